"""Datasets too big for one machine: LitData chunks streamed from a folder or an object store.

``python -m litlab.data.optimize SRC DST`` writes, with LitData's ``optimize``, one LitData
dataset per split (``DST/train``, ``DST/val``, ``DST/test``: chunks of encoded image bytes and
labels, and their ``index.json``) and a small dataset ``DST/meta`` (item 0: classes, counts, how
it was made; then each split's labels in stream order, for class-stratified FID samples).
Keeping the metadata in LitData's own format means it is read wherever LitData reads (a
folder, ``s3://``, ``gs://``, Azure) with LitData's credentials and nothing else.

Training reads ``StreamingDataset``s through LitData's ``StreamingDataLoader``: each rank and
worker streams its own chunks; images are decoded in the workers at ``size`` (the centre square,
as an image folder's), then cropped, flipped and normalized per batch on the device by the
DataModule, like every other source.
"""

from __future__ import annotations

import base64
import copy
import json
import logging
import os
import warnings
import zlib
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from litlab import rng
from litlab.compat import continue_item_shuffle_window, shuffle_as_on_a_local_disk
from litlab.data.decode import skip_unreadable
from litlab.data.folder_index import class_names
from litlab.data.loader import worker_init
from litlab.data.pixels import (
    Unreadable,
    check_decode,
    check_decoded_shape,
    why_unreadable,
    worker_item,
)
from litlab.data.sources import Source
from litlab.distributed.agree import rank_and_world
from litlab.errors import ConfigError, DataError

log = logging.getLogger(__name__)

META_FORMAT = 2  # bump when what DST holds changes (2: items in a random order)
SPLITS = ("train", "val", "test")


def join(root: str, name: str) -> str:
    """``root/name`` for a local folder or a URL alike."""
    return f"{root.rstrip('/')}/{name}"


def _litdata() -> Any:
    try:
        import litdata
    except ImportError as e:
        raise ConfigError(
            "streaming needs LitData: pip install 'litlab[stream]' (or pip install litdata)"
        ) from e
    # LitData logs its cache budget at INFO for every dataset in every worker; keep warnings.
    quiet = logging.getLogger("litdata")
    if quiet.level == logging.NOTSET:
        quiet.setLevel(logging.WARNING)
    # Lightning warns that an IterableDataset's length may be wrong with several workers:
    # LitData shards by worker itself, so its length is right.
    warnings.filterwarnings("ignore", message="Your `IterableDataset` has `__len__` defined")
    return litdata


class DecodeImage:
    """LitData transform, run in the loader's workers: an item's encoded bytes become uint8
    [channels, size, size] (the centre square, as ``load_image`` makes for image folders), or
    ``Unreadable`` (its name in ``split``) when they do not decode (``skip_unreadable`` drops it
    and the run counts it). ``encoded``: JPEGs stay bytes, for the run's device to decode
    (litlab.data.decode), the item's name with them."""

    def __init__(self, size: int, channels: int, encoded: bool = False, split: str = "") -> None:
        self.size, self.channels, self.encoded, self.split = size, channels, encoded, split

    def __call__(self, item: dict[str, Any]) -> tuple | Unreadable:
        name = f"{self.split}/{item.get('name')}"
        try:
            image = worker_item(item["image"], self.size, self.channels, self.encoded)
        except Exception as e:  # a damaged item is a skip, whatever PIL raises
            return Unreadable(name, why_unreadable(e))  # said once by the run, not every epoch
        return (image, int(item["label"]), name) if self.encoded else (image, int(item["label"]))


# An object store's clients say "no credentials" with these (botocore, google-auth, Azure).
CREDENTIAL_ERRORS = (
    "NoCredentialsError",
    "PartialCredentialsError",
    "DefaultCredentialsError",
    "ClientAuthenticationError",
)


