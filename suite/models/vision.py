"""torchvision's CNNs, untrained, adapted to the dataset's channels, resolution and classes.

For small inputs (CIFAR, MNIST, digits) they are changed as Study J did: ResNets get the CIFAR stem
(3x3 stride-1 convolution, no max-pool), MobileNetV2 keeps full resolution in its first layer, and
VGG keeps only the max-pools the resolution allows, with a global-pool + linear head in place of
the 4096-wide ImageNet classifier.

torchvision (with the torch._dynamo it imports: a second or more) is imported where a network is built,
so that the driver, which only checks networks, starts without it.
"""

from __future__ import annotations

import math

import torch
from torch import nn

SMALL_INPUT = 64  # images up to this side are "small" (CIFAR-style adaptations)
RESNET_STEM_CHANNELS = 64
# The named sizes of each family, declared once: size 18 of resnet is `network=resnet18`.
RESNET_SIZES = {"18": "resnet18", "50": "resnet50", "152": "resnet152"}  # torchvision's builder of each
VGG_SIZES = {"11": "A", "16": "D"}  # torchvision's names for the layer lists of the VGG paper
MOBILENET_SIZES = {"v2": "mobilenet_v2"}
VGG_LAYOUTS = {f"vgg{size}": layout for size, layout in VGG_SIZES.items()}


def _conv(in_channels: int, out_channels: int, kernel: int, stride: int) -> nn.Conv2d:
    """A bias-free convolution initialised as torchvision initialises ResNet and MobileNetV2."""
    conv = nn.Conv2d(in_channels, out_channels, kernel, stride, kernel // 2, bias=False)
    nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
    return conv


def resnet(arch: str, channels: int, classes: int, image_size: int) -> nn.Module:
    import torchvision

    model = getattr(torchvision.models, arch)(weights=None, num_classes=classes)
    if image_size <= SMALL_INPUT:
        model.conv1 = _conv(channels, RESNET_STEM_CHANNELS, 3, 1)
        model.maxpool = nn.Identity()
    elif channels != 3:
        model.conv1 = _conv(channels, RESNET_STEM_CHANNELS, 7, 2)
    return model


class CompactVGG(nn.Module):
    """VGG features, global average pooling and one linear layer: the head of CIFAR-style VGGs."""

    def __init__(self, features: nn.Sequential, feature_channels: int, classes: int) -> None:
        super().__init__()
        self.features = features
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(feature_channels, classes)
        for module in self.modules():  # torchvision's VGG initialisation
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, 0, 0.01)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


def vgg(arch: str, channels: int, classes: int, image_size: int, width: float, dropout: float) -> nn.Module:
    """Plain VGG (no batch-norm). The ImageNet classifier is kept only at full width on large inputs,
    since its first layer expects 512 x 7 x 7 features."""
    from torchvision.models.vgg import VGG, cfgs, make_layers

    max_pools = int(math.log2(image_size))  # each pool halves the side; stop at one pixel
    layout: list[int | str] = []
    for entry in cfgs[VGG_LAYOUTS[arch]]:
        if entry != "M":
            layout.append(max(1, round(entry * width)))
        elif layout.count("M") < max_pools:
            layout.append("M")
    features = make_layers(layout, batch_norm=False)
    features[0] = nn.Conv2d(channels, layout[0], 3, padding=1)
    if image_size <= SMALL_INPUT or width != 1:
        feature_channels = [entry for entry in layout if entry != "M"][-1]
        return CompactVGG(features, feature_channels, classes)
    return VGG(features, num_classes=classes, dropout=dropout)  # initialises every layer, the new conv too


def mobilenet_v2(channels: int, classes: int, image_size: int, width: float, dropout: float) -> nn.Module:
    import torchvision

    model = torchvision.models.mobilenet_v2(weights=None, num_classes=classes, width_mult=width, dropout=dropout)
    first = model.features[0][0]
    if channels != 3 or image_size <= SMALL_INPUT:
        model.features[0][0] = _conv(channels, first.out_channels, 3, 1 if image_size <= SMALL_INPUT else 2)
    return model
