"""What a checkpoint may be continued or tested with (``check_resumable``): the same model
family, network, data, seeds, objective, measures and optimizer settings, or a one-line refusal
that says what differs and what to do. Used by litlab.resume (resume=, requeued jobs) and by
train.py for ``ckpt_path=``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from litlab.checkpoint import data_state, stored_config
from litlab.compat import epochs_trained
from litlab.data.fingerprint import files_found, folder_of
from litlab.errors import CheckpointError, LitlabError

log = logging.getLogger("litlab")


PROCESS_KEYS = ("trainer.devices", "trainer.num_nodes")


def _processes_of(checkpoint: dict[str, Any], stored: Any) -> int | None:
    """How many processes wrote a checkpoint: its RNGState's states (one a process), else its
    config's trainer.devices x trainer.num_nodes where both are numbers (a launcher's layout is
    written there); None where neither says."""
    ranks = ((checkpoint.get("callbacks") or {}).get("RNGState") or {}).get("ranks")
    if isinstance(ranks, list):
        return len(ranks)
    devices, nodes = stored.get("devices"), stored.get("num_nodes") or 1
    if isinstance(devices, int) and devices > 0 and isinstance(nodes, int):
        return devices * nodes
    return None


def _given_now() -> list[str]:
    """This command's own overrides: under resume=, those it gave (not what earlier resumes
    recorded, which its composed overrides hold too); else Hydra's task overrides."""
    from litlab.resume import this_resume_overrides

    given = this_resume_overrides()
    if given is not None:
        return given
    try:
        from hydra.core.hydra_config import HydraConfig

        return list(HydraConfig.get().overrides.task)
    except ValueError:  # not under Hydra (a notebook, a test's composed config)
        return []


def check_processes(checkpoint: dict[str, Any], world: int, cfg: DictConfig) -> None:
    """A fit continued on another number of processes than its checkpoint's: each step's batch
    is data.batch_size x processes, so the run would go on with other batches and a refit
    step-counted schedule. Refused unless this command sets trainer.devices or
    trainer.num_nodes (then said once): a plain ``python train.py resume=`` of a run torchrun
    trained on 2 processes continued it on 1, exit 0 (walkthrough 153)."""
    from litlab.distributed.launchers import global_rank
    from litlab.overrides import override_key

    stored = stored_config(checkpoint, cfg.ckpt_path).get("trainer") or {}
    then = _processes_of(checkpoint, stored)
    if not cfg.get("train") or then is None or then == world:
        return
    if any(override_key(o) in PROCESS_KEYS for o in _given_now()):
        if global_rank() == 0:
            log.warning(
                "continuing on %d process(es) a run that trained on %d: each step now takes "
                "data.batch_size x %d images (was x %d), and step-counted schedules are refit "
                "to the new number of steps",
                world,
                then,
                world,
                then,
            )
        return
    nodes = stored.get("num_nodes") if isinstance(stored.get("num_nodes"), int) else 1
    layout = f"trainer.devices={then // nodes} trainer.num_nodes={nodes}"
    path = Path(cfg.ckpt_path)
    folder = path.parent.parent
    if path.parent.name == "checkpoints" and (folder / ".hydra").is_dir():
        again = f"train.py resume={folder}"  # (its run folder)
    else:
        again = f"train.py ckpt_path={path}"
    plain = f", or python {again} {layout}" if nodes == 1 else ""
    raise CheckpointError(
        f"{cfg.ckpt_path} was written by a run on {then} process(es), and this one runs on "
        f"{world}: each step would take data.batch_size x {world} images, not x {then}, and the "
        f"LR schedule would be refit. Continue it on {then} ({layout}): under the torchrun or "
        f"srun command it ran with, {again}{plain}; to continue on {world} on purpose, give "
        "trainer.devices (and trainer.num_nodes)"
    )