def missing_credentials(url: str, error: BaseException | None) -> str | None:
    """What to do where ``error`` (or an error it came from) is an object store's client
    finding no credentials for ``url``; None for any other error."""
    while error is not None:
        if type(error).__name__ in CREDENTIAL_ERRORS:
            return (
                f"no credentials for {url} ({type(error).__name__}: {error}); give them as the "
                "object store's own tools take them (S3: AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE; Google Cloud Storage: "
                "GOOGLE_APPLICATION_CREDENTIALS)"
            )
        error = error.__cause__ or error.__context__
    return None


def damaged_chunk(split_dir: str) -> str | None:
    """The first chunk file a local split's index lists that is missing or not of the size it
    lists (LitData waits for it, then fails in a traceback); None: all there, or not local."""
    if "://" in split_dir:
        return None
    folder = Path(split_dir.removeprefix("local:"))  # (LitData's prefix for a local folder)
    try:
        chunks = json.loads((folder / "index.json").read_text())["chunks"]
    except (OSError, ValueError, KeyError, TypeError):  # (LitData says what it cannot read)
        return None
    for chunk in chunks:
        file = folder / chunk["filename"]
        if not file.is_file() or file.stat().st_size != chunk["chunk_bytes"]:
            return chunk["filename"]
    return None


def convert_again(source: Any, input_dir: str) -> str:
    """The advice for a conversion to be written again: its command."""
    return f"convert it again: python -m litlab.data.optimize {source} {input_dir}"


def read_meta(input_dir: str, cache_dir: str | None = None) -> dict[str, Any]:
    """What ``litlab.data.optimize`` wrote about a converted dataset (``DST/meta``)."""
    litdata = _litdata()
    where = join(input_dir, "meta")
    try:
        item = litdata.StreamingDataset(where, cache_dir=cache_dir and join(cache_dir, "meta"))[0]
    except Exception as e:  # missing folder, bucket or index: the same advice
        if why := missing_credentials(input_dir, e):
            raise DataError(why) from e
        local = "://" not in input_dir and os.path.isdir(input_dir)
        converted = local and os.path.isfile(join(join(input_dir, "train"), "index.json"))
        if local and not converted and not os.path.isdir(where) and class_names(Path(input_dir)):
            raise DataError(  # a folder of images, not a conversion of one
                f"{input_dir} is a folder of images, not a litlab dataset; train on it with "
                f"data=image_folder data.source.root={input_dir}, or convert it first: "
                f"python -m litlab.data.optimize {input_dir} <another folder>"
            ) from e
        raise DataError(
            f"no litlab dataset at {input_dir} ({type(e).__name__}: {e}); convert one first: "
            f"python -m litlab.data.optimize /path/to/images {input_dir}"
        ) from e
    meta = json.loads(item["json"])
    if meta.get("unfinished"):
        raise DataError(
            f"{input_dir} holds an unfinished conversion of {meta.get('source')} (interrupted); "
            + convert_again(meta.get("source"), input_dir)
        )
    if meta.get("format") != META_FORMAT:
        raise DataError(
            f"{input_dir} was written by another version of litlab.data.optimize (format "
            f"{meta.get('format')}, this litlab reads {META_FORMAT}); convert it again"
        )
    return meta


def encode_labels(labels: list[int]) -> str:
    """A split's labels as a meta item's text: int32, zlib, base64 (ImageNet's 1.28M: ~3 MB)."""
    packed = zlib.compress(torch.tensor(labels, dtype=torch.int32).numpy().tobytes())
    return json.dumps({"labels": base64.b64encode(packed).decode(), "count": len(labels)})


