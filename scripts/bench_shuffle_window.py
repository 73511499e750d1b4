"""P2 streamed data: the cost of LitData's in-chunk shuffle window, read as litlab reads a
converted dataset for training (litlab.data.streaming: DecodeImage in the loader).

    python scripts/make_image_folder.py .data/digits_png --source digits --format png
    python -m litlab.data.optimize .data/digits_png .data/digits_chunks
    python scripts/bench_shuffle_window.py .data/digits_chunks            # about 1 min

One shuffled training epoch of the converted split (batch 128, --workers loader workers) per
window: LitData shuffles a chunk's items as aligned blocks of that many, in a new order each
epoch, and the items of a block among themselves ("full": the whole chunk as one permutation).
Alternating rounds after a warm-up round; "x 256 paired" is the median of the rounds' ratios
to LitData's default, 256 (litlab's choice: streaming.ITEM_SHUFFLE_WINDOW). Results:
docs/benchmarks.md, "P2 streamed: the in-chunk shuffle window".
"""

from __future__ import annotations

import time

import benchlib
from benchlib import Measure

from litlab.data.decode import skip_unreadable
from litlab.data.streaming import DecodeImage, join, streaming_loader_class


def epoch(chunks: str, window: int | str, size: int, workers: int) -> Measure:
    import litdata

    dataset = litdata.StreamingDataset(
        join(chunks, "train"), transform=DecodeImage(size, 3), item_shuffle_window=window
    )
    dataset.seed = 1
    loader = streaming_loader_class()(
        dataset,
        batch_size=128,
        shuffle=True,
        drop_last=True,
        collate_fn=skip_unreadable,
        num_workers=workers,
    )
    start = time.perf_counter()
    images = sum(len(batch[1]) for batch in loader)
    seconds = time.perf_counter() - start
    return {"s": seconds, "img/s": images / seconds}


def main() -> None:
    parser = benchlib.arguments(__doc__, repeats=5, data_dir=False)
    parser.add_argument("chunks", help="a dataset converted by python -m litlab.data.optimize")
    parser.add_argument("--windows", nargs="+", default=["256", "32", "16", "full"])
    parser.add_argument("--size", type=int, default=28, help="decoded pixels a side (28)")
    parser.add_argument("--workers", type=int, default=0, help="loader workers (0)")
    args = parser.parse_args()
    windows = [int(w) if w.isdigit() else w for w in args.windows]
    if 256 not in windows:
        windows.insert(0, 256)
    print(benchlib.machine(benchlib.device_arg("cpu")))
    variants = {
        str(w): (lambda warm, w=w: epoch(args.chunks, w, args.size, args.workers)) for w in windows
    }
    results = benchlib.interleaved(variants, args.repeats)
    medians = benchlib.medians(results)
    rows = [
        [
            name,
            f"{m['s']:.3f}",
            f"{m['img/s']:,.0f}",
            f"{benchlib.paired_ratio(results, name, '256', 's'):.3f}",
        ]
        for name, m in medians.items()
    ]
    print(f"\n{benchlib.rounds_caption(results)}, batch 128, {args.workers} workers:")
    benchlib.print_table(["window", "epoch s", "img/s", "x 256 paired"], rows, [])


if __name__ == "__main__":
    main()
