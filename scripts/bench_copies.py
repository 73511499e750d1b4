"""Time and memory of the streaming conversion's search for copies of training files among the
validation images (litlab.data.optimize.recorded_copies), at a given number of training files.

The records are what the conversion's writers leave (one ``[digest, name]`` line an image);
5 validation images are copies of training files. The search runs in a fresh process, after
its imports, so that its peak resident memory above them is its own:

    python scripts/bench_copies.py --files 1000000

Compare two versions of the code by running it with each one's src/ first on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

MEASURE = """
import resource, sys, time
from pathlib import Path
from litlab.data.optimize import recorded_copies
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
found = recorded_copies({"train": Path(sys.argv[1]) / "train", "val": Path(sys.argv[1]) / "val"})
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(f"{seconds:.2f} s, {(peak - before) / 1024:.0f} MB above the imports, "
      f"{len(found.get('val', []))} copies found")
"""


def write_records(folder: Path, files: int, held: int = 50_000, copies: int = 5) -> None:
    rng = random.Random(0)
    (folder / "train").mkdir(parents=True)
    (folder / "val").mkdir()
    trained = []
    with open(folder / "train" / "0.digests", "w") as out:
        for i in range(files):
            digest = rng.getrandbits(64) - 2**63  # bytes_digest's signed 64 bits
            if i < copies:
                trained.append(digest)
            out.write(json.dumps([digest, f"c{i % 1000:04d}/n{i:08d}.JPEG"]) + "\n")
    with open(folder / "val" / "0.digests", "w") as out:
        for i in range(held):
            out.write(
                json.dumps([rng.getrandbits(64) - 2**63, f"c{i % 1000:04d}/v{i}.JPEG"]) + "\n"
            )
        for i, digest in enumerate(trained):
            out.write(json.dumps([digest, f"c0000/copy{i}.JPEG"]) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=1_000_000, help="training files")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        write_records(Path(folder), args.files)
        print(f"{args.files:,} training files, 50,005 validation files:", flush=True)
        subprocess.run([sys.executable, "-c", MEASURE, folder], check=True)


if __name__ == "__main__":
    main()
