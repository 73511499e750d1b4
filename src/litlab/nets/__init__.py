"""Plain nn.Modules: architecture only, no Lightning, no Hydra."""

from litlab.nets.cnn import SmallCNN
from litlab.nets.dcgan import Discriminator, Generator
from litlab.nets.resnet import ResNet
from litlab.nets.torchvision_net import TorchvisionNet

__all__ = ["Discriminator", "Generator", "ResNet", "SmallCNN", "TorchvisionNet"]
