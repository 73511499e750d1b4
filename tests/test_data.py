"""Sources read the real on-disk formats; the DataModule splits, checks and transforms."""

from __future__ import annotations

import gzip
import json
import logging
import math
import os
import re
import shutil
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from conftest import (
    FASHION_SYSTEM_DIR,
    QUIET_CSV,
    REPO,
    make_cfg,
    needs_fashion,
    refused,
    run_cli,
    summary_of,
    write_cifar_batches,
    write_folder_losing_a_class_to_validation,
    write_idx,
    write_idx_dataset,
    write_png_folder,
    write_unusual_images,
)
from litlab.config import build
from litlab.data import (
    CIFAR10,
    MNIST,
    DataModule,
    DeviceLoader,
    Digits,
    FashionMNIST,
    ImageFolder,
    Synthetic,
)
from litlab.data.folder_cache import cached_folder
from litlab.data.pixels import load_image
from litlab.data.sources import (
    FASHION_MNIST_COUNTS,
    MNIST_COUNTS,
    labels_of,
    read_idx,
    stratified_indices,
)
from litlab.data.transforms import (
    BatchTransform,
    centre_boxes,
    crop_boxes,
    random_hflip,
    random_translate,
    resized_crops,
    roi_crops,
)
from litlab.errors import ConfigError, DataError
from litlab.train import train_task

# What a test of a classifier of 5 classes or fewer logs (no top-5)
TESTED = ("test/loss", "test/acc", "test/acc_macro")


def test_digits_is_embedded_upsampled_and_split_the_same_way_every_time():
    train, test = Digits(size=32).load("train"), Digits(size=32).load("test")
    assert train.tensors[0].shape[1:] == (1, 32, 32) and train.tensors[0].dtype == torch.uint8
    assert len(train) + len(test) == 1797
    assert torch.equal(Digits(size=32).load("test").tensors[1], test.tensors[1])
    assert set(test.tensors[1].tolist()) == set(range(10))


@pytest.mark.parametrize("gz", [True, False])
def test_read_idx_plain_and_gzip(tmp_path, gz):
    array = np.arange(2 * 3 * 4).reshape(2, 3, 4) % 256
    path = tmp_path / ("x.idx.gz" if gz else "x.idx")
    write_idx(path, array)
    assert read_idx(path).tolist() == array.tolist()


def test_truncated_idx_gz_is_a_data_error(tmp_path):
    write_idx_dataset(tmp_path)
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(DataError, match="fetch the file again"):
        read_idx(path)


def test_idx_with_short_payload_is_a_data_error(tmp_path):
    path = tmp_path / "train-labels-idx1-ubyte"
    path.write_bytes(bytes([0, 0, 8, 1]) + (100).to_bytes(4, "big") + bytes(10))
    with pytest.raises(DataError, match="truncated or corrupt"):
        read_idx(path)


@pytest.mark.parametrize("layout", ["flat", "torchvision"])
def test_mnist_reads_data_dir_in_both_layouts(tmp_path, layout):
    folder = tmp_path if layout == "flat" else tmp_path / "MNIST" / "raw"
    write_idx_dataset(folder, n_train=30, n_test=10, gz=layout == "flat")
    source = MNIST(str(tmp_path), download=False)
    source.prepare()
    train, test = source.load("train"), source.load("test")
    assert train.tensors[0].shape == (30, 1, 28, 28) and len(test) == 10


def test_fashion_prefers_data_dir_over_the_system_copy(tmp_path, caplog):
    """data_dir first, then the system's copy; the folder read is said and in summary.json's
    data (a data_dir given wrong fell back to the system copy without a word: 176)."""
    write_idx_dataset(tmp_path, n_train=12, n_test=4)
    system = tmp_path / "system"
    write_idx_dataset(system, n_train=20, n_test=8)
    source = FashionMNIST(str(tmp_path), download=False, system_dir=str(system))
    assert len(source.load("train")) == 12
    assert source.report == {"read_from": str(tmp_path)}
    only_system = FashionMNIST(str(tmp_path / "nope"), download=False, system_dir=str(system))
    with caplog.at_level("INFO", logger="litlab"):
        only_system.prepare()
        only_system.prepare(test=True)  # (every stage prepares: said once)
    assert len(only_system.load("train")) == 20
    assert only_system.report == {"read_from": str(system)}
    said = f"fashion_mnist: reading the files in {system} (data.source.data_dir="
    assert caplog.text.count(said + f"{tmp_path / 'nope'} does not exist)") == 1


def write_counted_idx(folder: Path, counts: dict[str, tuple[int, ...]]) -> None:
    """Four IDX files whose labels count per class as ``counts`` says (blank images)."""
    for prefix, split in (("train", "train"), ("t10k", "test")):
        labels = np.repeat(np.arange(10), counts[split])
        write_idx(folder / f"{prefix}-labels-idx1-ubyte", labels)
        write_idx(folder / f"{prefix}-images-idx3-ubyte", np.zeros((len(labels), 28, 28)))


def test_mnist_and_fashion_mnist_pass_over_each_others_files(tmp_path, caplog):
    """Their files have the same names, and both read data_dir first: data=mnist with a
    data_dir holding Fashion-MNIST trained on Fashion-MNIST unawares (and the reverse)."""
    write_counted_idx(tmp_path, FASHION_MNIST_COUNTS)
    with pytest.raises(DataError) as err:
        MNIST(str(tmp_path), download=False).prepare()
    message = str(err.value)
    assert f"{tmp_path} holds Fashion-MNIST's files" in message
    assert f"put the four IDX files (.gz or plain) in {tmp_path / 'MNIST' / 'raw'}" in message
    write_counted_idx(tmp_path / "MNIST" / "raw", MNIST_COUNTS)
    mnist = MNIST(str(tmp_path), download=False)
    mnist.prepare()
    for split in ("train", "test"):
        assert tuple(mnist.load(split).tensors[1].bincount().tolist()) == MNIST_COUNTS[split]
    assert f"{tmp_path} holds Fashion-MNIST's files (the same names), not mnist's" in caplog.text
    fashion = FashionMNIST(
        str(tmp_path / "MNIST" / "raw"), download=False, system_dir=str(tmp_path)
    )
    assert fashion.load("train").tensors[1].bincount().tolist() == [6000] * 10


def test_missing_idx_files_name_all_three_ways(tmp_path):
    source = FashionMNIST(str(tmp_path), download=False, system_dir=str(tmp_path / "nowhere"))
    with pytest.raises(DataError) as err:
        source.prepare()
    message = str(err.value)
    assert str(tmp_path) in message and "nowhere" in message and "download" in message
    assert "\n" not in message


@needs_fashion
def test_fashion_reads_the_debian_copy_whose_gz_differs_from_torchvision(tmp_path):
    source = FashionMNIST(str(tmp_path), download=False)
    source.prepare()
    train, test = source.load("train"), source.load("test")
    assert train.tensors[0].shape == (60000, 1, 28, 28) and len(test) == 10000
    assert train.tensors[1].bincount().tolist() == [6000] * 10


def test_cifar10_reads_python_batches(tmp_path):
    write_cifar_batches(tmp_path, per_batch=8)
    source = CIFAR10(str(tmp_path), download=False)
    source.prepare()
    train, test = source.load("train"), source.load("test")
    assert train.tensors[0].shape == (40, 3, 32, 32) and test.tensors[0].shape == (8, 3, 32, 32)
    assert train.tensors[1].dtype == torch.long


def test_cifar10_corrupt_batch_is_a_data_error(tmp_path):
    write_cifar_batches(tmp_path, per_batch=8)
    (tmp_path / "cifar-10-batches-py" / "test_batch").write_bytes(b"\x80\x04garbage")
    with pytest.raises(DataError, match="not a readable CIFAR-10 batch"):
        CIFAR10(str(tmp_path), download=False).load("test")


def test_jobs_starting_at_once_download_a_dataset_once_and_read_it_whole(tmp_path):
    """A sweep's jobs on a fresh machine prepare the same data folder at once. torchvision
    writes and extracts its files in place: each job downloaded every file again over the
    others' (a job's md5 check or extraction could meet another's truncation) and a job could
    take another's half-written file as found. Three jobs against a slow local mirror: each
    file is fetched once, and every job reads the whole dataset."""
    import hashlib
    import http.server
    import time

    mirror = tmp_path / "mirror"
    write_idx_dataset(mirror, n_train=2000, n_test=500)
    fetched: Counter = Counter()

    class SlowMirror(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(mirror), **kwargs)

        def copyfile(self, source, outputfile):  # about 1 s a file: the jobs' fetches overlap
            if self.headers.get("Method") == "HEAD":
                return  # torchvision's redirect probe: a GET it closes after the headers
            fetched[self.path.lstrip("/")] += 1
            while chunk := source.read(16384):
                outputfile.write(chunk)
                time.sleep(0.02)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), SlowMirror)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    md5s = {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in sorted(mirror.iterdir())}
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), str(REPO / "src")])}
    go = tmp_path / "go"
    logs = [open(tmp_path / f"job{i}.txt", "w+") for i in range(3)]  # noqa: SIM115
    jobs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys, helpers; helpers.fetch_fashion_mnist(*sys.argv[1:])",
                str(tmp_path / "data"),
                url,
                json.dumps(md5s),
                str(tmp_path / f"ready{i}"),
                str(go),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        for i, log in enumerate(logs)
    ]
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"ready{i}").exists() for i in range(3)):
            assert time.monotonic() < deadline and all(j.poll() is None for j in jobs)
            time.sleep(0.05)
        go.touch()  # all three fetch from the same instant
        for job in jobs:
            job.wait(timeout=120)
    finally:
        server.shutdown()
        server.server_close()
        for job in jobs:
            job.kill()
            job.wait()
    outputs = []
    for job, log in zip(jobs, logs, strict=True):
        log.seek(0)
        lines = log.read().splitlines()
        log.close()
        assert job.returncode == 0, "\n".join(line for line in lines if "B/s]" not in line)[-3000:]
        outputs.append(lines[-1])
    expected = hashlib.sha256()  # the mirror's files, read where they are
    for split in ("train", "test"):
        for tensor in FashionMNIST(str(mirror), system_dir=None).load(split).tensors:
            expected.update(tensor.numpy().tobytes())
    assert outputs == [expected.hexdigest()] * 3
    assert fetched == Counter(list(md5s))  # each file once


def test_a_folder_that_cannot_be_locked_warns_only_when_it_downloads(tmp_path, monkeypatch, caplog):
    """Where no lock can be taken (NFS without lockd; here the lock's name is a folder) the
    files are still read, silently when they are there, with a warning before a download."""
    import torchvision

    data = tmp_path / "data"
    (data / ".fashion_mnist.download.lock").mkdir(parents=True)
    write_idx_dataset(data, n_train=20, n_test=10)
    source = FashionMNIST(str(data), system_dir=None)
    with caplog.at_level("WARNING", logger="litlab"):
        source.prepare()
    assert len(source.load("train")) == 20 and not caplog.records
    monkeypatch.setattr(torchvision.datasets.FashionMNIST, "mirrors", ["http://127.0.0.1:9/"])
    missing = FashionMNIST(str(tmp_path / "empty"), system_dir=None)
    (tmp_path / "empty" / ".fashion_mnist.download.lock").mkdir(parents=True)
    with caplog.at_level("WARNING", logger="litlab"), pytest.raises(DataError, match="download"):
        missing.prepare()
    assert "downloading without a lock" in caplog.text and "Is a directory" in caplog.text


def test_a_job_waiting_too_long_for_anothers_download_says_which_lock(tmp_path, monkeypatch):
    """A download that stalls holds the others back: after DOWNLOAD_WAIT_S a waiting job stops
    with one line naming the lock (in DDP it hit Lightning's barrier timeout, which names
    nothing)."""
    import litlab.data.sources as sources

    lock = tmp_path / "data" / ".fashion_mnist.download.lock"
    lock.parent.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from filelock import FileLock; lock = FileLock(sys.argv[1]); lock.acquire(); "
            "print('held', flush=True); time.sleep(120)",
            str(lock),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(sources, "DOWNLOAD_WAIT_S", 1)
        with pytest.raises(DataError, match=r"another process has held .*fashion_mnist\.download"):
            sources.FashionMNIST(str(tmp_path / "data"), system_dir=None).prepare()
    finally:
        holder.kill()
        holder.wait()


def test_missing_cifar_without_download_says_what_to_do(tmp_path):
    with pytest.raises(DataError, match="download=true"):
        CIFAR10(str(tmp_path), download=False).prepare()


def test_image_folder_with_train_and_test_subfolders(tmp_path):
    write_png_folder(tmp_path / "train")
    write_png_folder(tmp_path / "test", per_class=2)
    for cache in (True, False):
        source = ImageFolder(str(tmp_path), size=24, cache=cache, cache_dir=str(tmp_path / "c"))
        train, test = source.load("train"), source.load("test")
        image, label = train[0]
        assert image.shape == (3, 24, 24) and image.dtype == torch.uint8
        assert len(train) == 18 and len(test) == 6 and label == 0


def test_image_folder_single_folder_is_split_file_by_file_and_grayscale_works(tmp_path):
    """Without split folders the test images are held out file by file, from each file's name:
    the same with or without the cache, and a folder that gains files or holds an unreadable
    one moves no file from one split to another (a test image never becomes a training one)."""
    from PIL import Image

    from litlab.data.folder_index import file_names

    root = tmp_path / "images"
    write_png_folder(root, per_class=30)
    classes = ["cat", "dog", "fox"]

    def split(cache: bool = True) -> dict[str, list[str]]:
        source = ImageFolder(
            str(root), size=16, channels=1, cache=cache, cache_dir=str(tmp_path / "cache")
        )
        train, test = source.load("train"), source.load("test")
        assert train[0][0].shape == (1, 16, 16)
        for i in (0, len(test) - 1):  # labels follow their files
            assert int(test[i][1]) == classes.index(file_names(test)[i].split("/")[0])
        return {"train": file_names(train), "test": file_names(test)}

    first = split()
    train, test = set(first["train"]), set(first["test"])
    assert not train & test and len(train | test) == 90
    assert 9 <= len(test) <= 27  # about test_fraction (0.2) of the files
    assert {name.split("/")[0] for name in test} == set(classes)
    assert split(cache=False) == first
    rng = np.random.default_rng(1)
    for i in range(20):
        pixels = rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / classes[i % 3] / f"new{i}.png")
    (root / "dog" / "broken.png").write_bytes(b"not an image")
    grown = split()
    assert test <= set(grown["test"]) and train <= set(grown["train"])
    assert len(grown["train"]) + len(grown["test"]) == 110  # the unreadable file in neither


