"""A strategy is declared once, by its spec (family, label, base memory) and its config: a toy strategy added here
and in one yaml is planned, priced by its family's cost and memory model, recommended, and named in reports by its
label, with no table of strategy names to edit elsewhere."""

import json
from dataclasses import dataclass
from typing import ClassVar

import pytest
from test_predict import layer, synthetic

import suite.strategies as strategies
from conftest import DIGITS, run_suite
from suite import paths
from suite.layout import Layout
from suite.predict.memory import rank_memory
from suite.predict.recommend import candidates
from suite.predict.step import step_time
from suite.records.store import Store
from suite.shared_names import Family
from suite.strategies.ddp import DDP
from suite.sweep import plan as planning


@dataclass(frozen=True)
class Toy(DDP):
    """DDP under another name: a replicated strategy nobody else knows."""

    name: str = "toy"
    family: ClassVar[Family] = Family.replicated
    label: ClassVar[str] = "Toy"


@pytest.fixture
def conf_with_toy(tmp_path, monkeypatch):
    """The toy's yaml in a site config directory (`suite --config-dir`), the suite's conf/ untouched."""
    site = tmp_path / "site"
    (site / "strategy").mkdir(parents=True)
    (site / "strategy" / "toy.yaml").write_text(f"_target_: {__name__}.Toy\nname: toy\n")
    monkeypatch.setenv(paths.SITE_CONFIG_ENV, str(site))
    strategies.strategy_class.cache_clear()
    yield site
    strategies.strategy_class.cache_clear()


def test_a_strategy_declared_once_is_planned_priced_and_named(conf_with_toy):
    (point,) = planning.plan([["strategy=toy", "workers=2", "dataset=digits"]])
    assert isinstance(point.strategy, Toy) and point.layout.dp == 2

    layout, layers = Layout(dp=2, mini_batch=8), [layer(1e6, forward=0.01, backward=0.02) for _ in range(3)]
    toy, ddp = synthetic(Toy(), layout, layers), synthetic(DDP(), layout, layers)
    assert step_time(toy) == step_time(ddp)  # its family's cost
    assert rank_memory(toy, 0.0) == rank_memory(ddp, 0.0)  # and its family's memory

    assert strategies.strategy_class("toy") is Toy
    assert ["strategy=toy"] in candidates(workers=2, batch=8)  # recommended among the others
    assert strategies.label("toy") == "Toy" and strategies.label("ddp") == "DDP"
    assert strategies.label("no_such_strategy") == "no_such_strategy"  # a run of another suite's strategy


def test_every_configured_strategy_declares_how_it_is_priced():
    names = sorted(path.stem for path in (paths.CONF_DIR / "strategy").glob("*.yaml"))
    unpriced = [name for name in names if strategies.strategy_class(name).family is None]
    assert len(names) >= 10 and not unpriced, unpriced


def test_pricing_and_the_overhead_probes_read_what_strategies_declare_not_their_classes(conf_with_toy):
    """Architecture step 3: suite/predict/ imports no strategy but the base class's declarations, and `make
    calibrate` probes every strategy that declares probes (AxoNN was missing from a list of its own), the toy too."""
    from suite.tools.overhead_probes import probe_settings

    predict = paths.REPO_ROOT / "suite" / "predict"
    imports = [line for path in predict.glob("*.py") for line in path.read_text().splitlines()
               if "suite.strategies." in line and "import" in line]
    assert all("suite.strategies.base import" in line for line in imports), imports
    settings = probe_settings()
    assert settings["toy"] == ["strategy=toy"] and settings["axonn"] == ["strategy=axonn"]
    assert settings["zero3"] == ["strategy=zero", "strategy.zero_stage=3"]


# A strategy no file of the suite names: data parallelism that all-reduces each gradient once backward has ended.
ALLREDUCE_MODULE = '''
from dataclasses import dataclass
from typing import ClassVar

import torch.distributed as dist

from suite.runtime.numerics import build_optimizer
from suite.strategies.base import DataParallel, GradientSync, Strategy, Supports
from suite.shared_names import Family


@dataclass(frozen=True)
class AllReduce(Strategy):
    name: str = "allreduce"
    family: ClassVar[Family] = Family.replicated
    label: ClassVar[str] = "All-reduce after backward"
    supports: ClassVar[Supports] = Supports(counts_communication=True)

    def gradient_sync(self, dp):
        return GradientSync(after_backward=True)

    def setup(self, model, rank):
        model = model.to(rank.env.device)
        return AllReduceRuntime(rank, model, build_optimizer(model.parameters(), rank.cfg.optimizer),
                                sync_buffers=True)


class AllReduceRuntime(DataParallel):
    def backward(self, loss):
        super().backward(loss)
        for parameter in self.model.parameters():
            dist.all_reduce(parameter.grad)
            parameter.grad /= dist.get_world_size()
'''


@pytest.mark.slow
def test_a_strategy_in_a_module_and_a_yaml_of_its_own_is_run_recorded_reported_and_priced(tmp_path, monkeypatch,
                                                                                         results):
    """Adding a strategy is its module and its yaml (here a site config directory's, `suite --config-dir`): the driver
    plans and runs it, its ranks train, the store records it, the report tables it by its label and the model prices
    it from what it declares, with no other file touched."""
    site = tmp_path / "site"
    (site / "strategy").mkdir(parents=True)
    (site / "strategy" / "allreduce.yaml").write_text("_target_: allreduce_strategy.AllReduce\nname: allreduce\n")
    (tmp_path / "allreduce_strategy.py").write_text(ALLREDUCE_MODULE)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("SUITE_CONFIG_DIR", str(site))

    run = run_suite("-m", *DIGITS, "epochs=1", "steps_per_epoch=2", "eval_batches=1", "strategy=single,allreduce",
                    "workers=1,2")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "skipped digits/resnet18/single/w2" in run.stderr
    runs = {(r.data.params["strategy"], r.data.params["workers"]): r for r in Store().runs("adhoc")}
    assert sorted(runs) == [("allreduce", "1"), ("allreduce", "2"), ("single", "1")]
    trained = runs["allreduce", "2"]
    assert trained.data.tags["suite.status"] == "finished" and trained.data.metrics["epoch_time_s_mean"] > 0
    assert trained.data.params["strategy"] == "allreduce"
    report = (results / "reports" / "adhoc" / "report.md").read_text()
    assert "All-reduce after backward" in report or "allreduce" in report, report

    priced = run_suite("predict", "--json", "dataset=imagenet", "network=resnet50", "cluster=dgx_h100", "workers=8",
                       "strategy=allreduce,ddp")
    assert priced.returncode == 0, priced.stderr[-3000:]
    rows = {row["strategy"]: row for row in map(json.loads, priced.stdout.splitlines())}
    toy, ddp = rows["allreduce"], rows["ddp"]
    assert toy["fits"] and toy["peak_memory_gb_per_gpu"] > 0
    # its gradients all sent once backward has ended, none overlapped with backward as DDP's buckets are
    assert toy["split_s"]["exposed_comm"] > ddp["split_s"]["exposed_comm"] and toy["epoch_s"] > ddp["epoch_s"]
