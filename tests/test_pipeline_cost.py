"""Machine starts on the critical path, counted from the compiled templates (pipeline/cost.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipeline import cost

ROOT = Path(__file__).resolve().parents[1]


def _spec(
    tasks: dict[str, dict[str, Any]], executors: dict[str, dict[str, Any]], components: dict[str, Any]
) -> dict[str, Any]:
    return {
        "root": {"dag": {"tasks": tasks}},
        "components": components,
        "deploymentSpec": {"executors": executors},
    }


def _task(component: str, after: tuple[str, ...] = (), condition: str = "") -> dict[str, Any]:
    task: dict[str, Any] = {"componentRef": {"name": component}, "dependentTasks": list(after)}
    if condition:
        task["triggerPolicy"] = {"condition": condition}
    return task


STEP: dict[str, Any] = {"container": {"image": "python", "command": ["sh", "-ec", "..."]}}
JOB: dict[str, Any] = {
    "container": {"image": "gcpc", "command": ["python3", "-u", "-m", cost.JOB_LAUNCHERS[0]]}
}
IMPORTER: dict[str, Any] = {"importer": {"artifactUri": {}}}
TUNE = "inputs.parameter_values['pipelinechannel--tune'] == true"


def test_each_kind_of_step_costs_what_the_rule_says() -> None:
    components = {
        "c-step": {"executorLabel": "e-step"},
        "c-job": {"executorLabel": "e-job"},
        "c-imp": {"executorLabel": "e-imp"},
    }
    executors = {"e-step": STEP, "e-job": JOB, "e-imp": IMPORTER}
    tasks = {
        "a": _task("c-step"),
        "b": _task("c-imp", ("a",)),
        "c": _task("c-job", ("b",)),
        "side": _task("c-step"),  # in parallel: not on the critical path
    }
    assert cost.critical_path(_spec(tasks, executors, components), {}) == (3, ["a", "c"])


def test_conditions_follow_the_scenario_and_count_the_worst_case_otherwise() -> None:
    components = {
        "c-step": {"executorLabel": "e-step"},
        "c-job": {"executorLabel": "e-job"},
        "c-tuning": {"dag": {"tasks": {"t1": _task("c-step"), "t2": _task("c-job", ("t1",))}}},
        "c-gate": {"dag": {"tasks": {"g": _task("c-step")}}},
    }
    executors = {"e-step": STEP, "e-job": JOB}
    tasks = {
        "first": _task("c-step"),
        "tuning": _task("c-tuning", ("first",), TUNE),
        "plain": _task("c-step", ("first",), f"!({TUNE})"),
        "after": _task("c-step", ("tuning", "plain")),
        "gate": _task("c-gate", ("after",), "inputs.parameter_values['pipelinechannel--promote'] == true"),
    }
    spec = _spec(tasks, executors, components)
    assert cost.critical_path(spec, {"tune": False}) == (4, ["first", "plain", "after", "g"])
    assert cost.critical_path(spec, {"tune": True}) == (6, ["first", "t1", "t2", "after", "g"])


# The e-mail template's exit handler runs after everything: one more start.
@pytest.mark.parametrize(("template", "extra"), [("pipeline.json", 0), ("pipeline-notify.json", 1)])
def test_the_compiled_runs_never_wait_for_more_starts_than_measured(template: str, extra: int) -> None:
    """The budget (10 and 13; the DAG had 19 and 23 while every piece of bookkeeping was a step of
    its own): a new step on the critical path fails here. The chains are the steps the project
    is about, in order."""
    spec = json.loads((ROOT / "compiled" / template).read_text())
    report = cost.report(spec)
    for scenario, (starts, chain) in report.items():
        assert starts <= cost.BUDGET[scenario] + extra, f"{scenario}: {starts} starts: {' > '.join(chain)}"
    assert report["default"][1][:7] == [
        "build-trainer-image",
        "plan-jobs",
        "prepare-dataset",
        "train-model",
        "evaluate-models",
        "upload-model",
        "evaluate-model",
    ]
    assert report["tuned"][1][3:5] == ["tune-hyperparameters", "best-trial"]
