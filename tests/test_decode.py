"""data.source.decode=device: JPEGs travel encoded from the loader's workers and are decoded a
whole batch at a time on the run's device (litlab.data.decode). On a CPU the same code runs
with libjpeg-turbo; the CUDA tests (nvJPEG) run in the GPU tier."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from PIL import Image

from conftest import QUIET_CSV, make_cfg, needs_cuda, summary_of, write_unusual_images
from litlab.data import DataModule, ImageFolder
from litlab.data.decode import (
    Encoded,
    all_unreadable,
    decode,
    kept,
    skip_unreadable,
    stack_samples,
)
from litlab.data.pixels import Unreadable, load_image, worker_item
from litlab.data.sources import Synthetic
from litlab.errors import ConfigError, DataError
from litlab.train import train_task

SIZES = [(40, 48), (64, 40), (90, 90), (33, 71), (120, 80), (48, 40)]


def smooth_picture(h: int, w: int, seed: int) -> np.ndarray:
    """A photo-like RGB picture (smooth shapes, no pixel noise, which JPEG would smear)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w] / max(h, w)
    freq, phase = rng.uniform(2, 6, (3, 2)), rng.uniform(0, 6, 3)
    waves = [np.sin(freq[c, 0] * 6 * x + phase[c]) * np.cos(freq[c, 1] * 6 * y) for c in range(3)]
    return (128 + 100 * np.stack(waves, -1)).clip(0, 255).astype(np.uint8)


def write_jpeg_folder(root: Path, per_class: int = 6) -> list[Path]:
    paths = []
    for c, name in enumerate(("cat", "dog")):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            h, w = SIZES[i % len(SIZES)]
            path = root / name / f"{i}.jpg"
            Image.fromarray(smooth_picture(h, w, 10 * c + i)).save(path, quality=95)
            paths.append(path)
    return paths


