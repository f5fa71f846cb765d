"""A report table, written three ways from the same cells: markdown (to read), CSV (to compute with), LaTeX booktabs
(to print; pandas' Styler).

The cells are what a reader sees. CSV gets numbers: a measured value with its interval (`Interval`), "1.2 [1.0,
1.4]" on screen, takes four columns, `<column>`, `<column> low`, `<column> high` and `<column> n` (the samples the
interval spans); a missing value (`-`) is an empty field; a percentage cell ("12.5%") is its fraction (0.125); a
column name drops its display brackets ("s/epoch [95% CI]" is `s/epoch`) and says `pct` for `%`. Every table with
intervals says under it what they span (repeats of a point, or epochs of one run), how they were made and from how
many samples.
"""

from __future__ import annotations

import io
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

MISSING = ("-", "")
LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                 "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


class Interval(str):
    """A value and its interval: the text a reader sees, and the numbers CSV gets."""

    value: float
    low: float
    high: float
    n: int | None
    spans: str  # what the interval is, in words (analysis.stats.Estimate.spans); "" where not said

    def __new__(cls, value: float, low: float, high: float, spec: str = ".3g", n: int | None = None,
                spans: str = "") -> Interval:
        cell = super().__new__(cls, f"{value:{spec}} [{low:{spec}}, {high:{spec}}]")
        cell.value, cell.low, cell.high, cell.n, cell.spans = value, low, high, n, spans
        return cell


def interval_cell(estimate, spec: str = ".3g") -> str:
    """An Estimate (analysis.stats) as a cell: `-` for none, the value alone from one sample, else an Interval."""
    if estimate is None:
        return "-"
    if estimate.n == 1:
        return format(estimate.value, spec)
    return Interval(estimate.value, estimate.low, estimate.high, spec, estimate.n, estimate.spans())


def csv_name(column: str) -> str:
    """A column's name in CSV: without its display brackets (`s/epoch [95% CI]` is `s/epoch`), `%` as `pct`."""
    return (re.sub(r"\s*\[[^\]]*\]", "", column).strip() or column).replace("%", "pct")


def number(cell: str) -> float | int | str | None:
    """A cell as CSV holds it: a number where it reads as one (a percentage as its fraction), None where missing,
    else the text."""
    if cell in MISSING:
        return None
    text = cell.strip()
    try:
        return int(text) if re.fullmatch(r"-?\d+", text) else float(text)
    except ValueError:
        pass
    if text.endswith("%"):
        try:
            return float(text[:-1]) / 100
        except ValueError:
            pass
    return cell


def interval_note(spans: Iterable[str], what: str = "Intervals", unit: str = "cell", of: int | None = None,
                  others: str = "") -> str | None:
    """What intervals span, counted: `Intervals: 95% t-interval over 3 repeats (4 cells); ...`; None for none. With
    `of`, the count of all that could have one (`3 of 6 points`), and what `others` (those without) are."""
    counted = Counter(span for span in spans if span)
    if not counted:
        return None
    total = f" of {of}" if of is not None and of > sum(counted.values()) else ""
    return f"{what}: " + "; ".join(f"{span} ({count}{total} {unit}{'s' * (count > 1 or bool(total))})"
                                   for span, count in sorted(counted.items())) + (
        f"; {others}" if total and others else "") + "."


@dataclass(frozen=True)
class Table:
    name: str  # file stem
    title: str
    columns: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)  # printed under the table (protocol, sources)

    def all_notes(self) -> list[str]:
        note = interval_note(cell.spans for row in self.rows for cell in row if isinstance(cell, Interval))
        return [*self.notes, *([note] if note else [])]

    def markdown(self) -> str:
        lines = [f"| {' | '.join(self.columns)} |", "|" + "---|" * len(self.columns)]
        lines += [f"| {' | '.join(cell.replace('|', '/') for cell in row)} |" for row in self.rows]
        notes = self.all_notes()
        return "\n".join([f"### {self.title}", "", *lines, *([""] + notes if notes else [])])

    def frame(self) -> pd.DataFrame:
        """The table's numbers, one column each (an interval's value, low, high and n apart): what CSV holds."""
        wide = [any(isinstance(row[i], Interval) for row in self.rows) for i in range(len(self.columns))]
        names = [csv_name(c) for c in self.columns]
        header = [part for name, w in zip(names, wide)
                  for part in ((name, f"{name} low", f"{name} high", f"{name} n") if w else (name,))]
        records = []
        for row in self.rows:
            out = []
            for cell, w in zip(row, wide):
                if isinstance(cell, Interval):
                    out += [cell.value, cell.low, cell.high, cell.n]
                elif w:  # a value without an interval (one sample), or none
                    value = number(cell)
                    out += [value, value, value, 1] if isinstance(value, float | int) else [value, None, None, None]
                else:
                    out.append(number(cell))
            records.append(out)
        return pd.DataFrame(records, columns=header, dtype=object)

    def csv(self) -> str:
        out = io.StringIO()
        self.frame().to_csv(out, index=False, lineterminator="\n")
        return out.getvalue()

    def latex(self) -> str:
        shown = pd.DataFrame([list(map(str, row)) for row in self.rows], columns=self.columns)
        styler = shown.style.hide(axis="index").format(escape="latex").format_index(escape="latex", axis=1)
        return styler.to_latex(caption="".join(LATEX_SPECIAL.get(c, c) for c in self.title),
                               position="ht", position_float="centering", hrules=True,
                               column_format="l" * len(self.columns), environment="table")

    def write(self, directory: Path) -> list[Path]:
        paths = []
        for suffix, text in (("md", self.markdown() + "\n"), ("csv", self.csv()), ("tex", self.latex())):
            path = directory / f"{self.name}.{suffix}"
            path.write_text(text)
            paths.append(path)
        return paths
