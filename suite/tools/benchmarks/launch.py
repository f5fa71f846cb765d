"""Benchmark: the fixed cost of a point run here, from the driver's start to the point's run in MLflow.

`make bench-launch` runs one sweep of trivial points (DDP on 2 ranks, a 2-layer GPT on tiny synthetic
data, one training step, no warm-up, one evaluation batch; the points differ in their seed only)
through `python -m suite`, in a private results directory, with $SUITE_TIMING set: the driver and every
rank mark when each part of a point ends (`suite.launch_timing`). It prints where the seconds go, per
point and once per sweep. Rank parts end when the slowest rank ends them. The last line, `launch cost
per point`, is the driver's wall time over the number of points: the cost of a point that trains for
no time at all, its share of the sweep's start and end included.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from suite.launch_timing import ENV
from suite.paths import REPO_ROOT

# A model and data so small that its one step costs next to nothing: what remains is the fixed cost.
POINT = ["dataset=tokens", "dataset.vocab_size=512", "dataset.seq_len=32", "dataset.samples=32",
         "dataset.val_samples=16", "network=gpt2_tiny", "strategy=ddp", "workers=2", "batch_size=16", "epochs=1",
         "steps_per_epoch=1", "warmup_steps=0", "eval_batches=1"]
# (part, mark that ends it); a rank mark ends a part once every rank made it. Each part starts where the
# previous one ended, the first at the point's turn in the sweep.
PARTS = (
    ("skip check, point directory", "point_dir"),
    ("rank processes start", "started"),
    ("rank imports, config, strategy", "joining"),
    ("process-group init", "joined"),
    ("data, model, strategy build", "built"),
    ("first training step", "first_step"),
    ("evaluation, summary", "done"),
    ("ranks exit", "ranks_ended"),
    ("verdict, recording into MLflow", "recorded"),
)


def run_sweep(points: int, workdir: Path) -> tuple[float, list[dict]]:
    """Run the sweep; its wall time and its marks, with the driver's start and exit as `spawned` and `exited`."""
    marks_file = workdir / "marks.jsonl"
    env = {**os.environ, ENV: str(marks_file), "SUITE_RESULTS_DIR": str(workdir / "results")}
    env.pop("MLFLOW_TRACKING_URI", None)
    seeds = ",".join(str(seed) for seed in range(1, points + 1))
    start = time.time()
    driver = subprocess.run([sys.executable, "-m", "suite", "-m", *POINT, f"seed={seeds}"], cwd=REPO_ROOT,
                            env=env, capture_output=True, text=True)
    end = time.time()
    if driver.returncode != 0:
        raise RuntimeError(f"the sweep failed (exit code {driver.returncode}):\n{driver.stdout[-3000:]}"
                           f"{driver.stderr[-3000:]}")
    marks = [json.loads(line) for line in marks_file.read_text().splitlines()]
    return end - start, [{"event": "spawned", "time": start}, *marks, {"event": "exited", "time": end}]


def split_points(marks: list[dict]) -> list[dict[str, float]]:
    """The time each point's marks were made at (a rank mark: by its last rank), keyed by event."""
    points: list[dict[str, float]] = []
    for m in marks:
        if m["event"] == "point":
            points.append({})
        if points:
            points[-1][m["event"]] = max(points[-1].get(m["event"], 0.0), m["time"])
    return points


def part_seconds(point: dict[str, float]) -> list[float]:
    ends = [point[event] for _, event in PARTS]
    return [end - start for start, end in zip([point["point"], *ends], ends)]


def table(rows: list[tuple[str, list[float]]], header: list[str] | None = None) -> str:
    width = max(len(name) for name, _ in rows)
    lines = [f"{'':<{width}}" + "".join(f"{h:>10}" for h in header)] if header else []
    lines += [f"{name:<{width}}" + "".join(f"{v:>10.2f}" for v in values) for name, values in rows]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m suite.tools.benchmarks.launch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, default=5, help="points in the sweep (default 5)")
    args = parser.parse_args(argv)
    if args.points < 1:
        parser.error("--points must be at least 1")
    with tempfile.TemporaryDirectory() as workdir:
        wall, marks = run_sweep(args.points, Path(workdir))
    points = split_points(marks)
    by_point = [part_seconds(p) for p in points]
    totals = [p["recorded"] - p["point"] for p in points]
    rows = [(name, [*(seconds[i] for seconds in by_point), statistics.median(seconds[i] for seconds in by_point)])
            for i, (name, _) in enumerate(PARTS)]
    rows.append(("total per point", [*totals, statistics.median(totals)]))
    print(f"{len(points)} point(s): {' '.join(POINT)}, seeds 1..{len(points)} (seconds)\n")
    print(table(rows, [*(f"point {k}" for k in range(1, len(points) + 1)), "median"]))
    first = next(m["time"] for m in marks if m["event"] == "point")
    last = max(m["time"] for m in marks if m["event"] == "recorded")
    server = [m["time"] - points[0]["point_dir"] for m in marks if m["event"] == "fork_server_ready"]
    print("\nonce per sweep\n" + table([("driver start, planning", [first - marks[0]["time"]]),
                                        *([("fork server start (in point 1)", server)] if server else []),
                                        ("report, driver exit", [marks[-1]["time"] - last]),
                                        (f"driver wall time, {len(points)} point(s)", [wall])]))
    print(f"\nlaunch cost per point: {wall / len(points):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
