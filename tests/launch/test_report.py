"""report.html with class names and class counts a user's folder can have: names that look like
matplotlib math, and more classes than a picture can hold."""

from __future__ import annotations

import random
import re
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from launch import report

SUMMARY: dict[str, Any] = {
    "pipeline": "p",
    "run_id": "r1",
    "target": "local",
    "status": "SUCCEEDED",
    "wall_seconds": 1.0,
    "steps": [],
    "model": None,
}


@pytest.mark.parametrize("name", ["a$^$b", "$x_1$", "cost $5 & <b>", r"back\slash$"])
def test_class_names_that_look_like_math_are_drawn_as_text(tmp_path: Path, name: str) -> None:
    """matplotlib parses `$...$` in a label as mathtext: `a$^$b` raised while the page was drawn."""
    labels = [name, "plain"]
    png = report.confusion_png(labels, [[3, 1], [0, 4]])
    assert png  # drawn
    page = report.write_report(
        tmp_path / "r.html",
        SUMMARY,
        {"confusion_matrix": {"labels": labels, "matrix": [[3, 1], [0, 4]]}},
        None,
    ).read_text()
    assert "data:image/png" in page


def test_a_thousand_classes_get_a_table_of_the_largest_confusions_not_a_picture(tmp_path: Path) -> None:
    n = 1000
    rng = random.Random(0)
    labels = [f"class{i:04d}" for i in range(n)]
    matrix = [[0] * n for _ in range(n)]
    for i in range(n):
        matrix[i][i] = 5
        matrix[i][rng.randrange(n)] += 1
    matrix[7][3] = 40  # the largest confusion, listed first
    tracemalloc.start()
    page = report.write_report(
        tmp_path / "r.html", SUMMARY, {"confusion_matrix": {"labels": labels, "matrix": matrix}}, None
    ).read_text()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 200 * 2**20, f"drawing the report for {n} classes took {peak / 2**20:.0f} MiB"
    assert "data:image/png" not in page
    assert f"{n} classes: the picture is drawn for at most {report.MAX_DRAWN_CLASSES}" in page
    rows = re.findall(r"<tr><td>(class\d+)</td><td>(class\d+)</td><td>(\d+)</td></tr>", page)
    assert len(rows) == report.TOP_CONFUSIONS
    assert rows[0] == ("class0007", "class0003", "40")
    counts = [int(c) for _, _, c in rows]
    assert counts == sorted(counts, reverse=True)
    with pytest.raises(ValueError, match="at most"):
        report.confusion_png(labels, matrix)


def test_top_confusions_skip_the_diagonal_and_empty_cells() -> None:
    assert report.top_confusions(["a", "b", "c"], [[9, 2, 0], [0, 9, 5], [1, 0, 9]], n=5) == [
        ("b", "c", 5),
        ("a", "b", 2),
        ("c", "a", 1),
    ]


def test_the_picture_is_drawn_up_to_the_limit(tmp_path: Path) -> None:
    n = report.MAX_DRAWN_CLASSES
    labels = [f"c{i}" for i in range(n)]
    matrix = [[1 if i == j else 0 for j in range(n)] for i in range(n)]
    page = report.write_report(
        tmp_path / "r.html", SUMMARY, {"confusion_matrix": {"labels": labels, "matrix": matrix}}, None
    ).read_text()
    assert "alt='confusion matrix'" in page


@pytest.mark.parametrize("error", [RuntimeError("no picture today"), KeyboardInterrupt()])
def test_a_report_that_cannot_be_drawn_is_recorded_in_the_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    """Both targets' writers (launch.cli, launch.vertexrun): summary.json first, the report's failure in it."""
    import json

    def broken(*args: Any) -> None:
        raise error

    monkeypatch.setattr(report, "write_report", broken)
    summary = dict(SUMMARY)
    report.write_json(tmp_path / "summary.json", summary)
    report.draw_report(tmp_path, summary, None, None)
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["report"] is None and written["report_error"] == summary["report_error"]
    assert summary["report_error"] in ("RuntimeError: no picture today", "KeyboardInterrupt")
    assert not list(tmp_path.glob(".*.partial"))


def test_write_json_raises_when_the_summary_cannot_be_written(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        report.write_json(tmp_path / "missing" / "summary.json", dict(SUMMARY))
