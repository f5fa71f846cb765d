"""The studies' reports from a real store: a slice of each miniature through the driver, every artifact written,
tables that parse, failed and invalid points kept in the status matrix, claims evaluated; a sweep invocation as
a parent run with its points as children."""

import csv
import io

import pytest

from analysis.report import write_report
from conftest import DIGITS, run_suite
from suite.sweep.driver import record_invalid
from suite.sweep.plan import plan

pytestmark = pytest.mark.xdist_group("report_studies")  # one worker runs the module: its fixtures run once

FAST = [*DIGITS, "steps_per_epoch=2", "log_every=1", "tracking.experiment=slice"]
GPT2 = ["dataset=tokens", "dataset.seq_len=32", "dataset.samples=64", "dataset.val_samples=16", "network=gpt2_tiny",
        "batch_size=4", "epochs=2", "steps_per_epoch=2", "warmup_steps=1", "tracking.experiment=slice"]
J_FILES = ["study_settings", "status_matrix", "status_problems", "j_epoch_time", "j_speedup_gpus",
           "j_table6_1_gpipe_configs", "claims", "breakdown"]
J_FIGURES = ["j_fig3_1_speedup", "j_fig3_2_speedup_gpus"]
N_FILES = ["study_settings", "status_matrix", "n_epoch_time", "n_single_gpu", "n_breakdown", "n_time_to_target",
           "n_zero_ddp_memory", "n_pipeline_memory_reduction", "n_table2_systems", "n_table3_hyperparameters", "claims",
           "claims_separated", "breakdown"]
N_FIGURES = ["n_fig6_epoch_time", "n_fig4_single_gpu", "n_fig5_breakdown", "n_fig8_convergence", "n_fig9_memory"]


def table(directory, name) -> list[list[str]]:
    return list(csv.reader(io.StringIO((directory / f"{name}.csv").read_text())))


