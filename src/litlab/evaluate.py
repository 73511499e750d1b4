"""The eval task: rebuild data and model from a checkpoint's stored config and test it."""

from __future__ import annotations

import importlib
import inspect
import logging
import re
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import hydra
import lightning as L
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf, open_dict

from litlab.callbacks.gan import (
    FID,
    give_checkpoint_state,
    require_gan,
    save_generated_images,
)
from litlab.callbacks.speed import Speed
from litlab.checkpoint import data_state, load_checkpoint, stored_config
from litlab.config import (
    build,
    build_model,
    check_all,
    check_top_level,
    config_dir,
    require,
)
from litlab.data.fingerprint import (
    files_found,
    files_found_as_split,
    files_found_by_content,
    files_found_renamed,
    folder_of,
    split_entries,
)
from litlab.data.folder_index import class_names, scan, split_folders
from litlab.distributed import adopt_launcher_layout
from litlab.distributed.agree import OnePrecision
from litlab.errors import ConfigError, DataError
from litlab.hardware import GPU_ONLY_PRECISIONS, check_hardware, on_gpu, resolve_precision
from litlab.loggers import check_forked_wandb, finish_loggers
from litlab.nets.torchvision_net import weights_from_checkpoint
from litlab.run import HoldStopAfterTest, Run, build_list, config_digest, freeze_the_imports
from litlab.train import (
    check_argv,
    evaluation_limits,
    record_stage,
    resolved_config,
    setup_extras,
    show_config,
)

log = logging.getLogger("litlab")

USAGE = "python eval.py ckpt_path=outputs/train/<date>/<time>/checkpoints/best.ckpt"


def evaluate(cfg: DictConfig, run: Run) -> dict[str, Any]:
    """Test the checkpoint on the stored data config (or data=... given here)."""
    check_top_level(cfg, "eval")
    # Under torchrun or srun, the processes' layout (trainer.devices=1 against torchrun's 2:
    # Lightning's "does not match the world size", after the data and model were built)
    adopt_launcher_layout(cfg.trainer)
    refuse_an_objective_given()
    path = require(cfg, "ckpt_path", USAGE)
    checkpoint = load_checkpoint(path)
    stored = stored_config(checkpoint, path)
    # The stored config is resolved; a data=... choice made here is resolved against this run.
    trained_state = data_state(checkpoint, stored)
    if cfg.get("data") and "_target_" not in cfg.data:  # +data.eval_batch_size=... alone: the
        with open_dict(cfg):  # run's data with that changed
            cfg.data = OmegaConf.merge(stored.data, cfg.data)
    count = generate_count(cfg.get("generate"))
    for key in ("image_shape", "num_classes"):
        if cfg.get("data") and OmegaConf.is_missing(cfg.data, key):  # data=image_folder's
            cfg.data[key] = stored.data[key]  # classes: the model's (the data set up checks them)
    # the run's own data too: its chunks may have been converted again since (walkthrough 168)
    chosen = cfg.data if cfg.get("data") else stored.data
    parts = OmegaConf.create({"data": other_data(chosen, stored.data, trained_state)})
    parts.model = stored.model
    check_all(parts)
    why = trained_precision(cfg.trainer, stored)
    run.summary["precision"] = resolve_precision(cfg.trainer)
    if why is not None:  # (its why said "as configured": walkthrough 178)
        run.summary["precision"].update(requested="trained", why=why)
    check_all(cfg)
    check_hardware(cfg.trainer)
    check_forked_wandb(cfg)
    limits = evaluation_limits(cfg, ("test",))
    if limits:
        run.summary["evaluation_limits"] = limits
    setup_extras(cfg)
    show_config(cfg)
    L.seed_everything(cfg.seed, workers=True)
    path = str(Path(path).resolve())  # not relative to where eval ran
    run.summary["checkpoint"] = path
    run.summary["checkpoint_step"] = checkpoint.get("global_step")  # (a file's name is reused)
    # the training run's config_digest (of the config a tuned run continued with, if tuned)
    run.summary["trained_config_digest"] = config_digest(stored)
    run.summary["metric"], mode = eval_objective(stored)

    datamodule = build(parts.data, "data")
    # the class names the model learned (image folders), checked when the data is set up
    datamodule.load_state_dict(data_state(checkpoint, stored))
    with weights_from_checkpoint():  # (a pretrained net's: the checkpoint's, not downloaded)
        model = build_model(parts.model, datamodule)
    model.load_state_dict(checkpoint["state_dict"])
    model.on_load_checkpoint(checkpoint)  # as Lightning's loads do: a GAN's step counts (g/step)
    if count:
        require_gan(model, "generate=N", "generate=0")  # before the test, not after it
    # Evaluation callbacks of the trained run (a GAN's FID and sample grids) test it the same
    # way; the others are not built (their classes may not be importable here).
    kept = eval_callbacks(stored.get("callbacks"))
    other = other_fid_extractor(cfg, kept)
    # For the loggers, as a training run's (W&B's config, hparams.yaml): the config the model
    # was trained with, the data tested and the checkpoint (an eval's W&B run had no config),
    # and the FID extractor the test measures through where it is another (review 149)
    model.save_hyperparameters(
        {
            **resolved_config(stored),
            "data": OmegaConf.to_container(parts.data, resolve=True),
            "ckpt_path": str(path),
            **({"fid_extractor": str(kept.fid.extractor)} if other else {}),
        }
    )
    loggers = build_list(cfg.get("logger"), "logger")
    callbacks = build_list(kept, "callbacks")
    if not other:
        give_checkpoint_state(callbacks, checkpoint)  # FID through the run's own extractor
    callbacks += [*trained_numerics(stored), OnePrecision(), HoldStopAfterTest(run)]
    callbacks.append(SpawnedDataAccount(run))
    trainer = build(cfg.trainer, "trainer", logger=loggers, callbacks=callbacks)
    run.summary["world_size"] = trainer.world_size  # as a training run's (the report's processes)
    ended: BaseException | None = None
    try:
        with run.phase("test"):
            trainer.test(model, datamodule=datamodule)
        record_stage(trainer, datamodule, run, "test")
        spawned = run.spawned_performance().get("data", {})  # (ddp_spawn's rank 0 set it up)
        run.summary["data"] = tested_data({**datamodule.report(), **spawned}, callbacks)
        # What eval -m over checkpoints ranks by (the report, sweep_summary.json): the test
        # value of the trained run's objective, in its direction
        metric = run.summary["metric"]
        run.summary["objective"] = {
            "metric": metric,
            "mode": mode,
            "value": run.summary["metrics"].get(metric),
        }
        if count:  # generating may take long: a SIGTERM held since the test's end stops it
            run.stop_if_asked()  # here, and one during it stops it (as outside any trainer)
        if count and trainer.is_global_zero:  # once (every rank wrote all of them)
            folder = Path(cfg.paths.output_dir) / "generated"
            with run.phase("generate"):
                run.summary["generated"] = save_generated_images(model, count, folder)
            run.summary["generated_dir"] = str(folder)
        run.say_results()
    except BaseException as e:
        ended = e
        raise
    finally:  # after the generation too: W&B shows a run stopped while generating as stopped
        finish_loggers(trainer.loggers, ended)
    return run.summary["metrics"]


