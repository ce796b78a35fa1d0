"""The conversion report's tables and frontier (deamoe_trt.convert.report)."""

import pytest

from deamoe_trt.convert.report import frontier, frontier_plot_path, report_table, step_bytes_of
from deamoe_trt.errors import UsageError


def row(method, fraction, one, eight, perplexity):
    return {
        "method": method,
        "shared_fraction": fraction,
        "f_s": 1,
        "f_p": 1,
        "bytes_per_step": one,
        "bytes_vs_source": one / 100,
        "bytes_per_step_at": {"1": one, "4": (one + eight) / 2, "8": eight},
        "bytes_vs_source_at": {"1": one / 100, "4": (one + eight) / 200, "8": eight / 100},
        "relative_error": [0.1],
        "expert_agreement": [0.5],
        "perplexity": perplexity,
        "next_token_agreement": 0.9,
    }


ROWS = [
    row("source", 0.5, 100, 100, 10.0),
    row("converted", 0.5, 70, 50, 10.6),  # smaller than pruned at 8 tokens, larger at 1
    row("pruned experts", 0.5, 65, 65, 10.4),
    row("naive", 0.5, 70, 50, 11.0),  # as large as converted everywhere, worse: never on the frontier
]
REPORT = {
    "rows": ROWS,
    "source": {"layers": 1, "num_experts": 4, "expert_width": 8, "top_k": 2, "heldout_tokens": 10},
}


def test_frontier_keeps_the_rows_no_other_row_beats_on_both_bytes_and_quality():
    names = [r["method"] for r in ROWS]
    assert {names[i] for i in frontier(ROWS, 1)} == {"source", "pruned experts"}
    assert {names[i] for i in frontier(ROWS, 8)} == {"source", "converted", "pruned experts"}


def test_table_shows_bytes_and_the_frontier_at_the_asked_tokens_per_step():
    at_one, at_eight = report_table(REPORT, tokens=1), report_table(REPORT, tokens=8)
    assert "at 1 token(s) per step" in at_one and "at 8 token(s) per step" in at_eight
    converted_one = next(line for line in at_one.splitlines() if line.lstrip().startswith("converted"))
    converted_eight = next(line for line in at_eight.splitlines() if line.lstrip().startswith("converted"))
    assert "70.0%" in converted_one and not converted_one.rstrip().endswith("yes")
    assert "50.0%" in converted_eight and converted_eight.rstrip().endswith("yes")


def test_a_report_with_one_token_counts_only_refuses_other_counts():
    old = {k: v for k, v in ROWS[1].items() if not k.endswith("_at")}
    assert step_bytes_of(old, 1) == (70, 0.7)
    with pytest.raises(UsageError, match="one token per step only"):
        step_bytes_of(old, 4)


def test_frontier_plot_is_written_beside_the_report_plot(tmp_path):
    pytest.importorskip("matplotlib")
    from deamoe_trt.convert.report import write_frontier_plot

    path = write_frontier_plot(REPORT, frontier_plot_path(tmp_path / "r.png"))
    assert path == tmp_path / "r-frontier.png" and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