def test_image_folder_validation_split_is_file_by_file_and_classes_must_agree(tmp_path):
    from litlab.data.folder_index import file_names

    root = tmp_path / "images"
    write_png_folder(root / "train", per_class=20)
    write_png_folder(root / "test", per_class=2)

    def datamodule(split_seed: int = 0) -> DataModule:
        source = ImageFolder(str(root), size=16, cache_dir=str(tmp_path / "cache"))
        dm = DataModule(
            source, [3, 16, 16], 3, [0.5], [0.25], batch_size=4, val_fraction=0.2,
            split_seed=split_seed, loader="auto",
        )  # fmt: skip
        dm.setup()
        return dm

    dm = datamodule()
    val, fit = set(file_names(dm.datasets["val"])), set(file_names(dm.datasets["train"]))
    assert not val & fit and len(val | fit) == 60 and 4 <= len(val) <= 20
    (root / "train" / "cat" / "extra.png").write_bytes(
        (root / "train" / "cat" / "0.png").read_bytes()
    )
    again = datamodule()
    assert val <= set(file_names(again.datasets["val"]))
    assert fit <= set(file_names(again.datasets["train"]))
    assert set(file_names(datamodule(split_seed=1).datasets["val"])) != val
    # A test folder whose class folders are named otherwise would relabel every class after it.
    (root / "test" / "dog").rename(root / "test" / "wolf")
    with pytest.raises(DataError, match=r"only in train/: \['dog'\]; only in test/: \['wolf'\]"):
        datamodule()


def test_synthetic_is_deterministic_and_any_shape():
    a = Synthetic(image_shape=(3, 17, 9), num_classes=4, train_size=10, test_size=5).load("train")
    b = Synthetic(image_shape=(3, 17, 9), num_classes=4, train_size=10, test_size=5).load("train")
    assert a.tensors[0].shape == (10, 3, 17, 9) and torch.equal(a.tensors[0], b.tensors[0])
    assert int(a.tensors[1].max()) < 4


def make_dm(**kwargs) -> DataModule:
    defaults = dict(
        source=Digits(),
        image_shape=[1, 28, 28],
        num_classes=10,
        mean=[0.3],
        std=[0.3],
        batch_size=32,
    )
    return DataModule(**{**defaults, **kwargs})


def test_val_split_is_disjoint_and_fixed():
    dm = make_dm()
    dm.setup()
    train, val = set(dm.datasets["train"].indices), set(dm.datasets["val"].indices)
    assert not train & val and len(train) + len(val) == len(Digits().load("train"))
    again = make_dm()
    again.setup()
    assert set(again.datasets["val"].indices) == val


def test_wrong_image_shape_tells_the_right_one():
    """The source's own size and channels first where it has them (an image folder's stored
    size is not the net's input), else the shape of the images."""
    dm = make_dm(image_shape=[1, 32, 32])
    with pytest.raises(
        ConfigError,
        match=r"set data.source.size=32 \(decoded so\), or data.image_shape=\[1,28,28\]$",
    ):
        dm.setup()
    dm = make_dm(image_shape=[3, 28, 28])
    with pytest.raises(ConfigError, match=r"set data.image_shape=\[1,28,28\]$"):
        dm.setup()