def generate_count(value: Any) -> int:
    """generate=N: a whole number of images to write, 0 for none."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"generate={value}: give the number of images to write (0: none)")
    return value


def trained_precision(trainer: DictConfig, stored: DictConfig) -> str | None:
    """trainer.precision=trained (eval's default): the precision the run trained and tested
    with, so that eval's test/* are the run's; float16 autocast on a CPU, which no CPU runs:
    32-true (16-true runs there, emulated, and stays: it was 32-true too, other figures).
    Returns why, for summary.json; None where another precision was asked for."""
    if str(trainer.get("precision")) != "trained":
        return None
    precision = str((stored.get("trainer") or {}).get("precision") or "32-true")
    on_cpu = not on_gpu(str(trainer.get("accelerator", "auto")))
    if precision in GPU_ONLY_PRECISIONS and on_cpu:
        log.info("trainer.precision=32-true: the run trained in %s, which needs a GPU", precision)
        trainer.precision = "32-true"
        return f"the run's {precision} needs a GPU (trained)"
    log.info("trainer.precision=trained: %s, the run's", precision)
    trainer.precision = precision
    return "the run's (trained)"


class SpawnedDataAccount(L.Callback):
    """A test in spawned processes (ddp_spawn): the data's account that their rank 0 set up
    (the test split's images, the classes), for this process's summary, whose DataModule read
    nothing (review 177: its data was the source's name alone, and the report put the run on
    another scale)."""

    def __init__(self, run: Run) -> None:
        self.run = run

    def spawned_record(self, trainer: L.Trainer) -> dict[str, Any]:
        report = getattr(trainer.datamodule, "report", None)
        return {"data": report()} if report is not None else {}

    def take_spawned_record(self, record: dict[str, Any]) -> None:
        self.run.take_spawned_record(record)


def tested_data(report: dict[str, Any], callbacks: list[Any]) -> dict[str, Any]:
    """The DataModule's report of what an evaluation read: the test split (the images tested,
    the files skipped), and the training split where an FID's real statistics come from it;
    not the training and validation sizes a classifier's test never read."""
    splits, classes = report.get("splits"), report.get("class_images")
    if not any(isinstance(c, FID) for c in callbacks):
        if splits:
            report["splits"] = {k: v for k, v in splits.items() if k == "test"}
        if classes:  # (review 159: the training split's, beside the test alone)
            report["class_images"] = {k: v for k, v in classes.items() if k == "test"}
    return report


def other_data(
    chosen: DictConfig, trained: DictConfig, trained_state: dict[str, Any] | None = None
) -> DictConfig:
    """The data chosen for testing, prepared as the model was trained (the network only knows
    the inputs it was trained on): normalized, stored and framed as in training, and, where it
    is the training data itself, split as in training (a larger test share of a folder or of
    digits would take in images the model trained on; another validation share, other real
    images for an FID); refused when its images or classes
    differ. ``trained_state``: the training DataModule's state in the checkpoint (its class
    names, a sample of the files trained on)."""
    data = OmegaConf.to_container(chosen, resolve=True)
    before = OmegaConf.to_container(trained, resolve=True)
    source, trained_source = data["source"], before["source"]
    if {"size", "channels"} <= source.keys():  # files, decoded to any shape (a folder, chunks)
        as_trained(data, before, ("image_shape",), "shaping the test images")
        source["channels"] = data["image_shape"][0]
    state = trained_state or {}
    names_as_trained(source, trained_source)
    for key in ("image_shape", "num_classes"):
        if data[key] != before[key]:
            if key == "num_classes" and published_names(source) is not None:  # a model of
                # named classes on a dataset of others: that, not the count's advice, refused
                # next for the names (walkthrough 182)
                numbers_as_trained(source, trained_source, state.get("classes"))
            raise ConfigError(
                f"the model was trained on data.{key}={before[key]} but this data has "
                f"{data[key]}; test it on data of the same {key.replace('_', ' ')} (set "
                f"data.{key}={before[key]}"
                + (", and data.source.channels to match" if key == "image_shape" else "")
                + ")"
            )
    as_trained(data, before, ("mean", "std"), "normalizing this data")
    as_trained(data, before, ("eval_crop",), "framing the test images")
    as_trained(source, trained_source, ("size",), "storing the images")
    decoded_as_trained(source, trained_source)
    if same_source(source, trained_source):
        as_trained(source, trained_source, ("test_fraction",), "holding out the run's test images")
        # the training split as the run drew it: a GAN's FID compares with its images (and
        # fid_floor measures them); data=<the run's option> again brought the option's
        # val_fraction back, and the FID its own reference set, without a word (review 169)
        as_trained(data, before, ("val_fraction", "split_seed"), "splitting off validation")
    label_as_trained(source, trained_source, state.get("classes"), before["num_classes"])
    numbers_as_trained(source, trained_source, state.get("classes"))
    converted = converted_from(trained_source, state.get("converted_from"))
    other_folder(source, trained_source, state.get("trained_files"), converted)
    chunks_as_trained(source, trained_source, state.get("conversion"), converted)
    return OmegaConf.create(data)


def same_place(a: str, b: str) -> bool:
    """Whether two data locations are one: local folders resolved (relative, ~, links), a
    bucket's URL as written."""
    if "://" in a or "://" in b:
        return a.rstrip("/") == b.rstrip("/")
    return folder_of(a) == folder_of(b)


def chunks_as_trained(
    source: dict[str, Any],
    trained: dict[str, Any],
    conversion: str | None,
    converted: tuple[Path, float, int | None] | None = None,
) -> None:
    """Streamed chunks whose test split holds images the run trained on, refused: the run's
    own chunks converted again since (``conversion``, the checkpoint's key of them, another:
    other files or fractions; a resume refuses them too), or chunks converted from the run's
    training folder, or from the folder its own chunks were converted from (``converted``:
    converted_from), at another test fraction than the run held out (walkthrough 130: 164 of
    330 images tested were trained or validated on, without a word; walkthrough 168: the same
    for a run on chunks, tested on chunks of its folder converted again)."""
    meta = chunks_meta(source)
    if meta is None:  # not chunks, or unreadable here: the test's setup says why
        return
    where = source["input_dir"]
    same = trained.get("input_dir") and same_place(str(trained["input_dir"]), str(where))
    if same and conversion and meta.get("source_key") not in (None, conversion):
        raise ConfigError(
            f"{where} holds another conversion than the one the run trained on (converted "
            "again since, of other or changed files or at other fractions): its test split is "
            "not the run's and may hold images it trained on; test the chunks it trained on, "
            "or convert its folder again as it was"
        )
    these = conversion_of(meta)
    if these is None:
        return
    folder, test, _ = these
    if trained.get("root") and trained.get("test_fraction") is not None:
        held_out, whose = float(trained["test_fraction"]), "the run's training folder"
        if folder != folder_of(trained["root"]):
            return
    elif converted is not None and folder == converted[0]:
        held_out, whose = converted[1], "the folder the run's chunks were converted from,"
    else:
        return
    if test != held_out and "test" not in (split_folders(folder) or {}):  # (its test/: the same)
        raise ConfigError(
            f"{where} was converted from {whose} {folder} holding out {test:g} of it for "
            f"testing, where the run held out {held_out:g}: its test split holds images the run "
            f"trained on; convert it with --test-fraction {held_out:g}, or test the folder "
            "itself (data=image_folder)"
        )


def as_trained(
    node: dict[str, Any], trained: dict[str, Any], keys: tuple[str, ...], why: str
) -> None:
    """Set ``keys`` of ``node`` to their values in training where both have them, saying so."""
    changed = [k for k in keys if k in node and k in trained and node[k] != trained[k]]
    if changed:
        log.info(
            "%s as in training: %s",
            why,
            ", ".join(f"{k} {trained[k]} (not {node[k]})" for k in changed),
        )
        node.update({k: trained[k] for k in changed})


def decoded_as_trained(source: dict[str, Any], trained: dict[str, Any]) -> None:
    """JPEGs decoded where the run's were (data.source.decode): the loader's workers (PIL) and
    the run's device (torchvision's decoder, then torch's resize) make other pixels of one file.
    Decoded on the device, the images are read as files (cache=false), as the run read them."""
    as_trained(source, trained, ("decode",), "decoding the images")
    if source.get("decode") == "device" and source.get("cache"):
        log.info("reading the files as decoded on the device, as in training: cache false")
        source["cache"] = False


def same_source(source: dict[str, Any], trained: dict[str, Any]) -> bool:
    """Whether a data source is the one the run trained on: the same class and folder."""
    return source.get("_target_") == trained.get("_target_") and folder_of(
        source.get("root")
    ) == folder_of(trained.get("root"))


# Sampled training files found under other names from which a folder is refused as a copy:
# fewer are taken for a dataset's duplicates (the same image in its training and test folders).
RENAMED_COPIES = 5


def sampled_contents(sample: list[list[Any]] | None) -> int:
    """How many distinct images (contents) a sample of training files holds."""
    return len({entry[1] for entry in sample or [] if len(entry) > 2 and entry[1]})


def other_folder(
    source: dict[str, Any],
    trained: dict[str, Any],
    trained_files: list[list[str]] | None = None,
    converted: tuple[Path, float, int | None] | None = None,
) -> None:
    """An image folder of class folders only, other than the training one: every image is
    tested (``test_all``), not the share its file names would hold out for testing in a run
    that trained on it. The same folder keeps its held-out test split (the others were trained
    on), and so does one that holds files the run trained on (``trained_files``, a sample in
    the checkpoint: a copy of the training folder, or the folder moved); a folder with a test/
    (or val/) folder is tested on that. +data.source.test_all=true: every image, as asked.
    ``converted``: where a streamed run's chunks came from (converted_from), None for others."""
    folder = another_folder(source, trained)
    if folder is None or source.get("test_all"):
        return
    layout = split_folders(folder)
    if layout is not None:  # tested on its test/ (or val/) folder: a copy of the run's own?
        refuse_a_split_folder_of_the_run(layout["test"], trained, trained_files)
        return
    if converted is not None and folder == converted[0]:  # the run streamed this folder's chunks
        log.warning(
            "%s is the folder the run's chunks (%s) were converted from: testing the share its "
            "file names hold out, as the run did (test_fraction %s; +data.source.test_all=true "
            "tests every image)%s",
            folder,
            trained.get("input_dir"),
            converted[1],
            ""
            if converted[2] is None
            else f"; the run saw them shrunk to {converted[2]} pixels a side and saved as JPEG "
            "(--max-side), these are the original files: other pixels, so another figure than "
            "its test on the chunks",
        )
        source["test_fraction"] = converted[1]
        return
    found = files_found(folder, trained_files or [])
    if found:
        as_trained(source, trained, ("test_fraction",), "holding out the run's test images")
        origin = trained.get("root")
        if origin is None and converted is not None:  # a copy of the folder its chunks came from
            source["test_fraction"], origin = converted[1], converted[0]
        sampled = len(trained_files or [])
        # a few among other images (walkthrough 182: 3 training files among 80 new ones, said
        # to be "a copy of its training folder", 14 of 83 tested): what else may be there is
        # not known (256 files sampled), so the share their names hold out, said as it is
        what = (
            f"a copy of its training folder {origin}, or that folder moved, images added or not"
            if 2 * found >= sampled
            else f"some of the run's training images among others; remove them (the folder "
            f"{origin} trained on) to test every image"
        )
        log.warning(
            "%s holds %d of %d files sampled from the run's training split, under their names, "
            "byte for byte (%s): testing the share its file names hold out, as the run did, "
            "none of which it trained on (+data.source.test_all=true tests every image)",
            folder,
            found,
            sampled,
            what,
        )
        return
    refuse_a_split_folder_of_the_run(folder, trained, trained_files)
    if files_found_renamed(folder, trained_files or []):
        names = [entry[0] for entry in trained_files or []]
        form = "nfc" if all(unicodedata.is_normalized("NFC", n) for n in names) else "nfd"
        raise ConfigError(
            f"{folder} holds the run's training files under names whose accented letters are "
            f"written in another Unicode form than the run's ({form.upper()}; macOS writes "
            "NFD), which hold out another test share: tested, it would measure images the run "
            f"trained on. Rename them as the run's were (`convmv -r -f utf8 -t utf8 --{form} "
            f"--notest {folder}`), or test another folder"
        )
    renamed = files_found_by_content(folder, scan(folder).files, trained_files or [])
    if renamed >= RENAMED_COPIES:
        raise ConfigError(
            f"{folder} holds {renamed} of the {sampled_contents(trained_files)} images sampled "
            "from the run's training split under other names, byte for byte (a renamed copy of its "
            "training images, or part of them): tested, it would measure images the run "
            "trained on. Test the run's own held-out split (eval.py ckpt_path=<checkpoint> "
            "without data.source.root) or a folder without them; +data.source.test_all=true "
            "tests every image of it as asked"
        )
    if renamed:  # (a dataset's few identical images, in its test folder and its training one)
        log.warning(
            "%s holds %d of the %d images sampled from the run's training split under other "
            "names, byte for byte (duplicates across the two folders?): those images count in "
            "its test figures though the run trained on them",
            folder,
            renamed,
            sampled_contents(trained_files),
        )
    source["test_all"] = True
    if converted is not None:  # said louder: litlab cannot tell a copy of that folder from others
        log.warning(
            "testing every image of %s: the model was trained on chunks (%s) converted from %s, "
            "and a copy of that folder holds its training images",
            folder,
            trained.get("input_dir"),
            converted[0],
        )
        return
    log.info("testing every image of %s (the model was trained on %s)", folder, trained_on(trained))


def refuse_a_split_folder_of_the_run(
    folder: Path, trained: dict[str, Any], trained_files: list[list[str]] | None
) -> None:
    """``folder`` (class folders, tested whole) holding files sampled from a split-layout run's
    train/ or val/ folder, named as there: that folder or a copy, whose images the run trained
    on or chose its checkpoint by, is refused; a few of them (a dataset's duplicates across
    its splits: files named by their content) are warned of, as under other names."""
    inside = files_found_as_split(folder, trained_files or [])
    split_sampled = len(split_entries(trained_files or []))
    if 0 < inside < min(RENAMED_COPIES, split_sampled):
        log.warning(
            "%s holds %d of the %d files sampled from the run's training and validation splits "
            "(duplicates across the splits?): those count in its test figures though the run "
            "trained or validated on them",
            folder,
            inside,
            split_sampled,
        )
    elif inside:
        raise ConfigError(
            f"{folder} holds {inside} of {len(trained_files or [])} files sampled from the "
            f"run's training and validation splits, byte for byte, named as in its train/ or "
            f"val/ folder (the run trained on {trained_on(trained)}, laid out in splits): that "
            "folder or a copy, whose images the run trained or validated on, or images of it "
            "among others. Test the run's own held-out split (eval.py ckpt_path=<checkpoint> "
            "without data.source.root) or a folder without them; +data.source.test_all=true "
            "tests every image of it as asked"
        )


def trained_on(trained: dict[str, Any]) -> Any:
    """What the run trained on, in words: its folder, its chunks, or its source's class."""
    return trained.get("root") or trained.get("input_dir") or trained.get("_target_")


def another_folder(source: dict[str, Any], trained: dict[str, Any]) -> Path | None:
    """The image folder ``source`` reads where it is not the training source's folder."""
    root = source.get("root")
    if "test_fraction" not in source or not root or not Path(root).expanduser().is_dir():
        return None
    folder = folder_of(root)
    return None if folder == folder_of(trained.get("root")) else folder


def label_as_trained(
    source: dict[str, Any],
    trained: dict[str, Any],
    trained_classes: list[str] | None,
    count: int,
) -> None:
    """Label the images of a folder other than the training one by the model's class names
    (``source.classes``): a label is a class's position among the class folders, so a folder
    with some of the model's ``count`` classes would otherwise give images the wrong labels
    (a class the model does not know: ImageFolder refuses it). Refused where it has fewer
    classes and the checkpoint holds no class names (a model trained on another source)."""
    folder = another_folder(source, trained)
    if folder is None:
        return
    folders = split_folders(folder)
    here = class_names(folders["train"] if folders else folder)
    published = published_names(trained)
    numbers = bool(here) and all(is_number(name) and int(name) < count for name in here)
    if trained_classes is None and numbers:  # folders named by the labels' numbers, 0 or 00,
        # whatever names the dataset publishes (10, 11 sort before 2; review 179: Fashion-MNIST's
        # model was refused a folder of 0..9)
        labelled = dict.fromkeys(numbered(count))
        for name in here:
            if labelled[str(int(name))] is not None:  # 1 and 01 (review 180: unclear refusal)
                raise DataError(
                    f"{folder}'s class folders {labelled[str(int(name))]!r} and {name!r} both "
                    f"name label {int(name)}; keep one folder a class"
                )
            labelled[str(int(name))] = name
        published = tuple(labelled[str(label)] or str(label) for label in range(count))
    if trained_classes is None and published is not None and len(published) == count:
        # a model trained on digits, Fashion-MNIST...: its label i is the dataset's class i,
        # which a folder names (review 177: "zero".."nine", or Fashion-MNIST's names in their
        # sorted order, were labelled by sorted position: test/acc 0.09 without a word)
        trained_classes = folders_by_name(folder, here, published, trained)
    elif trained_classes is None and len(here) >= count and here != numbered(len(here)):
        log.warning(
            "labelling %s's class folders by their sorted positions, %s: the checkpoint holds "
            "no class names (trained on %s), so these must be the model's labels 0-%d in order "
            "(folders named by the labels' numbers are)",
            folder,
            ", ".join(f"{name}={label}" for label, name in enumerate(here[:12]))
            + (", ..." if len(here) > 12 else ""),
            trained_on(trained),
            count - 1,
        )
    if trained_classes is None or here == list(trained_classes):
        if trained_classes is None and len(here) < count:
            raise ConfigError(
                f"{folder} has {len(here)} class folders but the model has {count} classes, "
                f"whose names its checkpoint does not hold (trained on {trained_on(trained)}): "
                "labels are positions among the sorted class folders, so test it on a folder of "
                f"all {count}"
            )
        return
    known = [str(name) for name in trained_classes]
    source["classes"] = known  # a class folder the model does not know: refused where labelled
    absent = [name for name in known if name not in here]
    log.info(
        "labelling %s by the model's %d classes (%s)",
        folder,
        len(known),
        f"no folder here for {absent}" if absent else f"in the model's order: {known}",
    )


def is_number(name: str) -> bool:
    """Whether a class name is a label's number (0, 07; not "²", which int() refuses)."""
    return name.isascii() and name.isdecimal()


def numbered(count: int) -> list[str]:
    """Class names that are the labels' own numbers, in label order."""
    return [str(label) for label in range(count)]


def imported(target: Any) -> Any:
    """The object a config node's ``_target_`` names; None where it cannot be imported here
    (not Hydra's get_class: it logs its own error first)."""
    module, _, name = str(target or "").rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except Exception:
        return None


def published_names(source: dict[str, Any]) -> tuple[str, ...] | None:
    """The names a dataset publishes for its labels (Source.label_names: digits, MNIST,
    Fashion-MNIST, CIFAR-10); None for sources whose labels are numbers alone (or whose class
    cannot be imported here)."""
    return getattr(imported(source.get("_target_")), "label_names", None)


def name_key(name: str) -> str:
    """A class name as a folder may spell it, case, spaces and punctuation aside (a folder
    cannot be named Fashion-MNIST's "T-shirt/top": T-shirt_top, tshirt top)."""
    return "".join(c for c in unicodedata.normalize("NFKC", name).casefold() if c.isalnum())


# A class folder named with its label's number first, to sort in label order: 0-t-shirt_top
NUMBERED = re.compile(r"(\d+)[-_. ]+(.*\w.*)")


def label_named(name: str, label_of: dict[str, int]) -> int | None:
    """The label a class folder names among a dataset's (``label_of``: name_key -> label), by
    its name, or by a name after its label's own number (walkthrough 182:
    scripts/make_image_folder.py's 0-t-shirt..9-ankle-boot were refused as none of them)."""
    label = label_of.get(name_key(name))
    prefixed = NUMBERED.fullmatch(name) if label is None else None
    if prefixed and label_of.get(name_key(prefixed[2])) == int(prefixed[1]):
        return int(prefixed[1])
    return label


def labels_by_name(published: Sequence[str]) -> dict[str, int]:
    """A dataset's labels by their published names' keys (name_key), for label_named."""
    return {name_key(name): label for label, name in enumerate(published)}


def folders_by_name(
    folder: Path, here: list[str], published: tuple[str, ...], trained: dict[str, Any]
) -> list[str]:
    """The folder's class folder for each of a dataset's labels, by the names it publishes
    (the name itself where the folder has none); refused where a folder is none of them."""
    label_of = labels_by_name(published)
    classes, unknown, found = list(published), [], {}
    for name in here:
        label = label_named(name, label_of)
        if label is None:
            unknown.append(name)
            continue
        if label in found:  # (two spellings of one class: one would be refused, unclearly)
            raise DataError(
                f"{folder}'s class folders {found[label]!r} and {name!r} both name the "
                f"model's class {published[label]!r}; keep one folder a class"
            )
        classes[label] = found[label] = name
    if unknown:
        raise DataError(
            f"{folder}'s class folders {unknown} are none of the classes the model learned, "
            f"{trained_on(trained)}'s labels 0-{len(published) - 1}: {', '.join(published)}; "
            "name each folder as its class (case, spaces and punctuation aside; after its "
            "label's number: 0-t-shirt_top)"
        )
    return classes


def names_as_trained(source: dict[str, Any], trained_source: dict[str, Any]) -> None:
    """A model trained on a dataset whose labels have published names (digits, MNIST,
    Fashion-MNIST, CIFAR-10) tested on another of them: refused where the names differ (a
    digits model on data=fashion_mnist, both of 10 classes, scored 0.17 without a word:
    walkthrough 186); the same names (digits and MNIST: 0-9) test as they are."""
    trained, here = published_names(trained_source), published_names(source)
    if trained is None or here is None or list(map(name_key, trained)) == list(map(name_key, here)):
        return
    raise DataError(
        f"the model learned {trained_on(trained_source)}'s classes, labels 0-{len(trained) - 1} "
        f"for {', '.join(trained)}; this data's labels 0-{len(here) - 1} are "
        f"{', '.join(here)}: its scores would be of other classes; test it on data of its "
        "classes (its dataset, or an image folder of its classes: data=image_folder "
        "data.source.root=<folder>)"
    )


def numbers_as_trained(
    source: dict[str, Any], trained_source: dict[str, Any], trained_classes: list[str] | None
) -> None:
    """A model trained on named classes (an image folder, chunks) tested on a source whose
    labels are numbers: its output i is its class ``trained_classes[i]``, which must be the
    source's class i (a model of "zero".."nine" folders tested on data=digits scored 0.10
    without a word: review 177). Refused where the dataset's published names differ; said
    where it publishes none."""
    if trained_classes is None or {"root", "input_dir"} & source.keys():
        return
    if same_source(source, trained_source):  # (a source of one's own with names: its own)
        return
    trained = [str(name) for name in trained_classes]
    published = published_names(source)
    numbers = all(map(is_number, trained))  # (00..09 too: review 179)
    label_of = labels_by_name(published or ())
    if (numbers and [int(name) for name in trained] == list(range(len(trained)))) or (
        published is not None
        and len(trained) == len(published)
        and all(label_named(name, label_of) == label for label, name in enumerate(trained))
    ):
        return
    if published is None:
        log.warning(
            "the model's labels stand for the classes it trained on, %s; this data's labels "
            "are numbers, taken for those classes in that order",
            trained,
        )
        return
    same = sorted(map(name_key, trained)) == sorted(map(name_key, published))
    raise DataError(
        f"the model's labels stand for the classes it trained on, {trained}, and this data's "
        f"labels 0-{len(published) - 1} for {list(published)}"
        + (" (the same classes in another order: a folder's are sorted)" if same else "")
        + ": its scores would be of other classes; test it on an image folder of its classes "
        "(data=image_folder data.source.root=<folder>)"
    )


def converted_from(
    trained: dict[str, Any], record: dict[str, Any] | None = None
) -> tuple[Path, float, int | None] | None:
    """The folder a streamed run's chunks were converted from, the conversion's test
    fraction and its --max-side (None: the files' own bytes; DST/meta, litlab.data.optimize):
    the checkpoint's ``record`` of them (DataModule.state_dict's converted_from), else read
    from the chunks; None for other sources, or where the chunks cannot be read here (moved,
    a bucket without credentials) and the checkpoint holds no record."""
    if record and record.get("source") and record.get("test") is not None:
        return folder_of(record["source"]), float(record["test"]), record.get("max_side")
    meta = chunks_meta(trained)
    return None if meta is None else conversion_of(meta)


def chunks_meta(source: dict[str, Any]) -> dict[str, Any] | None:
    """What the conversion of a streamed source's chunks recorded (DST/meta); None for other
    sources, or where the chunks cannot be read here (moved, a bucket without credentials)."""
    if not source.get("input_dir"):
        return None
    from litlab.data.streaming import read_meta

    try:
        return read_meta(str(source["input_dir"]), source.get("cache_dir"))
    except Exception:
        return None


def conversion_of(meta: dict[str, Any]) -> tuple[Path, float, int | None] | None:
    """(the folder converted, its test fraction, --max-side) from a conversion's meta; None
    where it names no folder or fraction."""
    source, test = meta.get("source"), (meta.get("fractions") or {}).get("test")
    if not source or test is None:
        return None
    return folder_of(source), float(test), (meta.get("options") or {}).get("max_side")


def trained_numerics(stored: DictConfig) -> list[Speed]:
    """The float32 matmul precision the run trained and tested with
    (``callbacks.speed.matmul_precision``: TF32 on GPUs with "high", bfloat16 passes on some
    CPUs with "medium") and its memory format (``channels_last``: other convolution kernels,
    other roundings under bf16: one test image of 10,000 apart without it), for eval.py's test
    to compute as the run's own did. torch.compile is left out (its fusions may move the last
    digits; compiling for one test pass costs more than it saves)."""
    precision = OmegaConf.select(stored, "callbacks.speed.matmul_precision")
    channels_last = bool(OmegaConf.select(stored, "callbacks.speed.channels_last"))
    if not precision and not channels_last:
        return []
    return [Speed(matmul_precision=precision, channels_last=channels_last)]


def other_fid_extractor(cfg: DictConfig, callbacks: DictConfig) -> bool:
    """Whether the test measures FID through another extractor than the run's (eval.py's
    ``fid_extractor``, e.g. inception for the published FIDs' scale: a run trained with the
    auto extractor could not be measured so afterwards; walkthrough 145), set into the
    stored FID callback's config; refused for a checkpoint without FID (a classifier's)."""
    extractor = cfg.get("fid_extractor")
    weights = cfg.get("fid_inception_weights")
    if "fid" in callbacks and takes(callbacks.fid, "settings_prefix"):  # its messages name
        with open_dict(callbacks):  # eval.py's keys (a subclass of one's own may not take it)
            callbacks.fid.settings_prefix = "fid_"
    if extractor is None and weights is None:
        return False
    if "fid" not in callbacks:
        raise ConfigError(
            "fid_extractor and fid_inception_weights choose how eval.py measures a GAN's FID, "
            "and this checkpoint's run measured none (a classifier, or callbacks.fid off); "
            "leave them out"
        )
    with open_dict(callbacks):
        if weights is not None:  # where the run's own InceptionV3 (or this one) is read from
            callbacks.fid.inception_weights = str(weights)
        if extractor is None or str(extractor) == str(callbacks.fid.get("extractor")):
            return False  # the run's own extractor, from its checkpoint (review 149)
        callbacks.fid.extractor = str(extractor)
    log.info(
        "FID through fid_extractor=%s, not the run's own: test/fid is not on the "
        "scale of the run's val/fid",
        callbacks.fid.extractor,
    )
    return True


def takes(node: DictConfig, argument: str) -> bool:
    """Whether the class a config node instantiates takes ``argument`` (or any keyword)."""
    try:
        parameters = inspect.signature(imported(node.get("_target_"))).parameters
    except Exception:  # (not importable here: its instantiation says why)
        return False
    return argument in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())


