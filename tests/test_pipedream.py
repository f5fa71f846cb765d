"""Asynchronous PipeDream checked against its defining rule, weight stashing, and against a replay.

Real gloo processes run a 3-stage pipeline over a stream of mini-batches: one rank per stage (lags
2, 1, 0), and PipeDream's 2-1-1 (the first stage on two replicas taking the mini-batches
round-robin and averaging their gradients; lags 1, 1, 0). Every mini-batch's backward must
differentiate through exactly the weights its forward used, while the live weights have moved on;
and the final weights must equal a single-process replay of PipeDream's update order that
recomputes each forward from saved weights (no stashing code shared). Every replication of up to
ten ranks runs its schedule to the end without a cycle of waits (a simulation of the ranks' orders).
"""

import copy
import itertools
import math

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from suite.layout import Layout
from suite.models.layers import Layer
from suite.pipeline.groups import PipelineGroups
from suite.pipeline.partition import StageModule, cut
from suite.pipeline.pipedream_engine import PipeDreamStage, lag
from suite.point_dir import PointDir
from suite.runtime.metrics import PhaseTimer
from suite.runtime.numerics import Precision
from suite.sweep.driver import run_sweep
from suite.sweep.plan import plan

# gloo ranks: spawned stages and a launched point; one xdist worker runs the module (its fixture runs once).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("pipedream")]

STAGES, MINIBATCHES, BATCH, WIDTH, CLASSES = 3, 8, 4, 6, 3
SIZES = [2, 2, 2]
LR, MOMENTUM = 0.2, 0.9
# Ranks per stage, and each stage's lag as PipeDream's paper counts it: a replica admits ceil(ranks of its and
# later stages / its stage's replicas) mini-batches before its first backward.
CONFIGS = {"1-1-1": ((1, 1, 1), (2, 1, 0)), "2-1-1": ((2, 1, 1), (1, 1, 0))}


def make_layers() -> list[Layer]:
    torch.manual_seed(0)
    modules = [nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, WIDTH),
               nn.Linear(WIDTH, CLASSES)]
    return [Layer(f"{i}.", m) for i, m in enumerate(modules)]


def data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(BATCH, WIDTH, generator=generator), torch.randint(0, CLASSES, (BATCH,), generator=generator))
            for _ in range(MINIBATCHES)]


def loss_fn(logits, targets):
    return F.cross_entropy(logits, targets)