def test_too_few_classes_tells_the_right_count():
    dm = make_dm(num_classes=5)
    with pytest.raises(ConfigError, match=r"set data\.num_classes=10"):
        dm.setup()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(batch_size=0), "batch_size must be a positive integer"),
        (dict(val_fraction=1.5), "val_fraction must lie strictly between 0 and 1"),
        (dict(val_fraction=0.0), "val_fraction must lie strictly between 0 and 1"),
        (dict(mean=[0.1, 0.2]), "one mean and std"),
        (dict(std=[0.0]), "std must be positive"),
    ],
)
def test_bad_datamodule_arguments(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        make_dm(**kwargs)


def test_batch_transform_normalizes_and_maps_back():
    transform = BatchTransform(mean=[0.5], std=[0.25])
    images = torch.tensor([0, 255], dtype=torch.uint8).view(2, 1, 1, 1)
    out = transform(images, train=False)
    assert out.flatten().tolist() == pytest.approx([-2.0, 2.0])
    assert transform.to_unit(out).flatten().tolist() == pytest.approx([0.0, 1.0])


def test_normalization_gives_exactly_what_models_were_trained_on():
    """(x / 255 - mean) / std to the last bit, per channel: a cheaper formula that rounds
    differently changes every run's numbers (3 epochs of the tiny MLP: final loss 0.2655 vs
    0.2818)."""
    transform = BatchTransform(mean=[0.5, 0.4, 0.3], std=[0.25, 0.2, 0.3])
    images = torch.randint(0, 256, (16, 3, 8, 8), dtype=torch.uint8)
    expected = (images / 255.0 - transform.mean) / transform.std
    assert torch.equal(transform(images, train=False), expected)


def test_translate_shifts_each_image_by_its_own_offset_and_keeps_labels_aligned():
    torch.manual_seed(0)
    n = 64
    images = torch.zeros(n, 1, 9, 9, dtype=torch.uint8)
    images[torch.arange(n), 0, 4, 4] = torch.arange(
        1, n + 1, dtype=torch.uint8
    )  # value = sample id
    out = random_translate(images, max_shift=2)
    assert out.shape == images.shape and out.dtype == torch.uint8
    positions = set()
    for i in range(n):
        (ys, xs) = torch.nonzero(out[i, 0], as_tuple=True)
        assert len(ys) == 1 and out[i, 0, ys[0], xs[0]] == i + 1  # the sample's own pixel, moved
        assert abs(int(ys[0]) - 4) <= 2 and abs(int(xs[0]) - 4) <= 2
        positions.add((int(ys[0]), int(xs[0])))
    assert len(positions) > 5  # offsets are drawn per sample


def test_hflip_mirrors_about_half_and_keeps_the_rest():
    torch.manual_seed(0)
    images = torch.arange(400 * 4, dtype=torch.float32).view(400, 1, 1, 4)
    out = random_hflip(images)
    flipped = (out != images).any(dim=(1, 2, 3))
    assert torch.equal(out[flipped], images[flipped].flip(3))
    assert 150 < int(flipped.sum()) < 250


def test_augmentation_only_in_training():
    dm = make_dm(translate=3, hflip=True)
    images = torch.randint(0, 256, (8, 1, 28, 28), dtype=torch.uint8)
    assert torch.equal(dm.transform(images, train=False), dm.transform(images, train=False))
    torch.manual_seed(1)
    assert not torch.equal(dm.transform(images, train=True), dm.transform(images, train=False))


def test_copying_debian_files_into_data_dir_works_too(tmp_path):
    if not FASHION_SYSTEM_DIR.is_dir():
        pytest.skip("Fashion-MNIST not installed")
    for f in FASHION_SYSTEM_DIR.glob("t10k-*.gz"):
        shutil.copy(f, tmp_path / f.name)
    with gzip.open(tmp_path / "t10k-labels-idx1-ubyte.gz") as f:
        assert f.read(4) == b"\x00\x00\x08\x01"
    source = FashionMNIST(str(tmp_path), download=False, system_dir=None)
    assert len(source.load("test")) == 10000


def test_device_is_the_default_and_keeps_the_splits_of_the_dataloader_path(caplog):
    device, plain = make_dm(num_workers=2), make_dm(loader="dataloader", num_workers=2)
    chosen = make_dm(loader="auto", num_workers=2)  # (data=image_folder's defaults: not said)
    with caplog.at_level(logging.INFO, logger="litlab"):
        device.setup(), plain.setup(), chosen.setup()
    assert chosen.loader == "device"
    # the workers asked for are not used by the device loader: said once (walkthrough 142)
    (said,) = [r.getMessage() for r in caplog.records if "num_workers" in r.getMessage()]
    assert "data.num_workers=2 is not used (it serves data.loader=dataloader)" in said
    assert isinstance(device.train_dataloader(), DeviceLoader)
    assert isinstance(plain.train_dataloader(), DataLoader)
    for split in ("val", "test"):  # unshuffled: the very same batches
        for (a, la), (b, lb) in zip(
            getattr(device, f"{split}_dataloader")(),
            getattr(plain, f"{split}_dataloader")(),
            strict=True,
        ):
            assert torch.equal(a, b) and torch.equal(la, lb)
    train = torch.cat([labels for _, labels in device.train_dataloader()])
    assert len(train) == len(device.datasets["train"]) // 32 * 32
    assert next(iter(device.train_dataloader()))[0].device.type == "cpu"  # no trainer: the CPU
    five, labels = device.arrays("val", limit=5)
    assert five.shape == (5, 1, 28, 28)
    odd, odd_labels = device.arrays("val", limit=5, shard=(1, 2))  # a DDP rank's part
    assert torch.equal(odd, five[1::2]) and torch.equal(odd_labels, labels[1::2])


def test_loader_choice_is_checked(tmp_path):
    with pytest.raises(ConfigError, match=r"'device' .*'dataloader' .*'auto', got 'gpu'"):
        make_dm(loader="gpu")
    write_png_folder(tmp_path)
    files = ImageFolder(str(tmp_path), size=28, channels=1, cache=False)
    folder = make_dm(source=files, num_classes=3)
    with pytest.raises(ConfigError, match=r"set data\.loader=dataloader"):
        folder.setup()


@pytest.mark.parametrize("option", sorted(p.stem for p in (REPO / "conf" / "data").glob("*.yaml")))
def test_in_memory_sources_default_to_the_device_loader(tmp_path, option):
    data = make_cfg(tmp_path, [f"data={option}"]).data
    file_backed = data.source._target_ in ("litlab.data.ImageFolder", "litlab.data.Streaming")
    # auto: the device loader once a folder is cached, LitData's loader for streams
    assert data.loader == ("auto" if file_backed else "device")


def test_stratified_subsets_follow_the_class_proportions_at_random():
    labels = torch.arange(10).repeat_interleave(100)  # sorted by class, as splits are stored
    picks = stratified_indices(labels, 50, seed=1)
    assert len(picks) == 50 and len(set(picks.tolist())) == 50
    assert labels[picks].bincount(minlength=10).tolist() == [5] * 10  # not the first classes
    assert not torch.equal(picks, stratified_indices(labels, 50, seed=2))
    assert torch.equal(picks, stratified_indices(labels, 50, seed=1))
    assert torch.equal(stratified_indices(labels, 5000), torch.arange(1000))


def test_train_fraction_trains_on_a_stratified_part_and_keeps_the_rest():
    dm = make_dm(train_fraction=0.1)
    dm.setup()
    fit, train = dm.arrays("fit")[1], dm.arrays("train")[1]
    assert len(fit) == round(0.1 * len(train))
    assert (fit.bincount(minlength=10) > 0).all()  # every class
    assert len(dm.train_dataloader()) == len(fit) // 32


def test_unusual_images_are_converted_and_damaged_ones_skipped_and_counted(tmp_path):
    write_png_folder(tmp_path / "images", per_class=4)
    unreadable = write_unusual_images(tmp_path / "images" / "cat")
    sixteen = np.full((8, 8), 65535, dtype=np.uint16)  # white, in 16 bits
    assert load_image_from(tmp_path, sixteen).min() == 255
    # One scale for every file of a mode: a dark 16-bit image stays dark (its values were once
    # taken as 8-bit ones when none was above 255), a float one in [0, 1] is not black.
    assert load_image_from(tmp_path, np.full((8, 8), 200 * 257, dtype=np.uint16)).min() == 200
    assert load_image_from(tmp_path, np.full((8, 8), 200, dtype=np.uint16)).max() == 1
    from PIL import Image

    Image.fromarray(np.full((8, 8), 0.5, dtype=np.float32)).save(tmp_path / "float.tiff")
    assert load_image(tmp_path / "float.tiff", 8, 1).min() == 128
    for name, channels in (("cmyk.jpg", 3), ("rgba.png", 3), ("grayscale.jpg", 3), ("huge.jpg", 1)):
        image = load_image(tmp_path / "images" / "cat" / name, 20, channels)
        assert image.shape == (channels, 20, 20) and image.dtype == np.uint8, name
    source = ImageFolder(str(tmp_path / "images"), size=20, cache_dir=str(tmp_path / "cache"))
    whole = source.load("train")
    report = source.report["all"]
    assert report["skipped"] == len(unreadable) == 3
    assert sorted(Path(f["file"]).name for f in report["skipped_files"]) == sorted(unreadable)
    assert report["images"] == 12 + 5 and len(whole) + len(source.load("test")) == 17


def test_links_are_read_once_hidden_files_left_out_and_a_broken_link_skipped(
    tmp_path, capsys, caplog
):
    """A link back up the tree was followed 40 levels deep (one image 40 times, in train and
    test alike); hidden files (.ipynb_checkpoints, macOS's ._name) were read as images; a broken
    link ended the cached run with a traceback (the check said a run skips it). What is not read
    (no image suffix; an image beside the class folders) is said by the check and in the run's
    log (the run said nothing)."""
    from litlab.data.check import main
    from litlab.data.folder_index import scan

    root = tmp_path / "images"
    write_png_folder(root, per_class=4)
    (root / "cat" / "gone.png").symlink_to(tmp_path / "nowhere.png")
    (root / "cat" / "again").symlink_to(".")
    write_png_folder(tmp_path / "elsewhere", classes=("dogs",), per_class=4)
    (root / "dog" / "more").symlink_to(tmp_path / "elsewhere" / "dogs")  # a folder linked in
    # an image under a second name (split by its name: in train and test), an image outside
    # linked in twice: each read once
    (root / "cat" / "alias.png").symlink_to(root / "cat" / "0.png")
    (root / "dog" / "x.png").symlink_to(tmp_path / "elsewhere" / "dogs" / "0.png")
    shutil.copy(root / "cat" / "1.png", tmp_path / "outside.png")
    (root / "cat" / "out1.png").symlink_to(tmp_path / "outside.png")
    (root / "cat" / "out2.png").symlink_to(tmp_path / "outside.png")
    (root / "cat" / ".ipynb_checkpoints").mkdir()
    shutil.copy(root / "cat" / "0.png", root / "cat" / ".ipynb_checkpoints" / "0-checkpoint.png")
    (root / "cat" / "._0.png").write_bytes(b"\0\5\26\7 AppleDouble")
    (root / "__MACOSX" / "cat").mkdir(parents=True)  # a zip made on a Mac: not a class
    (root / "__MACOSX" / "cat" / "._0.png").write_bytes(b"\0\5\26\7 AppleDouble")
    (root / "dog" / "notes.txt").write_text("not an image")
    shutil.copy(root / "cat" / "0.png", root / "loose.png")
    index = scan(root)
    assert index.files.count("cat/0.png") == 1 and len(index.files) == 18
    assert "cat/out1.png" in index.files and not {
        "cat/alias.png",
        "cat/out2.png",
        "dog/x.png",
    } & set(index.files)
    assert sorted(f for f in index.files if "/" in f[4:]) == [f"dog/more/{i}.png" for i in range(4)]
    assert index.ignored == ["dog/notes.txt"] and index.outside == ["loose.png"]
    source = ImageFolder(str(root), size=16, cache_dir=str(tmp_path / "cache"), workers=1)
    with caplog.at_level(logging.WARNING, logger="litlab"):
        source.load("train")
    (said,) = [r.getMessage() for r in caplog.records if "not read: " in r.getMessage()]
    assert "1 .txt (no image suffix" in said and "1 image(s) beside the class folders" in said
    assert source.report["all"]["skipped"] == 1
    assert source.report["all"]["skipped_files"][0]["file"] == "cat/gone.png"
    assert main([str(root), "--workers", "1", "--size", "16", "--batch-size", "2"]) == 1
    out = capsys.readouterr().out
    assert f"unreadable\t{root / 'cat' / 'gone.png'}\tFileNotFoundError" in out
    assert "not read: 1 .txt (no image suffix" in out and "(e.g. loose.png)" in out


def test_the_folders_a_nas_or_a_drive_writes_are_not_classes_nor_images(tmp_path, caplog):
    """A folder copied from a Synology NAS holds @eaDir/<image>/SYNOPHOTO_THUMB_*.jpg beside every
    image (its thumbnails, at other sizes): they were trained on as the class's images and drawn
    into validation and test too (near-copies the byte check cannot catch), and a @eaDir or
    #recycle folder at the top was a class. Left out, as __MACOSX is; not named as unread."""
    from PIL import Image

    from litlab.data.folder_index import scan, split_folders

    root = tmp_path / "nas"
    write_png_folder(root / "train", classes=("cat", "dog"), per_class=3)
    write_png_folder(root / "test", classes=("cat", "dog"), per_class=2)
    for image in sorted(root.glob("*/*/*.png")):
        thumbs = image.parent / "@eaDir" / image.name
        thumbs.mkdir(parents=True)
        for size in ("S", "M"):
            Image.open(image).save(thumbs / f"SYNOPHOTO_THUMB_{size}.jpg")
    for top in (root, root / "train"):
        (top / "@eaDir" / "train").mkdir(parents=True)
        for bin_ in ("#recycle", "@Recycle", "$Recycle.Bin"):  # Synology's, QNAP's, Windows'
            (top / bin_ / "cat").mkdir(parents=True)
            shutil.copy(root / "train" / "cat" / "0.png", top / bin_ / "cat" / "old.png")
    index = scan(root / "train")
    assert index.classes == ["cat", "dog"]
    assert index.files == [f"{c}/{i}.png" for c in ("cat", "dog") for i in range(3)]
    assert index.ignored == [] and index.outside == []
    assert set(split_folders(root)) == {"train", "test"}
    source = ImageFolder(str(root), size=16, cache_dir=str(tmp_path / "cache"), workers=1)
    with caplog.at_level(logging.WARNING, logger="litlab"):
        source.prepare()
        assert len(source.load("train")) == 6 and len(source.load("test")) == 4
    assert not [r for r in caplog.records if "not read" in r.getMessage()]
    # a run begun before they were left out trained on them: its resume= is refused, saying
    # why (review 159: "put the folder back as it was", the folder unchanged)
    with pytest.raises(DataError, match=r"it holds .*@eaDir.*: folders a NAS or a drive writes"):
        source.check_files({"v": 1, "key": "the files with the thumbnails", "files": 30})
    with pytest.raises(DataError) as refusal:  # a file added since: the folder's own change
        source.check_files({"v": 1, "key": "the files before one was added", "files": 5})
    assert "it holds" not in str(refusal.value)


def test_a_folder_linked_into_two_classes_or_two_splits_is_refused(tmp_path, capsys):
    """A class folder linked into the test split (test/cat -> train/cat) put training images in
    the test (test/acc 1.0), and one folder linked in as a second class (kitty -> cat) gave its
    images two labels: both silently. Refused in one line, by the run and by the check."""
    from litlab.data.check import main
    from litlab.data.folder_index import scan

    split = tmp_path / "split"
    write_png_folder(split / "train", classes=("cat", "dog"), per_class=4)
    write_png_folder(split / "test", classes=("dog",), per_class=2)
    (split / "test" / "cat").symlink_to(split / "train" / "cat")
    source = ImageFolder(str(split), size=16, cache_dir=str(tmp_path / "cache"), workers=1)
    with pytest.raises(DataError, match="would measure images trained on"):
        source.prepare()
    assert main([str(split), "--workers", "1", "--size", "16", "--batch-size", "2"]) == 2
    assert "would measure images trained on" in capsys.readouterr().out

    classes = tmp_path / "classes"
    write_png_folder(classes, per_class=4)
    (classes / "kitty").symlink_to(classes / "cat")
    with pytest.raises(DataError, match="would carry two labels"):
        scan(classes)
    (classes / "kitty").unlink()
    (classes / "dog" / "cats").symlink_to(classes / "cat")  # linked inside another class
    with pytest.raises(DataError, match="of class 'cat' too"):
        scan(classes)
    (classes / "dog" / "cats").unlink()
    (classes / "dog" / "puss.png").symlink_to(classes / "cat" / "0.png")  # an image, not a folder
    with pytest.raises(DataError, match=r"puss\.png is an image of class 'cat' too"):
        scan(classes)


def test_class_names_that_differ_only_in_their_encoding_are_said_to(tmp_path):
    """A class folder written on a Mac (NFD: "e" and an accent) beside one written elsewhere
    (NFC: one letter) looks the same in the message that refuses them: it says why."""
    import unicodedata

    split = tmp_path / "split"
    write_png_folder(split / "train", classes=("café", "dog"), per_class=4)
    write_png_folder(
        split / "test", classes=(unicodedata.normalize("NFD", "café"), "dog"), per_class=2
    )
    source = ImageFolder(str(split), size=16, cache_dir=str(tmp_path / "cache"), workers=1)
    with pytest.raises(DataError, match="differ only in how accented letters are encoded"):
        source.prepare()
    # eval.py on a folder of some of the model's classes, one copied through a Mac (it said
    # ['café'] is not among ['café', 'dog', 'fox'] alone: walkthrough 139)
    some = tmp_path / "some"
    write_png_folder(some, classes=(unicodedata.normalize("NFD", "café"),), per_class=2)
    known = ["café", "dog", "fox"]
    source = ImageFolder(str(some), size=16, cache_dir=str(tmp_path / "c"), classes=known)
    with pytest.raises(DataError, match=r"not among the model's classes .* differ only in how"):
        source.load("test")
    # or spelled in other case (walkthrough 157: Anemone/ refused for anemone, no hint)
    cased = tmp_path / "cased"
    write_png_folder(cased, classes=("Café",), per_class=2)
    source = ImageFolder(str(cased), size=16, cache_dir=str(tmp_path / "c"), classes=known)
    with pytest.raises(DataError, match=r"not among .* differ only in upper and lower case"):
        source.load("test")
    both = tmp_path / "both"  # in case and in encoding (review 161: "only in case" said)
    write_png_folder(both, classes=(unicodedata.normalize("NFD", "Café"),), per_class=2)
    source = ImageFolder(str(both), size=16, cache_dir=str(tmp_path / "c"), classes=known)
    with pytest.raises(DataError, match=r"in upper and lower case and in how accented letters"):
        source.load("test")
    split = tmp_path / "cased_split"
    write_png_folder(split / "train", classes=("cat", "dog"), per_class=4)
    write_png_folder(split / "test", classes=("Cat", "dog"), per_class=2)
    source = ImageFolder(str(split), size=16, cache_dir=str(tmp_path / "cache"), workers=1)
    with pytest.raises(DataError, match="differ only in upper and lower case"):
        source.prepare()


def test_a_test_folder_beside_class_folders_is_said_to_be_taken_as_a_class(
    tmp_path, capsys, caplog
):
    """root/{a,b,c,test/a}: without train/ beside it, test/ is a fourth class; the check told
    the user to set data.num_classes=4, and a run so set trained a class named test without a
    word (walkthrough 139). Both say it is named like a split."""
    from litlab.data.check import main

    write_png_folder(tmp_path / "images", classes=("a", "b", "c"), per_class=4)
    write_png_folder(tmp_path / "images" / "test", classes=("a",), per_class=2)
    source = ImageFolder(str(tmp_path / "images"), size=16, cache_dir=str(tmp_path / "c"))
    with caplog.at_level("WARNING", logger="litlab"):
        source.load("train")  # (first: said once a process, as the check would say it)
    assert "test/ named like a split, taken as class folder(s) of the 4" in caplog.text
    status = main([str(tmp_path / "images"), "--workers", "1", "--num-classes", "3"])
    out = capsys.readouterr().out
    assert status == 2
    assert "set data.num_classes=4 (or move test/ out: named like a split)" in out


def test_the_check_says_what_a_run_would_refuse_and_prints_names_as_they_are(tmp_path, capsys):
    """The check's exit status was 0 ("every file is readable") for folders a run refuses, and
    rich's markup ate or choked on file names with brackets."""
    from litlab.data.check import main

    def check(root: Path, *options: str) -> tuple[int, str]:
        status = main([str(root), "--workers", "1", "--size", "16", "--batch-size", "2", *options])
        return status, capsys.readouterr().out

    good = tmp_path / "good"
    write_png_folder(good, per_class=6)
    status, out = check(good)
    assert status == 0 and out.endswith("every file is readable\n")
    # the images each split holds, as a run splits them: 18 = train + val + test
    (line,) = [x for x in out.splitlines() if x.startswith("readable images a run holds: ")]
    sizes = dict(part.split() for part in line.split(": ")[1].split(", "))
    assert list(sizes) == ["train", "val", "test"] and sum(map(int, sizes.values())) == 18
    source = ImageFolder(str(good), size=16, cache_dir=str(tmp_path / "cache"), workers=1)
    assert int(sizes["test"]) == len(source.load("test"))
    # --train-fraction: train counts what a run with data.train_fraction trains on (its
    # summary.json splits.train; the check printed the whole training split)
    status, out = check(good, "--train-fraction", "0.5")
    (line,) = [x for x in out.splitlines() if x.startswith("readable images a run holds: ")]
    part = dict(p.split() for p in line.split(": ")[1].split(", "))
    dm = DataModule(source, [3, 16, 16], 3, [0.5], [0.25], batch_size=2, train_fraction=0.5)
    dm.setup("fit")
    assert int(part["train"]) == len(dm.datasets["fit"]) < int(sizes["train"])
    assert part["val"] == sizes["val"]
    # a training split smaller than a batch: the run refuses it (drop_last leaves no batch)
    status, out = main([str(good), "--workers", "1", "--size", "16"]), capsys.readouterr().out
    assert status == 2 and f"batch_size 128 exceeds the {sizes['train']} training images" in out
    half = int(sizes["train"]) // 2  # each process's share, as the run counts it
    status, out = check(good, "--batch-size", str(half + 1), "--processes", "2")
    assert status == 2 and f"exceeds the {half} training images of each of the 2 processes" in out
    status, out = check(good, "--num-classes", "10")
    assert status == 2 and "refused: 3 class folders but --num-classes 10" in out
    mismatched = tmp_path / "mismatched"
    write_png_folder(mismatched / "train", per_class=4)
    write_png_folder(mismatched / "test", classes=("cat", "dog"), per_class=2)
    status, out = check(mismatched)
    assert status == 2 and "different class folders" in out
    (good / "emu").mkdir()  # an empty class folder
    status, out = check(good)
    assert status == 2 and "['emu']" in out and "hold no image file" in out  # (walkthrough 150)
    assert f"readable images a run holds: train {sizes['train']}, " in out  # (was left out)
    status, out = check(write_folder_losing_a_class_to_validation(tmp_path))
    assert status == 2 and "['fox']" in out  # its one training image held out for validation
    brackets = tmp_path / "brackets"
    write_png_folder(brackets, classes=("a", "b["), per_class=4)
    for name in ("photo [edited].png", "x].png"):
        (brackets / "b[" / name).write_bytes(b"not an image")
    status, out = check(brackets)
    assert status == 1
    assert f"unreadable\t{brackets / 'b[' / 'photo [edited].png'}\t" in out
    assert f"unreadable\t{brackets / 'b[' / 'x].png'}\t" in out
    for bad in (["--size", "0"], ["--workers", "0"], ["--channels", "2"], ["--batch-size", "0"]):
        with pytest.raises(SystemExit) as stop:
            main([str(good), *bad])
        assert stop.value.code == 2, bad


def load_image_from(tmp_path, pixels: np.ndarray) -> np.ndarray:
    from PIL import Image

    path = tmp_path / "probe.png"
    Image.fromarray(pixels).save(path)  # uint16: mode I;16
    return load_image(path, 8, 1)


def test_the_cache_is_built_once_and_again_when_a_file_changes(tmp_path, caplog):
    """Also for a copy of the folder under another name made with its times (cp -a: the same
    files, names, sizes and times; built again before, README said reused); a new build says
    the earlier state's cache stays (each as large as the new one)."""
    write_png_folder(tmp_path / "images", per_class=3)
    first = cached_folder(tmp_path / "images", 16, 3, tmp_path / "cache")
    again = cached_folder(tmp_path / "images", 16, 3, tmp_path / "cache")
    assert again.path == first.path and torch.equal(first.images, again.images)
    assert first.images.shape == (9, 3, 16, 16)
    shutil.copytree(tmp_path / "images", tmp_path / "copied")  # copy2: with the files' times
    copied = cached_folder(tmp_path / "copied", 16, 3, tmp_path / "cache")
    assert copied.path == first.path and torch.equal(copied.images, first.images)
    from PIL import Image

    red = Image.new("RGB", (30, 30), "red")  # stored uncompressed: any colour, one size
    red.save(tmp_path / "images" / "cat" / "0.png", compress_level=0)
    with caplog.at_level(logging.WARNING, logger="litlab"):
        changed = cached_folder(tmp_path / "images", 16, 3, tmp_path / "cache")
    assert changed.path != first.path and changed.images[0, 0].float().mean() > 250  # red
    assert len(list((tmp_path / "cache").iterdir())) == 2  # no half-built folder left
    said = f"1 cache(s) of {tmp_path / 'images'} from before its files changed stay in"
    assert said in caplog.text and first.path.name in caplog.text
    # a gray build of the same files: the colour caches are not of an earlier state of them
    # (they were named to be deleted: walkthrough 139)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="litlab"):
        gray = cached_folder(tmp_path / "images", 16, 1, tmp_path / "cache")
    assert gray.images.shape[1] == 1 and "from before its files changed" not in caplog.text
    # another folder of that name (train/ of two datasets) is not this one's earlier state,
    # nor a copy: its bytes differ where its names, sizes and times agree
    other = tmp_path / "other" / "images"
    shutil.copytree(tmp_path / "images", other)
    Image.new("RGB", (30, 30), "blue").save(other / "cat" / "0.png", compress_level=0)
    then = (tmp_path / "images" / "cat" / "0.png").stat()
    assert (other / "cat" / "0.png").stat().st_size == then.st_size
    os.utime(other / "cat" / "0.png", ns=(then.st_atime_ns, then.st_mtime_ns))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="litlab"):
        copied_blue = cached_folder(other, 16, 3, tmp_path / "cache")
    assert copied_blue.path != changed.path and copied_blue.images[0, 2].float().mean() > 250
    assert "from before its files changed" not in caplog.text


