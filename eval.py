"""Test a checkpoint: python eval.py ckpt_path=outputs/train/<date>/<time>/checkpoints/best.ckpt"""

from litlab.evaluate import main

if __name__ == "__main__":
    main()