def check_resumable(checkpoint: dict[str, Any], cfg: DictConfig) -> None:
    """Refuse to resume from a checkpoint of another model family; to train on from one past
    the run's end, or with optimizer settings that its restored state would override."""
    path, max_epochs = cfg.ckpt_path, cfg.trainer.get("max_epochs")
    config = stored_config(checkpoint, path)
    stored = config.model
    trained = stored.get("_target_")
    if trained != cfg.model._target_:
        raise CheckpointError(
            f"{path} holds a {trained} but this run builds a {cfg.model._target_}; pick the "
            "matching model (e.g. model=dcgan for a GAN checkpoint) or another checkpoint"
        )
    network = _changed_network(stored, cfg.model) + _changed_gan_state(stored, cfg.model)
    if network:  # its weights do not fit (Lightning's size-mismatch traceback) or mean another net
        raise CheckpointError(
            f"{path} holds another network than this run builds ({'; '.join(network)}); set "
            "them as its run had them, or start a new run to train this network"
        )
    data = _changed_data(OmegaConf.create(config.get("data") or {}), cfg.data)
    measured = [
        f"model.{key}: {stored.get(key, default)} -> {cfg.model.get(key, default)}"
        for key, default in _MEASURES.items()
        if key in stored or key in cfg.model
        if stored.get(key, default) != cfg.model.get(key, default)
    ]
    measured += _changes(config, cfg, ["data.eval_crop", *_FID_MEASURE])
    if not cfg.get("train"):  # tested only: nothing is restored for training
        if data:  # images that trained could be tested (a moved split)
            raise CheckpointError(
                f"train=false tests {path} on data set up otherwise than its run's "
                f"({'; '.join(data)}): its test split could hold images it trained on; test it "
                f"with python eval.py ckpt_path={path} (its run's data; data=... there tests "
                "other data, prepared as it trained)"
            )
        if measured:  # a choice of evaluation (flip TTA for one), said: the figure differs
            log.warning(
                "train=false tests %s otherwise than its run measured val/* (%s): test/* are "
                "not the run's own figures (python eval.py ckpt_path=%s gives those)",
                path,
                "; ".join(measured),
                path,
            )
        return
    if data:
        raise CheckpointError(
            f"{path} trained on other data ({'; '.join(data)}): a resumed run continues the "
            "same training (its optimizer state, LR schedule and epoch count); resume with the "
            "run's data, or start a new run"
        )
    moved = _other_images(checkpoint, config, cfg)
    if moved:
        raise CheckpointError(
            f"{moved}: {path} trained on other images, and a resumed run trains on and tests "
            "the same ones (a copy of its folder, or the folder moved, holds them); resume on "
            "those, or start a new run"
        )
    seeds = _changed_seeds(config, cfg)
    if seeds:
        raise CheckpointError(
            f"a resumed run continues the random streams of {path} (its data order, its noise), "
            f"which {', '.join(seeds)} would change part way; resume with the run's seed, or "
            "start a new run"
        )
    objective = _changes(config, cfg, ["objective.metric", "objective.mode"])
    if objective:
        stored = config.get("objective") or {}
        given = f"objective.metric={stored.get('metric')} objective.mode={stored.get('mode')}"
        if (stored.get("metric"), stored.get("mode")) == ("val/acc", "max"):
            given = "objective=accuracy"  # e.g. a digits run from before digits chose val/loss
        raise CheckpointError(
            f"{', '.join(objective)}: {path}'s best checkpoint so far was chosen by the run's "
            "objective, and another would choose anew from the resumed epochs only (Lightning "
            f"keeps the best per metric and direction); resume with the run's objective "
            f"({given}; resume=<its run folder> takes it from there), or start a new run"
        )
    if measured:
        raise CheckpointError(
            f"{', '.join(measured)} would change what val/* measures part way (the best "
            "checkpoint then chosen across two measures); resume with the run's value, or "
            "start a new run"
        )
    averaged = "current_model_state" in checkpoint  # written with callbacks.ema
    if averaged != bool((cfg.get("callbacks") or {}).get("ema")):
        if averaged:
            what = (
                "with callbacks.ema (its state_dict holds the averaged weights, the raw ones "
                "beside them), and this run has none: it would train on from the averaged "
                "weights with the raw ones' optimizer state"
            )
        else:
            what = (
                "without callbacks.ema (its state_dict holds no average), and this run "
                "averages: its average would start over"
            )
        raise CheckpointError(
            f"{path} was written {what}; resume with callbacks.ema as the run had it, or start "
            "a new run"
        )
    changed = _changed_optimization(stored, cfg.model)
    if changed:
        raise CheckpointError(
            f"a resumed run restores its optimizer and LR schedule from {path}, so "
            f"{', '.join(changed)} would not apply; resume with the run's values, or start a "
            "new run to train with these"
        )
    budget, g_steps = cfg.model.get("max_g_steps"), (checkpoint.get("gan") or {}).get("g_steps")
    if budget is not None and g_steps is not None and g_steps >= budget:  # a GAN's own end
        raise CheckpointError(
            f"{path} has already taken {g_steps} generator steps and model.max_g_steps={budget}; "
            f"set model.max_g_steps above {g_steps} to train further"
        )
    limit = cfg.trainer.get("max_time")
    elapsed = ((checkpoint.get("callbacks") or {}).get("Timer") or {}).get("time_elapsed") or {}
    if limit is not None and elapsed.get("train") is not None:
        from lightning.pytorch.callbacks import Timer

        allowed = Timer(duration=limit)._duration  # (Lightning's parse: "DD:HH:MM:SS", a dict)
        if allowed is not None and elapsed["train"] >= allowed:
            raise CheckpointError(
                f"{path} has already trained for {elapsed['train']:.0f} s and trainer.max_time="
                f"{limit} allows {allowed:.0f} s (the time is restored with the checkpoint); "
                f"set a longer trainer.max_time to train further"
            )
    done = epochs_trained(checkpoint)  # a finished run's last.ckpt: all max_epochs of them
    if max_epochs is not None and max_epochs >= 0 and done >= max_epochs:
        raise CheckpointError(
            f"{path} has already trained {done} epochs and trainer.max_epochs={max_epochs}; "
            f"set trainer.max_epochs above {done} to train further"
        )


