"""Published claims checked against a sweep's runs: the report's "claims" section.

A claims file (analysis/published/<name>.yaml, named by a sweep's `report.claims`) lists every number and
checkable claim of a study, each with its source, the published value, the band that counts as "holds", and the
least evidence it needs (`needs`: `samples`, the fewest samples behind an interval; `gpu_memory`, memory the
CUDA allocator measured, not a CPU process's resident set; `full_size`, the study's networks and inputs, not a
sweep that declares itself a miniature in its `report.miniature`). Each `check` kind below turns the runs into
measured values with their 95% intervals and a verdict: `holds` when every interval lies inside the band, `fails`
when one lies wholly outside it, `inconclusive` when one straddles its edge; `not testable here` when the runs
lack the evidence the claim needs (the reason in the caveats column, the value still shown); `not measured` when
the sweep has no such point (with what would measure it). Points are selected by `where`: dataset, network
(a glob: `gpt2*` is any GPT-2), framework (a strategy, or Study N's name such as ZeRO-1 or Megatron-intra),
workers (a number, or `max`: the largest that ran), Study J's GPipe configuration.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

import yaml

from analysis.measure import cell_ratio, epoch_time, finished, speedup
from analysis.runs import Row
from analysis.stats import Estimate, estimate
from analysis.study_j import eq_6_1, gpipe_config, single_node_workers
from analysis.study_n import frameworks, memory_ratio, memory_reduction, series
from analysis.tables import Table, interval_note
from analysis.views import Context, Section, table_section, view

PUBLISHED_DIR = Path(__file__).parent / "published"
HOLDS, FAILS, INCONCLUSIVE = "holds", "fails", "inconclusive"
NOT_TESTABLE, NOT_MEASURED = "not testable here", "not measured"
NEEDS = ("samples", "gpu_memory", "full_size")


@dataclass(frozen=True)
class Verdict:
    measured: str
    verdict: str
    note: str = ""
    estimates: tuple[Estimate, ...] = ()  # the values behind it, with their intervals (none: a count, a status)

    @property
    def samples(self) -> int | None:
        """The fewest samples behind one of its intervals; None where it rests on none."""
        counts = [e.n for e in self.estimates if e.cv is not None or e.n > 1]
        return min(counts) if counts else None


def _band(claim: dict) -> tuple[float, float]:
    if "tolerance" in claim:
        return (claim["published"] * (1 - claim["tolerance"]), claim["published"] * (1 + claim["tolerance"]))
    return claim.get("min", float("-inf")), claim.get("max", float("inf"))


def judged(e: Estimate, claim: dict) -> str:
    """An estimate against the claim's band: its whole interval inside holds, wholly outside fails."""
    low, high = _band(claim)
    if low <= e.low and e.high <= high:
        return HOLDS
    return FAILS if e.high < low or e.low > high else INCONCLUSIVE


def compared(a: Estimate, b: Estimate) -> str:
    """Whether a is below b: holds when a's interval lies below b's, fails when above, else inconclusive."""
    return HOLDS if a.high < b.low else FAILS if a.low > b.high else INCONCLUSIVE


def combined(verdicts: Iterable[str]) -> str:
    """A claim over several values holds when each does and fails when one fails."""
    verdicts = list(verdicts)
    return FAILS if FAILS in verdicts else HOLDS if all(v == HOLDS for v in verdicts) else INCONCLUSIVE


def exact(value: float) -> Estimate:
    """A value that has no spread (a formula's, a count's)."""
    return Estimate(value, value, value, None, 1)


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
        missing = {"id", "source", "claim", "check", "needs"} - claim.keys()
        if missing:
            raise ValueError(f"{path}: claim {claim.get('id', '?')} lacks {', '.join(sorted(missing))}")
        if claim["check"] not in CHECKS:
            raise ValueError(f"{path}: claim {claim['id']}: check {claim['check']} is not one of {', '.join(CHECKS)}")
        unknown = set(claim["needs"] or {}) - set(NEEDS)
        if unknown:
            raise ValueError(f"{path}: claim {claim['id']}: needs {', '.join(sorted(unknown))} is not one of "
                             f"{', '.join(NEEDS)}")
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


def _time(ctx: Context, rows: list[Row]) -> Estimate | None:
    return epoch_time(rows, ctx.histories, ctx.protocol) if rows else None


def _text(e: Estimate, spec: str = ".3g") -> str:
    return format(e.value, spec) if e.low == e.high else f"{e.value:{spec}} [{e.low:{spec}}, {e.high:{spec}}]"


def check_speedup(ctx: Context, claim: dict) -> Verdict | None:
    """The point's throughput over `single`'s on one worker (same dataset and network): Study J's speedup."""
    point = select(ctx, claim["where"])
    if not point:
        return None
    base = [r for r in ctx.rows if r.strategy == "single" and r.workers == 1 and r.workload == point[0].workload]
    s = speedup(point, base, ctx.histories, ctx.protocol) if base else None
    if s is None:
        return None
    return Verdict(f"{_text(s)} ({point[0].network}, {point[0].workers} workers)", judged(s, claim), estimates=(s,))