def read_labels(
    input_dir: str, cache_dir: str | None, split: str, meta: dict[str, Any] | None = None
) -> torch.Tensor | None:
    """A converted split's labels in stream order (index i: the split's item i), from DST/meta
    (``meta``: its item 0, where already read); None for a conversion that did not record them
    (made before they were, or where LitData's counts disagreed)."""
    meta = read_meta(input_dir, cache_dir) if meta is None else meta
    item = meta.get("label_items", {}).get(split)
    if item is None:
        return None
    where = join(input_dir, "meta")
    text = _litdata().StreamingDataset(where, cache_dir=cache_dir and join(cache_dir, "meta"))[item]
    record = json.loads(text["json"])
    packed = zlib.decompress(base64.b64decode(record["labels"]))
    labels = torch.frombuffer(bytearray(packed), dtype=torch.int32).long()
    return labels if len(labels) == record["count"] else None


# LitData shuffles a chunk's items as aligned blocks of this many, in a new order each epoch,
# and each block's items among themselves (data.source.shuffle_window). Its default, 256, made a
# batch of 128 or 256 take its images from one block: the same groups of images every epoch.
# Reading jumps between blocks cost time (LitData 0.2.76; docs/benchmarks.md, 2 CPU cores): a
# whole-chunk permutation read 4.3-5.4x slower than blocks of 256, blocks of 32 1.11-1.15x. So 32:
# a batch of 128 mixes four groups of 32 in another combination every epoch.
ITEM_SHUFFLE_WINDOW = 32