def eval_callbacks(callbacks: DictConfig | None) -> DictConfig:
    """The stored callbacks whose class says it is used in evaluation (``used_in_eval``)."""
    kept = {}
    for name, node in (callbacks or {}).items():
        target = str(node.get("_target_")) if isinstance(node, DictConfig) else ""
        if not target:
            continue
        try:
            cls = get_class(target)
        except ImportError:  # a class of the training run's own modules, not importable here
            if target.startswith("litlab."):
                raise
            log.info(
                "callbacks.%s (%s) is not importable here; evaluation does not use it", name, target
            )
            continue
        if getattr(cls, "used_in_eval", False):
            kept[name] = node
    return OmegaConf.create(kept)


def refuse_an_objective_given() -> None:
    """eval.yaml's objective slot holds what a data option chooses for training (data=digits);
    one given on the command line would be taken and ignored: eval records the objective the
    run trained with (its test value), read from the checkpoint."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return
    for override in HydraConfig.get().overrides.task:
        if override.lstrip("+~").split("=")[0].split(".")[0] == "objective":
            raise ConfigError(
                f"{override}: eval.py records the objective the run trained with (the test "
                "value of its metric, read from the checkpoint); leave objective out"
            )


def eval_objective(stored: DictConfig) -> tuple[str, str]:
    """The test counterpart of the metric the trained run optimized (objective group), and its
    direction."""
    objective = stored.get("objective") or {}
    metric = str(objective.get("metric", "val/acc"))
    return "test/" + metric.split("/", 1)[-1], str(objective.get("mode", "max"))


def eval_task(cfg: DictConfig) -> float | None:
    """Everything `python eval.py` does once Hydra has composed the config."""
    with Run(cfg, "eval") as run:
        evaluate(cfg, run)
        return run.summary["objective"]["value"]


@hydra.main(version_base="1.3", config_path=config_dir(), config_name="eval")
def hydra_main(cfg: DictConfig) -> float | None:
    return eval_task(cfg)


def main() -> None:
    """`python eval.py ...`: Hydra's command line."""
    freeze_the_imports()
    check_argv()
    hydra_main()


if __name__ == "__main__":
    main()
