"""`make validate-published`: the performance model scored against published GPU measurements, with nothing
calibrated: each record mapped onto a suite point (suite.published.mapping), priced (suite.predict), and compared
with its published figure; then the error per metric, strategy family, GPU type and source, the order of layouts
within each source table (per source first, every record together last), the predicted memory per GPU against what
records state (per source, and whether the model says it fits: a record ran, so it fits), each record, and the GPU
pricing issue's targets beside what is reached.

    python -m suite.tools.validate_published [FILE ...] [--json]

FILE defaults to the open set (analysis/published/gpu_measurements.yaml and gpu_measurements_added.yaml); any files
of its schema will do (analysis/published/README.md). Per record: id, published value, prediction, signed error
(predicted / published - 1), source; a record the suite cannot express or price is listed with its reason.
`--json`: one JSON object per line for each record's primary metric, and one with `metric: memory_gb_per_gpu` where
the record states its memory per GPU, each with `id`, `metric`, `published`, `predicted` (null, with `reason`, where
it cannot price), in the record's units, and `fits` (the model's: whether the point fits its GPU). A malformed
record is one line naming the file, the record and the key, exit 2, before anything is priced.
"""

from __future__ import annotations

import argparse
import json
import sys

from analysis.published_score import Scored, score_record, summary_tables, targets
from analysis.tables import Table
from suite.errors import OneLineParser
from suite.predict.predictor import predict
from suite.tools.published import OPEN_SET, load_planned


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", default=list(OPEN_SET), help="published-measurements files")
    parser.add_argument("--json", action="store_true", help="one JSON object per record and metric")
    return parser.parse_args(argv)


def _number(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"


def records_table(scored: list[Scored]) -> Table:
    rows = [[s.record.id, s.metric, _number(s.published), _number(s.predicted),
             "" if s.error is None else f"{s.error:+.1%}", s.record.source.ref or s.record.prefix,
             s.reason or ""] for s in scored]
    return Table("published_records", "Published GPU measurements against the model's prediction",
                 ["record", "metric", "published", "predicted", "error", "source", "not priced because"], rows)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    planned = load_planned(args.files)
    if planned is None:
        return 2
    scored: list[Scored] = []
    for k, mapped in enumerate(planned, 1):
        if mapped.expressible:
            print(f"[{k}/{len(planned)} {mapped.record.id}]", file=sys.stderr, flush=True)
        scored += score_record(mapped, predict)
    if args.json:
        for s in scored:
            print(json.dumps(s.as_json()))
        return 0
    for table in summary_tables(scored):
        print(table.markdown())
        print()
    print(records_table(scored).markdown())
    print("\nTargets (the GPU pricing issue's):")
    print("\n".join(f"  {line}" for line in targets(scored)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
