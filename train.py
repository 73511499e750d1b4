"""Train a model: python train.py [group=option ...] [key=value ...] (see --help)."""

from litlab.train import main

if __name__ == "__main__":
    main()