# What says which data a run learns from (not how it is batched or loaded): the source's own
# settings (its class, test split, stored size...) but those below, and how its training split
# is divided into what trains and what validates.
_DATA_KEYS = ("image_shape", "num_classes", "mean", "std", "val_fraction", "split_seed")
_DATA_KEYS += ("train_fraction",)
# A source's settings that say where its files are and how they are read, not which images:
# a run folder moved to another machine resumes with its data at another path.
LOADING_ONLY = {"data_dir", "download", "system_dir", "root", "input_dir", "cache", "cache_dir"}
LOADING_ONLY |= {"workers", "decode", "max_cache_size", "shuffle_window"}


def _source_keys(*sources: Any) -> list[str]:
    """The settings of these data sources that say which images (``source.<key>``): every one
    but ``_target_`` (compared apart) and where and how the files are read (LOADING_ONLY)."""
    named = {str(k) for source in sources for k in source} - LOADING_ONLY - {"_target_"}
    return [f"source.{key}" for key in sorted(named)]


def data_settings(config: DictConfig) -> dict[str, Any]:
    """What says which data a run learns from and validates on (``_changed_data``'s keys: not
    where its files are read from), each resolved apart as plain values (one the config cannot
    resolve here, e.g. an environment variable only a job has, left out): an Optuna study keeps
    it (litlab.sweep.study_measure) for ``changed_data_settings``."""
    node = OmegaConf.select(config, "data")
    if not isinstance(node, DictConfig):
        return {}
    source = node.get("source") if isinstance(node.get("source"), DictConfig) else {}
    keys = ["source._target_", *_DATA_KEYS, *_source_keys(source)]
    settings: dict[str, Any] = {}
    for key in keys:
        try:
            value = OmegaConf.select(node, key)
            if isinstance(value, DictConfig | ListConfig):
                value = OmegaConf.to_container(value, resolve=True)
        except Exception:  # an interpolation only a job resolves
            continue
        if value is not None:
            *parents, last = key.split(".")
            place = settings
            for part in parents:
                place = place.setdefault(part, {})
            place[last] = value
    return settings


def changed_data_settings(
    then: dict[str, Any], now: dict[str, Any], ignore: frozenset[str] = frozenset()
) -> list[str]:
    """``_changed_data`` of two ``data_settings``, but keys in ``ignore`` (data.<key>)."""
    changes = _changed_data(OmegaConf.create(then), OmegaConf.create(now))
    return [c for c in changes if c.split(":", 1)[0] not in ignore]


