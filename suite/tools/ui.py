"""`make ui`: MLflow's UI on the suite's store, opened on a sweep's runs.

    python -m suite.tools.ui [--port 5000] [EXPERIMENT]

Prints the URL of the experiment's runs table (EXPERIMENT: a sweep's name; without one, the experiment of the latest
sweep invocation in the store), opens it where a browser can be opened, and runs `mlflow ui` on the store until
stopped. The URL opens MLflow's model-training pages (`workflowType=machine_learning`; MLflow 3 opens its GenAI ones
otherwise) on a view the suite saves in the experiment (a shared view state, the tag MLflow's own "Share" button
writes): the comparison columns shown (speedup and its interval, epoch time, samples/s, peak memory, status),
every sweep invocation's run expanded to its points, the runs sorted by name, which is each point's workload first
(`digits/resnet18/ddp/w2`). The invocation's run holds the sweep's params, summary metrics and report
(report/report.html shows the report with its figures)."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import webbrowser

from suite.records.store import Store, tracking_uri

LOOPBACK = "127.0.0.1"
VIEW_KEY = "suite"  # the shared view state's name: the URL's viewStateShareKey, the tag mlflow.sharedViewState.<key>
COLUMNS = [*(f"metrics.`{m}`" for m in ("speedup", "speedup_low", "speedup_high", "epoch_time_s_mean",
                                         "throughput_samples_s_mean", "peak_memory_mb")),
           "tags.`suite.status`"]


def save_view(store: Store, experiment_id: str) -> None:
    """The experiment's runs table as the suite shows it, saved as MLflow's shared view state (JSON in the tag)."""
    parents = [run.info.run_id for run in store.client.search_runs([experiment_id], "tags.`suite.sweep` != ''",
                                                                   max_results=50000)]
    # ordered by run name under the key of the UI's own "Run Name" sort (another key reads "Sort: undefined")
    view = {"orderByKey": "tags.`mlflow.runName`", "orderByAsc": True, "selectedColumns": COLUMNS,
            "runsExpanded": dict.fromkeys(parents, True)}
    store.client.set_experiment_tag(experiment_id, f"mlflow.sharedViewState.{VIEW_KEY}", json.dumps(view))


def runs_url(store: Store, experiment: str | None, port: int) -> str:
    """The UI's runs table of `experiment` (else of the latest sweep invocation's) in the suite's view (saved in
    the experiment); the UI's home without either."""
    home = f"http://{LOOPBACK}:{port}/"
    if store.empty():
        return home
    if experiment is None:
        sweeps = [run for name in store.experiment_names() for run in store.runs(name)
                  if "suite.sweep" in run.data.tags]
        if not sweeps:
            return home
        experiment_id = max(sweeps, key=lambda run: run.info.start_time).info.experiment_id
    else:
        found = store.client.get_experiment_by_name(experiment)
        if found is None:
            raise SystemExit(f"error: the store has no experiment {experiment} (known: "
                             f"{', '.join(store.experiment_names()) or 'none'})")
        experiment_id = found.experiment_id
    save_view(store, experiment_id)
    return f"{home}#/experiments/{experiment_id}/runs?workflowType=machine_learning&viewStateShareKey={VIEW_KEY}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiment", nargs="?", help="a sweep's name (default: the latest sweep's)")
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--print-only", action="store_true", help="print the URL, start no UI")
    args = parser.parse_args(argv)
    uri = tracking_uri()
    url = runs_url(Store(uri, create=False), args.experiment, args.port)
    print(f"MLflow UI: {url}", flush=True)
    if args.print_only:
        return 0
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--host", LOOPBACK, "--port", str(args.port),
                               "--backend-store-uri", uri])
    try:
        if (os.environ.get("DISPLAY") or sys.platform == "darwin") and listening(args.port, server):
            webbrowser.open(url)
        return server.wait()
    except KeyboardInterrupt:
        server.terminate()
        return server.wait()


def listening(port: int, server: subprocess.Popen, timeout_s: float = 60.0) -> bool:
    """Whether the UI answers on `port` within `timeout_s` (False as soon as its process has ended)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and server.poll() is None:
        with socket.socket() as probe:
            if probe.connect_ex((LOOPBACK, port)) == 0:
                return True
        time.sleep(0.5)
    return False


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
