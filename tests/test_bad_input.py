"""Bad input as a user types it: one line naming the offending value, exit 2, before anything is profiled or
launched and without creating a store (issue 30, cases 1, 3-6, 8, 17)."""


import pytest

from analysis import report as reporting
from conftest import DIGITS, run_make
from suite import __main__ as driver
from suite.errors import ConfigError
from suite.predict.costs import StepTime
from suite.predict.memory import Memory
from suite.predict.predictor import Prediction
from suite.sweep import sweep_files
from suite.sweep.plan import plan
from suite.sweep.sweep_files import sweep_file
from suite.tools import predict as predict_tool
from suite.tools import recommend as recommend_tool

TOOLS = {"predict": predict_tool, "recommend": recommend_tool}


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if not line.startswith("[")]  # the tools' progress lines aside


@pytest.mark.parametrize(("tool", "overrides", "expected"), [
    ("predict", ["workers=0"], "error: workers must be positive, got 0"),
    ("predict", ["strategy=ddp", "batch_size=-8"], "error: batch_size must be positive, got -8"),
    ("predict", ["precision=fp8"], "error: precision=fp8 is not one of fp32, bf16, fp16"),
    ("predict", ["optimizer.name=rmsprop"], "error: optimizer.name=rmsprop is not one of sgd, adam, adamw, lamb"),
    ("predict", ["cluster.device=tpu"], "error: cluster.device=tpu is not one of auto, cpu, cuda"),
    ("predict", ["workers=two"], "error: workers=two: Value 'two' of type 'str' could not be converted to Integer"),
    ("predict", ["strategy=zero", "optimizer.name=adam", "strategy.offload=gpu"],
     "error: strategy zero: offload=gpu is not one of none, cpu, params"),
    ("predict", ["strategy=gpipe_dist", "workers=2", "strategy.balance=by_magic"],
     "error: strategy gpipe_dist: balance=by_magic is not one of by_params, by_time or a list of integers"),
    ("predict", ["dataset.samples=0"], "error: dataset.samples=0 must be positive"),
    ("predict", ["strategy=ddp", "strategy.bucket_cap_mb=abc"],
     "error: strategy ddp: bucket_cap_mb=abc is not a number"),
    ("predict", ["strategy=zero", "strategy.zero_stage=4"],
     "error: strategy zero: zero_stage must be 1, 2 or 3, got 4"),
    ("predict", ["strategy=ddp", "strategy.bucket_cap_mb=0"], "error: strategy ddp needs bucket_cap_mb > 0, got 0"),
    ("recommend", ["workers=0"], "error: workers=0: workers must be positive integers separated by commas"),
])
def test_predict_and_recommend_reject_nonsense_values(results, capsys, tool, overrides, expected):
    """Case 1: a value no point could run with is rejected, not listed as a point that cannot run here."""
    assert TOOLS[tool].main([*DIGITS, *overrides]) == 2
    assert error_lines(capsys.readouterr().err) == [expected]
    assert not results.exists()


def test_a_point_the_cluster_cannot_run_is_still_listed(results, capsys):
    """Case 1's other half: torchgpipe beyond one node composes and is valid; this cluster cannot run it."""
    overrides = ["cluster=slurm", "cluster.workers_per_node=1", "strategy=gpipe", "workers=2"]
    assert predict_tool.main([*DIGITS, *overrides]) == 0
    out = capsys.readouterr().out
    assert "| digits/resnet18/gpipe/w2 | cannot run: strategy gpipe (torchgpipe) drives all its devices from one " \
           "process on one node" in out
    assert "Profiled on" not in out  # nothing predicted: no notes on how


def test_a_sweep_recording_invalid_points_still_rejects_nonsense_values():
    """Case 1 in a sweep file with `invalid_points: record`: a bad value rejects the sweep, it is not recorded."""
    invalid = []
    with pytest.raises(ConfigError) as info:
        plan([["workers=1"], ["workers=0"]], invalid=invalid)
    assert str(info.value) == "workers=0: workers must be positive, got 0"
    assert invalid == []


