"""Streaming (LitData): the conversion of an image folder, and training on its chunks."""

from __future__ import annotations

import io
import itertools
import json
import os
import re
import shutil
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import Subset

from conftest import (
    CPU_DDP,
    QUIET,
    QUIET_CSV,
    make_cfg,
    refused,
    run_cli,
    write_digits_folder,
    write_folder_losing_a_class_to_validation,
    write_png_folder,
    write_unusual_images,
)
from helpers import fingerprints
from litlab.config import build
from litlab.data.optimize import _write_meta, convert, main
from litlab.data.pixels import load_image
from litlab.data.streaming import (
    DecodeImage,
    join,
    read_labels,
    read_meta,
    streaming_loader_class,
)
from litlab.errors import ConfigError, DataError
from litlab.evaluate import eval_task
from litlab.train import train_task

litdata = pytest.importorskip("litdata")


def names_of(dataset) -> list[str]:
    """The files behind a DataModule split of an uncached image folder, in its order."""
    positions = list(range(len(dataset)))
    while isinstance(dataset, Subset):
        positions = [dataset.indices[p] for p in positions]
        dataset = dataset.dataset
    return [dataset.index.files[dataset.positions[p]] for p in positions]


def streamed(dst: Path, split: str) -> list[dict]:
    """A converted split's raw items (bytes, label, name), as LitData stores them."""
    return list(litdata.StreamingDataset(join(str(dst), split)))


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> tuple[Path, Path, list[str]]:
    """Three classes of 10 PNGs each, plus the unusual files of real folders in cat/ (three of
    them unreadable, one 3000x2000), converted with --max-side 64."""
    root = tmp_path_factory.mktemp("images")
    write_png_folder(root, per_class=10)
    bad = write_unusual_images(root / "cat")
    dst = tmp_path_factory.mktemp("chunks")
    convert(root, str(dst), max_side=64, workers=2)
    return root, dst, bad


def test_optimize_keeps_the_image_folders_splits_and_bytes_and_skips_bad_files(converted, tmp_path):
    root, dst, bad = converted
    meta = json.loads(streamed(dst, "meta")[0]["json"])
    assert meta["classes"] == ["cat", "dog", "fox"]
    assert sum(s["images"] for s in meta["splits"].values()) == 30 + 8 - len(bad)
    assert sum(s["skipped"] for s in meta["splits"].values()) == len(bad)
    # The very splits data=image_folder gives the DataModule (test held out by class, then the
    # validation split of the rest), less the unreadable files.
    cfg = make_cfg(
        tmp_path,
        [
            "data=image_folder",
            f"data.source.root={root}",
            "data.source.cache=false",
            "data.num_classes=3",
        ],
    )
    folder = build(cfg.data, "data")
    folder.setup()
    for split in ("train", "val", "test"):
        items = streamed(dst, split)
        want = {n for n in names_of(folder.datasets[split]) if Path(n).name not in bad}
        assert sorted(i["name"] for i in items) == sorted(want), split
        for item in items:
            path = root / item["name"]
            assert item["label"] == ["cat", "dog", "fox"].index(item["name"].split("/")[0])
            if item["name"] != "cat/huge.jpg":  # within --max-side: the file's own bytes
                assert item["image"] == path.read_bytes()
                pixels, _ = DecodeImage(32, 3)(item)
                assert torch.equal(pixels, torch.from_numpy(load_image(path, 32, 3)))
    huge = [i for s in ("train", "val", "test") for i in streamed(dst, s) if "huge" in i["name"]]
    assert len(huge) == 1 and len(huge[0]["image"]) < (root / "cat/huge.jpg").stat().st_size
    # Stored in a random order, not class by class (LitData shuffles within a window only).
    labels = [i["label"] for i in streamed(dst, "train")]
    assert sum(a != b for a, b in itertools.pairwise(labels)) > len(labels) / 3
    # A second run over the same files and options writes nothing.
    chunks = {p: p.stat().st_mtime_ns for p in dst.rglob("*.bin")}
    assert convert(root, str(dst), max_side=64, workers=2) == meta
    assert {p: p.stat().st_mtime_ns for p in dst.rglob("*.bin")} == chunks


def test_eval_on_the_folder_a_streamed_run_was_converted_from_tests_its_held_out_share(
    converted, tmp_path, caplog
):
    """eval.py data=image_folder data.source.root=<the folder the chunks came from> on a
    streamed run's checkpoint tested every image of it, most of them trained on (review: 0.935
    against the run's own 0.914): the conversion's meta names the folder and its test fraction."""
    import shutil

    from litlab.evaluate import converted_from, other_folder

    root, dst, _ = converted
    trained = {"_target_": "litlab.data.Streaming", "input_dir": str(dst)}
    source = {"_target_": "litlab.data.ImageFolder", "root": str(root), "test_fraction": 0.5}
    with caplog.at_level("WARNING", logger="litlab"):
        other_folder(source, trained, None, converted_from(trained))
    assert source["test_fraction"] == 0.2 and not source.get("test_all")  # the conversion's
    assert f"{root} is the folder the run's chunks ({dst}) were converted from" in caplog.text
    # the fixture's chunks are shrunk (--max-side 64): the originals are other pixels
    assert "the run saw them shrunk to 64 pixels a side and saved as JPEG" in caplog.text
    other = tmp_path / "other"
    shutil.copytree(root, other)  # without the conversion's sample: every image, said
    source = {"_target_": "litlab.data.ImageFolder", "root": str(other), "test_fraction": 0.2}
    with caplog.at_level("WARNING", logger="litlab"):
        other_folder(source, trained, None, converted_from(trained))
    assert source["test_all"] and f"converted from {root}" in caplog.text
    # a copy is known by the files the conversion sampled from its training split (kept in the
    # run's checkpoints): its held-out share, the conversion's (walkthrough 168: every image
    # of a copy tested, 220 of 300 trained on); the sample is of training files alone
    sample = read_meta(str(dst))["trained_files"]
    held_out = {item["name"] for item in streamed(dst, "test")}
    names = {name for name, *_ in sample}  # (every training file here: fewer than 256)
    assert {item["name"] for item in streamed(dst, "train")} <= names and not names & held_out
    source = {"_target_": "litlab.data.ImageFolder", "root": str(other), "test_fraction": 0.5}
    other_folder(source, trained, sample, (root, 0.2, 64))
    assert source["test_fraction"] == 0.2 and not source.get("test_all")


def test_a_skipped_file_is_named_without_pils_object_address(tmp_path, capsys):
    """PIL names what it could not identify by the object it read from: the conversion's skip
    lines showed "<_io.BytesIO object at 0x7f...>" (walkthrough 130)."""
    from litlab.data.optimize import encode

    (tmp_path / "fake.jpg").write_text("not an image")
    assert list(encode((str(tmp_path / "fake.jpg"), 0, "cat/fake.jpg"), None, 90)) == []
    line = capsys.readouterr().err.strip()
    assert line.startswith("skipped unreadable image cat/fake.jpg: UnidentifiedImageError")
    assert "cannot identify image file its bytes" in line and "0x" not in line


def test_chunks_of_the_training_folder_at_another_test_fraction_are_refused(converted):
    """eval.py of a run on an image folder, on chunks converted from that folder holding out
    another share for testing: their test split held images the run trained on (walkthrough
    130: 164 of 330), tested without a word. The same share passes."""
    from litlab.evaluate import chunks_as_trained

    root, dst, _ = converted  # converted at the default --test-fraction 0.2
    chunks = {"_target_": "litlab.data.Streaming", "input_dir": str(dst)}
    trained = {"_target_": "litlab.data.ImageFolder", "root": str(root), "test_fraction": 0.1}
    with pytest.raises(ConfigError, match=r"convert it with --test-fraction 0\.1"):
        chunks_as_trained(chunks, trained, None)
    chunks_as_trained(chunks, {**trained, "test_fraction": 0.2}, None)
    # a run on chunks of that folder held out 0.1 (its checkpoint's record of them): these
    # chunks, converted from the same folder at 0.2, are refused too (walkthrough 168: 81 of
    # 153 images tested were trained on), wherever the run's chunks are now
    streamed_run = {"_target_": "litlab.data.Streaming", "input_dir": "/gone/chunks"}
    with pytest.raises(ConfigError, match=r"the folder the run's chunks were converted from"):
        chunks_as_trained(chunks, streamed_run, "another key", (root.resolve(), 0.1, None))
    chunks_as_trained(chunks, streamed_run, "another key", (root.resolve(), 0.2, None))


