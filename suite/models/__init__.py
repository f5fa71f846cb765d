"""Networks of the two studies, built from config with no weight downloads.

A network is a family (gpt2, llama3, resnet, vgg, mobilenet) and one of its named sizes, each family's sizes declared
once beside its model (`GPT2_SIZES`, `LLAMA3_SIZES`, `RESNET_SIZES`, ...) and selected by conf/network/<name>.yaml. A
point is recorded under the name of what it builds (`resolve_network`): the size's name (`gpt2_tiny`, `resnet18`),
or, where a decoder's dimensions are overridden, the size whose dimensions they are, else a name that states them
(`gpt2_L4_H4_E96`, `llama3_L2_H4_KV2_E64_F192`), so that no name means two networks. `network.width` (vgg,
mobilenet) and `network.dropout` are knobs of a size, recorded beside its name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from torch import nn

from suite.errors import BadValue, ConfigError
from suite.models.gpt2 import GPT2, GPT2_SIZES, GPT2Dims
from suite.models.llama import LLAMA3_SIZES, Llama, LlamaDims
from suite.models.vision import MOBILENET_SIZES, RESNET_SIZES, VGG_LAYOUTS, VGG_SIZES, mobilenet_v2, resnet, vgg


@dataclass(frozen=True)
class NetworkFamily:
    sizes: Mapping[str, Any]  # size -> what builds it (a decoder's dimensions, torchvision's builder or layout)
    separator: str  # between family and size in a size's name: gpt2_tiny, resnet18
    dims: type | None = None  # a decoder's dimensions (GPT2Dims, LlamaDims), free to override; a CNN's: its size's

    @property
    def dimensions(self) -> tuple[str, ...]:
        return tuple(f.name for f in fields(self.dims)) if self.dims else ()


FAMILIES = {
    "gpt2": NetworkFamily(GPT2_SIZES, "_", GPT2Dims),
    "llama3": NetworkFamily(LLAMA3_SIZES, "_", LlamaDims),
    "resnet": NetworkFamily(RESNET_SIZES, ""),
    "vgg": NetworkFamily(VGG_SIZES, ""),
    "mobilenet": NetworkFamily(MOBILENET_SIZES, "_"),
}
DECODERS = tuple(name for name, family in FAMILIES.items() if family.dims)  # token networks, split alike
# Every family's dimensions; a network's config sets those of other families to 0
DIMENSIONS = tuple(dict.fromkeys(dim for family in FAMILIES.values() for dim in family.dimensions))


def size_name(family: str, size: str) -> str:
    """The name a family's size is configured and recorded by: conf/network/<name>.yaml."""
    return f"{family}{FAMILIES[family].separator}{size}"


def network_names() -> list[str]:
    """The name of every named size of every family."""
    return [size_name(family, size) for family, f in FAMILIES.items() for size in f.sizes]


RESNETS = tuple(RESNET_SIZES.values())
CNNS = (*RESNETS, *VGG_LAYOUTS, *(size_name("mobilenet", size) for size in MOBILENET_SIZES))
ARCHS = (*CNNS, *DECODERS)


