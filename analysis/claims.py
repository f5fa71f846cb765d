"""Published claims checked against a sweep's runs: the report's "claims" section.

A claims file (analysis/published/<name>.yaml, named by a sweep's `report.claims`) lists every number and
checkable claim of a study, each with its source, the published value and the relation that counts as
"holds". Each `check` kind below turns the runs into a measured value and a verdict: holds, does not hold, or
not measured by this sweep (with what would measure it). Points are selected by `where`: dataset, network
(a glob: `gpt2*` is any GPT-2), framework (a strategy, or Study N's name such as ZeRO-1 or Megatron-intra),
workers (a number, or `max`: the largest that ran), Study J's GPipe configuration.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

import yaml

from analysis.measure import epoch_time, finished, speedup
from analysis.runs import Row
from analysis.stats import ratio
from analysis.study_j import eq_6_1, gpipe_config, single_node_workers
from analysis.study_n import frameworks, memory_ratio, memory_reduction, series
from analysis.tables import Table
from analysis.views import Context, Section, table_section, view

PUBLISHED_DIR = Path(__file__).parent / "published"
HOLDS, FAILS, NOT_MEASURED = "holds", "does not hold", "not measured"


@dataclass(frozen=True)
class Verdict:
    measured: str
    verdict: str
    note: str = ""


def _claims_file(name: str) -> tuple[Path, dict]:
    path = PUBLISHED_DIR / f"{name}.yaml"
    return path, yaml.safe_load(path.read_text())


def load_controls(name: str) -> dict[str, str]:
    """The file's `controls`: points the study did not run that part a claim's ratio (see `separated`), each
    with what it is."""
    return _claims_file(name)[1].get("controls", {})


def load_claims(name: str) -> list[dict]:
    path, content = _claims_file(name)
    claims = content["claims"]
    for claim in claims:
        missing = {"id", "source", "claim", "check"} - claim.keys()
        if missing:
            raise ValueError(f"{path}: claim {claim.get('id', '?')} lacks {', '.join(sorted(missing))}")
        if claim["check"] not in CHECKS:
            raise ValueError(f"{path}: claim {claim['id']}: check {claim['check']} is not one of {', '.join(CHECKS)}")
        if "control" in claim and (claim["check"] not in RATIOS or claim["control"] not in content.get("controls", {})
                                   or len(claim.get("effects", ())) != 2):
            raise ValueError(f"{path}: claim {claim['id']}: a control needs a ratio check ({', '.join(RATIOS)}), "
                             f"an entry in `controls` and two `effects`")
    return claims


def _is(row: Row, ctx: Context, name: str) -> bool:
    return row.strategy == name or name in [f.removesuffix(" (ext)") for f in frameworks(row, ctx)]


def select(ctx: Context, where: dict) -> list[Row]:
    """The repeats of the one point `where` names."""
    rows = [r for r in ctx.rows
            if fnmatch(r.dataset, where.get("dataset", "*")) and fnmatch(r.network, where.get("network", "*"))
            and ("framework" not in where or _is(r, ctx, where["framework"]))
            and ("config" not in where or gpipe_config(r, ctx.rows) == where["config"])]
    workers = where.get("workers")
    if workers == "single_node":
        workers = single_node_workers(ctx.rows)
    if workers == "max":
        workers = max((r.workers for r in rows if finished([r])), default=None)
    return [r for r in rows if workers is None or r.workers == workers]


def _time(ctx: Context, rows: list[Row]) -> float | None:
    e = epoch_time(rows, ctx.histories, ctx.protocol) if rows else None
    return e.value if e else None


def _within(value: float, claim: dict) -> bool:
    if "tolerance" in claim:
        return abs(value - claim["published"]) <= claim["tolerance"] * claim["published"]
    low, high = claim.get("min", float("-inf")), claim.get("max", float("inf"))
    return low <= value <= high


def check_speedup(ctx: Context, claim: dict) -> Verdict | None:
    """The point's throughput over `single`'s on one worker (same dataset and network): Study J's speedup."""
    point = select(ctx, claim["where"])
    if not point:
        return None
    base = [r for r in ctx.rows if r.strategy == "single" and r.workers == 1 and r.workload == point[0].workload]
    s = speedup(point, base, ctx.histories, ctx.protocol) if base else None
    if s is None:
        return None
    return Verdict(f"{s.value:.3g} ({point[0].network}, {point[0].workers} workers)",
                   HOLDS if _within(s.value, claim) else FAILS)


def check_epoch_time(ctx: Context, claim: dict) -> Verdict | None:
    t = _time(ctx, select(ctx, claim["where"]))
    if t is None:
        return None
    return Verdict(f"{t:.4g} s", HOLDS if _within(t, claim) else FAILS)


def _networks(ctx: Context, where: dict) -> list[str]:
    return sorted({r.network for r in select(ctx, where)})


