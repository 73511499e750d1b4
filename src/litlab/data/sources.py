"""Image sources: where pixels and labels come from, and nothing else.

Every source yields uint8 images shaped [C, H, W] with integer labels. Sources that fit in
memory return a ``TensorDataset(images, labels)`` so that loaders can index whole batches.
Folders of image files (``ImageFolder``) live in litlab.data.folder.
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import os
import pickle
import socket
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from math import prod
from pathlib import Path
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, Subset, TensorDataset

from litlab.errors import ConfigError, DataError, first_line

log = logging.getLogger("litlab")

Split = Literal["train", "test"]


def fixed_split(n: int, fraction: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Split range(n) into (keep, held_out) with a fixed seed, so every run sees the same sets."""
    if not 0.0 < fraction < 1.0:
        raise ConfigError(f"a split fraction must lie strictly between 0 and 1, got {fraction}")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    held = max(1, round(n * fraction))
    return order[held:].sort().values, order[:held].sort().values


def stratified_indices(labels: torch.Tensor, n: int, seed: int = 0) -> torch.Tensor:
    """``n`` indices of ``labels`` (sorted), drawn at random within each class, with every class
    represented in proportion (largest remainders); all indices when ``n`` covers them all."""
    if n >= len(labels):
        return torch.arange(len(labels))
    generator = torch.Generator().manual_seed(seed)
    classes, counts = labels.unique(return_counts=True)
    quota = counts.double() * n / len(labels)
    take = quota.floor().long()
    by_remainder = torch.argsort(quota - take, descending=True, stable=True)
    take[by_remainder[: n - int(take.sum())]] += 1
    picks = []
    for label, k in zip(classes.tolist(), take.tolist(), strict=True):
        members = (labels == label).nonzero().flatten()
        picks.append(members[torch.randperm(len(members), generator=generator)[:k]])
    return torch.cat(picks).sort().values


def labels_of(dataset: Dataset) -> torch.Tensor:
    """All labels of a dataset, without decoding its images where it keeps them apart."""
    if isinstance(dataset, Subset):
        return labels_of(dataset.dataset)[torch.as_tensor(dataset.indices, dtype=torch.long)]
    if isinstance(dataset, TensorDataset):
        return dataset.tensors[1]
    targets = getattr(dataset, "targets", None)  # FileImages, torchvision's ImageFolder
    if targets is not None:
        return torch.as_tensor(targets, dtype=torch.long)
    return _read_labels(dataset)


# The labels of Datasets that keep none apart, read once per Dataset (by the object and its
# length: one that grew since is read again)
_READ_LABELS: weakref.WeakKeyDictionary[Dataset, torch.Tensor] = weakref.WeakKeyDictionary()


def _read_labels(dataset: Dataset) -> torch.Tensor:
    """Every sample's label of a Dataset of one's own without ``targets``, its images decoded
    too: once per Dataset, said, with a bar. The class count, a train_fraction and FID's
    subsets each read all of it again, in silence (a large one looked hung at setup)."""
    with contextlib.suppress(TypeError):  # (a Dataset that cannot be weakly referenced)
        read = _READ_LABELS.get(dataset)
        if read is not None and len(read) == len(dataset):
            return read.clone()  # (the caller's to change)
    from lightning.pytorch.utilities import rank_zero_only
    from rich.progress import Progress

    said = rank_zero_only.rank == 0
    if said:
        log.info(
            "reading all %d samples of %s for their labels, images too (once): it has no "
            "`targets`; a `targets` list of its labels, as torchvision's datasets have, "
            "skips this",
            len(dataset),
            type(dataset).__name__,
        )
    with Progress(transient=True, disable=not said) as progress:
        task = progress.add_task(f"labels of {type(dataset).__name__}", total=len(dataset))
        labels = []
        for i in range(len(dataset)):
            labels.append(int(dataset[i][1]))
            progress.advance(task)
    read = torch.tensor(labels, dtype=torch.long)
    with contextlib.suppress(TypeError):
        _READ_LABELS[dataset] = read.clone()
    return read