def test_a_split_layouts_test_folder_makes_the_test_fraction_moot(tmp_path, capsys):
    """A folder with its own test/ is tested on it, whatever --test-fraction: chunks of it at
    another fraction hold the same test images (review 172: eval.py refused them as holding
    training images, and converting again was refused as "test fraction 0.2 -> 0.3"); another
    --max-side is still refused."""
    from litlab.evaluate import chunks_as_trained

    root, dst = tmp_path / "images", tmp_path / "chunks"
    write_png_folder(root / "train", per_class=6)
    write_png_folder(root / "test", per_class=2)
    first = convert(root, str(dst), workers=1)
    again = convert(root, str(dst), test_fraction=0.3, workers=1)  # not refused
    assert again["splits"] == first["splits"]
    streamed_run = {"_target_": "litlab.data.Streaming", "input_dir": "/gone/chunks"}
    chunks = {"_target_": "litlab.data.Streaming", "input_dir": str(dst)}
    chunks_as_trained(chunks, streamed_run, "another key", (root.resolve(), 0.2, None))
    with pytest.raises(DataError, match=r"options \{'max_side': None"):
        convert(root, str(dst), test_fraction=0.3, max_side=8, workers=1)


def test_a_streamed_run_resumed_on_another_conversion_is_refused(converted, tmp_path, capsys):
    """data.source.input_dir is where the chunks are (a loading setting: chunks copied to a
    bucket or another machine), so resume= with the chunks of another folder trained on and
    tested other images without a word. The checkpoint keeps which conversion it streamed
    (DST/meta's key of the source's files): another is refused, a copy of the chunks resumes;
    and so is the run's own folder converted again since (a walkthrough: accepted, its
    validation split changed part way)."""
    from litlab.checkpoint import load_checkpoint
    from litlab.resumable import check_resumable

    _, converted_dst, _ = converted
    dst = tmp_path / "chunks"  # the run's (converted again below: the fixture's copy)
    shutil.copytree(converted_dst, dst)
    run = [
        "data=streaming",
        "data.num_classes=3",
        "data.source.size=16",
        "data.image_shape=[3,16,16]",
        "data.batch_size=4",
        "data.num_workers=0",
        "model.net.width=4",
        "model.scheduler=null",
        "test=false",
        *QUIET,
    ]
    trained = make_cfg(
        tmp_path / "t", [*run, f"data.source.input_dir={dst}", "trainer.max_epochs=1"]
    )
    train_task(trained)
    last = Path(trained.paths.output_dir) / "checkpoints" / "last.ckpt"
    assert load_checkpoint(last)["DataModule"]["conversion"] == read_meta(str(dst))["source_key"]
    copy, other = converted_dst, tmp_path / "other"
    write_png_folder(tmp_path / "images", per_class=4)
    convert(tmp_path / "images", str(other), workers=1)
    more = [*run, "trainer.max_epochs=2", f"ckpt_path={last}"]
    check_resumable(
        load_checkpoint(last), make_cfg(tmp_path / "t", [*more, f"data.source.input_dir={copy}"])
    )
    elsewhere = make_cfg(tmp_path / "t", [*more, f"data.source.input_dir={other}"])
    refused(
        capsys,
        train_task,
        elsewhere,
        f"data.source.input_dir: {dst} -> {other} holds another conversion",
    )
    # the run's folder converted again: refused, then asked for
    with pytest.raises(DataError, match=rf"{dst} holds a finished conversion of {converted[0]}"):
        convert(tmp_path / "images", str(dst), workers=1)
    convert(tmp_path / "images", str(dst), workers=1, replace=True)
    again = make_cfg(tmp_path / "t", [*more, f"data.source.input_dir={dst}"])
    check_resumable(load_checkpoint(last), again)  # the run's own path: nothing compared here
    refused(capsys, train_task, again, f"{dst} holds another conversion than the checkpoint's")
    # and eval.py of the run on them: their test split is another (walkthrough 130: tested
    # without a word, images it trained on among them)
    tested = [f"ckpt_path={last}", "extras.print_config=false", "data.num_workers=0"]
    tested += ["data=streaming", f"data.source.input_dir={dst}", "data.image_shape=[3,16,16]"]
    evaluated = make_cfg(tmp_path / "e", tested, config_name="eval")
    refused(capsys, eval_task, evaluated, f"{dst} holds another conversion than the one the run")
    # ... and on the run's own data, nothing given (walkthrough 168: tested without a word)
    plain = make_cfg(tmp_path / "e", [*tested[:2]], config_name="eval")
    refused(capsys, eval_task, plain, f"{dst} holds another conversion than the one the run")


def test_a_conversion_records_each_splits_labels_in_stream_order(converted, tmp_path):
    """FID's class-stratified samples of a stream need each split's labels in the order the
    stream indexes its items, known without reading the chunks: the conversion records them
    (2 writer workers, unreadable files skipped) in DST/meta. And the order is the conversion's,
    not a race between its workers: converting again gives the same stream."""
    root, dst, _ = converted
    for split in ("train", "val", "test"):
        assert read_labels(str(dst), None, split).tolist() == [
            i["label"] for i in streamed(dst, split)
        ], split
    again = tmp_path / "again"
    convert(root, str(again), max_side=64, workers=3)
    for split in ("train", "val", "test"):
        assert [i["name"] for i in streamed(again, split)] == [
            i["name"] for i in streamed(dst, split)
        ], split


@pytest.fixture
def shared_staging(tmp_path, monkeypatch) -> Path:
    """LitData's staging folder shared by every optimize() on the machine ($TMPDIR/chunks),
    with $TMPDIR (Python's, inherited by the forked workers) inside this test's folder."""
    from litdata.processing.data_processor import _get_cache_dir

    monkeypatch.delenv("DATA_OPTIMIZER_CACHE_FOLDER", raising=False)
    monkeypatch.delenv("DATA_OPTIMIZER_DATA_CACHE_FOLDER", raising=False)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    shared = Path(_get_cache_dir())
    assert shared.parent == tmp_path / "tmp"
    return shared


@contextmanager
def another_litdata_job_wiping(folder: Path) -> Iterator[None]:
    """What each other optimize() on the machine does to the shared staging folder as it
    starts: delete it (here every 2 ms, for as long as the block runs)."""
    stop = threading.Event()

    def wipe() -> None:
        while not stop.is_set():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True, exist_ok=True)
            stop.wait(0.002)

    thread = threading.Thread(target=wipe, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def test_a_conversion_leaves_the_machines_shared_staging_folder_alone(tmp_path, shared_staging):
    """Every LitData optimize() empties $TMPDIR/chunks as it starts and stages an object
    store's chunks there: two conversions at once on a node deleted each other's chunks before
    their upload (CI, 2026-12-03). A conversion stages in folders of its own, removed after;
    another job's files in the shared one survive it."""
    shared_staging.mkdir()
    (shared_staging / "chunk-0-0.bin").write_bytes(b"another job's chunk")
    write_png_folder(tmp_path / "images", per_class=4)
    meta = convert(tmp_path / "images", str(tmp_path / "chunks"), workers=2)
    assert sum(s["images"] for s in meta["splits"].values()) == 12
    assert (shared_staging / "chunk-0-0.bin").read_bytes() == b"another job's chunk"
    assert not list(shared_staging.parent.glob("litlab-optimize-*"))  # its own: removed
    assert "DATA_OPTIMIZER_CACHE_FOLDER" not in os.environ  # the user's environment as it was


def test_private_staging_sits_beside_the_users_folder_and_clears_abandoned_ones(
    tmp_path, monkeypatch
):
    """With DATA_OPTIMIZER_CACHE_FOLDER set (a scratch disk), the conversion's own folders go
    beside that folder, not inside it (other LitData jobs delete it as they start). Folders
    of this host's conversions stopped by Ctrl-C (LitData exits with os._exit, past any
    cleanup) are removed once their process is gone and they sat unchanged for an hour; not
    those of another pid namespace (a container with the host's name), whose pids are not ours."""
    import socket
    import subprocess
    import sys
    import time

    from litlab.data.optimize import private_staging
    from litlab.files import pid_namespace

    scratch = tmp_path / "scratch"
    monkeypatch.setenv("DATA_OPTIMIZER_CACHE_FOLDER", str(scratch / "chunks"))
    monkeypatch.delenv("DATA_OPTIMIZER_DATA_CACHE_FOLDER", raising=False)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    host, hour_ago = f"{socket.gethostname()}-{pid_namespace()}", time.time() - 3700
    abandoned = scratch / f"litlab-optimize-{host}-{gone.stdout.strip()}-0123456789ab"
    recent = scratch / f"litlab-optimize-{host}-{gone.stdout.strip()}-ba9876543210"
    running = scratch / f"litlab-optimize-{host}-{os.getppid()}-0123456789ab"
    container = f"litlab-optimize-{socket.gethostname()}-{pid_namespace() + 1}"
    elsewhere = scratch / f"{container}-{gone.stdout.strip()}-0123456789ab"
    for folder in (abandoned, recent, running, elsewhere):
        (folder / "chunks").mkdir(parents=True)
    for folder in (abandoned, running, elsewhere):
        for path in (folder / "chunks", folder):
            os.utime(path, (hour_ago, hour_ago))
    with private_staging() as private:
        assert private.parent == scratch and private.name.startswith(f"litlab-optimize-{host}-")
        assert os.environ["DATA_OPTIMIZER_CACHE_FOLDER"] == str(private / "chunks")
        assert os.environ["DATA_OPTIMIZER_DATA_CACHE_FOLDER"] == str(private / "data")
        assert not abandoned.exists() and recent.exists() and running.exists()
        assert elsewhere.exists()
    assert not private.exists()
    assert os.environ["DATA_OPTIMIZER_CACHE_FOLDER"] == str(scratch / "chunks")
    assert "DATA_OPTIMIZER_DATA_CACHE_FOLDER" not in os.environ
    # A folder whose parent cannot take it (a mount point's /, or not writable): on its disk still
    access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: Path(p) != scratch and access(p, mode))
    with private_staging() as private:
        assert private.parent == scratch / "chunks"


