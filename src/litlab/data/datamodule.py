"""The one image DataModule: splits, transforms, loaders and the image shape models read."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any, Literal

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset, TensorDataset

from litlab.compat import epoch_to_train
from litlab.data.decode import Encoded, decode, kept, skip_unreadable, stack_samples
from litlab.data.fingerprint import copies_sentence
from litlab.data.folder import FileImages
from litlab.data.folder_index import encoding_hint, file_names
from litlab.data.loader import DeviceLoader, ResumableDataLoader, ShardSampler, reader_context
from litlab.data.pixels import Unreadable
from litlab.data.sources import Source, labels_of, stratified_indices
from litlab.data.transforms import BatchTransform
from litlab.distributed.agree import largest_on_any_rank
from litlab.distributed.strategy import forward_is_collective
from litlab.errors import ConfigError, DataError

log = logging.getLogger(__name__)
LoaderKind = Literal["auto", "device", "dataloader"]


def _in_memory(dataset: Dataset) -> bool:
    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    return isinstance(dataset, TensorDataset)


def _file_images(dataset: Dataset) -> FileImages | None:
    """The FileImages under a dataset (or Subsets of one), else None."""
    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    return dataset if isinstance(dataset, FileImages) else None


def _reads_files(dataset: Dataset) -> bool:
    return _file_images(dataset) is not None


def part_of_a_split(limit: float | int | None) -> bool:
    """Whether a trainer.limit_*_batches evaluates part of its split: a fraction below 1, or a
    number of batches (an int, or a whole float above 1, as Lightning reads it); 1.0 is all of
    it and 0 none."""
    return limit is not None and limit != 0 and not (isinstance(limit, float) and limit == 1.0)


def _run_seed() -> int:
    """The run's seed (Lightning's seed_everything sets it for every rank), 0 outside a run."""
    return int(os.environ.get("PL_GLOBAL_SEED", 0))


def _streams(dataset: Dataset) -> bool:
    """A dataset read as a stream (LitData's StreamingDataset), not indexed by a sampler."""
    return isinstance(dataset, IterableDataset)


def _images(dataset: Dataset) -> int:
    """Images in a split, all ranks' (a stream's len() is this rank's share)."""
    return dataset.images if _streams(dataset) else len(dataset)


def _sample_shape(dataset: Dataset) -> tuple[int, ...]:
    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    if isinstance(dataset, TensorDataset):
        return tuple(dataset.tensors[0].shape[1:])
    shape = getattr(dataset, "sample_shape", None)  # sources that decode files as they go
    return tuple(shape) if shape is not None else tuple(dataset[0][0].shape)


def _sample_problem(dataset: Dataset, want: Sequence[int]) -> str | None:
    """What is wrong with the images and labels a source's ``load`` returned, where they are
    not uint8 [C, H, W] pixels and integer labels (a source of one's own; walkthrough 173: a
    float or [N, H, W] array reached the loader's check or an IndexError); None: nothing."""
    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    if isinstance(dataset, TensorDataset):
        if len(dataset.tensors) != 2:
            return f"{len(dataset.tensors)} tensors, not (images, labels)"
        images, labels = dataset.tensors
        if labels.ndim != 1 or labels.dtype.is_floating_point or labels.dtype == torch.bool:
            return f"labels {labels.dtype} {list(labels.shape)}, not N integer class indices"
    elif getattr(dataset, "sample_shape", None) is None and not isinstance(
        dataset, IterableDataset
    ):  # a dataset of one's own: its first
        sample = dataset[0]
        if not isinstance(sample, tuple | list) or len(sample) < 2:
            return f"samples of type {type(sample).__name__}, not (image, label) pairs"
        image, label = sample[:2]
        if not isinstance(image, torch.Tensor):
            return f"images of type {type(image).__name__}, not uint8 tensors [C, H, W]"
        if isinstance(label, float) or (
            isinstance(label, torch.Tensor) and label.dtype.is_floating_point
        ):
            return f"label {label!r}, not an integer class index"
        images = image[None]
    else:
        return None
    shape = list(images.shape[1:])
    if images.ndim == 3:
        return f"images {shape}: a channel axis is missing ([1, H, W] for grey)"
    if images.ndim != 4:
        return f"images {shape}, not [C, H, W]"
    # channels last (not any last axis of 1, 3 or 4: synthetic [2, 16, 3] is an image too,
    # review 179; RGBA [32, 32, 4] and small [6, 6, 4] are channels last: review 180)
    last = shape[2] in (1, 3, 4) and shape[0] not in (1, 3, 4)
    if last and (shape[0] != want[0] or min(shape[:2]) >= 8):
        return f"images {shape}, channels last: give [C, H, W] (images.permute(0, 3, 1, 2))"
    if images.dtype != torch.uint8:
        fix = (
            " ((images * 255).round().to(torch.uint8) for 0-1)"
            if images.is_floating_point()
            else ""
        )
        return f"images {images.dtype}, not uint8 pixels 0-255{fix}"
    return None


DEFAULT_VAL_FRACTION = 0.1  # (every data option's; streamed chunks fix their own)


def _class_count(dataset: Dataset) -> tuple[int, bool]:
    """(classes, exact): the class folders of an image folder (exact), else max label + 1 (a
    split need not hold every class)."""
    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    classes = getattr(dataset, "classes", None)
    if classes is not None:
        return len(classes), True
    # (a Dataset of one's own without targets: every sample read once, its images too, said;
    # a sample of them missed a label above data.num_classes, then an IndexError: review 180)
    return int(labels_of(dataset).max()) + 1, False


def _stream_index(dataset: Dataset, limit: int | None, seed: int) -> torch.Tensor:
    """A seeded class-stratified random subset of a streamed split's items (sorted), as of an
    in-memory split, from the labels the conversion recorded in stream order; a seeded uniform
    one for a conversion without them (made by an older litlab: convert again)."""
    if limit is None:
        raise ConfigError(
            "FID on streamed data needs callbacks.fid.extractor=inception or a litlab "
            "classifier checkpoint trained on this data (callbacks.fid.extractor=<run>/"
            "checkpoints/best.ckpt): the auto extractor trains on the whole training split, "
            "which a stream does not hold in memory"
        )
    labels = dataset.read_labels()
    if labels is not None and len(labels) == dataset.images:
        return stratified_indices(labels, limit, seed)
    log.warning(
        "this streamed dataset's conversion did not record its labels (made by an older "
        "litlab, or LitData's counts disagreed: see the conversion's output): its FID sample is "
        "uniform, not class-stratified; convert it again for a stratified one"
    )
    generator = torch.Generator().manual_seed(seed)
    return torch.randperm(dataset.images, generator=generator)[:limit].sort().values


class DataModule(L.LightningDataModule):
    """Turns a Source into train/val/test loaders of normalized (and optionally augmented) images.

    Images travel as uint8 and are converted, augmented and normalized per batch on the device
    the batch lands on (``on_after_batch_transfer``): cheap for the host, and one code path.
    ``loader="device"`` keeps in-memory splits on the run's device and indexes whole batches
    there (``DeviceLoader``); ``"dataloader"`` is torch's DataLoader, for file-backed sources;
    ``"auto"`` picks the first for in-memory (and cached) data, else the second.

    Images stored larger than ``image_shape`` (an image folder's ``size``) are cropped and
    resized on the device: a random resized crop per training image with area fraction in
    ``random_resized_crop``, the centre ``eval_crop`` of the side for evaluation. With
    ``random_resized_crop`` null, training takes evaluation's frame too (the centre
    ``eval_crop``; the whole image at ``eval_crop=1``): train and test images then show
    objects at one scale, and a GAN learns the frames FID compares it with. ``augment`` runs on
    every training batch after the crop and flip (``data/augment``: TrivialAugment or
    RandAugment, one op and magnitude drawn per image).
    """

    def __init__(
        self,
        source: Source,
        image_shape: Sequence[int],
        num_classes: int,
        mean: Sequence[float],
        std: Sequence[float],
        batch_size: int = 128,
        eval_batch_size: int | None = None,
        val_fraction: float = DEFAULT_VAL_FRACTION,
        split_seed: int = 0,
        hflip: bool = False,
        translate: int = 0,
        num_workers: int = 0,
        pin_memory: bool = True,
        loader: LoaderKind = "device",
        train_fraction: float = 1.0,
        random_resized_crop: Sequence[float] | None = None,
        eval_crop: float = 1.0,
        augment: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        if loader not in ("auto", "device", "dataloader"):
            raise ConfigError(
                f"loader must be 'device' (in-memory sources), 'dataloader' (torch DataLoader) "
                f"or 'auto', got {loader!r}"
            )
        crop = random_resized_crop
        if crop is not None and (len(crop) != 2 or not 0 < crop[0] <= crop[1] <= 1):
            raise ConfigError(
                f"random_resized_crop is the [min, max] fraction of the area a crop keeps, "
                f"0 < min <= max <= 1 (e.g. [0.35, 1]), or null; got {list(crop)}"
            )
        if not 0 < eval_crop <= 1:
            raise ConfigError(f"eval_crop must lie in (0, 1], got {eval_crop}")
        if batch_size < 1 or (eval_batch_size is not None and eval_batch_size < 1):
            raise ConfigError(f"batch_size must be a positive integer, got {batch_size}")
        if not 0.0 < val_fraction < 1.0:
            raise ConfigError(f"val_fraction must lie strictly between 0 and 1, got {val_fraction}")
        if len(image_shape) != 3 or len(mean) not in (1, image_shape[0]) or len(std) != len(mean):
            raise ConfigError(
                f"image_shape must be [C, H, W] with one mean and std (for all channels) or one per "
                f"channel, got image_shape={list(image_shape)}, mean={list(mean)}, std={list(std)}"
            )
        if min(std) <= 0:
            raise ConfigError(f"std must be positive, got {list(std)}")
        if translate < 0 or num_workers < 0:
            raise ConfigError("translate and num_workers must be >= 0")
        if not 0.0 < train_fraction <= 1.0:
            raise ConfigError(f"train_fraction must lie in (0, 1], got {train_fraction}")
        self.source = source
        self.image_shape = tuple(image_shape)
        self.num_classes = num_classes
        self.batch_size = batch_size
        # Set by tune.batch_size while Lightning's finder doubles past its cap (its power
        # search reloads the data before it checks max_val): batches of the cap then.
        self.batch_cap: int | None = None
        self.eval_batch_size = eval_batch_size or batch_size
        self.val_fraction = val_fraction
        # how a run gets more validation images (said where an accuracy on few of them ties)
        self.more_validation = "raise data.val_fraction"
        self.split_seed = split_seed
        self.train_fraction = train_fraction
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.loader = loader
        self.transform = BatchTransform(
            mean,
            std,
            hflip=hflip,
            translate=translate,
            size=self.image_shape[1:],
            crop_scale=random_resized_crop,
            eval_crop=eval_crop,
            augment=augment,
        )
        # unreadable files dropped by the file-reading loader: each once, whatever reads it
        # again (every epoch, evaluation); every rank's after a fit or test (gather_unreadable, train.record_stage)
        self.unreadable: set[str] = set()
        # copies of training files among an evaluation split's (_say_copies), by split
        self.copies: dict[str, list[tuple[str, str]]] = {}
        self._stage: str | None = None  # setup's
        # An image folder's class names, in label order (None: a source without names), and
        # those of the checkpoint a run continues or tests (checked at setup or when restored).
        self.class_names: list[str] | None = None
        self.trained_classes: list[str] | None = None
        self.stored_shape: tuple[int, ...] = self.image_shape  # the split's, set at setup
        self._said_fewer_pixels = False
        # Set by litlab.callbacks.Speed(channels_last=True) to match the model's weights.
        self.memory_format = torch.contiguous_format
        self.datasets: dict[str, Dataset] = {}
        self._fingerprints: list[list[str]] | None = None  # state_dict's, made once
        self._device_copies: dict[tuple, torch.Tensor] = {}  # _on_device's

    def prepare_data(self) -> None:
        trainer = self.trainer
        known = self.source.known_classes()  # before a decode (a large folder's: an hour)
        # a checkpoint's classes first (eval.py, a fit continued): a class folder added since
        # is named, where the count's advice (data.num_classes=5) was refused next for the
        # model's own count (walkthrough 150)
        self._check_classes(known)
        if known is not None and len(known) != self.num_classes:
            self.source.check_class_files()  # (an empty class folder: said, not counted)
            raise ConfigError(self._class_count_error("train", len(known)))
        self.source.prepare(test=self._reads_test(trainer.state.fn if trainer else None))

    def _reads_test(self, stage: str | None) -> bool:
        """Whether a stage reads the test split: a test, or a fit or validation with a callback
        that does (``reads_test_split``: FID's floor). A fit alone leaves it unread (an image
        folder's test images are decoded at the test, not before the first step)."""
        if stage not in ("fit", "validate"):
            return True
        trainer = self.trainer
        callbacks = trainer.callbacks if trainer is not None else []
        return any(getattr(c, "reads_test_split", False) for c in callbacks)

    def setup(self, stage: str | None = None) -> None:
        self._stage = stage
        if not self.datasets:
            self._check_classes(self.source.known_classes())  # (every rank, before a decode)
            self._setup_splits()
        if "test" not in self.datasets and self._reads_test(stage):
            self.datasets["test"] = self.source.load("test")
            self._check(self.datasets["test"], "test")
            self._say_copies("test", ("fit", "val"))

    def _say_copies(self, split: str, trained: tuple[str, ...]) -> None:
        """Images of an evaluation split whose files are byte-for-byte copies of files of the
        ``trained`` splits ("fit": the images trained on; Source.copies, where a source can tell): said, and recorded for
        summary.json (data.copies_of_training), once a split. Its metrics count them as unseen
        images (walkthrough 150: 15 of a test split's 90 images copies of training files,
        test/acc 1, not a word). Not refused: the folder is the user's data to mend."""
        copies_of = getattr(self.source, "copies", None)
        if copies_of is None or split in self.copies or split not in self.datasets:
            return
        if split == "val" and self._stage not in (None, "fit", "validate"):
            return  # eval.py measures no val/* (review 154: it was told of them)
        # by the folder's split names: "fit" (what trains: all of train, or its train_fraction)
        # is of the training split
        splits = {
            "train" if name == "fit" else name: self.datasets[name]
            for name in trained
            if name in self.datasets
        }
        found = copies_of(splits, (split, self.datasets[split]))
        if not found:
            return
        self.copies[split] = found
        if self._says:
            log.warning(
                "%s; remove the copies (streamed data: from its image folder, then convert it "
                "again; the first 20: summary.json, data.copies_of_training)",
                # (a stream's len() is this rank's share: _images counts the split's)
                copies_sentence(found, _images(self.datasets[split]), split),
            )

    def _setup_splits(self) -> None:
        """The training, validation and fit splits (the test split: ``setup``)."""
        if getattr(self.source, "own_validation_split", False):
            self._setup_given_splits()
            return
        train_full = self.source.load("train")
        asked = self.loader  # (auto's choice of the device loader: not said, review 148)
        if self.loader == "auto":
            self.loader = "device" if _in_memory(train_full) else "dataloader"
        if self.loader == "device" and not _in_memory(train_full):
            raise ConfigError(
                f"data.loader=device needs an in-memory source, but {self.source.name} "
                + (
                    "reads files as it goes"
                    if _reads_files(train_full)
                    else "gives its images one at a time (not a TensorDataset)"
                )
                + "; set data.loader=dataloader"
            )
        if asked == "device" and self.num_workers > 0:  # (walkthrough 142: not a word)
            log.info(
                "data.loader=device: batches are cut from the split held in the run's device "
                "memory, in the training process; data.num_workers=%d is not used (it serves "
                "data.loader=dataloader)",
                self.num_workers,
            )
        self._check(train_full, "train")
        given = self.source.given_validation()
        if given is not None:  # the source's own validation split: all of train is trained on
            self._check(given, "val")
            self.more_validation = "add images to its validation folder"
            train_idx, val_idx = torch.arange(len(train_full)), None
        else:  # A fixed split seed keeps the validation set the same across runs and trials.
            train_idx, val_idx = self.source.validation_split(
                train_full, self.val_fraction, self.split_seed
            )
        self.datasets["train"] = Subset(train_full, train_idx.tolist())
        # What the model learns from: all of the training split, or a seeded class-stratified
        # fraction of it (data-efficiency studies); metrics of the data (FID) use all of it.
        self.datasets["fit"] = self.datasets["train"]
        if self.train_fraction < 1.0:
            train = self.datasets["train"]
            keep = stratified_indices(
                labels_of(train), max(1, round(len(train) * self.train_fraction)), self.split_seed
            )
            self.datasets["fit"] = Subset(train, keep.tolist())
        self.datasets["val"] = given if val_idx is None else Subset(train_full, val_idx.tolist())
        self._say_copies("val", ("fit",))
        self._say_unbalanced()

    def _class_images(self, split: str) -> torch.Tensor | None:
        """How many images of each class a split holds, where its labels are read without
        decoding it (arrays in memory, an image folder's files); None otherwise (a stream)."""
        dataset = self.datasets.get(split)
        base = dataset
        while isinstance(base, Subset):
            base = base.dataset
        if base is None or (
            not isinstance(base, TensorDataset) and getattr(base, "targets", None) is None
        ):
            return None
        return torch.bincount(labels_of(dataset), minlength=self.num_classes)

    @property
    def _says(self) -> bool:
        """Whether this process says what the data is: rank 0, or no trainer (each rank sets
        the data up)."""
        return self.trainer is None or self.trainer.is_global_zero

    def streamed(self) -> bool:
        """Whether the training split is streamed (LitData chunks), not held or listed here."""
        return "train" in self.datasets and _streams(self.datasets["train"])

    def _class_images_read(self, split: str) -> torch.Tensor | None:
        """``_class_images`` less the files found unreadable as they were read (cache=false):
        the split sizes beside them count only images (review 171: a class of 28 files, 27 of
        them unreadable, read 28 in class_images beside the splits' 1)."""
        counts = self._class_images(split)
        files = self._paths(split) if counts is not None and self.unreadable else None
        if files is None:
            return counts
        labels = labels_of(self.datasets[split])
        lost = torch.tensor([f in self.unreadable for f in files], dtype=torch.bool)
        return counts - torch.bincount(labels[lost], minlength=self.num_classes)

    def _say_unbalanced(self) -> None:
        """Once: a training split whose largest class has ten times the images of its smallest
        or more (walkthrough 157: 110, 101 and 6 images, test/acc 0.976 with the small class
        never predicted, not a word). Where the labels are read without decoding the images."""
        if self._stage not in (None, "fit", "validate") or not self._says:
            return  # eval.py trains nothing (review 159: it said the training split's balance)
        counts = self._class_images("fit")
        if counts is None:
            return
        whole = self._class_images("train")  # (not "fit": a train_fraction subset's gaps)
        whole = counts if whole is None else whole
        present = (whole > 0).nonzero().flatten().tolist()
        # labels below the first or above the last there are (labels of one's own from 1,
        # data.num_classes above the classes): outputs no image trains, in silence
        # (walkthrough 173); not the gaps of labels drawn at random (synthetic data)
        empty = [k for k in range(len(whole)) if present and not present[0] <= k <= present[-1]]
        if empty and self.class_names is None:  # (a folder's classes: said otherwise)
            log.warning(
                "data.num_classes=%d, but the training split holds no image of label(s) %s "
                "(labels run from 0 to data.num_classes - 1): their outputs are never trained "
                "towards; set data.num_classes to the classes there are, labelled from 0",
                self.num_classes,
                empty[:10],
            )
        held = counts > 0  # (a folder's class without training images is said otherwise)
        if held.sum() < 2 or counts.max() < 10 * counts[held].min():
            return
        names = self.class_names or [str(label) for label in range(len(counts))]
        small = int(torch.where(held, counts, counts.max() + 1).argmin())
        large = int(counts.argmax())
        log.warning(
            "the training images are unbalanced: class %s has %d, class %s %d (%.0fx): "
            "accuracy counts images, so the large classes decide it (val/acc, test/acc); "
            "test/acc_macro averages the classes' accuracies, summary.json test_per_class and "
            "data.class_images give each class",
            names[small],
            int(counts[small]),
            names[large],
            int(counts[large]),
            int(counts[large]) / int(counts[small]),
        )

    def _setup_given_splits(self) -> None:
        """A source that holds its own train, val and test splits (streamed datasets, split
        when they were converted): taken as they are."""
        if self.train_fraction < 1.0:
            raise ConfigError(
                f"data.train_fraction is not available with {self.source.name} (its splits were "
                "fixed at conversion); convert a smaller folder instead"
            )
        if self.loader == "device":
            raise ConfigError(
                f"data.loader=device needs an in-memory source, but {self.source.name} streams; "
                "set data.loader=auto"
            )
        self.loader = "dataloader"
        self.more_validation = "convert again with a larger --val-fraction, or more images in val/"
        converted = (getattr(self.source, "meta", {}).get("fractions") or {}).get("val")
        asked = self.val_fraction != DEFAULT_VAL_FRACTION  # (the default: nothing was asked)
        if self._says and asked and converted is not None and float(converted) != self.val_fraction:
            log.warning(
                "data.val_fraction=%g does not apply to %s: its validation split was fixed at "
                "conversion (--val-fraction %g); convert again for another",
                self.val_fraction,
                self.source.label,
                float(converted),
            )
        for split in ("train", "val", "test"):
            self.datasets[split] = self.source.load(split)
            self._check(self.datasets[split], split)
        self.datasets["fit"] = self.datasets["train"]
        self._say_copies("val", ("fit",))
        self._say_copies("test", ("fit", "val"))
        shared_cache = getattr(self.source, "shared_cache", None)
        if shared_cache and self.trainer is not None and self.trainer.is_global_zero:
            said = shared_cache(self.trainer.num_nodes)
            if said:
                log.warning(said)

    def _check(self, dataset: Dataset, split: str) -> None:
        if _images(dataset) == 0:
            raise DataError(f"the {self.source.name} {split} split is empty")
        if _streams(dataset) and self.trainer is not None:  # (the others: _loader)
            self._refuse_fewer_images_than_ranks(split, self.trainer.world_size, dataset.images)
        problem = _sample_problem(dataset, self.image_shape)
        if problem is not None:
            raise DataError(
                f"the {self.source.name} {split} split holds {problem}: a source's load() "
                "returns (uint8 image [C, H, W], integer label) pairs, a TensorDataset of "
                "uint8 [N, C, H, W] images and N labels in memory"
            )
        shape = _sample_shape(dataset)
        self.stored_shape = shape  # what a batch decoded on the device is made into
        want = self.image_shape
        # Stored larger is fine (cropped and resized on the device), never smaller.
        if shape[0] != want[0] or shape[1] < want[1] or shape[2] < want[2]:
            # a source that decodes to a size and channels of its own (an image folder): those
            # are what to change (its stored size is not the net's input)
            fixes = []
            if shape[0] != want[0] and hasattr(self.source, "channels"):
                fixes.append(f"data.source.channels={want[0]}")
            if (shape[1] < want[1] or shape[2] < want[2]) and hasattr(self.source, "size"):
                fixes.append(f"data.source.size={max(want[1:])}")
            fits = f"data.image_shape=[{','.join(map(str, shape))}]"
            advice = f"{' and '.join(fixes)} (decoded so), or {fits}" if fixes else fits
            raise ConfigError(
                f"data.image_shape is {list(want)} but the {self.source.name} {split} "
                f"images are {list(shape)}; set {advice}"
            )
        self._say_the_net_sees_fewer_pixels(shape)
        classes, exact = _class_count(dataset)
        names = getattr(dataset, "classes", None)
        if classes > self.num_classes or (exact and classes != self.num_classes):
            if self.trained_classes is not None and names is not None:  # a checkpoint tested
                raise DataError(  # (data.num_classes is the model's: set otherwise, refused)
                    f"the model was trained with the {len(self.trained_classes)} classes "
                    f"{self.trained_classes}, the {self.source.name} {split} split has "
                    f"{classes}: {list(names)}; test it on data of the model's classes (an "
                    "image folder of some of them is labelled by their names: data=image_folder "
                    "data.source.root=<folder>)"
                )
            raise ConfigError(self._class_count_error(split, classes))
        if names is not None:
            self.class_names = [str(name) for name in names]
            self._check_classes()

    def _class_count_error(self, split: str, classes: int) -> str:
        if classes < 2:  # data.num_classes=1: a classifier refuses it (review 171)
            return (
                f"the {self.source.name} {split} split has {classes} class but data.num_classes "
                f"is {self.num_classes}: a classifier needs two classes or more (is the data's "
                "root the folder that holds the class folders?); a GAN trains on one class: "
                "model=dcgan data.num_classes=1"
            )
        return (
            f"the {self.source.name} {split} split has {classes} classes but data.num_classes "
            f"is {self.num_classes}; set data.num_classes={classes}"
        )

    def _check_classes(self, now: list[str] | None = None) -> None:
        """Refuse class folders other than the checkpoint's, even as many: a label is the
        position of its folder's name in sorted order, so a renamed or swapped folder would
        silently give other images each label. ``now``: the classes found (a scan's, before
        a decode), else the data's."""
        trained, now = self.trained_classes, self.class_names if now is None else now
        if trained is None or now is None or trained == now:
            return
        moved = [
            f"{i}: {a} -> {b}" for i, (a, b) in enumerate(zip(trained, now, strict=False)) if a != b
        ]
        new, gone = [c for c in now if c not in trained], [c for c in trained if c not in now]
        which = "; ".join(
            [f"class folder(s) {new} are new (an empty folder is a class too)"] * bool(new)
            + [f"{gone} are missing"] * bool(gone)
        )
        raise DataError(
            f"the model was trained with the classes {trained}, this data has {now} (labels "
            f"{', '.join(moved[:3])}{', ...' if len(moved) > 3 else ''}"
            f"{'; ' + which if which else ''}); use class folders of the same names"
            f"{encoding_hint(trained, now)}"
        )

    def state_dict(self) -> dict[str, Any]:
        """Kept in checkpoints by Lightning: the class names the labels stand for, a sample of
        the files trained on (an image folder: eval.py, resume=), which files an image folder
        holds and which conversion streamed chunks are (a fit continued: the same), and the
        unreadable
        files found so far (this rank's: rank 0's in the file), which a resumed epoch does not
        read again."""
        state: dict[str, Any] = {}
        if self.class_names is not None:
            state["classes"] = self.class_names
        if self._fingerprints is None and "fit" in self.datasets:
            sample = getattr(self.source, "fingerprints", None)  # image folders
            fit, val = self.datasets["fit"], self.datasets.get("val")
            self._fingerprints = (sample and sample(fit, val)) or []
        if self._fingerprints:  # files trained on (litlab.data.fingerprint: eval.py)
            state["trained_files"] = self._fingerprints
        conversion = getattr(self.source, "conversion", None)  # streamed chunks
        key = conversion() if conversion is not None else None
        if key:
            state["conversion"] = key
        converted_from = getattr(self.source, "converted_from", None)  # streamed chunks
        if converted_from is not None and (record := converted_from()):
            state["converted_from"] = record
        if files := self._files_key():  # an image folder's files (a fit continued: the same)
            # and those a cached decode found unreadable: removed since, the resume goes on
            # (review 171; read as they go, each file holds a place in the epoch's order and
            # the training subset's draw: refused as before, review 174)
            without = self.source.unreadable_names()
            state["files"] = {**files, "without": without} if without else files
        if self.unreadable:
            state["unreadable"] = sorted(self.unreadable)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A resumed run's (after setup) or a tested checkpoint's class names: checked. A
        resumed fit's unreadable files count on (not a test's or eval.py's: they count what
        they read)."""
        self.trained_classes = state.get("classes")
        self._check_classes()
        trainer = self.trainer
        if trainer is not None and trainer.state.fn == "fit":
            self._check_same_files(state)
            self.unreadable.update(state.get("unreadable", []))

    def _files_key(self) -> dict[str, Any] | None:
        files = getattr(self.source, "files_key", None)  # image folders
        return files() if files is not None else None

    def continues(self, state: dict[str, Any]) -> None:
        """A fit continued from a checkpoint (resume=, a requeue, ckpt_path=; ``state``: this
        DataModule's in it), said before the trainer prepares the data: an image folder whose
        files changed since is refused from its scan, before a decode (ImageFolder.check_files;
        a changed folder's decode is a new cache, an hour for a million images)."""
        self.trained_classes = state.get("classes")  # checked from a scan too
        if hasattr(self.source, "continued_files"):
            self.source.continued_files = state.get("files")

    def _check_same_files(self, state: dict[str, Any]) -> None:
        """A fit continued from a checkpoint reads the files its run read: an image folder
        changed since (files added, removed, renamed or moved to another class; refused
        earlier where ``continues`` was told), or chunks converted again in their folder, would
        train and validate it on other images part way (its best checkpoint chosen across two
        validation sets, a mid-epoch resume's order over other files). Refused, before any
        batch."""
        check_files = getattr(self.source, "check_files", None)  # image folders
        if check_files is not None:
            check_files(state.get("files"))
        conversion = getattr(self.source, "conversion", None)  # streamed chunks
        then, now = state.get("conversion"), conversion() if conversion is not None else None
        if then and now and then != now:
            raise DataError(
                f"{self.source.label} holds another conversion than the checkpoint's (converted "
                "again since, of other or changed files): a resumed run would go on with other "
                "images; resume on the chunks it trained on, or start a new run on these"
            )

    def _loader(
        self, split: str, train: bool, batch_size: int | None = None
    ) -> DataLoader | DeviceLoader:
        if batch_size is None:
            batch_size = self.batch_size if train else self.eval_batch_size
        if _streams(self.datasets[split]):
            return self._streaming_loader(split, train, batch_size)
        trainer = self.trainer
        order = dict(
            # Lightning turns shuffling off for overfit_batches only on torch DataLoaders.
            shuffle=train and not (trainer and trainer.overfit_batches),
            drop_last=train,
            # The run's seed, as Lightning seeds its DistributedSampler: the same on every rank.
            seed=_run_seed(),
            # Without a trainer (tests, notebooks): the CPU, one process.
            rank=trainer.global_rank if trainer else 0,
            world_size=trainer.world_size if trainer else 1,
        )
        if not train and order["world_size"] > 1:
            self._refuse_fewer_images_than_ranks(split, order["world_size"])
        trained = self._trained_batches() if train else None
        sampled = self._read_in_part(split, train)
        if self.loader == "dataloader":
            dataset = self.datasets[split]
            reads_files = _reads_files(dataset)
            if sampled is not None:
                dataset = Subset(dataset, sampled.tolist())
            return ResumableDataLoader(
                dataset,
                ShardSampler(len(dataset), batch_size=batch_size, **order),  # type: ignore[arg-type]
                trained,
                num_workers=self.num_workers,
                pin_memory=self.pin_memory and torch.cuda.is_available(),
                persistent_workers=self.num_workers > 0,
                # files can be unreadable: such batches carry the count of those skipped
                collate_fn=skip_unreadable if reads_files else None,
                multiprocessing_context=reader_context(self.num_workers) if reads_files else None,
            )
        images, labels, rows = self._tensors(split)
        if sampled is not None:
            rows = rows[sampled]
        device = trainer.strategy.root_device if trainer else torch.device("cpu")
        images, labels = self._on_device(images, device), self._on_device(labels, device)
        return DeviceLoader(
            images,
            labels,
            batch_size,
            rows=rows,
            device=device,
            trained=trained,
            **order,  # type: ignore[arg-type]
        )

    def _say_the_net_sees_fewer_pixels(self, stored: tuple[int, ...]) -> None:
        """Once: images decoded at a size (data.source.size) well above data.image_shape's,
        which every crop is resized to (walkthrough 157: data.source.size=64 alone trained on
        32-pixel crops, not a word)."""
        size = getattr(self.source, "size", None)
        want = max(self.image_shape[1:])
        if self._said_fewer_pixels or size is None or max(stored[1:]) < 1.5 * want:
            return
        self._said_fewer_pixels = True
        # (a line, not a warning: storing large and training small is also a recipe's choice,
        # FFCV's 256-pixel images and 160-pixel crops; review 159)
        if self._stage in (None, "fit") and self._says:
            log.info(
                "data.source.size=%d decodes the images at %d px, and the net sees "
                "data.image_shape %s: each crop is resized to %d px; to train at %d px, set "
                "data.image_shape=[%d,%d,%d] (and data.source.size about %d, a crop's margin)",
                size,
                max(stored[1:]),
                list(self.image_shape),
                want,
                size,
                self.image_shape[0],
                size,
                size,
                -(-size * 9 // 8),
            )

    def _refuse_fewer_images_than_ranks(
        self, split: str, world: int, size: int | None = None
    ) -> None:
        """An evaluation split of fewer images than the run's processes: a sampler that deals
        each image once leaves some ranks none, and every rank must run the same batches (each
        rank's loader padded by repeating images, which then counted twice: a val split of 2
        images on 3 ranks measured val/acc over 3; review 151). The same line as a streamed
        split's, training's too (_check: LitData's loader gives each rank whole batches of its
        own). ``size``: the split's, where it is not loaded yet."""
        size = len(self.datasets[split]) if size is None else size
        if size < world:
            why = (
                "and LitData gives each process whole batches of its own"
                if _streams(self.datasets.get(split))
                else "each of which evaluates images of its own (repeated images would count twice)"
            )
            raise DataError(
                f"the {self.source.name} {split} split holds {size} image(s), fewer than the "
                f"run's {world} processes, {why}; add images to the split, or run on fewer "
                "processes"
            )

    def refuse_a_test_split_too_small(self, world: int) -> None:
        """Before a fit that will be tested: a test split of fewer images than processes, where
        the source can count it without decoding it (an image folder's test/ is decoded at the
        test: the refusal came after the whole fit; review 154)."""
        files_in = getattr(self.source, "files_in", None)
        count = files_in("test") if files_in is not None and world > 1 else None
        if count is not None:
            self._refuse_fewer_images_than_ranks("test", world, count)

    def _on_device(self, tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
        """One copy of an in-memory array on the run's device, shared by the loaders that read
        rows of it (training and validation are rows of one array: each loader's own copy took
        twice its memory on a GPU)."""
        key = (tensor.data_ptr(), tuple(tensor.shape), tensor.dtype, str(device))
        if key not in self._device_copies:
            self._device_copies[key] = tensor.to(device)
        return self._device_copies[key]

    def _read_in_part(self, split: str, train: bool) -> torch.Tensor | None:
        """The order a split is read in where only part of it is: a seeded permutation
        (``data.split_seed``), the same every epoch and on every rank, so that the batches read
        are a random sample of the split. Evaluation where the trainer evaluates part of a
        split (``trainer.limit_val_batches`` / ``limit_test_batches``); training under
        ``trainer.overfit_batches`` (its batches unshuffled, the same every epoch). Splits are
        stored class by class (an image folder's files): read in order,
        ``limit_val_batches=0.25`` measured the first 3 of 10 classes, and ``overfit_batches``
        trained on one class (a constant label "overfits"). None where the whole split is read
        in the loader's own order."""
        trainer = self.trainer
        if train and not (trainer and trainer.overfit_batches):
            return None
        if not train and not self._evaluates_in_part(split):
            return None
        generator = torch.Generator().manual_seed(self.split_seed)
        return torch.randperm(len(self.datasets[split]), generator=generator)

    def _evaluates_in_part(self, split: str) -> bool:
        trainer = self.trainer
        return part_of_a_split(
            getattr(trainer, f"limit_{split}_batches", None) if trainer else None
        )

    def _streaming_loader(self, split: str, train: bool, batch_size: int) -> DataLoader:
        """LitData's loader: each rank and worker streams its own chunks. Training drops the
        last items so that every rank runs the same number of batches; evaluation reads every
        item once (the last rank takes the items left over from whole batches, so ranks may run
        a different number of batches: no step of evaluation syncs, but under FSDP each forward
        does, and every rank then runs the largest number, the rest empty batches)."""
        from litlab.data.streaming import streaming_loader_class

        dataset, trainer = self.datasets[split], self.trainer
        dataset.seed = _run_seed()  # the same on every rank
        if not train and self._evaluates_in_part(split):
            log.warning(
                "trainer.limit_%s_batches on streamed data measures the first items of each "
                "rank's chunks, in the order the conversion stored them (not a random sample)",
                split,
            )
        if not train:  # LitData deals whole batches to ranks: a batch per rank at least
            world_size = trainer.world_size if trainer else 1
            batch_size = min(batch_size, max(1, dataset.images // world_size))
        epoch = None
        if train and trainer is not None:
            # overfit_batches trains the first batches of every pass: the same ones only in the
            # same order (epoch 0's, a seeded sample), as the in-memory and folder loaders do.
            overfit = bool(trainer.overfit_batches)
            epoch = (lambda: 0) if overfit else (lambda: epoch_to_train(trainer))
        return streaming_loader_class()(
            dataset,
            batch_size=batch_size,
            shuffle=train,
            drop_last=train,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory and torch.cuda.is_available(),
            collate_fn=skip_unreadable,
            multiprocessing_context=reader_context(self.num_workers, "litdata"),
            trained=self._trained_batches() if train else None,
            epoch=epoch,
            pad_to=None if train or not forward_is_collective(trainer) else largest_on_any_rank,
        )

    def _trained_batches(self) -> Callable[[], int] | None:
        """How many of the epoch's batches a resumed trainer counts as trained (its epoch loop's
        processed count, which it will not run again); None without a trainer."""
        trainer = self.trainer
        if trainer is None:
            return None
        return lambda: trainer.fit_loop.epoch_loop.batch_progress.current.processed

    def train_dataloader(self) -> DataLoader | DeviceLoader:
        fit = self.datasets["fit"]
        # each rank's share (a streamed dataset's len is already this rank's)
        ranks = 1 if self.trainer is None else self.trainer.world_size
        share = len(fit) if _streams(fit) else len(fit) // ranks
        if self.batch_cap is not None and self.batch_size > self.batch_cap:
            return self._loader("fit", train=True, batch_size=self.batch_cap)
        if share < self.batch_size:  # drop_last would leave no batch at all
            each = f" of each of the {ranks} ranks" if ranks > 1 else ""  # (streamed too: 168)
            raise ConfigError(
                f"batch_size {self.batch_size} exceeds the {share} training images{each}; "
                f"lower data.batch_size (to {share} at most)"
            )
        return self._loader("fit", train=True)

    def val_dataloader(self) -> DataLoader | DeviceLoader:
        return self._loader("val", train=False)

    def test_dataloader(self) -> DataLoader | DeviceLoader:
        return self._loader("test", train=False)

    def arrays(
        self,
        split: str,
        limit: int | None = None,
        seed: int = 0,
        shard: tuple[int, int] = (0, 1),
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A split's uint8 images and labels (for metrics such as FID): all of them, or a seeded
        class-stratified random subset of ``limit`` (splits are stored class by class, so a
        head would hold the first classes only). ``shard=(rank, world)``: only every
        world-th image of that set, from the rank-th on (read alone: a rank of a DDP job reads
        its part of a stream or folder, not all of it)."""
        self._set_up(split)
        dataset = self.datasets[split]
        if _streams(dataset):
            index = _stream_index(dataset, limit, seed)
        else:
            labels = labels_of(dataset)
            index = stratified_indices(labels, len(labels) if limit is None else limit, seed)
        index = index[shard[0] :: shard[1]]
        base, within = dataset, index
        while isinstance(base, Subset):  # index the tensors themselves, not one sample at a time
            base, within = base.dataset, torch.as_tensor(base.indices, dtype=torch.long)[within]
        if isinstance(base, TensorDataset):
            return base.tensors[0][within], base.tensors[1][within]
        # files or a stream's items read one by one: some may not decode (dropped), JPEGs may
        # come encoded
        return stack_samples([dataset[i] for i in index.tolist()], _sample_shape(dataset))

    def eval_arrays(
        self,
        split: str,
        limit: int | None = None,
        seed: int = 0,
        device: torch.device | str = "cpu",
        chunk: int = 2048,
        shard: tuple[int, int] = (0, 1),
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``arrays`` framed as the models see them: each image's centre ``eval_crop`` resized to
        ``image_shape`` (on ``device``, as a run there crops), returned as uint8 on the CPU. Real
        images for FID and its extractor: a generator learns these frames (GANs take the
        evaluation crop in training too), not the stored ones, which may be larger."""
        images, labels = self.arrays(split, limit, seed, shard)
        framed = [self.transform.eval_pixels(part.to(device)).cpu() for part in images.split(chunk)]
        return (torch.cat(framed) if framed else images), labels

    def _tensors(self, split: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The in-memory tensors a split lives in and its rows in them, without copying (an
        image folder's cache stays memory-mapped on the CPU)."""
        dataset, rows = self.datasets[split], None
        while isinstance(dataset, Subset):
            index = torch.as_tensor(dataset.indices, dtype=torch.long)
            rows = index if rows is None else index[rows]
            dataset = dataset.dataset
        images, labels = dataset.tensors
        return images, labels, torch.arange(len(labels)) if rows is None else rows

    def split_size(self, split: str) -> int:
        """Images in a split (all ranks': a stream's len() is this rank's share)."""
        self._set_up(split)
        return _images(self.datasets[split])

    def _set_up(self, split: str) -> None:
        """``setup`` as far as ``split`` needs (the test split only for itself)."""
        self.setup("test" if split == "test" else "fit")

    def report(self) -> dict[str, Any]:
        """What the data was, for summary.json: ``source`` (which data: Source.label), the
        source's own account (an image folder's images and files skipped per folder),
        ``splits`` (what was trained on, validated and tested: images; where they are read as
        they go, the files listed less those found unreadable, so that a run reports the same
        split sizes cached or not, which the report ranks runs by) and ``skipped_while_loading``
        (the files found unreadable as they were read, each once; by every rank where the fit
        or test ended, this rank's where it failed)."""
        report = {"source": self.source.label, **(getattr(self.source, "report", {}) or {})}
        names = {"train": "fit", "val": "val", "test": "test"}
        splits = {
            name: self.split_size(key) - len(self._found_unreadable(key))
            for name, key in names.items()
            if key in self.datasets
        }
        if splits:
            report["splits"] = splits
        classes = {name: self._class_images_read(key) for name, key in names.items()}
        if any(counts is not None for counts in classes.values()):
            labels = self.class_names or [str(label) for label in range(self.num_classes)]
            report["class_images"] = {
                name: dict(zip(labels, counts.tolist(), strict=False))
                for name, counts in classes.items()
                if counts is not None
            }
        if self.copies:
            report["copies_of_training"] = {
                split: {"images": len(found), "first": [list(pair) for pair in found[:20]]}
                for split, found in self.copies.items()
            }
        if self.unreadable:
            report["skipped_while_loading"] = len(self.unreadable)
            if lost := self.classes_never_read():
                report["classes_never_read"] = lost
                if self._says:
                    log.warning(
                        "class(es) %s: every training file was unreadable, the model never saw "
                        "them (list them: python -m litlab.data.check <root>)",
                        lost,
                    )
        return report

    def classes_never_read(self) -> list[str]:
        """Classes of the training split whose every file was found unreadable as it was read
        (an image folder with cache=false; a cached one refuses them as it decodes): the model
        never saw them, and their test images count as errors."""
        held, read = self._class_images("fit"), self._class_images_read("fit")
        if not self.unreadable or held is None or read is None:
            return []
        classes = self.class_names or []
        lost = ((held > 0) & (read == 0)).nonzero().flatten().tolist()
        return [classes[k] for k in lost if k < len(classes)]

    def _paths(self, key: str) -> list[str] | None:
        """The files of a split read as they go, as the unreadable ones are named (None for
        images held in memory or streamed)."""
        dataset = self.datasets.get(key)
        images = None if dataset is None else _file_images(dataset)
        if images is None:
            return None
        return [str(images.index.root / f) for f in file_names(dataset)]

    def _found_unreadable(self, key: str) -> list[str]:
        """The files of a split found unreadable as they were read."""
        if not self.unreadable:
            return []
        return [f for f in self._paths(key) or [] if f in self.unreadable]

    def gather_unreadable(self) -> None:
        """Every rank's unreadable files into this rank's (each rank reads its own share of
        every split): one collective where files are read as they go, so every rank calls it at
        the same point (after a fit or a test that ended). Not in ddp_spawn's main process (its
        ranks ran in processes of their own, gone)."""
        trainer = self.trainer
        if trainer is None or trainer.world_size == 1 or not self._reads_as_it_goes():
            return
        if not torch.distributed.is_initialized():  # ddp_spawn's main process
            return
        everyone: list[list[str] | None] = [None] * trainer.world_size
        torch.distributed.all_gather_object(everyone, sorted(self.unreadable))
        said = set(self.unreadable)
        for files in everyone:
            self.unreadable.update(files or [])
        # the run's log (rank 0's) named only the files rank 0 read (walkthrough 139)
        others = sorted(self.unreadable - said)
        if others and trainer.is_global_zero:
            log.warning(
                "skipped unreadable image(s) that other ranks read (their logs say why): %s",
                ", ".join(others[:20])
                + (f" and {len(others) - 20} more" if len(others) > 20 else ""),
            )

    def _reads_as_it_goes(self) -> bool:
        """Whether batches come from files or a stream read as they go (unreadable ones
        possible), the same on every rank."""
        return self.loader == "dataloader" and any(
            _reads_files(d) or _streams(d) for d in self.datasets.values()
        )

    def _skipped(self, skipped: list[Unreadable]) -> None:
        """Files a loader's workers found unreadable: counted, and each said once a run (the
        workers, new processes every epoch, would say it every time they read it)."""
        for item in skipped:
            if item.file not in self.unreadable:
                log.warning("skipped unreadable image %s (%s)", item.file, item.reason or "?")
                self.unreadable.add(item.file)

    def ready(self, batch: Any, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """A loader's batch, already on its device, as models see it: decoded where it came
        encoded, cropped (and augmented when ``train``) and normalized; skipped files counted."""
        if len(batch) == 3:  # from the file-reading loader: (images, labels, files skipped)
            images, labels, skipped = batch
            self._skipped(skipped)
            if not len(labels):  # every file unreadable: an empty batch of the stored shape
                images = torch.empty(
                    (0, *self.stored_shape), dtype=torch.uint8, device=labels.device
                )
            elif isinstance(images, Encoded):  # JPEGs left to this device (data.source.decode)
                c, size = self.stored_shape[:2]
                encoded = images
                images, keep = decode(encoded, size, c, labels.device)
                labels = kept(labels, keep)
                if not keep.all():
                    failed = zip(encoded.files, keep.tolist(), strict=True)
                    self.unreadable.update(f for f, k in failed if not k)
        else:
            images, labels = batch
        images = self.transform(images, train=train)
        return images.contiguous(memory_format=self.memory_format), labels

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        training = self.trainer is not None and self.trainer.training
        images, labels = self.ready(batch, train=training)
        if self.trainer is not None:  # "true" precisions (bf16-true, 16-true) take their dtype;
            # Lightning converts float batches before this hook, and these were still uint8
            images = self.trainer.precision_plugin.convert_input(images)
        return images, labels
