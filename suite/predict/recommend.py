"""The recommender: every strategy, with its main knobs, that could train a cell (dataset x network x cluster x
workers), ranked by predicted epoch time; those that cannot run or do not fit listed apart with the reason.

Each strategy says which of its knob settings are candidates (`Strategy.candidates`). On W workers: `single`
(W = 1), `ddp`, `horovod`, `zero` stages 1-3, `fsdp` resharding or not and FSDP2 x TP with every tp > 1 dividing W,
`megatron` with every tp dividing W, and for every pipeline depth pp >= 2 dividing W: `gpipe` (pp = W, one
process), `gpipe_dist`, `1f1b` and interleaved `1f1b` (2 chunks per rank) with pp, 2 pp and 4 pp micro-batches
where they divide the batch, and `pipedream`; dp = W / pp replicas of each pipeline; `gpipe_dist` and `1f1b` also
with each stage split over tp ranks (3D: pp x tp dividing W, pp >= 2, dp = W / (pp x tp)).
"""

from __future__ import annotations

from dataclasses import dataclass

from suite.config import PointConfig
from suite.predict import correction
from suite.predict.predictor import FITTED, Prediction, predict
from suite.strategies import strategy_class, strategy_names
from suite.sweep.plan import InvalidPoint, Point, plan


def candidates(workers: int, batch: int) -> list[list[str]]:
    """Every priced strategy with each knob setting it offers for a cell of `workers` with the point's `batch_size`
    (each strategy's `candidates`)."""
    priced = [strategy_class(name) for name in strategy_names() if strategy_class(name).family is not None]
    return [[f"strategy={spec.name}", *knobs] for spec in priced for knobs in spec.candidates(workers, batch)]


@dataclass(frozen=True)
class Infeasible:
    label: str  # the candidate, as its overrides name it
    reason: str


@dataclass(frozen=True)
class Ranking:
    workers: int
    ranked: list[Prediction]  # feasible, fastest first
    infeasible: list[Infeasible]

    @property
    def pick(self) -> Prediction | None:
        return self.ranked[0] if self.ranked else None

    @property
    def margin(self) -> float | None:
        """How much slower the next strategy (another strategy, not another knob of the pick's) is predicted."""
        if not self.ranked:
            return None
        others = [p for p in self.ranked if p.point.strategy.name != self.ranked[0].point.strategy.name]
        return others[0].epoch_s / self.ranked[0].epoch_s - 1 if others else None


def strategy_overrides(overrides: tuple[str, ...]) -> str:
    """A candidate named by its strategy overrides: `strategy=zero strategy.zero_stage=3` is `zero zero_stage=3`."""
    named = [o for o in overrides if o.startswith("strategy")]
    return " ".join(o.removeprefix("strategy=").removeprefix("strategy.") for o in named)


def rank_cell(base: list[str], workers: int, variant: str = "suite", progress=None) -> Ranking:
    """Plan every candidate of the cell (`base` overrides, e.g. dataset, network, cluster, batch), predict those
    that can run and rank them; raises ConfigError for overrides that do not compose at all."""
    batch = next((int(o.split("=", 1)[1]) for o in base if o.startswith("batch_size=")), PointConfig.batch_size)
    jobs = [[*base, f"workers={workers}", *c] for c in candidates(workers, batch)]
    invalid: list[InvalidPoint] = []
    points: list[Point] = plan(jobs, experiment="recommend", invalid=invalid)
    if variant == FITTED:  # said before any candidate is profiled
        for cluster in sorted({p.cfg.cluster.name for p in points}):
            correction.required(cluster)
    infeasible = [Infeasible(strategy_overrides(i.overrides), i.error) for i in invalid]
    feasible = []
    for k, point in enumerate(points, 1):
        if progress:
            progress(k, len(points), point)
        prediction = predict(point, variant)
        if prediction.fits is False:
            infeasible.append(Infeasible(strategy_overrides(point.overrides), f"peak {prediction.peak_mb:.0f} MB per "
                                         f"rank > {prediction.capacity / 2**20:.0f} MB"))
        else:
            feasible.append(prediction)
    return Ranking(workers, sorted(feasible, key=lambda p: p.epoch_s), infeasible)