def check_epoch_time(ctx: Context, claim: dict) -> Verdict | None:
    t = _time(ctx, select(ctx, claim["where"]))
    if t is None:
        return None
    return Verdict(f"{_text(t, '.4g')} s", judged(t, claim), estimates=(t,))


def _networks(ctx: Context, where: dict) -> list[str]:
    return sorted({r.network for r in select(ctx, where)})


def check_decreasing(ctx: Context, claim: dict) -> Verdict | None:
    """Per network, the epoch times of the listed points (`order`: `where`s merged over the claim's) fall
    strictly, each interval below the one before; holds when they do for every network that ran them all."""
    measured = {}
    for network in _networks(ctx, claim.get("where", {})):
        times = [_time(ctx, select(ctx, {**claim.get("where", {}), "network": network, **w})) for w in claim["order"]]
        if all(t is not None for t in times):
            measured[network] = times
    if not measured:
        return None
    steps = {n: [compared(b, a) for a, b in zip(times, times[1:])] for n, times in measured.items()}
    falling = [n for n, verdicts in steps.items() if combined(verdicts) == HOLDS]
    text = "; ".join(f"{n} " + " / ".join(_text(t, ".4g") for t in times) for n, times in measured.items())
    return Verdict(f"{len(falling)} of {len(measured)} networks: {text}",
                   combined(v for verdicts in steps.values() for v in verdicts),
                   estimates=tuple(t for times in measured.values() for t in times))


def check_fastest(ctx: Context, claim: dict) -> Verdict | None:
    """The point `where` names is the fastest of `among` (frameworks, or `where`s merged over the claim's) in
    every cell (dataset x network) where it finished, its interval below every other's; cells where it did not
    finish are exempt (the "unless memory runs out")."""
    where, among = claim["where"], claim["among"]
    cells = sorted({(r.dataset, r.network) for r in select(ctx, where)})
    verdicts, used = [], []
    for dataset, network in cells:
        cell = {**where, "dataset": dataset, "network": network}
        mine = _time(ctx, select(ctx, cell))
        others = [_time(ctx, select(ctx, {**cell, **(other if isinstance(other, dict) else {"framework": other})}))
                  for other in among]
        others = [t for t in others if t is not None]
        if mine is None or not others:
            continue
        verdicts.append(combined(compared(mine, other) for other in others))
        used += [mine, *others]
    if not verdicts:
        return None
    return Verdict(f"fastest in {verdicts.count(HOLDS)} of {len(verdicts)} cells, slower in "
                   f"{verdicts.count(FAILS)}, within the intervals in {verdicts.count(INCONCLUSIVE)}",
                   combined(verdicts), estimates=tuple(used))


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
    return Verdict(f"{value:.4f}", judged(exact(value), claim))


def _time_ratios(ctx: Context, claim: dict) -> dict[tuple[str, int], Estimate]:
    out = {}
    for network in _networks(ctx, claim["where"]):
        lines = series(ctx, network)
        a, b = lines.get(claim["framework"], {}), lines.get(claim["relative_to"], {})
        for workers in sorted(set(a) & set(b)):
            if claim["where"].get("workers", workers) != workers:
                continue
            found = cell_ratio(a[workers], b[workers], ctx.histories, ctx.protocol)
            if found is not None:
                out[network, workers] = found
    return out


def _memory_ratios(ctx: Context, claim: dict) -> dict[tuple[str, int], Estimate]:
    values = {}
    for network in _networks(ctx, claim["where"]):
        for workers, value in memory_ratio(ctx, network, claim["framework"], claim["relative_to"]).items():
            if workers >= claim.get("min_workers", 2):
                values[network, workers] = exact(value)
    return values


RATIOS = {"time_ratio": (_time_ratios, "time ratio"), "memory_ratio": (_memory_ratios, "memory ratio")}


def _ratio_text(values: dict[tuple[str, int], Estimate], what: str) -> str:
    return f"{what} " + ", ".join(f"{_text(v)} ({n} w{w})" for (n, w), v in sorted(values.items()))


def _range_verdict(values: dict[tuple[str, int], Estimate], claim: dict, what: str) -> Verdict | None:
    if not values:
        return None
    return Verdict(_ratio_text(values, what), combined(judged(v, claim) for v in values.values()),
                   estimates=tuple(values.values()))


def check_time_ratio(ctx: Context, claim: dict) -> Verdict | None:
    """Epoch time of `framework` over `relative_to`'s at every GPU count both ran, each within the range."""
    return _range_verdict(_time_ratios(ctx, claim), claim, "time ratio")