@pytest.mark.slow
@pytest.mark.parametrize(("value", "expected"), [
    ("abc", "error: argument --repeats: 'abc' is not a positive integer (--help lists the options)"),
    ("0", "error: argument --repeats: '0' is not a positive integer (--help lists the options)"),
    ("-2", "error: argument --repeats: '-2' is not a positive integer (--help lists the options)"),
])
def test_make_sweep_rejects_repeats_that_are_not_a_positive_count(results, value, expected):
    """Case 3: no usage block for a word, no silent single run for 0."""
    result = run_make("sweep", f"REPEATS={value}", "SWEEP=digits")
    assert result.returncode != 0
    assert [line for line in result.stderr.splitlines() if not line.startswith("make:")] == [expected]
    assert not results.exists()


@pytest.mark.parametrize(("repeats", "expected"), [("abc", "abc"), ("0", "0"), ("2.5", "2.5"), ("true", "True")])
def test_a_sweep_files_repeats_must_be_a_positive_count(conf_copy, repeats, expected):
    """Case 3 in a sweep file: its `repeats:` key."""
    (conf_copy / "sweep" / "repeated.yaml").write_text(f"points:\n  - workers=1\nrepeats: {repeats}\n")
    with pytest.raises(ConfigError, match=None) as info:
        sweep_file("repeated")
    assert str(info.value) == f"sweep repeated: repeats={expected} is not a positive integer"


def test_a_sweep_files_points_reuse_its_workloads(conf_copy):
    """`workloads` names override lines that points (and other workloads) interpolate."""
    (conf_copy / "sweep" / "reused.yaml").write_text(
        "common: [epochs=1]\n"
        "workloads:\n  gpt2: dataset=tokens network=gpt2_mini\n  held: ${workloads.gpt2} workers=2\n"
        "points:\n  - ${workloads.gpt2} strategy=ddp workers=1,2\n  - ${workloads.held} strategy=zero\n"
        "  - strategy=single seed=\\${workers}\n")  # escaped: Hydra's own interpolation, left to the point
    assert sweep_files.sweep_lines("reused") == [
        ["epochs=1", "dataset=tokens", "network=gpt2_mini", "strategy=ddp", "workers=1,2"],
        ["epochs=1", "dataset=tokens", "network=gpt2_mini", "workers=2", "strategy=zero"],
        ["epochs=1", "strategy=single", "seed=${workers}"]]


def test_a_sweep_line_that_names_its_clusters_gives_no_points_on_another(conf_copy):
    """Study N ran AxoNN on Lassen only: its lines name their clusters, the rest run on every cluster; a point that
    names no cluster runs on conf/config.yaml's default (local)."""
    (conf_copy / "sweep" / "somewhere.yaml").write_text(
        "points:\n  - strategy=ddp workers=1,2\n  - line: strategy=axonn workers=2\n    clusters: [lassen, local]\n")
    assert sweep_files.sweep_jobs("somewhere", ["cluster=sophia,lassen"]) == [
        ["strategy=ddp", "workers=1", "cluster=sophia"], ["strategy=ddp", "workers=1", "cluster=lassen"],
        ["strategy=ddp", "workers=2", "cluster=sophia"], ["strategy=ddp", "workers=2", "cluster=lassen"],
        ["strategy=axonn", "workers=2", "cluster=lassen"]]
    assert sweep_files.sweep_jobs("somewhere", []) == [["strategy=ddp", "workers=1"], ["strategy=ddp", "workers=2"],
                                                       ["strategy=axonn", "workers=2"]]
    study_n = {cluster: {job[job.index("strategy=axonn") - 1] for job in sweep_files.sweep_jobs(
        "study_n", [f"cluster={cluster}"]) if "strategy=axonn" in job} for cluster in ("lassen", "sophia")}
    assert study_n == {"lassen": {"precision=fp16"}, "sophia": set()}


