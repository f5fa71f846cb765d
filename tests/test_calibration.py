"""`make calibrate`: nccl-tests' bus bandwidth, the job on 2 gloo ranks (its curve, record and MLflow run), the job
script of a batch cluster, copying a record into a cluster config, and the MFU of points that divide by its peak
(or say why they have none)."""

import re
import shutil
import statistics

import pytest
import yaml
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from conftest import results_of_their_own, run_make, run_suite
from suite.errors import ConfigError
from suite.paths import CONF_DIR, load_record, record_path
from suite.predict import library_overhead
from suite.predict.library_overhead import Overhead, Probe, overhead_path
from suite.records.store import Store
from suite.shared_names import Collective
from suite.tools.calibrate import CALIBRATED, apply_record, check, compose_config
from suite.worker.calibration_rank import bus_bandwidth, message_sizes

pytestmark = pytest.mark.xdist_group("calibration")  # one worker runs the module: its fixtures run once

KIB, MIB = 2**10, 2**20


@pytest.mark.parametrize("op, ranks, busbw", [
    (Collective.all_reduce, 8, 1.75),  # 2 (n - 1) / n
    (Collective.all_reduce, 2, 1.0),
    (Collective.all_gather, 8, 0.875),  # (n - 1) / n
    (Collective.reduce_scatter, 4, 0.75),
    (Collective.broadcast, 8, 1.0),
])
def test_bus_bandwidth_is_nccl_tests(op, ranks, busbw):
    assert bus_bandwidth(op, 1.0, ranks) == busbw
    assert bus_bandwidth(op, 3.0, ranks) == 3 * busbw


def test_message_sizes_go_up_by_the_factor_to_the_largest():
    assert message_sizes(4 * KIB, 256 * MIB, 4) == [4 * KIB * 4**k for k in range(9)]
    assert message_sizes(4 * KIB, 5 * KIB, 2) == [4 * KIB]
    with pytest.raises(ValueError):
        message_sizes(4 * KIB, 2 * KIB, 4)


@pytest.mark.parametrize("overrides, error", [
    (["nodes=2"], "cluster local is one node, not nodes=2"),
    (["cluster=lassen"],
     "cluster lassen needs an account to charge: add ACCOUNT=<name> (or cluster.job.account=<name>)"),
    (["cluster=lassen", "cluster.job.account=bank", "workers=5"],
     "workers=5 on nodes=1 is more than cluster lassen's 4 per node"),
    (["calibration.dtypes=[fp64]"], "calibration.dtypes: fp64 not among fp32, tf32, bf16, fp16"),
    (["calibration.probe_strategies=[ddp,zero2]"], "calibration.probe_strategies: zero2 not among 1f1b, axonn, "
     "ddp, fsdp, gpipe, gpipe_dist, horovod, megatron, pipedream, single, zero, zero3"),
    (["calibration.probe_passes=0"], "calibration.probe_passes must be at least 1, got 0"),
    (["calibration.max_bytes=1024"],
     "calibration: message sizes 4096..1024 by x4: need 4 <= min <= max and factor >= 2"),
])
def test_a_calibration_that_cannot_run_is_one_line(overrides, error):
    with pytest.raises(ConfigError, match=f"^{re.escape(error)}$"):
        check(compose_config(overrides), dry_run=True)


def test_a_batch_calibration_takes_every_gpu_of_its_nodes():
    cfg = compose_config(["cluster=thetagpu", "nodes=2"])
    assert (cfg.workers, cfg.nodes, cfg.tracking.experiment) == (16, 2, "calibration")


def record(scopes: dict) -> dict:
    return {"provenance": {"date": "2026-11-22T17:00:00+0000", "hosts": ["lassen710"], "device": "Tesla V100-SXM2-16GB",
                           "backend": "nccl", "torch": "2.14.1", "git_sha": "0123456789abcdef"},
            "p2p": {scope: {"ranks": [0, 1], "latency_s": latency, "bandwidth_gbs": bandwidth}
                    for scope, (latency, bandwidth) in scopes.items()}}


