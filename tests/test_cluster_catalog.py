"""The hardware catalog (docs/clusters.md, "Hardware catalog"): every cluster file composes with the GPU type and NIC
it lists, a GPU's numbers live in its catalog entry alone, and a bad or missing number in an entry is one line
naming the file and key before anything runs."""


import pytest

from conftest import DIGITS, edit_catalog_entry
from suite.errors import ConfigError
from suite.paths import CONF_DIR
from suite.sweep import hardware_catalog
from suite.sweep.plan import plan
from suite.tools import predict as predict_tool

CLUSTER_DIR = CONF_DIR / "cluster"
CLUSTERS = sorted(path.stem for path in CLUSTER_DIR.glob("*.yaml"))
GPU_TYPES = sorted(path.stem for path in (CLUSTER_DIR / "gpu").glob("*.yaml"))
GPU_CLUSTERS = [name for name in CLUSTERS if hardware_catalog.entries(name).get("gpu")]
# What a GPU type's entry gives: a cluster setting one of these repeats (or contradicts) its GPU's datasheet.
GPU_KEYS = ("gpu", "device_memory_gb", "device_memory_bandwidth_gbs", "fp64_tflops", "peak_tflops", "fp8_tflops",
            "sm_count", "boost_clock_mhz", "nvlink_generation", "nvlink_bandwidth_gbs", "pcie_generation")


def hardware_of(name: str):
    invalid = []
    points = plan([[*DIGITS, f"cluster={name}", "cluster.job.account=x"]], invalid=invalid)
    return (points or invalid)[0].cfg.cluster.hardware


@pytest.mark.parametrize("name", CLUSTERS)
def test_every_cluster_file_composes_and_passes_its_hardware_checks(name):
    """A point on each cluster composes and is valid, or is recorded as one this machine cannot run (a GPU the
    local launcher lacks); a bad catalog number would raise instead."""
    assert hardware_of(name) is not None


def test_the_gpu_clusters_of_the_issue_are_in_the_catalog():
    assert {"lassen", "thetagpu", "polaris", "h100", "lisa", "dgx1_v100", "dgx2", "dgx_a100_40gb", "dgx_a100_80gb",
            "dgx_h100", "dgx_h200"} <= set(GPU_CLUSTERS)
    assert {hardware_catalog.entries(name)["gpu"].stem for name in GPU_CLUSTERS} == set(GPU_TYPES)  # each type in use


@pytest.mark.parametrize("name", GPU_CLUSTERS)
def test_a_cluster_takes_its_gpus_numbers_from_the_catalog_never_repeating_them(name):
    """A cluster file may override a number of its GPU type (Lassen keeps Study N's FP64 figure), never copy one."""
    layers = hardware_catalog.cluster_layers(CONF_DIR, name)
    gpu_values = {}
    for layer in layers:
        if layer.group == "gpu":
            for key, value in layer.hardware.items():
                assert gpu_values.get(key) != value, f"{layer.path.name} repeats {key} of the type it extends"
                gpu_values[key] = value
    for layer in layers:
        if layer.group == "cluster":
            repeated = {key for key in GPU_KEYS if key in gpu_values and layer.value(key) == gpu_values[key]}
            assert not repeated, f"{layer.path.name} repeats its GPU type's {sorted(repeated)}"


@pytest.mark.parametrize("name", GPU_CLUSTERS)
def test_a_gpu_cluster_has_what_pricing_from_the_datasheet_needs(name):
    hardware = hardware_of(name)
    assert hardware.device_memory_gb > 0 and hardware.device_memory_bandwidth_gbs > 0 and hardware.peak_tflops
    assert hardware.intra_node_fabric is not None
    if name not in ("h100", "h200"):  # the one-machine clusters: no network
        assert hardware.nics_per_node and hardware.nic_bandwidth_gbs and hardware.inter_node_bandwidth_gbs


def test_a_node_is_priced_by_its_gpu_type_and_fabric():
    dgx = hardware_of("dgx_a100_80gb")
    assert (dgx.gpu, dgx.device_memory_gb, dgx.device_memory_bandwidth_gbs, dgx.peak_tflops.bf16) == \
        ("NVIDIA A100", 80, 2039, 312)
    assert (dgx.intra_node_fabric, dgx.intra_node_bandwidth_gbs, dgx.nics_per_node, dgx.inter_node_bandwidth_gbs) == \
        ("nvswitch", 300, 8, 200)
    h200 = hardware_of("dgx_h200")
    assert (h200.device_memory_gb, h200.peak_tflops.bf16, h200.fp8_tflops, h200.inter_node_bandwidth_gbs) == \
        (141, 989.4, 1978.9, 400)