def test_a_conversion_leaving_a_class_no_training_files_is_refused(tmp_path):
    """As data=image_folder: a class whose only train/ file falls in the validation share (or
    an empty class folder) would never be trained on; refused before anything is written."""
    root = write_folder_losing_a_class_to_validation(tmp_path)
    with pytest.raises(DataError, match=r"\['fox'\] .*no readable image for training"):
        convert(root, str(tmp_path / "chunks"), workers=1)
    assert not (tmp_path / "chunks").exists()


@pytest.mark.parametrize("recorded", [True, False])
def test_a_class_whose_training_files_are_all_unreadable_is_refused(
    tmp_path, monkeypatch, recorded
):
    """The class check before decoding sees zebra's files; none decodes, so the written train
    split lacks the class (a run and litlab.data.check refuse such data). Refused in one line
    once the train split is written, from the recorded labels or, where LitData's counts left
    them unrecorded, the written items; DST/meta stays unfinished (a run refuses it)."""
    import litlab.data.optimize as optimize

    root, dst = tmp_path / "images", tmp_path / "chunks"
    write_png_folder(root, per_class=6)
    (root / "zebra").mkdir()
    for i in range(8):
        (root / "zebra" / f"{i}.png").write_bytes(b"not a picture")
    if not recorded:
        monkeypatch.setattr(optimize, "recorded_labels", lambda folder, written: None)
    with pytest.raises(DataError, match=r"\['zebra'\] of .*images leave no readable image"):
        convert(root, str(dst), workers=1)
    assert (dst / "train" / "index.json").is_file()  # refused after decoding, not before
    with pytest.raises(DataError, match="unfinished conversion"):
        read_meta(str(dst))


def test_files_of_yours_that_litdata_would_delete_in_the_destination_are_refused(tmp_path):
    """LitData's overwrite deletes every .bin and *index.json file (and .checkpoints) in a local
    DST/<split> and DST/meta, not only its chunks: a user's model.bin was lost silently."""
    root, dst = tmp_path / "images", tmp_path / "chunks"
    write_png_folder(root, per_class=4)
    for name in ["train/model.bin", "meta/my-index.json", "val/.checkpoints/state"]:
        (dst / name).parent.mkdir(parents=True, exist_ok=True)
        (dst / name).write_text("precious")
    # an earlier conversion's own files (a writer's index, left by an interruption) and other
    # names are not deleted, nor refused
    for name in ["train/chunk-0-0.bin", "train/0.index.json", "train/notes.txt", "README.md"]:
        (dst / name).write_text("x")
    before = sorted(p for p in dst.rglob("*"))
    with pytest.raises(DataError, match=r"holds 3 file\(s\) that converting there would delete"):
        convert(root, str(dst), workers=1)
    assert sorted(p for p in dst.rglob("*")) == before


def test_a_destination_inside_the_image_folder_is_refused(tmp_path, capsys):
    """python -m litlab.data.optimize images images/chunks converted, then chunks/ counted as a
    class folder of images: the check, the next run and the next conversion refused it (review)."""
    write_png_folder(tmp_path / "images", per_class=4)
    with pytest.raises(SystemExit) as exit_:
        main([str(tmp_path / "images"), str(tmp_path / "images" / "chunks")])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and "lies inside" in err and "write the chunks outside" in err
    assert not (tmp_path / "images" / "chunks").exists()


@pytest.mark.parametrize(
    ("dst", "needle"),
    [
        ("azure://container/chunks", "cannot write a conversion to azure://"),
        ("hf://datasets/me/chunks", "cannot write a conversion to hf://"),
        ("r2://bucket/chunks", "r2:// only through a Lightning Studio's data connection"),
        ("gs://bucket/chunks", "needs google-cloud-storage"),
    ],
)
def test_a_destination_litdata_cannot_write_to_is_one_line(tmp_path, capsys, dst, needle):
    """LitData writes to a folder, s3://, gs:// and r2:// (this last only through a Lightning
    data connection); azure:// was offered by the help and failed with a traceback."""
    if dst.startswith("gs://"):
        try:
            import google.cloud.storage  # noqa: F401
        except ImportError:
            pass
        else:
            pytest.skip("google-cloud-storage is installed: gs:// would be listed for real")
    write_png_folder(tmp_path / "images", per_class=4)
    with pytest.raises(SystemExit) as exit_:
        main([str(tmp_path / "images"), dst])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and needle in err, err


def test_a_finished_conversion_whose_split_was_removed_is_converted_again(
    converted, tmp_path, monkeypatch
):
    """rm -rf DST/train after a conversion: a run said to convert it again, and converting
    said there was nothing to do. The splits are counted before a conversion is vouched for,
    and the meta names SRC absolutely (its advice works from any folder). So are the chunk
    files of a local split: one deleted (its index intact) or cut short was "nothing to do"
    too (review 172), and a run on it a traceback after LitData's wait."""
    from litlab.data.streaming import damaged_chunk

    root, dst, _ = converted
    damaged = tmp_path / "damaged"
    shutil.copytree(dst, damaged)
    shutil.rmtree(damaged / "train")
    monkeypatch.chdir(root.parent)
    meta = convert(Path(root.name), str(damaged), max_side=64, workers=1)
    assert sorted(i["name"] for i in streamed(damaged, "train")) == sorted(
        i["name"] for i in streamed(dst, "train")
    )
    assert meta["source"] == str(root.resolve())
    for harm in ("delete", "truncate"):
        chunk = sorted((damaged / "test").glob("*.bin"))[-1]
        if harm == "delete":
            chunk.unlink()
        else:
            chunk.write_bytes(chunk.read_bytes()[:-10])
        assert damaged_chunk(f"local:{damaged / 'test'}") == chunk.name  # (LitData's prefix)
        with pytest.raises(DataError, match=f"{chunk} is missing or cut short; convert it again"):
            streamed_test_split(damaged)  # a run said so (LitData waited, then a traceback)
        convert(Path(root.name), str(damaged), max_side=64, workers=1)
        assert len(streamed(damaged, "test")) == len(streamed(dst, "test")), harm


def test_a_folder_of_images_given_as_a_streamed_dataset_says_what_to_run(tmp_path):
    """data=streaming on the image folder itself advised converting it into itself."""
    images = tmp_path / "images"
    write_png_folder(images, per_class=2)
    with pytest.raises(
        DataError, match=r"is a folder of images, not a litlab dataset; train on it"
    ):
        read_meta(str(images))
    with pytest.raises(DataError, match=r"no litlab dataset at .*litlab.data.optimize /path/to"):
        read_meta(str(tmp_path / "nothing here"))


