"""Networks: shapes for every dataset, published parameter counts, GPT-2's structure and causality, checks."""

import math
import re

import pytest
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.utils.data import DataLoader
from torchvision.models import VGG

from suite.config import DatasetConfig, NetworkConfig
from suite.data import build_datasets
from suite.errors import ConfigError
from suite.models import (
    ARCHS,
    DECODERS,
    FAMILIES,
    build_model,
    check_network,
    network_names,
    resolve_network,
    size_name,
)
from suite.models.gpt2 import GPT2_SIZES
from suite.paths import CONF_DIR

CNNS = [arch for arch in ARCHS if arch not in DECODERS]
SMALL_TOKENS = {"vocab_size": 97, "seq_len": 16}


def load_conf(group: str, file: str, schema: type, overrides: dict) -> DictConfig:
    """conf/<group>/<file>.yaml against the schema, as Hydra would compose it, with overrides."""
    raw = OmegaConf.load(CONF_DIR / group / f"{file}.yaml")
    raw.pop("defaults")
    return OmegaConf.merge(OmegaConf.structured(schema), raw, overrides)


def dataset_conf(file: str, /, **overrides) -> DictConfig:
    return load_conf("dataset", file, DatasetConfig, overrides)


def network_conf(file: str, /, **overrides) -> DictConfig:
    """conf/network/<file>.yaml completed from its family and size, as a point composes it."""
    return resolve_network(load_conf("network", file, NetworkConfig, overrides))


def cnn_conf(arch: str) -> DictConfig:
    """A fast variant: ResNets only come at full width."""
    return network_conf(arch, **({} if arch.startswith("resnet") else {"width": 0.25}))


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def on_meta(net: DictConfig, data: DictConfig) -> nn.Module:
    """The model with shapes but no storage: free to build at any size, and it still runs forward for shapes."""
    with torch.device("meta"):
        return build_model(net, data).eval()


# --- every network on every dataset shape ---------------------------------------------------------------------


SMALL_IMAGE_CASES = [(arch, dataset) for arch in CNNS for dataset in ("digits", "mnist", "cifar10")
                     if arch != "resnet152" or dataset == "digits"]  # resnet152 is slow; its stem is the others'


@pytest.mark.parametrize("arch, dataset", SMALL_IMAGE_CASES)
def test_cnns_classify_small_images_of_every_dataset(arch, dataset):
    data = dataset_conf(dataset)
    torch.manual_seed(0)
    model = build_model(cnn_conf(arch), data).eval()
    with torch.no_grad():
        logits = model(torch.randn(2, data.channels, data.image_size, data.image_size))
    assert logits.shape == (2, data.num_classes) and torch.isfinite(logits).all()


@pytest.mark.parametrize("dataset", ["imagenet", "highres"])
@pytest.mark.parametrize("arch", CNNS)
def test_cnns_at_full_size_on_large_images(arch, dataset):
    data = dataset_conf(dataset)
    model = on_meta(network_conf(arch), data)
    logits = model(torch.empty(2, data.channels, data.image_size, data.image_size, device="meta"))
    assert logits.shape == (2, 1000)


def test_a_cnn_runs_on_large_single_channel_images():
    data = dataset_conf("imagenet", channels=1, num_classes=7)
    torch.manual_seed(0)
    model = build_model(network_conf("mobilenet_v2", width=0.25), data).eval()
    assert model.features[0][0].stride == (2, 2)  # large inputs keep the ImageNet stride
    with torch.no_grad():
        logits = model(torch.randn(1, 1, 224, 224))
    assert logits.shape == (1, 7) and torch.isfinite(logits).all()