def test_the_catalogs_numbers_are_not_part_of_a_points_identity():
    """Pricing numbers change what a point is predicted to take, not what it measures: the config hash stays (the
    GPU's memory, which a CPU rank is held to, is the one number that is part of it)."""
    point = plan([[*DIGITS, "cluster=dgx_h100"]])[0]
    retuned = plan([[*DIGITS, "cluster=dgx_h100", "cluster.hardware.nvlink_bandwidth_gbs=100",
                     "cluster.hardware.inter_node_latency_us=5", "cluster/nic=infiniband_hdr"]])[0]
    assert retuned.config_hash == point.config_hash


def test_bf16_on_study_js_titan_rtx_is_refused():
    invalid = []
    plan([[*DIGITS, "cluster=lisa", "precision=bf16"]], invalid=invalid)
    assert "not NVIDIA TITAN RTX; use fp16" in invalid[0].error


@pytest.mark.parametrize(("entry", "values", "problem"), [
    ("gpu/v100_sxm2_16gb", {"device_memory_gb": 0}, "device_memory_gb must be positive, got 0.0"),
    ("gpu/v100_sxm2_16gb", {"device_memory_bandwidth_gbs": -900}, "device_memory_bandwidth_gbs must be positive, "
                                                                  "got -900.0"),
    ("gpu/v100_sxm2_16gb", {"peak_tflops": {"fp32": 15.7, "fp16": 0}}, "peak_tflops.fp16 must be positive, got 0.0"),
    ("gpu/v100_sxm2_16gb", {"sm_count": -80}, "sm_count must be positive, got -80"),
    ("gpu/v100_sxm2_16gb", {"device_memory_bandwidth_gbs": None},
     "device_memory_bandwidth_gbs is required of a gpu catalog entry, got None"),
    ("gpu/v100_sxm2_16gb", {"peak_tflops": None}, "peak_tflops is required of a gpu catalog entry, got None"),
    ("nic/infiniband_edr", {"nic_bandwidth_gbs": -12.5}, "nic_bandwidth_gbs must be positive, got -12.5"),
    ("nic/infiniband_edr", {"inter_node_latency_us": -1}, "inter_node_latency_us must be >= 0, got -1.0"),
    ("nic/infiniband_edr", {"nic_bandwidth_gbs": None},
     "nic_bandwidth_gbs is required of a nic catalog entry, got None"),
], ids=["memory 0", "negative bandwidth", "peak 0", "negative SMs", "no bandwidth", "no peaks", "negative NIC",
        "negative latency", "NIC without bandwidth"])
def test_a_bad_catalog_entry_is_one_line_naming_its_file_and_key(conf_copy, entry, values, problem):
    path = conf_copy / "cluster" / f"{entry}.yaml"
    edit_catalog_entry(path, **values)
    with pytest.raises(ConfigError, match=None) as info:  # every cluster listing the entry refuses its points
        plan([["cluster=lassen", "cluster.job.account=x"]], invalid=[])
    assert str(info.value) == f"{path}: {problem}"


def test_a_clusters_own_bad_number_names_the_cluster_file(conf_copy):
    path = conf_copy / "cluster" / "dgx_h100.yaml"
    path.write_text(path.read_text().replace("inter_node_bandwidth_gbs: 400", "inter_node_bandwidth_gbs: -400"))
    with pytest.raises(ConfigError, match=None) as info:
        plan([["cluster=dgx_h200"]])  # through the DGX H200, which extends it
    assert str(info.value) == f"{path}: inter_node_bandwidth_gbs must be positive, got -400.0"


def test_make_predict_refuses_a_bad_catalog_entry_before_profiling(conf_copy, results, capsys):
    path = conf_copy / "cluster" / "gpu" / "a100_sxm4_40gb.yaml"
    edit_catalog_entry(path, device_memory_gb=0)
    assert predict_tool.main([*DIGITS, "cluster=polaris", "cluster.job.account=x"]) == 2
    assert [line for line in capsys.readouterr().err.splitlines() if not line.startswith("[")] == [
        f"error: {path}: device_memory_gb must be positive, got 0.0"]
    assert not results.exists()
