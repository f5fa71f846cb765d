"""A strategy is declared once, by its spec (family, label, base memory) and its config: a toy strategy added here
and in one yaml is planned, priced by its family's cost and memory model, recommended, and named in reports by its
label, with no table of strategy names to edit elsewhere."""

import shutil
from dataclasses import dataclass
from typing import ClassVar

import pytest
from test_predict import layer, synthetic

import suite.strategies as strategies
from suite import paths
from suite.layout import Layout
from suite.predict.memory import rank_memory
from suite.predict.recommend import candidates
from suite.predict.step import step_time
from suite.strategies.ddp import DDP
from suite.sweep import compose
from suite.sweep import plan as planning
from suite.vocabulary import Family


@dataclass(frozen=True)
class Toy(DDP):
    """DDP under another name: a replicated strategy nobody else knows."""

    name: str = "toy"
    family: ClassVar[Family] = Family.replicated
    label: ClassVar[str] = "Toy"


@pytest.fixture
def conf_with_toy(tmp_path, monkeypatch):
    conf = tmp_path / "conf"
    shutil.copytree(paths.CONF_DIR, conf)
    (conf / "strategy" / "toy.yaml").write_text(f"_target_: {__name__}.Toy\nname: toy\n")
    for module in (paths, compose, strategies):
        monkeypatch.setattr(module, "CONF_DIR", conf)
    strategies.strategy_class.cache_clear()
    yield conf
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
