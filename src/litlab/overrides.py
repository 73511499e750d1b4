"""Hydra command-line overrides (``key=value``) as litlab reads them back from run folders."""

from __future__ import annotations

# What each `resume=` of a run that trained changed (its overrides, merged), beside the run's
# .hydra/overrides.yaml: litlab.resume writes and applies it, litlab.report shows it.
RESUME_OVERRIDES = "resume_overrides.yaml"

# What the finders (tune.batch_size, tune.lr) set, by switch: litlab.tune writes the values found
# into the config (and summary.json's "tuned"), never given on the command line too.
TUNED_KEYS = {"batch_size": "data.batch_size", "lr": "model.optimizer.lr"}

# Seeds of what a run draws (data order and init, its splits, a GAN's noise): a study searching
# one of them names a lucky draw best (litlab.sweep refuses it); runs that differ only in them
# are repeats of one configuration (litlab.report gives their mean and spread).
SEEDS = ("seed", "data.split_seed", "model.noise_seed")

# Keys that name, tag or log a run, not what it computes: a run's config digest leaves them out,
# and the report's comparison of settings too (two runs of one setting under two tags were two
# settings "over seeds": walkthrough 163).
RUN_LABELS = ("tags", "task_name", "extras", "logger")
# ... and, in the report, where a run writes and how its sweep chose it (an Optuna search's
# config, hparams_search, sets the sweeper alone: a trial and its seeds run again without it
# are one setting)
NOT_COMPARED = (*RUN_LABELS, "paths", "hydra", "hparams_search")


def compared(key: str) -> bool:
    """Whether an override's key is a setting the report compares runs by."""
    return key.replace("/", ".").split(".", 1)[0] not in NOT_COMPARED


def override_key(override: str) -> str | None:
    """The key of a ``key=value``, ``+key=value`` or ``~key`` override; None for other forms."""
    if "=" not in override and not override.startswith("~"):
        return None
    return override.split("=", 1)[0].lstrip("+~")


def merged_overrides(earlier: list[str], later: list[str]) -> list[str]:
    """``earlier`` then ``later``, an earlier override of a key that ``later`` sets left out."""
    keys = {override_key(arg) for arg in later}
    return [arg for arg in earlier if override_key(arg) not in keys] + list(later)
