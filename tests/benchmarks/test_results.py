"""The result files' schema, and the committed results honour it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import registry
from benchmarks.common import (
    MACHINE_KEYS,
    RESULT_KEYS,
    RESULTS_DIR,
    load_results,
    machine_info,
    make_result,
    validate_result,
    write_result,
)


def valid() -> dict[str, Any]:
    return make_result(
        "input",
        inputs={"batch_size": 64},
        figures={"images_per_second": {"ours": 2.0, "codelab": 1.0}},
        ratio=2.0,
        goal={"description": ">= 5x", "min_ratio": 5.0},
        goal_met=False,
    )


def test_a_result_has_every_key_and_describes_the_machine() -> None:
    result = valid()
    assert set(RESULT_KEYS) <= set(result)
    assert set(MACHINE_KEYS) <= set(result["machine"])
    assert result["machine"]["cpu_count"] >= 1
    assert validate_result(result) == []
    assert set(MACHINE_KEYS) <= set(machine_info())


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"ratio": 0}, "ratio must be a positive number or null"),
        ({"ratio": "fast"}, "ratio must be a positive number or null"),
        ({"goal_met": "yes"}, "goal_met must be true, false or null"),
        ({"figures": []}, "figures must be an object"),
        ({"when": "yesterday"}, "when must be an ISO timestamp"),
        ({"skipped": ""}, "skipped, when present, must say why"),
        ({"machine": {"cpu_count": 2}}, "machine lacks 'cpu_model'"),
    ],
)
def test_malformed_results_are_named(change: dict[str, Any], problem: str) -> None:
    problems = validate_result({**valid(), **change})
    assert any(problem in p for p in problems), problems


def test_missing_keys_are_named() -> None:
    result = valid()
    del result["goal"]
    assert validate_result(result) == ["missing key 'goal'"]
    with pytest.raises(ValueError, match="malformed"):
        make_result("x", inputs={}, figures={}, ratio=-1.0, goal={}, goal_met=None)


def test_results_round_trip_through_their_file(tmp_path: Path) -> None:
    path = write_result(valid(), tmp_path)
    assert path == tmp_path / "input.json"
    assert load_results(tmp_path)["input"] == json.loads(path.read_text(encoding="utf-8"))
    with pytest.raises(ValueError, match="malformed"):
        write_result({**valid(), "ratio": -2}, tmp_path)


def test_committed_results_are_well_formed_and_named_after_their_benchmark() -> None:
    paths = sorted(RESULTS_DIR.glob("*.json"))
    for path in paths:
        result = json.loads(path.read_text(encoding="utf-8"))
        assert validate_result(result) == [], path
        assert result["name"] == path.stem
        assert result["name"] in registry.BENCHMARKS
        if result["ratio"] is not None and not result.get("skipped"):
            assert result["goal_met"] in (True, False, None)


def test_runs_disturbed_by_other_processes_are_flagged() -> None:
    from benchmarks.common import busy_note

    assert busy_note([{"other_cpu_share": 0.02}, {"other_cpu_share": None}, {}]) is None
    note = busy_note([{"other_cpu_share": 0.02}, {"other_cpu_share": 0.41}])
    assert note is not None and "up to 41% of the CPUs" in note
