"""Tables and plots of an experiment: `python -m analysis.report <experiment>`."""

from __future__ import annotations

import argparse
from pathlib import Path

from analysis.plots import plot_convergence, plot_speedup
from analysis.runs import latest_per_point
from analysis.speedup import speedup_table
from suite.paths import results_dir
from suite.records.store import Store


def write_report(store: Store, experiment: str, run_ids: set[str] | None = None,
                 out_dir: Path | None = None) -> tuple[str, list[Path]]:
    """Markdown speedup table (returned and written) and PNG plots for the experiment's points."""
    out_dir = out_dir or results_dir() / "reports"
    runs = [r for r in store.runs(experiment) if run_ids is None or r.info.run_id in run_ids]
    rows = latest_per_point(runs)
    table = speedup_table(rows)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = [out_dir / f"{experiment}.md"]
    files[0].write_text(f"# {experiment}\n\n{table}\n")
    if rows:
        files.append(plot_speedup(rows, out_dir / f"{experiment}_speedup.png"))
        files.append(plot_convergence(rows, store.client, out_dir / f"{experiment}_convergence.png"))
    return table, files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("experiment", help="MLflow experiment (a sweep's name, or 'adhoc')")
    parser.add_argument("--tracking-uri", default=None)
    args = parser.parse_args()
    table, files = write_report(Store(args.tracking_uri), args.experiment)
    print(table)
    for path in files:
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
