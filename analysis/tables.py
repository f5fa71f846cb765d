"""A report table, written three ways: markdown (to read), CSV (to compute with), LaTeX booktabs (to print)."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path

LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                 "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def latex_escape(text: str) -> str:
    return "".join(LATEX_SPECIAL.get(c, c) for c in text)


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
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(self.columns)
        writer.writerows(self.rows)
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
