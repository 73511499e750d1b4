"""train.py as run on a job spanning two kinds of machine (test_distributed): rank 0's CPU
computes bfloat16 natively, the other ranks' do not (litlab.hardware's detection answers so)."""

import os

import litlab.hardware
from litlab.train import main

litlab.hardware.cpu_has_native_bf16 = lambda: os.environ.get("RANK") == "0"

if __name__ == "__main__":
    main()
