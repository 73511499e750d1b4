"""Train a model: python train.py [group=option ...] [key=value ...] (see --help)."""

from litlab.entry import run

if __name__ == "__main__":
    run("litlab.train")