def check_constant_ratio(ctx: Context, claim: dict) -> Verdict | None:
    """Epoch time of `framework` over `relative_to`'s at every GPU count both ran, per network: the offset between
    their curves is constant when each count's ratio lies within `spread` (a fraction) of the network's median ratio (a
    constant offset between curves on log axes); it needs two counts."""
    ratios = _time_ratios(ctx, claim)
    verdicts = []
    for network in sorted({n for n, _ in ratios}):
        mine = {key: value for key, value in ratios.items() if key[0] == network}
        if len(mine) < 2:
            continue
        middle = sorted(v.value for v in mine.values())[len(mine) // 2]
        band = {"min": middle * (1 - claim["spread"]), "max": middle * (1 + claim["spread"])}
        verdicts += [judged(value, band) for value in mine.values()]
    if not verdicts:
        return None
    return Verdict(_ratio_text(ratios, "time ratio"), combined(verdicts), estimates=tuple(ratios.values()))


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
    return Verdict("reduction " + ", ".join(f"{v:.3g} ({k})" for (k, _), v in sorted(values.items())),
                   combined(judged(exact(v), claim) for v in values.values()))


def check_single_gpu_ratio(ctx: Context, claim: dict) -> Verdict | None:
    """1-GPU epoch time of `framework` over the fastest framework's on 1 GPU (of those `among`)."""
    where = {**claim["where"], "workers": 1}
    mine = select(ctx, {**where, "framework": claim["framework"]})
    others = [rows for rows in (select(ctx, {**where, "framework": f}) for f in claim["among"]) if _time(ctx, rows)]
    if not _time(ctx, mine) or not others:
        return None
    fastest = min(others, key=lambda rows: _time(ctx, rows).value)
    value = cell_ratio(mine, fastest, ctx.histories, ctx.protocol)
    return Verdict(f"{_text(value)}x the fastest", judged(value, claim), estimates=(value,))


def check_comm_share(ctx: Context, claim: dict) -> Verdict | None:
    """Communication's share of a step (`comm_fraction`, measured in the traces of `profile.steps`) at the point
    `where` names, the median over its finished repeats."""
    rows = [r for r in finished(select(ctx, claim["where"])) if "comm_fraction" in r.metrics]
    if not rows:
        return None
    share = estimate([r.metrics["comm_fraction"] for r in rows])
    return Verdict(f"{share.value:.1%} ({rows[0].network}, {rows[0].workers} workers)", judged(share, claim),
                   estimates=(share,))


def check_none(ctx: Context, claim: dict) -> Verdict | None:
    """A claim the suite cannot measure yet (the claim's `measure` says what would)."""
    return None


CHECKS = {"speedup": check_speedup, "epoch_time": check_epoch_time, "decreasing": check_decreasing,
          "fastest": check_fastest, "time_ratio": check_time_ratio, "constant_ratio": check_constant_ratio,
          "memory_ratio": check_memory_ratio,
          "memory_reduction": check_memory_reduction, "single_gpu_ratio": check_single_gpu_ratio,
          "status": check_status, "eq_6_1": check_eq_6_1, "comm_share": check_comm_share, "none": check_none}


def untestable(ctx: Context, claim: dict, verdict: Verdict) -> str | None:
    """Why this sweep's runs cannot test the claim, though they measured it: the evidence it `needs` that they lack."""
    needs = claim["needs"] or {}
    if needs.get("gpu_memory") and not any("peak_cuda_allocated_mb" in r.metrics for r in ctx.rows):
        return "a claim on GPU memory: this sweep measured a CPU process's resident set"
    if needs.get("full_size") and ctx.miniature:
        return f"a claim on the study's full sizes: this sweep is a miniature ({ctx.miniature})"
    fewest = needs.get("samples")
    if fewest and verdict.samples is not None and verdict.samples < fewest:
        return f"an interval from {verdict.samples} sample(s), fewer than the {fewest} the claim needs"
    return None


def evaluate(ctx: Context, claims: list[dict]) -> list[tuple[dict, Verdict]]:
    out = []
    for claim in claims:
        verdict = CHECKS[claim["check"]](ctx, claim)
        if verdict is None:
            verdict = Verdict("-", NOT_MEASURED, claim.get("measure", ""))
        elif (reason := untestable(ctx, claim, verdict)) is not None:
            verdict = Verdict(verdict.measured, NOT_TESTABLE, reason, verdict.estimates)
        out.append((claim, verdict))
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
    verdicts = evaluate(ctx, claims)
    rows = [[c["id"], c["source"], c["claim"], published(c), relation(c), v.measured, v.verdict, v.note]
            for c, v in verdicts]
    spans = interval_note((e.spans() for _, v in verdicts for e in v.estimates if e.method), "Intervals", "value")
    table = Table("claims", f"{ctx.experiment}: published claims ({ctx.claims}) against this sweep",
                  ["id", "source", "claim", "published", "holds if", "this sweep", "verdict", "caveats"], rows,
                  ["holds: every measured 95% interval inside the band; fails: one wholly outside it; inconclusive: "
                   "one straddles its edge; not testable here: the runs lack the evidence the claim needs (caveats); "
                   "not measured: no such point in this sweep (caveats: what would measure it). Times compare equal "
                   "work: each epoch scaled to one pass over the whole training set.", *([spans] if spans else [])])
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