class Source(ABC):
    """Where the pixels and labels of one dataset come from."""

    name: str = "source"
    # The names the dataset publishes for its labels 0..N-1 (a digit's own, Fashion-MNIST's,
    # CIFAR-10's), which eval.py matches with an image folder's class names (a model trained
    # here holds none: a label is a number); None: the labels are numbers alone.
    label_names: ClassVar[tuple[str, ...] | None] = None

    @property
    def label(self) -> str:
        """Which data this is, for summary.json (runs' values compare on the same data only):
        the source's name, and the folder read where the name does not say it."""
        return self.name

    def prepare(self, test: bool = True) -> None:  # noqa: B027 - optional hook
        """Fetch files if needed; called once per node before any process loads, at every
        stage. ``test=False`` (a fit or validation that does not read the test split): work
        done for the test split alone (an image folder's decode) may wait for a later call with
        ``test=True``; what would stop the test (a missing file or folder) is still checked."""

    def known_classes(self) -> list[str] | None:
        """The class names, where known before ``prepare`` decodes anything (an image folder's
        class folders, from a scan); None where not."""
        return None

    def check_class_files(self) -> None:  # noqa: B027 - optional hook
        """Refuse classes that ``known_classes`` counts but no image stands for (an image
        folder's empty class folder), before the class count is compared; nothing here."""

    @abstractmethod
    def load(self, split: Split) -> Dataset:
        """Return the split as a dataset of (uint8 [C, H, W] image, int label)."""

    def validation_split(
        self, train: Dataset, fraction: float, seed: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(kept, validation) indices of the training split: a fixed draw of ``fraction`` by
        ``seed``, the same in every run (the source's images do not change between runs)."""
        return fixed_split(len(train), fraction, seed)

    def given_validation(self) -> Dataset | None:
        """A validation split of the source's own (a folder's val/ beside train/ and test/),
        taken instead of ``validation_split``'s share of the training split; None: none."""
        return None


class Digits(Source):
    """scikit-learn's bundled 8x8 handwritten digits, upsampled: works anywhere, no download."""

    name = "digits"
    label_names = tuple(map(str, range(10)))

    def __init__(self, size: int = 28, test_fraction: float = 0.2) -> None:
        if size < 8:
            raise ConfigError(f"size must be at least 8 (the digits are 8x8), got {size}")
        self.size = size
        self.test_fraction = test_fraction

    def load(self, split: Split) -> TensorDataset:
        from sklearn.datasets import load_digits

        digits = load_digits()
        pixels = torch.as_tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
        pixels = F.interpolate(
            pixels, size=(self.size, self.size), mode="bilinear", align_corners=False
        )
        images = (pixels.clamp(0, 1) * 255).round().to(torch.uint8)
        labels = torch.as_tensor(digits.target, dtype=torch.long)
        train, test = fixed_split(len(labels), self.test_fraction)
        index = train if split == "train" else test
        return TensorDataset(images[index], labels[index])


def read_idx(path: Path) -> torch.Tensor:
    """Read an IDX ubyte file (MNIST format), plain or gzip-compressed."""
    try:
        with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as e:
        raise DataError(f"cannot read {path} ({e}); delete it and fetch the file again") from e
    if len(data) < 4 or data[:3] != b"\x00\x00\x08":
        raise DataError(f"{path} is not an IDX ubyte file; delete it and fetch the file again")
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    payload = memoryview(data)[4 + 4 * ndim :]
    if len(payload) != prod(dims):
        raise DataError(
            f"{path} holds {len(payload)} bytes where its header promises {prod(dims)}: "
            "the file is truncated or corrupt; delete it and fetch it again"
        )
    return torch.frombuffer(bytearray(payload), dtype=torch.uint8).reshape(dims)


DOWNLOAD_WAIT_S = 20 * 60  # the longest a job waits for another's download (< DDP's 30-min timeout)
DOWNLOAD_STALL_S = 120  # a download that receives nothing for this long fails


@contextmanager
def one_download_at_a_time(folder: Path, name: str) -> Iterator[Callable[[], None]]:
    """Hold ``folder/.<name>.download.lock`` while a dataset's files are looked for and, if
    missing, downloaded into ``folder``; a download stalled for DOWNLOAD_STALL_S fails. Gives
    the function to call before downloading: it warns where the folder could not be locked.

    A sweep's jobs start at once, on one machine or on hosts sharing the folder, and torchvision
    writes and extracts its files in place: each job's download truncated the files another was
    writing or checking, and a job could take another's half-written file as found. A folder
    this process cannot write to (a read-only dataset mount) is only read."""
    from filelock import FileLock, Timeout

    with contextlib.suppress(OSError):
        folder.mkdir(parents=True, exist_ok=True)
    unlocked = ""  # why not, where the folder could not be locked

    def before_download() -> None:
        if unlocked:
            log.warning(
                "%s: downloading without a lock (%s): jobs starting at once may download over "
                "each other",
                name,
                unlocked,
            )

    if not os.access(folder, os.W_OK):
        yield before_download  # nothing can be downloaded into it: only read
        return
    path = folder / f".{name}.download.lock"
    lock: FileLock | None = FileLock(str(path), mode=0o666)  # hosts' and users' jobs share it
    try:
        try:
            lock.acquire(timeout=0)
        except Timeout:
            log.info("%s: waiting for another process holding %s (fetching the files)", name, path)
            try:
                lock.acquire(timeout=DOWNLOAD_WAIT_S)
            except Timeout:
                raise DataError(
                    f"another process has held {path} for {DOWNLOAD_WAIT_S // 60} minutes while "
                    f"fetching {name} (a stalled download?); stop it, or put the files in {folder}"
                ) from None
    except OSError as e:  # e.g. a file system without locks (NFS without lockd)
        unlocked, lock = f"{path}: {first_line(str(e))}", None
    stall = socket.getdefaulttimeout()
    socket.setdefaulttimeout(DOWNLOAD_STALL_S)  # torchvision's download sets no timeout
    try:
        yield before_download
    finally:
        socket.setdefaulttimeout(stall)
        if lock is not None:
            lock.release()


# Each class's number of images in the published files. MNIST's and Fashion-MNIST's files have
# the same four names, so one data_dir may hold either: the labels tell them apart.
MNIST_COUNTS = {
    "train": (5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949),
    "test": (980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009),
}
FASHION_MNIST_COUNTS = {"train": (6000,) * 10, "test": (1000,) * 10}


class _IDXSource(Source):
    """A dataset published as four IDX files (MNIST and Fashion-MNIST)."""

    torchvision_name: str
    # The other dataset with the same file names: its name, and its labels' class counts
    lookalike: ClassVar[tuple[str, dict[str, tuple[int, ...]]]]
    files: ClassVar[dict[str, tuple[str, str]]] = {
        "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
        "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
    }

    def __init__(self, data_dir: str, download: bool = True, system_dir: str | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.download = download
        self.system_dir = system_dir
        self._judged: dict[Path, bool] = {}  # folder: whether it holds the look-alike's files

    def _candidates(self) -> list[Path]:
        own = [self.data_dir, self.data_dir / self.torchvision_name / "raw"]
        return own + ([Path(self.system_dir)] if self.system_dir else [])

    @staticmethod
    def _file(folder: Path, stem: str) -> Path | None:
        """``folder``'s file of ``stem``, .gz or plain; None if it has neither."""
        return next((p for p in (folder / stem, folder / f"{stem}.gz") if p.is_file()), None)

    def _passed_over(self, folder: Path) -> bool:
        """Whether ``folder`` holds the look-alike's files: every label file it has counts each
        class as the other dataset's published file does (judged once a folder)."""
        if folder not in self._judged:
            counts = self.lookalike[1]
            labels = {split: self._file(folder, pair[1]) for split, pair in self.files.items()}
            judged = [
                tuple(torch.bincount(read_idx(path).long()).tolist()) == counts[split]
                for split, path in labels.items()
                if path is not None
            ]
            self._judged[folder] = bool(judged) and all(judged)
            if self._judged[folder]:
                log.warning(
                    "%s holds %s files (the same names), not %s's: passed over",
                    folder,
                    self.lookalike[0],
                    self.name,
                )
        return self._judged[folder]

    def _find(self, stem: str) -> Path | None:
        """The first candidate folder's file of ``stem``, passing over a folder that holds the
        look-alike's (data=mnist read Fashion-MNIST from a shared data_dir unawares)."""
        for folder in self._candidates():
            path = self._file(folder, stem)
            if path is not None and not self._passed_over(folder):
                return path
        return None

    def _found(self) -> bool:
        return all(self._find(stem) for pair in self.files.values() for stem in pair)

    @property
    def report(self) -> dict[str, str]:
        """For summary.json: the folder whose files were read (data_dir, its torchvision
        folder, or the system's copy: a data_dir given wrong fell back to it unsaid: 176)."""
        image = self._find(self.files["train"][0])
        return {"read_from": str(image.parent)} if image is not None else {}

    def _say_where(self, given: bool) -> None:
        read = self.report.get("read_from")
        if read and not getattr(self, "_said_where", False):
            self._said_where = True
            missing = "" if given else f" (data.source.data_dir={self.data_dir} does not exist)"
            log.info("%s: reading the files in %s%s", self.name, read, missing)

    def prepare(self, test: bool = True) -> None:
        given = self.data_dir.is_dir()  # (before the download lock's folder is made there)
        with one_download_at_a_time(self.data_dir, self.name) as before_download:
            if self._found():
                self._say_where(given)
                return
            if not self.download:
                raise DataError(self._not_found("download is off (data.source.download=false)"))
            before_download()
            import torchvision

            try:
                dataset = getattr(torchvision.datasets, self.torchvision_name)
                dataset(str(self.data_dir), download=True)
            except Exception as e:  # any network or disk failure: report all the ways in one line
                reason = " ".join(str(e).split())  # torchvision lists each mirror on its own line
                raise DataError(self._not_found(f"download failed: {reason}")) from e

    def _not_found(self, why: str) -> str:
        places = ", ".join(str(p) for p in self._candidates())
        own = self.data_dir / self.torchvision_name / "raw"
        ways = [f"put the four IDX files (.gz or plain) in {own}"]
        if self.system_dir:
            ways.append(f"install the system copy ({self.system_dir})")
        ways.append(
            "retry the download (needs internet)"
            if self.download
            else "allow the torchvision download (data.source.download=true, needs internet)"
        )
        others = "".join(
            f" ({folder} holds {self.lookalike[0]} files)"
            for folder, passed in sorted(self._judged.items())
            if passed
        )
        return f"{self.name} files not found in {places}{others} and {why}; {', or '.join(ways)}"

    def load(self, split: Split) -> TensorDataset:
        image_path, label_path = (self._find(stem) for stem in self.files[split])
        if image_path is None or label_path is None:
            raise DataError(self._not_found("they were not fetched (prepare_data did not run)"))
        images, labels = read_idx(image_path), read_idx(label_path)
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise DataError(
                f"{image_path} and {label_path} do not match ({tuple(images.shape)} images, "
                f"{tuple(labels.shape)} labels); fetch both files again"
            )
        return TensorDataset(images.unsqueeze(1).contiguous(), labels.long())


class FashionMNIST(_IDXSource):
    """Zalando's Fashion-MNIST: data_dir, then Debian's dataset-fashion-mnist, then download."""

    name = "fashion_mnist"
    label_names = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt")
    label_names += ("Sneaker", "Bag", "Ankle boot")  # (torchvision's FashionMNIST.classes)
    torchvision_name = "FashionMNIST"
    lookalike = ("MNIST's", MNIST_COUNTS)

    def __init__(
        self,
        data_dir: str,
        download: bool = True,
        system_dir: str | None = "/usr/share/datasets/fashion-mnist",
    ) -> None:
        super().__init__(data_dir, download, system_dir)


class MNIST(_IDXSource):
    """LeCun's MNIST digits: data_dir, then torchvision's download."""

    name = "mnist"
    label_names = tuple(map(str, range(10)))
    torchvision_name = "MNIST"
    lookalike = ("Fashion-MNIST's", FASHION_MNIST_COUNTS)


class CIFAR10(Source):
    """CIFAR-10 in its python pickle batches (cifar-10-batches-py), downloaded by torchvision."""

    name = "cifar10"
    label_names = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse")
    label_names += ("ship", "truck")  # (its batches.meta, as torchvision's CIFAR10.classes)
    folder = "cifar-10-batches-py"
    batches: ClassVar[dict[str, list[str]]] = {
        "train": [f"data_batch_{i}" for i in range(1, 6)],
        "test": ["test_batch"],
    }

    def __init__(self, data_dir: str, download: bool = True) -> None:
        self.root = Path(data_dir) / self.folder
        self.download = download

    def prepare(self, test: bool = True) -> None:
        with one_download_at_a_time(self.root.parent, self.name) as before_download:
            if all((self.root / b).is_file() for names in self.batches.values() for b in names):
                return
            hint = (
                f"CIFAR-10 batches not found in {self.root}: put the extracted cifar-10-batches-py "
                "folder in data.source.data_dir or allow the download (data.source.download=true)"
            )
            if not self.download:
                raise DataError(hint)
            before_download()
            import torchvision

            try:
                torchvision.datasets.CIFAR10(str(self.root.parent), download=True)
            except Exception as e:
                raise DataError(f"{hint}; download failed: {e}") from e

    def load(self, split: Split) -> TensorDataset:
        images, labels = [], []
        for name in self.batches[split]:
            path = self.root / name
            try:
                with open(path, "rb") as f:
                    batch = pickle.load(f, encoding="latin1")
                images.append(
                    torch.as_tensor(batch["data"], dtype=torch.uint8).reshape(-1, 3, 32, 32)
                )
                labels.append(torch.as_tensor(batch["labels"], dtype=torch.long))
            except FileNotFoundError as e:
                raise DataError(
                    f"{path} is missing; fetch CIFAR-10 again (data.source.download=true)"
                ) from e
            except Exception as e:  # a truncated or foreign pickle fails in many ways
                # prepare() sees only that the files exist: a damaged one must go to be fetched
                raise DataError(
                    f"{path} is not a readable CIFAR-10 batch ({e}); delete it and run again "
                    "with data.source.download=true to fetch it again"
                ) from e
        return TensorDataset(torch.cat(images), torch.cat(labels))


class Synthetic(Source):
    """Random images of any shape: one fixed random prototype per class plus noise, so it is learnable."""

    name = "synthetic"

    def __init__(
        self,
        image_shape: Sequence[int] = (3, 32, 32),
        num_classes: int = 10,
        train_size: int = 1024,
        test_size: int = 256,
        seed: int = 0,
    ) -> None:
        if len(image_shape) != 3 or min(image_shape) < 1:
            raise ConfigError(
                f"image_shape must be [C, H, W] with positive sizes, got {list(image_shape)}"
            )
        if num_classes < 1 or train_size < 1 or test_size < 1:
            raise ConfigError("num_classes, train_size and test_size must be positive")
        self.image_shape = tuple(image_shape)
        self.num_classes = num_classes
        self.sizes = {"train": train_size, "test": test_size}
        self.seed = seed

    def load(self, split: Split) -> TensorDataset:
        # 16-bit draws: the sum of two fits, and the temporaries of an ImageNet-sized set are a
        # quarter of int64's (3 GB instead of 12 for 2,000 images of 3 x 224 x 224)
        g = torch.Generator().manual_seed(self.seed)
        shape = (self.num_classes, *self.image_shape)
        prototypes = torch.randint(0, 256, shape, generator=g, dtype=torch.int16)
        g.manual_seed(self.seed + (1 if split == "train" else 2))
        n = self.sizes[split]
        labels = torch.randint(0, self.num_classes, (n,), generator=g)
        noise = torch.randint(0, 256, (n, *self.image_shape), generator=g, dtype=torch.int16)
        images = noise.add_(prototypes[labels]).div_(2, rounding_mode="floor").to(torch.uint8)
        return TensorDataset(images, labels)
