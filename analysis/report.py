"""The report of an experiment, from the store: `python -m analysis.report <experiment>`.

Writes results/reports/<experiment>/: report.md (the sanity flags first, then every section in the order the sweep
file's `report.views` names them), the same as report.html with its figures embedded (what MLflow's artifact viewer
shows on a sweep's run), each view's tables (md, CSV, LaTeX) and figures (PNG, PDF), and runs.csv (every run the
report read, with its params, metrics and status). The sweep file of
the same name, when there is one, chooses the views, the timing protocol, the strategies shown as an extension, the
published claims to check and whether it is a miniature; without one the report has the DEFAULT_VIEWS. Its
`study_settings` are the report's caption: a table under the title.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

import analysis.breakdown  # noqa: F401  (registers the breakdown view)
import analysis.claims  # noqa: F401  (registers the claims view)
import analysis.device  # noqa: F401  (registers the device view)
import analysis.equivalence  # noqa: F401  (registers the same-losses view)
import analysis.model_score  # noqa: F401  (registers the performance model's view)
import analysis.sanity  # noqa: F401  (registers the sanity flags, every report's first section)
import analysis.study_j  # noqa: F401  (registers Study J's views)
import analysis.study_n  # noqa: F401  (registers Study N's views)
from analysis.html import markdown_to_html
from analysis.measure import PROTOCOLS, Histories, cell_key, finished
from analysis.runs import Row, latest_per_point, write_runs_csv
from analysis.speedup import cell_speedups
from analysis.tables import Table
from analysis.views import DEFAULT_VIEWS, VIEWS, Context, NotRun, Section
from suite.errors import ConfigError, OneLineParser
from suite.paths import config_file, results_dir
from suite.records.store import Store
from suite.sweep.sweep_files import sweep_file


@dataclass(frozen=True)
class Report:
    directory: Path
    files: list[Path]
    summary: str  # for the terminal: the first view the sweep file names, and how many points the flags name
    rows: list[Row]  # its points
    # each finished run's point's speedup interval (the speedup table's), by run id: what MLflow's runs table shows
    speedup_bounds: dict[str, tuple[float, float]] = field(default_factory=dict)


def _sweep_section(sweep: str | None, key: str, empty):
    """A section of conf/sweep/<sweep>.yaml as plain data; `empty` without the file or the section."""
    if not sweep or not config_file(f"sweep/{sweep}.yaml").exists():
        return empty
    section = sweep_file(sweep).get(key)
    return OmegaConf.to_container(section) if section else empty


def report_settings(sweep: str | None) -> dict:
    """The `report` section of conf/sweep/<sweep>.yaml ({} without one), checked."""
    settings = _sweep_section(sweep, "report", {})
    unknown = [v for v in settings.get("views", []) if v not in VIEWS]
    if unknown:
        raise ConfigError(f"sweep {sweep}: report.views {', '.join(unknown)} unknown (known: {', '.join(VIEWS)})")
    if settings.get("timing", "suite") not in PROTOCOLS:
        raise ConfigError(f"sweep {sweep}: report.timing={settings['timing']} is not one of {', '.join(PROTOCOLS)}")
    return settings


def study_settings_table(experiment: str, sweep: str | None) -> Table | None:
    """The caption of a study's report: the settings its sweep runs unlike the suite's defaults, with their sources
    (the sweep file's `study_settings`); None for a sweep that lists none."""
    settings = _sweep_section(sweep, "study_settings", [])
    if not settings:
        return None
    return Table("study_settings", f"{experiment}: settings this sweep runs unlike the suite's defaults",
                 ["setting", "source"], [[s["setting"], s["source"]] for s in settings])


def write_report(store: Store, experiment: str, run_ids: set[str] | None = None, out_dir: Path | None = None,
                 sweep: str | None = None, not_run: list[NotRun] | None = None) -> Report:
    """Every view the sweep file names (else the defaults) over the experiment's points (only `run_ids`, when
    given), written under out_dir (default results/reports/<experiment>)."""
    settings = report_settings(sweep or experiment)
    directory = out_dir or results_dir() / "reports" / experiment
    directory.mkdir(parents=True, exist_ok=True)
    runs = [r for r in store.runs(experiment) if run_ids is None or r.info.run_id in run_ids]
    sections, rows, bounds = [], [], {}
    if runs:  # without, nothing is read: a store that does not exist is not created
        ctx = Context(experiment, latest_per_point(runs), Histories(store.client), store.client, directory,
                      settings.get("timing", "suite"), tuple(settings.get("extension", ())), settings.get("claims"),
                      settings.get("miniature"), not_run or [])
        views = ["sanity", *(v for v in settings.get("views", DEFAULT_VIEWS) if v != "sanity")]
        sections, rows = ([VIEWS[name](ctx) for name in views] if ctx.rows else []), ctx.rows
        intervals = cell_speedups(rows, ctx.histories, ctx.protocol)
        bounds = {row.run_id: (intervals[cell_key(row)].low, intervals[cell_key(row)].high)
                  for row in finished(rows) if cell_key(row) in intervals}
    caption = study_settings_table(experiment, sweep or experiment)
    index, page = directory / "report.md", directory / "report.html"
    index.write_text(f"# {experiment}\n\n" + (caption.markdown() + "\n\n" if caption else "")
                     + "\n\n".join(f"## {s.title}\n\n{s.markdown.removeprefix(f'### {s.title}').lstrip()}"
                                    for s in sections) + "\n")
    page.write_text(markdown_to_html(index.read_text(), directory, experiment))
    files = [index, page, *(caption.write(directory) if caption else []),
             *(path for s in sections for path in s.files), *([write_runs_csv(runs, directory / "runs.csv")]
                                                              if runs else [])]
    return Report(directory, files, terminal_summary(sections, index), rows, bounds)


def terminal_summary(sections: list[Section], index: Path) -> str:
    """The first view the sweep file names (the sanity flags come before it in report.md), and a line saying how many
    points the flags name."""
    if not sections:
        return "(no runs)"
    sanity, *chosen = sections
    flagged = sum(line.startswith("| ") for line in sanity.markdown.splitlines()) - 1  # less the header
    note = f"\n\n{flagged} point(s) flagged: see \"Sanity flags\" in {index}" if flagged > 0 else ""
    return (chosen[0].markdown if chosen else sanity.markdown) + note


def check_experiment(store: Store, experiment: str) -> None:
    """Raise ConfigError unless the store holds runs of `experiment`: naming the known sweeps where it is not one,
    else the experiments that have runs (hand-run points are `adhoc`'s)."""
    if experiment not in store.experiment_names():
        sweep_file(experiment)
    if not store.runs(experiment):
        recorded = sorted(name for name in store.experiment_names() if store.runs(name))
        raise ConfigError(f"no runs of {experiment} recorded in {store.uri}: points run without a sweep (`suite run "
                          f"...`) are recorded under adhoc; experiments with runs: {', '.join(recorded) or 'none'} "
                          "(`make report SWEEP=<name>`)")


def main(argv: list[str]) -> int:
    parser = OneLineParser(prog="suite report", description=__doc__)
    parser.add_argument("experiment", help="MLflow experiment (a sweep's name, or 'adhoc')")
    parser.add_argument("--tracking-uri", default=None)
    args = parser.parse_args(argv)
    try:
        store = Store(args.tracking_uri, create=False)
        check_experiment(store, args.experiment)
        report = write_report(store, args.experiment)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(report.summary)
    print(f"wrote {len(report.files)} file(s) to {report.directory}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
