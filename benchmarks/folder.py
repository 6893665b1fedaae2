"""`folder`: does `make run ARGS="--dataset_source folder:PATH"` reach, with the defaults, the
accuracy the data allows?

For each variant of `benchmarks.charfolder` (`clean`, `hard`), rendered with a fixed seed, two
local runs (`common.local_run`), each with its own runs folder and registry (no champion):
1. defaults: `--dataset_source folder:PATH` and nothing else (up to 30 epochs, early stopping
   after 5, the best epoch exported);
2. reference: the same with `--epochs 60 --early_stopping_patience 0`: "as much training as the
   data can use" for this backbone.

The figure is each run's `test_accuracy` on the folder's own `test/` images. Ratio: the
defaults' mean test accuracy / the reference's. Goal: on every variant the defaults end within
`TOLERANCE` of the reference (one test image in 128 is 0.008).
"""

from __future__ import annotations

import shutil
import statistics
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks import charfolder
from benchmarks.common import local_run, make_result, say

NAME = "folder"
VARIANTS = ("clean", "hard")
SEED = 0
"""The rendering's seed (the pipeline's own `--seed` stays at its default)."""
REFERENCE_FLAGS = ("--epochs", "60", "--early_stopping_patience", "0")
TOLERANCE = 0.02
GOAL = {
    "description": f"with the defaults, test accuracy within {TOLERANCE} of a 60-epoch run without "
    "early stopping, on every folder",
    "tolerance": TOLERANCE,
}


class FolderBenchmarkError(RuntimeError):
    """A run failed or left no metrics."""


def run_figures(summary: Mapping[str, Any], wall_seconds: float) -> dict[str, Any]:
    """One run's figures from its summary.json."""
    if summary.get("status") != "SUCCEEDED":
        raise FolderBenchmarkError(f"the run ended {summary.get('status')}: {summary.get('error')}")
    metrics = summary.get("metrics") or {}
    if "test_accuracy" not in metrics:
        raise FolderBenchmarkError(f"the run's summary has no test_accuracy: {sorted(metrics)}")
    parameters = summary.get("parameters") or {}
    return {
        "test_accuracy": float(metrics["test_accuracy"]),
        "macro_f1": metrics.get("macro_f1"),
        "epochs": parameters.get("epochs"),
        "early_stopping_patience": parameters.get("early_stopping_patience"),
        "epochs_completed": metrics.get("epochs_completed"),
        "best_epoch": metrics.get("best_epoch"),
        "stopped_early": metrics.get("stopped_early"),
        "promoted": bool((summary.get("gate") or {}).get("promote")),
        "wall_seconds": round(wall_seconds, 2),
    }


def build_result(
    variants: Mapping[str, Mapping[str, Mapping[str, Any]]],
    *,
    inputs: Mapping[str, Any],
    wall_seconds: float,
    machine: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The result from each variant's `defaults` and `reference` run figures."""
    if not variants:
        raise FolderBenchmarkError("no variant ran")
    gaps = {
        name: round(runs["reference"]["test_accuracy"] - runs["defaults"]["test_accuracy"], 4)
        for name, runs in variants.items()
    }
    defaults = statistics.fmean(runs["defaults"]["test_accuracy"] for runs in variants.values())
    reference = statistics.fmean(runs["reference"]["test_accuracy"] for runs in variants.values())
    summary = "; ".join(
        f"{name}: defaults {runs['defaults']['test_accuracy']:.3f} in {runs['defaults']['epochs_completed']} "
        f"epochs ({runs['defaults']['wall_seconds']:.0f}s) vs 60 epochs {runs['reference']['test_accuracy']:.3f} "
        f"({runs['reference']['wall_seconds']:.0f}s)"
        for name, runs in variants.items()
    )
    return make_result(
        NAME,
        inputs=inputs,
        figures={
            "variants": {k: dict(v) for k, v in variants.items()},
            "gaps": gaps,
            "wall_seconds": round(wall_seconds, 2),
        },
        ratio=defaults / reference if reference > 0 else None,
        goal=GOAL,
        goal_met=all(gap <= TOLERANCE for gap in gaps.values()),
        machine=machine,
        summary=summary,
    )


def run(work: Path, results_dir: Path) -> dict[str, Any]:
    started = time.perf_counter()
    root = work / "folder"
    variants: dict[str, dict[str, dict[str, Any]]] = {}
    for name in VARIANTS:
        data = root / f"{name}-seed{SEED}"
        if not data.exists():  # rendered once, kept between benchmark runs (build/ is git-ignored)
            say(f"folder: rendering the {name} folder into {data}")
            partial = data.with_suffix(".partial")
            shutil.rmtree(partial, ignore_errors=True)
            charfolder.render(partial, name, SEED).rename(data)
        variants[name] = {}
        for side, flags in (("defaults", ()), ("reference", REFERENCE_FLAGS)):
            say(f"folder: {name}: {side} run")
            runs = root / "runs" / f"{name}-{side}"
            shutil.rmtree(runs, ignore_errors=True)
            done = local_run(
                runs, "--dataset_source", f"folder:{data}", *flags, log=root / "logs" / f"{name}-{side}.log"
            )
            figures = run_figures(done.summary, done.wall_seconds)
            variants[name][side] = figures
            say(
                f"folder: {name}: {side}: test accuracy {figures['test_accuracy']:.4f} after "
                f"{figures['epochs_completed']} epochs (exported {figures['best_epoch']}) in {figures['wall_seconds']:.0f}s"
            )
    inputs = {
        "command": "make run (local target, default parameters) with --dataset_source folder:PATH; the "
        f"reference adds {' '.join(REFERENCE_FLAGS)}",
        "folders": {
            name: {
                "classes": list(charfolder.CLASSES),
                "train_per_class": charfolder.VARIANTS[name].train_per_class,
                "test_per_class": charfolder.VARIANTS[name].test_per_class,
                "render_seed": SEED,
            }
            for name in VARIANTS
        },
    }
    return build_result(variants, inputs=inputs, wall_seconds=time.perf_counter() - started)
