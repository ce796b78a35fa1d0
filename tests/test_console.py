import io

import pytest

from deamoe_trt.console import Progress, format_bytes, format_table


def test_table_aligns_columns_under_their_headers():
    text = format_table(("name", "value"), [("a", 1), ("long name", 12345)], title="T")
    lines = text.splitlines()
    assert lines[0] == "T"
    assert len({len(line) for line in lines[1:]}) == 1
    assert lines[-1].endswith("12345") and lines[2].startswith("---------")


def test_bytes_use_decimal_units():
    assert (format_bytes(999), format_bytes(102_400), format_bytes(1.36e9)) == ("999 B", "102.40 KB", "1.36 GB")


def test_progress_in_a_log_prints_first_and_last_steps_not_every_step():
    stream = io.StringIO()
    progress = Progress(100, "work", stream=stream, log_interval=3600)
    for _ in range(100):
        progress.update("x")
    lines = stream.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == ["[1/100]", "[100/100]"]


def test_progress_can_be_silenced():
    stream = io.StringIO()
    progress = Progress(3, "work", stream=stream, enabled=False)
    progress.update()
    assert stream.getvalue() == "" and progress.done == 1


def test_table_aligns_text_columns_left_when_asked():
    text = format_table(("check", "found"), [("gpu", "none"), ("tensorrt", "10.3")], align="ll")
    lines = text.splitlines()
    assert lines[2] == "gpu       none"
    assert lines[3] == "tensorrt  10.3"
    with pytest.raises(ValueError, match="one of 'l'/'r' per column"):
        format_table(("a", "b"), [], align="l")


def test_markdown_table_rules_numbers_right_and_titles_above():
    text = format_table(("name", "value"), [("a", 1), ("long name", 12345)], title="T", markdown=True)
    assert text.splitlines() == ["T", "", "| name | value |", "| --- | ---: |", "| a | 1 |", "| long name | 12345 |"]
