"""What a compiled pipeline costs in machine starts on Vertex, counted from its template.

Every container step runs as a Vertex `CustomJob` of its own, on a fresh VM (Google's "Specify
the machine configuration for a pipeline step";
docs/architecture.md#the-critical-path-machine-starts-on-vertex): an importer, a condition or a
sub-DAG starts nothing (0); a container step one VM (1); a GCPC `CustomJob` or tuning launcher its
own VM, then the job's (2); GCPC's Dataflow Flex Template launcher its own, then the template's
launcher VM, then the job's workers (3: "Flex Templates",
https://cloud.google.com/dataflow/docs/guides/templates/using-flex-templates).

`critical_path(spec, scenario)` is the longest chain of starts through the DAG's dependencies,
nested DAGs included; a branch the scenario does not decide counts as taken (the worst case).
No public figure gives a start's duration: this module counts; it does not time.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

JOB_LAUNCHERS = (
    "google_cloud_pipeline_components.container.v1.custom_job.launcher",
    "google_cloud_pipeline_components.container.v1.hyperparameter_tuning_job.launcher",
)
DATAFLOW_LAUNCHER = "google_cloud_pipeline_components.container.preview.dataflow.flex_template.launcher"
# The runs `make compile` reports: the default one, one with tuning, one preparing on Dataflow.
SCENARIOS: dict[str, dict[str, bool | str]] = {
    "default": {"tune": False, "prepare_engine": "job"},
    "tuned": {"tune": True, "prepare_engine": "job"},
    "dataflow": {"tune": False, "prepare_engine": "beam"},
}
# The most starts a run may wait for; tests/test_pipeline_cost.py fails above it (each chain:
# docs/architecture.md#the-critical-path-machine-starts-on-vertex).
BUDGET = {"default": 10, "tuned": 13, "dataflow": 12}
_CONDITION = re.compile(
    r"^(!\()?inputs\.parameter_values\['pipelinechannel--([\w-]+)'\] == (true|'[^']*')\)?$"
)


def task_cost(spec: Mapping[str, Any], component: Mapping[str, Any]) -> int:
    """Machine starts of one non-DAG component (the rule above)."""
    executor = spec["deploymentSpec"]["executors"][component["executorLabel"]]
    container = executor.get("container")
    if container is None:  # an importer: the backend reads a URI, no VM
        return 0
    words = [*(container.get("command") or []), *(container.get("args") or [])]
    if any(DATAFLOW_LAUNCHER in word for word in words):
        return 3
    return 2 if any(launcher in word for word in words for launcher in JOB_LAUNCHERS) else 1


def _taken(task: Mapping[str, Any], scenario: Mapping[str, bool | str]) -> bool:
    match = _CONDITION.match(task.get("triggerPolicy", {}).get("condition", "").strip())
    if not match or match.group(2) not in scenario:
        return True  # unconditional, or not decided by the scenario: counted (worst case)
    wanted = True if match.group(3) == "true" else match.group(3).strip("'")
    holds = scenario[match.group(2)] == wanted
    return not holds if match.group(1) else holds


def critical_path(
    spec: Mapping[str, Any], scenario: Mapping[str, bool | str], dag: Mapping[str, Any] | None = None
) -> tuple[int, list[str]]:
    """(machine starts one after another, the tasks on that chain that start machines) of `dag`
    (default: the pipeline's root) in `scenario`."""
    tasks = (dag or spec["root"]["dag"])["tasks"]
    best: dict[str, tuple[int, list[str]]] = {}

    def longest(name: str) -> tuple[int, list[str]]:
        if name in best:
            return best[name]
        task = tasks[name]
        before = max(
            (longest(d) for d in task.get("dependentTasks", [])), default=(0, []), key=lambda x: x[0]
        )
        if not _taken(task, scenario):
            own: tuple[int, list[str]] = (0, [])
        else:
            component = spec["components"][task["componentRef"]["name"]]
            if "dag" in component:
                own = critical_path(spec, scenario, component["dag"])
            else:
                cost = task_cost(spec, component)
                own = (cost, [task.get("taskInfo", {}).get("name", name)] if cost else [])
        best[name] = (before[0] + own[0], before[1] + own[1])
        return best[name]

    return max((longest(name) for name in tasks), default=(0, []), key=lambda x: x[0])


def report(spec: Mapping[str, Any]) -> dict[str, tuple[int, list[str]]]:
    return {name: critical_path(spec, scenario) for name, scenario in SCENARIOS.items()}
