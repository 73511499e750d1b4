"""Test a checkpoint: python eval.py ckpt_path=outputs/train/<date>/<time>/checkpoints/best.ckpt"""

from litlab.entry import run

if __name__ == "__main__":
    run("litlab.evaluate")
