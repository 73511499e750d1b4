"""Config location, validation against the constructors' signatures, and instantiation.

Nets, models, data and callbacks know nothing of Hydra. Hydra is known here, by the tasks
(train, evaluate), by the Hydra callbacks litlab adds (folders, sweep), and where Hydra's
runtime must be read or changed (the tuners' saved config, multirun x DDP, resume's argv).
Every object is built with ``build`` (``hydra.utils.instantiate``); before that, each
``_target_`` node is checked against the signature of what it builds, so a typo or a wrong type
fails with one line naming the key.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import logging
import os
import re
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import hydra
from hydra.errors import InstantiationException
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from litlab.compat import config_node, is_none_node
from litlab.errors import ConfigError, LitlabError, first_line

log = logging.getLogger("litlab")


def in_sweep() -> bool:
    """Whether this process runs a job of a Hydra multirun (-m)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def sweep_group() -> str | None:
    """W&B group of a sweep's jobs: "<task>-<sweep folder date>_<time>"; None outside a sweep.
    A continued Optuna study's launches (each in a folder of its own) share the group of the
    folder its SQLite storage is in, the study's first: one study, one group."""
    from hydra.core.hydra_config import HydraConfig

    if not in_sweep():
        return None
    hydra = HydraConfig.get()
    return group_of_sweep(hydra.job.name, study_folder(hydra.sweep.dir, hydra.sweeper))


SQLITE = "sqlite:///"  # an SQLAlchemy URL of an SQLite file: the prefix, then its path


def sqlite_file(storage: str | None) -> Path | None:
    """The file of an Optuna storage that is an SQLite URL (``sqlite:///<path>``), else None
    (another database, or none)."""
    if storage and storage.startswith(SQLITE):
        return Path(storage.removeprefix(SQLITE))
    return None


def study_folder(sweep_dir: str | Path, sweeper: Any) -> Path:
    """The folder that names a sweep's W&B group: its own, or the sweep folder its study's
    SQLite storage (``hydra.sweeper.storage``, resolved) lies in (a database elsewhere, which
    may hold several studies, does not name a group)."""
    storage = str((sweeper or {}).get("storage") or "")
    database = sqlite_file(storage)
    if database is not None and "${" not in storage:
        folder = database.absolute().parent
        if (folder / "0").is_dir():  # a sweep's folder, its first job's (not a studies.db's)
            return folder
    return Path(sweep_dir)


def group_of_sweep(job_name: str, sweep_dir: Path) -> str:
    """The W&B group of the jobs of the sweep in ``sweep_dir`` (sweep_group)."""
    return f"{job_name}-{sweep_dir.parent.name}_{sweep_dir.name}"


def optuna_direction(mode: str) -> str:
    """objective.mode (max/min) in the words Optuna uses (maximize/minimize)."""
    return {"max": "maximize", "min": "minimize"}[mode]


def run_dir(base: str, stamp: str) -> str:
    """hydra.run.dir: litlab.resume.run_dir (imported here when used: it imports this module)."""
    from litlab.resume import run_dir as folder

    return folder(base, stamp)


# cached: the folder is looked at once, and every later read of hydra.run.dir agrees
OmegaConf.register_new_resolver("run_dir", run_dir, replace=True, use_cache=True)
OmegaConf.register_new_resolver("sweep_group", sweep_group, replace=True)
OmegaConf.register_new_resolver("optuna_direction", optuna_direction, replace=True)


# The local files and folders a data source reads (relative as a command may give them).
DATA_PATH_KEYS = ("root", "input_dir", "data_dir")


def local_path(value: Any) -> bool:
    """Whether a data path is a local one as written (not a bucket's URL, LitData's ``local:``
    folder read as a remote one, ~ or an interpolation): relative or absolute."""
    return (
        isinstance(value, str)
        and bool(value)
        and "://" not in value
        and not value.startswith("local:")
        and value[0] not in "~$"
    )


