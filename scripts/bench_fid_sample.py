"""FID's real sample: is a streamed split's sample as representative as the same images' in a
folder? The FID floor (real test images against a sample of --num-real real training images)
of one image folder read three ways, over --seeds sample seeds, with one extractor:

    python scripts/make_image_folder.py /tmp/fid/folder --format png --limit 6000
    python -m litlab.data.optimize /tmp/fid/folder /tmp/fid/chunks
    python scripts/bench_fid_sample.py /tmp/fid/folder /tmp/fid/chunks     # ~30 s on 2 cores

- folder: data=image_folder (a class-stratified sample);
- stream: data=streaming on the conversion (class-stratified from the labels it recorded);
- stream, old conversion: the same chunks with the meta of a conversion made before the labels
  were recorded (a uniform sample), written beside the chunks (<chunks>-without-labels).
The extractor is litlab's auto one (a small classifier trained on the folder's training split,
cached under --cache). Printed per side: the floor's mean and each seed's, and how far the
sample's largest class count is from an even share. Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import benchlib
import numpy as np
import torch
from scipy import linalg

from litlab.config import build
from litlab.data.optimize import _write_meta
from litlab.data.streaming import _litdata, join
from litlab.metrics.fid import domain_classifier


def without_labels(chunks: Path) -> Path:
    """A copy of the conversion whose meta lacks the recorded labels (as an older litlab's)."""
    old = chunks.with_name(f"{chunks.name}-without-labels")
    if not old.exists():
        shutil.copytree(chunks, old)
        meta = json.loads(_litdata().StreamingDataset(join(str(chunks), "meta"))[0]["json"])
        _write_meta(str(old), {k: v for k, v in meta.items() if k != "label_items"})
    return old


def frechet(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    (m1, s1), (m2, s2) = a, b
    root = linalg.sqrtm(s1 @ s2).real
    return float(((m1 - m2) ** 2).sum() + np.trace(s1 + s2 - 2 * root))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("folder", type=Path, help="an image folder (make_image_folder.py)")
    parser.add_argument("chunks", type=Path, help="its conversion (python -m litlab.data.optimize)")
    parser.add_argument("--num-real", type=int, default=600, help="sample size (default 600)")
    parser.add_argument("--seeds", type=int, default=5, help="sample seeds 0..N-1 (default 5)")
    parser.add_argument("--cache", default="/tmp/litlab-fid-sample", help="extractor cache")
    args = parser.parse_args()
    print(benchlib.machine(torch.device("cpu")))
    benchlib.quiet()
    source = ["data.source.channels=1", "data.source.size=28"]
    common = ["data.num_classes=10", "data.image_shape=[1,28,28]"]
    common += ["data.mean=[0.286]", "data.std=[0.353]"]
    sides = {
        "folder": ["data=image_folder", f"data.source.root={args.folder.resolve()}"],
        "stream": ["data=streaming", f"data.source.input_dir={args.chunks.resolve()}"],
        "stream, old conversion": [
            "data=streaming",
            f"data.source.input_dir={without_labels(args.chunks.resolve())}",
        ],
    }
    out = benchlib.REPO / "outputs" / "unused"
    data = {
        name: build(benchlib.compose([*o, *source, *common], out).data, "data")
        for name, o in sides.items()
    }
    images, labels = data["folder"].eval_arrays("train")
    extractor = domain_classifier(images, labels, [0.286], [0.353], args.cache)

    def statistics(x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        f = torch.cat([extractor(c.float() / 255) for c in x.split(1000)]).double().numpy()
        return f.mean(0), np.cov(f, rowvar=False)

    n = args.num_real
    test = statistics(data["folder"].eval_arrays("test", n, seed=0)[0])
    print(f"\nFID floor: {n} test images against {n} training images, seeds 0-{args.seeds - 1}")
    rows = []
    for name, datamodule in data.items():
        floors, off = [], []
        for seed in range(args.seeds):
            x, y = datamodule.eval_arrays("train", n, seed=seed)
            floors.append(frechet(test, statistics(x)))
            counts = torch.bincount(y, minlength=10).float()
            off.append(float((counts - n / 10).abs().max()))
        seeds = ", ".join(f"{f:.2f}" for f in floors)
        rows.append([name, f"{np.mean(floors):.3f}", seeds, f"{np.mean(off):.1f}"])
    header = ["sample of", "floor, mean", "floor by seed", "largest class off N/10, mean"]
    benchlib.print_table(header, rows, [])


if __name__ == "__main__":
    main()