@pytest.mark.parametrize("loader", ["device", "dataloader"])
def test_overfit_batches_are_a_sample_of_the_classes_the_same_every_epoch(
    tmp_path, monkeypatch, loader
):
    """trainer.overfit_batches reads its batches unshuffled: an image folder's first stored
    images, all of its first class, so that a constant label "overfit" them (debug=overfit
    passed for a model that learns nothing; a review). Now a seeded sample of the split, the
    same batches every epoch."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # helpers.RecordImages
    write_png_folder(tmp_path / "images", per_class=16)
    train_on_folder(
        tmp_path,
        "data.batch_size=8",
        "trainer.max_epochs=2",
        "+trainer.overfit_batches=2",
        "model.scheduler=null",  # 4 steps: too few for the one-cycle warm-up
        f"data.loader={loader}",
        "+callbacks.seen._target_=helpers.RecordImages",
        f"+callbacks.seen.folder={tmp_path / 'seen'}",
    )
    seen = json.loads((tmp_path / "seen" / "rank0.json").read_text())
    first = [label for batch in seen["labels0"] for label in batch]
    assert len(first) == 16 and seen["labels1"] == seen["labels0"]
    assert len(set(first)) == 3, first


@pytest.mark.parametrize("cache", [True, False])
def test_a_run_scans_each_split_folder_once(tmp_path, monkeypatch, cache):
    """Lightning calls prepare_data and setup for fit and again for test; scanning a folder
    stats every file (a million files: tens of seconds), so a run scans each of its folders
    once. A copy sent to other processes (ddp_spawn) opens them afresh."""
    import pickle

    import litlab.data.folder as folder

    write_png_folder(tmp_path / "images" / "train", per_class=12)
    write_png_folder(tmp_path / "images" / "test", per_class=3)
    scanned: Counter[str] = Counter()
    real_scan = folder.scan

    def counting_scan(root: Path) -> folder.FolderIndex:
        scanned[Path(root).name] += 1
        return real_scan(root)

    monkeypatch.setattr(folder, "scan", counting_scan)
    summary = train_on_folder(
        tmp_path, f"data.source.cache={cache}", "data.batch_size=8", "trainer.max_epochs=1"
    )
    assert "test/acc" in summary["metrics"]
    assert scanned == {"train": 1, "test": 1}

    source = ImageFolder(
        str(tmp_path / "images"), size=20, cache=cache, cache_dir=str(tmp_path / "cache")
    )
    assert len(source.load("train")) == 36
    copy = pickle.loads(pickle.dumps(source))
    assert not copy._opened and len(copy.load("test")) == 9


def test_a_folder_s_test_split_is_decoded_at_the_test_not_before_training(tmp_path, capsys):
    """A fit reads the training and validation splits only: the test folder's decode (a third
    of a first run's decode on Fashion-MNIST's layout) waits for the test, and a fit alone never
    makes it. Its class folders are still checked before the first step."""
    write_png_folder(tmp_path / "images" / "train", per_class=12)
    write_png_folder(tmp_path / "images" / "test", per_class=3)

    def caches() -> list[str]:  # folder-<split>-<size>px-<key>
        return sorted(p.name.split("-")[1] for p in (tmp_path / "cache").iterdir())

    run = ["data.batch_size=8", "trainer.max_epochs=1"]
    summary = train_on_folder(tmp_path, *run, "test=false")
    assert caches() == ["train"]
    assert set(summary["data"]["splits"]) == {"train", "val"}
    shutil.rmtree(tmp_path / "run")
    summary = train_on_folder(tmp_path, *run)
    assert caches() == ["test", "train"]
    assert summary["data"]["splits"]["test"] == 9 and "test/acc" in summary["metrics"]

    shutil.rmtree(tmp_path / "run")
    (tmp_path / "images" / "test" / "fox").rename(tmp_path / "images" / "test" / "owl")
    with pytest.raises(SystemExit):  # litlab: error: ... different class folders ...
        train_on_folder(tmp_path, *run)
    assert "different class folders" in capsys.readouterr().err
    assert not list((tmp_path / "run").rglob("*.ckpt"))  # refused before training


def test_a_fit_with_fid_decodes_the_test_folder_once_before_its_ranks_load(tmp_path):
    """FID reads the test split in the fit (its N and floor): the fit's prepare_data (one
    process a node, before the others load) decodes it then, not every rank at its first FID."""
    import lightning as L
    from lightning.pytorch.trainer.states import TrainerFn

    from litlab.callbacks.gan import FID

    write_png_folder(tmp_path / "images" / "train", per_class=4)
    write_png_folder(tmp_path / "images" / "test", per_class=2)
    for callbacks, decoded in (([], ["train"]), ([FID()], ["test", "train"])):
        cache = tmp_path / f"cache{len(callbacks)}"
        source = ImageFolder(str(tmp_path / "images"), size=20, cache_dir=str(cache))
        datamodule = DataModule(source, [3, 16, 16], 3, mean=[0.5], std=[0.5], batch_size=4)
        trainer = L.Trainer(callbacks=callbacks, logger=False, enable_progress_bar=False)
        trainer.state.fn = TrainerFn.FITTING
        datamodule.trainer = trainer
        datamodule.prepare_data()
        assert sorted(p.name.split("-")[1] for p in cache.iterdir()) == decoded


def test_random_resized_crops_are_drawn_per_image_and_evaluation_is_the_centre():
    boxes = crop_boxes(64, 40, 40, (0.35, 1.0))
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]) / 1600
    assert areas.min() >= 0.35 * 0.95 and areas.max() <= 1.0  # sides rounded to whole pixels
    assert len({tuple(b) for b in boxes.tolist()}) > 56  # one draw per image, not one per batch
    assert (boxes[:, :2] >= 0).all() and (boxes[:, 2:] <= 40).all()
    assert torch.equal(boxes, boxes.round())
    images = torch.arange(40.0).repeat(2, 3, 40, 1).to(torch.uint8)  # a horizontal ramp
    transform = BatchTransform([0.0], [1 / 255], size=(32, 32), crop_scale=(0.35, 1.0))
    evaluated = transform(images, train=False)
    assert evaluated.shape == (2, 3, 32, 32) and torch.equal(evaluated[0], evaluated[1])
    assert transform(images, train=True).shape == (2, 3, 32, 32)
    centre = BatchTransform([0.0], [1 / 255], size=(32, 32), eval_crop=0.875)(images, False)
    assert abs(float(centre[0, 0, 0, 0]) - 2.5) < 1.0  # the crop starts 2.5 px in


def test_cpu_crops_match_the_accelerators_roi_align_crops():
    """The CPU resizes each crop with torch's uint8 kernel, accelerators with roi_align: the
    same boxes must give the same pictures (wrong axes or offsets would not)."""
    y, x = torch.meshgrid(torch.arange(48.0), torch.arange(64.0), indexing="ij")
    smooth = torch.stack([x * 3, y * 4, 128 + 60 * torch.sin(x / 9) * torch.cos(y / 7)])
    images = smooth.clamp(0, 255).to(torch.uint8).repeat(3, 1, 1, 1)
    boxes = torch.tensor([[0.0, 0.0, 64.0, 48.0], [8.0, 4.0, 40.0, 44.0], [20.0, 10.0, 60.0, 30.0]])
    threads = torch.get_num_threads()
    cpu, roi = resized_crops(images, boxes, (24, 24)), roi_crops(images, boxes, (24, 24))
    assert torch.get_num_threads() == threads  # the CPU loop's single thread is given back
    assert cpu.dtype == torch.uint8 and cpu.shape == roi.shape == (3, 3, 24, 24)
    assert (cpu - roi).abs().mean() < 1.0, (cpu - roi).abs().mean(dim=(1, 2, 3))


@pytest.mark.parametrize(("height", "width"), [(40, 40), (256, 384), (300, 120), (40, 200)])
@pytest.mark.parametrize("scale", [(0.08, 1.0), (0.35, 1.0)])
def test_random_resized_crops_are_distributed_as_torchvisions(height, width, scale):
    """The areas, aspects and positions of torchvision's RandomResizedCrop.get_params (retried
    draws, whole pixels, the centred fallback: a 40 x 200 image rarely fits a draw at 0.35)."""
    from torchvision.transforms import RandomResizedCrop

    n = 6000
    ours = crop_boxes(n, height, width, scale, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    image = torch.zeros(1, height, width)
    params = [RandomResizedCrop.get_params(image, scale, (3 / 4, 4 / 3)) for _ in range(n)]
    top, left, h, w = torch.tensor(params, dtype=torch.float).T
    theirs = torch.stack([left, top, left + w, top + h], dim=1)

    def stats(boxes):
        w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
        centre_x = (boxes[:, 0] + boxes[:, 2]) / 2 / width
        return torch.stack([w * h / (height * width), (w / h).log(), centre_x]).mean(dim=1)

    # standard errors of these means at n = 6000: about 0.003 (area), 0.002 (log aspect)
    assert torch.allclose(stats(ours), stats(theirs), atol=0.012), (stats(ours), stats(theirs))
    assert ours[:, 0].min() >= 0 and ours[:, 2].max() <= width and ours[:, 3].max() <= height


def test_evaluation_crops_whole_pixels_on_every_device():
    """The centre crop's box is in whole pixels: roi_align (accelerators) at 1:1 gives the
    crop's pixels themselves, as the CPU does (folder_resnet50: 0.91 of 176 is 160.16 px)."""
    images = torch.randint(0, 256, (2, 3, 176, 176), dtype=torch.uint8)
    boxes = centre_boxes(2, 176, 176, 0.91, images.device)
    assert torch.equal(boxes[0], torch.tensor([8.0, 8.0, 168.0, 168.0]))
    centre = images[:, :, 8:168, 8:168]
    assert torch.equal(resized_crops(images, boxes, (160, 160)), centre)
    assert torch.equal(roi_crops(images, boxes, (160, 160)).round().byte(), centre)
    for h, w, fraction in [(100, 101, 0.875), (97, 130, 0.9), (36, 36, 0.875), (74, 74, 0.875)]:
        x1, y1, x2, y2 = centre_boxes(1, h, w, fraction, images.device)[0].tolist()
        assert x2 - x1 == y2 - y1 == round(min(h, w) * fraction)  # square, whole pixels


def train_on_folder(tmp_path: Path, *overrides: str) -> dict:
    """A small classifier trained on tmp_path/images (3 classes at 20 px); its summary."""
    cfg = make_cfg(
        tmp_path,
        [
            "data=image_folder",
            f"data.source.root={tmp_path / 'images'}",
            f"data.source.cache_dir={tmp_path / 'cache'}",
            "data.source.size=20",
            "data.image_shape=[3,16,16]",
            "data.num_classes=3",
            "data.num_workers=0",
            "model.net.width=8",
            "logger=csv",
            "extras.print_config=false",
            "callbacks.progress_bar=null",
            *overrides,
        ],
    )
    train_task(cfg)
    summary = summary_of(cfg)
    assert summary["status"] == "completed"
    return summary


def test_a_root_of_one_class_or_a_file_says_what_it_is(tmp_path, capsys):
    """A root that is a class folder itself (its one subfolder read as the only class) was told
    to set data.num_classes=1, which a classifier then refused; a root that is a file was said
    not to exist (review 171)."""
    write_png_folder(tmp_path / "images" / "cat", per_class=6)  # images/cat/{cat,dog,fox}/

    def folder_run(root: Path):
        return make_cfg(
            tmp_path,
            ["data=image_folder", f"data.source.root={root}", "data.num_classes=3", *QUIET_CSV],
        )

    refused(capsys, train_task, folder_run(tmp_path / "images"), "a classifier needs two classes")
    image = next((tmp_path / "images" / "cat" / "cat").iterdir())
    refused(capsys, train_task, folder_run(image), "is a file, not a folder")


@pytest.mark.parametrize(
    ("cache", "decode"), [(True, "workers"), (False, "workers"), (False, "device")]
)
def test_a_folder_with_damaged_files_trains_to_the_end(tmp_path, cache, decode):
    write_png_folder(tmp_path / "images", per_class=12)
    write_unusual_images(tmp_path / "images" / "dog")
    summary = train_on_folder(
        tmp_path,
        f"data.source.cache={cache}",
        f"data.source.decode={decode}",  # device: JPEGs decoded a batch at a time here
        "data.batch_size=8",
        "trainer.max_epochs=2",
    )
    assert "test/acc" in summary["metrics"]
    # 44 files, 3 unreadable: what each split held, images, cached or read as they go (the files
    # less those found unreadable; was 44: the report put the two runs on different scales)
    assert sum(summary["data"]["splits"].values()) == 41
    assert summary["data"]["splits"].keys() == {"train", "val", "test"}
    # and class by class, images alone (review 171: the unreadable files counted there)
    classes = summary["data"]["class_images"]
    assert {split: sum(counts.values()) for split, counts in classes.items()} == summary["data"][
        "splits"
    ]
    if cache:
        assert summary["data"]["all"]["skipped"] == 3
    else:  # seen as they are read (every epoch, and evaluation): each file counted once
        assert summary["data"]["skipped_while_loading"] == 3


def test_batches_whose_every_file_is_unreadable_are_skipped(tmp_path):
    """Read as it goes (cache=false), a batch can lose every image: one process skips that
    training step, an evaluation batch counts for nothing (no NaN loss, no crash on it)."""
    write_png_folder(tmp_path / "images", per_class=3)
    for i in range(30):  # most of the files: many 2-file batches hold no readable image
        (tmp_path / "images" / "fox" / f"broken{i}.png").write_bytes(b"not an image")
    summary = train_on_folder(
        tmp_path,
        "data.source.cache=false",
        "data.batch_size=2",
        "data.eval_batch_size=2",
        "trainer.max_epochs=1",
    )
    assert all(math.isfinite(summary["metrics"][k]) for k in ("val/loss", "test/loss"))
    # each broken file once, as it was read (drop_last leaves one training file of the epoch
    # unread; counted per read, 31 and more before)
    assert summary["data"]["skipped_while_loading"] in (29, 30)


