"""`e2e`: the local `make run` wall time, step by step.

`common.local_run` with the default local parameters (synthetic data through the real TFDS cassava
builder, the tiny backbone at 64 px, one chief and one worker) into a fresh runs folder and
registry: the command's wall time and each step's seconds. No baseline: the codelab has no
pipeline to run end to end. Goal: within 120 s on 2 cores.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import local_run, make_result

NAME = "e2e"
GOAL_SECONDS = 120.0
GOAL = {
    "description": f"the default local run within {GOAL_SECONDS:.0f} s on 2 cores",
    "max_seconds": GOAL_SECONDS,
}


def run(work: Path, results_dir: Path) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-e2e-", dir=work) as tmp:
        done = local_run(Path(tmp), log=work / "logs" / "e2e.log")
    summary, wall = done.summary, done.wall_seconds
    steps = {s["name"]: s["seconds"] for s in summary["steps"]}
    slowest = ", ".join(f"{n} {s:.0f}s" for n, s in sorted(steps.items(), key=lambda kv: -kv[1])[:3])
    return make_result(
        NAME,
        inputs={
            "command": "make run (local target, default parameters)",
            "parameters": summary["parameters"],
        },
        figures={
            "wall_seconds": round(wall, 2),
            "pipeline_seconds": summary["wall_seconds"],
            "startup_seconds": round(wall - summary["wall_seconds"], 2),
            "steps_seconds": steps,
            "test_accuracy": summary["metrics"].get("test_accuracy"),
        },
        ratio=None,
        goal=GOAL,
        goal_met=wall <= GOAL_SECONDS,
        summary=f"{wall:.0f}s wall (pipeline {summary['wall_seconds']:.0f}s); slowest: {slowest}",
    )