def test_apply_copies_the_records_bandwidths_and_latencies_into_the_cluster_config(tmp_path):
    config = tmp_path / "lassen.yaml"
    shutil.copyfile(CONF_DIR / "cluster" / "lassen.yaml", config)
    before = config.read_text().splitlines()
    source = tmp_path / "record.yaml"
    values = apply_record(record({"intra_node": (2.5e-5, 44.123456), "inter_node": (4.1e-6, 11.9)}), config, source)
    assert values == {"intra_node_bandwidth_gbs": 44.12, "intra_node_latency_us": 25.0,
                      "inter_node_bandwidth_gbs": 11.9, "inter_node_latency_us": 4.1}
    hardware = OmegaConf.load(config).hardware
    assert {field: hardware[field] for field in values} == values
    assert (hardware.cpu, hardware.fp64_tflops, hardware.nics_per_node) == ("IBM Power9", 7.0, 2)  # the rest as it was
    comment = [line for line in config.read_text().splitlines() if CALIBRATED in line]
    assert comment == [f"  {CALIBRATED} intra_node_bandwidth_gbs, intra_node_latency_us, inter_node_bandwidth_gbs, "
                       f"inter_node_latency_us from {source}: send/recv ping-pong measured 2026-11-22T17:00:00+0000 on "
                       "lassen710 (Tesla V100-SXM2-16GB), nccl, torch 2.14.1, git 0123456789"]
    # Applied again: the values and their one comment replaced, every other line untouched.
    apply_record(record({"intra_node": (3e-5, 40.0)}), config, source)
    after = config.read_text().splitlines()
    assert OmegaConf.load(config).hardware.intra_node_bandwidth_gbs == 40.0
    assert sum(CALIBRATED in line for line in after) == 1
    changed = {line.split(":")[0].strip() for line in set(before) ^ set(after)}
    assert changed <= {*values, "#"} | {line.split(":")[0].strip() for line in comment}


def test_apply_adds_a_hardware_block_where_there_is_none(tmp_path):
    config = tmp_path / "slurm.yaml"
    shutil.copyfile(CONF_DIR / "cluster" / "slurm.yaml", config)
    apply_record(record({"intra_node": (1e-5, 10.0)}), config, tmp_path / "record.yaml")
    loaded = OmegaConf.load(config)
    assert (loaded.hardware.intra_node_bandwidth_gbs, loaded.hardware.intra_node_latency_us) == (10.0, 10.0)
    assert loaded.job.time_limit_min == 60


SMALL = ("calibration.max_bytes=4194304 calibration.matmul_n=256 calibration.seconds=0.05 "
         "calibration.matmul_seconds=0.2 cluster.threads_per_worker=1 calibration.probe_strategies=[single] "
         "calibration.probe_passes=2")


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """`make calibrate` on 2 gloo ranks, 4 KiB to 4 MiB, into a results directory of its own. Over 120 s in `make
    test` on 2 loaded cores: the matmul peak, every collective's curve and the library-overhead probes, which the
    module's tests read."""
    with results_of_their_own(tmp_path_factory, "calibrated") as results:
        made = run_make("calibrate", f"ARGS={SMALL}")
    return results, made


