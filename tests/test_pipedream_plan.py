"""PipeDream's planner: its dynamic program against every configuration tried by brute force, and the choices its
cost rule implies (weights that are dear to all-reduce stay on one rank; compute without weights is replicated)."""

import itertools

import pytest

from conftest import run_make
from suite.errors import ConfigError
from suite.predict.links import LinkModel
from suite.predict.pipedream_plan import Costs, Planner, point_planner, pricing_point, resolve_auto
from suite.sweep import plan as sweep_plan

FAST = LinkModel.from_hardware(5.0, 10.0, "test")
SLOW = LinkModel.from_hardware(50.0, 0.01, "test: 10 MB/s")


def costs(compute, params, links=FAST, saved=None, output=None, per_node=8, capacity=None) -> Costs:
    n = len(compute)
    return Costs(tuple(compute), tuple(params), (0,) * n, tuple(saved or [1000] * n), tuple(output or [4000] * n),
                 lambda ranks, nodes: links, per_node, capacity)


def brute_force(planner: Planner, stages: int) -> float:
    """The least time per mini-batch of any `stages`-stage configuration: every cut, every replication."""
    L, W, best = planner.layers, planner.workers, float("inf")
    for cuts in itertools.combinations(range(1, L), stages - 1):
        bounds = [0, *cuts, L]
        for replicas in itertools.product(range(1, W + 1), repeat=stages):
            if sum(replicas) != W:
                continue
            time, rank = 0.0, 0
            for (first, end), r in zip(zip(bounds, bounds[1:]), replicas):
                stage = planner.stage(first, end, r, rank)
                if stage is None:
                    break
                time, rank = max(time, stage.time_s, stage.send_s), rank + r
            else:
                best = min(best, time)
    return best


@pytest.mark.parametrize("links", [FAST, SLOW])
def test_the_dynamic_program_finds_the_best_configuration_of_every_stage_count(links):
    planner = Planner(costs([0.3, 0.1, 0.5, 0.2, 0.4], [10**6, 0, 4 * 10**6, 2 * 10**5, 8 * 10**6], links), 4)
    plans = planner.plans()
    assert [p.time_s for p in plans] == sorted(p.time_s for p in plans)
    for plan in plans:
        assert sum(plan.replicas) == 4 and sum(plan.balance) == 5
        assert plan.time_s == pytest.approx(brute_force(planner, len(plan.stages)))
    assert {len(p.stages) for p in plans} == {1, 2, 3, 4}
    chosen = plans[0]
    assert chosen.knobs() == (f"strategy.replicas=[{','.join(map(str, chosen.replicas))}] "
                              f"strategy.balance=[{','.join(map(str, chosen.balance))}]")


def test_weights_dear_to_all_reduce_stay_on_one_rank_and_the_rest_is_replicated():
    # VGG's shape: convolutions (much compute, few weights), then fully connected layers (the reverse).
    planner = Planner(costs([1.0, 1.0, 0.2, 0.05], [10**3, 10**3, 10**3, 10**8], SLOW), 4)
    chosen = planner.plans()[0]
    assert chosen.name == "3-1" and chosen.stages[0].end <= 2  # the fully connected layer is not replicated


def test_without_weights_to_all_reduce_pure_data_parallelism_wins():
    planner = Planner(costs([0.4, 0.1, 0.3, 0.2], [0, 0, 0, 0]), 4)
    chosen = planner.plans()[0]
    assert chosen.name == "4" and chosen.time_s == pytest.approx(1.0 / 4)


def test_stages_that_cannot_hold_their_stashes_are_not_planned():
    # Stage 0 of 1-1 stashes ceil(1 / 1) copy of its weights and activations besides them; one stage stashes none.
    roomy = Planner(costs([1.0, 1.0], [600, 600], capacity=10**6), 2).plans()
    tight = Planner(costs([1.0, 1.0], [600, 600], saved=[2 * 10**6, 10**6], capacity=1.5 * 10**6), 2).plans()
    assert {p.name for p in roomy} == {"2", "1-1"} and {p.name for p in tight} == {"2"}
    with pytest.raises(ConfigError, match="holds its stashed weights"):
        Planner(costs([1.0, 1.0], [10**6, 10**6], capacity=1.5 * 10**6), 2).plans()


