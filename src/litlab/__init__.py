"""litlab: Lightning + Hydra + Weights & Biases experiments for image classifiers and GANs."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("litlab")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0+src"