def test_an_object_store_without_credentials_is_one_line(tmp_path, monkeypatch, capsys):
    """Converting to s3:// without credentials ended in botocore's 65-line traceback; a run
    reading from it said there was no dataset there, to be converted."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no wait for a cloud's metadata
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    images = tmp_path / "images"
    write_png_folder(images, per_class=2)
    with pytest.raises(SystemExit) as exit_info:
        main([str(images), "s3://bucket/chunks", "--workers", "1"])
    assert exit_info.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("litlab: error: no credentials for s3://bucket/chunks (NoCredentials")
    with pytest.raises(DataError, match=r"no credentials for s3://bucket/chunks .*AWS_PROFILE"):
        read_meta("s3://bucket/chunks")


def test_a_large_16_bit_image_is_shrunk_not_skipped(tmp_path):
    """--max-side shrinks a 16-bit image as any other (Pillow's reducing resize refused the
    16-bit mode: the file was skipped as unreadable)."""
    from PIL import Image

    root = tmp_path / "images"
    write_png_folder(root, per_class=4)
    ramp = np.linspace(0, 65535, 512 * 384).reshape(384, 512).astype(np.uint16)
    Image.fromarray(ramp).save(root / "cat" / "deep.png")
    meta = convert(root, str(tmp_path / "chunks"), max_side=64, workers=1)
    assert sum(s["skipped"] for s in meta["splits"].values()) == 0
    (item,) = [
        i
        for s in ("train", "val", "test")
        for i in streamed(tmp_path / "chunks", s)
        if i["name"] == "cat/deep.png"
    ]
    with Image.open(io.BytesIO(item["image"])) as image:
        assert image.size == (64, 48) and image.mode == "L"
        assert abs(np.asarray(image).mean() - 127.5) < 3  # the ramp's 16 bits, scaled to 8


def test_chunks_converted_smaller_than_the_decoded_size_are_said(tmp_path, caplog):
    """--max-side 32 chunks streamed at data.source.size=40: every image enlarged, not a word
    (walkthrough 150). Said once; not at a size within --max-side."""
    from litlab.data.streaming import Streaming

    root = tmp_path / "images"
    write_png_folder(root, per_class=4)
    convert(root, str(tmp_path / "chunks"), max_side=32, workers=1)
    with caplog.at_level("WARNING", logger="litlab"):
        source = Streaming(str(tmp_path / "chunks"), size=40)
        source.prepare()
        source.prepare()
        Streaming(str(tmp_path / "chunks"), size=32).prepare()
    assert caplog.text.count("was converted with --max-side 32, below data.source.size=40") == 1
    assert "convert again with a --max-side at least data.source.size x the images" in (caplog.text)


def test_an_interrupted_conversion_over_an_earlier_one_is_not_taken_as_finished(
    converted, tmp_path, monkeypatch
):
    """Converting into a folder that holds an earlier conversion, stopped while the splits
    are rewritten: the earlier meta no longer vouches for the mixed splits; a run refuses the
    folder in one line, and converting again finishes it."""
    import litlab.data.optimize as optimize

    root, _, _ = converted
    dst = tmp_path / "chunks"
    other = tmp_path / "other"
    write_png_folder(other, per_class=6)
    first = convert(other, str(dst), workers=1)

    def interrupted(output_dir: str) -> int:
        raise KeyboardInterrupt  # after the first split is rewritten

    monkeypatch.setattr(optimize, "_written", interrupted)
    with pytest.raises(KeyboardInterrupt):
        convert(root, str(dst), max_side=64, workers=1, replace=True)
    monkeypatch.undo()
    cfg = make_cfg(
        tmp_path, ["data=streaming", f"data.source.input_dir={dst}", "data.num_classes=3"]
    )
    with pytest.raises(DataError, match=r"unfinished conversion .* convert it again"):
        build(cfg.data, "data").prepare_data()
    again = convert(root, str(dst), max_side=64, workers=1)
    assert again["source"] == str(root) and again != first


def test_a_converted_folder_missing_a_split_is_one_clear_line(converted, tmp_path):
    import shutil

    _, dst, _ = converted
    shutil.copytree(dst / "meta", tmp_path / "partial" / "meta")
    cfg = make_cfg(
        tmp_path,
        ["data=streaming", f"data.source.input_dir={tmp_path / 'partial'}", "data.num_classes=3"],
    )
    with pytest.raises(DataError, match=r"has no readable train split .* convert it again"):
        build(cfg.data, "data").setup("fit")


def test_streaming_config_mistakes_are_one_clear_line(converted, tmp_path, caplog):
    _, dst, _ = converted
    base = ["data=streaming", f"data.source.input_dir={dst}"]

    def setup(*overrides: str) -> None:
        build(make_cfg(tmp_path, [*base, *overrides]).data, "data").setup()

    with pytest.raises(ConfigError, match=re.escape("set data.num_classes=3")):
        setup("data.num_classes=5")
    # a checkpoint of 5 classes tested on chunks of 3: eval.py said set data.num_classes=3,
    # and so set, set it to 5 (walkthrough 139); the chunks' labels are not the model's
    data = build(make_cfg(tmp_path, [*base, "data.num_classes=5"]).data, "data")
    data.load_state_dict({"classes": ["ant", "cat", "dog", "emu", "fox"]})
    with pytest.raises(DataError, match=r"test it on data of the model's classes \(an image"):
        data.setup("test")
    with pytest.raises(ConfigError, match="train_fraction"):
        setup("data.num_classes=3", "data.train_fraction=0.5")
    # another validation share, which the chunks fixed: said (walkthrough 168: silent)
    with caplog.at_level("WARNING", logger="litlab"):
        setup("data.num_classes=3", "data.val_fraction=0.3")
    assert "data.val_fraction=0.3 does not apply" in caplog.text
    assert "(--val-fraction 0.1)" in caplog.text
    with pytest.raises(ConfigError, match=re.escape("data.loader=auto")):
        setup("data.num_classes=3", "data.loader=device")
    with pytest.raises(ConfigError, match="shuffle_window must be a number of items above 1"):
        setup("data.num_classes=3", "data.source.shuffle_window=1")
    with pytest.raises(DataError, match=re.escape("python -m litlab.data.optimize")):
        build(
            make_cfg(
                tmp_path, [base[0], f"data.source.input_dir={tmp_path}", "data.num_classes=3"]
            ).data,
            "data",
        ).prepare_data()


def test_a_streamed_epoch_cut_short_refuses_another_topology(converted):
    _, dst, _ = converted
    dataset = litdata.StreamingDataset(join(str(dst), "train"), transform=DecodeImage(32, 3))
    loader = streaming_loader_class()(dataset, batch_size=4, num_workers=0, shuffle=True)
    next(iter(loader))
    state = loader.state_dict()
    state["dataset"]["world_size"] = 2
    with pytest.raises(ConfigError, match="resume with the same values"):
        loader.load_state_dict(state)


@pytest.mark.parametrize("workers", [0, 1])
def test_streaming_draws_nothing_from_the_global_generator(converted, workers):
    """Each pass of the loader (iter()) took its workers' seed from the global generator, which
    a run resumed mid-epoch restores as it was at the stop and then passes once more: every
    later crop, flip and dropout draw differed from the uninterrupted run's."""
    _, dst, _ = converted
    dataset = litdata.StreamingDataset(join(str(dst), "train"), transform=DecodeImage(32, 3))
    loader = streaming_loader_class()(dataset, batch_size=4, num_workers=workers, shuffle=True)
    before = torch.get_rng_state()
    for _ in range(2):
        next(iter(loader))
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.slow
@pytest.mark.dist
def test_streaming_on_two_ranks_shards_exactly_and_resumes_bit_identically(tmp_path):
    """2 CPU ranks on LitData chunks of the digits: each rank its own images (none shared, the
    same number of batches), a new order every epoch, every test image tested once, and
    SIGTERM mid-epoch + resume= ends with the uninterrupted run's weights."""
    chunks = tmp_path / "chunks"
    convert(write_digits_folder(tmp_path / "digits"), str(chunks), workers=2)
    args = [
        *streamed_digits_args(chunks),
        "trainer.max_epochs=2",
        "trainer.devices=2",
        "trainer.strategy=ddp",
        "logger=csv",
        *QUIET,
    ]
    record = ["+callbacks.record._target_=helpers.RecordImages"]
    straight = run_cli(
        *args,
        *record,
        f"+callbacks.record.folder={tmp_path / 'seen'}",
        f"paths.log_dir={tmp_path}/a",
    )
    assert straight.returncode == 0, straight.stderr[-3000:]
    ranks = [json.loads((tmp_path / "seen" / f"rank{r}.json").read_text()) for r in (0, 1)]
    # The digits hold a few identical images: count images as a multiset of fingerprints.
    split = {s: Counter(images_of(chunks, s)) for s in ("train", "test")}
    for epoch in ("epoch0", "epoch1"):
        batches = [rank[epoch] for rank in ranks]
        assert len(batches[0]) == len(batches[1]) == split["train"].total() // 2 // 64
        seen = [Counter(x for batch in b for x in batch) for b in batches]
        assert seen[0] + seen[1] <= split["train"]  # no image twice: disjoint shards
        assert seen[0] != seen[1]
    assert ranks[0]["epoch0"] != ranks[0]["epoch1"]  # reshuffled
    # Representative batches: the folder lists its images class by class, and LitData shuffles
    # only within a window: written in that order, a batch would hold one or two classes.
    for rank in ranks:
        assert min(len(set(labels)) for labels in rank["labels0"] + rank["labels1"]) >= 8
    tested = Counter(x for rank in ranks for batch in rank["test"] for x in batch)
    assert tested == split["test"]  # every test image once, over the ranks
    summary = summary_of_folder(tmp_path / "a")
    assert summary["metrics"]["test/acc"] > 0.3  # learns (chance: 0.1) in 20 steps
    # The DDP test accuracy is the accuracy of the same checkpoint tested by one process.
    cfg = make_cfg(
        tmp_path / "eval",
        [f"ckpt_path={summary['best_checkpoint']}", "extras.print_config=false"],
        config_name="eval",
    )
    assert eval_task(cfg) == pytest.approx(summary["metrics"]["test/acc"], abs=1e-7)

    stopped = run_cli(
        *args,
        "+callbacks.stop._target_=helpers.SignalAt",
        "+callbacks.stop.batch=4",  # mid-way through the first epoch: the second one follows
        *record,
        f"+callbacks.record.folder={tmp_path / 'resumed'}",
        f"paths.log_dir={tmp_path}/b",
    )
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    folder = next((tmp_path / "b").rglob("summary.json")).parent
    resumed = run_cli(f"resume={folder}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for r, rank in enumerate(ranks):  # the rest of the first epoch, then the whole second
        rest = json.loads((tmp_path / "resumed" / f"rank{r}.json").read_text())
        # batches 0-5 ran before the stop: under DDP the ranks agree on the signal (at batch 4)
        # one batch late (Preemption: no host sync in the step)
        assert rest["epoch0"] == rank["epoch0"][6:], r
        assert rest["epoch1"] == rank["epoch1"], r  # (was empty: LitData kept continuing)
    a = torch.load(Path(summary["best_checkpoint"]).parent / "last.ckpt", weights_only=True)
    b = torch.load(folder / "checkpoints" / "last.ckpt", weights_only=True)
    for name, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][name]), name