@pytest.mark.slow  # runs make; prices VGG-16 from Lassen's datasheet
def test_make_plan_pipedream_prints_the_chosen_configuration_and_every_stage_counts_best():
    made = run_make("plan-pipedream", "ARGS=dataset=imagenet network=vgg16 cluster=lassen workers=16 batch_size=64")
    assert made.returncode == 0, made.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in made.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    header, *body = [[cell.strip() for cell in row] for row in rows]
    assert header[:4] == ["configuration", "plan", "stages", "layers per stage"]
    chosen = body[0]
    # As docs/performance-model.md says: the fully connected layers (the last 12) alone on one GPU, the convolutions
    # replicated before them; PipeDream's own choice for VGG-16 on 16 GPUs, 15-1, within 1% of the chosen
    assert chosen[1] == "chosen" and chosen[0].endswith("-1") and chosen[3].endswith("-12"), chosen
    pipedreams = next(row for row in body if row[0] == "15-1")
    assert float(pipedreams[4]) <= 1.01 * float(chosen[4])
    planned = body[:16]
    assert sorted(int(row[2]) for row in planned) == list(range(1, 17))  # the best of every stage count
    assert all(sum(map(int, row[0].split("-"))) == 16 for row in body)
    times = [float(row[4]) for row in planned]
    assert times == sorted(times)
    assert len(body) == 16 and chosen[8].startswith(f"strategy.replicas=[{chosen[0].replace('-', ',')}] "
                                                    "strategy.balance=[")
    bad = run_make("plan-pipedream", "ARGS=dataset=imagenet network=vgg16 cluster=lassen workers=64")
    assert bad.returncode == 2 and "error: the PipeDream planner searches up to 32 workers, not 64" in bad.stderr


LASSEN_VGG = ["dataset=imagenet", "network=vgg16", "cluster=lassen", "cluster.job.account=x", "workers=4",
              "batch_size=64", "strategy=pipedream"]


def test_pp_auto_runs_the_planners_choice_under_the_identity_of_auto(results):
    (auto,) = sweep_plan.plan([[*LASSEN_VGG, "strategy.pp=auto"]], runs_here=False, plan_auto=resolve_auto)
    planner, _ = point_planner(pricing_point(auto.cfg))
    chosen = planner.plans()[0]
    assert list(auto.cfg.strategy.replicas) == chosen.replicas and list(auto.cfg.strategy.balance) == chosen.balance
    assert auto.layout.replication == chosen.name == "2-2" and auto.processes == 4
    other = auto.cfg.copy()
    other.strategy.replicas, other.strategy.balance = [3, 1], [30, 9]
    assert sweep_plan.config_hash(other) == auto.config_hash  # what the planner chose is recorded, not who the point is
    (explicit,) = sweep_plan.plan([[*LASSEN_VGG, "strategy.replicas=[2,2]",
                         f"strategy.balance=[{','.join(map(str, chosen.balance))}]"]], runs_here=False)
    assert explicit.layout == auto.layout and explicit.config_hash != auto.config_hash


def test_pp_auto_without_a_link_model_is_one_line_before_launch(results):
    with pytest.raises(ConfigError) as info:
        sweep_plan.plan([["dataset=digits", "strategy=pipedream", "strategy.pp=auto", "workers=2"]],
                        plan_auto=resolve_auto)
    assert "cluster local has no link costs" in str(info.value) and "\n" not in str(info.value)
    assert not (results / "points").exists()
    with pytest.raises(ConfigError, match="pp=auto is chosen by PipeDream's planner, which this command does not"):
        sweep_plan.plan([["dataset=digits", "strategy=pipedream", "strategy.pp=auto", "workers=2"]])