def test_a_class_whose_every_file_is_unreadable_is_said_to(tmp_path, caplog):
    """Read as it goes (cache=false), a class of files that do not decode (photos renamed from
    .heic to .jpg) trained as if it were not there, in silence; cached, it is refused. Each
    unreadable file is said once a run, with its path and PIL's reason (the loader's worker
    processes, new every epoch, said it at every read, the reason naming a BytesIO)."""
    write_png_folder(tmp_path / "images", per_class=6)
    for png in (tmp_path / "images" / "fox").iterdir():
        png.write_bytes(b"not an image")
    with caplog.at_level(logging.WARNING, logger="litlab"):
        summary = train_on_folder(
            tmp_path,
            "data.source.cache=false",
            "data.batch_size=1",
            "trainer.max_epochs=2",
            "data.num_workers=1",
        )
    assert summary["data"]["classes_never_read"] == ["fox"]
    assert any(
        "['fox']: every training file was unreadable" in r.getMessage() for r in caplog.records
    )
    said = Counter(
        r.getMessage().split()[3]
        for r in caplog.records
        if r.getMessage().startswith("skipped unreadable image")
    )
    fox = tmp_path / "images" / "fox"
    assert sorted(said) == sorted(str(fox / f"{i}.png") for i in range(6))  # train, val, test
    assert set(said.values()) == {1}
    reasons = [r.getMessage() for r in caplog.records if "skipped unreadable" in r.getMessage()]
    assert all("UnidentifiedImageError: cannot identify image file" in m for m in reasons)
    assert not any("BytesIO" in m for m in reasons)


def test_two_builders_with_the_same_pid_never_share_a_build_folder(tmp_path, monkeypatch):
    """Containers that share a cache volume all run as pid 1. Two builds of one cache at once:
    B starts after A has decoded its first rows, and A publishes while B still decodes. In one
    shared build folder B wiped A's rows, and A published them black for every later run.
    Threads stand in for the decoding processes, so that the test can pace the two builders."""
    from concurrent.futures import ThreadPoolExecutor

    import litlab.data.folder_cache as folder

    root = tmp_path / "images"
    write_png_folder(root, per_class=30)  # 90 files: two chunks of rows (64 and 26)
    monkeypatch.setattr(os, "getpid", lambda: 1)
    monkeypatch.setattr(
        folder,
        "ProcessPoolExecutor",
        lambda n: ThreadPoolExecutor(n, thread_name_prefix=threading.current_thread().name),
    )
    a_wrote, b_opened, a_done = threading.Event(), threading.Event(), threading.Event()
    decode = folder._decode_into

    def paced(paths: list[str], start: int, target: str, shape: tuple[int, ...]):
        if threading.current_thread().name.startswith("A"):
            if start > 0:  # A's second chunk: once B has opened its build
                b_opened.wait(10)
            failed = decode(paths, start, target, shape)
            a_wrote.set()
            return failed
        b_opened.set()  # B has made its (empty) array and decodes once A has published
        a_done.wait(10)
        return decode(paths, start, target, shape)

    monkeypatch.setattr(folder, "_decode_into", paced)
    built: dict[str, object] = {}

    def build(name: str) -> None:
        try:
            built[name] = cached_folder(root, 16, 3, tmp_path / "cache", workers=1)
        except Exception as e:
            built[name] = e
        finally:
            if name == "A":
                a_done.set()

    a = threading.Thread(target=build, args=("A",), name="A")
    a.start()
    a_wrote.wait(10)
    b = threading.Thread(target=build, args=("B",), name="B")
    b.start()
    a.join(30)
    b.join(30)
    files = folder.scan(root).files
    expected = torch.stack([torch.from_numpy(load_image(root / f, 16, 3)) for f in files])
    for name in ("A", "B"):
        assert isinstance(built[name], folder.CachedFolder), built[name]
        assert torch.equal(built[name].images, expected), name
    later = cached_folder(root, 16, 3, tmp_path / "cache", workers=1)
    assert torch.equal(later.images, expected)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [later.path.name]  # none left


def test_train_beside_valid_or_validation_is_a_split_layout_and_unknown_splits_are_refused(
    tmp_path, caplog
):
    """Kaggle's and Keras' train/ beside validation/ (or valid/) was read as a folder of two
    classes named train and validation (and num_classes=2 advised); folders named like splits
    that litlab cannot pair are refused, while a class folder named train among others (a
    vehicle in CIFAR-100) is a class like any other."""
    from litlab.data.check import splits

    caplog.set_level("INFO", logger="litlab")
    for held_out in ("valid", "validation"):
        root = tmp_path / held_out
        write_png_folder(root / "train")
        write_png_folder(root / held_out, per_class=2)
        source = ImageFolder(str(root), size=16, cache_dir=str(tmp_path / "cache"), workers=1)
        dm = DataModule(source, [3, 16, 16], 3, [0.5], [0.25], batch_size=4, loader="auto")
        dm.setup()
        assert len(dm.datasets["train"]) + len(dm.datasets["val"]) == 18
        assert len(dm.datasets["test"]) == 6
        assert sorted(splits(root)) == ["test", "train"]  # as a run names them
    assert f"test split: {root / 'validation'} (no test/ beside train/)" in caplog.text
    for odd in (("train", "dev"), ("train",), ("Train", "Test")):
        root = tmp_path / "-".join(odd)
        for name in odd:
            write_png_folder(root / name, per_class=2)
        with pytest.raises(DataError, match="named like splits"):
            ImageFolder(str(root), size=16, cache_dir=str(tmp_path / "cache")).load("train")
        with pytest.raises(DataError, match="named like splits"):
            splits(root)
    # a held-out folder alone: where to point eval.py is said (walkthrough 160)
    heldout = tmp_path / "heldout"
    write_png_folder(heldout / "test", per_class=2)
    with pytest.raises(DataError, match=rf"alone, data\.source\.root={heldout / 'test'}$"):
        ImageFolder(str(heldout), size=16, cache_dir=str(tmp_path / "cache")).load("test")
    vehicles = tmp_path / "vehicles"
    write_png_folder(vehicles, classes=("bus", "car", "train"), per_class=4)
    whole = ImageFolder(str(vehicles), size=16, cache_dir=str(tmp_path / "cache"), workers=1)
    assert whole.load("train").classes == ["bus", "car", "train"]
    assert "named like a split" not in caplog.text  # (a test/ among classes is said to be)


def test_a_validation_folder_beside_train_and_test_is_the_validation_split(tmp_path):
    """train/, val/ (or valid/, validation/) and test/: validation is val/ itself and every file
    of train/ is trained on (val/ was ignored and validation carved out of train/), in the
    DataModule, the pre-flight check and the conversion for streaming alike."""
    from litlab.data.check import splits
    from litlab.data.folder_index import file_names
    from litlab.data.optimize import source_splits

    root = tmp_path / "images"
    write_png_folder(root / "train", per_class=10)
    write_png_folder(root / "validation", per_class=3)
    write_png_folder(root / "test", per_class=2)
    source = ImageFolder(str(root), size=16, cache_dir=str(tmp_path / "cache"), workers=1)
    dm = DataModule(source, [3, 16, 16], 3, [0.5], [0.25], batch_size=4, loader="auto")
    dm.setup()
    assert len(dm.datasets["train"]) == 30 and len(dm.datasets["test"]) == 6
    assert len(dm.datasets["val"]) == 9
    assert file_names(dm.datasets["val"]) == file_names(source.load("val"))
    # what a run says to get more validation images (data.val_fraction does not apply here)
    assert dm.more_validation == "add images to its validation folder"
    assert sorted(splits(root)) == ["test", "train", "val"]
    _, converted, _ = source_splits(root, 0.2, 0.1)
    assert {split: len(items) for split, items in converted.items()} == {
        "train": 30,
        "val": 9,
        "test": 6,
    }
    assert {Path(path).parent.parent.name for path, _, _ in converted["val"]} == {"validation"}


def test_a_conversion_says_what_it_leaves_out_as_a_run_does(tmp_path, capsys):
    """litlab.data.optimize said nothing of the files it does not convert (the check and a run
    say "not read: ..."): an image beside the class folders, a file without an image suffix."""
    from litlab.data.optimize import source_splits

    root = tmp_path / "images"
    write_png_folder(root, per_class=10)
    (root / "cat" / "notes.txt").write_text("not an image")
    (root / "stray.png").write_bytes(
        (root / "cat" / sorted(os.listdir(root / "cat"))[0]).read_bytes()
    )
    source_splits(root, 0.2, 0.1)
    said = capsys.readouterr().out
    assert f"{root}: not read: 1 .txt" in said
    assert "1 image(s) beside the class folders (e.g. stray.png)" in said


def test_a_class_without_training_images_is_refused_and_one_missing_from_the_test_warned(
    tmp_path, caplog
):
    """A class with no training image (an empty folder, or every file unreadable) can never be
    predicted: its test images would all count as errors. Refused in one line; a held-out split
    without a class is only a warning."""
    root = tmp_path / "images"
    write_png_folder(root / "train", per_class=4)
    write_png_folder(root / "test", per_class=2)

    def load(split: str, cache: bool = True):
        source = ImageFolder(
            str(root), size=16, cache=cache, cache_dir=str(tmp_path / "cache"), workers=1
        )
        return source.load(split)

    for f in (root / "train" / "fox").iterdir():
        f.write_bytes(b"not an image")
    with pytest.raises(DataError, match=r"\['fox'\] .*no readable image for training"):
        load("train")
    shutil.rmtree(root / "train" / "fox")
    (root / "train" / "fox").mkdir()
    for cache in (True, False):  # an empty folder: said to be empty (walkthrough 150)
        with pytest.raises(DataError, match=r"\['fox'\] .*hold no image file: every class"):
            load("train", cache)
    flat = tmp_path / "flat"
    write_png_folder(flat, classes=("cat", "dog"), per_class=4)
    (flat / "fox").mkdir()
    with pytest.raises(DataError, match=r"\['fox'\] .*hold no image file: every class"):
        ImageFolder(str(flat), size=16, cache_dir=str(tmp_path / "cache"), workers=1).load("train")
    write_png_folder(root / "train", per_class=4)
    shutil.rmtree(root / "test" / "fox")
    (root / "test" / "fox").mkdir()
    with caplog.at_level("WARNING", logger="litlab.data.folder"):
        assert len(load("test")) == 4
    assert "no image of class(es) ['fox']" in caplog.text


def test_a_class_without_validation_images_is_said_as_the_check_says_it(tmp_path, caplog):
    """The check warned that the validation share holds no image of a class; the run said
    nothing (val/* then measure the other classes alone). Eval.py validates nothing: silent."""
    write_png_folder(tmp_path / "images", per_class=12)  # cat/'s 12 names: none in validation
    options = {"size": 16, "cache_dir": str(tmp_path / "cache"), "workers": 1}
    for test_all, said in ((False, True), (True, False)):
        source = ImageFolder(str(tmp_path / "images"), test_all=test_all, **options)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="litlab"):
            source.validation_split(source.load("train"), 0.1, 0)
        assert ("validation split of" in caplog.text and "['cat']" in caplog.text) is said


@pytest.mark.parametrize("cache", [True, False])
def test_a_class_whose_training_files_all_fall_in_validation_is_refused(tmp_path, cache):
    """The validation share is carved from train/ file by file: a class of few files can lose
    them all to it, and would never be trained on (the check ran before the carve)."""
    root = write_folder_losing_a_class_to_validation(tmp_path)
    cfg = make_cfg(
        tmp_path,
        [
            "data=image_folder",
            f"data.source.root={root}",
            f"data.source.cache={cache}",
            f"data.source.cache_dir={tmp_path / 'cache'}",
            "data.source.size=16",
            "data.image_shape=[3,16,16]",
            "data.num_classes=3",
            "data.num_workers=0",
        ],
    )
    datamodule = build(cfg.data, "data")
    with pytest.raises(DataError, match=r"\[.fox.\] .*no readable image for training .*held out"):
        datamodule.setup("fit")


def test_netpbm_and_jfif_files_are_images_too(tmp_path):
    """torchvision's ImageFolder reads .ppm and .pgm (GTSRB ships .ppm); PIL also decodes .pbm,
    .pnm, .jfif and .jpe. Such files were left out without a word."""
    from PIL import Image

    from litlab.data.folder_index import scan

    root = tmp_path / "images"
    picture = Image.new("RGB", (20, 20), (200, 100, 50))
    for name, mode, kind in (
        ("a/x.ppm", "RGB", "PPM"),
        ("a/y.jfif", "RGB", "JPEG"),
        ("a/z.jpe", "RGB", "JPEG"),
        ("b/x.pgm", "L", "PPM"),
        ("b/y.pbm", "1", "PPM"),
        ("b/z.pnm", "RGB", "PPM"),
    ):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        picture.convert(mode).save(root / name, kind)
    assert len(scan(root).files) == 6
    cached = cached_folder(root, 16, 3, tmp_path / "cache", workers=1)
    assert not cached.skipped and cached.images.shape == (6, 3, 16, 16)
    assert cached.images[0, :, 8, 8].tolist() == [200, 100, 50]


def eval_on_folder(tmp_path: Path, summary: dict, root: Path, *overrides: str):
    """The eval config of train_on_folder's best checkpoint tested on the folder at root.
    No data.num_classes nor data.image_shape, as README writes it: the checkpoint's (refused
    as unset, and as the folder's default 32 px; walkthrough 162)."""
    return make_cfg(
        tmp_path / "eval",
        [
            f"ckpt_path={summary['best_checkpoint']}",
            "data=image_folder",
            f"data.source.root={root}",
            f"data.source.cache_dir={tmp_path / 'cache'}",
            "data.num_workers=0",
            "extras.print_config=false",
            *overrides,
        ],
        config_name="eval",
    )


def test_eval_on_the_training_folder_tests_the_runs_own_test_images_framed_as_the_run(
    tmp_path, caplog
):
    """eval.py with data=image_folder on the training folder took the test share, stored size
    and evaluation crop from image_folder's defaults, not the run's: trained with
    test_fraction 0.1, eval's 0.2 took in images the model trained on, and framed them
    otherwise. Now they come from the run: eval's test/acc is the run's own, on the same
    images."""
    from litlab.evaluate import eval_task

    write_png_folder(tmp_path / "images", per_class=20)
    summary = train_on_folder(
        tmp_path,
        "trainer.max_epochs=1",
        "data.batch_size=4",
        "data.source.test_fraction=0.1",
        "data.eval_crop=1.0",
    )
    # image_folder's defaults: test_fraction 0.2, size 36, eval_crop 0.875
    eval_cfg = eval_on_folder(tmp_path, summary, tmp_path / "images")
    with caplog.at_level("INFO", logger="litlab"):
        eval_task(eval_cfg)
    evaluated = summary_of(eval_cfg)
    assert evaluated["data"]["splits"]["test"] == summary["data"]["splits"]["test"] > 0
    assert evaluated["metrics"] == {k: summary["metrics"][k] for k in TESTED}
    assert "test_fraction 0.1 (not 0.2)" in caplog.text
    assert "eval_crop 1.0 (not 0.875)" in caplog.text and "size 20 (not 36)" in caplog.text