def resolve_network(net):
    """Complete a composed network config in place (and return it) from its family and size: the architecture
    built, a decoder's dimensions that no override gave (another family's dimensions are 0, whatever was given: a
    CNN's size fixes its layers), and the name it is recorded by, which is what is built: the name of the family's
    size of these dimensions (network.size is then that size), else the dimensions' `name` (`GPT2Dims.name`;
    network.size null). Idempotent. BadValue (one line,
    naming the choices) for an unknown family or size, or a name or architecture set by hand that is not what is
    built."""
    family = FAMILIES.get(net.family)
    if family is None:
        raise BadValue(f"network.family={net.family} is not one of {', '.join(FAMILIES)}")
    size = None if net.size is None else str(net.size)
    sizes = ", ".join(family.sizes)
    if size is not None and size not in family.sizes:
        raise BadValue(f"network.size={size} is not a size of {net.family}: one of {sizes}")
    for dim in DIMENSIONS:  # a grid-wide override (bench-model's ARGS=network.n_layer=1) leaves other families be
        if dim not in family.dimensions:
            setattr(net, dim, 0)
    if family.dims:
        for dim in family.dimensions:
            if getattr(net, dim) is None:
                if size is None:
                    raise BadValue(f"network.{dim} is not given and network.size is null: give a size ({sizes}) "
                                   f"or every dimension ({', '.join(family.dimensions)})")
                setattr(net, dim, getattr(family.sizes[size], dim))
        dims = family.dims(**{dim: getattr(net, dim) for dim in family.dimensions})
        size = next((s for s, d in family.sizes.items() if d == dims), None)
        arch = net.family
        name = size_name(net.family, size) if size is not None else dims.name()
    else:
        if size is None:
            raise BadValue(f"network.size=null: a {net.family} network is one of its sizes ({sizes})")
        arch = name = size_name(net.family, size)
    if net.arch not in (None, arch):
        raise BadValue(f"network.arch={net.arch} is set by network.family and network.size (here {arch}): "
                       "choose the network with network=<name> or network.size")
    if net.name not in (None, name):
        raise BadValue(f"network.name={net.name} is the name of what is built (here {name}): choose the network "
                       "with network=<name>, network.size or its dimensions")
    net.size, net.arch, net.name = size, arch, name
    return net


def llama_dims(net) -> LlamaDims:
    """The dimensions of a resolved Llama 3 network config."""
    return LlamaDims(**{dim: getattr(net, dim) for dim in FAMILIES["llama3"].dimensions})


def check_network(net, data) -> None:
    """Raise ConfigError (one line) for a network that cannot be built for this dataset."""
    if net.arch not in ARCHS:
        raise BadValue(f"network.arch={net.arch} is not one of {', '.join(ARCHS)}")
    wants = "tokens" if net.arch in DECODERS else "image"
    if data.kind != wants:
        raise ConfigError(f"network {net.name} ({net.arch}) needs {wants} data, dataset {data.name} is {data.kind}")
    if not 0 <= net.dropout < 1:
        raise BadValue(f"network.dropout={net.dropout} must be in [0, 1)")
    if net.width <= 0:
        raise BadValue(f"network.width={net.width} must be positive")
    if net.arch in RESNETS and net.width != 1:
        raise ConfigError(f"network.width is not supported for {net.arch} (torchvision fixes ResNet widths)")
    dimensions = FAMILIES[net.family].dimensions
    if dimensions and min(getattr(net, dim) for dim in dimensions) <= 0:
        raise BadValue(f"network {net.name}: {', '.join(dimensions)} must be positive")
    if net.arch in DECODERS and net.n_embd % net.n_head:
        raise ConfigError(f"network {net.name}: n_embd={net.n_embd} is not divisible by n_head={net.n_head}")
    if net.arch == "llama3":
        if net.n_head % net.n_kv_head:
            raise ConfigError(f"network {net.name}: n_head={net.n_head} is not divisible by "
                              f"n_kv_head={net.n_kv_head} (query heads share key-value heads in equal groups)")
        if net.n_embd // net.n_head % 2:
            raise ConfigError(f"network {net.name}: its head width n_embd / n_head = {net.n_embd // net.n_head} "
                              "is odd; rotary embeddings rotate pairs of dimensions")
        if net.dropout:
            raise ConfigError(f"network {net.name}: Llama 3 has no dropout; leave network.dropout 0")


def build_model(net, data) -> nn.Module:
    """An untrained network shaped for the dataset, initialised from torch's global RNG (seed it first)."""
    if net.arch == "gpt2":
        return GPT2(data.vocab_size, data.seq_len, net.n_layer, net.n_head, net.n_embd, net.dropout, net.attention)
    if net.arch == "llama3":
        return Llama(data.vocab_size, llama_dims(net), net.attention)
    if net.arch in RESNETS:
        return resnet(net.arch, data.channels, data.num_classes, data.image_size)
    if net.arch in VGG_LAYOUTS:
        return vgg(net.arch, data.channels, data.num_classes, data.image_size, net.width, net.dropout)
    return mobilenet_v2(data.channels, data.num_classes, data.image_size, net.width, net.dropout)
