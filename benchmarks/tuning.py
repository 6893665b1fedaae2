"""`tuning`: does `make run ARGS="--tune true"` end at or above the untuned run?

Each repetition (one per seed in `SEEDS`), in a fresh runs folder and registry
(`common.local_run`), runs the default local run with `--seed` (version 1, the champion), then the
same with `--tune true` into the same registry: its `evaluate-models` job evaluates the tuned model
(challenger) and version 1 (champion) side by side on its test split. The figures compared are
that evaluation's (run 2's `version.json`, `evaluation.models.{challenger,champion}`): both models
on the same images.

Ratio: mean tuned / mean untuned accuracy. The comparison is the gate's (`trainer.pairedstats`,
evaluation.json's `comparison`): per repetition the paired accuracy difference, its 95% bootstrap
interval and McNemar's p. Goal: never significantly worse (the interval's upper end at least 0)
in any repetition; "significantly better" (the lower end above 0) is reported beside.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import LocalRun, busy_note, local_run, make_result, say

NAME = "tuning"
SEEDS = (42, 43)
"""One repetition per seed: 42 is the pipeline's default (repetition 1 is exactly `make run`)."""
MAX_REPETITION_SECONDS = 300.0
"""A repetition slower than this skips the rest (the benchmark stays within about 10 minutes)."""
METRIC = "accuracy"
TUNING_PARAMETERS = ("max_trial_count", "parallel_trial_count", "search_algorithm", "search_space")
"""The tuned run's tuning parameters (its defaults: recorded, not set)."""
GOAL = {
    "description": "tuned not significantly worse than untuned on the same test split (the paired 95% "
    "interval of the accuracy difference reaches 0), in every repetition",
    "metric": METRIC,
    "every_repetition": True,
}


class TuningBenchmarkError(RuntimeError):
    """A run failed or did not leave what the comparison needs."""