@pytest.mark.parametrize(("entry", "expected"), [
    ("  - line: workers=2\n    clusters: [lasen]\n",
     "sweep clustered: point 'workers=2' names cluster(s) lasen (known: "),
    ("  - line: workers=2\n", "sweep clustered: point {'line': 'workers=2'} is neither an override line nor "
                               "`line: ..., clusters: [...]`"),
    ("  - line: workers=2\n    clusters: []\n", "sweep clustered: point {'line': 'workers=2', 'clusters': []} is "
                                                 "neither an override line nor `line: ..., clusters: [...]`"),
])
def test_a_sweep_lines_clusters_are_known_ones(conf_copy, entry, expected):
    (conf_copy / "sweep" / "clustered.yaml").write_text(f"points:\n{entry}")
    with pytest.raises(ConfigError, match=None) as info:
        sweep_file("clustered")
    assert str(info.value).startswith(expected)


@pytest.mark.parametrize(("text", "expected"), [
    ("workloads:\n  gpt2: dataset=tokens\npoints:\n  - ${workloads.gpt3} strategy=ddp\n",
     "sweep interpolated: points[0]: Interpolation key 'workloads.gpt3' not found (workloads: gpt2)"),
    ("common: [epochs=1]\npoints:\n  - workers=1\n  - ${workloads.gpt2} workers=2\n",
     "sweep interpolated: points[1]: Interpolation key 'workloads.gpt2' not found (workloads: none)"),
    ("workloads:\n  gpt2: [dataset=tokens]\npoints:\n  - ${workloads.gpt2}\n",
     "sweep interpolated: workloads is not a mapping of names to override lines"),
])
def test_a_sweep_files_interpolation_to_nothing_is_one_line(conf_copy, text, expected):
    (conf_copy / "sweep" / "interpolated.yaml").write_text(text)
    with pytest.raises(ConfigError, match=None) as info:
        sweep_file("interpolated")
    assert str(info.value) == expected


HARDWARE = {
    "nodes": ("0", "must be positive, got 0"),
    "cores_per_node": ("-4", "must be positive, got -4"),
    "cpu_memory_gb": ("0", "must be positive, got 0.0"),
    "device_memory_gb": ("-1", "must be positive, got -1.0"),
    "fp64_tflops": ("0", "must be positive, got 0.0"),
    "intra_node_bandwidth_gbs": ("0", "must be positive, got 0.0"),
    "inter_node_bandwidth_gbs": ("-10", "must be positive, got -10.0"),
    "intra_node_latency_us": ("-1", "must be >= 0, got -1.0"),
    "inter_node_latency_us": ("-0.5", "must be >= 0, got -0.5"),
    "peak_tflops.fp16": ("0", "must be positive, got 0.0"),
    "fp8_tflops": ("-1", "must be positive, got -1.0"),
    "device_memory_bandwidth_gbs": ("0", "must be positive, got 0.0"),
    "sm_count": ("0", "must be positive, got 0"),
    "boost_clock_mhz": ("-1530", "must be positive, got -1530.0"),
    "nvlink_generation": ("0", "must be positive, got 0"),
    "nvlink_bandwidth_gbs": ("-150", "must be positive, got -150.0"),
    "pcie_generation": ("0", "must be positive, got 0"),
    "nics_per_node": ("0", "must be positive, got 0"),
    "nic_bandwidth_gbs": ("-12.5", "must be positive, got -12.5"),
}


@pytest.mark.parametrize("key", HARDWARE)
def test_a_clusters_hardware_must_be_positive(key):
    """Case 4, every capacity, bandwidth, count and peak of a cluster's hardware; rejected even where points that
    cannot run are recorded."""
    value, problem = HARDWARE[key]
    invalid = []
    with pytest.raises(ConfigError, match=None) as info:
        plan([["cluster=lassen", "cluster.job.account=x", f"cluster.hardware.{key}={value}"]], invalid=invalid)
    assert str(info.value) == f"cluster.hardware.{key} {problem}"
    assert invalid == []