def absolute_data_paths(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` (a resolved config, plain) with data.source's relative local paths made
    absolute (from this process's working directory, as the run read them): what a checkpoint
    and a config digest record. `data.source.root=imgs` stored as written sent eval.py, run
    from another folder, to another or no folder."""
    source = (config.get("data") or {}).get("source")
    if not isinstance(source, dict):
        return config
    for key in DATA_PATH_KEYS:
        if local_path(source.get(key)):
            source[key] = os.path.abspath(source[key])
    return config


def config_dir() -> str:
    """The conf/ tree: packaged inside a wheel, or at the root of a source checkout."""
    packaged = Path(__file__).parent / "conf"
    return str(packaged if packaged.is_dir() else Path(__file__).resolve().parents[2] / "conf")


def _describe(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def _matches(value: Any, hint: Any) -> bool | None:
    """True/False when ``hint`` is a simple type we can check; None when we cannot tell."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        results = [_matches(value, a) for a in args]
        return True if any(results) else (None if None in results else False)
    if hint is type(None):
        return value is None
    if origin is typing.Literal:
        return value in args
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin in (Sequence, list, tuple, typing.Sequence) and args:
        if not isinstance(value, ListConfig | list | tuple):
            return False
        results = [_matches(v, args[0]) for v in value]
        return None if None in results else all(results)
    return None


def _hint_name(hint: Any) -> str:
    text = str(hint).replace("typing.", "").replace("collections.abc.", "")
    return getattr(hint, "__name__", text) if not typing.get_args(hint) else text


def _is_target_node(node: Any) -> bool:
    # keys(), not `in`: `"_target_" in node` is False when the target is ??? (to be set)
    return isinstance(node, DictConfig) and not is_none_node(node) and "_target_" in node.keys()  # noqa: SIM118


# Targets that import a package of their own only when built: (any of these modules, to install)
OPTIONAL_PACKAGES = {
    "lightning.pytorch.loggers.TensorBoardLogger": (
        ("tensorboard", "tensorboardX"),
        "pip install tensorboard (or pip install 'litlab[tensorboard]')",
    ),
}


def check_packages(target: str, path: str) -> None:
    """A target whose package is not installed: one line that says what to install."""
    modules, install = OPTIONAL_PACKAGES.get(target, ((), ""))
    if modules and not any(importlib.util.find_spec(m) for m in modules):
        raise ConfigError(f"{path} ({target}) needs {modules[0]}, not installed: {install}")


def check_node(node: DictConfig, path: str) -> None:
    """Check a ``_target_`` node's keys and simple value types against its target's signature."""
    if OmegaConf.is_missing(node, "_target_"):
        raise ConfigError(
            f"{path}._target_ must be set (it is ??? in the config): add {path}._target_=..."
        )
    target = node.get("_target_")
    hydra_log = logging.getLogger("hydra.utils")  # it logs the error before raising it
    level = hydra_log.level
    hydra_log.setLevel(logging.CRITICAL)
    try:
        built = hydra.utils.get_object(target)
    except Exception as e:
        cause = e.__cause__ or e  # Hydra's ImportError wraps the import's own, over 3 lines
        top = str(target).split(".", 1)[0]
        missing = bool(top) and importlib.util.find_spec(top) is None
        hint = f": {top} is not importable, put its folder on PYTHONPATH" if missing else ""
        module, _, name = str(target).rpartition(".")
        if not missing and module and name:  # the module is there, the name in it is not
            try:  # ("No module named 'mynets.NoSuch'" blamed the module: walkthrough 173)
                if not hasattr(importlib.import_module(module), name):
                    cause, hint = f"{module} has no {name}", ""
            except Exception:  # (the module itself fails: Hydra's cause says how)
                pass
        raise ConfigError(
            f"{path}._target_: cannot import {target!r} ({first_line(cause)}){hint}"
        ) from e
    finally:
        hydra_log.setLevel(level)
    check_packages(target, path)
    func = built.__init__ if inspect.isclass(built) else built
    try:
        params = inspect.signature(built).parameters
        hints = typing.get_type_hints(func)
    except (TypeError, ValueError, NameError):
        return
    open_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    partial = bool(node.get("_partial_", False))
    for key in node:
        if str(key).startswith("_"):
            continue
        if key not in params and not open_kwargs:
            known = ", ".join(
                k for k, p in params.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
            )
            options = f"known options: {known}" if known else f"{target} takes none"
            raise ConfigError(
                f"{path}.{key} is not an option of {target}; {options}"
                + option_key_hint(path, str(key), str(target))
            )
        value = config_node(node, key)
        if _is_target_node(value):
            check_node(value, f"{path}.{key}")
            continue
        if key in hints and not OmegaConf.is_missing(node, key):
            plain = (
                OmegaConf.to_container(value, resolve=True)
                if isinstance(value, DictConfig | ListConfig)
                else node[key]
            )
            if _matches(plain, hints[key]) is False:
                # a value interpolated from another key (max_lr: ${model.optimizer.lr}) names it
                interpolated = OmegaConf.is_interpolation(node, key)
                raw = OmegaConf.to_container(node, resolve=False)[key] if interpolated else None
                source = f" (from {str(raw)[2:-1]})" if raw else ""
                raise ConfigError(
                    f"{path}.{key}{source} must be {_hint_name(hints[key])}, got {_describe(plain)}"
                )
    for name, p in params.items():
        if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        # `name in node` is False for ??? values; keys() lists them.
        if name in node.keys() and OmegaConf.is_missing(node, name):  # noqa: SIM118
            raise ConfigError(
                f"{path}.{name} must be set (it is ??? in the config): add {path}.{name}=..."
            )
        # Trainer callbacks and loggers are passed by the task, not the config.
        if (
            not partial
            and p.default is p.empty
            and name not in node
            and name not in ("callbacks", "logger")
        ):
            # (a key the config lacks: Hydra takes it with +; walkthrough 173)
            raise ConfigError(
                f"{path}.{name} is required by {target}; set it: +{path}.{name}=<value> on the "
                "command line (or in the config)"
            )
    if partial:
        probe_partial(node, path, built)


def option_key_hint(path: str, key: str, target: str) -> str:
    """Where a net of one's own got a key of the model/net option it replaced (the default
    SmallCNN's width: ``model.net._target_=...`` alone keeps the option's other keys;
    walkthrough 173), or a source of one's own one of the data option's source, how to start
    from none."""
    if path not in ("model.net", "data.source") or target.startswith(("litlab.", "torchvision.")):
        return ""
    if path == "data.source":
        if key not in option_keys("data", "source"):
            return ""
        return (
            f" ({key} came with the data option, which data.source._target_ alone keeps: for a "
            f"source of your own, '~data.source' '+data.source={{_target_: {target}}}')"
        )
    try:  # on model/net=custom already: the key is the user's own (review 175)
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.get().runtime.choices.get("model/net") == "custom":
            return ""
    except Exception:  # (not under Hydra: a test's composed config)
        pass
    if key not in option_keys("model/net"):  # (custom's own key is _target_ alone)
        return ""
    return (
        f" ({key} came with the model/net option, which model.net._target_ alone "
        f"keeps: for a net of your own, model/net=custom model.net._target_={target})"
    )


def probe_partial(node: DictConfig, path: str, target: Any) -> None:
    """Call an optimizer or LR-scheduler factory on stand-in arguments now, so that a value only
    its constructor checks (a negative lr, pct_start above 1) is one line before the run starts,
    not a traceback from inside the fit. Other partials are called by the code that uses them."""
    import torch

    if not inspect.isclass(target):
        return
    param = torch.nn.Parameter(torch.zeros(1))
    try:
        factory = hydra.utils.instantiate(node)
        if issubclass(target, torch.optim.Optimizer):
            factory(params=[param])
        elif issubclass(target, torch.optim.lr_scheduler.LRScheduler):
            given = getattr(factory, "keywords", {})
            wanted = inspect.signature(target).parameters
            length = {k: 100 for k in ("total_steps", "T_max", "total_iters") if k in wanted}
            factory(
                optimizer=torch.optim.SGD([param], lr=0.1),
                **{k: v for k, v in length.items() if k not in given},
            )
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{path}: {first_line(e)} (from {node['_target_']})") from e


def check_all(cfg: DictConfig, path: str = "") -> None:
    """Check every ``_target_`` node below ``cfg`` (outermost first)."""
    try:
        for key in cfg:
            child = config_node(cfg, key)
            where = f"{path}.{key}" if path else str(key)
            if _is_target_node(child):
                check_node(child, where)
            elif isinstance(child, DictConfig) and not is_none_node(child):
                check_all(child, where)
    except LitlabError:
        raise
    except OmegaConfBaseException as e:
        where = getattr(e, "full_key", "") or path
        missing = re.fullmatch(r"Interpolation key '(.+)' not found", first_line(e))
        if missing and where:  # (a node removed that another key reads: ~data.source and
            # data.image_shape's ${data.source.size}; OmegaConf's 3-line message said where only)
            base = re.sub(r"\[\d+\]$", "", where)
            raise ConfigError(
                f"{where} is set from {missing[1]}, which is not in the config: set {base} "
                f"yourself (or +{missing[1]}=...)"
            ) from e
        raise ConfigError(f"{where}: {first_line(e)}".strip(" :")) from e


def build(node: DictConfig, path: str, **kwargs: Any) -> Any:
    """Instantiate one config node; a user error inside a constructor names the node.

    Constructors check values that no signature can (torch, torchvision, Lightning raise a
    ValueError or Lightning's MisconfigurationException for them): those are config errors too.
    """
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    try:
        return hydra.utils.instantiate(node, **kwargs)
    except InstantiationException as e:
        cause = e.__cause__
        if isinstance(cause, LitlabError):
            raise type(cause)(f"{path}: {cause}") from cause
        if isinstance(cause, ValueError | MisconfigurationException):
            raise ConfigError(f"{path}: {first_line(cause)}") from cause
        raise


def build_model(node: DictConfig, datamodule: Any) -> Any:
    """The model of ``node`` (cfg.model), its nets' lazy layers sized for the data's images."""
    from litlab.models.lazy import materialize

    model = build(node, "model")
    materialize(model, tuple(datamodule.image_shape))
    return model


def get_class(name: str, path: str) -> type:
    """A class by its dotted name, or one line naming the config key."""
    try:
        return hydra.utils.get_class(name)
    except Exception as e:
        raise ConfigError(f"{path}: cannot import {name!r} ({first_line(e)})") from e


def require(cfg: DictConfig, key: str, hint: str) -> Any:
    """Read a mandatory top-level key, turning ??? into a one-line error."""
    if OmegaConf.is_missing(cfg, key) or cfg.get(key) is None:
        raise ConfigError(f"{key} is required: {hint}")
    return cfg[key]


def check_ema(cfg: DictConfig) -> None:
    """Refuse the EMA callback under FSDP: it averages each whole parameter, FSDP leaves each
    rank a flat shard of it (the first update would fail with a size mismatch)."""
    from litlab.distributed import strategy_name

    strategy = strategy_name(cfg.trainer.get("strategy", "auto")).lower()
    if (cfg.get("callbacks") or {}).get("ema") and "fsdp" in strategy:
        raise ConfigError(
            "callbacks.ema averages whole parameters, which FSDP shards across the ranks; use "
            "trainer.strategy=ddp, or callbacks.ema=null"
        )


def check_pretrained_normalization(cfg: DictConfig) -> None:
    """Pretrained torchvision weights (``model.net.weights``) saw their own normalization in
    training (ImageNet's mean and std): data normalized otherwise starts the net on inputs it
    never saw, a slower fine-tune and a worse result, silently. One warning naming the values."""
    net = OmegaConf.select(cfg, "model.net") or {}
    weights = net.get("weights") if isinstance(net, DictConfig) else None
    if not weights or str(net.get("_target_", "")).rsplit(".", 1)[-1] != "TorchvisionNet":
        return
    import torchvision

    try:
        known = (
            torchvision.models.get_model_weights(str(net.name)).verify(str(weights)).transforms()
        )
    except (KeyError, ValueError):
        return  # an unknown name or weights: the net's constructor says so
    # one value per image channel (a single mean and std serve every channel: DataModule)
    shape = cfg.data.get("image_shape")
    channels = int(shape[0]) if shape else len(cfg.data.get("mean") or []) or 1
    wanted = [[float(v) for v in known.mean][:channels], [float(v) for v in known.std][:channels]]
    given = [[float(v) for v in cfg.data.get(key) or []] for key in ("mean", "std")]
    given = [values * channels if len(values) == 1 else values for values in given]
    if all(
        len(a) == len(b) and all(abs(x - y) < 1e-3 for x, y in zip(a, b, strict=True))
        for a, b in zip(given, wanted, strict=True)
    ):
        return
    log.warning(
        "model.net.weights=%s was trained on images normalized with mean %s, std %s, but this "
        "data is normalized with mean %s, std %s; set data.mean=%s data.std=%s to fine-tune it "
        "on the inputs it knows",
        weights,
        *wanted,
        *given,
        *wanted,
    )


def clipping_option(module: Any) -> str | None:
    """The option that clips a module's gradients: Lightning's for automatic optimization, the
    module's own where it steps its optimizers itself (the GANs' model.gradient_clip_val);
    None where such a module has none."""
    if getattr(module, "automatic_optimization", True):
        return "trainer.gradient_clip_val"
    return "model.gradient_clip_val" if hasattr(module, "gradient_clip_val") else None


def check_manual_optimization(cfg: DictConfig, model: Any) -> None:
    """A model that steps its own optimizers (Lightning's manual optimization: the GANs) gets
    neither Lightning's gradient clipping nor its gradient accumulation; Lightning refuses both
    with a traceback once training starts."""
    if getattr(model, "automatic_optimization", True):
        return
    if cfg.trainer.get("gradient_clip_val"):
        raise ConfigError(
            f"trainer.gradient_clip_val: {type(model).__name__} steps its own optimizers (manual "
            f"optimization), which Lightning does not clip; set {clipping_option(model) or 'the model'} to clip "
            "instead"
        )
    if (cfg.trainer.get("accumulate_grad_batches") or 1) != 1:
        raise ConfigError(
            f"trainer.accumulate_grad_batches: {type(model).__name__} steps its own optimizers "
            "(manual optimization), which Lightning does not accumulate for; use a larger "
            "data.batch_size (or more devices) instead"
        )
    if (cfg.get("callbacks") or {}).get("ema"):
        # Lightning's weight averaging swaps every net for its average around validation and
        # saves the averages as the weights: a GAN's FID would score an average of its
        # generator's average, its best checkpoint hold averaged discriminators
        raise ConfigError(
            f"callbacks.ema: {type(model).__name__} steps its own optimizers (manual "
            "optimization) and keeps its own average of the generator where it has one (the "
            "GANs: model.ema_decay), which its samples, FID and tests use; set callbacks.ema=null"
        )


# The direction of litlab's own metrics, by the last part of their names (val/loss, test/acc_top5)
BETTER_WHEN = {"loss": "min", "fid": "min", "acc": "max", "acc_top5": "max", "acc_best": "max"}


CLASSIFIER = "litlab.models.ImageClassifier"
GAN = "litlab.models.GAN"


def objective_not_logged(metric: str, logged: Sequence[str]) -> ConfigError:
    return ConfigError(
        f"objective.metric={metric} is not logged by this model's validation "
        f"({', '.join(logged)}); set objective.metric to one of them (objective=accuracy "
        "or objective=loss choose val/acc or val/loss)"
    )


def check_objective(cfg: DictConfig) -> None:
    """Refuse an objective on the test split (it would choose the model it scores), one in the
    wrong direction for its metric (objective.metric=val/loss alone
    kept accuracy's max: the worst checkpoint, tested and scored), one that no part of the run
    logs (FID with the FID callback off), and a best checkpoint chosen by another metric or
    direction than the objective: its score is the run's objective value (what a sweep
    optimizes and the report ranks by) and the checkpoint the test measures."""
    callbacks = cfg.get("callbacks") or {}
    metric = str(cfg.objective.metric)
    if metric.split("/", 1)[0] == "test":
        raise ConfigError(
            f"objective.metric={metric} is measured on the test split, but the objective picks "
            "the best checkpoint and a sweep's best trial: the test set would choose the model "
            f"it then scores; set objective.metric=val/{metric.split('/', 1)[-1]}"
        )
    if cfg.model.get("_target_") == CLASSIFIER and metric.startswith("val/"):
        from litlab.models.classifier import validation_metrics

        classes = OmegaConf.select(cfg, "data.num_classes", default=None, throw_on_missing=False)
        logged = validation_metrics(classes if isinstance(classes, int) else None)
        if metric not in logged:  # (a typo: refused before the data, and each job of a sweep)
            raise objective_not_logged(metric, logged)
    # (val/d_real too: a run may choose by it; review 148)
    gan_metric = metric.startswith("val/fid") or metric in ("val/class_entropy", "val/d_real")
    if cfg.model.get("_target_") == GAN and metric.startswith("val/") and not gan_metric:
        # (val/acc: refused by Lightning's checkpoint after the first epoch; walkthrough 145)
        raise ConfigError(
            f"objective.metric={metric} is not logged by a GAN's validation, which measures "
            "FID (val/fid: the averaged generator's, val/fid_g: the trained one's), "
            "val/class_entropy and val/d_real; set objective=fid (model=dcgan's own)"
        )
    better = BETTER_WHEN.get(metric.rsplit("/", 1)[-1])
    if better is not None and str(cfg.objective.mode) != better:
        raise ConfigError(
            f"objective.metric={metric} is better when {'lower' if better == 'min' else 'higher'}"
            f", but objective.mode={cfg.objective.mode}: the best checkpoint (what the test "
            "measures), early stopping, a plateau schedule and a sweep would all take the worst "
            f"as the best; set objective.mode={better} (a run trained so chose its best the wrong "
            "way round: start a new run)"
        )
    best = callbacks.get("model_checkpoint") or {}
    chosen_by = (best.get("monitor"), best.get("mode", "min"))
    if best and chosen_by[0] is not None and chosen_by != (metric, str(cfg.objective.mode)):
        # the direction its metric is better in, where known (its mode followed the objective's:
        # the advice was refused by the check above; walkthrough 173)
        way = BETTER_WHEN.get(str(chosen_by[0]).rsplit("/", 1)[-1]) or chosen_by[1]
        if chosen_by[0] == metric:  # the mode alone set apart (review 174)
            known = BETTER_WHEN.get(str(metric).rsplit("/", 1)[-1])
            fix = (  # (a metric of no known direction: either may be the wrong one, 175)
                "leave callbacks.model_checkpoint.mode out (it follows the objective)"
                if known
                else f"set objective.mode to the direction {metric} is better in (min or max) "
                "and leave callbacks.model_checkpoint.mode out (it follows the objective)"
            )
            raise ConfigError(
                f"callbacks.model_checkpoint.mode={chosen_by[1]} but objective.mode="
                f"{cfg.objective.mode} for {metric}: the best checkpoint would be chosen the "
                f"other way round; {fix}"
            )
        raise ConfigError(
            f"callbacks.model_checkpoint keeps the best checkpoint by {chosen_by[0]} "
            f"({chosen_by[1]}) but objective is {metric} ({cfg.objective.mode}): the run's "
            f"objective value would be the best {chosen_by[0]}; set objective.metric="
            f"{chosen_by[0]} objective.mode={way} (the checkpoint follows the objective "
            "by default: leave callbacks.model_checkpoint.monitor and mode out)"
        )
    keep, name = best.get("save_top_k", 1), str(best.get("filename") or "")
    if best and keep != 1 and "{" not in name:  # every save would overwrite the one file
        raise ConfigError(
            f"callbacks.model_checkpoint.save_top_k={keep} with the one file name {name!r}: "
            "each save overwrites it, so it would hold the newest of the top k, not the best; "
            "keep save_top_k=1, or name the files apart (callbacks.model_checkpoint.filename="
            "'best-{epoch}')"
        )
    validates = cfg.get("train") and cfg.trainer.get("limit_val_batches", 1.0) != 0
    monitored = chosen_by[0] == metric
    every, epochs = cfg.trainer.get("check_val_every_n_epoch") or 1, cfg.trainer.get("max_epochs")
    by_epochs = (cfg.trainer.get("max_steps") or -1) < 0  # (max_steps may end it elsewhere)
    counted = isinstance(every, int) and isinstance(epochs, int) and epochs > 0
    # the epochs trained after the last validation
    unvalidated = epochs % every if validates and by_epochs and counted else 0
    if unvalidated and epochs < every:  # none validated at all
        never = (
            f"trainer.check_val_every_n_epoch={every} is above trainer.max_epochs={epochs}: "
            "the run never validates (no objective, no best checkpoint"
        )
        if callbacks.get("early_stopping"):
            raise ConfigError(
                f"{never}, and callbacks.early_stopping never acts); set "
                f"trainer.check_val_every_n_epoch to at most {epochs}"
            )
        log.warning(
            "%s); ++trainer.limit_val_batches=0 says so, or set "
            "trainer.check_val_every_n_epoch to at most %d",
            never,
            epochs,
        )
    if unvalidated and monitored:
        log.warning(
            "trainer.max_epochs=%d is not a multiple of trainer.check_val_every_n_epoch=%d: "
            "the last %d epoch(s) train without validation, so best.ckpt (what the test "
            "measures) cannot be one of them",
            epochs,
            every,
            unvalidated,
        )
    if unvalidated and not monitored:
        raise ConfigError(
            f"no best checkpoint is kept, so the objective is the last validation's {metric}; "
            f"with trainer.max_epochs={epochs} and trainer.check_val_every_n_epoch={every} the "
            "last epoch is not validated, and the objective would not describe the weights the "
            f"test measures (last.ckpt): set trainer.max_epochs to a multiple of {every}, or keep "
            "callbacks.model_checkpoint"
        )
    if metric.startswith("val/fid") and callbacks.get("fid") is None and validates and monitored:
        if "fid" not in callbacks and "samples" not in callbacks:  # the group chosen anew
            raise ConfigError(
                "this callbacks group has no GAN callbacks (callbacks.fid, callbacks.samples), "
                f"so objective.metric={metric} is never logged: a GAN keeps callbacks=gan, "
                "which model=dcgan chooses (callbacks=ema is for classifiers: a GAN averages "
                "its generator itself, model.ema_decay)"
            )
        raise ConfigError(
            f"objective.metric={metric} comes from callbacks.fid, which is off; keep callbacks.fid "
            "(callbacks.fid.num_samples=... makes it cheaper), or also set "
            "callbacks.model_checkpoint=null (no best checkpoint; last.ckpt is still kept)"
        )


def check_plateau_mode(cfg: DictConfig) -> None:
    """ReduceLROnPlateau on another metric than the objective needs that metric's direction:
    model.scheduler_mode follows objective.mode unless set (a loss watched in the accuracy's
    direction, max, would cut the LR while the loss falls)."""
    model = cfg.get("model") or {}
    scheduler = model.get("scheduler")
    monitor = model.get("scheduler_monitor")
    if not isinstance(scheduler, DictConfig) or "_target_" not in scheduler or monitor is None:
        return
    target = hydra.utils.get_object(str(scheduler._target_))
    from torch.optim.lr_scheduler import ReduceLROnPlateau

    if not (isinstance(target, type) and issubclass(target, ReduceLROnPlateau)):
        return
    if "mode" in scheduler or str(monitor) == str(cfg.objective.metric):
        return
    follows = OmegaConf.is_interpolation(model, "scheduler_mode") and "objective.mode" in str(
        OmegaConf.to_container(model, resolve=False).get("scheduler_mode")
    )
    if follows:
        raise ConfigError(
            f"model.scheduler_monitor={monitor} is not the objective ({cfg.objective.metric}), "
            f"whose direction ({cfg.objective.mode}) model.scheduler_mode follows; set "
            "model.scheduler_mode=min or max for it too"
        )


# Settings that are true or false, outside any _target_'s arguments (those are checked against
# their constructor's hints): a typo in one was a non-empty string, taken as true.
SWITCHES = ("train", "test", "tune.batch_size", "tune.lr", "extras.print_config")
SWITCHES += ("extras.ignore_warnings",)


# Config groups of plain settings, read by litlab itself: a key added under one (`+tune.lrr=true`,
# `+objective.metrc=val/acc`) set nothing, silently (walkthrough 173).
PLAIN_GROUPS = ("tune", "objective", "extras")


@functools.cache
def option_keys(group: str, under: str | None = None) -> frozenset[str]:
    """The keys the options of a config group set (their top level, defaults aside; or those of
    their node ``under``), read once a process: every run's checks ask (check_plain_group)."""
    keys: set[str] = set()
    for option in (Path(config_dir()) / group).glob("*.yaml"):
        loaded = OmegaConf.load(option)
        if isinstance(loaded, DictConfig) and under is not None:
            loaded = loaded.get(under)
        if isinstance(loaded, DictConfig):
            keys |= {str(k) for k in loaded if k != "defaults"}
    return frozenset(keys)


def check_plain_group(cfg: DictConfig, group: str) -> None:
    """Refuse a key of a plain-settings group that none of its options has."""
    import difflib

    node = cfg.get(group)
    if not isinstance(node, DictConfig):
        return
    known = option_keys(group)
    for key in node:
        if known and str(key) not in known:
            close = difflib.get_close_matches(str(key), sorted(known), n=1)
            hint = f"did you mean {group}.{close[0]}? " if close else ""
            raise ConfigError(
                f"{group}.{key} is not a setting; {hint}{group}'s settings are "
                f"{', '.join(sorted(known))}"
            )


def overlays(group: str) -> bool:
    """Whether a config group's options all set keys elsewhere (``# @package _global_``:
    experiment, hparams_search, debug), so that the group itself is no key of the config."""
    options = list((Path(config_dir()) / group).glob("*.yaml"))
    return bool(options) and all(
        option.read_text().startswith("# @package _global_") for option in options
    )


def check_top_level(cfg: DictConfig, config_name: str) -> None:
    """Refuse top-level keys that the task's config does not have (``+seeed=3``, a typo that
    Hydra's ``+`` adds silently); keys inside the groups are checked against their targets."""
    import difflib

    primary = OmegaConf.to_container(OmegaConf.load(Path(config_dir()) / f"{config_name}.yaml"))
    chosen = [entry for entry in primary.get("defaults", []) if isinstance(entry, dict)]
    groups = [next(iter(entry)) for entry in chosen]
    # groups chosen by none by default (experiment, hparams_search, debug): their key is in the
    # config only where a choice of theirs puts it there, or a key was added under them
    optional = {next(iter(entry)) for entry in chosen if next(iter(entry.values())) is None}
    known = {*primary, *groups, "hydra"} - {"defaults"}
    for key in cfg:
        if key in optional and overlays(str(key)):  # +hparams_search.n_trials=3: a key of nothing
            raise ConfigError(
                f"{key}.* is not a setting: {key}=<option> picks a config that sets others "
                "(`# @package _global_`), and a key added under it sets nothing; give the "
                "setting itself"
                + (", e.g. hydra.sweeper.n_trials=3" if key == "hparams_search" else "")
            )
        if key not in known:
            close = difflib.get_close_matches(str(key), sorted(known), n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise ConfigError(
                f"{key} is not a setting of the {config_name} task; {hint}its top-level settings "
                f"are {', '.join(sorted(known - {'hydra'}))}"
            )
    for group in PLAIN_GROUPS:  # (no _target_ whose arguments would refuse a typo)
        check_plain_group(cfg, group)
    for key in SWITCHES:  # (Hydra reads `tune.lr=ture` as a string, which is true)
        value = OmegaConf.select(cfg, key, default=None)
        if value is not None and not isinstance(value, bool):
            worded = isinstance(value, str) and value.lower() in ("true", "false")
            hint = (
                " (a string, as ${oc.env:...} gives: ${oc.decode:${oc.env:NAME,false}} "
                "turns it into true or false)"
                if worded
                else ""
            )
            raise ConfigError(f"{key}={value!r}: give true or false{hint}")
    seed = cfg.get("seed")  # what Lightning's seed_everything (numpy) takes (null: Lightning's 0)
    if seed is not None and not (type(seed) is int and 0 <= seed < 2**32):
        raise ConfigError(f"seed={seed}: give a whole number from 0 to {2**32 - 1}, e.g. seed=42")


def check_augmentation(cfg: DictConfig) -> None:
    """Refuse augmentation of real images alone for models that forbid it (GANs)."""
    model = hydra.utils.get_object(cfg.model._target_)
    keys = ("translate", "hflip", "random_resized_crop", "augment")
    augmented = [k for k in keys if cfg.data.get(k)]
    if getattr(model, "augments_real_images_alone", True) is False and augmented:
        raise ConfigError(
            f"data.{augmented[0]} augments the real images only, which a GAN's discriminator "
            "tells from the plain generated ones (the generator then learns the augmentation); "
            "set data.translate=0 data.hflip=false data.random_resized_crop=null "
            "data.augment=null, and "
            "model.diffaugment=[translation,cutout] "
            "to augment real and generated images alike"
        )


def check_precision(cfg: DictConfig) -> None:
    """Refuse 16-bit weights (``*-true`` precisions) for models that need float32 ones (GANs)."""
    model = hydra.utils.get_object(cfg.model._target_)
    precision = str(cfg.trainer.get("precision"))
    if getattr(model, "needs_float32_weights", False) and precision in ("bf16-true", "16-true"):
        raise ConfigError(
            f"trainer.precision={precision} casts every weight to 16 bits, which {model.__name__} "
            "cannot train with (its EMA copy would stop moving: a decay of 0.999 is 1.0 in 16 "
            "bits); use trainer.precision=bf16-mixed (16-bit arithmetic, float32 weights)"
        )
    if precision == "16-true":
        check_float16_eps(cfg)


def check_float16_eps(cfg: DictConfig) -> None:
    """Refuse an optimizer eps that float16 holds as 0 (or a subnormal) under 16-true, where the
    optimizer's state is float16 too: Adam's denominator, sqrt(v) + eps, is then 0 wherever a
    gradient's square underflows, and the loss NaN within steps (walkthrough 176: the default
    AdamW's 1e-8, "training diverged ... lower the learning rate")."""
    import torch

    smallest = torch.finfo(torch.float16).tiny  # 6.1e-05, float16's smallest normal number
    for key in cfg.model:
        node = cfg.model.get(key)
        if not str(key).endswith("optimizer") or not _is_target_node(node):
            continue
        try:
            default = inspect.signature(hydra.utils.get_object(node._target_)).parameters.get("eps")
        except Exception:
            continue
        eps = node.get("eps", default.default if default is not None else None)
        number = isinstance(eps, int | float) and not isinstance(eps, bool)
        if number and 0 <= eps < smallest:  # (eps=0 from the command line is an int)
            raise ConfigError(
                f"trainer.precision=16-true keeps the optimizer's state in float16, where "
                f"model.{key}.eps={eps:g} is below its smallest normal number ({smallest:.2g}): "
                "Adam's steps divide by about zero and the loss becomes NaN; set "
                f"model.{key}.eps=1e-4, or trainer.precision=bf16-true (bfloat16 holds it)"
            )


def check_device_stats(cfg: DictConfig) -> None:
    """Lightning's DeviceStatsMonitor with cpu_stats=true reads psutil, which it imports at the
    first training batch: without it the run failed there, after the data's setup, in a
    traceback."""
    import importlib.util

    from litlab.hardware import on_gpu

    callbacks = cfg.get("callbacks") or {}
    cpu = not on_gpu(str(cfg.trainer.get("accelerator", "auto")))
    for name, callback in callbacks.items():
        if not isinstance(callback, DictConfig):
            continue
        monitor = str(callback.get("_target_", "")).endswith("DeviceStatsMonitor")
        if monitor and cpu and not callback.get("cpu_stats"):  # (it logged nothing, silently)
            log.warning(
                "callbacks.%s logs a GPU's counters, and this run computes on the CPU: nothing "
                "is logged; callbacks.%s.cpu_stats=true logs the CPU's (psutil)",
                name,
                name,
            )
        if monitor and callback.get("cpu_stats") and importlib.util.find_spec("psutil") is None:
            raise ConfigError(
                f"callbacks.{name}.cpu_stats=true needs psutil: pip install psutil, or set "
                f"callbacks.{name}.cpu_stats=false (the CUDA counters need nothing more)"
            )
