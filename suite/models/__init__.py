"""Networks of the two studies, built from config with no weight downloads."""

from __future__ import annotations

from torch import nn

from suite.errors import BadValue, ConfigError
from suite.models.gpt2 import GPT2
from suite.models.vision import VGG_LAYOUTS, mobilenet_v2, resnet, vgg

RESNETS = ("resnet18", "resnet50", "resnet152")
CNNS = (*RESNETS, *VGG_LAYOUTS, "mobilenet_v2")
ARCHS = (*CNNS, "gpt2")


def check_network(net, data) -> None:
    """Raise ConfigError (one line) for a network that cannot be built for this dataset."""
    if net.arch not in ARCHS:
        raise BadValue(f"network.arch={net.arch} is not one of {', '.join(ARCHS)}")
    wants = "tokens" if net.arch == "gpt2" else "image"
    if data.kind != wants:
        raise ConfigError(f"network {net.name} ({net.arch}) needs {wants} data, dataset {data.name} is {data.kind}")
    if not 0 <= net.dropout < 1:
        raise BadValue(f"network.dropout={net.dropout} must be in [0, 1)")
    if net.width <= 0:
        raise BadValue(f"network.width={net.width} must be positive")
    if net.arch in RESNETS and net.width != 1:
        raise ConfigError(f"network.width is not supported for {net.arch} (torchvision fixes ResNet widths)")
    if net.arch == "gpt2":
        if min(net.n_layer, net.n_head, net.n_embd) <= 0:
            raise BadValue(f"network {net.name}: n_layer, n_head and n_embd must be positive")
        if net.n_embd % net.n_head:
            raise ConfigError(f"network {net.name}: n_embd={net.n_embd} is not divisible by n_head={net.n_head}")


def build_model(net, data) -> nn.Module:
    """An untrained network shaped for the dataset, initialised from torch's global RNG (seed it first)."""
    if net.arch == "gpt2":
        return GPT2(data.vocab_size, data.seq_len, net.n_layer, net.n_head, net.n_embd, net.dropout)
    if net.arch in RESNETS:
        return resnet(net.arch, data.channels, data.num_classes, data.image_size)
    if net.arch in VGG_LAYOUTS:
        return vgg(net.arch, data.channels, data.num_classes, data.image_size, net.width, net.dropout)
    return mobilenet_v2(data.channels, data.num_classes, data.image_size, net.width, net.dropout)