def check_decreasing(ctx: Context, claim: dict) -> Verdict | None:
    """Per network, the epoch times of the listed points (`order`: `where`s merged over the claim's) fall
    strictly; holds when they do for every network that ran them all."""
    judged = {}
    for network in _networks(ctx, claim.get("where", {})):
        times = [_time(ctx, select(ctx, {**claim.get("where", {}), "network": network, **w})) for w in claim["order"]]
        if all(t is not None for t in times):
            judged[network] = times
    if not judged:
        return None
    falling = [n for n, t in judged.items() if all(a > b for a, b in zip(t, t[1:]))]
    text = "; ".join(f"{n} " + " / ".join(f"{t:.4g}" for t in times) for n, times in judged.items())
    return Verdict(f"{len(falling)} of {len(judged)} networks: {text}", HOLDS if len(falling) == len(judged)
                   else FAILS)


def check_fastest(ctx: Context, claim: dict) -> Verdict | None:
    """The point `where` names is the fastest of `among` (frameworks, or `where`s merged over the claim's) in
    every cell (dataset x network) where it finished; cells where it did not are exempt (the "unless memory runs
    out")."""
    where, among = claim["where"], claim["among"]
    cells = sorted({(r.dataset, r.network) for r in select(ctx, where)})
    wins, judged = 0, 0
    for dataset, network in cells:
        cell = {**where, "dataset": dataset, "network": network}
        mine = _time(ctx, select(ctx, cell))
        others = [_time(ctx, select(ctx, {**cell, **(other if isinstance(other, dict) else {"framework": other})}))
                  for other in among]
        others = [t for t in others if t is not None]
        if mine is None or not others:
            continue
        judged += 1
        wins += mine <= min(others)
    if not judged:
        return None
    return Verdict(f"fastest in {wins} of {judged} cells", HOLDS if wins == judged else FAILS)


def check_status(ctx: Context, claim: dict) -> Verdict | None:
    """The point ended with the published failure (`status`, e.g. oom)."""
    rows = select(ctx, claim["where"])
    if not rows:
        return None
    last = max(rows, key=lambda r: r.start_time)
    return Verdict(last.status, HOLDS if last.status == claim["status"] else FAILS)


def check_eq_6_1(ctx: Context, claim: dict) -> Verdict | None:
    """Eq. 6.1's factor (W + #mb - 1) / (W x #mb) of the configuration's runs, at the published worker count."""
    rows = [r for r in select(ctx, claim["where"]) if r.workers == claim["where"].get("workers", r.workers)]
    if not rows:
        return None
    value = eq_6_1(rows[0].workers, int(rows[0].params["micro_batches"]))
    return Verdict(f"{value:.4f}", HOLDS if _within(value, claim) else FAILS)


def _time_ratios(ctx: Context, claim: dict) -> dict[tuple[str, int], float]:
    out = {}
    for network in _networks(ctx, claim["where"]):
        lines = series(ctx, network)
        a, b = lines.get(claim["framework"], {}), lines.get(claim["relative_to"], {})
        for workers in sorted(set(a) & set(b)):
            if claim["where"].get("workers", workers) != workers:
                continue
            ta = [e.value for e in (epoch_time([r], ctx.histories, ctx.protocol) for r in finished(a[workers])) if e]
            tb = [e.value for e in (epoch_time([r], ctx.histories, ctx.protocol) for r in finished(b[workers])) if e]
            if ta and tb:
                out[network, workers] = ratio(ta, tb).value
    return out


def _memory_ratios(ctx: Context, claim: dict) -> dict[tuple[str, int], float]:
    values = {}
    for network in _networks(ctx, claim["where"]):
        for workers, value in memory_ratio(ctx, network, claim["framework"], claim["relative_to"]).items():
            if workers >= claim.get("min_workers", 2):
                values[network, workers] = value
    return values


RATIOS = {"time_ratio": (_time_ratios, "time ratio"), "memory_ratio": (_memory_ratios, "memory ratio")}


def _ratio_text(values: dict[tuple[str, int], float], what: str) -> str:
    return f"{what} " + ", ".join(f"{v:.3g} ({n} w{w})" for (n, w), v in sorted(values.items()))


def _range_verdict(values: dict, claim: dict, what: str) -> Verdict | None:
    if not values:
        return None
    holds = all(_within(v, claim) for v in values.values())
    return Verdict(_ratio_text(values, what), HOLDS if holds else FAILS)


def check_time_ratio(ctx: Context, claim: dict) -> Verdict | None:
    """Epoch time of `framework` over `relative_to`'s at every GPU count both ran, each within the range."""
    return _range_verdict(_time_ratios(ctx, claim), claim, "time ratio")


def check_memory_ratio(ctx: Context, claim: dict) -> Verdict | None:
    """Peak memory of `framework` over `relative_to`'s at every GPU count above `min_workers` both ran."""
    return _range_verdict(_memory_ratios(ctx, claim), claim, "memory ratio")


def check_memory_reduction(ctx: Context, claim: dict) -> Verdict | None:
    """Peak memory on 1 GPU over the smallest at a larger count, for each pipeline framework listed."""
    values = {}
    for network in _networks(ctx, claim["where"]):
        lines = series(ctx, network)
        for name in claim["frameworks"]:
            factor = memory_reduction(lines.get(name, {}))
            if factor is not None:
                values[f"{network} {name}", 0] = factor
    if not values:
        return None
    holds = all(_within(v, claim) for v in values.values())
    return Verdict("reduction " + ", ".join(f"{v:.3g} ({k})" for (k, _), v in sorted(values.items())),
                   HOLDS if holds else FAILS)