@pytest.mark.slow
def test_make_calibrate_records_a_bus_bandwidth_curve_that_rises(calibrated, monkeypatch):
    results, made = calibrated
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    assert re.search(r"^\[rank0\]: .* calibrate: intra_node all_reduce 4 KiB: ", made.stdout, re.M)  # progress
    monkeypatch.setenv("SUITE_RESULTS_DIR", str(results))
    found = load_record("local")
    sizes = [4 * KIB * 4**k for k in range(6)]
    curves = found["collectives"]["intra_node"]
    assert found["collectives"].keys() == {"intra_node"} and curves["ranks"] == 2
    for op in Collective:
        assert [point["bytes"] for point in curves[op]] == sizes
        smallest, largest = curves[op][0]["busbw_gbs"], curves[op][-1]["busbw_gbs"]
        assert largest > 2 * smallest, (op, smallest, largest)  # latency-bound at 4 KiB, far from it at 4 MiB
        for point in curves[op]:
            assert point["algbw_gbs"] == pytest.approx(point["bytes"] / point["time_s"] / 1e9)
    p2p = found["p2p"]["intra_node"]
    assert p2p["ranks"] == [0, 1] and 0 < p2p["latency_s"] < 1 and p2p["bandwidth_gbs"] > 0
    assert found["matmul"]["threads"] == 2 and set(found["matmul"]["tflops"]) == {"fp32", "bf16"}
    provenance = found["provenance"]
    assert (provenance["backend"], provenance["world_size"], provenance["nodes"]) == ("gloo", 2, 1)
    client = MlflowClient(Store().uri)
    run = client.get_run(provenance["mlflow_run_id"])
    assert run.data.tags["suite.status"] == "finished"
    assert {"cluster": "local", "backend": "gloo", "world_size": "2"}.items() <= run.data.params.items()
    history = client.get_metric_history(run.info.run_id, "intra_node_all_reduce_busbw_gbs")
    assert sorted(m.step for m in history) == sizes
    assert yaml.safe_load(client.download_artifacts(run.info.run_id, "calibration.yaml", str(results)) and
                          (results / "calibration.yaml").read_text()) == found
    assert f"recorded as run {run.info.run_id} and in {record_path('local')}" in made.stdout
    assert yaml.safe_load(record_path("local", ranks=2).read_text()) == found  # the latest among 2 ranks


@pytest.mark.slow
def test_make_calibrate_measures_the_library_overhead_on_probe_networks(calibrated, monkeypatch):
    results, made = calibrated
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    monkeypatch.setenv("SUITE_RESULTS_DIR", str(results))
    library = yaml.safe_load(overhead_path("local").read_text())
    assert list(library["strategies"]) == ["single"]  # calibration.probe_strategies=[single]
    single = library["strategies"]["single"]
    assert single["workers"] == 1  # the others on the calibration's 2
    probes = single["probes"]
    narrow, wide, deep = probes
    assert wide["param_bytes"] > 10 * narrow["param_bytes"] > 0 and wide["param_tensors"] == narrow["param_tensors"]
    assert deep["param_tensors"] > 3 * narrow["param_tensors"] > 0
    found = Overhead(single["fixed_s"], single["per_byte_s"], single["per_tensor_s"])
    assert found == library_overhead.fit([Probe("single", p["param_bytes"], p["param_tensors"], p["predicted_s"],
                                        p["measured_s"]) for p in probes])["single"]
    if found.per_byte_s > 0 and found.per_tensor_s > 0:  # three terms from three probes: through each of them
        for probe in probes:
            assert found.step_s(probe["param_bytes"], probe["param_tensors"]) == pytest.approx(
                probe["measured_s"] - probe["predicted_s"])
    client = MlflowClient(Store().uri)
    runs = [client.get_run(run_id) for run_id in library["runs"]]
    assert [run.data.tags["suite.status"] for run in runs] == ["finished"] * 6  # 3 probes, 2 passes over them
    assert {client.get_experiment(run.info.experiment_id).name for run in runs} == {"library_overhead"}
    steps = [run.data.metrics["epoch_time_s_mean"] / run.data.metrics["steps_per_epoch"] for run in runs]
    for index, probe in enumerate(probes):
        assert probe["passes_s"] == pytest.approx([steps[index], steps[index + 3]])
        assert probe["measured_s"] == pytest.approx(statistics.median(probe["passes_s"]))
    assert f"library overhead in {overhead_path('local')}" in made.stdout


TINY = ["dataset=tokens", "network=gpt2_tiny", "dataset.vocab_size=512", "dataset.seq_len=32", "dataset.samples=128",
        "dataset.val_samples=16", "batch_size=8", "epochs=1", "steps_per_epoch=4", "warmup_steps=1",
        "eval_batches=1", "record_prediction=false"]  # MFU is what is tested here, not the model's profiling
