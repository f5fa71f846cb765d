"""Published GPU measurements as suite points (issue 32, item 6): the repository's records file read into typed
records, each mapped onto the suite's overrides and planned, or given its reason; a malformed record is one line
naming the file, the record and the key, exit 2. Nothing is profiled or trained."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from suite.published import mapping
from suite.published.mapping import Reason, map_record, plan_records
from suite.published.records import MalformedRecord, Record, load, stated_elsewhere
from suite.tools import published as tool

RECORDS = Path(__file__).resolve().parents[1] / "analysis" / "published" / "gpu_measurements.yaml"
SHARED = Path("/work/shared/published/gpu_measurements.yaml")

MEGATRON_TP = ("megatron-readme2020-mp-dgxa100-4b", (
    "framework=megatron_lm_2020",
    "dataset=tokens", "dataset.seq_len=1024", "dataset.vocab_size=51200", "network=gpt2_small", "network.n_layer=36",
    "network.n_head=24", "network.n_embd=3072", "network.attention=math", "cluster=dgx_a100_40gb", "workers=4",
    "strategy=megatron", "strategy.tp=4", "strategy.batch_grows_with_tp=false", "batch_size=16", "precision=fp16",
    "activation_checkpointing=every", "network.dropout=0.1", "optimizer.name=adam"))  # Megatron-LM's default dropout
ZERO = ("narayanan-a100-t2-zero3-175b-384gpu", (
    "framework=megatron_deepspeed",
    "dataset=tokens", "dataset.seq_len=2048", "dataset.vocab_size=51200", "network=gpt2_small", "network.n_layer=96",
    "network.n_head=96", "network.n_embd=12288", "network.attention=math", "cluster=dgx_a100_80gb", "workers=384",
    "strategy=zero",
    "strategy.zero_stage=3", "batch_size=4", "precision=fp16", "activation_checkpointing=every",
    "network.dropout=0.1", "optimizer.name=adam"))
STUDY_J_GPIPE = ("studyj-torchgpipe-resnet18-imagenet-4gpu-configA", (
    "framework=torchgpipe",
    "dataset=imagenet", "network=resnet18", "cluster=lisa", "workers=4", "strategy=gpipe",
    "strategy.micro_batch_size=24", "batch_size=288"))
HYBRID_DP_TP = ("megatron-readme2020-dp-dgxa100-2b", (  # Megatron-LM's dp x tp: the suite's megatron with replicas
    "framework=megatron_lm_2020",
    "dataset=tokens", "dataset.seq_len=1024", "dataset.vocab_size=51200", "network=gpt2_small", "network.n_layer=30",
    "network.n_head=18", "network.n_embd=2304", "network.attention=math", "cluster=dgx_a100_40gb", "workers=256",
    "strategy=megatron", "strategy.tp=2", "strategy.batch_grows_with_tp=false", "batch_size=16", "precision=fp16",
    "activation_checkpointing=every", "network.dropout=0.1", "optimizer.name=adam"))
HYBRID_3D = ("narayanan-a100-t2-ptd-530b-560gpu", (  # Megatron-LM's dp x pp x tp: 1F1B's stages split over tp ranks
    "framework=megatron_lm",
    "dataset=tokens", "dataset.seq_len=2048", "dataset.vocab_size=51200", "network=gpt2_small", "network.n_layer=105",
    "network.n_head=128", "network.n_embd=20480", "network.attention=math", "cluster=dgx_a100_80gb", "workers=560",
    "strategy=1f1b", "strategy.tp=8", "strategy.pp=35", "strategy.micro_batch_size=1", "batch_size=1120",
    "precision=bf16", "activation_checkpointing=every", "network.dropout=0.1", "optimizer.name=adam"))
LLAMA3_8B = ("torchtitan-h100-llama3-8b-8gpu-fsdp", (  # torchtitan's FSDP2 on Meta's Grand Teton
    "framework=torchtitan", "dataset=tokens", "dataset.seq_len=8192", "dataset.vocab_size=128256",
    "network=llama3_8b", "cluster=grand_teton", "workers=8", "strategy=fsdp", "batch_size=2", "precision=bf16",
    "activation_checkpointing=selective_op", "optimizer.name=adam"))
STUDY_J_HOROVOD = ("studyj-horovod-resnet50-imagenet-16gpu-speedup", (
    "framework=pytorch",
    "dataset=imagenet", "network=resnet50", "cluster=lisa", "workers=16", "strategy=horovod", "batch_size=32"))


@pytest.fixture(scope="module")
def records() -> dict[str, Record]:
    return {r.id: r for r in load(RECORDS)}


def test_the_repository_holds_the_published_set_unchanged(records):
    assert len(records) == 223
    if SHARED.exists():  # copied with every citation: the same records, field for field
        assert RECORDS.read_bytes() == SHARED.read_bytes()
    record = records["megatron-readme-a100-1.7b"]
    assert (record.hardware.gpu, record.model.hidden, record.layout.dp, record.measured.value) == \
        ("a100_sxm4_80gb", 2304, 32, 137.0)
    assert record.measured.also["percent_of_theoretical_peak"] == 44
    assert record.source.url_or_repo == "https://github.com/NVIDIA/Megatron-LM"
    with pytest.raises(AttributeError):  # frozen
        record.layout.dp = 4


@pytest.mark.parametrize(("ident", "overrides"), [MEGATRON_TP, ZERO, STUDY_J_GPIPE, STUDY_J_HOROVOD, HYBRID_DP_TP,
                                                    HYBRID_3D])
def test_a_published_configuration_maps_to_the_suite_point_that_trains_it(records, ident, overrides):
    mapped = map_record(records[ident])
    assert mapped.reasons == ()
    assert mapped.overrides == overrides


def test_a_megatron_record_trains_with_its_frameworks_documented_dropout_said_with_its_source(records):
    """No record states its dropout: Megatron-LM's runs had its arguments' 0.1 (attention and hidden), said where it
    is taken; a framework that documents none (torchtitan's Llama has no dropout) is priced without, as the suite."""
    megatron = map_record(records[MEGATRON_TP[0]])
    assert "network.dropout=0.1" in megatron.overrides
    assert ("dropout not stated: 0.1, Megatron-LM's --attention-dropout and --hidden-dropout defaults "
            "(megatron/arguments.py at 5281919)") in megatron.assumptions
    llama = map_record(records[LLAMA3_8B[0]])
    assert not any("dropout" in text for text in (*llama.overrides, *llama.assumptions))


def test_what_a_record_leaves_unstated_is_said_not_hidden(records):
    assumptions = map_record(records[STUDY_J_GPIPE[0]]).assumptions
    assert assumptions == ("precision not stated: fp32, torchgpipe (PyTorch)'s default (PyTorch trains in "
                           "float32 unless torch.amp is asked for (torch.get_default_dtype(): \"initially "
                           "torch.float32\"))",
                           "recomputation not stated: torchgpipe's default checkpoint=except_last",
                           "optimizer not stated: SGD with momentum, the suite's default",
                           "an epoch of ImageNet's 1,281,167 training images")


def test_a_llama3_record_maps_to_the_suites_llama_with_torchtitans_defaults_said(records):
    """Its size by its dimensions, on the catalog's Grand Teton; what it leaves unstated (context, vocabulary,
    precision, key-value heads) from torchtitan's configs and Llama 3's tokenizer, each an assumption."""
    mapped = map_record(records[LLAMA3_8B[0]])
    assert mapped.overrides == LLAMA3_8B[1]  # its selective recomputation: torchtitan's operator policy
    assert mapped.assumptions[:4] == (
        "sequence length not stated: 8192, torchtitan (PyTorch FSDP2)'s default (train_configs/llama3_8b.toml, "
        "llama3_70b.toml and llama3_405b.toml: seq_len = 8192, at commit 9dec370, which its Llama 3.1 benchmarks "
        "list)",
        "key-value heads not stated: Llama 3's 8 (torchtitan's llama3_configs)",
        "vocabulary not stated: Llama 3's tokenizer's 128256",
        "precision not stated: bf16, torchtitan (PyTorch FSDP2)'s default (torchtitan's "
        "training.mixed_precision_param defaults to \"bfloat16\" (torchtitan/config/job_config.py))")
    record = records[LLAMA3_8B[0]]
    full = replace(record, training=replace(record.training, activation_recompute="full"))
    (planned,) = plan_records([full])
    assert planned.point.cfg.network.name == "llama3_8b" and planned.point.cfg.activation_checkpointing == "every"
    hardware = planned.point.cfg.cluster.hardware
    assert (hardware.device_memory_gb, hardware.device_memory_bandwidth_gbs, hardware.inter_node_bandwidth_gbs) == \
        (96, 2400, 400)
    shallower = replace(full, model=replace(full.model, n_layer=4, ffn_hidden=10000, name="Llama 3 of 4 blocks"))
    (planned,) = plan_records([shallower])  # no named size: its dimensions, its feed-forward width exactly
    assert planned.point.cfg.network.name == "llama3_L4_H32_KV8_E4096_F10000"
    tensor_parallel = map_record(records["torchtitan-h100-llama3-70b-256gpu-fsdp32-tp8"])  # FSDP over tp groups
    assert {"network=llama3_70b", "strategy=fsdp", "strategy.tp=8", "strategy.sequence_parallel=true",
            "activation_checkpointing=every"} <= set(tensor_parallel.overrides)


def test_an_epoch_is_priced_over_the_records_own_dataset_or_not_at_all(records):
    """Issue 61: a paper's epoch over its own corpus was priced as an epoch of the suite's `tokens`, 500x too fast."""
    record = records["llmfoundry-a100-40-mpt125m-s2048-16gpu"]
    measured = replace(record.measured, metric="epoch_time_s", value=3600.0, also={})
    assert map_record(replace(record, measured=measured)).reasons == (
        Reason(mapping.NOT_STATED, "the dataset behind an epoch (measured.also.epoch_samples or epoch_tokens)"),)
    stated = replace(measured, also={"epoch_tokens": 2048 * 1000})
    assert "dataset.samples=1000" in map_record(replace(record, measured=stated)).overrides  # sequences of 2048
    images = records[STUDY_J_GPIPE[0]]
    stated = replace(images.measured, also={"epoch_samples": 50_000})
    assert "dataset.samples=50000" in map_record(replace(images, measured=stated)).overrides


@pytest.mark.parametrize(("ident", "reasons"), [
    ("megatron-readme-a100-39b", (
        Reason(mapping.NOT_STATED, "layout.virtual_stages of an interleaved 1F1B schedule"),
        Reason(mapping.NOT_STATED, "training.micro_batch (a 2-stage pipeline's micro-batches)"))),
    ("horovod-docs-vgg16-512gpu-scaling", (
        Reason(mapping.GPU, "other:pascal: no cluster of conf/cluster/ has this GPU type"),
        Reason(mapping.NOT_STATED, "training.global_batch and training.micro_batch"),
        Reason(mapping.NOT_STATED, "training.activation_recompute (the record names none, and Horovod + TensorFlow "
                                   "(tf_cnn_benchmarks, synthetic data per reproduction instructions) documents no "
                                   "default the suite describes)"))),
    ("torchtitan-h100-llama3-70b-256gpu-fsdp32-tp8-asynctp", (
        Reason(mapping.ASYNC_TP, "tensor-parallel matmuls decomposed to overlap their collectives (torchtitan's "
                                 "enable_async_tensor_parallel): not a knob of the suite"),)),
])
def test_a_record_the_suite_cannot_express_gets_its_reasons(records, ident, reasons):
    mapped = map_record(records[ident])
    assert mapped.reasons == reasons
    assert mapped.overrides and not mapped.expressible  # what could be mapped still is, for the reader


def test_fp8_linear_layers_and_compiled_blocks_map_to_the_suites_knobs(records):
    """torchtitan's FSDP2 + torch.compile + Float8 row: its blocks compiled and its linear layers in fp8 under bf16
    (tensorwise scaling, the one recipe its converter had then), said in the assumptions."""
    mapped = map_record(records["torchtitan-h100-llama3-8b-8gpu-fsdp-compile-float8"])
    assert mapped.expressible, mapped.reasons
    assert {"compile=true", "precision=bf16", "fp8=tensorwise"} <= set(mapped.overrides)
    assert any(text.startswith("precision 'fp8_linear+bf16' run as precision=bf16 fp8=tensorwise")
               for text in mapped.assumptions), mapped.assumptions


def test_context_parallel_records_map_to_fsdp_over_context_ranks(records):
    """torchtitan's FSDP 4 x CP 2 row (its layout's dp is the FSDP degree, the CP degree in `measured.also`): 8
    workers in 4 replicas of 2 context-parallel ranks, each replica one 65536-token sequence."""
    mapped = map_record(records["torchtitan-h100-llama3-8b-8gpu-fsdp4-cp2-s65536"])
    assert mapped.expressible, mapped.reasons
    assert {"workers=8", "strategy=fsdp", "strategy.cp=2", "batch_size=1", "dataset.seq_len=65536"} <= set(
        mapped.overrides), mapped.overrides


# The tests of every planned record share one worker, which plans them once (40 s)
PLANNED_ONCE = pytest.mark.xdist_group("published_planned")


@pytest.fixture(scope="module")
def planned(records) -> dict[str, mapping.Mapped]:
    """Every record mapped and planned (Hydra composes the 178 points the mapping expresses)."""
    return {m.record.id: m for m in plan_records(list(records.values()))}


def test_a_node_size_the_catalog_lacks_is_a_reason(records):
    record = records[STUDY_J_GPIPE[0]]
    bigger = replace(record, hardware=replace(record.hardware, gpus_per_node=8))
    assert map_record(bigger).reasons == (Reason(mapping.CLUSTER, "8 x titan_rtx per node (the catalog has lisa: 4)"),)


@PLANNED_ONCE
def test_mapped_points_plan_and_a_planner_rejection_is_the_records_reason(planned):
    megatron, zero, gpipe = (planned[i] for i in (MEGATRON_TP[0], ZERO[0], STUDY_J_GPIPE[0]))
    assert (megatron.point.layout.tp, megatron.point.layout.dp, megatron.point.global_batch_size) == (4, 1, 16)
    assert megatron.point.cfg.network.name == "gpt2_L36_H24_E3072"
    assert (zero.point.layout.shard, zero.point.global_batch_size) == (384, 1536)  # the record's global batch
    assert zero.point.cfg.cluster.hardware.device_memory_gb == 80
    assert (gpipe.point.layout.pp, gpipe.point.layout.micro_batches, gpipe.point.global_batch_size) == (4, 12, 288)
    assert gpipe.point.cfg.cluster.hardware.gpu == "NVIDIA TITAN RTX"
    checkpointed = planned["megatron-readme-a100-3.6b"].point  # Megatron-LM's full recomputation
    assert (checkpointed.strategy.name, checkpointed.cfg.activation_checkpointing) == ("megatron", "every")
    accumulated = planned["llmfoundry-a100-80-mpt70b-s2048-64gpu"].point  # 4 micro-batches of 8 per GPU and step
    assert (accumulated.cfg.batch_size, accumulated.cfg.grad_accum, accumulated.layout.micro_batches,
            accumulated.global_batch_size) == (8, 4, 4, 2048)
    assert accumulated.cfg.network.attention == "efficient"  # llm-foundry's Triton FlashAttention, as near as torch
    assert "attention: llm-foundry's Triton FlashAttention" in " ".join(planned[
        "llmfoundry-a100-80-mpt70b-s2048-64gpu"].assumptions)
    assert megatron.point.cfg.network.attention == "math"  # Megatron-LM's before FlashAttention
    record = planned[STUDY_J_GPIPE[0]].record
    (rejected,) = plan_records([replace(record, training=replace(record.training, precision="fp16"))])
    assert rejected.point is None
    assert rejected.reasons == (Reason(mapping.PLANNER, "strategy gpipe does not train in precision=fp16 "
                                                        "(use fp32, bf16)"),)
    record = planned[ZERO[0]].record  # DeepSpeed's gradient_accumulation_steps
    (accumulating,) = plan_records([replace(record, training=replace(record.training, grad_accum=2,
                                                                        micro_batch=None))])
    assert (accumulating.point.cfg.batch_size, accumulating.point.cfg.grad_accum) == (2, 2)
    record = planned[HYBRID_DP_TP[0]].record  # Megatron-LM's accumulation, the suite's megatron's too
    (accumulating,) = plan_records([replace(record, training=replace(record.training, grad_accum=2, micro_batch=None))])
    assert (accumulating.point.strategy.name, accumulating.point.cfg.grad_accum,
            accumulating.point.layout.micro_batches) == ("megatron", 2, 2)



def test_megatron_core_records_take_its_documented_defaults_and_its_fp32_attention():
    """Megatron-Core (conf/framework/megatron_core.yaml, core_r0.8.0): a record naming no precision is mapped in its
    default, fp32 (then scored against the GPU's fp32 peak, not in a precision the record did not state), and in
    fp32 Transformer Engine's unfused attention; in bf16 its fused kernel."""
    added = {r.id: r for r in load(tool.ADDED_RECORDS)}
    record = added["megatroncore-readme-h100-1.7b-48gpu"]
    assert record.training.precision is None
    mapped = map_record(record)
    assert "framework=megatron_core" in mapped.overrides and "network.attention=math" in mapped.overrides
    assert not any(o.startswith("precision=") for o in mapped.overrides)  # fp32, the suite's default too
    assert any("fp32, Megatron-Core's default" in line for line in mapped.assumptions)
    in_bf16 = replace(record, training=replace(record.training, precision="bf16"))
    assert {"precision=bf16", "network.attention=flash"} <= set(map_record(in_bf16).overrides)


def test_zero_1_beside_model_parallelism_is_priced_where_the_framework_declares_its_optimizer_sharding():
    """BLOOM's 3D layout with ZeRO-1 (DeepSpeed's bf16 optimizer, which conf/framework/ declares as sharding the
    optimizer over the replicas) maps to the suite's 1F1B over tp x pp under that framework, its schedule the
    framework's documented one, on the catalog cluster that names its system; the same layout under a framework that
    declares no such sharding cannot be priced."""
    added = {r.id: r for r in load(tool.ADDED_RECORDS)}
    bloom = added["bloom-a100-176b-384gpu-gbs2048-iter12695"]
    mapped = map_record(bloom)
    assert mapped.expressible
    assert {"framework=megatron_deepspeed_bigscience", "strategy=1f1b", "strategy.tp=4", "strategy.pp=12",
            "workers=384", "cluster=jean_zay_a100"} <= set(mapped.overrides)  # the system it names, its Omni-Path
    assert any(a.startswith("pipeline schedule not stated: 1f1b, Megatron-DeepSpeed (bigscience-workshop fork)")
               for a in mapped.assumptions)
    plain = replace(bloom, training=replace(bloom.training, framework="Megatron-LM"))
    assert map_record(plain).reasons == (Reason(mapping.LAYOUT_3D, "ZeRO-1 with model parallelism (tp=4, pp=12; "
                                                                   "the 3D-layouts issue)"),)


def test_the_records_this_project_added_cite_their_sources_beside_the_shared_set(records):
    """Issue 61, item 5: 30 or more records from sources other than llm-foundry, each with where it was read; read
    with the shared set by default, no id in both."""
    added = load(tool.ADDED_RECORDS)
    assert len(added) >= 30 and not any(r.id.startswith("llmfoundry") for r in added)
    assert all(r.source.ref and r.source.where for r in added)
    assert not {r.id for r in added} & set(records)
    assert tool.parse_args([]).files == [str(RECORDS), str(tool.ADDED_RECORDS)]



def test_a_record_across_nodes_that_names_no_network_is_not_priced_and_a_named_one_is_said(records):
    """What crosses nodes goes at the network's rate, and no framework documents a network: a record of several nodes
    that states neither its inter-node network nor its system is not priced for it; one that names its network in
    words is priced on its catalog cluster's, which its assumptions name beside the record's words."""
    stated = records["megatron-readme-a100-1.7b"]
    (line,) = [a for a in map_record(stated).assumptions if "inter-node" in a]
    assert line == ("inter-node network priced as dgx_a100_80gb's (conf/cluster/dgx_a100_80gb.yaml); the record's: "
                    f"{stated.hardware.inter_node}")
    silent = replace(stated, hardware=replace(stated.hardware, inter_node=None, system=None))
    assert Reason(mapping.NOT_STATED, f"hardware.inter_node (a run over {stated.hardware.nodes} nodes)") in \
        map_record(silent).reasons


def test_what_a_records_authors_state_elsewhere_fills_what_it_leaves_null_said_with_its_source(records):
    """Megatron-LM's README table leaves its pipelines' micro-batches and model chunks unstated; the paper's scripts
    (examples/sc21/run_table_1.sh) state them: the open set's records take them, each said with its citation."""
    rows = [records[f"megatron-readme-a100-{size}"] for size in ("18b", "76b", "1t")]
    planned = {m.record.id: m for m in plan_records(stated_elsewhere(rows, tool.STATED_ELSEWHERE))}
    interleaved = planned["megatron-readme-a100-76b"]
    assert interleaved.record.training.micro_batch == 2 and interleaved.record.layout.virtual_stages == 3
    layout = interleaved.point.layout
    assert (layout.tp, layout.pp, layout.virtual_stages, layout.micro_batch_size, layout.micro_batches) == \
        (8, 4, 3, 2, 28)
    assert ("not in the record, stated elsewhere: training.micro_batch=2, layout.virtual_stages=3 (NVIDIA/Megatron-LM@"
            "de7dc40f883ceed06344051c3c7ebd57da59cc53 examples/sc21/run_table_1.sh: MODEL_SIZE 76B: MBS=2, "
            "--num-layers-per-virtual-pipeline-stage 5 (NLS=60 / (PP=4 x 5) = 3 chunks per rank))") in \
        interleaved.assumptions
    accumulated = planned["megatron-readme-a100-18b"].point  # 4 micro-batches of 8 a replica: Megatron accumulates
    assert (accumulated.strategy.name, accumulated.cfg.batch_size, accumulated.cfg.grad_accum) == ("megatron", 8, 4)
    assert planned["megatron-readme-a100-1t"].point.layout.virtual_stages == 1  # no flag: not interleaved


def test_a_stated_elsewhere_entry_fills_only_what_its_record_leaves_null(tmp_path, records):
    record = records["megatron-readme-a100-39b"]
    source = {"ref": "a script", "where": "its line 3"}
    path = tmp_path / "elsewhere.yaml"
    cases = [({"id": record.id, "source": source, "layout": {"pp": 4}},
              f"{path}: entry {record.id}: layout.pp is stated in the record (2): an entry fills only what it leaves "
              "null"),
             ({"id": record.id, "training": {"micro_batch": 4}},
              f"{path}: entry {record.id}: source.ref and source.where are required: where the fields are stated"),
             ({"id": record.id, "source": source, "training": {"micro_batch": "four"}},
              f"{path}: entry {record.id}: training.micro_batch='four' is not an integer"),
             ({"id": record.id, "source": source, "measured": {"value": 1}},
              f"{path}: entry {record.id}: measured is not a key of an entry (id, source, hardware, model, training, "
              "layout)")]
    for entry, line in cases:
        path.write_text(yaml.safe_dump([entry]))
        with pytest.raises(MalformedRecord) as e:
            stated_elsewhere([record], path)
        assert str(e.value) == line
    path.write_text(yaml.safe_dump([{"id": record.id, "source": source, "training": {"micro_batch": 4}},
                                    {"id": "a-record-of-another-file", "source": source, "layout": {"pp": 2}}]))
    (filled,) = stated_elsewhere([record], path)
    assert filled.training.micro_batch == 4 and filled.stated_elsewhere == ("training.micro_batch=4 (a script: its "
                                                                            "line 3)",)
    assert replace(filled, training=record.training, stated_elsewhere=()) == record


def test_every_stated_elsewhere_entry_names_a_record_of_the_open_set():
    ids = {r.id for path in tool.OPEN_SET for r in load(path)}
    entries = yaml.safe_load(tool.STATED_ELSEWHERE.read_text())
    assert entries and {e["id"] for e in entries} <= ids


def test_an_id_in_two_records_files_is_one_line(tmp_path, capsys):
    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    for path in (first, second):
        path.write_text(yaml.safe_dump([BASE]))
    assert tool.load_planned([str(first), str(second)]) is None
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: ") and str(second) in line and BASE["id"] in line

def test_every_record_is_mapped_or_has_a_reason(records):
    mapped = [map_record(r) for r in records.values()]
    assert all(bool(m.reasons) != m.expressible for m in mapped)
    counts = mapping.counts(mapped)
    assert sum(first for first, _ in counts.values()) == len(records) == 223
    assert counts[mapping.EXPRESSIBLE][0] >= 50  # before planning


@PLANNED_ONCE
def test_every_record_is_planned_or_has_a_reason(records, planned):
    assert list(planned) == list(records)  # none dropped, in order
    assert all((m.point is not None) == m.expressible for m in planned.values())
    counts = mapping.counts(list(planned.values()))
    assert sum(first for first, _ in counts.values()) == 223
    # 58 before gradient accumulation (107 LLM Foundry records), 165 before 3D layouts, 168 before torchtitan's
    # selective recomputation (its two plain FSDP records), 170 before fp8 linear layers and compiled blocks (its five
    # FSDP2 records with torch.compile, with or without Float8), 175 before context parallelism (its FSDP x CP records)
    assert counts[mapping.EXPRESSIBLE][0] == 178


# --- bad input: one line naming the file, the record and the key, exit 2 ----------------------------------------

BASE = yaml.safe_load(RECORDS.read_text())[0] if RECORDS.exists() else {}


def _with(change) -> list[dict]:
    record = copy.deepcopy(BASE)
    change(record)
    return [record]


@pytest.mark.parametrize(("records_", "expected"), [
    (_with(lambda r: r["hardware"].update(total_gpus="thirty-two")),
     "record megatron-readme-a100-1.7b: hardware.total_gpus='thirty-two' is not an integer"),
    (_with(lambda r: r["layout"].update(strategy="dp_tp")),
     "record megatron-readme-a100-1.7b: layout.strategy=dp_tp is not one of ddp, horovod, gpipe, 1f1b, "
     "interleaved_1f1b, pipedream_async, zero1, zero2, zero3, fsdp, megatron_tp, hybrid"),
    (_with(lambda r: r.pop("id")), "record 1 (no id): id is required"),
    (_with(lambda r: r["measured"].pop("metric")), "record megatron-readme-a100-1.7b: measured.metric is required"),
    (_with(lambda r: r["measured"].update(value=None)),
     "record megatron-readme-a100-1.7b: measured.value is required"),
    (_with(lambda r: r["measured"].update(metric="teraflops")),
     "record megatron-readme-a100-1.7b: measured.metric=teraflops is not one of tflops_per_gpu, mfu, samples_per_s, "
     "tokens_per_s, tokens_per_s_per_gpu, iteration_time_s, epoch_time_s, speedup, scaling_efficiency, "
     "memory_gb_per_gpu, max_batch_fits"),
    (_with(lambda r: r["layout"].update(sequence_paralel=True)),
     "record megatron-readme-a100-1.7b: layout.sequence_paralel is not a key of the schema (one of strategy, dp, tp, "
     "pp, virtual_stages, schedule, sequence_parallel, zero_stage)"),
    (_with(lambda r: r["hardware"].update(gpu="a100")),
     "record megatron-readme-a100-1.7b: hardware.gpu=a100 is not one of v100_sxm2_16gb, v100_sxm2_32gb, "
     "v100_sxm3_32gb, v100_pcie_32gb, v100, a100_sxm4_40gb, a100_sxm4_80gb, h100_sxm5_80gb, h100_sxm5_96gb, "
     "h200_sxm_141gb, titan_rtx, p100, p40 or other:<name>"),
    (_with(lambda r: r["training"].update(global_batch=True)),
     "record megatron-readme-a100-1.7b: training.global_batch=True is not an integer"),
    ([BASE, BASE], "record megatron-readme-a100-1.7b: id is given twice (records 1 and 2)"),
])
def test_a_malformed_record_is_one_line_naming_file_record_and_key(tmp_path, capsys, records_, expected):
    path = tmp_path / "records.yaml"
    path.write_text(yaml.safe_dump(records_, sort_keys=False))
    with pytest.raises(MalformedRecord) as info:
        load(path)
    assert str(info.value) == f"{path}: {expected}"
    assert tool.main([str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [f"error: {path}: {expected}"]
    assert captured.out == ""


def test_a_records_file_that_is_not_one_is_one_line(tmp_path, capsys):
    missing = tmp_path / "none.yaml"
    assert tool.main([str(missing)]) == 2
    assert capsys.readouterr().err == f"error: {missing}: cannot be read (No such file or directory)\n"
    broken = tmp_path / "broken.yaml"
    broken.write_text("- id: a\n  measured: {metric: speedup, value: 2\n")
    assert tool.main([str(broken)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {broken}:3:1: ")


UNSPLIT_HYBRID = "narayanan-a100-t2-ptd-175b-384gpu"  # a model-parallel size of 96, not split into tp and pp


def test_the_command_lists_each_record_and_the_count(tmp_path, capsys, records):
    path = tmp_path / "records.yaml"
    entries = yaml.safe_load(RECORDS.read_text())
    path.write_text(yaml.safe_dump([e for e in entries if e["id"] in (STUDY_J_HOROVOD[0], UNSPLIT_HYBRID)],
                                   sort_keys=False))
    assert tool.main([str(path), "--assumptions"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{UNSPLIT_HYBRID}: cannot: not stated: layout.dp, tp and pp of a hybrid layout",
        f"{STUDY_J_HOROVOD[0]}: {' '.join(STUDY_J_HOROVOD[1])}",
        "    assumed: inter-node network priced as lisa's (conf/cluster/lisa.yaml); the record's: 40 Gbps Ethernet",
        "    assumed: precision not stated: fp32, Horovod (PyTorch), ring-allreduce's default (PyTorch trains in "
        "float32 unless torch.amp is asked for (torch.get_default_dtype(): \"initially torch.float32\"))",
        "    assumed: activation recomputation not stated: none, PyTorch keeps what backward needs unless "
        "torch.utils.checkpoint is called (its docs: checkpointing \"trades compute for memory\" only where applied)",
        "    assumed: optimizer not stated: SGD with momentum, the suite's default",
        "",
        "2 records: 1 expressible as suite points; the rest by reason (first reason / among its reasons):",
        "     1 /    1  not stated",
    ]


def test_the_rows_of_one_source_table_and_model_are_ordered_by_kendalls_tau_and_the_pick_scored(records):
    from analysis.published_score import Order, Scored, ordering, source_table

    rows = [r for r in records.values() if r.prefix == "narayanan" and r.model.name == "GPT-3 175B"]
    assert len(rows) == 6 and {source_table(r) for r in rows} == {"Table 2"}
    same = [Scored(r, r.measured.metric, r.measured.value, 2 * r.measured.value) for r in rows]
    flipped = [Scored(r, r.measured.metric, r.measured.value, 1 / r.measured.value) for r in rows]
    fastest = max(rows, key=lambda r: r.measured.value)
    slowest = min(rows, key=lambda r: r.measured.value)
    key = ("narayanan: Table 2", "GPT-3 175B")
    assert ordering(same) == {key: Order(6, 1.0, fastest.id, 0.0)}  # picks the published fastest
    # picks the published slowest, that far below the fastest
    assert ordering(flipped) == {key: Order(6, -1.0, slowest.id, 1 - slowest.measured.value / fastest.measured.value)}
    assert ordering(same[:2]) == {}  # fewer than three rows order nothing


def test_memory_per_gpu_is_scored_per_source_with_whether_the_model_says_it_fits(records):
    """The records that state their memory per GPU: the predicted peak's error per source and over all of them, and
    fits agreed (a record ran, so it fits); a target line beside the issue's."""
    from analysis.published_score import MEMORY, Scored, memory_table, targets

    stating = [r for r in records.values() if "memory_gib" in r.measured.also][:3]
    gb = [r.measured.also["memory_gib"] * 2**30 / 1e9 for r in stating]
    scored = [Scored(stating[0], MEMORY, gb[0], 1.1 * gb[0], fits=True),
              Scored(stating[1], MEMORY, gb[1], 0.8 * gb[1], fits=False),
              Scored(stating[2], MEMORY, gb[2], None, "not priced")]
    table = memory_table(scored)
    assert [row[:2] + row[5:] for row in table.rows] == [["torchtitan", "2", "1 of 2", "1 unpriced"],
                                                         ["every record stating it", "2", "1 of 2", "1 unpriced"]]
    assert table.rows[0][2:5] == ["15.0%", "19.0%", "-5.0%"]  # median |error|, p90, median signed
    assert "fits predicted right (they ran, so they fit) on 1 of 2 priced" in table.notes[0]
    assert "memory per GPU over 2 priced records: median 15.0% (<= 10%: NOT met); fits predicted in 1 of 2 (>= 95%: " \
           "NOT met)" in targets(scored)
    assert targets(scored[2:]) == ["memory per GPU: none of the 1 records that state it priced"]


def test_the_share_of_records_priced_counts_those_whose_gpu_the_catalog_has(records):
    """The priced-share target: of the records whose GPU type a catalog cluster has, how many are priced; a record
    refused for its GPU is outside the count, one refused for anything else inside it."""
    from analysis.published_score import Scored, targets

    three = list(records.values())[:3]
    scored = [Scored(three[0], three[0].measured.metric, 1.0, 1.0),
              Scored(three[1], three[1].measured.metric, 1.0, None, "not stated: training.micro_batch (...)"),
              Scored(three[2], three[2].measured.metric, 1.0, None, f"{mapping.GPU}: p40: no cluster of ...")]
    assert "priced: 1 of the 2 records whose GPU is in the catalog, 50% (>= 85%: NOT met)" in targets(scored)


def test_every_framework_of_the_open_set_is_described_and_matched_by_its_whole_name(records):
    """Frameworks as data (conf/framework/): what each runs where a record is silent, with its source; a name is
    matched whole, so a framework spelt otherwise has no defaults rather than another's by substring."""
    from suite.published.frameworks import framework_of, frameworks

    named = {r.training.framework for r in records.values() if r.training.framework}
    assert named <= frameworks().keys(), named - frameworks().keys()
    megatron = framework_of("Megatron-LM")
    assert megatron.attention.value == "math" and "--use-flash-attn" in megatron.attention.source
    # its README's 2020 records cite the commit of that year's code, described by a file of its own
    assert framework_of("Megatron-LM", records["megatron-readme2020-mp-dgxa100-4b"].source.ref).name == \
        "megatron_lm_2020"
    assert framework_of("Megatron-LM", records["megatron-readme-a100-1.7b"].source.ref).name == "megatron_lm"
    assert megatron.recompute.value == "every" and megatron.selective_recompute == "selective"
    torchtitan = framework_of("torchtitan (PyTorch FSDP2)")
    assert torchtitan.precision.value == "bf16" and torchtitan.selective_recompute == "selective_op"
    stranger = framework_of("my megatron fork")  # "megatron" in its name gave it Megatron-LM's kernels before
    assert stranger.attention is None and stranger.precision is None and not stranger.offload
    record = records["megatron-readme2020-mp-dgxa100-4b"]
    renamed = replace(record, training=replace(record.training, framework="my megatron fork"))
    assert "network.attention=math" not in map_record(renamed).overrides
    silent = replace(renamed, training=replace(renamed.training, activation_recompute=None))
    assert any("not stated: training.activation_recompute (the record names none, and my megatron fork documents no "
               "default" in str(reason) for reason in map_record(silent).reasons)