def test_small_inputs_get_the_cifar_stems():
    data = dataset_conf("cifar10")
    resnet = build_model(network_conf("resnet18"), data)
    assert resnet.conv1.kernel_size == (3, 3) and resnet.conv1.stride == (1, 1)
    assert isinstance(resnet.maxpool, nn.Identity)
    mobilenet = build_model(network_conf("mobilenet_v2", width=0.25), data)
    assert mobilenet.features[0][0].stride == (1, 1)
    digits_vgg = build_model(network_conf("vgg16", width=0.25), dataset_conf("digits"))
    pools = [m for m in digits_vgg.features if isinstance(m, nn.MaxPool2d)]
    assert len(pools) == 3 and digits_vgg.classifier.in_features == 128  # 8 -> 1 pixel; 512 * width channels


def test_vgg_keeps_the_imagenet_classifier_with_the_configured_dropout_on_large_inputs():
    model = on_meta(network_conf("vgg16", dropout=0.5), dataset_conf("imagenet"))
    assert isinstance(model, VGG) and model.classifier[0].in_features == 512 * 7 * 7
    assert [m.p for m in model.classifier if isinstance(m, nn.Dropout)] == [0.5, 0.5]


def test_gpt2_predicts_the_next_token_at_every_position():
    data = dataset_conf("tokens", **SMALL_TOKENS)
    model = build_model(network_conf("gpt2_tiny"), data)
    logits = model(torch.randint(97, (3, 16)))
    assert logits.shape == (3, 16, 97) and torch.isfinite(logits).all()


# --- published sizes --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("network, dataset, parameters", [
    ("resnet18", "imagenet", 11_689_512),
    ("resnet50", "imagenet", 25_557_032),  # "25.6M"
    ("resnet152", "imagenet", 60_192_808),
    ("vgg11", "imagenet", 132_863_336),
    ("vgg16", "imagenet", 138_357_544),  # "138.4M"
    ("mobilenet_v2", "imagenet", 3_504_872),
    ("gpt2_small", "tokens", 124_439_808),  # "124M": the LM head is the token embedding
    ("gpt2_medium", "tokens", 354_823_168),  # "355M"
])
def test_published_configurations_have_the_published_parameter_counts(network, dataset, parameters):
    assert parameter_count(on_meta(network_conf(network), dataset_conf(dataset))) == parameters


# --- GPT-2 ----------------------------------------------------------------------------------------------------


def test_gpt2_is_causal():
    torch.manual_seed(0)
    model = build_model(network_conf("gpt2_tiny"), dataset_conf("tokens", **SMALL_TOKENS)).eval()
    tokens = torch.randint(97, (2, 16))
    changed = tokens.clone()
    changed[:, 10] = (changed[:, 10] + 1) % 97
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    torch.testing.assert_close(after[:, :10], before[:, :10])
    assert not torch.allclose(after[:, 10:], before[:, 10:])


def test_gpt2s_attention_kernels_train_to_the_same_losses_and_weights():
    """network.attention picks torch's kernel, not the function: the CPU's flash kernel and the math one (scores
    materialised) train alike, as torch's choice does."""
    tokens = torch.randint(97, (4, 16), generator=torch.Generator().manual_seed(1))

    def train(attention: str) -> tuple[list[float], dict[str, torch.Tensor]]:
        torch.manual_seed(0)
        model = build_model(network_conf("gpt2_tiny", attention=attention), dataset_conf("tokens", **SMALL_TOKENS))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for _ in range(3):
            loss = F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return losses, model.state_dict()

    (auto_losses, auto), *others = map(train, ("auto", "flash", "math"))
    for losses, weights in others:
        assert losses == pytest.approx(auto_losses, rel=1e-5)
        torch.testing.assert_close(weights, auto, rtol=1e-4, atol=1e-6)