# A node's ranks use 2 threads in all, as the calibration's (2 ranks of one thread) did.
TINY_POINTS = {"tokens/gpt2_tiny/single/w1": ["strategy=single", "workers=1", "cluster.threads_per_worker=2"],
               "tokens/gpt2_tiny/ddp/w2": ["strategy=ddp", "workers=2", "cluster.threads_per_worker=1"]}


@pytest.mark.slow
def test_points_divide_by_the_calibrated_peak(calibrated, monkeypatch):
    results, made = calibrated
    assert made.returncode == 0, made.stderr[-3000:]
    monkeypatch.setenv("SUITE_RESULTS_DIR", str(results))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for overrides in TINY_POINTS.values():
        done = run_suite(*TINY, *overrides)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    peak = load_record("local")["matmul"]["tflops"]["fp32"]
    runs = {run.info.run_name: run for run in Store().runs("adhoc")}
    assert runs.keys() == TINY_POINTS.keys()
    for run in runs.values():
        m, tags = run.data.metrics, run.data.tags
        steps = m["steps_per_epoch"]
        assert m["model_tflop_per_step"] > 0 and m["hardware_tflop_per_step"] == m["model_tflop_per_step"]
        # Per device, and on CPU the node is the device: the whole step's FLOPs over the epoch time.
        assert m["achieved_tflops"] == pytest.approx(m["model_tflop_per_step"] * steps / m["epoch_time_s_mean"])
        assert m["peak_tflops"] == pytest.approx(peak)
        assert m["mfu"] == pytest.approx(m["achieved_tflops"] / peak) and m["hfu"] == pytest.approx(m["mfu"])
        assert (tags["suite.peak_source"], tags["suite.peak_dtype"]) == ("calibration", "fp32")
        assert "suite.mfu_missing" not in tags
        assert "predicted_epoch_time_s" not in m  # record_prediction=false: the calibration record alone asks for none
    # Two replicas of batch 8 compute twice the FLOPs of one per global step.
    assert runs["tokens/gpt2_tiny/ddp/w2"].data.metrics["model_tflop_per_step"] == pytest.approx(
        2 * runs["tokens/gpt2_tiny/single/w1"].data.metrics["model_tflop_per_step"])


@pytest.mark.slow
def test_without_a_peak_a_point_has_no_mfu_and_says_why(results, store):
    done = run_suite(*TINY, *TINY_POINTS["tokens/gpt2_tiny/ddp/w2"], "activation_checkpointing=every")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run,) = store.runs("adhoc")
    m = run.data.metrics
    assert m["model_tflop_per_step"] > 0 and m["hardware_tflop_per_step"] > m["model_tflop_per_step"]
    assert "achieved_tflops" in m and not {"mfu", "hfu", "peak_tflops"} & m.keys()
    assert run.data.tags["suite.mfu_missing"] == (f"no calibration record {record_path('local')} "
                                                  "(make calibrate CLUSTER=local); cluster local gives no "
                                                  "hardware.peak_tflops.fp32")


@pytest.mark.slow
def test_make_calibrate_on_a_batch_cluster_writes_its_job_script(results):
    made = run_make("calibrate", "CLUSTER=lassen", "ACCOUNT=bank", "NODES=2", "DRY_RUN=1")
    assert made.returncode == 0, made.stderr[-3000:]
    (script,) = re.findall(r"^\[calibrate/lassen/w8\] job script: (\S+)$", made.stdout, re.M)
    text = open(script).read()
    assert {"#BSUB -nnodes 2", "#BSUB -G bank"} <= set(text.splitlines())
    assert re.search(r"^run_point 0 TERM \S+/calibration/jobs/lassen/\S+-w8 calibrate/lassen/w8 10 jsrun .* "
                     r"-m suite.worker ", text, re.M)
    assert "-m suite.records.record" in text
    assert not (results / "calibration").exists()  # a dry run creates no job directory
    assert "the library overhead's probes are not part of a batch job" in made.stdout