class Streaming(Source):
    """A dataset converted by ``python -m litlab.data.optimize``, streamed from ``input_dir``
    (a local folder or an ``s3://``, ``gs://``, ``azure://`` URL) with LitData. Remote chunks are
    cached under ``cache_dir`` (LitData's default when null), at most ``max_cache_size`` of them
    (e.g. "50GB"). Credentials come from the environment (``~/.aws``, AWS_* variables, ...) as
    LitData and boto3 read them; nothing here takes or logs a secret. ``decode``: "workers"
    (PIL in the loader's workers) or "device" (JPEGs a batch at a time on the run's device).
    ``shuffle_window``: a chunk's items are shuffled as blocks of this many (ITEM_SHUFFLE_WINDOW)."""

    name = "streaming"

    @property
    def label(self) -> str:
        return f"{self.name} {self.input_dir}"

    own_validation_split = True

    def __init__(
        self,
        input_dir: str,
        size: int,
        channels: int = 3,
        cache_dir: str | None = None,
        max_cache_size: str | None = None,
        decode: str = "workers",
        shuffle_window: int | str = ITEM_SHUFFLE_WINDOW,
    ) -> None:
        check_decoded_shape(size, channels)
        check_decode(decode)
        if not (
            shuffle_window == "full" or (isinstance(shuffle_window, int) and shuffle_window > 1)
        ):
            raise ConfigError(
                f"data.source.shuffle_window must be a number of items above 1 or full, got "
                f"{shuffle_window!r}"
            )
        self.decode, self.shuffle_window = decode, shuffle_window
        self.input_dir = str(input_dir)
        self.size, self.channels = size, channels
        self.cache_dir, self.max_cache_size = cache_dir, max_cache_size
        self._meta: dict[str, Any] | None = None
        self._said_upscaled = False

    @property
    def meta(self) -> dict[str, Any]:
        if self._meta is None:
            self._meta = read_meta(self.input_dir, self.cache_dir)
        return self._meta

    def conversion(self) -> str | None:
        """Which conversion this is: the key of its source's files (names, sizes, times) and
        fractions, the same in a copy of the chunks (kept in checkpoints: resume= elsewhere)."""
        return self.meta.get("source_key")

    def converted_from(self) -> dict[str, Any] | None:
        """The folder the chunks were converted from, the test fraction it held out and the
        --max-side (kept in checkpoints: eval.py on that folder, a copy of it, or chunks
        converted from it again tests the run's held-out share, even where these chunks have
        since moved or been converted again); None where the meta does not say."""
        meta = self.meta
        test = (meta.get("fractions") or {}).get("test")
        if not meta.get("source") or test is None:
            return None
        max_side = (meta.get("options") or {}).get("max_side")
        return {"source": meta["source"], "test": float(test), "max_side": max_side}

    def fingerprints(self, trained: Any = None, validated: Any = None) -> list[list[Any]] | None:
        """The conversion's seeded sample of the files it put in the training split (and a
        validation folder's), with digests of their bytes: eval.py recognises a copy of the
        converted folder by them, as of an image folder (None: converted before 2026-12-07)."""
        return self.meta.get("trained_files")

    def shared_cache(self, nodes: int) -> str | None:
        """Where ``nodes`` (> 1) nodes would download remote chunks into one cache: LitData's
        default, under the home folder, which most clusters share between nodes (review 158:
        ``max_cache_size`` then bounds each node's share of one folder, and the chunks' reference
        counts that keep a node from deleting a chunk another reads rely on file locks across
        nodes); a warning saying what to give instead, else None."""
        remote = "://" in self.input_dir or self.input_dir.startswith("local:")
        if nodes < 2 or not remote or self.cache_dir or os.environ.get("LITDATA_CACHE_DIR"):
            return None
        home = os.path.join(os.path.expanduser("~"), ".lightning", "chunks")
        return (
            f"data.source.cache_dir is not set: the {nodes} nodes download {self.input_dir}'s "
            f"chunks into LitData's default cache, {home}, one folder for all of them where the "
            "home folder is shared (most clusters): data.source.max_cache_size then bounds each "
            "node's share of it, and one node's deletions depend on file locks across nodes; "
            "give each node a cache on its own disk, e.g. data.source.cache_dir=/tmp/litdata"
        )

    def copies(
        self, trained: dict[str, Any], held: tuple[str, Any]
    ) -> list[tuple[str, str]] | None:
        """(held-out image, training image) for each image of the ``held`` split whose source
        file was a byte-for-byte copy of a file converted into an earlier split, as the
        conversion recorded them (``<split>:<class>/<file>``; DataModule._say_copies says
        them); None for a conversion from before they were recorded."""
        recorded = self.meta.get("copies_of_training")
        if recorded is None:
            return None
        return [(held_out, trained) for held_out, trained in recorded.get(held[0], [])]

    @property
    def report(self) -> dict[str, Any]:
        """For summary.json: images per split and the files the conversion skipped."""
        return {"streamed_from": self.input_dir, **self.meta["splits"]}

    def prepare(self, test: bool = True) -> None:
        max_side = (self.meta.get("options") or {}).get("max_side")  # fails early, with what
        if max_side and max_side < self.size and not self._said_upscaled:  # to do, where none
            self._said_upscaled = True
            log.warning(  # (walkthrough 150: not a word)
                "%s was converted with --max-side %d, below data.source.size=%d: every image "
                "is enlarged to be decoded at that size (the centre square of its shorter "
                "side); convert again with a --max-side at least data.source.size x the "
                "images' longer/shorter side (e.g. %d for 4:3 images), or decode smaller "
                "(data.source.size and data.image_shape)",
                self.input_dir,
                max_side,
                self.size,
                -(-self.size * 4 // 3),
            )

    def load(self, split: str) -> Any:
        """The split as a ``StreamingDataset`` of (uint8 [C, size, size], label), with its
        classes, image count and sample shape attached for the DataModule."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        _litdata()
        from litlab.data.litdata_shuffle import StreamingDataset  # (imports LitData)

        try:
            dataset = StreamingDataset(
                join(self.input_dir, split),
                cache_dir=self.cache_dir and join(self.cache_dir, split),
                max_cache_size=self.max_cache_size,
                transform=DecodeImage(
                    self.size, self.channels, self.decode == "device", join(self.input_dir, split)
                ),
                item_shuffle_window=self.shuffle_window,
            )
        except (FileNotFoundError, ValueError) as e:  # a split folder or its index missing
            if isinstance(e, ValueError) and "index.json" not in str(e):
                raise  # another of LitData's checks: its own message
            raise DataError(
                f"{self.input_dir} has no readable {split} split ({type(e).__name__}: {e}); "
                + convert_again(self.meta.get("source"), self.input_dir)
            ) from e
        damaged = damaged_chunk(join(self.input_dir, split))
        if damaged:  # (a copy cut short, a file deleted: review 172)
            raise DataError(
                f"{join(join(self.input_dir, split), damaged)} is missing or cut short; "
                + convert_again(self.meta.get("source"), self.input_dir)
            )
        shuffle_as_on_a_local_disk(dataset)  # on NFS/Lustre too: every item, new rank shares
        dataset.classes = self.meta["classes"]
        dataset.images = self.meta["splits"][split]["images"]  # all ranks' (len: this rank's)
        dataset.read_labels = partial(read_labels, self.input_dir, self.cache_dir, split, self.meta)
        dataset.sample_shape = (self.channels, self.size, self.size)
        return dataset


def streaming_loader_class() -> type:
    """LitData's ``StreamingDataLoader``, with what resuming needs (built on first use, so
    that LitData is imported only by runs that stream)."""
    litdata = _litdata()
    from litlab.data.litdata_shuffle import CUT  # (imports LitData)

    class StreamingLoader(litdata.StreamingDataLoader):
        """Streams each pass in the order of the trainer's epoch at that pass (``epoch``: a run
        resumed at an epoch's end continues with the next epoch's order, not that epoch's
        again), continues an epoch from the batches the trainer counts as trained (``trained``: a
        checkpoint written inside a batch, as Lightning's SLURM handler writes, holds a
        position one batch ahead, and the trainer runs that batch again), and refuses to
        continue an epoch on another number of ranks, workers or batch size (the rest of that
        epoch would be another set of images). ``pad_to``: an evaluation's batches on this rank
        to the number every rank runs (given this rank's own, it answers the largest), the
        rest empty batches, as a batch of unreadable files is (under FSDP each evaluation
        forward is a collective: a rank with a batch more would wait for the others forever)."""

        def __init__(
            self,
            dataset: Any,
            *args: Any,
            trained: Callable[[], int] | None = None,
            epoch: Callable[[], int] | None = None,
            pad_to: Callable[[int], int] | None = None,
            **kwargs: Any,
        ):
            # The workers' seeds from the rank's own "loader" stream: torch's DataLoader draws
            # them from the global generator at each iter() otherwise (with 0 workers too),
            # which a resumed run restores as it was mid-epoch: every later augmentation and
            # dropout draw would be shifted by one (litlab.data.loader.ResumableDataLoader).
            rank, _ = rank_and_world()
            kwargs.setdefault("generator", rng.stream(getattr(dataset, "seed", 0), rank, "loader"))
            if kwargs.get("num_workers", 0) > 0:  # stop signals to the group: not the workers
                kwargs.setdefault("worker_init_fn", worker_init(rank))
            super().__init__(dataset, *args, **kwargs)
            self._trained, self._epoch = trained, epoch
            self._continued = False  # a pass from a loaded state (load_state_dict) has begun
            self._old_cut = False  # continuing an epoch cut as LitData does (load_state_dict)
            # asked once, on every rank together (the answer is a collective)
            self._padded = pad_to(super().__len__()) if pad_to is not None else None

        def __len__(self) -> int:
            return super().__len__() if self._padded is None else self._padded

        def __iter__(self) -> Any:
            # LitData continues from a loaded state (`restore`) until a pass runs out; Lightning
            # ends an epoch after len(loader) batches without running the pass out, so the
            # epoch after the continued one would continue from its end again: no batches.
            if self.restore and self._continued:
                self.restore = False
            self._continued = self.restore
            if not self.restore and self._old_cut:  # the checkpoint's epoch done (review 148)
                self.dataset.cut_at_random, self.dataset.shuffler, self._old_cut = True, None, False
            if not self.restore and self._epoch is not None:
                self.current_epoch = self._epoch()  # LitData counts from 1: it adds 1 here
            if self._padded is None:
                return super().__iter__()
            return self._padded_pass()

        def _padded_pass(self) -> Any:
            count = 0
            for batch in super().__iter__():
                count += 1
                yield batch
            for _ in range(self._padded - count):
                yield skip_unreadable([])  # an empty batch, as of files all unreadable

        def state_dict(self) -> dict[str, Any]:
            return {**super().state_dict(), CUT: getattr(self.dataset, "cut_at_random", False)}

        def load_state_dict(self, state: dict[str, Any]) -> None:
            saved = state["dataset"]
            if not state.get(CUT) and getattr(self.dataset, "cut_at_random", False):
                # stopped by a litlab before 2026-12-07: its epoch goes on as it began
                self.dataset.cut_at_random, self.dataset.shuffler = False, None
                self._old_cut = True
                log.info(
                    "this checkpoint's run streamed with LitData's epoch cut (the same images "
                    "left out of every epoch where its chunk order repeats): the epoch it "
                    "stopped in goes on so, the later ones leave out other images every epoch"
                )
            _, world_size = rank_and_world()
            now = (world_size, max(1, self.num_workers), self.batch_size)
            then = (saved["world_size"], saved["num_workers"], saved["batch_size"])
            if now != then:
                raise ConfigError(
                    "this checkpoint stopped mid-epoch with (ranks, data.num_workers, "
                    f"data.batch_size) = {then}, this run has {now} (data.num_workers=0 counts "
                    "as 1): resume with the same values (or from a checkpoint written at an "
                    "epoch's end)"
                )
            layout = (self.dataset.subsampled_files, self.dataset.region_of_interest)
            if _as_lists(layout) != _as_lists(
                (saved["subsampled_files"], saved["region_of_interest"])
            ):
                raise ConfigError(
                    f"{self.dataset.input_dir.url or self.dataset.input_dir.path} lays its images "
                    "out in other chunks than those this checkpoint stopped mid-epoch in "
                    "(converted again, with other chunk sizes): its place in the epoch would "
                    "point at other images; resume on the chunks it trained on (or from a "
                    "checkpoint written at an epoch's end)"
                )
            # The chunks where they are now: a copy of the run's conversion (the checkpoint's
            # key of it is checked as the fit begins: DataModule) moved or copied elsewhere, as
            # data.source.input_dir may be; LitData refused its own state's other path with a
            # traceback (walkthrough 168)
            where = self.dataset.input_dir
            moved = {"input_dir_url": where.url, "input_dir_path": where.path}
            state = {**state, "dataset": {**saved, **moved}}
            if self._trained is not None:
                state = _rewound(state, self._trained(), world_size)
            continue_item_shuffle_window(self.dataset, saved)  # a checkpoint's from before
            super().load_state_dict(state)

    return StreamingLoader


def _as_lists(value: Any) -> Any:
    """Tuples as lists, all the way down (a checkpoint's state holds lists where LitData's
    dataset holds tuples)."""
    if isinstance(value, list | tuple):
        return [_as_lists(v) for v in value]
    return value


def _rewound(state: dict[str, Any], trained: int, world_size: int) -> dict[str, Any]:
    """A StreamingDataLoader state moved back to ``trained`` batches of its epoch, when it is
    ahead (LitData counts what it handed out; its workers take batches in turn)."""
    size, workers = state["dataset"]["batch_size"], state["dataset"]["num_workers"]
    ahead = state["num_samples_yielded"] // size - trained
    if ahead <= 0:
        return state
    state, back = copy.deepcopy(state), ahead * size
    state["num_samples_yielded"] -= back
    state["latest_worker_idx"] = (state["latest_worker_idx"] - ahead) % workers
    state["dataset"]["num_samples_yielded"] -= back
    state["dataset"]["sample_in_epoch"] -= back * world_size
    return state
