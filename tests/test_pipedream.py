"""Asynchronous PipeDream checked against its defining rule, weight stashing, and against a replay.

Three real gloo processes run a 3-stage pipeline (lags 2, 1, 0) over a stream of mini-batches.
Every mini-batch's backward must differentiate through exactly the weights its forward used, while
the live weights have moved on; and the final weights must equal a single-process replay of
PipeDream's update order that recomputes each forward from saved weights (no stashing code shared).
"""

import copy

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from suite.layout import Layout
from suite.models.layers import Layer
from suite.pipeline.partition import StageModule, cut
from suite.pipeline.pipedream import PipeDreamStage
from suite.pipeline.topology import Topology
from suite.runtime.precision import Precision
from suite.runtime.timing import PhaseTimer
from suite.sweep.driver import run_sweep
from suite.sweep.plan import plan

# gloo ranks: spawned stages and a launched point; one xdist worker runs the module (its fixture runs once).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("pipedream")]

STAGES, MINIBATCHES, BATCH, WIDTH, CLASSES = 3, 8, 4, 6, 3
SIZES = [2, 2, 2]
LR, MOMENTUM = 0.2, 0.9


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


def run_rank(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=STAGES)
    torch.set_num_threads(1)
    messages = record_messages()
    topology = Topology.build(Layout(dp=1, pp=STAGES, mini_batch=BATCH), rank, set(), "cpu", channels=True)
    module = StageModule(cut(make_layers(), SIZES)[rank])
    stage = PipeDreamStage(module, rank, topology, optimizer_for(module), lambda: None, torch.device("cpu"),
                           record_versions=True)
    timer, precision = PhaseTimer(torch.device("cpu")), Precision("fp32", "cpu")
    losses = [stage.step(x, y, loss_fn, precision, timer) for x, y in data()]
    stage.drain(timer)
    torch.save({"records": stage.records, "weights": module.named_state(), "versions": stage.weight_versions_max,
                "losses": [float(loss) for loss in losses if loss is not None], "messages": set(messages)},
               f"{out_dir}/rank{rank}.pt")
    dist.destroy_process_group()


def stage_orders() -> list[list[tuple[str, int]]]:
    """PipeDream's order of operations on each stage: `lag` forwards, then forward k / backward k - lag."""
    orders = []
    for stage in range(STAGES):
        lag = STAGES - 1 - stage
        ops = []
        for k in range(MINIBATCHES):
            ops.append(("F", k))
            if k >= lag:
                ops.append(("B", k - lag))
        ops += [("B", k) for k in range(MINIBATCHES - lag, MINIBATCHES)]
        orders.append(ops)
    return orders


def replay() -> tuple[list[dict], list[dict[int, int]], list[float]]:
    """Single-process reference: run every stage's order, recomputing each backward's forward from the
    weights saved at that mini-batch's forward. Returns final weights, the weight version each forward
    used, and the losses."""
    stages = [StageModule(group) for group in cut(make_layers(), SIZES)]
    optimizers = [optimizer_for(s) for s in stages]
    versions = [0] * STAGES
    used_version: list[dict[int, int]] = [{} for _ in range(STAGES)]
    saved: list[dict[int, tuple[dict, torch.Tensor]]] = [{} for _ in range(STAGES)]
    activations: dict[tuple[int, int], torch.Tensor] = {}  # (stage, k) -> input of that stage
    grads: dict[tuple[int, int], torch.Tensor] = {}  # (stage, k) -> gradient of that stage's output
    batches, losses = data(), {}
    orders, positions = stage_orders(), [0] * STAGES
    while any(p < len(o) for p, o in zip(positions, orders)):
        progressed = False
        for s in range(STAGES):
            if positions[s] == len(orders[s]):
                continue
            op, k = orders[s][positions[s]]
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
                for live, stale in zip(stages[s].parameters(), snapshot.parameters()):
                    live.grad = stale.grad
                optimizers[s].step()
                optimizers[s].zero_grad()
                versions[s] += 1
            else:
                continue
            positions[s] += 1
            progressed = True
        assert progressed, "the replay order deadlocked"
    return [s.named_state() for s in stages], used_version, [losses[k] for k in range(MINIBATCHES)]


@pytest.fixture(scope="module")
def pipedream_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("pipedream")
    mp.spawn(run_rank, args=(str(out / "init"), str(out)), nprocs=STAGES, join=True)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(STAGES)]


def test_pipedream_backward_uses_the_weights_of_its_forward(pipedream_run):
    _, used_version, _ = replay()
    for stage, result in enumerate(pipedream_run):
        lag = STAGES - 1 - stage
        records = result["records"]
        assert sorted(r.minibatch for r in records) == list(range(MINIBATCHES))
        for record in records:
            assert record.backward_checksum == record.forward_checksum, (stage, record)
            assert record.forward_version == used_version[stage][record.minibatch], (stage, record)
        stale = [r for r in records if r.live_version_at_backward > r.forward_version]
        # After the warm-up every backward on a stage with a lag runs against weights that have moved on.
        assert len(stale) == (MINIBATCHES - 1 if lag else 0), (stage, records)
        assert result["versions"] == lag  # versions in flight = stages after it


def test_activations_and_gradients_travel_on_process_groups_of_their_own(pipedream_run):
    """Each direction between neighbouring stages has its own group: on NCCL, one communicator per stage pair would
    queue stage 0's next activation send ahead of its gradient receive while stage 1's gradient send waits for it."""
    channels: dict[tuple[int, int], set[str]] = {}  # (sender, receiver) -> the groups either end used
    for rank, run in enumerate(pipedream_run):
        for kind, peer, group in run["messages"]:
            channels.setdefault((rank, peer) if kind == "send" else (peer, rank), set()).add(group)
    assert set(channels) == {(0, 1), (1, 0), (1, 2), (2, 1)}
    assert all(len(groups) == 1 for groups in channels.values()), channels
    groups = {group for groups in channels.values() for group in groups}
    assert len(groups) == 4 and "default" not in groups


def test_pipedream_weights_match_replay(pipedream_run):
    weights, _, losses = replay()
    torch.testing.assert_close(torch.tensor(pipedream_run[-1]["losses"]), torch.tensor(losses), rtol=1e-5, atol=1e-6)
    for stage, result in enumerate(pipedream_run):
        assert result["weights"].keys() == weights[stage].keys()
        for name, value in weights[stage].items():
            torch.testing.assert_close(result["weights"][name], value, rtol=1e-5, atol=1e-6, msg=name)
    initial = [StageModule(g).named_state() for g in cut(make_layers(), SIZES)]
    assert any(not torch.equal(initial[0][n], weights[0][n]) for n in weights[0])  # training moved the weights


def test_pipedream_replicated_gpt2_pipeline_runs(store):
    """DP x PP (2 replicas of 2 stages) on GPT-2, whose embedding and LM head sit on different stages."""
    (point,) = plan([["dataset=tokens", "network=gpt2_tiny", "dataset.seq_len=16", "dataset.vocab_size=256",
                      "dataset.samples=64", "dataset.val_samples=8", "batch_size=8", "epochs=1", "warmup_steps=2",
                      "log_every=1", "strategy=pipedream", "workers=4", "strategy.pp=2", "timeout_s=300"]])
    (outcome,) = run_sweep([point], store)
    assert outcome.status == "finished", outcome.error
    (run,) = store.runs("adhoc")
    assert run.data.metrics["weight_versions_max"] == 1
    assert run.data.params["pipeline_replicas"] == "2"


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
    topology = Topology(Layout(dp=1, mini_batch=1), rank=0, mesh=None, pipe_group=None, dp_group=None)
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
