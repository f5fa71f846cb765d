"""The pieces a report is made of ("views"): each writes tables (md, CSV, LaTeX) and figures (PNG, PDF) into the
report directory and returns a markdown section. A sweep file names its views under `report.views`; a sweep
that names none gets DEFAULT_VIEWS: the speedup table and plot, convergence, and where the time goes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from analysis.measure import Histories, cells, status_of  # noqa: E402
from analysis.plots import foot_note  # noqa: E402
from analysis.runs import GridPoint, Row  # noqa: E402
from analysis.tables import Table  # noqa: E402
from suite.shared_names import Status

DEFAULT_VIEWS = ("speedup_table", "speedup", "convergence", "breakdown")


@dataclass(frozen=True)
class NotRun(GridPoint):
    """A point of the sweep with no run in the store (never started, or its job is still waiting)."""


@dataclass
class Context:
    experiment: str
    rows: list[Row]
    histories: Histories
    client: object  # MlflowClient
    directory: Path
    protocol: str = "suite"
    extension: tuple[str, ...] = ()  # strategies the study could not run: shown apart as an extension
    claims: str | None = None  # analysis/published/<claims>.yaml
    miniature: str | None = None  # how the sweep scales its study down (`report.miniature`); None: full size
    not_run: list[NotRun] = field(default_factory=list)


@dataclass
class Section:
    title: str
    markdown: str
    files: list[Path] = field(default_factory=list)


VIEWS: dict[str, Callable[[Context], Section]] = {}


def view(name: str):
    def register(function: Callable[[Context], Section]) -> Callable[[Context], Section]:
        VIEWS[name] = function
        return function
    return register


def save_figure(fig, ctx: Context, name: str, note: str | None = None) -> list[Path]:
    """PNG and PDF of the figure, `note` along its foot."""
    fig.tight_layout(rect=(0, foot_note(fig, note), 1, 1 - 0.4 / fig.get_figheight()))  # room for the suptitle
    paths = [ctx.directory / f"{name}.png", ctx.directory / f"{name}.pdf"]
    fig.savefig(paths[0], dpi=120)
    fig.savefig(paths[1])
    plt.close(fig)
    return paths


def table_section(table: Table, ctx: Context, extra_files: list[Path] | None = None,
                  heading: str | None = None) -> Section:
    """The table as a report section, under `heading` (default: the table's title, then not repeated below it)."""
    return Section(heading or table.title, table.markdown(), table.write(ctx.directory) + (extra_files or []))


@view("status")
def status_matrix(ctx: Context) -> Section:
    """Cell x strategy: `ok` for a finished point, else its status; below, every point that did not finish
    with its error line. Points the sweep submitted that have no run yet (at the end of `make sweep` on a batch
    cluster) read `not run`; `make status` lists every point of a sweep with its state."""
    grouped = cells(ctx.rows)
    labels = sorted({key[2] for key in grouped} | {n.strategy for n in ctx.not_run})
    places = sorted({(d, n, w) for d, n, _, w in grouped} | {(n.dataset, n.network, n.workers) for n in ctx.not_run})
    state = {(d, n, w, label): status_of(repeats) for (d, n, label, w), repeats in grouped.items()}
    for missing in ctx.not_run:
        state.setdefault((missing.dataset, missing.network, missing.workers, missing.strategy), "not run")
    matrix = Table("status_matrix", f"{ctx.experiment}: status of every point", ["dataset", "network", "workers",
                                                                                 *labels],
                   [[d, n, str(w), *(("ok" if state.get((d, n, w, label)) == Status.finished
                                      else state.get((d, n, w, label), "").split(":")[0] or "")
                                     for label in labels)] for d, n, w in places],
                   ["ok: finished; an empty cell is not a point of this sweep."])
    problems = Table("status_problems", f"{ctx.experiment}: points that did not finish",
                     ["dataset", "network", "strategy", "workers", "status", "error"],
                     [[d, n, label, str(w), *(state[d, n, w, label].split(": ", 1) + [""])[:2]]
                      for d, n, w in places for label in labels
                      if state.get((d, n, w, label), Status.finished) != Status.finished])
    files = matrix.write(ctx.directory) + problems.write(ctx.directory)
    return Section("Status", matrix.markdown() + "\n\n" + problems.markdown(), files)


@view("speedup_table")
def speedup_table_view(ctx: Context) -> Section:
    from analysis.measure import PROTOCOLS
    from analysis.speedup import speedup_table
    table = speedup_table(ctx.rows, ctx.histories, ctx.protocol,
                          f"{ctx.experiment}: speedup against each workload's baseline ({PROTOCOLS[ctx.protocol]})")
    return table_section(table, ctx, heading="Speedup")


@view("speedup")
def speedup_plot(ctx: Context) -> Section:
    from analysis.plots import plot_speedup
    path, note = plot_speedup(ctx.rows, ctx.histories, ctx.protocol, ctx.directory / "speedup.png")
    return Section("Speedup plot", f"![speedup]({path.name})" + (f"\n\n{note}" if note else ""), [path])


@view("convergence")
def convergence_plot(ctx: Context) -> Section:
    from analysis.plots import plot_convergence
    path = plot_convergence(ctx.rows, ctx.client, ctx.directory / "convergence.png")
    return Section("Validation metric against training time", f"![convergence]({path.name})", [path])
