"""litlab's Optuna sweeper (``hydra.sweeper._target_`` in conf/hparams_search/): Hydra's, plus two
things a study needs (litlab.sweep): a study continued from its storage draws new trials, and a
sweep none of whose trials completed ends with its sweep_summary.json and one line, not the
plugin's traceback; under torchrun or srun, ranks other than 0 ask a copy of a shared
study; each job knows its trial (optuna_trials.json), so that a job a signal stopped, continued
with resume=, tells the study its result. A Hydra plugin, so it lives in the hydra_plugins namespace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

try:  # the optional [sweep] extra; without it there is nothing to register
    import hydra_plugins.hydra_optuna_sweeper.optuna_sweeper as optuna_sweeper
except ImportError:
    optuna_sweeper = None

if optuna_sweeper is not None:

    class LitlabOptunaSweeper(optuna_sweeper.OptunaSweeper):
        def sweep(self, arguments: list[str]) -> Any:
            from litlab.sweep import (
                best_job,
                continued_sampler,
                drop_an_unused_study,
                drop_empty_sweep_folder,
                drop_rank_storage,
                fail_unrun_trials,
                launches_in_process,
                rank_storage,
                read_jobs,
                record_asked_trials,
                record_measure,
                refuse_a_direction_against_the_objective,
                refuse_a_found_value_searched,
                refuse_a_search_over_a_missing_key,
                refuse_a_search_space,
                refuse_a_tuned_measure,
                refuse_a_tuned_seed,
                refuse_an_unseeded_grid,
                refuse_an_untrained_study,
                refuse_another_direction,
                refuse_another_measure,
                refuse_what_every_trial_would,
                tell_stopped_batch,
            )

            impl = self.sweeper
            sweeper = impl.config.hydra.sweeper
            try:
                refuse_what_every_trial_would(impl.config)
                refuse_a_tuned_seed(arguments, sweeper.get("params"))
                refuse_a_tuned_measure(arguments, sweeper.get("params"))
                refuse_a_search_over_a_missing_key(impl.config, arguments, sweeper.get("params"))
                refuse_a_found_value_searched(impl.config, arguments, sweeper.get("params"))
                refuse_an_untrained_study(impl.config)
                refuse_an_unseeded_grid(sweeper.sampler)
                refuse_a_direction_against_the_objective(impl.config)
                refuse_another_direction(impl.config, impl.storage, impl.study_name)
                refuse_another_measure(impl.config, impl.storage, impl.study_name)
            except SystemExit:  # refused: no trial ran, the sweep's folder goes if it is empty
                drop_empty_sweep_folder(impl.config.hydra.sweep.dir)
                raise
            shared, impl.storage = impl.storage, rank_storage(impl.storage, impl.study_name)
            impl.sampler = continued_sampler(
                impl.sampler, sweeper.sampler, impl.storage, impl.study_name
            )
            configure = impl._configure_trials
            batch: list[int] = []  # the trials of the batch launched last

            def configure_and_record(trials: list[Any], *args: Any) -> Any:
                record_asked_trials(
                    impl.config.hydra.sweep.dir, impl.job_idx, trials, shared, impl.study_name
                )
                if trials and shared == impl.storage:  # (global rank 0's study, not a copy)
                    record_measure(trials[0], impl.config)
                batch[:] = [trial.number for trial in trials]
                return configure(trials, *args)

            impl._configure_trials = configure_and_record
            sweep_dir, in_process = impl.config.hydra.sweep.dir, launches_in_process(impl.config)
            try:
                return super().sweep(arguments)
            except ValueError as e:  # optuna's study.best_trial: "Record does not exist."
                if impl.job_idx == 0:  # before any job: Optuna refused the search space (146)
                    try:
                        refuse_a_search_space(e)
                    except SystemExit:  # the study's file, made now, and the folder go
                        drop_rank_storage(shared, impl.storage)
                        drop_an_unused_study(shared)
                        drop_empty_sweep_folder(sweep_dir)
                        raise
                if best_job(read_jobs(Path(impl.config.hydra.sweep.dir))) is not None:
                    raise
                return None  # no trial completed: the summary callback says so and exits
            except (SystemExit, KeyboardInterrupt):  # a signal stopped a job, and the sweep
                if shared == impl.storage:  # (global rank 0's: the others ask a copy)
                    tell_stopped_batch(sweep_dir, batch, in_process)
                raise
            except Exception:  # the launch itself failed (a job's config not composed)
                if shared == impl.storage:
                    fail_unrun_trials(sweep_dir, shared, impl.study_name, batch, in_process)
                raise
            finally:
                drop_rank_storage(shared, impl.storage)