def test_gpt2_has_the_submodules_strategies_split_on():
    net = network_conf("gpt2_tiny", dropout=0.1)
    model = build_model(net, dataset_conf("tokens", **SMALL_TOKENS))
    assert [name for name, _ in model.named_children()] == ["tok_emb", "pos_emb", "drop", "blocks", "ln_f", "head"]
    assert isinstance(model.blocks, nn.ModuleList) and len(model.blocks) == 2
    block = model.blocks[0]
    sharded = ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")
    shapes = {name: tuple(block.get_submodule(name).weight.shape) for name in sharded}
    assert shapes == {"attn.qkv": (192, 64), "attn.proj": (64, 64), "mlp.fc": (256, 64), "mlp.proj": (64, 256)}
    assert model.head.weight is model.tok_emb.weight
    assert model.pos_emb.weight.shape == (16, 64) and model.drop.p == 0.1


def test_gpt2_scales_the_init_of_residual_projections_by_depth():
    torch.manual_seed(0)
    net = network_conf("gpt2_tiny", n_layer=8, n_embd=128)
    model = build_model(net, dataset_conf("tokens", **SMALL_TOKENS))
    stds = {name: float(p.detach().std()) for name, p in model.named_parameters() if name.startswith("blocks.0.")}
    assert stds["blocks.0.attn.qkv.weight"] == pytest.approx(0.02, rel=0.1)
    assert stds["blocks.0.mlp.fc.weight"] == pytest.approx(0.02, rel=0.1)
    assert stds["blocks.0.attn.proj.weight"] == pytest.approx(0.02 / math.sqrt(2 * 8), rel=0.1)
    assert stds["blocks.0.mlp.proj.weight"] == pytest.approx(0.02 / math.sqrt(2 * 8), rel=0.1)


def test_gpt2_tiny_learns_synthetic_tokens_in_a_few_steps():
    data_cfg = dataset_conf("tokens", vocab_size=64, seq_len=32, samples=256, val_samples=32)
    data = build_datasets(data_cfg, seed=0)
    torch.manual_seed(0)
    model = build_model(network_conf("gpt2_tiny"), data_cfg)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    val_inputs, val_targets = next(iter(DataLoader(data.val, batch_size=32)))

    def val_perplexity() -> float:
        with torch.no_grad():
            return math.exp(F.cross_entropy(model(val_inputs).flatten(0, 1), val_targets.flatten()))

    before = val_perplexity()
    for _ in range(2):
        for inputs, targets in DataLoader(data.train, batch_size=32, shuffle=True):
            optimizer.zero_grad()
            F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten()).backward()
            optimizer.step()
    assert before > 48 and val_perplexity() < 24  # uniform guessing: 64; the chain's best: about 4


# --- determinism and checks -----------------------------------------------------------------------------------


@pytest.mark.parametrize("network, dataset", [("resnet18", "digits"), ("gpt2_tiny", "tokens")])
def test_initial_weights_are_a_function_of_the_torch_seed(network, dataset):
    def weights(seed: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(seed)
        return build_model(network_conf(network), dataset_conf(dataset, **SMALL_TOKENS)).state_dict()

    first, again, other = weights(0), weights(0), weights(1)
    assert first.keys() == again.keys()
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)


@pytest.mark.parametrize("network", ["resnet18", "resnet50", "resnet152", "vgg11", "vgg16", "mobilenet_v2"])
def test_the_shipped_cnn_configs_pass_the_check_on_image_data(network):
    assert network_conf(network).arch in ARCHS
    for dataset in ("digits", "mnist", "cifar10", "imagenet", "highres"):
        check_network(network_conf(network), dataset_conf(dataset))


@pytest.mark.parametrize("network", [name for name in network_names() if name.startswith("gpt2_")])
def test_the_shipped_gpt2_configs_pass_the_check_on_token_data(network):
    check_network(network_conf(network), dataset_conf("tokens"))
    check_network(network_conf(network), dataset_conf("wikitext103"))


