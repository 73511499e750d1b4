"""Shared fixtures: composed configs with run folders in tmp_path, real on-disk data fixtures."""

from __future__ import annotations

import gzip
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

from litlab.config import config_dir

REPO = Path(__file__).resolve().parents[1]


def _share_the_cores_between_workers() -> None:
    """Under pytest-xdist, each worker (and every process it starts: CLI runs, DDP ranks) gets
    its share of the cores for torch's intra-op threads. Left to torch's default, every worker
    runs one OpenMP thread per core, and their spinning threads fight: the suite took twice the
    time on 2 cores with 2 workers (tests/test_train.py + test_recipes.py + test_observability.py:
    288 s vs 143 s, 2026-12-03). A user's OMP_NUM_THREADS is kept."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        threads = max(1, (cores or 1) // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


_share_the_cores_between_workers()
FASHION_SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")
# A GAN small enough for a CPU test: 16 px synthetic images, widths of 8 (any model=dcgan*).
TINY_GAN_DATA = [
    "data=synthetic",
    "data.image_shape=[1,16,16]",
    "data.source.train_size=256",
    "data.source.test_size=64",
    "data.batch_size=32",
    "model.generator.width=8",
    "model.discriminator.width=8",
]
TINY_GAN = ["model=dcgan", *TINY_GAN_DATA]
# The README's DDP line on a machine without GPUs: two CPU processes (gloo).
CPU_DDP = ["trainer.accelerator=cpu", "trainer.devices=2", "trainer.strategy=ddp"]
# A test run's console: no config tree, no progress bar (and with QUIET_CSV, CSV logs only).
QUIET = ["extras.print_config=false", "callbacks.progress_bar=null"]
QUIET_CSV = [*QUIET, "logger=csv"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slow tier first (a stable sort: modules stay together within each tier): its tests
    take up to two minutes each, and one started last by an xdist worker leaves the others idle
    at the end of the run; the quick tests then even out the workers' ends."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _same_random_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts from one random state, whatever ran before it in its worker (pytest-xdist
    deals tests to workers as they finish): an unseeded draw that passes in one order of the
    suite and fails in another is a flake, not a finding. PL_GLOBAL_SEED, which a run leaves set
    (litlab reads it outside a run too), is cleared."""
    import random

    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _offline_wandb(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never reach the network: W&B runs for real, offline."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


def make_cfg(tmp_path: Path, overrides: list[str] = (), config_name: str = "train") -> DictConfig:
    """Compose a config as `python train.py <overrides>` would, with its run folder in tmp_path."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose(config_name=config_name, overrides=list(overrides), return_hydra_config=True)
    out = tmp_path / "run"
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(out)
        cfg.hydra.runtime.cwd = str(REPO)
        cfg.hydra.job.num = 0
        cfg.paths.log_dir = str(tmp_path / "outputs")
        cfg.paths.data_dir = str(tmp_path / "data")
    HydraConfig.instance().set_config(cfg)
    return cfg


def bare_trainer(**kwargs) -> L.Trainer:
    """Lightning's Trainer with the loop alone: no logger, checkpoints, progress bar or summary."""
    defaults = dict(
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    return L.Trainer(**{**defaults, **kwargs})


def refused(capsys: pytest.CaptureFixture[str], task, cfg: DictConfig, needle: str) -> str:
    """Run a task in-process, expect exit status 2 with one 'litlab: error:' line holding
    ``needle``; return that line."""
    with pytest.raises(SystemExit) as exit_info:
        task(cfg)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("litlab: error: ") and needle in err[-1], err[-3:]
    return err[-1]


# W&B online as litlab sees it (a key), its server an unused loopback port: nothing is sent.
NO_WANDB_SERVER = {"WANDB_API_KEY": "a" * 40, "WANDB_BASE_URL": "http://127.0.0.1:9"}


def run_cli(
    *args: str,
    script: str = "train.py",
    cwd: Path = REPO,
    timeout: int = 600,
    wandb_online: bool = False,
    new_session: bool = False,
) -> subprocess.CompletedProcess:
    """Run a task exactly as a user does, from the repo root. W&B offline, or with
    ``wandb_online`` online with credentials and no server reachable (NO_WANDB_SERVER).
    ``new_session``: in a process group of its own (as a cluster job), which it may signal."""
    # Not WANDB_SERVICE: a W&B run made in the test process would share its service with the
    # child, which then outlives the child (a killed child's run id stays "in use" there).
    skip = {"WANDB_SERVICE", "WANDB_MODE"}
    wandb: dict[str, str] = {"WANDB_MODE": "offline"}
    if wandb_online:  # nor a proxy (W&B would wait for it), nor the user's saved `wandb offline`
        skip |= {"HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "WANDB_CONFIG_DIR"}
        config = tempfile.mkdtemp(prefix="wandb-config-")
        wandb = {**NO_WANDB_SERVER, "WANDB_CONFIG_DIR": config}
    env = {
        **{k: v for k, v in os.environ.items() if k not in skip},
        **wandb,
        "WANDB_SILENT": "true",
        "HYDRA_FULL_ERROR": "0",
        "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, str(REPO / script), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        start_new_session=new_session,
    )


def write_idx(path: Path, array: np.ndarray) -> None:
    """Write an IDX ubyte file (the MNIST format), gzip-compressed when the name ends in .gz."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(
        int(d).to_bytes(4, "big") for d in array.shape
    )
    payload = header + array.astype(np.uint8).tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gz":
        with gzip.open(path, "wb") as f:
            f.write(payload)
    else:
        path.write_bytes(payload)


def write_idx_dataset(
    folder: Path, n_train: int = 64, n_test: int = 32, gz: bool = True, seed: int = 0
) -> None:
    """Four MNIST-format files with random 28x28 images and labels 0-9."""
    rng = np.random.default_rng(seed)
    suffix = ".gz" if gz else ""
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        write_idx(folder / f"{prefix}-images-idx3-ubyte{suffix}", rng.integers(0, 256, (n, 28, 28)))
        labels = np.arange(n) % 10
        write_idx(folder / f"{prefix}-labels-idx1-ubyte{suffix}", labels)


def write_cifar_batches(data_dir: Path, per_batch: int = 20, seed: int = 0) -> None:
    """cifar-10-batches-py with the real pickle layout and few images."""
    rng = np.random.default_rng(seed)
    folder = data_dir / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {
            "data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
            "labels": [int(x) for x in np.arange(per_batch) % 10],
            "batch_label": name,
        }
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f)


def write_png_folder(
    root: Path, classes: tuple[str, ...] = ("cat", "dog", "fox"), per_class: int = 6, seed: int = 0
) -> None:
    """Random PNGs, root/<class>/<i>.png; the same seed writes the same bytes."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c in classes:
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / c / f"{i}.png")


def write_folder_losing_a_class_to_validation(tmp_path: Path) -> Path:
    """tmp_path/images with train/ and test/ where class fox's one train/ file is one that
    data.val_fraction's default share (0.1, split seed 0) takes for validation."""
    import shutil

    from litlab.data.folder_index import validation_split

    root = tmp_path / "images"
    write_png_folder(root / "train", classes=("cat", "dog"), per_class=6)
    write_png_folder(root / "test", classes=("cat", "dog", "fox"), per_class=2)
    names = [f"fox/{i}.png" for i in range(200)]
    _, val = validation_split(names, 0.1, 0)
    (root / "train" / "fox").mkdir()
    write_png_folder(tmp_path / "one", classes=("fox",), per_class=1)
    shutil.copy(tmp_path / "one" / "fox" / "0.png", root / "train" / names[int(val[0])])
    return root


def write_digits_folder(root: Path) -> Path:
    """scikit-learn's 1,797 digits as 28-px grayscale PNGs in root/<digit>/ (a flat folder)."""
    from PIL import Image

    from litlab.data import Digits

    for split in ("train", "test"):
        images, labels = Digits().load(split).tensors
        for i, (image, label) in enumerate(zip(images, labels.tolist(), strict=True)):
            (root / str(label)).mkdir(parents=True, exist_ok=True)
            Image.fromarray(image[0].numpy()).save(root / str(label) / f"{split}{i}.png")
    return root


def write_unusual_images(folder: Path) -> list[str]:
    """Files of the kinds real folders hold beside good images: damaged ones (truncated, not
    an image, empty), and unusual modes and sizes (CMYK, grayscale, RGBA, 16-bit, large).
    Returns the names of the unreadable ones."""
    import io

    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rgb = np.random.default_rng(0).integers(0, 256, (40, 48, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, "JPEG")
    (folder / "truncated.jpg").write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 3])
    (folder / "not-an-image.jpg").write_bytes(b"this is not a picture\n" * 10)
    (folder / "empty.png").write_bytes(b"")
    Image.fromarray(rgb).convert("CMYK").save(folder / "cmyk.jpg")
    Image.fromarray(rgb[..., 0]).save(folder / "grayscale.jpg")
    Image.fromarray(np.dstack([rgb, rgb[..., :1]])).save(folder / "rgba.png")
    Image.fromarray(rgb[..., 0].astype(np.uint16) * 257).save(folder / "sixteen-bit.png")
    Image.fromarray(rgb).resize((3000, 2000)).save(folder / "huge.jpg")
    return ["truncated.jpg", "not-an-image.jpg", "empty.png"]


needs_fashion = pytest.mark.skipif(
    not (FASHION_SYSTEM_DIR / "train-images-idx3-ubyte.gz").is_file(),
    reason="Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)",
)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def summary_of(cfg: DictConfig) -> dict:
    import json

    return json.loads((Path(cfg.paths.output_dir) / "summary.json").read_text())