def check_single_gpu_ratio(ctx: Context, claim: dict) -> Verdict | None:
    """1-GPU epoch time of `framework` over the fastest framework's on 1 GPU (of those `among`)."""
    where = {**claim["where"], "workers": 1}
    mine = _time(ctx, select(ctx, {**where, "framework": claim["framework"]}))
    others = [_time(ctx, select(ctx, {**where, "framework": f})) for f in claim["among"]]
    others = [t for t in others if t is not None]
    if mine is None or not others:
        return None
    value = mine / min(others)
    return Verdict(f"{value:.3g}x the fastest", HOLDS if _within(value, claim) else FAILS)


def check_comm_share(ctx: Context, claim: dict) -> Verdict | None:
    """Communication's share of a step (`comm_fraction`, measured in the traces of `profile.steps`) at the point
    `where` names, the median over its finished repeats."""
    rows = [r for r in finished(select(ctx, claim["where"])) if "comm_fraction" in r.metrics]
    if not rows:
        return None
    value = statistics.median(r.metrics["comm_fraction"] for r in rows)
    return Verdict(f"{value:.1%} ({rows[0].network}, {rows[0].workers} workers)",
                   HOLDS if _within(value, claim) else FAILS)


def check_none(ctx: Context, claim: dict) -> Verdict | None:
    """A claim the suite cannot measure yet (the claim's `measure` says what would)."""
    return None


CHECKS = {"speedup": check_speedup, "epoch_time": check_epoch_time, "decreasing": check_decreasing,
          "fastest": check_fastest, "time_ratio": check_time_ratio, "memory_ratio": check_memory_ratio,
          "memory_reduction": check_memory_reduction, "single_gpu_ratio": check_single_gpu_ratio,
          "status": check_status, "eq_6_1": check_eq_6_1, "comm_share": check_comm_share, "none": check_none}


def evaluate(ctx: Context, claims: list[dict]) -> list[tuple[dict, Verdict]]:
    out = []
    for claim in claims:
        verdict = CHECKS[claim["check"]](ctx, claim)
        out.append((claim, verdict or Verdict("-", NOT_MEASURED, claim.get("measure", ""))))
    return out


def published(claim: dict) -> str:
    if "published" in claim:
        return str(claim["published"])
    if "min" in claim and "max" in claim:
        return f"{claim['min']}-{claim['max']}"
    return f"> {claim['min']}" if "min" in claim else "-"


def relation(claim: dict) -> str:
    if "tolerance" in claim:
        return f"within {100 * claim['tolerance']:.0f}% of {claim['published']}"
    if "min" in claim or "max" in claim:
        return f"in [{claim.get('min', '-inf')}, {claim.get('max', 'inf')}]"
    return claim.get("relation", "as stated")


def separated(ctx: Context, claims: list[dict]) -> list[list[str]]:
    """The ratio of each claim that names a `control` parted in two, named by the claim's two `effects`:
    `framework` over the control, and the control over `relative_to`; their product is the claim's ratio. One
    row per distinct comparison, so that a part several claims share is shown once."""
    rows, seen = [], set()
    for claim in [c for c in claims if "control" in c]:
        ratios, what = RATIOS[claim["check"]]
        for effect, part in zip(claim["effects"], ({"relative_to": claim["control"]}, {"framework": claim["control"]})):
            parted = {**claim, **part}
            comparison = f"{parted['framework']} / {parted['relative_to']}"
            if (what, comparison) in seen:
                continue
            seen.add((what, comparison))
            values = ratios(ctx, parted)
            rows.append([claim["id"], effect, comparison, what, _ratio_text(values, what) if values else NOT_MEASURED])
    return rows


@view("claims")
def claims_view(ctx: Context) -> Section:
    """Each published claim: its source, value, relation, this sweep's value and the verdict; below, the ratios of
    the claims that name a control, parted into their two effects."""
    if not ctx.claims:
        return Section("Claims", "(this sweep's report names no claims file: report.claims)")
    claims = load_claims(ctx.claims)
    rows = [[c["id"], c["source"], c["claim"], published(c), relation(c), v.measured, v.verdict, v.note]
            for c, v in evaluate(ctx, claims)]
    table = Table("claims", f"{ctx.experiment}: published claims ({ctx.claims}) against this sweep",
                  ["id", "source", "claim", "published", "holds if", "this sweep", "verdict",
                   "what would measure it"], rows)
    section = table_section(table, ctx)
    parts = separated(ctx, claims)
    if parts:
        notes = ["Not published: the study did not run the controls. A claim's ratio is the product of its two "
                 "parts.", *(f"{name}: {what}" for name, what in load_controls(ctx.claims).items())]
        parted = Table("claims_separated", f"{ctx.experiment}: the claims' ratios parted by a control",
                       ["claim", "effect", "comparison", "measure", "this sweep"], parts, notes)
        section.files += parted.write(ctx.directory)
        section.markdown += "\n\n" + parted.markdown()
    return section