def optimizer_for(module: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(module.parameters(), lr=LR, momentum=MOMENTUM)


def record_messages() -> list[tuple[str, int, str]]:
    """From now on in this process, every point-to-point message as (send or recv, peer, its process group's name),
    recorded on its way to torch.distributed."""
    messages = []

    def recorded(kind: str, call):
        def message(tensor, peer, group=None):
            messages.append((kind, peer, "default" if group is None else group.group_name))
            return call(tensor, peer, group)
        return message
    dist.isend, dist.recv = recorded("send", dist.isend), recorded("recv", dist.recv)
    return messages


def layout_of(replicas: tuple[int, ...]) -> Layout:
    """One rank per stage on the grid; else PipeDream's replicated stages."""
    if set(replicas) == {1}:
        return Layout(dp=1, pp=len(replicas), mini_batch=BATCH)
    rounds = math.lcm(*replicas)
    return Layout(dp=1, pp=len(replicas), mini_batch=rounds * BATCH, micro_batches=rounds, stage_replicas=replicas)


def run_rank(rank: int, replicas: tuple[int, ...], init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=sum(replicas))
    torch.set_num_threads(1)
    messages = record_messages()
    layout = layout_of(replicas)
    topology = PipelineGroups.build(layout, rank, set(), "cpu", channels=True)
    place = layout.position(rank)
    module = StageModule(cut(make_layers(), SIZES)[place.stage])
    stage = PipeDreamStage(module, place.stage, topology, optimizer_for(module),
                           lambda: topology.average_grads(list(module.parameters())), torch.device("cpu"),
                           record_versions=True)
    timer, precision = PhaseTimer(torch.device("cpu")), Precision("fp32", "cpu")
    mine = [x_y for k, x_y in enumerate(data()) if k % replicas[place.stage] == place.replica]
    losses = [stage.step(x, y, loss_fn, precision, timer) for x, y in mine]
    stage.drain(timer)
    torch.save({"place": place, "records": stage.records, "weights": module.named_state(),
                "versions": stage.weight_versions_max, "losses": [float(loss) for loss in losses if loss is not None],
                "messages": set(messages)}, f"{out_dir}/rank{rank}.pt")
    dist.destroy_process_group()


def rank_orders(replicas: tuple[int, ...], lags: tuple[int, ...], minibatches: int) -> dict[tuple[int, int], list]:
    """PipeDream's order of operations on each replica (stage, j) of each stage: over its own mini-batches
    j, j + r, ... (r replicas), `lag` forwards, then forward q / backward q - lag, each backward followed by the
    update its stage's replicas make together."""
    orders = {}
    for stage, (r, lag_) in enumerate(zip(replicas, lags)):
        for j in range(r):
            own = list(range(j, minibatches, r))
            ops = []
            for q, k in enumerate(own):
                ops.append(("F", k))
                if q >= lag_:
                    ops += [("B", own[q - lag_]), ("U", q - lag_)]
            ops += [op for q in range(max(len(own) - lag_, 0), len(own)) for op in (("B", own[q]), ("U", q))]
            orders[(stage, j)] = ops
    return orders


def replay(replicas: tuple[int, ...], lags: tuple[int, ...]) -> tuple[list[dict], list[dict[int, int]], list[float]]:
    """Single-process reference: run every replica's order, recomputing each backward's forward from the weights
    saved at that mini-batch's forward; a stage's update u steps its one set of weights with the mean of its
    replicas' u-th gradients. Returns final weights, the weight version each forward used, and the losses."""
    stages = [StageModule(group) for group in cut(make_layers(), SIZES)]
    optimizers = [optimizer_for(s) for s in stages]
    versions = [0] * STAGES
    used_version: list[dict[int, int]] = [{} for _ in range(STAGES)]
    saved: list[dict[int, tuple[dict, torch.Tensor]]] = [{} for _ in range(STAGES)]
    activations: dict[tuple[int, int], torch.Tensor] = {}  # (stage, k) -> input of that stage
    grads: dict[tuple[int, int], torch.Tensor] = {}  # (stage, k) -> gradient of that stage's output
    pending: list[dict[int, list]] = [{} for _ in range(STAGES)]  # stage -> update -> its replicas' gradients
    batches, losses = data(), {}
    orders = rank_orders(replicas, lags, MINIBATCHES)
    positions = dict.fromkeys(orders, 0)
    while any(positions[r] < len(o) for r, o in orders.items()):
        progressed = False
        for (s, j), order in orders.items():
            if positions[(s, j)] == len(order):
                continue
            op, k = order[positions[(s, j)]]
            inputs = batches[k][0] if s == 0 else activations.get((s, k))
            if op == "F" and inputs is not None:
                saved[s][k] = (copy.deepcopy(stages[s].state_dict()), inputs)
                used_version[s][k] = versions[s]
                with torch.no_grad():
                    out = stages[s](inputs)
                if s < STAGES - 1:
                    activations[(s + 1, k)] = out
            elif op == "B" and (s == STAGES - 1 or (s, k) in grads):
                weights, inputs = saved[s].pop(k)
                snapshot = copy.deepcopy(stages[s])
                snapshot.load_state_dict(weights)
                inputs = inputs.clone().requires_grad_(s > 0)
                out = snapshot(inputs)
                if s == STAGES - 1:
                    loss = loss_fn(out, batches[k][1])
                    losses[k] = loss.item()
                    loss.backward()
                else:
                    out.backward(grads.pop((s, k)))
                if s > 0:
                    grads[(s - 1, k)] = inputs.grad
                pending[s].setdefault(k // replicas[s], []).append([p.grad for p in snapshot.parameters()])
            elif op == "U" and len(pending[s].get(k, ())) == replicas[s]:
                if versions[s] == k:  # the first replica here makes the stage's update; the others find it made
                    for live, *copies in zip(stages[s].parameters(), *pending[s][k]):
                        live.grad = torch.stack(copies).mean(0)
                    optimizers[s].step()
                    optimizers[s].zero_grad()
                    versions[s] += 1
            else:
                continue
            positions[(s, j)] += 1
            progressed = True
        assert progressed, "the replay order deadlocked"
    return [s.named_state() for s in stages], used_version, [losses[k] for k in range(MINIBATCHES)]


@pytest.fixture(scope="module", params=CONFIGS)
def pipedream_run(request, tmp_path_factory):
    replicas, lags = CONFIGS[request.param]
    out = tmp_path_factory.mktemp("pipedream")
    mp.spawn(run_rank, args=(replicas, str(out / "init"), str(out)), nprocs=sum(replicas), join=True)
    return replicas, lags, [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(sum(replicas))]


def test_pipedream_backward_uses_the_weights_of_its_forward(pipedream_run):
    replicas, lags, ranks = pipedream_run
    _, used_version, _ = replay(replicas, lags)
    for result in ranks:
        stage, r = result["place"].stage, replicas[result["place"].stage]
        records = result["records"]
        assert sorted(rec.minibatch for rec in records) == list(range(result["place"].replica, MINIBATCHES, r))
        for record in records:
            assert record.backward_checksum == record.forward_checksum, (stage, record)
            assert record.forward_version == used_version[stage][record.minibatch], (stage, record)
        stale = [rec for rec in records if rec.live_version_at_backward > rec.forward_version]
        # After the warm-up every backward on a stage with a lag runs against weights that have moved on.
        assert len(stale) == (MINIBATCHES // r - 1 if lags[stage] else 0), (stage, records)
        assert result["versions"] == lags[stage]  # the versions a replica keeps in flight


def test_activations_and_gradients_travel_on_process_groups_of_their_own(pipedream_run):
    """Each direction between neighbouring ranks has its own group: on NCCL, one communicator per pair would queue
    stage 0's next activation send ahead of its gradient receive while stage 1's gradient send waits for it. A
    replicated stage's replicas each talk to the next stage's rank."""
    replicas, _, ranks = pipedream_run
    channels: dict[tuple[int, int], set[str]] = {}  # (sender, receiver) -> the groups either end used
    for rank, run in enumerate(ranks):
        for kind, peer, group in run["messages"]:
            channels.setdefault((rank, peer) if kind == "send" else (peer, rank), set()).add(group)
    pairs = {(1, 1, 1): {(0, 1), (1, 2)}, (2, 1, 1): {(0, 2), (1, 2), (2, 3)}}[replicas]
    assert set(channels) == pairs | {(b, a) for a, b in pairs}
    assert all(len(groups) == 1 for groups in channels.values()), channels
    groups = {group for groups in channels.values() for group in groups}
    assert len(groups) == 2 * len(pairs) and "default" not in groups


def test_pipedream_weights_match_replay(pipedream_run):
    replicas, lags, ranks = pipedream_run
    weights, _, losses = replay(replicas, lags)
    ran = {}
    for result in ranks:
        if result["losses"]:
            ran.update(zip(range(result["place"].replica, MINIBATCHES, replicas[-1]), result["losses"]))
    torch.testing.assert_close(torch.tensor([ran[k] for k in range(MINIBATCHES)]), torch.tensor(losses),
                               rtol=1e-5, atol=1e-6)
    for result in ranks:  # every replica of a stage ends with the same weights
        stage = result["place"].stage
        assert result["weights"].keys() == weights[stage].keys()
        for name, value in weights[stage].items():
            torch.testing.assert_close(result["weights"][name], value, rtol=1e-5, atol=1e-6, msg=name)
    initial = [StageModule(g).named_state() for g in cut(make_layers(), SIZES)]
    assert any(not torch.equal(initial[0][n], weights[0][n]) for n in weights[0])  # training moved the weights


def test_the_replicated_replay_averages_replicas():
    """The replay's 2-1-1 is not its 1-1-1: the first stage updates half as often, on two mini-batches."""
    one, _, _ = replay(*CONFIGS["1-1-1"])
    two, _, _ = replay(*CONFIGS["2-1-1"])
    assert any(not torch.equal(one[0][n], two[0][n]) for n in one[0])


def compositions(ranks: int):
    """Every way to put `ranks` ranks on consecutive stages, one or more each."""
    for cuts in itertools.product((False, True), repeat=ranks - 1):
        sizes, size = [], 1
        for cut_here in cuts:
            if cut_here:
                sizes.append(size)
                size = 0
            size += 1
        yield (*sizes, size)


def runs_to_the_end(replicas: tuple[int, ...], lags: list[int] | None = None) -> bool:
    """Simulate every replica's order under the runtime's waits: a forward waits for the previous stage's forward
    of its mini-batch, a backward for the next stage's backward (sends never wait), and an update for every
    replica of its stage to reach it (the all-reduce). False on a cycle of waits. `lags`: the runtime's unless
    given."""
    layout = layout_of(replicas)
    lags = lags or [lag(layout, s) for s in range(layout.pp)]
    minibatches = math.lcm(*replicas) * (len(replicas) + max(lags) + 2)
    orders = rank_orders(replicas, lags, minibatches)
    positions = dict.fromkeys(orders, 0)
    forwards, backwards, arrived = set(), set(), {}
    last = len(replicas) - 1
    while any(positions[r] < len(o) for r, o in orders.items()):
        progressed = False
        for (s, j), order in orders.items():
            while positions[(s, j)] < len(order):
                op, k = order[positions[(s, j)]]
                if op == "F" and (s == 0 or (s - 1, k) in forwards):
                    forwards.add((s, k))
                elif op == "B" and (s == last or (s + 1, k) in backwards):
                    backwards.add((s, k))
                elif op == "U":
                    arrived.setdefault((s, k), set()).add(j)
                    if len(arrived[(s, k)]) < replicas[s]:
                        break
                else:
                    break
                positions[(s, j)] += 1
                progressed = True
        if not progressed:
            return False
    return True


def test_every_replication_of_up_to_ten_ranks_runs_without_a_cycle_of_waits():
    configs = [c for ranks in range(1, 11) for c in compositions(ranks)]
    assert len(configs) == 2 ** 10 - 1
    assert [c for c in configs if not runs_to_the_end(c)] == []
    # The check can fail: with one mini-batch in flight too few on 2-1-1's first stage (one rank per stage's lag,
    # 2, 1, 0, does not hold either), a replica waits in its all-reduce while the second stage waits for its forward.
    assert not runs_to_the_end((2, 1, 1), [0, 1, 0])


GPT2 = ["dataset=tokens", "network=gpt2_tiny", "dataset.seq_len=16", "dataset.vocab_size=256", "dataset.samples=64",
        "dataset.val_samples=16", "epochs=1", "warmup_steps=2", "log_every=1", "strategy=pipedream", "workers=4",
        "timeout_s=300"]


def test_pipedream_replicated_gpt2_pipelines_run(store):
    """DP x PP (2 replicas of 2 stages) and PipeDream's 2-1-1 on GPT-2, whose embedding and LM head sit on
    different stages: the first stage's two replicas keep one stashed version each, as the single ranks after them
    do; 2-1-1's step is a round of two mini-batches."""
    points = plan([[*GPT2, "batch_size=8", "strategy.pp=2"], [*GPT2, "batch_size=4", "strategy.replicas=[2,1,1]"]])
    assert [p.processes for p in points] == [4, 4] and [p.global_batch_size for p in points] == [16, 8]
    outcomes = run_sweep(points, store)
    assert [o.status for o in outcomes] == ["finished"] * 2, [o.error for o in outcomes]
    grid, replicated = (store.client.get_run(o.run_id).data for o in outcomes)
    assert grid.metrics["weight_versions_max"] == 1 and grid.params["pipeline_replicas"] == "2"
    assert replicated.params["stage_replicas"] == "2-1-1" and replicated.params["micro_batches"] == "2"
    assert [replicated.metrics[f"weight_versions_max_stage{s}"] for s in range(3)] == [1, 1, 0]
    assert replicated.metrics["samples_per_epoch"] == 8 * replicated.metrics["steps_per_epoch"]
    assert replicated.metrics["val_loss"] > 0


SAME_AS_THE_GRID = {"1-1-1-1 is pp=4": ("strategy.replicas=[1,1,1,1]", "strategy.pp=4", "batch_size=4"),
                    "2-2 is two pipelines of 2": ("strategy.replicas=[2,2]", "strategy.pp=2", "batch_size=4")}


@pytest.mark.parametrize("case", SAME_AS_THE_GRID)
def test_stages_alike_replicated_train_as_the_grid_does(store, case):
    """Replicated stages with every stage alike are the grid's pipelines: mini-batch k on every stage's replica
    k mod r is pipeline k mod r's, each stage averaging the same gradients. Same losses and weights (the samples
    of a step are the same; which replica runs which differs)."""
    replicated, grid, batch = SAME_AS_THE_GRID[case]
    common = [*GPT2, batch, "strategy.balance=by_params", "save_final_weights=true", "steps_per_epoch=4",
              "tracking.experiment=alike"]
    points = plan([[*common, replicated], [*common, grid]])
    assert points[0].global_batch_size == points[1].global_batch_size
    outcomes = run_sweep(points, store)
    assert [o.status for o in outcomes] == ["finished"] * 2, [o.error for o in outcomes]
    dirs = [PointDir(store.client.get_run(o.run_id).data.tags["suite.point_dir"]) for o in outcomes]
    losses = [torch.tensor(d.summary()["step_losses"]) for d in dirs]
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=0)
    assert losses[0][0] != losses[0][-1]
    weights = [torch.load(d.weights_file) for d in dirs]
    assert weights[0].keys() == weights[1].keys()
    for name, value in weights[1].items():
        torch.testing.assert_close(weights[0][name], value, rtol=1e-5, atol=1e-6, msg=name)


class ScalarReads(TorchDispatchMode):
    """Counts tensor-to-host scalar reads (`.item()`, `float(t)`): each is a device sync on a GPU."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func is torch.ops.aten._local_scalar_dense.default
        return func(*args, **(kwargs or {}))


def single_stage_reads(record_versions: bool) -> int:
    """Scalar reads during steps of a one-stage PipeDream (no peers: no process group needed)."""
    module = StageModule(make_layers())
    topology = PipelineGroups(Layout(dp=1, mini_batch=1), rank=0, mesh=None, pipe_group=None, dp_group=None)
    stage = PipeDreamStage(module, 0, topology, optimizer_for(module), lambda: None, torch.device("cpu"),
                           record_versions=record_versions)
    timer, precision = PhaseTimer(torch.device("cpu")), Precision("fp32", "cpu")
    with ScalarReads() as reads:
        for x, y in data():
            stage.step(x, y, loss_fn, precision, timer)
    return reads.count


def test_pipedream_step_reads_no_weights_to_the_host():
    """The weight checksums are for the stashing test only: a normal step syncs no parameter to the host."""
    assert single_stage_reads(record_versions=False) == 0
    parameters = len(list(StageModule(make_layers()).parameters()))
    assert single_stage_reads(record_versions=True) >= 2 * parameters * MINIBATCHES  # what the count sees
