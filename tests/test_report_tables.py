"""Report tables as files: CSV that pandas reads as numbers (an interval's value, low, high and n apart, missing
values empty), markdown and LaTeX from the same cells, and a note saying what the intervals span."""

import io

import pandas as pd

from analysis.stats import REPEATS, estimate
from analysis.tables import Interval, Table, interval_cell


def table() -> Table:
    three = interval_cell(estimate([1.0, 1.5, 2.0], over=REPEATS))
    return Table("t", "epoch times & more_", ["point", "s/epoch [95% CI]", "CV", "MFU %", "note"],
                 [["a", three, "12.5%", "40.1", "x: 1 [0, 2]"], ["b", "-", "-", "-", ""],
                  ["c", "2.0", "1.0%", "7", "y"]])


def test_csv_columns_are_numbers_with_an_intervals_parts_apart_and_missing_values_empty():
    frame = pd.read_csv(io.StringIO(table().csv()))
    assert list(frame.columns) == ["point", "s/epoch", "s/epoch low", "s/epoch high", "s/epoch n", "CV", "MFU pct",
                                   "note"]
    numeric = ["s/epoch", "s/epoch low", "s/epoch high", "s/epoch n", "CV", "MFU pct"]
    assert all(pd.api.types.is_numeric_dtype(frame[c]) for c in numeric)
    a, b, c = frame.to_dict("records")
    assert a["s/epoch"] == 1.5 and a["s/epoch low"] < 1.5 < a["s/epoch high"] and a["s/epoch n"] == 3
    assert a["CV"] == 0.125 and a["MFU pct"] == 40.1
    assert all(pd.isna(b[col]) for col in numeric)  # `-` on screen, empty in CSV
    assert (c["s/epoch"], c["s/epoch low"], c["s/epoch high"], c["s/epoch n"]) == (2.0, 2.0, 2.0, 1)  # one sample


def test_markdown_and_latex_show_the_same_cells_and_say_what_the_intervals_span():
    t = table()
    markdown = t.markdown()
    assert "| a | 1.5 [" in markdown and "| b | - | - | - |  |" in markdown
    assert "Intervals: 95% t-interval over 3 repeats (1 cell)." in markdown
    latex = t.latex()
    assert r"\caption{epoch times \& more\_}" in latex and r"12.5\%" in latex and r"MFU \%" in latex
    assert latex.count(r"\toprule") == latex.count(r"\midrule") == latex.count(r"\bottomrule") == 1
    assert latex.split(r"\midrule")[1].count(r"\\") == 3


def test_an_interval_cell_is_the_value_alone_from_one_sample_and_a_dash_for_none():
    assert interval_cell(None) == "-" and interval_cell(estimate([2.0])) == "2"
    assert isinstance(interval_cell(estimate([2.0, 3.0])), Interval)


def test_a_figure_of_a_workload_whose_every_point_failed_says_why_and_warns_nothing():
    """Hostile inputs 3, case 8: matplotlib's 'No artists with labels found' stood beside a failed point's line, and
    the axes stood empty."""
    import warnings

    import matplotlib.pyplot as plt

    from analysis.plots import _legend
    from analysis.runs import Row

    failed = [Row(run_id=status, dataset="tokens", network="gpt2_tiny", strategy="ddp", workers=2, status=status,
                  epoch_time_s=None, throughput=None, peak_memory_mb=None, val_metric=None, val_value=None,
                  start_time=0, params={}, label="ddp", metrics={})
              for status in ("failed: rank 1: RuntimeError", "failed: rank 0: OSError", "oom: rank 0")]
    fig, ax = plt.subplots()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _legend(ax, failed)
    assert ax.get_legend() is None
    assert [t.get_text() for t in ax.texts] == [
        "nothing to draw: 2 failed, 1 oom\n(the report's status table has each point's error)"]
    ax.plot([1, 2], [1, 2], label="ddp")
    _legend(ax, failed)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["ddp"]
    plt.close(fig)