def trials_table(tuning: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The tuning job's trials, compact: id, state, parameters, final objective value."""
    out = []
    for trial in (tuning or {}).get("trials") or []:
        final = (trial.get("finalMeasurement") or {}).get("metrics") or []
        out.append(
            {
                "id": str(trial.get("id")),
                "state": trial.get("state"),
                "parameters": {p["parameterId"]: p["value"] for p in trial.get("parameters") or []},
                "value": final[0]["value"] if final else None,
            }
        )
    return out


def _side(evaluation: Mapping[str, Any], side: str) -> dict[str, Any]:
    figures = (evaluation.get("models") or {}).get(side)
    if not figures:
        raise TuningBenchmarkError(f"version.json's evaluation has no {side!r} figures: {evaluation!r}")
    return {
        "accuracy": float(figures["accuracy"]),
        "macro_f1": float(figures["macro_f1"]),
        "examples": int(figures["examples"]),
    }


def _succeeded(launch: LocalRun, what: str) -> dict[str, Any]:
    summary = launch.summary
    if summary.get("status") != "SUCCEEDED":
        raise TuningBenchmarkError(
            f"the {what} run ended {summary.get('status')}: {summary.get('error')} (log: {launch.log})"
        )
    if not summary.get("model"):
        raise TuningBenchmarkError(f"the {what} run registered no model (log: {launch.log})")
    return summary


def _run_figures(evaluated: Mapping[str, Any], launch: LocalRun) -> dict[str, Any]:
    """One run's side of a repetition: its model's figures on the shared split, its own."""
    return {
        "accuracy": evaluated["accuracy"],
        "macro_f1": evaluated["macro_f1"],
        "own_test_accuracy": launch.summary.get("metrics", {}).get("test_accuracy"),
        "version": launch.summary["model"]["version"],
        "wall_seconds": round(launch.wall_seconds, 2),
        "pipeline_seconds": launch.summary.get("wall_seconds"),
        "other_cpu_share": launch.other_cpu_share,
    }


def repetition_figures(
    seed: int, untuned: LocalRun, tuned: LocalRun, version_record: Mapping[str, Any]
) -> dict[str, Any]:
    """One repetition's figures from the two runs and the tuned version's `version.json`; raises
    when the comparison is not the one this benchmark means to make."""
    first, second = _succeeded(untuned, "untuned"), _succeeded(tuned, "tuned")
    if not first["model"].get("champion"):
        raise TuningBenchmarkError(f"the untuned run's model did not become the champion: {first['model']}")
    gate = second.get("gate") or {}
    if gate.get("champion_score", -1) == -1:
        raise TuningBenchmarkError(f"the tuned run's gate compared with no champion: {gate}")
    if not second.get("tuning"):
        raise TuningBenchmarkError("the tuned run has no tuning record (was --tune true passed?)")
    evaluation = version_record.get("evaluation") or {}
    challenger, champion = _side(evaluation, "challenger"), _side(evaluation, "champion")
    before = (version_record.get("alias") or {}).get("before") or {}
    if before.get("version") not in (None, first["model"]["version"]):
        raise TuningBenchmarkError(
            f"the tuned run's champion was version {before.get('version')}, not the untuned run's "
            f"version {first['model']['version']}"
        )
    best = second["tuning"].get("best") or {}
    parameters = second.get("parameters") or {}
    return {
        "seed": seed,
        "tuning_parameters": {k: parameters.get(k) for k in TUNING_PARAMETERS},
        "test_examples": challenger["examples"],
        "dataset_fingerprint": evaluation.get("dataset_fingerprint"),
        "untuned": _run_figures(champion, untuned),
        "tuned": {
            **_run_figures(challenger, tuned),
            "tune_seconds": next(
                (s["seconds"] for s in second.get("steps", []) if s["name"] == "tune-hyperparameters"), None
            ),
            "training_hyperparameters": second.get("training_hyperparameters"),
        },
        "trials": trials_table(second["tuning"]),
        "best_trial": {
            "id": best.get("trial_id"),
            "value": best.get("value"),
            "hyperparameters": best.get("hyperparameters"),
        },
        "gate": {
            "promote": bool(gate.get("promote")),
            **{k: gate.get(k) for k in ("reason", "metric", "score", "champion_score")},
        },
        "champion_moved": bool(second["model"].get("champion")),
        "tuned_at_least_untuned": challenger[METRIC] >= champion[METRIC],
        "paired": paired(evaluation),
    }


def paired(evaluation: Mapping[str, Any]) -> dict[str, Any]:
    """The tuned - untuned accuracy difference as the evaluation job paired it, and its verdict."""
    comparison = evaluation.get("comparison")
    if not isinstance(comparison, Mapping) or METRIC not in comparison:
        raise TuningBenchmarkError("the tuned version's evaluation has no paired comparison")
    figure = comparison[METRIC]
    low, high = (float(x) for x in figure["ci95"])
    verdict = (
        "significantly worse" if high < 0 else "significantly better" if low > 0 else "indistinguishable"
    )
    return {
        "difference": float(figure["difference"]),
        "ci95": [low, high],
        "mcnemar_p": float(comparison["mcnemar"]["p_value"]),
        "verdict": verdict,
    }


def build_result(
    repetitions: Sequence[Mapping[str, Any]],
    *,
    inputs: Mapping[str, Any],
    wall_seconds: float,
    machine: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    if not repetitions:
        raise TuningBenchmarkError("no repetition ran")
    exact = {
        f"{side}_{key}": statistics.fmean(float(r[side][key]) for r in repetitions)
        for side in ("untuned", "tuned")
        for key in ("accuracy", "macro_f1")
    }
    means = {k: round(v, 4) for k, v in exact.items()}
    untuned_acc, tuned_acc = exact[f"untuned_{METRIC}"], exact[f"tuned_{METRIC}"]
    met = all(r["paired"]["verdict"] != "significantly worse" for r in repetitions)
    promoted = sum(bool(r["gate"]["promote"]) for r in repetitions)
    runs = [
        {"seed": r["seed"], "side": side, **{k: r[side][k] for k in ("wall_seconds", "other_cpu_share")}}
        for r in repetitions
        for side in ("untuned", "tuned")
    ]
    per_rep = ", ".join(
        f"{r['tuned']['accuracy']:.3f} vs {r['untuned']['accuracy']:.3f} "
        f"({r['paired']['difference']:+.3f}, 95% CI {r['paired']['ci95'][0]:+.3f} to {r['paired']['ci95'][1]:+.3f}, "
        f"McNemar p={r['paired']['mcnemar_p']:.2g}: {r['paired']['verdict']})"
        for r in repetitions
    )
    examples = sorted({r["test_examples"] for r in repetitions})
    summary = (
        f"tuned vs untuned accuracy {per_rep} (seed{'s' if len(repetitions) > 1 else ''} "
        f"{', '.join(str(r['seed']) for r in repetitions)}; {'/'.join(map(str, examples))} test images); "
        f"macro F1 {means['tuned_macro_f1']:.3f} vs {means['untuned_macro_f1']:.3f}; "
        f"gate promoted {promoted}/{len(repetitions)}; "
        f"{statistics.fmean(r['untuned']['wall_seconds'] + r['tuned']['wall_seconds'] for r in repetitions):.0f}s "
        "per repetition"
    )
    return make_result(
        NAME,
        inputs=inputs,
        figures={
            "repetitions": list(repetitions),
            "mean": means,
            "runs": runs,
            "wall_seconds": round(wall_seconds, 2),
        },
        ratio=tuned_acc / untuned_acc if untuned_acc > 0 else None,
        goal=GOAL,
        goal_met=met,
        machine=machine,
        summary=summary,
        notes=busy_note(runs),
    )


def launch(work_dir: Path, seed: int, *, tune: bool, log: Path) -> LocalRun:
    return local_run(work_dir, "--seed", str(seed), *(["--tune", "true"] if tune else []), log=log)


def repetition(work: Path, seed: int, index: int, count: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"bench-tuning-{seed}-", dir=work) as tmp:
        where = Path(tmp)
        logs = work / "logs"
        say(f"tuning: repetition {index}/{count} (seed {seed}): untuned run (fresh registry)")
        untuned = launch(where, seed, tune=False, log=logs / f"tuning-{seed}-untuned.log")
        say(f"tuning: untuned run done in {untuned.wall_seconds:.0f}s; tuned run (--tune true)")
        tuned = launch(where, seed, tune=True, log=logs / f"tuning-{seed}-tuned.log")
        model = tuned.summary.get("model") or {}
        version_path = Path(str(model.get("path", where / "missing"))) / "version.json"
        if tuned.summary.get("status") == "SUCCEEDED" and not version_path.exists():
            raise TuningBenchmarkError(f"the tuned run's version record is missing: {version_path}")
        record = json.loads(version_path.read_text(encoding="utf-8")) if version_path.exists() else {}
        figures = repetition_figures(seed, untuned, tuned, record)
    say(
        f"tuning: tuned run done in {tuned.wall_seconds:.0f}s; tuned accuracy {figures['tuned']['accuracy']:.4f} "
        f"vs untuned {figures['untuned']['accuracy']:.4f} on {figures['test_examples']} shared test images"
    )
    return figures


def run(work: Path, results_dir: Path) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    repetitions: list[dict[str, Any]] = []
    skipped = None
    for i, seed in enumerate(SEEDS, start=1):
        rep_started = time.perf_counter()
        repetitions.append(repetition(work, seed, i, len(SEEDS)))
        took = time.perf_counter() - rep_started
        if i < len(SEEDS) and took > MAX_REPETITION_SECONDS:
            skipped = (
                f"repetition {i} took {took:.0f}s (> {MAX_REPETITION_SECONDS:.0f}s): "
                f"the other {len(SEEDS) - i} skipped to keep the benchmark within about 10 minutes"
            )
            say(f"tuning: {skipped}")
            break
    inputs = {
        "command": "make run (local target, default parameters) with --seed S, then the same with "
        "--tune true into the same registry",
        "seeds_planned": list(SEEDS),
        "seeds": [r["seed"] for r in repetitions],
        "repetitions": len(repetitions),
        "compared_on": "the tuned run's test split: its evaluate-models job evaluates the tuned model "
        "(challenger) and the untuned one (champion) side by side (version.json evaluation)",
        "max_repetition_seconds": MAX_REPETITION_SECONDS,
        "tuning": repetitions[0]["tuning_parameters"],
        **({"repetitions_skipped": skipped} if skipped else {}),
    }
    return build_result(repetitions, inputs=inputs, wall_seconds=time.perf_counter() - started)