def _changed_data(stored: DictConfig, now: DictConfig) -> list[str]:
    """The data settings that differ between a checkpoint's run and this one, as
    "data.<key>: <then> -> <now>" (data=fashion_mnist on a digits run's checkpoint; another
    data.split_seed or data.source.test_fraction: images that trained now validated or tested)."""
    keys = ["source._target_"]
    if OmegaConf.select(stored, "source._target_") == OmegaConf.select(now, "source._target_"):
        keys += _source_keys(*(node.get("source") or {} for node in (stored, now)))
    return _changes(stored, now, [*keys, *_DATA_KEYS], "data.")


def _other_images(checkpoint: dict[str, Any], stored: DictConfig, now: DictConfig) -> str | None:
    """An image folder at another path than the run's (data.source.root, a loading setting: a
    run folder resumed on another machine) that holds none of the files sampled from the run's
    training split (the checkpoint's, by name and bytes), or streamed chunks at another place
    (data.source.input_dir) of another conversion: other images. None where there is nothing
    to compare (a checkpoint from before these were kept) or no such folder."""
    then, new = (OmegaConf.select(c, "data.source.input_dir") for c in (stored, now))
    if then and new and then != new:
        return _other_conversion(checkpoint, stored, now)
    then, new = (OmegaConf.select(c, "data.source.root") for c in (stored, now))
    folder = folder_of(new)
    if folder is None or then is None or folder == folder_of(then) or not folder.is_dir():
        return None
    sample = data_state(checkpoint, stored).get("trained_files")
    if not sample:
        return None
    if files_found(folder, sample):
        return None
    return (
        f"data.source.root: {then} -> {new} holds none of the {len(sample)} files sampled from "
        "the run's training split"
    )


def _other_conversion(
    checkpoint: dict[str, Any], stored: DictConfig, now: DictConfig
) -> str | None:
    """Streamed chunks at another data.source.input_dir that are another conversion than the
    run's (DST/meta's key of its source's files: a copy of the chunks has the run's)."""
    from litlab.data.streaming import read_meta

    key = data_state(checkpoint, stored).get("conversion")
    if not key:
        return None
    new = now.data.source.input_dir
    try:
        meta = read_meta(new, OmegaConf.select(now, "data.source.cache_dir"))
    except LitlabError:  # not there, not a conversion: the run's setup says so
        return None
    if meta.get("source_key") == key:
        return None
    return (
        f"data.source.input_dir: {stored.data.source.input_dir} -> {new} holds another "
        f"conversion (of {meta.get('source')}: other files, or files changed since)"
    )


def _changes(stored: DictConfig, now: DictConfig, keys: list[str], prefix: str = "") -> list[str]:
    """ "<prefix><key>: <then> -> <now>" for each key that the checkpoint's run set (``stored``)
    and this run's config (``now``) gives another value."""
    changes = []
    for key in keys:
        then, new = (
            OmegaConf.to_container(v, resolve=True) if isinstance(v, DictConfig | ListConfig) else v
            for v in (OmegaConf.select(stored, key), OmegaConf.select(now, key))
        )
        if then is not None and then != new:
            changes.append(f"{prefix}{key}: {then} -> {new}")
    return changes


# What seeds a run's random streams: the data order of every epoch (torch's and litlab's
# loaders draw it from (seed, epoch)) and a GAN's noise generators (model.noise_seed). The
# global generators' state is restored from a checkpoint, these are not.
_SEEDS = ("seed", "model.noise_seed")


def _changed_seeds(stored: DictConfig, now: DictConfig) -> list[str]:
    """The seeds that differ between a checkpoint's run and this one, as "<key>: <then> ->
    <now>" (resume=<run> seed=7: the rest of a resumed epoch in another order, some images
    twice and others not at all, and a GAN's later noise and FID latents from other streams)."""
    return _changes(stored, now, [key for key in _SEEDS if OmegaConf.select(now, key) is not None])


# Model settings that say what validation measures (with the model's default where unset):
# test-time flips average each image's logits with its mirror's.
# (a GAN's ema_decay: val/fid measures the averaged generator, which another decay makes
# another average part way; walkthrough 145)
_MEASURES = {"tta_flip": False, "ema_decay": 0.999}  # (the GAN's default: review 149)
# What FID (a GAN's val/fid, its objective) compares: its feature extractor and how many
# generated and real images.
_FID_MEASURE = [
    f"callbacks.fid.{key}" for key in ("extractor", "inception_weights", "num_samples", "num_real")
]