@pytest.mark.slow
def test_a_streamed_run_resumed_at_an_epochs_end_trains_the_next_epochs_order(tmp_path):
    """resume= from last.ckpt (written at epoch 0's end) with more epochs: epoch 1 streams epoch
    1's order (it streamed epoch 0's again), and the run ends as one run straight through."""
    chunks = tmp_path / "chunks"
    convert(write_digits_folder(tmp_path / "digits"), str(chunks), workers=2)
    args = [
        *streamed_digits_args(chunks),
        "model.scheduler=null",  # one epoch's schedule would differ from two epochs'
        "logger=csv",
        *QUIET,
    ]
    record = ["+callbacks.record._target_=helpers.RecordImages"]

    def run(*overrides: str) -> None:
        result = run_cli(*overrides)
        assert result.returncode == 0, result.stderr[-3000:]

    run(*args, "trainer.max_epochs=2", *record, f"+callbacks.record.folder={tmp_path}/a",
        f"paths.log_dir={tmp_path}/a")  # fmt: skip
    run(*args, "trainer.max_epochs=1", f"paths.log_dir={tmp_path}/b")
    folder = next((tmp_path / "b").rglob("summary.json")).parent
    run(
        f"resume={folder}",
        "trainer.max_epochs=2",
        *record,
        f"+callbacks.record.folder={tmp_path}/c",
    )
    straight, resumed = (json.loads((tmp_path / x / "rank0.json").read_text()) for x in "ac")
    assert straight["epoch0"] != straight["epoch1"] and resumed["epoch1"] == straight["epoch1"]
    a = torch.load(next((tmp_path / "a").rglob("last.ckpt")), weights_only=True)["state_dict"]
    b = torch.load(folder / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert all(torch.equal(value, b[name]) for name, value in a.items())


def streamed_digits_args(chunks: Path) -> list[str]:
    """The digits' LitData chunks, with images that fingerprints identify (no random crop or
    flip), one loader worker."""
    return [
        "data=streaming",
        f"data.source.input_dir={chunks}",
        "data.num_classes=10",
        "data.source.channels=1",
        "data.source.size=28",
        "data.image_shape=[1,28,28]",
        "data.random_resized_crop=null",  # deterministic images: fingerprints identify them
        "data.eval_crop=1",
        "data.hflip=false",
        "data.batch_size=64",
        "data.num_workers=1",
        "trainer.accelerator=cpu",
    ]


def images_of(chunks: Path, split: str) -> list[int]:
    """Fingerprints of a converted split's images as the run decodes them (helpers.RecordImages)."""
    decode = DecodeImage(28, 1)
    return fingerprints(torch.stack([decode(item)[0] for item in streamed(chunks, split)]))


def summary_of_folder(root: Path) -> dict:
    return json.loads(next(root.rglob("summary.json")).read_text())


def names_loader(dst: Path, **options: Any) -> Any:
    """litlab's streaming loader over a converted split, shuffled (seed 7), batches of 4 names."""
    dataset = litdata.StreamingDataset(join(str(dst), "train"), shuffle=True, seed=7)
    return streaming_loader_class()(
        dataset,
        batch_size=4,
        shuffle=True,
        collate_fn=lambda items: [i["name"] for i in items],
        **options,
    )


def test_each_pass_streams_the_order_of_the_trainers_epoch(converted):
    """A run resumed from an epoch's end (no loader state in its checkpoint) continues with the
    next epoch's order, not the first epoch's again: the order is the trainer's epoch's at
    each pass, whenever the loader was built."""
    _, dst, _ = converted

    def epochs(start: int, count: int) -> list[list[str]]:
        epoch = [start]  # the trainer's current_epoch
        loader = names_loader(dst, epoch=lambda: epoch[0])
        passes = []
        for _ in range(count):
            passes.append([name for batch in loader for name in batch])
            epoch[0] += 1
        return passes

    first, second = epochs(0, 2)
    assert first != second and sorted(first) == sorted(second)
    assert epochs(1, 1) == [second]


@pytest.mark.parametrize("workers", [0, 2])
def test_the_epoch_after_a_continued_one_streams_all_of_its_batches(converted, workers):
    """Lightning ends an epoch after len(loader) batches without running the pass out; the
    pass after one continued from a loaded state is a whole new epoch (it was empty)."""
    _, dst, _ = converted
    epoch = [0]

    def loader() -> Any:
        return names_loader(dst, drop_last=True, num_workers=workers, epoch=lambda: epoch[0])

    def as_lightning_runs(stream: Any, batches: int) -> list[list[str]]:
        return list(itertools.islice(stream, batches))  # no next() after the last batch

    straight = loader()
    whole = [as_lightning_runs(iter(straight), len(straight))]
    epoch[0] = 1
    whole.append(as_lightning_runs(iter(straight), len(straight)))
    assert whole[0] != whole[1]
    epoch[0] = 0
    cut = loader()
    handed_out = as_lightning_runs(iter(cut), 3)
    state = cut.state_dict()
    resumed = loader()
    resumed.load_state_dict(state)
    assert handed_out + as_lightning_runs(iter(resumed), len(resumed) - 3) == whole[0]
    epoch[0] = 1
    assert as_lightning_runs(iter(resumed), len(resumed)) == whole[1]


@pytest.mark.slow
def test_an_s3_dataset_converts_and_trains_with_credentials_from_the_environment_only(
    tmp_path, monkeypatch, shared_staging
):
    """The URL path against a local S3 server (moto): convert to s3://, train one epoch from it,
    and the secret key appears nowhere in the run folder. The conversion stages its chunks
    before the upload where other LitData jobs on the machine do not delete them."""
    moto_server = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    from litdata.streaming import downloader

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        secret = "litlab-test-secret-7f3a9c"
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{host}:{port}")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "litlab-test-key")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        # moto serves plain http, which LitData's obstore client refuses (real S3 is https):
        # allowed here in this process (and the forked conversion workers) only.
        monkeypatch.setitem(downloader._OBSTORE_CLIENT_OPTIONS, "allow_http", True)
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket="litlab")
        write_png_folder(tmp_path / "images", per_class=12)
        # LitData's overwrite deletes every object whose key starts with <dst>/train (val, test,
        # meta): a user's objects there are refused, not lost (reviewer: all of these went)
        mine = ["mixed/train/notes.txt", "mixed/train_raw/cat/1.jpg", "mixed/valuable.csv"]
        for key in [*mine, "mixed/README.md", "images/README.md"]:
            s3.put_object(Bucket="litlab", Key=key, Body=b"precious")
        with pytest.raises(DataError, match=r"3 object.*would delete.*mixed/train/notes\.txt"):
            convert(tmp_path / "images", "s3://litlab/mixed", workers=2)
        with another_litdata_job_wiping(shared_staging):
            meta = convert(tmp_path / "images", "s3://litlab/images", workers=2)
        assert sum(s["images"] for s in meta["splits"].values()) == 36
        # converted again (other options): refused (runs trained on it test on its splits:
        # walkthrough 168), then asked for: its own earlier objects are replaced, others kept
        with pytest.raises(DataError, match=r"give --replace to write this one over it"):
            convert(tmp_path / "images", "s3://litlab/images", max_side=32, workers=2)
        convert(tmp_path / "images", "s3://litlab/images", max_side=32, workers=2, replace=True)
        keys = {o["Key"] for o in s3.list_objects_v2(Bucket="litlab")["Contents"]}
        assert {*mine, "mixed/README.md", "images/README.md"} <= keys
        cfg = make_cfg(
            tmp_path,
            [
                "data=streaming",
                "data.source.input_dir=s3://litlab/images",
                f"data.source.cache_dir={tmp_path / 'cache'}",
                "data.num_classes=3",
                "data.batch_size=8",
                "data.num_workers=0",
                "trainer.max_epochs=1",
                "logger=wandb",
                *QUIET,
            ],
        )
        train_task(cfg)
    finally:
        server.stop()
    summary = json.loads((Path(cfg.paths.output_dir) / "summary.json").read_text())
    assert summary["status"] == "completed" and "test/acc" in summary["metrics"]
    assert summary["data"]["test"]["images"] == meta["splits"]["test"]["images"]
    for path in Path(cfg.paths.output_dir).rglob("*"):
        assert not path.is_file() or secret.encode() not in path.read_bytes(), path