@pytest.mark.parametrize("network, overrides, dataset, message", [
    ("resnet18", {"family": "alexnet"}, "cifar10",
     "network.family=alexnet is not one of gpt2, llama3, resnet, vgg, mobilenet"),
    ("resnet18", {"size": "34"}, "cifar10", "network.size=34 is not a size of resnet: one of 18, 50, 152"),
    ("gpt2_tiny", {"size": "huge"}, "tokens", "network.size=huge is not a size of gpt2: one of nano, tiny, mini, "
                                              "mini_wide, small, medium"),
    ("vgg11", {"size": None}, "cifar10", "network.size=null: a vgg network is one of its sizes (11, 16)"),
    ("gpt2_tiny", {"size": None, "n_layer": 3}, "tokens", "network.n_head is not given and network.size is null"),
    ("resnet18", {"arch": "alexnet"}, "cifar10", "network.arch=alexnet is set by network.family and network.size"),
    ("gpt2_tiny", {"name": "gpt2_tiny", "n_layer": 4}, "tokens",
     "network.name=gpt2_tiny is the name of what is built (here gpt2_L4_H2_E64)"),
    ("gpt2_tiny", {}, "cifar10", "needs tokens data, dataset cifar10 is image"),
    ("resnet18", {}, "tokens", "needs image data, dataset tokens is tokens"),
    ("vgg16", {"width": 0}, "cifar10", "network.width=0"),
    ("resnet50", {"width": 0.5}, "cifar10", "network.width is not supported for resnet50"),
    ("vgg11", {"dropout": 1.0}, "imagenet", "network.dropout=1.0 must be in [0, 1)"),
    ("gpt2_tiny", {"dropout": -0.1}, "tokens", "network.dropout=-0.1 must be in [0, 1)"),
    ("gpt2_tiny", {"n_embd": 65}, "tokens", "n_embd=65 is not divisible by n_head=2"),
    ("gpt2_tiny", {"n_layer": 0}, "tokens", "n_layer, n_head, n_embd must be positive"),
    ("gpt2_tiny", {"n_head": -2}, "tokens", "n_layer, n_head, n_embd must be positive"),
])
def test_check_network_rejects_bad_configs_in_one_line(network, overrides, dataset, message):
    with pytest.raises(ConfigError) as error:
        check_network(network_conf(network, **overrides), dataset_conf(dataset))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_check_network_reads_plain_dataclasses_too():
    data = DatasetConfig(name="tokens", kind="tokens", vocab_size=97, seq_len=16)
    odd = resolve_network(NetworkConfig(family="gpt2", size=None, n_layer=1, n_head=3, n_embd=64))
    assert odd.name == "gpt2_L1_H3_E64"
    with pytest.raises(ConfigError, match="not divisible"):
        check_network(odd, data)
    model = build_model(resolve_network(NetworkConfig(family="gpt2", size="tiny", n_layer=1, n_embd=32)), data)
    assert model(torch.zeros(1, 16, dtype=torch.int64)).shape == (1, 16, 97)


# --- named sizes -----------------------------------------------------------------------------------------------


def test_every_size_has_its_config_and_every_config_is_a_size():
    """conf/network/<name>.yaml selects a family and size, under the name the size is recorded by."""
    files = sorted(path.stem for path in (CONF_DIR / "network").glob("*.yaml"))
    assert files == sorted(network_names())
    for name in files:
        raw = OmegaConf.load(CONF_DIR / "network" / f"{name}.yaml")
        assert set(raw) == {"defaults", "family", "size"}, name  # dimensions live in the size tables only
        assert size_name(raw.family, str(raw.size)) == name == network_conf(name).name


def test_no_two_sizes_are_one_network_and_no_size_looks_derived():
    dims = list(GPT2_SIZES.values())
    assert len(set(dims)) == len(dims)
    assert len(set(network_names())) == len(network_names())
    assert not any(re.fullmatch(r"gpt2_L\d+_H\d+_E\d+", name) for name in network_names())


def gpt2_parameters(vocab: int, seq: int, n_layer: int, n_embd: int) -> int:
    """Embeddings, blocks (attention 4E^2 + 4E, MLP 8E^2 + 5E, two LayerNorms 4E), the final LayerNorm; the head
    is the token embedding."""
    return vocab * n_embd + seq * n_embd + n_layer * (12 * n_embd**2 + 13 * n_embd) + 2 * n_embd