# Model settings that shape the optimizer's parameter groups, restored from the checkpoint.
_OPTIMIZER_GROUPS = ("decay_norm_and_bias",)
# A net's settings that say only where its first weights come from (pretrained ones), which a
# checkpoint's weights replace.
_INITIAL_WEIGHTS = ("weights",)


def _flat(node: Any, prefix: str) -> dict[str, Any]:
    """A config node as {"<prefix>.<key>.<key>": value}, lists as values."""
    if not isinstance(node, DictConfig):
        return {prefix: node}
    out: dict[str, Any] = {}
    for key in node:
        out.update(_flat(node[key], f"{prefix}.{key}"))
    return out


def _changed_network(stored: DictConfig, now: DictConfig) -> list[str]:
    """The network settings that differ between a checkpoint's run and this one, as
    "model.<node>.<key>: <then> -> <now>": the model's nodes that build a module (a
    ``_target_``: model.net, a GAN's model.generator and model.discriminator), not its optimizers
    and schedules (``_changed_optimization``). resume=<run> model.net.width=16 passed every
    check and ended in a size-mismatch traceback as the checkpoint's weights were loaded."""
    changes = []
    for key in sorted({str(k) for k in (*stored, *now)}):
        nodes = [node.get(key) for node in (stored, now)]
        builds = any(isinstance(n, DictConfig) and "_target_" in n for n in nodes)
        if not builds or "optimizer" in key or "scheduler" in key:
            continue
        then, new = (_flat(n, f"model.{key}") for n in nodes)
        changes += [
            f"{name}: {_plain(then.get(name))} -> {_plain(new.get(name))}"
            for name in {**then, **new}
            if name.rsplit(".", 1)[-1] not in _INITIAL_WEIGHTS and then.get(name) != new.get(name)
        ]
    return changes


def _changed_gan_state(stored: DictConfig, now: DictConfig) -> list[str]:
    """A GAN's settings that shape its state beside its nets, as "model.<key>: <then> ->
    <now>": its EMA generator there or not (model.ema_decay null or not) and the fixed noise of
    its sample grids (model.num_fixed_noise). Either ended a resume in Lightning's traceback
    (unexpected keys generator_ema.*; size mismatch for fixed_noise)."""
    changes = []
    both = "ema_decay" in stored and "ema_decay" in now  # (one left to the model's default)
    if both and (stored.ema_decay is None) != (now.ema_decay is None):
        changes.append(f"model.ema_decay: {stored.ema_decay} -> {now.get('ema_decay')}")
    if "num_fixed_noise" in stored and stored.num_fixed_noise != now.get("num_fixed_noise"):
        changes.append(
            f"model.num_fixed_noise: {stored.num_fixed_noise} -> {now.get('num_fixed_noise')}"
        )
    return changes


def _plain(value: Any) -> Any:
    """A config value as the user wrote it ([2, 2] for a list, not a ListConfig's repr)."""
    return OmegaConf.to_container(value) if isinstance(value, ListConfig) else value


def _changed_optimization(stored: DictConfig, now: DictConfig) -> list[str]:
    """The optimizer and LR-schedule settings (model.*optimizer*, model.*scheduler*, and what
    makes the optimizer's parameter groups) that differ between a checkpoint's run and this one,
    as "model.<key>: <then> -> <now>": Lightning restores the optimizer's and the schedule's
    state (learning rate, momentum, weight decay, the schedule's own settings), so new values
    there would be recorded but not used (other parameter groups: not restored at all)."""
    changes = []
    for key in now:
        optimization = "optimizer" in str(key) or "scheduler" in str(key)
        if (optimization or key in _OPTIMIZER_GROUPS) and key in stored:
            if (stored[key] is None) != (now[key] is None):  # switched on or off, as a whole
                named = [
                    n.get("_target_", "set") if isinstance(n, DictConfig) else n
                    for n in (stored[key], now[key])
                ]
                changes.append(f"model.{key}: {named[0]} -> {named[1]}")
                continue
            then, new = _flat(stored[key], f"model.{key}"), _flat(now[key], f"model.{key}")
            changes += [
                f"{name}: {then.get(name)} -> {new.get(name)}"
                for name in {**then, **new}  # either side's keys (model.scheduler=null: none)
                if then.get(name) != new.get(name)
            ]
    return changes
