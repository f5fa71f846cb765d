"""Published GPU measurements as suite points: each record of a records file mapped onto the suite's datasets,
networks, catalog clusters and strategies, planned as a sweep plans it, or listed with the reason it cannot be.

    python -m suite.tools.published [FILE ...] [--assumptions]

FILE defaults to the open set: analysis/published/gpu_measurements.yaml (the shared records, unchanged) and
gpu_measurements_added.yaml beside it (the records this project added, each with its citation); any files of the
schema will do (analysis/published/README.md), their records' ids unique across them. Per record: `<id>:
<overrides>` (what `python -m suite` or `make predict ARGS=...` takes), or `<id>: cannot: <reason>`; with
--assumptions, under each point the defaults taken for what its record leaves unstated. Then the count: records the
suite can express, and the rest by their first reason. A malformed record is one line naming the file, the record
and the key, exit 2. Nothing is profiled, priced or launched.
"""

from __future__ import annotations

import argparse
import sys

from suite.errors import ConfigError, OneLineParser
from suite.paths import REPO_ROOT
from suite.published.mapping import EXPRESSIBLE, Mapped, counts, plan_records
from suite.published.records import MalformedRecord, load, stated_elsewhere

RECORDS = REPO_ROOT / "analysis" / "published" / "gpu_measurements.yaml"
ADDED_RECORDS = RECORDS.with_name("gpu_measurements_added.yaml")
OPEN_SET = (str(RECORDS), str(ADDED_RECORDS))
# What other sources by a record's authors state of its run where the record leaves it null (records.stated_elsewhere)
STATED_ELSEWHERE = RECORDS.with_name("stated_elsewhere.yaml")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", default=list(OPEN_SET), help="published-measurements files")
    parser.add_argument("--assumptions", action="store_true",
                        help="list the defaults taken for what each record leaves unstated")
    return parser.parse_args(argv)


def record_lines(m: Mapped, assumptions: bool) -> list[str]:
    if not m.expressible:
        return [f"{m.record.id}: cannot: {'; '.join(map(str, m.reasons))}"]
    lines = [f"{m.record.id}: {' '.join(m.overrides)}"]
    return lines + ([f"    assumed: {a}" for a in m.assumptions] if assumptions else [])


def summary_lines(planned: list[Mapped]) -> list[str]:
    """The count: points, then each reason's records (as the first reason: these add up to the rest; among the
    reasons: what lifting that one limit alone would not be enough for)."""
    lines = [f"{len(planned)} records: {sum(m.expressible for m in planned)} expressible as suite points; the rest "
             "by reason (first reason / among its reasons):"]
    lines += [f"  {first:4d} / {among:4d}  {kind}" for kind, (first, among) in counts(planned).items()
              if kind != EXPRESSIBLE]
    return lines


def load_planned(paths: list[str]) -> list[Mapped] | None:
    """The records of the files, with what STATED_ELSEWHERE states of them, mapped and planned; None after one
    `error:` line where a file is malformed or two files hold one id."""
    try:
        records, where = [], {}
        for path in paths:
            for record in load(path):
                if record.id in where:
                    raise MalformedRecord(f"{path}: record {record.id}: its id is {where[record.id]}'s too")
                where[record.id] = path
                records.append(record)
        return plan_records(stated_elsewhere(records, STATED_ELSEWHERE))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return None


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    planned = load_planned(args.files)
    if planned is None:
        return 2
    for m in planned:
        print("\n".join(record_lines(m, args.assumptions)))
    print()
    print("\n".join(summary_lines(planned)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