def check_artifacts(directory, tables, figures):
    for name in tables:
        rows = table(directory, name)
        assert rows and all(len(row) == len(rows[0]) for row in rows), name
        latex = (directory / f"{name}.tex").read_text()
        assert latex.count(r"\toprule") == latex.count(r"\midrule") == latex.count(r"\bottomrule") == 1
        body = latex.split(r"\midrule")[1].split(r"\bottomrule")[0].strip().splitlines()
        assert len(body) == len(rows) - 1 and all(line.endswith(r"\\") for line in body)
        assert all(line.count(" & ") == len(rows[0]) - 1 for line in body), name
        assert (directory / f"{name}.md").read_text().startswith("### ")
    for name in figures:
        assert (directory / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
        assert (directory / f"{name}.pdf").read_bytes()[:4] == b"%PDF"


@pytest.fixture(scope="module")
def slice_store(tmp_path_factory):
    """Both studies' kinds of points, one made to fail, in one experiment; and one that cannot run, recorded."""
    import os

    from suite.records.store import Store
    results = tmp_path_factory.mktemp("studies") / "results"
    saved = {k: os.environ.get(k) for k in ("SUITE_RESULTS_DIR", "MLFLOW_TRACKING_URI")}
    os.environ["SUITE_RESULTS_DIR"] = str(results)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    try:
        for args in (["strategy=single", "workers=1"], ["strategy=ddp", "workers=2"],
                     ["strategy=gpipe", "workers=2", "strategy.micro_batches=12", "strategy.micro_batch_size=2,3",
                      "strategy.balance=by_params", "strategy.checkpoint=never", "steps_per_epoch=1"],
                     ["strategy=pipedream", "workers=2", "fault.kind=error"]):
            result = run_suite("-m", *FAST, *args)
            assert result.returncode == (1 if "fault.kind=error" in args else 0), result.stderr[-3000:]
        for optimizer, strategies in (("lamb", "ddp"), ("adam", "ddp,zero")):  # Study N's DDP, its ZeRO and DDP+Adam
            result = run_suite("-m", *GPT2, f"optimizer.name={optimizer}", f"strategy={strategies}", "workers=2")
            assert result.returncode == 0, result.stderr[-3000:]
        repeated = run_suite("--repeats", "2", *FAST, "strategy=single", "workers=1")
        assert repeated.returncode == 0, repeated.stderr[-3000:]
        assert "[1/2 digits/resnet18/single/w1] skipped: finished run" in repeated.stdout  # repeat 0 ran above
        assert "[2/2 digits/resnet18/single/w1/r1] finished" in repeated.stdout
        store = Store()
        invalid = []
        plan([[*FAST, "strategy=megatron", "workers=2"]], invalid=invalid)
        assert [p.error for p in invalid] == ["strategy megatron splits GPT-2's attention and MLP; network resnet18 "
                                              "(resnet18) has no such layers"]
        record_invalid(invalid, store)
        record_invalid(invalid, store)  # once per point: a second sweep finds it recorded
        yield store, results
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.mark.slow  # runs a sweep's points
def test_study_j_report_has_every_artifact_and_keeps_failed_points(slice_store):
    store, results = slice_store
    report = write_report(store, "slice", sweep="study_j_mini", out_dir=results / "reports" / "j")
    check_artifacts(report.directory, J_FILES, J_FIGURES)
    matrix = table(report.directory, "status_matrix")
    rows = {tuple(r[:3]): dict(zip(matrix[0], r)) for r in matrix[1:]}
    assert rows["digits", "resnet18", "2"]["pipedream"] == "failed"
    assert rows["digits", "resnet18", "2"]["megatron"] == "invalid"
    assert rows["digits", "resnet18", "1"]["single"] == "ok"
    problems = {(r[2], r[4]): r[5] for r in table(report.directory, "status_problems")[1:]}
    assert problems["pipedream", "failed"] == "rank 0: RuntimeError: injected fault at step 1"
    assert "megatron" in {s for s, _ in problems}
    epoch = {r[2]: r for r in table(report.directory, "j_epoch_time")[1:] if r[0] == "digits"}
    assert epoch["pipedream"][-1].startswith("failed") and epoch["single"][-1] == "finished"
    assert epoch["single"][10] == "2" and "[" in epoch["single"][7] and epoch["single"][8].endswith("%")
    assert epoch["gpipe"][4:7] == ["24", "2", "12"]  # configuration A: the smaller micro-batch of 12
    assert epoch["ddp (extension)"][9] != "-"  # a speedup with its interval
    configs = table(report.directory, "j_table6_1_gpipe_configs")
    assert configs[0] == ["", "Config A", "Config B"] and configs[4][0] == "Equation 6.1"
    assert configs[4][1:] == [f"{(2 + 12 - 1) / 24:.2f}"] * 2
    assert "Study J protocol" in (report.directory / "j_epoch_time.md").read_text()


@pytest.mark.slow  # runs a sweep's points
def test_study_n_report_has_every_artifact_and_evaluates_claims(slice_store):
    store, results = slice_store
    report = write_report(store, "slice", sweep="study_n_mini", out_dir=results / "reports" / "n")
    check_artifacts(report.directory, N_FILES, N_FIGURES)
    claims = {r[0]: r for r in table(report.directory, "claims")[1:]}
    memory = claims["zero1_memory_vs_ddp"]
    assert memory[6] in ("holds", "does not hold") and memory[5].startswith("memory ratio")
    ratio = float(memory[5].split()[2])
    assert (memory[6] == "holds") == (0.42 <= ratio <= 0.66)
    assert claims["megatron_intra_comm_share"][6] == "not measured" and claims["megatron_intra_comm_share"][7]
    assert claims["zero2_memory_vs_ddp"][6] == "not measured"  # no ZeRO-2 point in the slice
    parts = {r[2]: r for r in table(report.directory, "claims_separated")[1:] if r[3] == "memory ratio"}
    assert parts["ZeRO-1 / DDP+Adam"][1] == "sharding" and parts["DDP+Adam / DDP"][1] == "optimizer"
    assert parts["ZeRO-1 / DDP+Adam"][4].startswith("memory ratio") and parts["DDP+Adam / DDP"][4] != "not measured"
    ddp = [r for r in table(report.directory, "n_epoch_time")[1:] if r[1] == "DDP" and r[0] == "gpt2_tiny"]
    assert ddp and "[" in ddp[0][3]  # one repeat: the interval over its epochs
    sections = [line for line in (report.directory / "report.md").read_text().splitlines() if line.startswith("## ")]
    assert len(sections) == 9  # the sweep file's views


@pytest.mark.slow  # runs a sweep's points
def test_sweep_invocation_is_a_parent_run_with_the_report(results, store):
    result = run_suite("--sweep", "digits")
    assert result.returncode == 0, result.stderr[-3000:]
    runs = store.runs("digits")
    (parent,) = [r for r in runs if r.data.tags.get("suite.sweep") == "digits"]
    children = [r for r in runs if r is not parent]
    assert len(children) == 2
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parent.info.run_id}
    assert parent.info.status == "FINISHED"
    report = {a.path for a in store.client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/report.md", "report/speedup.md", "report/speedup.png", "report/convergence.png"} <= report
    experiment = store.client.get_experiment_by_name("digits")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert (results / "reports" / "digits" / "speedup.png").stat().st_size > 0


def test_repeat_index_is_part_of_a_points_identity():
    (plain,) = plan([[*DIGITS], [*DIGITS, "repeat=0"]])  # repeat 0 is the point as it always was: one point
    (second,) = plan([[*DIGITS, "repeat=1"]])
    assert second.config_hash != plain.config_hash
    assert (plain.label, second.label) == ("digits/resnet18/single/w1", "digits/resnet18/single/w1/r1")
