"""Every network of the studies as an ordered list of layers, the unit a pipeline cuts between.

A ResNet or MobileNetV2 block is one layer, a VGG convolution, activation or pool is one layer,
GPT-2 and Llama 3 are [embedding, block, ..., block, head]. Running the layers one after the other computes
exactly what the network's own `forward` does. Each layer keeps the parameter names it has in the
whole network (`prefix` + its own name), so a pipeline stage can report its weights under the names
of the single-process model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from suite.models.gpt2 import GPT2
from suite.models.llama import Llama
from suite.models.vision import CompactVGG
from suite.runtime.torch_api import is_dtensor


@dataclass
class Layer:
    prefix: str  # "" for layers that gather several top-level modules under their own names
    module: nn.Module

    def named_state(self) -> dict[str, torch.Tensor]:
        """This layer's weights and buffers on the host, under their names in the whole network; split ones
        (tensor parallelism) gathered whole, a collective their ranks join."""
        return {self.prefix + k: (v.full_tensor() if is_dtensor(v) else v).detach().cpu()
                for k, v in self.module.state_dict().items()}


class Stem(nn.Module):
    """Top-level modules of the network applied in order, under their own attribute names."""

    def __init__(self, **modules: nn.Module) -> None:
        super().__init__()
        for name, module in modules.items():
            self.add_module(name, module)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for module in self.children():
            x = module(x)
        return x


class PoolHead(nn.Module):
    """Global average pooling, flatten, classifier: the end of every CNN here."""

    def __init__(self, pool: nn.Module, classifier_name: str, classifier: nn.Module) -> None:
        super().__init__()
        self.pool = pool
        self.classifier_name = classifier_name
        self.add_module(classifier_name, classifier)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self, self.classifier_name)(torch.flatten(self.pool(x), 1))


class GPT2Embedding(nn.Module):
    def __init__(self, model: GPT2) -> None:
        super().__init__()
        self.tok_emb, self.pos_emb, self.drop = model.tok_emb, model.pos_emb, model.drop

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        return self.drop(self.tok_emb(idx) + self.pos_emb(positions))


class GPT2Head(nn.Module):
    def __init__(self, model: GPT2) -> None:
        super().__init__()
        self.ln_f, self.head = model.ln_f, model.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln_f(x))


def _numbered(prefix: str, modules: nn.Sequential) -> list[Layer]:
    return [Layer(f"{prefix}{i}.", module) for i, module in enumerate(modules)]


def flatten_layers(model: nn.Module) -> list[Layer]:
    """The network as layers; parameters stay shared with `model` (tied weights stay tied)."""
    from torchvision.models import MobileNetV2, ResNet  # here: see suite.models.vision

    if isinstance(model, GPT2):
        return [Layer("", GPT2Embedding(model)), *_numbered("blocks.", model.blocks), Layer("", GPT2Head(model))]
    if isinstance(model, Llama):
        return [Layer("", Stem(tok_emb=model.tok_emb)), *_numbered("blocks.", model.blocks),
                Layer("", Stem(ln_f=model.ln_f, head=model.head))]
    if isinstance(model, ResNet):
        blocks = [layer for name in ("layer1", "layer2", "layer3", "layer4")
                  for layer in _numbered(f"{name}.", getattr(model, name))]
        stem = Stem(conv1=model.conv1, bn1=model.bn1, relu=model.relu, maxpool=model.maxpool)
        return [Layer("", stem), *blocks, Layer("", PoolHead(model.avgpool, "fc", model.fc))]
    if isinstance(model, CompactVGG):
        return [*_numbered("features.", model.features),
                Layer("", PoolHead(model.avgpool, "classifier", model.classifier))]
    if isinstance(model, MobileNetV2):
        return [*_numbered("features.", model.features),
                Layer("", PoolHead(nn.AdaptiveAvgPool2d(1), "classifier", model.classifier))]
    if hasattr(model, "features") and hasattr(model, "classifier"):  # torchvision's VGG (ImageNet head)
        stem = Stem(avgpool=model.avgpool, flatten=nn.Flatten(1))
        return [*_numbered("features.", model.features), Layer("", stem), *_numbered("classifier.", model.classifier)]
    raise TypeError(f"no layer list for {type(model).__name__}")


def block_layers(model: nn.Module) -> list[Layer]:
    """The layers that are the network's own submodules and hold parameters (a decoder block, a ResNet block,
    a VGG convolution; not the wrappers that `flatten_layers` builds around a network's ends)."""
    return [layer for layer in flatten_layers(model) if layer.prefix and any(True for _ in layer.module.parameters())]


def tied_parameters(layers: list[Layer]) -> list[list[tuple[int, str]]]:
    """Groups of (layer index, name) that hold one shared parameter in different layers (GPT-2's
    embedding and LM head)."""
    seen: dict[int, list[tuple[int, str]]] = {}
    for index, layer in enumerate(layers):
        for name, param in layer.module.named_parameters(remove_duplicate=False):
            places = seen.setdefault(id(param), [])
            if all(i != index for i, _ in places):
                places.append((index, name))
    return [places for places in seen.values() if len(places) > 1]
