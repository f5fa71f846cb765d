"""A report table, written three ways: markdown (to read), CSV (to compute with), LaTeX booktabs (to print).

A cell that is a measured value with its 95% interval (`Interval`) reads "1.2 [1.0, 1.4]" in markdown and LaTeX and
takes three CSV columns, `<column>`, `<column> low` and `<column> high`, so that a spreadsheet computes with
numbers."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path

LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                 "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def latex_escape(text: str) -> str:
    return "".join(LATEX_SPECIAL.get(c, c) for c in text)


class Interval(str):
    """A value and its interval: the text a reader sees, and the three numbers CSV gets."""

    value: float
    low: float
    high: float

    def __new__(cls, value: float, low: float, high: float, spec: str = ".3g") -> Interval:
        cell = super().__new__(cls, f"{value:{spec}} [{low:{spec}}, {high:{spec}}]")
        cell.value, cell.low, cell.high = value, low, high
        return cell


def interval_cell(estimate, spec: str = ".3g") -> str:
    """An Estimate (analysis.stats) as a cell: `-` for none, the value alone from one sample, else an Interval."""
    if estimate is None:
        return "-"
    if estimate.n == 1:
        return format(estimate.value, spec)
    return Interval(estimate.value, estimate.low, estimate.high, spec)


@dataclass(frozen=True)
class Table:
    name: str  # file stem
    title: str
    columns: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)  # printed under the table (protocol, sources)

    def markdown(self) -> str:
        lines = [f"| {' | '.join(self.columns)} |", "|" + "---|" * len(self.columns)]
        lines += [f"| {' | '.join(cell.replace('|', '/') for cell in row)} |" for row in self.rows]
        return "\n".join([f"### {self.title}", "", *lines, *([""] + self.notes if self.notes else [])])

    def csv(self) -> str:
        """Columns with an Interval in some row are written as three: the value, its low and high end."""
        split = [any(isinstance(row[i], Interval) for row in self.rows) for i in range(len(self.columns))]
        header = [name for name, wide in zip(self.columns, split)
                  for name in ((name, f"{name} low", f"{name} high") if wide else (name,))]

        def cells(row: list[str]) -> list[str]:
            out = []
            for cell, wide in zip(row, split):
                if isinstance(cell, Interval):
                    out += [repr(cell.value), repr(cell.low), repr(cell.high)]
                else:
                    out += [cell, "", ""] if wide else [cell]
            return out
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(map(cells, self.rows))
        return out.getvalue()

    def latex(self) -> str:
        row = " & ".join
        body = [row(latex_escape(c) for c in r) + r" \\" for r in self.rows]
        return "\n".join([
            r"\begin{table}[ht]", r"\centering", rf"\caption{{{latex_escape(self.title)}}}",
            rf"\begin{{tabular}}{{{'l' * len(self.columns)}}}", r"\toprule",
            row(latex_escape(c) for c in self.columns) + r" \\", r"\midrule", *body, r"\bottomrule",
            r"\end{tabular}", r"\end{table}", ""])

    def write(self, directory: Path) -> list[Path]:
        paths = []
        for suffix, text in (("md", self.markdown() + "\n"), ("csv", self.csv()), ("tex", self.latex())):
            path = directory / f"{self.name}.{suffix}"
            path.write_text(text)
            paths.append(path)
        return paths