@pytest.mark.parametrize("decode", ["workers", "device"])
def test_a_streamed_split_gives_a_seeded_random_sample_for_metrics(converted, tmp_path, decode):
    """What FID's real statistics read: a seeded random subset of the whole split (decoded as
    training decodes), the same for the same seed, all of the split when it asks for more; a
    DDP rank reads its own part of it (every world-th image), the parts making up the whole."""
    _, dst, _ = converted
    cfg = make_cfg(
        tmp_path,
        [
            "data=streaming",
            f"data.source.input_dir={dst}",
            "data.num_classes=3",
            f"data.source.decode={decode}",
        ],
    )
    datamodule = build(cfg.data, "data")
    total = datamodule.split_size("train")
    images, labels = datamodule.arrays("train", 5, seed=1)
    assert images.shape == (5, 3, 36, 36) and images.dtype == torch.uint8 and len(labels) == 5
    again, _ = datamodule.arrays("train", 5, seed=1)
    other, _ = datamodule.arrays("train", 5, seed=2)
    assert torch.equal(images, again) and not torch.equal(images, other)
    parts = [datamodule.arrays("train", 5, seed=1, shard=(rank, 2)) for rank in (0, 1)]
    assert [len(p[0]) for p in parts] == [3, 2]
    assert torch.equal(torch.cat([p[0] for p in parts])[[0, 3, 1, 4, 2]], images)
    assert len(datamodule.arrays("train", total + 10)[0]) == total
    with pytest.raises(ConfigError, match="extractor=inception"):
        datamodule.arrays("train")
    # class-stratified, as an in-memory split's sample: every class in proportion to its share
    share = torch.bincount(read_labels(str(dst), None, "train"), minlength=3) / total
    for n, seed in itertools.product((5, 9, 13), range(4)):
        counts = torch.bincount(datamodule.arrays("train", n, seed=seed)[1], minlength=3)
        assert ((counts - n * share).abs() < 1).all(), (n, seed, counts.tolist())


def test_a_stream_converted_without_its_labels_gives_a_uniform_sample_and_says_so(
    converted, tmp_path, caplog
):
    """A conversion made before the labels were recorded still gives FID its seeded sample,
    uniform, with a line saying how to get a stratified one."""
    _, dst, _ = converted
    old = tmp_path / "old"
    shutil.copytree(dst, old)
    meta = json.loads(streamed(dst, "meta")[0]["json"])
    _write_meta(str(old), {k: v for k, v in meta.items() if k != "label_items"})
    assert read_labels(str(old), None, "train") is None
    cfg = make_cfg(
        tmp_path, ["data=streaming", f"data.source.input_dir={old}", "data.num_classes=3"]
    )
    datamodule = build(cfg.data, "data")
    images, labels = datamodule.arrays("train", 5, seed=1)
    assert len(images) == len(labels) == 5
    assert "convert it again for a stratified one" in caplog.text


@pytest.mark.slow
@pytest.mark.dist
def test_a_gan_on_streamed_data_under_ddp_ends_every_rank_with_the_extractors_one_line(
    converted, tmp_path
):
    """FID's auto extractor trains on the whole training split, which a stream is too large to
    hold: the one line says what to do. Only rank 0 reads the split (the others wait for its
    weights): its error ends every rank, none is left waiting in the broadcast (it was)."""
    _, dst, _ = converted
    result = run_cli(
        "model=dcgan",
        "data=streaming",
        f"data.source.input_dir={dst}",
        "data.num_classes=3",
        "data.source.size=16",
        "data.image_shape=[3,16,16]",
        "data.batch_size=4",
        "model.generator.width=8",
        "model.discriminator.width=8",
        *CPU_DDP,
        "logger=csv",
        f"paths.log_dir={tmp_path}",
        *QUIET,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("litlab: error:")]
    # each rank's own (before: rank 0's alone; rank 1 waited until the launcher killed it)
    assert len(lines) == 2 and all("callbacks.fid.extractor=inception" in x for x in lines), lines
    assert "Traceback" not in result.stderr, result.stderr[-3000:]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_streamed_epoch_resumed_inside_a_batch_gives_that_batch_again(converted, workers):
    """A checkpoint written inside a batch (Lightning's SLURM handler saves in the signal
    handler) holds LitData's position a batch ahead of what the trainer counts as trained; the
    loader continues from the trainer's count, so that batch is trained, not skipped."""
    _, dst, _ = converted

    def loader(trained=None):
        return names_loader(dst, num_workers=workers, trained=trained)

    whole = list(loader())
    cut = loader()
    batches = iter(cut)
    handed_out = [next(batches) for _ in range(3)]  # the third is in flight when it saves
    state = cut.state_dict()
    del batches
    resumed = loader(trained=lambda: 2)
    resumed.load_state_dict(state)
    assert handed_out == whole[:3]
    assert list(resumed) == whole[2:]


def test_an_epoch_stopped_on_chunks_resumes_on_a_copy_elsewhere_but_not_on_other_chunks(
    converted, tmp_path
):
    """data.source.input_dir may point elsewhere, at the same chunks (copied to a node's disk,
    a bucket): mid-epoch LitData refused its state's other path with a traceback (walkthrough
    168). A copy continues the epoch exactly; the same files converted again in other chunks
    (the conversion's key is the same) are refused in one line: the stopped epoch's place
    would point at other images."""
    _, dst, _ = converted
    whole = list(names_loader(dst))
    cut = names_loader(dst)
    batches = iter(cut)
    first = [next(batches) for _ in range(2)]
    state = cut.state_dict()
    del batches
    copy = tmp_path / "copy"
    shutil.copytree(dst, copy)
    resumed = names_loader(copy, trained=lambda: 2)
    resumed.load_state_dict(state)
    assert first + list(resumed) == whole
    root, _, _ = converted
    other = tmp_path / "rechunked"  # the same files and fractions, chunks of a few kB
    convert(root, str(other), max_side=64, workers=1, chunk_bytes="8kb")
    assert read_meta(str(other))["source_key"] == read_meta(str(dst))["source_key"]
    with pytest.raises(ConfigError, match="lays its images out in other chunks"):
        names_loader(other, trained=lambda: 2).load_state_dict(state)


def test_streamed_jpegs_decoded_on_the_device_train_to_the_end(converted, tmp_path):
    """data.source.decode=device: the loader hands JPEGs on encoded (PNGs as pixels), the run
    decodes them a batch at a time and trains to the end."""
    _, dst, _ = converted
    overrides = [
        "data=streaming",
        f"data.source.input_dir={dst}",
        "data.source.decode=device",
        "data.num_classes=3",
        "data.batch_size=8",
        "data.num_workers=0",
        "trainer.max_epochs=1",
        "logger=csv",
        *QUIET,
    ]
    cfg = make_cfg(tmp_path, overrides)
    datamodule = build(cfg.data, "data")
    datamodule.setup()
    # its splits were fixed at conversion: more validation images come from another conversion
    assert datamodule.more_validation.startswith("convert again with a larger --val-fraction")
    loaders = (
        datamodule.train_dataloader(),
        datamodule.val_dataloader(),
        datamodule.test_dataloader(),
    )
    kinds = {type(batch[0]).__name__ for loader in loaders for batch in loader}
    assert "Encoded" in kinds  # some batches carry JPEG bytes, not pixels
    train_task(cfg)
    summary = json.loads((Path(cfg.paths.output_dir) / "summary.json").read_text())
    assert summary["status"] == "completed" and "test/acc" in summary["metrics"]


