"""Plain nn.Modules: architecture only, no Lightning, no Hydra."""

from litlab.nets.cnn import SmallCNN
from litlab.nets.resnet import ResNet
from litlab.nets.torchvision_net import TorchvisionNet

__all__ = ["ResNet", "SmallCNN", "TorchvisionNet"]
