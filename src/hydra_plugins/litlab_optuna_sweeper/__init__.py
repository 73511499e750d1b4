"""litlab's Optuna sweeper, a Hydra plugin (see litlab_optuna_sweeper.py)."""