@pytest.mark.parametrize("size, parameters", [
    ("nano", 4096 * 8 + 64 * 8 + 12 * 64 + 13 * 8 + 2 * 8),
    ("tiny", 366_336),
    ("mini", 1_325_824),
    ("mini_wide", 14_740_480),  # model_bench's "15 M parameters"
])
def test_the_gpt2_size_table_builds_networks_of_the_expected_parameter_counts(size, parameters):
    """Selected by network.size on another size's config, as an override would; vocabulary 4096, 64 tokens."""
    net = network_conf("gpt2_tiny", size=size)
    assert net.name == f"gpt2_{size}" and net.size == size
    data = dataset_conf("tokens", vocab_size=4096, seq_len=64)
    dims = GPT2_SIZES[size]
    assert parameters == gpt2_parameters(4096, 64, dims.n_layer, dims.n_embd)
    assert parameter_count(on_meta(net, data)) == parameters


@pytest.mark.parametrize("family, size, network", [("resnet", "50", "resnet50"), ("vgg", "11", "vgg11"),
                                                   ("mobilenet", "v2", "mobilenet_v2")])
def test_a_cnn_size_builds_its_torchvision_network(family, size, network):
    net = network_conf("resnet18", family=family, size=size, n_layer=4)  # GPT-2's dimension: not a CNN's
    assert (net.name, net.arch, net.n_layer) == (network, network, 0)
    data = dataset_conf("imagenet")
    assert parameter_count(on_meta(net, data)) == parameter_count(on_meta(network_conf(network), data))


@pytest.mark.parametrize("overrides, name, size", [
    ({}, "gpt2_tiny", "tiny"),
    ({"n_layer": 4}, "gpt2_L4_H2_E64", None),  # not gpt2_tiny: it has 2 layers
    ({"n_layer": 4, "n_head": 4, "n_embd": 128}, "gpt2_mini", "mini"),  # the dimensions of a size: its name
    ({"size": "mini", "n_embd": 96}, "gpt2_L4_H4_E96", None),
    ({"size": None, "n_layer": 1, "n_head": 1, "n_embd": 8}, "gpt2_nano", "nano"),
    ({"dropout": 0.1}, "gpt2_tiny", "tiny"),  # a knob of the size, recorded beside its name
])
def test_a_gpt2_is_recorded_under_the_name_of_what_is_built(overrides, name, size):
    net = network_conf("gpt2_tiny", **overrides)
    assert (net.name, net.size) == (name, size)
    assert resolve_network(net).name == name  # resolving again changes nothing


def test_two_different_networks_never_share_a_recorded_name():
    """Every size and a few overrides of each GPT-2 dimension: one name, one set of dimensions."""
    nets = [network_conf(name) for name in network_names()]
    nets += [network_conf("gpt2_tiny", **{dim: value}) for dim in ("n_layer", "n_head", "n_embd")
             for value in (1, 4, 8)]
    nets += [network_conf("gpt2_mini", n_layer=2, n_head=2, n_embd=64), network_conf("vgg16", width=0.25)]
    built: dict[str, set] = {}
    for net in nets:
        built.setdefault(net.name, set()).add((net.arch, net.n_layer, net.n_head, net.n_embd))
    assert all(len(shapes) == 1 for shapes in built.values()), built
    assert network_conf("gpt2_mini", n_layer=2, n_head=2, n_embd=64).name == "gpt2_tiny"


def test_each_family_names_its_sizes():
    assert {family: list(f.sizes) for family, f in FAMILIES.items()} == {
        "gpt2": ["nano", "tiny", "mini", "mini_wide", "small", "medium"],
        "llama3": ["nano", "tiny", "8b", "70b", "405b"], "resnet": ["18", "50", "152"],
        "vgg": ["11", "16"], "mobilenet": ["v2"]}
