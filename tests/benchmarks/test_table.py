"""The BENCHMARKS.md table: rendered from result files, only between its markers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks import registry, table
from benchmarks.common import make_result

MACHINE = {"cpu_count": 2, "cpu_model": "Test CPU", "python": "3.11", "tensorflow": "2.21.0", "gpu": None}


def result(name: str, **overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "inputs": {},
        "figures": {},
        "ratio": None,
        "goal": {"description": "none set"},
        "goal_met": None,
        "machine": MACHINE,
        **overrides,
    }
    return make_result(name, **fields)


def rows(rendered: str) -> dict[str, str]:
    """Table rows keyed by benchmark name."""
    out = {}
    for line in rendered.splitlines()[2:]:
        name = line.split("`")[1]
        out[name] = line
    return out


def test_one_row_per_benchmark_in_order_with_what_each_result_says() -> None:
    results = {
        "input": result(
            "input",
            ratio=10.47,
            goal={"description": ">= 5x"},
            goal_met=True,
            summary="ours 7,986 img/s vs codelab 762 img/s",
        ),
        "gpu": result("gpu", skipped="no GPU", summary="no GPU on this machine"),
        "prepare": result("prepare", summary="synthetic 150 img/s", notes="no baseline"),
        "extra": result("extra", ratio=0.5, goal_met=False, summary="slower"),
    }
    rendered = table.render_table(results, registry.TITLES)
    by_name = rows(rendered)
    assert list(by_name) == [
        "input",
        "train",
        "gpu",
        "prepare",
        "e2e",
        "memory",
        "tuning",
        "folder",
        "extra",
    ]
    assert "ours 7,986 img/s vs codelab 762 img/s" in by_name["input"]
    assert "| 10.47x |" in by_name["input"] and "| yes |" in by_name["input"]
    assert "2 x Test CPU, no GPU" in by_name["input"]
    assert "no result yet: run `make bench BENCH=train`" in by_name["train"]
    assert "skipped: no GPU on this machine" in by_name["gpu"] and "not measured" in by_name["gpu"]
    assert "skipped: skipped" not in table.render_row(
        "gpu", "t", result("gpu", skipped="no GPU", summary="skipped: no GPU")
    )
    assert "synthetic 150 img/s. no baseline" in by_name["prepare"]
    assert "no result yet: run `make bench BENCH=e2e`" in by_name["e2e"]
    assert "| 0.50x |" in by_name["extra"] and "**no**" in by_name["extra"]
    for line in rendered.splitlines():
        assert line.count("|") == 8, line  # 7 cells: a pipe inside a cell is escaped


def test_pipes_in_text_are_escaped() -> None:
    rendered = table.render_table({"input": result("input", summary="a | b")}, {"input": "t"})
    assert "a \\| b" in rendered


def test_only_the_block_between_the_markers_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "BENCHMARKS.md"
    path.write_text(
        f"# Benchmarks\n\nintro\n\n{table.START}\nold table\n{table.END}\n\n## Findings\n\nkept\n",
        encoding="utf-8",
    )
    table.update_markdown(path, "| new |")
    text = path.read_text(encoding="utf-8")
    assert "old table" not in text
    assert f"{table.START}\n| new |\n{table.END}" in text
    assert text.startswith("# Benchmarks\n\nintro\n") and text.endswith("## Findings\n\nkept\n")
    table.update_markdown(path, "| new |")
    assert path.read_text(encoding="utf-8") == text  # idempotent


def test_a_file_without_markers_gets_the_table_appended(tmp_path: Path) -> None:
    path = tmp_path / "BENCHMARKS.md"
    path.write_text("# Notes\n\nhand-written\n", encoding="utf-8")
    table.update_markdown(path, "| t |")
    assert (
        path.read_text(encoding="utf-8") == f"# Notes\n\nhand-written\n\n{table.START}\n| t |\n{table.END}\n"
    )
    missing = tmp_path / "new.md"
    table.update_markdown(missing, "| t |")
    assert missing.read_text(encoding="utf-8").startswith("# Benchmarks\n")