def test_a_dataset_on_a_parallel_filesystem_is_shuffled_as_on_a_local_disk(tmp_path, monkeypatch):
    """On NFS, Lustre, GPFS, ... (forced here: LITDATA_POSIX_FAST=1) LitData shuffled whole
    chunks in an order fixed across epochs: each of 2 ranks trained on the same images every
    epoch and some images were never seen. Now, as on a local disk: over 3 epochs every image
    is trained on, and each rank's share changes from one epoch to the next."""
    from litlab.data.streaming import Streaming

    root = tmp_path / "images"
    write_png_folder(root, per_class=24)
    dst = tmp_path / "chunks"
    convert(root, str(dst), test_fraction=0.1, val_fraction=0.1, workers=1, chunk_bytes="2KB")
    monkeypatch.setenv("LITDATA_POSIX_FAST", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    seen = {}  # (rank, epoch) -> the images trained on
    for rank, epoch in itertools.product(range(2), range(3)):
        monkeypatch.setenv("GLOBAL_RANK", str(rank))
        dataset = Streaming(str(dst), size=8).load("train")
        assert len(list((dst / "train").glob("*.bin"))) >= 8  # several chunks per rank
        loader = fingerprint_loader(dataset, 42, 4, epoch=lambda epoch=epoch: epoch)
        seen[rank, epoch] = {name for batch in loader for name in batch}
    monkeypatch.delenv("WORLD_SIZE")  # one process reads them all
    monkeypatch.delenv("GLOBAL_RANK")
    everything = {fingerprint(image) for image, _ in Streaming(str(dst), size=8).load("train")}
    assert set().union(*seen.values()) == everything
    for rank in range(2):
        assert seen[rank, 0] != seen[rank, 1] != seen[rank, 2]


def test_epochs_on_several_nodes_give_every_rank_the_same_whole_batches_once(tmp_path):
    """LitData dealt the epochs after the first on several nodes among each node's own ranks:
    a node holding more items gave its ranks more batches (48 and 56 items: DDP's ranks then
    wait for each other), and a chunk two nodes shared in the first epoch was read by both in
    every later one (review 148). 2 nodes x 2 ranks here, dealt as LitData does; 10 chunks
    (LitData's epochs 2-4: 12, 12, 16 and 16 items a rank)."""
    from litdata.utilities.env import _DistributedEnv

    from litlab.data.streaming import Streaming

    root = tmp_path / "images"
    write_png_folder(root, per_class=24)
    dst = tmp_path / "chunks"
    convert(root, str(dst), test_fraction=0.1, val_fraction=0.1, workers=1, chunk_bytes="40KB")
    dataset = Streaming(str(dst), size=8).load("train")
    len(fingerprint_loader(dataset, 3, 4))  # (LitData makes its shuffler for the training)
    two_nodes = _DistributedEnv(world_size=4, global_rank=0, num_nodes=2)
    for epoch in range(1, 5):
        chunks, intervals = dataset.shuffler.get_chunks_and_intervals_per_workers(
            two_nodes, 1, 4, epoch
        )
        counts = {sum(end - first for _, first, end, _ in rank) for rank in intervals}
        assert len(counts) == 1 and counts.pop() % 4 == 0, epoch  # the same whole batches
        items = [
            (chunk, item)
            for rank_chunks, rank in zip(chunks, intervals, strict=True)
            for chunk, (_, first, end, _) in zip(rank_chunks, rank, strict=True)
            for item in range(first, end)
        ]
        assert len(items) == len(set(items)), epoch  # each item once


def fingerprint(image: torch.Tensor) -> bytes:
    return image.numpy().tobytes()


def fingerprint_loader(dataset: Any, seed: int, batch_size: int, **options: Any) -> Any:
    """litlab's streaming loader over a streamed split, shuffled (``seed``), dropping the last
    items as training does; its batches are lists of the images' fingerprints."""
    dataset.seed = seed
    return streaming_loader_class()(
        dataset,
        batch_size=batch_size,
        shuffle=True,
        drop_last=True,
        collate_fn=lambda items: [fingerprint(image) for image, _ in items],
        **options,
    )


@pytest.mark.dist
def test_a_streamed_evaluation_under_fsdp_runs_as_many_batches_on_every_rank(tmp_path):
    """LitData deals an evaluation's items so that ranks can run different numbers of batches
    (every item once); under FSDP each forward is a collective, and a rank with a batch more
    would wait for the others forever. Padded with empty batches: every rank runs the largest
    count through an FSDP-wrapped net, and every test image is seen once over the ranks."""
    import torch.multiprocessing as mp

    from helpers import streamed_evaluation_under_fsdp

    root = tmp_path / "images"
    write_png_folder(root, per_class=24)
    dst = tmp_path / "chunks"
    convert(root, str(dst), test_fraction=0.3, val_fraction=0.1, workers=1, chunk_bytes="2KB")
    args = (2, str(tmp_path / "init"), str(tmp_path), str(dst))
    mp.spawn(streamed_evaluation_under_fsdp, args=args, nprocs=2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    counts = ranks[0]["counts"]
    assert counts[0] == counts[1] == ranks[0]["batches"] == ranks[1]["batches"]
    assert ranks[0]["empty"] + ranks[1]["empty"] > 0  # the case: one rank had fewer
    tested = Counter(x for rank in ranks for x in rank["seen"])
    everything = Counter(fingerprint(image) for image, _ in streamed_test_split(dst))
    assert tested == everything


def streamed_test_split(dst: Path) -> Any:
    from litlab.data.streaming import Streaming

    return Streaming(str(dst), size=8).load("test")


def test_evaluation_batches_are_padded_where_each_forward_is_a_collective_only():
    from types import SimpleNamespace

    from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy

    from litlab.distributed.strategy import forward_is_collective

    def trainer(strategy, world_size=2):
        return SimpleNamespace(strategy=strategy, world_size=world_size)

    assert forward_is_collective(trainer(FSDPStrategy()))
    assert not forward_is_collective(trainer(FSDPStrategy(), world_size=1))
    assert not forward_is_collective(trainer(DDPStrategy()))  # an evaluation forward syncs nothing
    assert not forward_is_collective(None)  # a DataModule used without a trainer


@pytest.fixture(scope="module")
def one_chunk(tmp_path_factory) -> Path:
    """600 small PNGs converted into one chunk per split (420 training images)."""
    root = tmp_path_factory.mktemp("many")
    write_png_folder(root, per_class=200)
    dst = tmp_path_factory.mktemp("one_chunk")
    convert(root, str(dst), test_fraction=0.2, val_fraction=0.1, workers=1)
    return dst


def stored_positions(dst: Path) -> dict[bytes, int]:
    """Each training image's place in its chunk, by its pixels."""
    from litlab.data.streaming import Streaming

    dataset = Streaming(str(dst), size=8).load("train")
    return {fingerprint(image): i for i, (image, _) in enumerate(dataset)}


def training_batches(dst: Path, epoch: int) -> list:
    from litlab.data.streaming import Streaming

    dataset = Streaming(str(dst), size=8).load("train")
    return list(fingerprint_loader(dataset, 3, 128, epoch=lambda: epoch))


def test_a_streamed_batch_draws_from_the_whole_chunk_not_a_fixed_block(one_chunk):
    """LitData's default in-chunk shuffle permutes aligned blocks of 256 items: every batch of
    128 took its images from one block, the same groups of images every epoch. In blocks of 32
    now, four random ones to a batch: most batches span two blocks of 256 (4 of 14 blocks of 32
    lie in one of them 8% of the time)."""
    assert len(list((one_chunk / "train").glob("*.bin"))) == 1
    place = stored_positions(one_chunk)
    batches = training_batches(one_chunk, 0) + training_batches(one_chunk, 1)
    spanning = [len({place[image] // 256 for image in batch}) > 1 for batch in batches]
    assert len(batches) == 6 and sum(spanning) >= 4, spanning


def test_each_epoch_leaves_out_other_images_of_a_chunk(one_chunk):
    """Whole batches leave 36 of the 420 training images out of an epoch. LitData cut them from
    the last chunk's end before shuffling within it: with one chunk, the same 36 every epoch,
    whatever the seed, never trained on (review 147). Now another stretch every epoch: over
    four epochs every image is trained on, each epoch's images once."""
    place = stored_positions(one_chunk)
    left_out = []
    for epoch in range(4):
        trained = [image for batch in training_batches(one_chunk, epoch) for image in batch]
        assert len(trained) == len(set(trained)) == 384
        left_out.append(set(place) - set(trained))
    assert len({frozenset(images) for images in left_out}) == 4
    assert not set.intersection(*left_out)  # every image trained on in some epoch


def test_an_epoch_stopped_with_litdatas_default_window_continues_with_it(one_chunk, caplog):
    """A mid-epoch checkpoint of a run from before (LitData's window of 256 items) continues
    that epoch as it would have gone on (LitData refused the state: ValueError), and says that
    the window given (here the default, 32) is not applied (walkthrough 130: a resume= with
    data.source.shuffle_window=256 was recorded, and silently not applied)."""
    import litdata as ld

    old = ld.StreamingDataset(join(str(one_chunk), "train"), transform=DecodeImage(8, 3))
    loader = fingerprint_loader(old, 3, 64)
    batches = iter(loader)
    next(batches)
    state = loader.state_dict()
    rest = list(batches)
    assert state["dataset"]["item_shuffle_window"] == 256
    from litlab.data.streaming import Streaming

    resumed = fingerprint_loader(Streaming(str(one_chunk), size=8).load("train"), 3, 64)
    with caplog.at_level("INFO", logger="litlab"):
        resumed.load_state_dict(state)
    assert list(resumed) == rest  # and with LitData's cut of the epoch (review 147), as begun
    assert "data.source.shuffle_window=32 is not this run's" in caplog.text
    assert "streamed with LitData's epoch cut" in caplog.text
    # the epochs after it are cut as a new run's (they kept LitData's for good: review 148)
    from litlab.data.litdata_shuffle import CUT

    assert not resumed.state_dict()[CUT]
    next_epoch = list(resumed)
    assert resumed.state_dict()[CUT] and len(next_epoch) == len(rest) + 1


def test_a_streamed_split_of_fewer_images_than_ranks_is_one_clear_line(tmp_path):
    """A test split of 1 image on 2 ranks: LitData deals whole batches to ranks, so one rank
    has none (Lightning refuses a loader of zero length on a rank). Before (found by review):
    "the streaming test split is empty", read from this rank's share of a split that 1 process
    trains and tests on."""
    root = tmp_path / "images"
    write_png_folder(root / "train", per_class=20)
    write_png_folder(root / "test", classes=("cat",), per_class=1)
    for other in ("dog", "fox"):
        (root / "test" / other).mkdir()  # the same classes, without test images
    chunks = tmp_path / "chunks"
    convert(root, str(chunks), workers=1)
    args = ["data=streaming", f"data.source.input_dir={chunks}", "data.num_classes=3"]
    args += ["data.num_workers=0", "trainer.max_epochs=1", "logger=csv", *QUIET, *CPU_DDP]
    run = run_cli(*args, f"paths.log_dir={tmp_path / 'runs'}", timeout=300)
    assert run.returncode == 2, run.stderr[-3000:]
    assert run.stderr.strip().splitlines()[-1] == (
        "litlab: error: the streaming test split holds 1 image(s), fewer than the run's 2 "
        "processes, and LitData gives each process whole batches of its own; add images to "
        "the split, or run on fewer processes"
    )


def test_chunk_sizes_in_bytes_or_with_a_unit_and_a_wrong_one_in_one_line(tmp_path, capsys):
    """`--chunk-bytes 2000` (a number of bytes) converts; LitData takes only a size with a unit
    as text and ended a bare number with its traceback (found by review). A size it cannot read
    is one line."""
    write_png_folder(tmp_path / "images", per_class=4)
    assert main([str(tmp_path / "images"), str(tmp_path / "a"), "--chunk-bytes", "2000"]) == 0
    assert len(list((tmp_path / "a" / "train").glob("chunk-*.bin"))) > 1  # 2 kB chunks
    with pytest.raises(SystemExit) as refused:
        main([str(tmp_path / "images"), str(tmp_path / "b"), "--chunk-bytes", "2 bananas"])
    assert refused.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "litlab: error: --chunk-bytes 2 bananas: give a size such as 64MB or 512kb, or a "
        "number of bytes"
    )


def test_overfit_on_a_stream_trains_the_same_batches_every_epoch(converted, tmp_path):
    """debug=overfit promises the same batches every epoch (a seeded sample, as the in-memory
    and folder loaders give); a stream was shuffled in each epoch's own order, so each epoch
    "overfitted" other images (reviewer)."""
    _, dst, _ = converted
    overrides = [
        "debug=overfit",
        "trainer.overfit_batches=2",
        "trainer.max_epochs=3",
        "data=streaming",
        f"data.source.input_dir={dst}",
        "data.num_classes=3",
        "data.image_shape=[3,36,36]",
        "data.random_resized_crop=null",  # deterministic images: fingerprints identify them
        "data.eval_crop=1",
        "data.hflip=false",
        "data.batch_size=4",
        "data.num_workers=0",
        "model.scheduler=null",
        "test=true",  # RecordImages writes what it saw when the test ends
        "+callbacks.record._target_=helpers.RecordImages",
        f"+callbacks.record.folder={tmp_path / 'seen'}",
        "logger=csv",
        *QUIET,
    ]
    cfg = make_cfg(tmp_path, overrides)
    train_task(cfg)
    seen = json.loads((tmp_path / "seen" / "rank0.json").read_text())
    epochs = [seen[f"epoch{e}"] for e in range(3)]
    assert len(epochs[0]) == 2 and all(len(batch) == 4 for batch in epochs[0])
    assert epochs[1] == epochs[0] and epochs[2] == epochs[0]


def test_copies_among_the_converted_splits_are_said_by_the_conversion_and_the_run(
    tmp_path, capsys, caplog
):
    """A folder's test/ holding copies of train/ files (walkthrough 150): the conversion
    digests each file it reads and says them, the chunks' meta records them, and a run on the
    chunks says them and records them in summary.json as a run on the folder does."""
    root = tmp_path / "images"
    write_png_folder(root / "train", per_class=8)
    write_png_folder(root / "test", per_class=3, seed=1)
    for i in range(2):
        shutil.copy(root / "train" / "dog" / f"{i}.png", root / "test" / "dog" / f"dup{i}.png")
    meta = convert(root, str(tmp_path / "chunks"), workers=2)
    found = sorted(tuple(pair) for pair in meta["copies_of_training"]["test"])
    # each copy's original, in the split the conversion put it in (validation is carved out
    # of train/, file by file)
    assert [held for held, _ in found] == ["test:dog/dup0.png", "test:dog/dup1.png"]
    assert [original.split(":") for _, original in found] in [
        [[a, "dog/0.png"], [b, "dog/1.png"]] for a in ("train", "val") for b in ("train", "val")
    ]
    assert list(meta["copies_of_training"]) == ["test"]
    assert (
        "warning: 2 of the 11 test images are byte-for-byte copies of files the run trains or "
        "validates on (e.g. test:" in capsys.readouterr().err
    )
    from litlab.data import DataModule
    from litlab.data.streaming import Streaming

    source = Streaming(str(tmp_path / "chunks"), size=8)
    dm = DataModule(source, [3, 8, 8], 3, [0.5], [0.25], batch_size=4, loader="auto")
    with caplog.at_level("WARNING", logger="litlab"):
        dm.setup()
    assert sorted(dm.copies["test"]) == found
    assert "val" not in dm.copies  # (none there)
    assert "2 of the 11 test images are byte-for-byte copies of files the run trains" in (
        caplog.text
    )
    assert dm.report()["copies_of_training"]["test"]["images"] == 2


def test_nodes_sharing_litdatas_default_cache_are_told_and_local_chunks_stay_as_given(
    tmp_path, monkeypatch, caplog
):
    """Chunks read as remote ones (an object store's; LitData's ``local:`` folder) are
    downloaded into a cache, LitData's default one under the home folder, which a cluster's
    nodes share: max_cache_size bounds each node's share of one folder (review 158). Said once
    a run of several nodes, with what to give; not with a cache_dir of its own. And a
    ``local:`` input_dir was made into <cwd>/local:<path> in the checkpoints: resume= and
    eval.py looked for that."""
    import lightning as L

    from litlab.config import absolute_data_paths
    from litlab.data import DataModule
    from litlab.data.streaming import Streaming

    monkeypatch.delenv("LITDATA_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    write_png_folder(tmp_path / "images", per_class=8)
    convert(tmp_path / "images", str(tmp_path / "chunks"), workers=1)
    remote = f"local:{tmp_path / 'chunks'}"

    def said(nodes: int, cache_dir: str | None = None) -> list[str]:
        source = Streaming(remote, size=8, cache_dir=cache_dir)
        dm = DataModule(source, [3, 8, 8], 3, [0.5], [0.25], batch_size=2, loader="auto")
        dm.trainer = L.Trainer(accelerator="cpu", devices=1, num_nodes=nodes, logger=False)
        caplog.clear()
        with caplog.at_level("WARNING", logger="litlab"):
            dm.setup()
        return [r.getMessage() for r in caplog.records if "cache_dir is not set" in r.getMessage()]

    (line,) = said(2)
    assert str(tmp_path / "home" / ".lightning" / "chunks") in line
    assert "data.source.cache_dir=/tmp/litdata" in line
    assert said(1) == [] and said(2, str(tmp_path / "node-cache")) == []
    config = {"data": {"source": {"input_dir": remote}}}
    assert absolute_data_paths(config)["data"]["source"]["input_dir"] == remote


def test_the_conversions_train_line_trains_on_a_small_folder(tmp_path, capsys):
    """The conversion's "train on it" command, run as printed, on a folder of 30 images: it
    asked for data=streaming's batch of 128 (refused: "batch_size 128 exceeds the 21 training
    images"; walkthrough 176); a batch that fits is in the line where the split is smaller."""
    images, dst = tmp_path / "images", tmp_path / "chunks"
    write_png_folder(images, per_class=10)
    assert main([str(images), str(dst), "--workers", "1"]) == 0
    (line,) = [out for out in capsys.readouterr().out.splitlines() if "train on it:" in out]
    command = line.split("train on it: python train.py ", 1)[1].split()
    assert any(arg.startswith("data.batch_size=") for arg in command)
    trained = run_cli(*command, "trainer.max_epochs=1", *QUIET_CSV, f"paths.log_dir={tmp_path}")
    assert trained.returncode == 0, trained.stderr[-2000:]