def test_a_run_on_a_folder_given_relative_is_tested_again_from_another_folder(
    tmp_path, monkeypatch
):
    """`data.source.root=images`, given relative to where the run started: its checkpoints
    record the folder absolute, so that `eval.py ckpt_path=...` run elsewhere tests the run's
    test images (it looked for images/ where it ran, or failed)."""
    from litlab.evaluate import eval_task

    write_png_folder(tmp_path / "images", per_class=20)
    monkeypatch.chdir(tmp_path)
    summary = train_on_folder(
        tmp_path, "trainer.max_epochs=1", "data.batch_size=4", "data.source.root=images"
    )
    (tmp_path / "elsewhere" / "images").mkdir(parents=True)  # an empty images/ there
    monkeypatch.chdir(tmp_path / "elsewhere")
    eval_cfg = make_cfg(
        tmp_path / "eval",
        [f"ckpt_path={summary['best_checkpoint']}", "extras.print_config=false"],
        config_name="eval",
    )
    eval_task(eval_cfg)
    evaluated = summary_of(eval_cfg)
    assert evaluated["metrics"] == {k: summary["metrics"][k] for k in TESTED}


def test_a_run_on_a_folder_given_relative_resumes_from_another_folder(tmp_path):
    """`resume=<run>` from another working directory than the run's: the saved config's
    `data.source.root=images` is taken from where the run started (it looked for images/ in
    the new working directory: no such folder)."""
    write_png_folder(tmp_path / "images", per_class=12)
    args = ["data=image_folder", "data.source.root=images", "data.source.size=20"]
    args += ["data.image_shape=[3,16,16]", "data.num_classes=3", "data.batch_size=4"]
    args += ["data.num_workers=0", f"data.source.cache_dir={tmp_path / 'cache'}"]
    args += ["model.net.width=4", "model.scheduler=null", "logger=csv", "test=false"]
    args += ["extras.print_config=false", "callbacks.progress_bar=null"]
    folder = tmp_path / "run"
    first = run_cli(*args, "trainer.max_epochs=1", f"hydra.run.dir={folder}", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    resumed = run_cli(f"resume={folder}", "trainer.max_epochs=2")  # from the repository
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["epochs"] == {"trained": 2, "validated": 2}


def test_eval_on_another_folder_tests_every_image_of_it(tmp_path, caplog):
    """eval.py on a folder of class folders other than the training one tested only the share
    its file names would hold out in a run that trained on it (about a fifth): now every image.
    The training folder itself keeps its held-out split (the rest was trained on), and a folder
    with test/ is tested on that."""
    from litlab.evaluate import eval_task, other_folder

    write_png_folder(tmp_path / "images", per_class=6)
    summary = train_on_folder(tmp_path, "trainer.max_epochs=1", "test=false", "data.batch_size=4")
    write_png_folder(tmp_path / "other", per_class=10, seed=1)  # other images
    other = ImageFolder(str(tmp_path / "other"), size=20, cache_dir=str(tmp_path / "cache"))
    assert 0 < other.load("test").__len__() < 30  # what eval tested before
    every = ImageFolder(str(other.root), size=20, cache_dir=str(tmp_path / "cache"), test_all=True)
    assert len(every.load("test")) == 30
    # nothing held out to validate: a GAN's FID takes its real statistics (the training
    # split's) from every image too (walkthrough 162: 112 of 120, the rest a validation share)
    train = every.load("train")
    kept, validated = every.validation_split(train, 0.1, 0)
    assert len(train) == len(kept) == 30 and len(validated) == 0

    trained = {"root": str(tmp_path / "images"), "test_fraction": 0.2}
    for root, expected in [(tmp_path / "other", True), (tmp_path / "images", False)]:
        source = {"root": str(root), "test_fraction": 0.2}
        other_folder(source, trained)
        assert source.get("test_all", False) is expected, root
    write_png_folder(tmp_path / "split" / "train", per_class=2)
    write_png_folder(tmp_path / "split" / "test", per_class=2)
    source = {"root": str(tmp_path / "split"), "test_fraction": 0.2}
    other_folder(source, trained)
    assert "test_all" not in source

    eval_cfg = eval_on_folder(tmp_path, summary, tmp_path / "other", "data.source.size=20")
    with caplog.at_level("INFO", logger="litlab"):
        assert eval_task(eval_cfg) is not None
    assert f"testing every image of {tmp_path / 'other'}" in caplog.text
    assert summary_of(eval_cfg)["data"]["test_all"] is True


def write_coloured_folder(root: Path, classes: tuple[str, ...], per_class: int, seed: int):
    """PNGs whose class is their colour (cat red, dog green, fox blue, with noise): a small
    net learns them in a few epochs, so a test accuracy says whether labels were right."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    colours = {"cat": (200, 30, 30), "dog": (30, 200, 30), "fox": (30, 30, 200), "emu": (0, 0, 0)}
    for c in classes:
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            noise = rng.integers(-30, 30, (24, 24, 3))
            pixels = np.clip(np.array(colours[c]) + noise, 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / c / f"{seed}-{i}.png")


def test_eval_on_a_folder_of_some_of_the_models_classes_labels_them_as_the_model(
    tmp_path, caplog, capsys
):
    """eval.py on a folder holding 2 of the model's 3 class folders was refused with advice
    that contradicted itself ("set data.num_classes=2", then "the model was trained on 3: set
    data.num_classes=3"), and an empty folder for the third class was refused as a class
    without training images. Labels are positions among the class folders, so dog/ and fox/
    alone would be labels 0 and 1 (cat and dog to the model): they are labelled by the
    model's class names. A class folder the model does not know is refused in one line."""
    from litlab.evaluate import eval_task

    write_coloured_folder(tmp_path / "images", ("cat", "dog", "fox"), 12, seed=0)
    summary = train_on_folder(tmp_path, "trainer.max_epochs=4", "data.batch_size=6", "test=false")
    write_coloured_folder(tmp_path / "some", ("dog", "fox"), 5, seed=1)
    (tmp_path / "empty" / "cat").mkdir(parents=True)  # an empty folder for the missing class
    write_coloured_folder(tmp_path / "empty", ("dog", "fox"), 5, seed=1)
    for name, cache in (("some", "true"), ("some", "false"), ("empty", "true")):
        eval_cfg = eval_on_folder(
            tmp_path / f"{name}-{cache}",
            summary,
            tmp_path / name,
            "data.source.size=20",
            f"data.source.cache={cache}",
        )
        with caplog.at_level("INFO", logger="litlab"):
            assert eval_task(eval_cfg) is not None, (name, cache)
        tested = summary_of(eval_cfg)
        assert tested["data"]["splits"] == {"test": 10}  # a classifier's test reads no other
        assert tested["metrics"]["test/acc"] >= 0.9, (name, cache)  # 0 with the folder's labels
    assert "labelling " + str(tmp_path / "some") + " by the model's 3 classes" in caplog.text

    labelled = ImageFolder(
        str(tmp_path / "some"),
        size=20,
        cache_dir=str(tmp_path / "cache"),
        classes=["cat", "dog", "fox"],
    ).load("test")
    assert sorted(set(labels_of(labelled).tolist())) == [1, 2]
    write_coloured_folder(tmp_path / "more", ("dog", "emu"), 1, seed=2)
    eval_cfg = eval_on_folder(tmp_path / "more-eval", summary, tmp_path / "more")
    caches = Path(eval_cfg.data.source.cache_dir)
    refused(capsys, eval_task, eval_cfg, "class folder(s) ['emu'] of ")
    assert not list(caches.glob("*/*"))  # refused from the scan: nothing decoded (before: all)
    # a model trained on a source whose checkpoint holds no class names (digits): all of them
    from litlab.evaluate import label_as_trained

    with pytest.raises(ConfigError, match="has 2 class folders but the model has 10 classes"):
        label_as_trained({"root": str(tmp_path / "some"), "test_fraction": 0.2}, {}, None, 10)


def test_eval_on_other_images_decodes_them_where_the_run_decoded_its_own(tmp_path):
    """A run that decoded its JPEGs on the device (other pixels than the workers' PIL): eval.py
    on another folder, chosen with the default decode, decodes them there too."""
    from litlab.evaluate import other_data

    trained = make_cfg(
        tmp_path, ["data=image_folder", "data.source.cache=false", "data.source.decode=device"]
    ).data
    chosen = make_cfg(tmp_path, ["data=image_folder"]).data
    for cfg, root in ((trained, "images"), (chosen, "other")):
        cfg.source.root = str(tmp_path / root)
        cfg.image_shape, cfg.num_classes = [3, 32, 32], 3
    tested = other_data(chosen, trained).source
    assert (tested.decode, tested.cache) == ("device", False)
    assert other_data(trained, chosen).source.decode == "workers"  # and the other way round


def test_eval_on_a_copy_of_the_training_folder_tests_its_held_out_share(tmp_path, caplog):
    """The training folder copied or moved (another machine, /scratch): eval.py took it for
    another folder and tested every image of it, the ones trained on too (reviewer: 1797 of
    which 1437 trained or validated on). Files sampled from the training split, kept in the
    checkpoint with digests of their bytes, recognise it: its held-out share is tested."""
    from litlab.evaluate import eval_task

    write_png_folder(tmp_path / "images", per_class=20)
    held_out = "data.source.test_fraction=0.1"  # not eval's default: the run's share is kept
    summary = train_on_folder(tmp_path, "trainer.max_epochs=1", "data.batch_size=4", held_out)
    shutil.copytree(tmp_path / "images", tmp_path / "copy")
    eval_cfg = eval_on_folder(tmp_path, summary, tmp_path / "copy", "data.source.size=20")
    with caplog.at_level("INFO", logger="litlab"):
        assert eval_task(eval_cfg) is not None
    assert "files sampled from the run's training split, under their names" in caplog.text
    assert "(a copy of its training folder" in caplog.text
    assert "test_fraction 0.1 (not 0.2)" in caplog.text
    tested = summary_of(eval_cfg)
    assert tested["data"]["splits"]["test"] == summary["data"]["splits"]["test"] < 30
    assert tested["metrics"]["test/acc"] == pytest.approx(summary["metrics"]["test/acc"])
    # a class of training images among others is not called a copy (walkthrough 182: 3
    # training files among 80 new ones were "a copy of its training folder"): said as it is
    write_png_folder(tmp_path / "mixed", per_class=20, seed=1)
    shutil.copytree(tmp_path / "images" / "cat", tmp_path / "mixed" / "cat", dirs_exist_ok=True)
    eval_cfg = eval_on_folder(tmp_path, summary, tmp_path / "mixed", "data.source.size=20")
    caplog.clear()
    with caplog.at_level("INFO", logger="litlab"):
        assert eval_task(eval_cfg) is not None
    assert "(some of the run's training images among others; remove them" in caplog.text
    assert "a copy of its training folder" not in caplog.text


def test_what_a_split_layout_leaves_unread_is_said_once(tmp_path, caplog):
    """valid/ beside val/ and test/, an unlabeled/ folder, an image at the root: a folder laid
    out in splits read none of them without a word (walkthrough 130; the flat layout says
    what it leaves out)."""
    from litlab.data.folder_index import split_folders

    for name in ("train", "test", "val", "valid", "unlabeled"):
        write_png_folder(tmp_path / name, per_class=1)
    (tmp_path / "stray.png").write_bytes((tmp_path / "train" / "cat" / "0.png").read_bytes())
    with caplog.at_level("WARNING", logger="litlab"):
        folders = split_folders(tmp_path)
        split_folders(tmp_path)
    assert {k: v.name for k, v in folders.items()} == {
        "train": "train",
        "test": "test",
        "val": "val",
    }
    said = [r.getMessage() for r in caplog.records if "not read" in r.getMessage()]
    assert len(said) == 1 and "stray.png, unlabeled, valid beside them not read" in said[0]


def test_eval_on_the_train_folder_of_a_split_layout_run_is_refused(tmp_path, capsys):
    """A run on images/train/ beside images/test/: eval.py on images/train/ found none of the
    run's sampled files (kept as train/<class>/<file>) and tested every image, all of them
    trained or validated on, with an info line (walkthrough 130: 0.666 against 0.616)."""
    from litlab.evaluate import eval_task

    write_png_folder(tmp_path / "images" / "train", per_class=12)
    write_png_folder(tmp_path / "images" / "test", per_class=3)
    summary = train_on_folder(tmp_path, "trainer.max_epochs=1", "data.batch_size=6", "test=false")
    eval_cfg = eval_on_folder(tmp_path, summary, tmp_path / "images" / "train")
    line = refused(capsys, eval_task, eval_cfg, "files sampled from the run's training and")
    assert "named as in its train/ or val/ folder" in line
    assert "the run trained or validated on" in line
    assert "+data.source.test_all=true tests every image of it as asked" in line


def test_eval_on_the_validation_folder_of_a_split_layout_run_is_refused(tmp_path, capsys, caplog):
    """A run on images/train/ beside images/val/ and images/test/ validated on val/, whose
    images chose its best checkpoint: eval.py on images/val/, or on a copy of train/ and val/
    (where val/ is the test split), tested them as new images and gave the run's val/acc as a
    test figure, without a word (walkthrough 139). Both refused; the run's own folder tests its
    test/ folder."""
    import shutil

    from litlab.evaluate import eval_task

    images = tmp_path / "images"
    write_png_folder(images / "train", per_class=12)
    write_png_folder(images / "val", per_class=4, seed=1)
    write_png_folder(images / "test", per_class=3, seed=2)
    summary = train_on_folder(tmp_path, "trainer.max_epochs=1", "data.batch_size=6", "test=false")
    for split in ("train", "val"):
        shutil.copytree(images / split, tmp_path / "copy" / split)
    for i, folder in enumerate([images / "val", tmp_path / "copy"]):
        eval_cfg = eval_on_folder(tmp_path / str(i), summary, folder)
        line = refused(capsys, eval_task, eval_cfg, "files sampled from the run's training and")
        tested = folder if folder.name == "val" else folder / "val"  # (the copy's test split)
        assert f"{tested} holds 12 of 48 files" in line  # all 12 of val/, 36 of train/ sampled
        assert "named as in its train/ or val/ folder" in line
    eval_task(eval_on_folder(tmp_path / "own", summary, images))  # its test/ folder
    # test_all asked of it: still its test/ folder, said, and not recorded as every image
    # (summary.json said test_all true: review 144)
    every = eval_on_folder(tmp_path / "all", summary, images, "+data.source.test_all=true")
    with caplog.at_level("WARNING", logger="litlab"):
        eval_task(every)
    assert f"its test split is {images / 'test'} alone" in caplog.text
    tested = summary_of(every)["data"]
    assert tested["splits"] == {"test": 9} and "test_all" not in tested
    # moved elsewhere, its test/ holding one training image too (files named by their content
    # repeat across splits): tested, with a warning (review 144: refused as a copy of train/)
    moved = shutil.copytree(images, tmp_path / "moved")
    shutil.copy(images / "train" / "cat" / "5.png", moved / "test" / "cat" / "5.png")
    with caplog.at_level("WARNING", logger="litlab"):
        eval_task(eval_on_folder(tmp_path / "m", summary, moved))
    assert f"{moved / 'test'} holds 1 of the 48 files sampled from the run's training and" in (
        caplog.text
    )


def test_eval_on_a_copy_whose_names_changed_unicode_form_is_refused(tmp_path):
    """A copy of the training folder whose accented names were rewritten in the other Unicode
    form (macOS's NFD; a zip or rsync --iconv round trip): its names hash to another held-out
    share, so eval.py found none of the run's files and tested every image, the ones trained
    on too (reviewer). Now refused, saying how to rename them back."""
    import unicodedata

    from litlab.data.fingerprint import fingerprints
    from litlab.evaluate import other_folder

    names = [f"caf\u00e9/{i}.png" for i in range(4)] + [f"th\u00e9/{i}.png" for i in range(4)]
    for name in names:
        for root, form in (("images", "NFC"), ("copy", "NFD")):
            path = tmp_path / root / unicodedata.normalize(form, name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(name.encode() * 8)
    sample = fingerprints(tmp_path / "images", names)
    trained = {"root": str(tmp_path / "images"), "test_fraction": 0.2}
    with pytest.raises(ConfigError, match=r"another Unicode form than the run's \(NFC;") as e:
        other_folder({"root": str(tmp_path / "copy"), "test_fraction": 0.2}, trained, sample)
    assert f"convmv -r -f utf8 -t utf8 --nfc --notest {tmp_path / 'copy'}" in str(e.value)
    other = {"root": str(tmp_path / "images2"), "test_fraction": 0.2}  # another: every image
    shutil.copytree(tmp_path / "copy", tmp_path / "images2")
    for path in (tmp_path / "images2").rglob("*.png"):
        path.write_bytes(b"other")
    other_folder(other, trained, sample)
    assert other["test_all"] is True


def test_eval_on_a_renamed_copy_of_training_images_is_refused(tmp_path, capsys, caplog):
    """A folder holding the run's training images under other names (a dataset exported
    again, files numbered anew): eval.py found none of the sampled files by name and tested
    every image, the trained ones too. Now the sampled files are looked for by length and bytes:
    refused, unless +data.source.test_all=true; a few (a dataset's duplicates) are warned of."""
    from PIL import Image

    from litlab.evaluate import eval_task

    write_png_folder(tmp_path / "images", per_class=12)
    summary = train_on_folder(tmp_path, "trainer.max_epochs=1", "data.batch_size=3", "test=false")
    for path in sorted((tmp_path / "images").rglob("*.png")):
        renamed = tmp_path / "renamed" / path.parent.name / f"export_{path.name}"
        renamed.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, renamed)
    eval_cfg = eval_on_folder(tmp_path, summary, tmp_path / "renamed")
    line = refused(capsys, eval_task, eval_cfg, "images sampled from the run's training split")
    assert "under other names, byte for byte" in line and "+data.source.test_all=true" in line
    asked = eval_on_folder(tmp_path, summary, tmp_path / "renamed", "+data.source.test_all=true")
    eval_task(asked)
    assert summary_of(asked)["data"]["splits"]["test"] == 36  # every image, as asked
    # another folder of other images, two of them training images under other names
    other = tmp_path / "other"
    for i, path in enumerate(sorted((tmp_path / "renamed").rglob("*.png"))):
        (other / path.parent.name).mkdir(parents=True, exist_ok=True)
        target = other / path.parent.name / f"new_{i}.png"
        if i < 2:
            shutil.copyfile(path, target)
        else:
            Image.new("RGB", (48, 40), (i, 3 * i, 255 - i)).save(target)
    caplog.clear()
    with caplog.at_level("WARNING", logger="litlab"):
        eval_task(eval_on_folder(tmp_path, summary, other))
    assert "(duplicates across the two folders?)" in caplog.text
    # contents, not files: 30 identical training images (blank frames) are one image found
    from litlab.data.fingerprint import files_found_by_content, fingerprints

    blank = tmp_path / "blank"
    for folder, count in (("train", 30), ("test", 1)):
        (blank / folder / "a").mkdir(parents=True)
        for i in range(count):
            Image.new("RGB", (20, 20)).save(blank / folder / "a" / f"{folder}{i}.png")
    sample = fingerprints(blank / "train", [f"a/train{i}.png" for i in range(30)])
    assert files_found_by_content(blank / "test", ["a/test0.png"], sample) == 1


@pytest.mark.parametrize("loader", ["device", "dataloader"])
def test_part_of_an_evaluation_split_is_a_random_sample_of_it(tmp_path, loader):
    """trainer.limit_test_batches=0.5 on an image folder (stored class by class): the batches
    measured are a seeded random sample of the split, the same every time and every image of
    the split once over the whole order (before: the first classes only, here 2 of 4). The
    whole split is read in its stored order."""
    import lightning as L

    root = tmp_path / "images"
    write_png_folder(root, classes=("a", "b", "c", "d"), per_class=10)
    source = ImageFolder(
        str(root), size=16, test_fraction=0.5, cache_dir=str(tmp_path / "cache"), workers=1
    )

    def labels_read(limit: float | int) -> list[list[int]]:
        dm = DataModule(
            source, [3, 16, 16], 4, [0.5], [0.25], batch_size=4, loader=loader, num_workers=0
        )
        dm.eval_batch_size = 4
        dm.trainer = L.Trainer(
            limit_test_batches=limit,
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        dm.setup()
        return [batch[1].tolist() for batch in dm.test_dataloader()]

    def flat(batches: list[list[int]]) -> list[int]:
        return [label for batch in batches for label in batch]

    whole = labels_read(1.0)
    assert flat(whole) == sorted(flat(whole))  # as stored: class by class
    part = labels_read(0.5)
    assert part == labels_read(0.5)  # the same sample at every evaluation
    assert Counter(flat(part)) == Counter(flat(whole))  # each image once in the order
    assert len(set(flat(part[: len(part) // 2]))) == 4  # every class among the batches measured


def test_which_evaluation_limits_measure_part_of_a_split():
    """1.0 is all of a split and 0 none; a fraction below 1 and a number of batches (an int, or a
    whole float above 1, which Lightning reads as batches) are parts (2.0 was taken as all)."""
    from litlab.data.datamodule import part_of_a_split

    limits = [None, 0, 0.0, 1.0, 0.5, 1, 2, 2.0]
    assert [part_of_a_split(limit) for limit in limits] == [False] * 4 + [True] * 4


def test_a_corrupt_cifar10_batch_says_how_to_fetch_it_again_and_that_works(tmp_path, monkeypatch):
    """prepare() looks only for the batch files: "fetch it again" over a damaged one fetched
    nothing with download=true. Its advice, delete it and run again, does fetch it."""
    import torchvision

    fetched = []

    def download(root: str, download: bool) -> None:  # torchvision's CIFAR10, offline
        fetched.append(root)
        write_cifar_batches(Path(root), per_batch=8)

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", download)
    write_cifar_batches(tmp_path, per_batch=8)
    batch = tmp_path / "cifar-10-batches-py" / "data_batch_3"
    batch.write_bytes(b"\x80\x04garbage")
    source = CIFAR10(str(tmp_path), download=True)
    source.prepare()
    assert fetched == []  # every file is there: nothing fetched
    with pytest.raises(
        DataError, match=r"data_batch_3 is not a readable .*delete it and run again"
    ):
        source.load("train")
    batch.unlink()
    source.prepare()
    assert fetched == [str(tmp_path)] and len(source.load("train")) == 40


def test_images_decoded_well_above_the_nets_input_are_said(tmp_path, caplog):
    """data.source.size=64 alone trained on 32-pixel crops (data.image_shape's default) without
    a word (walkthrough 157): said once (a line: storing large and training small is also a
    recipe's choice), with the shape to set; a crop's margin is not."""
    write_png_folder(tmp_path / "images", per_class=4)
    for size, said in ((48, True), (20, False)):
        source = ImageFolder(str(tmp_path / "images"), size=size, cache_dir=str(tmp_path / "c"))
        dm = DataModule(source, [3, 16, 16], 3, [0.5], [0.25], batch_size=2, loader="auto")
        caplog.clear()
        with caplog.at_level("INFO", logger="litlab"):
            dm.setup()
            dm.setup("test")
        lines = [r.getMessage() for r in caplog.records if "the net sees" in r.getMessage()]
        assert lines == (
            [
                "data.source.size=48 decodes the images at 48 px, and the net sees "
                "data.image_shape [3, 16, 16]: each crop is resized to 16 px; to train at 48 px, "
                "set data.image_shape=[3,48,48] (and data.source.size about 54, a crop's margin)"
            ]
            if said
            else []
        )


def test_the_training_balance_is_said_where_a_fit_trains_and_not_by_a_test(tmp_path, caplog):
    """eval.py (the test stage) said the training split's balance and recorded its images by
    class beside the test's alone (review 159)."""
    from litlab.evaluate import tested_data

    root = tmp_path / "images"
    write_png_folder(root, classes=("cat",), per_class=30)
    write_png_folder(root, classes=("dog",), per_class=2, seed=1)
    source = ImageFolder(str(root), size=16, cache_dir=str(tmp_path / "c"), workers=1)
    said = []
    for stage in ("test", "fit"):
        dm = DataModule(source, [3, 16, 16], 2, [0.5], [0.25], batch_size=2, loader="auto")
        caplog.clear()
        with caplog.at_level("WARNING", logger="litlab"):
            dm.setup(stage)
        said.append("the training images are unbalanced" in caplog.text)
    assert said == [False, True]
    dm.setup("test")  # (a run's test after its fit)
    report = dm.report()
    assert set(report["class_images"]) == {"train", "val", "test"}
    assert set(tested_data(report, [])["class_images"]) == {"test"}


def test_copies_are_matched_on_digest_arrays_each_to_the_first_trained_file_of_its_bytes(
    tmp_path,
):
    """copies_among works on int64 digest arrays (a conversion of a million files held 0.3 GB of
    names and digests as Python objects); the conversion reads its records' names for the
    copies alone. Each copy names the first training file of its bytes; a held-out file
    repeated within its own split is not a copy of training."""
    from litlab.data.fingerprint import copies_among
    from litlab.data.optimize import recorded_copies

    top = np.iinfo(np.int64)
    trained = np.array([5, top.min, 7, 5, top.max], dtype=np.int64)
    assert copies_among(trained, np.array([7, 8, 5, 5, top.max, 9, top.min])) == [
        (0, 2), (2, 0), (3, 0), (4, 4), (6, 1)
    ]  # fmt: skip
    assert copies_among([], [1, 2]) == [] and copies_among([1, 2], []) == []
    records = {}
    for split, lines in {
        "train": [[3, "cat/a.png"], [4, "dog/b.png"], [3, "cat/a2.png"]],
        "val": [[9, "cat/v.png"], [4, "dog/v.png"]],
        "test": [[9, "cat/t.png"], [3, "cat/t2.png"], [1, "dog/t.png"], [1, "dog/t3.png"]],
    }.items():
        (tmp_path / split).mkdir()
        half = len(lines) // 2  # two writers' files, read in their sorted order
        for rank, part in enumerate((lines[:half], lines[half:])):
            text = "".join(json.dumps(line) + "\n" for line in part)
            (tmp_path / split / f"{rank}.digests").write_text(text)
        records[split] = tmp_path / split
    assert recorded_copies(records) == {
        "val": [["val:dog/v.png", "train:dog/b.png"]],
        "test": [["test:cat/t.png", "val:cat/v.png"], ["test:cat/t2.png", "train:cat/a.png"]],
    }


def test_copies_of_training_files_among_the_held_out_images_are_said_and_recorded(
    tmp_path, caplog, capsys
):
    """Byte-for-byte copies of training images in val/ and test/ (walkthrough 150: 15 of each
    split's 90 images, test/acc 1, not a word, where eval.py on the test folder alone refused
    it), and in a folder without split folders a copy under another name ("img copy.png"),
    whose name hashes it into another split than its original: said once a split, with an
    example, and recorded for summary.json. Files read as they go (cache=false) are not
    digested: nothing is said there."""
    from litlab.data.folder_index import file_names

    root = tmp_path / "split"
    write_png_folder(root / "train", per_class=10)
    write_png_folder(root / "val", per_class=3, seed=1)
    write_png_folder(root / "test", per_class=3, seed=2)
    for i in range(2):  # 2 training images copied into val/, 3 into test/ (one of them twice)
        shutil.copy(root / "train" / "dog" / f"{i}.png", root / "val" / "dog" / f"dup{i}.png")
    for i, name in enumerate(("0.png", "1.png", "1.png")):
        shutil.copy(root / "train" / "fox" / name, root / "test" / "fox" / f"dup{i}.png")
    shutil.copy(root / "val" / "cat" / "0.png", root / "test" / "cat" / "val_copy.png")
    source = ImageFolder(str(root), size=16, cache_dir=str(tmp_path / "cache"), workers=1)
    dm = DataModule(source, [3, 16, 16], 3, [0.5], [0.25], batch_size=4, loader="auto")
    with caplog.at_level("WARNING", logger="litlab"):
        dm.setup()
    assert dm.copies["val"] == [("val/dog/dup0.png", "train/dog/0.png"),
                                ("val/dog/dup1.png", "train/dog/1.png")]  # fmt: skip
    assert (
        "2 of the 11 validation images are byte-for-byte copies of files the run trains on (e.g. "
        "val/dog/dup0.png is train/dog/0.png): val/* and the checkpoints chosen by them count "
        "them as unseen images" in caplog.text
    )
    assert dm.copies["test"] == [
        ("test/cat/val_copy.png", "val/cat/0.png"),  # a validation image, which chose the best
        ("test/fox/dup0.png", "train/fox/0.png"),
        ("test/fox/dup1.png", "train/fox/1.png"),
        ("test/fox/dup2.png", "train/fox/1.png"),
    ]
    assert "4 of the 13 test images are byte-for-byte copies of files the run trains or " in (
        caplog.text
    )
    # the pre-flight check says them as the run does (walkthrough 150: "every file is readable")
    from litlab.data.check import main

    assert main([str(root), "--size", "16", "--batch-size", "4", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert (
        "warning: 2 of the 11 validation images are byte-for-byte copies of files the run "
        "trains on (e.g. val/dog/dup0.png is train/dog/0.png): val/* and the checkpoints chosen "
        "by them count them as unseen images" in out
    )
    assert "warning: 4 of the 13 test images are byte-for-byte copies of files the run " in out
    # eval.py (the test stage) measures no val/*: its copies are not said (review 154)
    tested = DataModule(source, [3, 16, 16], 3, [0.5], [0.25], batch_size=4, loader="auto")
    tested.setup("test")
    assert list(tested.copies) == ["test"]
    report = dm.report()["copies_of_training"]
    assert report["val"]["images"] == 2 and report["test"]["first"][0] == [
        "test/cat/val_copy.png",
        "val/cat/0.png",
    ]
    # no split folders: copies under other names fall into other splits than their original
    flat = tmp_path / "flat"
    write_png_folder(flat, per_class=20)
    group = ["cat/3.png", *(f"cat/3 copy{i}.png" for i in range(8))]
    for name in group[1:]:
        shutil.copy(flat / group[0], flat / name)
    source = ImageFolder(str(flat), size=16, cache_dir=str(tmp_path / "cache"), workers=1)
    dm = DataModule(source, [3, 16, 16], 3, [0.5], [0.25], batch_size=4, loader="auto")
    dm.setup()
    trained = [name for name in file_names(dm.datasets["train"]) if name in group]
    held = {
        split: [name for name in file_names(dm.datasets[split]) if name in group]
        for split in ("val", "test")
    }
    assert trained and held["val"] and held["test"]  # (the names spread the group so)
    assert dm.copies == {
        split: [(name, trained[0]) for name in names] for split, names in held.items()
    }
    # files read as they go are not digested
    source = ImageFolder(str(root), size=16, cache=False, workers=1)
    dm = DataModule(source, [3, 16, 16], 3, [0.5], [0.25], batch_size=4, loader="auto")
    dm.setup()
    assert not dm.copies and "copies_of_training" not in dm.report()


def test_classes_without_a_training_image_are_said(tmp_path, caplog):
    """data.num_classes=12 on the 10 digits (or labels of one's own that start at 1) trained
    outputs that no image pulls towards, in silence (walkthrough 173); said, with the labels."""
    from litlab.config import build

    dm = build(make_cfg(tmp_path, ["data.num_classes=12"]).data, "data")
    with caplog.at_level("WARNING", logger="litlab"):
        dm.setup("fit")
    assert "holds no image of label(s) [10, 11]" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="litlab"):  # nor a small subset's gaps (review 174)
        build(make_cfg(tmp_path, []).data, "data").setup("fit")
        build(make_cfg(tmp_path, ["data.train_fraction=0.004"]).data, "data").setup("fit")
    assert "holds no image of label" not in caplog.text


def test_a_source_of_ones_own_is_told_in_one_line_what_its_images_should_be():
    """A source of one's own (README: any class with load()) that returns float pixels,
    [N, H, W] or channels-last images, or float labels got a traceback from deep in the loader
    or an IndexError (walkthrough 173), or trained on truncated labels; a map-style Dataset of
    its own (images one at a time) failed in the class count. Each is said in one line."""
    from helpers import GivenImages
    from litlab.data.datamodule import _sample_problem

    def datamodule(images, labels, **kwargs):
        one = kwargs.pop("one_at_a_time", False)
        return DataModule(
            GivenImages(images, labels, one), [1, 8, 8], 3, [0.5], [0.25], batch_size=4, **kwargs
        )

    pixels = torch.randint(0, 256, (30, 1, 8, 8), dtype=torch.uint8)
    labels = torch.arange(30) % 3
    wrong = {
        "not uint8 pixels 0-255 ((images * 255).round()": (pixels.float() / 255, labels),
        "images [8, 8]: a channel axis is missing": (pixels[:, 0], labels),
        "images [8, 8, 1], channels last": (pixels.permute(0, 2, 3, 1), labels),
        "labels torch.float32 [30], not N integer class indices": (pixels, labels.float()),
    }
    for said, (images, given) in wrong.items():
        for one_at_a_time in (False, True):
            if one_at_a_time and "labels" in said:
                said = "label 0.0, not an integer class index"
            dm = datamodule(images, given, loader="auto", one_at_a_time=one_at_a_time)
            with pytest.raises(DataError, match=re.escape(said)):
                dm.setup("fit")
    dicts = datamodule(pixels, labels, loader="dataloader", one_at_a_time=True)
    dicts.source.load = lambda split: [{"image": pixels[0], "label": 0}] * 30
    with pytest.raises(DataError, match="holds samples of type dict, not"):
        dicts.setup("fit")
    with pytest.raises(ConfigError, match=r"given gives its images one at a time .*dataloader"):
        datamodule(pixels, labels, one_at_a_time=True).setup("fit")
    synthetic = Synthetic(image_shape=(2, 16, 3), num_classes=3, train_size=8, test_size=4)
    assert _sample_problem(synthetic.load("train"), (2, 16, 3)) is None  # an image, not NHWC
    for rgba in ((4, 32, 32, 4), (4, 6, 6, 4)):  # RGBA channels last, small images too
        given = torch.zeros(rgba, dtype=torch.uint8), torch.zeros(4, dtype=torch.long)
        assert "channels last" in _sample_problem(TensorDataset(*given), (3, *rgba[1:3]))
    # a label above data.num_classes where a sample of the labels would not look (review 180)
    high = labels.repeat(20)
    high[1] = 3
    with pytest.raises(ConfigError, match=r"has 4 classes but data\.num_classes is 3"):
        datamodule(
            pixels.repeat(20, 1, 1, 1), high, loader="dataloader", one_at_a_time=True
        ).setup()
    dm = datamodule(pixels, labels, loader="dataloader", one_at_a_time=True)
    dm.setup("fit")  # its classes counted from its labels
    images, batch_labels = next(iter(dm.train_dataloader()))
    assert images.dtype == torch.uint8 and images.shape == (4, 1, 8, 8)
    assert batch_labels.dtype == torch.long and set(batch_labels.tolist()) <= {0, 1, 2}


def test_a_dataset_of_ones_own_without_targets_has_its_labels_read_once_and_said(caplog):
    """A map-style Dataset of one's own without ``targets`` had every sample read (images
    decoded) for the class count, again for a train_fraction's stratified subset, again for
    FID's subsets, in silence: a large one looked hung at setup. Read once, said, with what
    skips it; the labels read are the Dataset's own, in order."""
    from helpers import GivenImages, OneAtATime

    class Counted(OneAtATime):
        reads = 0

        def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
            Counted.reads += 1
            return super().__getitem__(i)

    pixels = torch.randint(0, 256, (90, 1, 8, 8), dtype=torch.uint8)
    labels = torch.arange(90) % 3
    source = GivenImages(pixels, labels)
    source.load = lambda split: Counted(TensorDataset(pixels, labels))
    dm = DataModule(
        source, [1, 8, 8], 3, [0.5], [0.25], batch_size=4, loader="dataloader", train_fraction=0.5
    )
    with caplog.at_level("INFO", logger="litlab"):
        dm.setup("fit")
    assert "reading all 90 samples of Counted for their labels" in caplog.text
    assert "a `targets` list of its labels" in caplog.text
    assert Counted.reads <= 90 + 5  # every label once, and a sample or two looked at
    read = Counted.reads
    dm.arrays("train", limit=30)  # FID's subset: its 30 images, no labels again
    assert Counted.reads - read <= 30 + 5
    dataset = dm.datasets["train"].dataset
    read = Counted.reads
    assert torch.equal(labels_of(dataset), labels) and Counted.reads == read
    labels_of(dataset)[0] = 7  # a caller's copy (review 183: the cache itself was handed out)
    assert torch.equal(labels_of(dataset), labels)


def test_eval_matches_a_folders_class_names_with_a_datasets_published_labels(tmp_path, caplog):
    """eval.py of a model trained on a dataset whose labels are numbers (digits, Fashion-MNIST)
    on a folder labelled its images by the folders' sorted positions (review 177: Fashion-MNIST's
    names sort into another order, test/acc 0.25 for 0.38; "zero".."nine" 0.09), and a model of
    named class folders tested on digits compared its classes with digits' numbers: both
    without a word. A folder's names are matched with the dataset's published ones (case,
    spaces and punctuation aside: a folder cannot be named "T-shirt/top"); a folder of other
    names, or digits for a model of other classes, is refused; unnamed labels are said."""
    from PIL import Image

    from litlab.data.sources import FashionMNIST
    from litlab.evaluate import other_data

    def folder(name: str, classes: list[str]) -> Path:
        for spelled in classes:
            (tmp_path / name / spelled).mkdir(parents=True)
            Image.new("L", (28, 28)).save(tmp_path / name / spelled / "a.png")
        return tmp_path / name

    spelled = ["t-shirt_top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt"]
    spelled += ["Sneaker", "Bag", "ankle boot"]
    fashion = folder("fashion", spelled)
    trained = make_cfg(tmp_path, ["data=fashion_mnist"]).data
    chosen = make_cfg(tmp_path, ["data=image_folder", f"data.source.root={fashion}"]).data
    chosen.image_shape, chosen.mean, chosen.std = trained.image_shape, trained.mean, trained.std
    chosen.source.size, chosen.source.channels, chosen.num_classes = 28, 1, 10
    # each folder labelled as the dataset's class it names, not by its sorted position
    assert list(other_data(chosen, trained).source.classes) == spelled
    assert sorted(spelled, key=str.lower) != spelled
    assert len(FashionMNIST.label_names) == 10
    chosen.source.root = str(folder("words", ["zero", "one", "two", "three", "four", "five"]))
    with pytest.raises(DataError, match=r"class folders \['five', 'four', .*\] are none of the"):
        other_data(chosen, trained)
    # folders named by the labels' numbers (0..9, or 00..09) are the dataset's classes by
    # number, whatever names it publishes (review 179: refused)
    chosen.source.root = str(folder("numbered", [str(n) for n in range(10)]))
    assert "classes" not in other_data(chosen, trained).source  # sorted: each its number
    chosen.source.root = str(folder("padded", [f"{n:02d}" for n in (0, 3, 9)]))
    assert list(other_data(chosen, trained).source.classes)[::3] == ["00", "03", "6", "09"]
    chosen.source.root = str(folder("one", ["1", "01"]))
    with pytest.raises(DataError, match=r"'01' and '1' both name label 1; keep one folder"):
        other_data(chosen, trained)
    # two spellings of one class: one line naming both
    chosen.source.root = str(folder("twice", ["Bag", "bag_"]))
    with pytest.raises(DataError, match=r"'Bag' and 'bag_' both name the model's class 'Bag'"):
        other_data(chosen, trained)
    # each name after its label's number, as scripts/make_image_folder.py writes them
    # (walkthrough 182: refused as none of the classes); after another number: refused
    prefixed = [f"{n}-{name}" for n, name in enumerate(spelled)]
    chosen.source.root = str(folder("prefixed", prefixed))
    assert "classes" not in other_data(chosen, trained).source  # sorted: in label order
    chosen.source.root = str(folder("misnumbered", ["3-trouser", "1-Trouser"]))
    with pytest.raises(DataError, match=r"class folders \['3-trouser'\] are none of the"):
        other_data(chosen, trained)
    # numbers beyond 9 (10 sorts before 2): labelled by their numbers
    trained.source = {"_target_": "litlab.data.Synthetic"}
    trained.num_classes = chosen.num_classes = 12
    chosen.source.root = str(folder("numbers", [str(n) for n in range(12)]))
    assert list(other_data(chosen, trained).source.classes) == [str(n) for n in range(12)]
    # the other way round: a model of named folders tested on digits, or on unnamed labels
    trained = make_cfg(tmp_path, ["data=image_folder", f"data.source.root={fashion}"]).data
    digits = make_cfg(tmp_path, ["data=digits"]).data
    trained.image_shape, trained.mean, trained.std = digits.image_shape, digits.mean, digits.std
    trained.source.size, trained.source.channels, trained.num_classes = 28, 1, 10
    words = ["eight", "five", "four", "nine", "one", "seven", "six", "three", "two", "zero"]
    with pytest.raises(DataError, match=r"the model's labels stand for .*\['eight', 'five'"):
        other_data(digits, trained, {"classes": words})
    other_data(digits, trained, {"classes": [str(n) for n in range(10)]})  # numbered: theirs
    other_data(digits, trained, {"classes": [f"{n:02d}" for n in range(10)]})  # 00..09 too
    fashion_data = make_cfg(tmp_path, ["data=fashion_mnist"]).data  # (walkthrough 182)
    other_data(fashion_data, trained, {"classes": prefixed})
    with pytest.raises(DataError, match=r"the model's labels stand for .*'1-t-shirt_top'"):
        other_data(fashion_data, trained, {"classes": [prefixed[1][0] + p[1:] for p in prefixed]})
    trained.num_classes = 3  # 3 named classes on its 10: that, not "set data.num_classes=3"
    with pytest.raises(DataError, match=r"the model's labels stand for .*\['a', 'b', 'c'\]"):
        other_data(fashion_data, trained, {"classes": ["a", "b", "c"]})
    trained.num_classes = 10
    synthetic = make_cfg(tmp_path, ["data=synthetic", "data.image_shape=[1,28,28]"]).data
    synthetic.mean, synthetic.std = digits.mean, digits.std
    with caplog.at_level("WARNING", logger="litlab"):
        other_data(synthetic, trained, {"classes": words})
    assert "this data's labels are numbers, taken for those classes in that order" in caplog.text
    # a model of one named dataset on another of as many classes (walkthrough 186: a digits
    # model on data=fashion_mnist, test/acc 0.17 without a word); digits on MNIST: 0-9 both
    mnist = make_cfg(tmp_path, ["data=mnist"]).data
    for other in (fashion_data, mnist):  # (digits' shape and statistics: only names differ)
        other.image_shape, other.mean, other.std = (
            list(digits[key]) for key in ("image_shape", "mean", "std")
        )
    with pytest.raises(DataError, match=r"learned litlab.data.Digits's classes, labels 0-9 for "):
        other_data(fashion_data, digits)
    with pytest.raises(DataError, match=r"this data's labels 0-9 are 0, 1, 2, 3, 4, 5, 6, 7, "):
        other_data(digits, fashion_data)
    other_data(mnist, digits)
