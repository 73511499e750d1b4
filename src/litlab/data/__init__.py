"""Image data: sources say where pixels come from; the DataModule owns everything else."""

from litlab.data.datamodule import DataModule
from litlab.data.folder import ImageFolder
from litlab.data.loader import DeviceLoader
from litlab.data.sources import CIFAR10, MNIST, Digits, FashionMNIST, Source, Synthetic
from litlab.data.streaming import Streaming

__all__ = [
    "CIFAR10",
    "MNIST",
    "DataModule",
    "DeviceLoader",
    "Digits",
    "FashionMNIST",
    "ImageFolder",
    "Source",
    "Streaming",
    "Synthetic",
]