def test_the_driver_rejects_a_non_positive_capacity_before_launch(results, capsys):
    """Case 4 as typed: `python -m suite cluster.hardware.device_memory_gb=-1`, no point directory, no store."""
    assert driver.main(["cluster.hardware.device_memory_gb=-1"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: cluster.hardware.device_memory_gb must be positive, got -1.0"]
    assert not results.exists()


@pytest.mark.parametrize(("override", "expected"), [
    ("optimizer.lr=nan", "optimizer.lr=nan"), ("optimizer.lr=inf", "optimizer.lr=inf"),
    ("optimizer.momentum=-inf", "optimizer.momentum=-inf"), ("cluster.hardware.nic_bandwidth_gbs=nan",
                                                             "cluster.hardware.nic_bandwidth_gbs=nan")])
def test_a_knob_that_is_not_a_finite_number_is_refused_before_launch(results, capsys, override, expected):
    """Hostile inputs 3, case 1: nan passes `value <= 0` and inf any upper bound; every number of a point is checked
    finite before any range, whatever its knob."""
    assert driver.main([*DIGITS, override]) == 2
    assert capsys.readouterr().err.splitlines() == [f"error: {expected} must be a finite number"]
    assert not results.exists()


@pytest.mark.parametrize(("argv", "expected"), [
    (["--sweep", "../../../x/outside/evil"], "sweep name '../../../x/outside/evil' holds a path separator"),
    ([*DIGITS, "tracking.experiment=../../escaped-exp"], "tracking.experiment='../../escaped-exp' holds a path "
                                                          "separator"),
    ([*DIGITS, "tracking.experiment=.."], "tracking.experiment='..' is empty or a relative directory"),
    ([*DIGITS, f"tracking.experiment={'x' * 300}"], "tracking.experiment='xxx"),
], ids=["sweep", "experiment", "dot-dot", "too-long"])
def test_a_name_that_would_write_outside_the_results_directory_is_refused(tmp_path, monkeypatch, capsys, argv,
                                                                          expected):
    """Hostile inputs 3, case 2: names that become directories (a sweep's, an experiment's, a cluster's) stay one
    directory under the results directory, checked before anything is created, there or anywhere."""
    results = tmp_path / "a" / "b" / "results"
    monkeypatch.setenv("SUITE_RESULTS_DIR", str(results))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert driver.main(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: {expected}"), line
    assert not (tmp_path / "a").exists() and not (tmp_path / "x").exists()


@pytest.mark.parametrize(("file", "text", "argv", "expected"), [
    ("sweep/empty.yaml", "", ["--sweep", "empty"], "{dir}/sweep/empty.yaml: has no points (a sweep file maps "
                                                    "`points` to a list of override lines)"),
    ("sweep/listed.yaml", "- workers=1\n", ["--sweep", "listed"], "{dir}/sweep/listed.yaml: is not a mapping (a "
                                                                  "sweep file maps `points` to a list of override "
                                                                  "lines)"),
    ("cluster/nameless.yaml", "defaults: [cluster_schema]\nscheduler: local\n", [*DIGITS, "cluster=nameless"],
     "cluster.name not set: cluster=nameless's config file must set it"),
], ids=["empty sweep", "sweep list", "nameless cluster"])
def test_a_malformed_site_file_is_one_line_naming_it(tmp_path, results, monkeypatch, capsys, file, text, argv,
                                                     expected):
    """Hostile inputs 3, case 3: files under --config-dir that are empty, not a mapping or lack a required key."""
    site = tmp_path / "site"
    (site / file).parent.mkdir(parents=True)
    (site / file).write_text(text)
    monkeypatch.setenv("SUITE_CONFIG_DIR", str(site))
    assert driver.main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [f"error: {expected.format(dir=site)}"]
    assert not results.exists()


def test_a_deepspeed_config_that_contradicts_the_batch_is_refused_before_launch(results, capsys):
    """Hostile inputs 3, case 6: DeepSpeed asserted the contradiction only in the ranks (the point recorded failed)."""
    zero = [*DIGITS, "strategy=zero", "workers=2", "optimizer.name=adam"]
    assert driver.main([*zero, "+strategy.ds_config.train_batch_size=999"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: strategy zero: ds_config.train_batch_size=999 contradicts the point's 32: the batch is set by "
        "batch_size, workers and grad_accum"]
    assert not results.exists()


def test_a_yaml_syntax_error_in_conf_is_one_line_with_file_line_column(conf_copy):
    """Case 5: a sweep file (read by the planner) and a group's option (composed by Hydra)."""
    sweep = conf_copy / "sweep" / "broken.yaml"
    sweep.write_text("common: [dataset=digits\npoints:\n  - workers=1\n")
    with pytest.raises(ConfigError, match=None) as info:
        sweep_file("broken")
    assert str(info.value) == f"{sweep}:2:7: expected ',' or ']', but got ':'"
    with pytest.raises(ConfigError, match=None) as info:
        reporting.report_settings("broken")  # `make report SWEEP=broken` reads its report section
    assert str(info.value) == f"{sweep}:2:7: expected ',' or ']', but got ':'"
    network = conf_copy / "network" / "broken.yaml"
    network.write_text("name: broken\n  depth: 3\n")
    with pytest.raises(ConfigError, match=None) as info:
        plan([["network=broken"]])
    assert str(info.value) == f"{network}:2:8: mapping values are not allowed here"


NOT_AN_OVERRIDE = "is not an override: give key=value, e.g. strategy=ddp"


@pytest.mark.parametrize(("command", "argv", "expected"), [
    (driver, ["strategy"], f"error: 'strategy' {NOT_AN_OVERRIDE}"),
    (driver, ["-m", "strategy=ddp", "workers"], f"error: 'workers' {NOT_AN_OVERRIDE}"),
    (driver, ["workers=[1"], "error: override 'workers=[1' does not parse: no viable alternative at input '[1'"),
    (predict_tool, ["network"], f"error: 'network' {NOT_AN_OVERRIDE}"),
    (recommend_tool, ["network", "workers=2"], f"error: 'network' {NOT_AN_OVERRIDE}"),
], ids=["suite", "sweep", "unparsed", "predict", "recommend"])
def test_an_override_without_a_value_is_one_line(results, capsys, command, argv, expected):
    """Case 6: `python -m suite strategy`, `make sweep ARGS=workers`, the same in predict and recommend."""
    assert command.main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [expected]
    assert not results.exists()


@pytest.mark.parametrize("tool", TOOLS)
def test_the_fitted_variant_without_a_correction_is_refused_before_profiling(results, capsys, tool):
    """Case 8: said at once, with how to fit one; nothing profiled (results/profiles is not even made)."""
    assert TOOLS[tool].main(["--variant", "fitted", *DIGITS, "workers=1"]) == 2
    assert error_lines(capsys.readouterr().err) == [
        f"error: no fitted correction for cluster local ({results}/calibration/local.correction.yaml): "
        "`make bench-model` fits one on this machine's measured grid"]
    assert not results.exists()


def test_every_predict_column_has_its_value():
    """Case 17: as many values as headers, each under its own (the step's time waiting for a core included)."""
    point = plan([DIGITS])[0]
    step = StepTime(compute=0.5, comm=0.25, bubble=0.125, optimizer=0.0625, data=0.03125, core_wait=0.375)
    prediction = Prediction(point, step, 10, Memory(1, 2, 3, 4, 5, 6), None, "cpu", "calibration local.yaml")
    row = predict_tool.prediction_row(prediction)
    assert len(row) == len(predict_tool.COLUMNS)
    values = dict(zip(predict_tool.COLUMNS, row))
    assert (values["core wait"], values["optimizer"], values["data"]) == ("0.3750", "0.0625", "0.0312")
