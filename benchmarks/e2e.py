"""`e2e`: the local `make run` wall time, step by step.

NOT YET IMPLEMENTED. `make run` (the pipeline's local target) does not exist yet; this
benchmark is added with it. Until then the runner skips it without failing, writes no result
file, and the table in BENCHMARKS.md says "not yet implemented".

# TODO(e2e): implement `run` once `make run` exists: run the local pipeline on the benchmark's
# cassava-like source (`fixtures.cassava_source`), time each step of the DAG (build, prepare,
# tune, train, evaluate, upload) and the whole, and return
# `make_result("e2e", inputs=..., figures={"steps_seconds": {...}, "total_seconds": ...},
# ratio=None, goal=GOAL, goal_met=None, summary=...)`; then set IMPLEMENTED = True.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

NAME = "e2e"
IMPLEMENTED = False
NOT_IMPLEMENTED = "not yet implemented (arrives with `make run`)"
GOAL = {"description": "none set; reported for tracking"}


def run(work: Path, results_dir: Path) -> dict[str, Any]:
    raise NotImplementedError(f"benchmark e2e: {NOT_IMPLEMENTED}")