def pil_centre_square(path: Path, size: int) -> np.ndarray:
    """The centre square of the shorter side, resized bicubic with antialiasing by PIL (no
    JPEG draft shortcut): what the device path computes."""
    with Image.open(path) as image:
        image = image.convert("RGB")
        w, h = image.size
        side = min(w, h)
        box = ((w - side) // 2, (h - side) // 2, (w - side) // 2 + side, (h - side) // 2 + side)
        resized = image.resize((size, size), Image.Resampling.BICUBIC, box=box)
    return np.asarray(resized).transpose(2, 0, 1)


def test_a_batch_of_jpegs_decodes_to_the_centre_squares_the_workers_make(tmp_path):
    paths = write_jpeg_folder(tmp_path)
    items = [worker_item(p.read_bytes(), 32, 3) for p in paths]
    assert all(item.dim() == 1 for item in items)  # JPEGs stay encoded in the workers
    images, keep = decode(Encoded(items), 32, 3, "cpu")
    assert images.shape == (len(paths), 3, 32, 32) and images.dtype == torch.uint8
    assert keep.all()
    exact = torch.from_numpy(np.stack([pil_centre_square(p, 32) for p in paths])).float()
    assert (images.float() - exact).abs().mean() < 0.5  # the same resize as PIL's
    # the workers' PIL path decodes JPEGs at reduced scale first: close, not equal
    workers = torch.from_numpy(np.stack([load_image(p, 32, 3) for p in paths])).float()
    assert (images.float() - workers).abs().mean() < 3.0
    # a one-pixel shift of the square, or swapped channels, is far from it
    assert (images.float().roll(1, dims=3) - exact).abs().mean() > 2.0
    assert (images.float().flip(1) - exact).abs().mean() > 10.0


def test_workers_leave_only_whole_rgb_and_gray_jpegs_encoded(tmp_path, monkeypatch):
    """The rest is decoded (or refused) in the workers by PIL: other formats, CMYK (nvJPEG
    refuses some), a JPEG without its end (truncated), and images past PIL's bomb guard."""
    write_unusual_images(tmp_path)
    kinds = {}
    for path in sorted(tmp_path.iterdir()):
        try:
            kinds[path.name] = (
                "bytes" if worker_item(path.read_bytes(), 20, 3).dim() == 1 else "pixels"
            )
        except Exception:
            kinds[path.name] = "refused"
    assert kinds == {
        "cmyk.jpg": "pixels",
        "empty.png": "refused",
        "grayscale.jpg": "bytes",
        "huge.jpg": "bytes",
        "not-an-image.jpg": "refused",
        "rgba.png": "pixels",
        "sixteen-bit.png": "pixels",
        "truncated.jpg": "refused",
    }
    cmyk = worker_item((tmp_path / "cmyk.jpg").read_bytes(), 20, 3).float()
    reference = torch.from_numpy(pil_centre_square(tmp_path / "cmyk.jpg", 20)).float()
    assert (255 - cmyk - reference).abs().mean() > 30.0  # not inverted ink
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # the 40x48 JPEG is now a "bomb"
    with pytest.raises((Image.DecompressionBombError, Image.DecompressionBombWarning)):
        worker_item((tmp_path / "grayscale.jpg").read_bytes(), 20, 3)


def corrupt_huffman_tables(jpeg: bytes) -> bytes:
    """A JPEG with a whole header and end marker whose Huffman table cannot be decoded."""
    bad = bytearray(jpeg)
    at = bad.find(b"\xff\xc4")
    bad[at + 5 : at + 21] = b"\xff" * 16
    return bytes(bad)


def test_a_jpeg_that_fails_the_batch_is_found_skipped_and_the_rest_keep_their_places(tmp_path):
    paths = write_jpeg_folder(tmp_path, per_class=3)
    data = [p.read_bytes() for p in paths]
    data.insert(3, corrupt_huffman_tables(data[0]))
    items = [worker_item(d, 24, 3) for d in data]
    assert all(item.dim() == 1 for item in items)  # its header passes: the decoder finds it
    with pytest.warns(UserWarning, match="does not decode"):
        images, keep = decode(Encoded(items), 24, 3, "cpu")
    assert keep.tolist() == [True, True, True, False, True, True, True]
    alone = torch.cat([decode(Encoded([i]), 24, 3, "cpu")[0] for i in items[:3] + items[4:]])
    assert torch.equal(images, alone)  # each picture in its place
    labels = kept(torch.arange(7), keep)
    assert labels.tolist() == [0, 1, 2, 4, 5, 6]


def test_a_jpeg_the_device_cannot_decode_is_counted_once_by_its_file(tmp_path):
    """A JPEG whole enough for the workers to hand on as bytes that no decoder reads: the
    run's count of unreadable files names it, once over every pass (two here)."""
    paths = write_jpeg_folder(tmp_path / "images", per_class=8)
    broken = paths[3]  # cat/3.jpg, a test image (held out by its name)
    broken.write_bytes(corrupt_huffman_tables(broken.read_bytes()))
    source = ImageFolder(str(tmp_path / "images"), size=24, cache=False, decode="device")
    dm = DataModule(
        source, [3, 24, 24], 2, [0.5], [0.25], batch_size=4, num_workers=0, loader="auto",
        val_fraction=0.25,
    )  # fmt: skip
    dm.setup()
    seen = 0
    for _ in range(2):
        for split in ("fit", "val", "test"):
            loader = dm._loader(split, train=split == "fit", batch_size=4)
            for batch in loader:
                _, labels = dm.ready(batch, train=split == "fit")
                seen += len(labels)
    assert dm.unreadable == {str(broken)} and dm.report()["skipped_while_loading"] == 1
    assert seen == 2 * (8 + 3 + 2)  # fit: 2 whole batches of its 10; val 3; test 3 less 1


def test_split_samples_for_metrics_decode_jpegs_and_drop_what_does_not_decode(tmp_path, caplog):
    paths = write_jpeg_folder(tmp_path, per_class=3)
    # as a dataset read as it goes hands them on: (JPEG bytes, label, file)
    samples = [(worker_item(p.read_bytes(), 16, 3), i, str(p)) for i, p in enumerate(paths)]
    samples[2] = (
        torch.frombuffer(
            bytearray(corrupt_huffman_tables(paths[2].read_bytes())), dtype=torch.uint8
        ),
        2,
        str(paths[2]),
    )
    samples[4] = Unreadable(str(paths[4]), "OSError: truncated")  # unreadable in the worker
    with pytest.warns(UserWarning, match="does not decode"), caplog.at_level("WARNING"):
        images, labels = stack_samples(samples, (3, 16, 16), chunk=2)
    # the worker's unreadable file said (workers no longer warn: the run says each once)
    assert (
        f"skipped 1 unreadable image(s) of 6, e.g. {paths[4]} (OSError: truncated)" in caplog.text
    )
    assert images.shape == (4, 3, 16, 16) and labels.tolist() == [0, 1, 3, 5]
    for image, label in zip(images, labels.tolist(), strict=True):
        assert torch.equal(image, decode(Encoded([samples[label][0]]), 16, 3, "cpu")[0][0])


def test_gray_runs_decode_jpegs_to_one_channel(tmp_path):
    paths = write_jpeg_folder(tmp_path, per_class=2)
    images, keep = decode(
        Encoded([worker_item(p.read_bytes(), 16, 1) for p in paths]), 16, 1, "cpu"
    )
    assert images.shape == (4, 1, 16, 16) and keep.all()
    gray = np.stack([load_image(p, 16, 1) for p in paths])
    assert (images.float() - torch.from_numpy(gray).float()).abs().mean() < 4.0


def test_pinning_leaves_an_encoded_batch_as_it_is():
    from torch.utils.data._utils.pin_memory import pin_memory

    batch = Encoded([torch.zeros(5, dtype=torch.uint8)])
    assert pin_memory(batch) is batch


def test_the_datamodule_decodes_after_the_transfer_and_sees_the_workers_pictures(tmp_path):
    write_jpeg_folder(tmp_path / "images", per_class=8)

    def datamodule(decode_where: str) -> DataModule:
        source = ImageFolder(str(tmp_path / "images"), size=24, cache=False, decode=decode_where)
        dm = DataModule(
            source, [3, 24, 24], 2, [0.5], [0.25], batch_size=4, eval_batch_size=4, loader="auto"
        )
        dm.setup()
        return dm

    device, workers = datamodule("device"), datamodule("workers")
    batch = next(iter(device.test_dataloader()))
    assert isinstance(batch[0], Encoded)  # the workers only read the files
    batch = move_data_to_device(batch, "cpu")  # what Lightning does before the hook
    assert isinstance(batch[0], Encoded)
    images, labels = device.on_after_batch_transfer(batch, 0)
    first = next(iter(workers.test_dataloader()))
    reference, same_labels = workers.on_after_batch_transfer(first, 0)
    assert images.shape == reference.shape == (3, 3, 24, 24) and torch.equal(labels, same_labels)
    assert (images - reference).abs().mean() * 0.25 * 255 < 3.0  # in pixel levels
    # metrics that read a split's images (FID's real statistics) get pixels, not bytes
    pixels, _ = device.arrays("test", limit=3)
    assert pixels.shape == (3, 3, 24, 24) and pixels.dtype == torch.uint8


def test_decode_device_is_for_files_read_as_they_go(tmp_path):
    with pytest.raises(ConfigError, match="cache=false"):
        ImageFolder(str(tmp_path), size=24, cache=True, decode="device")
    with pytest.raises(ConfigError, match="'workers' or 'device'"):
        ImageFolder(str(tmp_path), size=24, cache=False, decode="gpu")


def test_a_batch_of_pixels_only_is_collated_as_before():
    pixels = [
        (torch.zeros(3, 8, 8, dtype=torch.uint8), 1),
        Unreadable("a/b.png"),
        (torch.ones(3, 8, 8).byte(), 0),
    ]
    images, labels, skipped = skip_unreadable(pixels)
    assert (
        images.shape == (2, 3, 8, 8)
        and labels.tolist() == [1, 0]
        and [u.file for u in skipped] == ["a/b.png"]
    )


@pytest.mark.gpu
@needs_cuda
def test_nvjpeg_decodes_a_batch_as_the_cpu_does_and_refuses_what_the_cpu_refuses(tmp_path):
    paths = write_jpeg_folder(tmp_path / "good")
    write_unusual_images(tmp_path / "odd")
    progressive = tmp_path / "progressive.jpg"
    Image.open(paths[0]).save(progressive, progressive=True)
    odd = [tmp_path / "odd" / n for n in ("grayscale.jpg", "huge.jpg")] + [progressive]
    data = [p.read_bytes() for p in [*paths, *odd]]
    data.insert(4, corrupt_huffman_tables(data[0]))
    for channels in (3, 1):
        items = [worker_item(d, 32, channels) for d in data]
        assert all(item.dim() == 1 for item in items)
        on_gpu, keep_gpu = decode(Encoded(items), 32, channels, "cuda")
        on_cpu, keep_cpu = decode(Encoded(items), 32, channels, "cpu")
        assert on_gpu.is_cuda and torch.equal(keep_gpu, keep_cpu) and not keep_gpu[4]
        # nvJPEG's IDCT and colour conversion differ from libjpeg-turbo's by a level or so
        per_image = (on_gpu.cpu().float() - on_cpu.float()).abs().mean(dim=(1, 2, 3))
        assert per_image.max() < 2.0, per_image


@pytest.mark.gpu
@needs_cuda
def test_a_gpu_run_decodes_a_jpeg_folder_on_the_gpu_to_the_end(tmp_path):
    """The whole path as users run it: JPEG bytes from the workers, Lightning's transfer to
    the GPU, nvJPEG, crops and training; damaged files skipped and counted."""
    write_jpeg_folder(tmp_path / "images", per_class=40)
    write_unusual_images(tmp_path / "images" / "dog")
    cfg = make_cfg(
        tmp_path,
        [
            "data=image_folder",
            f"data.source.root={tmp_path / 'images'}",
            "data.source.cache=false",
            "data.source.decode=device",
            "data.source.size=36",
            "data.num_classes=2",
            "data.batch_size=8",
            "data.num_workers=2",
            "model.net.width=8",
            "trainer=gpu",
            "trainer.max_epochs=2",
            *QUIET_CSV,
        ],
    )
    train_task(cfg)
    summary = summary_of(cfg)
    assert summary["status"] == "completed" and "test/acc" in summary["metrics"]
    # each file once, however many passes read it (a training file that drop_last left out
    # of both epochs is never read)
    assert 0 < summary["data"]["skipped_while_loading"] <= 3


def test_an_empty_training_batch_is_one_clear_line_on_several_ranks():
    """Ranks of a multi-process fit cannot skip a training step (each is a collective)."""
    labels = torch.empty(0, dtype=torch.long)
    one = SimpleNamespace(world_size=1, global_rank=0)
    two = SimpleNamespace(world_size=2, global_rank=1)
    assert all_unreadable(labels, one)
    assert not all_unreadable(torch.zeros(3, dtype=torch.long), two)
    with pytest.raises(DataError, match=r"on rank 1 was unreadable.*litlab\.data\.check"):
        all_unreadable(labels, two)


@pytest.mark.parametrize("orientation", [3, 6, 8])  # turned 180, 90 one way and the other
def test_photos_stored_turned_are_seen_upright_by_every_path(tmp_path, orientation):
    """A phone photo stored on its side with an EXIF orientation (as viewers show it: upright)
    was learnt, and tested, lying on its side: now upright in the cache and the workers' path,
    handed decoded (not as bytes) to a device decoder, which ignores EXIF, and upright in a
    stream converted with --max-side (whose re-encoded JPEG drops EXIF)."""
    from PIL import ExifTags

    from litlab.data.optimize import encode

    picture = Image.fromarray(smooth_picture(48, 64, 3))
    # stored as the camera wrote it: the orientation tag says how to turn it back
    stored = picture.transpose(
        {
            3: Image.Transpose.ROTATE_180,
            6: Image.Transpose.ROTATE_90,
            8: Image.Transpose.ROTATE_270,
        }[orientation]
    )
    exif = Image.Exif()
    exif[ExifTags.Base.Orientation] = orientation
    stored.save(tmp_path / "turned.jpg", quality=95, exif=exif)
    picture.save(tmp_path / "upright.jpg", quality=95)
    stored.save(tmp_path / "as-stored.jpg", quality=95)

    def seen(path: Path) -> torch.Tensor:
        return torch.from_numpy(load_image(path, 32, 3)).float()

    turned, upright, as_stored = (
        seen(tmp_path / n) for n in ("turned.jpg", "upright.jpg", "as-stored.jpg")
    )
    assert (turned - upright).abs().mean() < 2.0
    assert (turned - as_stored).abs().mean() > 10.0  # what it learnt before
    item = worker_item((tmp_path / "turned.jpg").read_bytes(), 32, 3)
    assert item.shape == (3, 32, 32) and torch.equal(item.float(), turned)
    assert worker_item((tmp_path / "upright.jpg").read_bytes(), 32, 3).dim() == 1  # still bytes

    def streamed(name: str) -> torch.Tensor:  # converted with --max-side 40, then decoded
        (sample,) = encode((str(tmp_path / name), 0, name), max_side=40, quality=95)
        assert worker_item(sample["image"], 32, 3).dim() == 1  # re-encoded, without EXIF: bytes
        return torch.from_numpy(load_image(io.BytesIO(sample["image"]), 32, 3)).float()

    turned, upright, as_stored = (
        streamed(n) for n in ("turned.jpg", "upright.jpg", "as-stored.jpg")
    )
    assert (turned - upright).abs().mean() < 2.0
    assert (turned - as_stored).abs().mean() > 10.0


def test_workers_that_read_files_are_not_forked_from_the_training_process(tmp_path):
    """Python 3.11 can leave a worker forked from a process with threads (the last pass's queue
    feeders ending) waiting forever in PyOS_AfterFork_Child: a DDP rank hung at a new pass, here
    and in a review. File readers start from a forkserver (one thread); the workers still hand
    over the same batches. In-memory data keeps fork (a worker would get a copy of it)."""
    import os

    write_jpeg_folder(tmp_path / "images", per_class=8)
    source = ImageFolder(str(tmp_path / "images"), size=24, cache=False)
    dm = DataModule(
        source,
        [3, 24, 24],
        2,
        [0.5],
        [0.25],
        batch_size=4,
        eval_batch_size=4,
        num_workers=1,
        loader="auto",
    )
    dm.setup()
    loader = dm.test_dataloader()
    assert loader.multiprocessing_context.get_start_method() == "forkserver"
    images, labels, skipped = next(iter(loader))
    reference = [source.load("test")[i] for i in range(len(labels))]  # in order
    assert torch.equal(images, torch.stack([image for image, _ in reference]))
    assert labels.tolist() == [label for _, label in reference] and skipped == []
    (worker,) = loader._iterator._workers  # persistent: still there
    status = Path(f"/proc/{worker.pid}/status").read_text()
    parent = int(status.split("PPid:")[1].split()[0])
    assert parent != os.getpid()  # the forkserver's child, not ours
    in_memory = DataModule(
        Synthetic((1, 8, 8), train_size=64, test_size=16), [1, 8, 8], 10, [0.5], [0.25],
        batch_size=8, loader="dataloader", num_workers=1,
    )  # fmt: skip
    in_memory.setup()
    assert in_memory.test_dataloader().multiprocessing_context is None


def test_a_reader_worker_finds_what_the_main_script_imports_already_imported(tmp_path):
    """multiprocessing runs the main script (as __mp_main__) in every worker it starts, and
    train.py imports everything a run needs (Hydra, torch-fidelity, ...). The readers' forkserver imports
    it once for all its workers; before, each worker imported it at every pass (a stream's
    workers are not persistent). Three loaders of one worker each, in a script as train.py."""
    write_jpeg_folder(tmp_path / "images", per_class=4)
    runs = tmp_path / "runs.txt"
    script = tmp_path / "script.py"
    script.write_text(
        f"""import os, sys
with open({str(runs)!r}, "a") as f:
    f.write(f"{{__name__}} {{'litlab.train' in sys.modules}}\\n")
from litlab.train import main
from litlab.data import DataModule, ImageFolder

if __name__ == "__main__":
    source = ImageFolder({str(tmp_path / "images")!r}, size=16, cache=False)
    dm = DataModule(source, [3, 16, 16], 2, [0.5], [0.25], batch_size=2, eval_batch_size=2,
                    num_workers=1, loader="auto")
    dm.setup()
    for _ in range(3):
        loader = dm.test_dataloader()
        assert loader.multiprocessing_context.get_start_method() == "forkserver"
        assert len(list(loader)) == len(loader) > 0
"""
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = runs.read_text().splitlines()
    assert runs == ["__main__ False"] + ["__mp_main__ True"] * 3, runs
