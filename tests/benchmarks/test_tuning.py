"""The tuning benchmark's bookkeeping, from hand-written summaries and version records (no
pipeline runs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import tuning
from benchmarks.common import LocalRun, validate_result

MACHINE = {"cpu_count": 2, "cpu_model": "Test CPU", "python": "3.11", "tensorflow": "2.21.0", "gpu": None}
SPACE = [{"parameter_id": "learning_rate", "double_value_spec": {"min_value": 0.0005, "max_value": 0.005}}]


def untuned_summary(accuracy: float = 0.97, status: str = "SUCCEEDED") -> dict[str, Any]:
    return {
        "status": status,
        "error": "" if status == "SUCCEEDED" else "step train-model failed: boom",
        "steps": [{"name": "train-model", "status": "SUCCESS", "seconds": 20.0}],
        "metrics": {"test_accuracy": accuracy},
        "model": {"name": "m", "version": "1", "path": "/r/m/1", "champion": True},
        "gate": {
            "promote": True,
            "reason": "no champion yet",
            "metric": "accuracy",
            "score": accuracy,
            "champion_score": -1,
        },
        "wall_seconds": 60.0,
        "parameters": {"tune": False},
    }


def tuned_summary(
    tuned: float, untuned: float, *, path: str = "/r/m/2", champion_score: float | None = None
) -> dict[str, Any]:
    promote = tuned >= untuned
    return {
        "status": "SUCCEEDED",
        "error": "",
        "steps": [
            {"name": "tune-hyperparameters", "status": "SUCCESS", "seconds": 70.0},
            {"name": "train-model", "status": "SUCCESS", "seconds": 20.0},
        ],
        "metrics": {"test_accuracy": tuned},
        "model": {"name": "m", "version": "2", "path": path, "champion": promote},
        "gate": {
            "promote": promote,
            "reason": "test accuracy vs the champion's",
            "metric": "accuracy",
            "score": tuned,
            "champion_score": untuned if champion_score is None else champion_score,
        },
        "tuning": {
            "metric_id": "val_accuracy",
            "trials": [
                {
                    "id": "1",
                    "state": "SUCCEEDED",
                    "parameters": [{"parameterId": "learning_rate", "value": 0.001}],
                    "finalMeasurement": {
                        "stepCount": "5",
                        "metrics": [{"metricId": "val_accuracy", "value": 0.9}],
                    },
                },
                {
                    "id": "2",
                    "state": "SUCCEEDED",
                    "parameters": [{"parameterId": "learning_rate", "value": 0.002}],
                    "finalMeasurement": {
                        "stepCount": "5",
                        "metrics": [{"metricId": "val_accuracy", "value": 0.95}],
                    },
                },
            ],
            "best": {"trial_id": "2", "value": 0.95, "hyperparameters": {"learning_rate": 0.002}},
        },
        "training_hyperparameters": {"learning_rate": 0.002, "epochs": 6.0},
        "wall_seconds": 130.0,
        "parameters": {
            "tune": True,
            "max_trial_count": 2,
            "parallel_trial_count": 1,
            "search_algorithm": "ALGORITHM_UNSPECIFIED",
            "search_space": SPACE,
        },
    }


def version_record(
    tuned: float, untuned: float, tuned_f1: float = 0.9, untuned_f1: float = 0.8, half_width: float = 0.035
) -> dict[str, Any]:
    """The tuned version's version.json: both models on the shared split, and their paired
    comparison (an interval of +-`half_width` around the difference)."""
    difference = tuned - untuned
    return {
        "version": "2",
        "evaluation": {
            "split": "test",
            "dataset_fingerprint": "sha256:abc",
            "models": {
                "challenger": {"examples": 100, "accuracy": tuned, "macro_f1": tuned_f1, "loss": 0.1},
                "champion": {"examples": 100, "accuracy": untuned, "macro_f1": untuned_f1, "loss": 0.2},
            },
            "comparison": {
                "examples": 100,
                "accuracy": {
                    "challenger": tuned,
                    "champion": untuned,
                    "difference": difference,
                    "ci95": [difference - half_width, difference + half_width],
                },
                "mcnemar": {"b": 4, "c": 1, "p_value": 0.375},
            },
        },
        "alias": {"name": "champion", "moved": tuned >= untuned, "before": {"version": "1"}},
    }


def repetition(seed: int, tuned: float, untuned: float, **f1: float) -> dict[str, Any]:
    return tuning.repetition_figures(
        seed,
        LocalRun(untuned_summary(0.96), wall_seconds=70.0, other_cpu_share=0.01),
        LocalRun(tuned_summary(tuned, untuned), wall_seconds=140.0, other_cpu_share=0.02),
        version_record(tuned, untuned, **f1),
    )


def test_a_repetition_reads_both_sides_from_the_shared_evaluation_not_each_runs_own_split() -> None:
    figures = repetition(42, tuned=0.98, untuned=0.95)
    # The untuned run's own test_accuracy (0.96) is on its own split: the comparison uses the
    # evaluation job's figure for the champion on the tuned run's split (0.95).
    assert figures["untuned"] == {
        "accuracy": 0.95,
        "macro_f1": 0.8,
        "own_test_accuracy": 0.96,
        "version": "1",
        "wall_seconds": 70.0,
        "pipeline_seconds": 60.0,
        "other_cpu_share": 0.01,
    }
    assert figures["tuned"]["accuracy"] == 0.98 and figures["tuned"]["macro_f1"] == 0.9
    assert figures["tuned"]["tune_seconds"] == 70.0 and figures["tuned"]["wall_seconds"] == 140.0
    assert figures["trials"] == [
        {"id": "1", "state": "SUCCEEDED", "parameters": {"learning_rate": 0.001}, "value": 0.9},
        {"id": "2", "state": "SUCCEEDED", "parameters": {"learning_rate": 0.002}, "value": 0.95},
    ]
    assert figures["best_trial"] == {"id": "2", "value": 0.95, "hyperparameters": {"learning_rate": 0.002}}
    assert figures["gate"]["promote"] is True and figures["champion_moved"] is True
    assert figures["tuning_parameters"]["search_space"] == SPACE
    assert figures["test_examples"] == 100 and figures["tuned_at_least_untuned"] is True


def test_the_goal_is_met_when_tuned_is_at_least_untuned_in_every_repetition_ties_included() -> None:
    reps = [repetition(42, tuned=0.98, untuned=0.95), repetition(43, tuned=0.96, untuned=0.96)]
    result = tuning.build_result(reps, inputs={"seeds": [42, 43]}, wall_seconds=420.0, machine=MACHINE)
    assert validate_result(result) == []
    assert result["name"] == "tuning"
    assert result["ratio"] == pytest.approx(((0.98 + 0.96) / 2) / ((0.95 + 0.96) / 2), abs=1e-3)
    assert result["goal_met"] is True
    assert result["goal"]["description"].startswith(
        "tuned not significantly worse than untuned on the same test split (the paired 95% interval"
    )
    assert result["figures"]["mean"] == {
        "untuned_accuracy": 0.955,
        "untuned_macro_f1": 0.8,
        "tuned_accuracy": 0.97,
        "tuned_macro_f1": 0.9,
    }
    assert (
        "0.980 vs 0.950 (+0.030, 95% CI -0.005 to +0.065, McNemar p=0.38: indistinguishable)"
        in result["summary"]
    )
    assert "0.960 vs 0.960 (+0.000, 95% CI -0.035 to +0.035" in result["summary"]
    assert "seeds 42, 43" in result["summary"] and "gate promoted 2/2" in result["summary"]
    assert "notes" not in result  # the machine was idle (other_cpu_share <= 2%)


def test_one_significantly_worse_repetition_misses_the_goal_even_when_the_mean_is_higher() -> None:
    reps = [repetition(42, tuned=0.99, untuned=0.90), repetition(43, tuned=0.90, untuned=0.95)]
    result = tuning.build_result(reps, inputs={}, wall_seconds=420.0, machine=MACHINE)
    assert result["ratio"] is not None and result["ratio"] > 1
    assert result["goal_met"] is False
    verdicts = [r["paired"]["verdict"] for r in result["figures"]["repetitions"]]
    assert verdicts == ["significantly better", "significantly worse"]
    assert "gate promoted 1/2" in result["summary"]


def test_one_image_worse_is_noise_and_keeps_the_goal() -> None:
    """0.94 against 0.95 on 100 images: the interval reaches above 0, so tuning is not shown to
    have made the model worse (the old rule, tuned >= untuned, called this a miss)."""
    reps = [repetition(42, tuned=0.94, untuned=0.95)]
    result = tuning.build_result(reps, inputs={}, wall_seconds=200.0, machine=MACHINE)
    assert result["goal_met"] is True
    assert result["figures"]["repetitions"][0]["paired"]["verdict"] == "indistinguishable"
    assert result["figures"]["repetitions"][0]["tuned_at_least_untuned"] is False


def test_a_version_without_the_paired_comparison_is_refused() -> None:
    record = version_record(0.9, 0.9)
    del record["evaluation"]["comparison"]
    with pytest.raises(tuning.TuningBenchmarkError, match="no paired comparison"):
        tuning.repetition_figures(
            42,
            LocalRun(untuned_summary(0.96), wall_seconds=70.0, other_cpu_share=0.01),
            LocalRun(tuned_summary(0.9, 0.9), wall_seconds=140.0, other_cpu_share=0.02),
            record,
        )


def test_a_tuned_model_below_the_untuned_one_gives_a_ratio_below_one() -> None:
    result = tuning.build_result(
        [repetition(42, tuned=0.8, untuned=1.0, tuned_f1=0.7, untuned_f1=1.0)],
        inputs={},
        wall_seconds=200.0,
        machine=MACHINE,
    )
    assert result["ratio"] == pytest.approx(0.8)
    assert result["goal_met"] is False
    assert "(seed 42; 100 test images)" in result["summary"]
    assert "macro F1 0.700 vs 1.000" in result["summary"]


def test_a_busy_machine_is_flagged() -> None:
    rep = repetition(42, tuned=0.9, untuned=0.9)
    rep["tuned"]["other_cpu_share"] = 0.4
    result = tuning.build_result([rep], inputs={}, wall_seconds=200.0, machine=MACHINE)
    assert "up to 40% of the CPUs" in result["notes"]


@pytest.mark.parametrize(
    ("untuned", "tuned", "record", "message"),
    [
        (
            untuned_summary(status="FAILED"),
            tuned_summary(0.9, 0.9),
            version_record(0.9, 0.9),
            "untuned run ended FAILED",
        ),
        (
            untuned_summary(),
            tuned_summary(0.9, 0.9, champion_score=-1),
            version_record(0.9, 0.9),
            "no champion",
        ),
        (
            untuned_summary(),
            {**tuned_summary(0.9, 0.9), "tuning": None},
            version_record(0.9, 0.9),
            "no tuning record",
        ),
        (untuned_summary(), tuned_summary(0.9, 0.9), {"evaluation": {}}, "no 'challenger' figures"),
        (
            untuned_summary(),
            tuned_summary(0.9, 0.9),
            {**version_record(0.9, 0.9), "alias": {"before": {"version": "7"}}},
            "champion was version 7",
        ),
    ],
)
def test_a_comparison_that_is_not_tuned_vs_untuned_is_refused(
    untuned: dict[str, Any], tuned: dict[str, Any], record: dict[str, Any], message: str
) -> None:
    with pytest.raises(tuning.TuningBenchmarkError, match=message):
        tuning.repetition_figures(42, LocalRun(untuned, 1.0), LocalRun(tuned, 1.0), record)


def fake_launch(accuracies: dict[int, tuple[float, float]], calls: list[tuple[int, bool]]) -> Any:
    """Stands in for `launch`: writes the tuned version's version.json where its summary says."""

    def launch(work_dir: Path, seed: int, *, tune: bool, log: Path) -> LocalRun:
        calls.append((seed, tune))
        assert (work_dir / "registry").parent == work_dir and work_dir.exists()
        if not tune:
            return LocalRun(untuned_summary(), wall_seconds=50.0, other_cpu_share=0.0, log=str(log))
        tuned, untuned = accuracies[seed]
        folder = work_dir / "registry" / "m" / "2"
        folder.mkdir(parents=True)
        (folder / "version.json").write_text(json.dumps(version_record(tuned, untuned)), encoding="utf-8")
        summary = tuned_summary(tuned, untuned, path=str(folder))
        return LocalRun(summary, wall_seconds=100.0, other_cpu_share=0.0, log=str(log))

    return launch


def test_run_does_every_repetition_in_its_own_registry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[int, bool]] = []
    monkeypatch.setattr(tuning, "launch", fake_launch({42: (0.97, 0.96), 43: (0.95, 0.95)}, calls))
    result = tuning.run(tmp_path / "work", tmp_path / "results")
    assert calls == [(42, False), (42, True), (43, False), (43, True)]
    assert validate_result(result) == []
    assert result["goal_met"] is True
    assert result["inputs"]["seeds"] == [42, 43] and result["inputs"]["repetitions"] == 2
    assert result["inputs"]["tuning"]["max_trial_count"] == 2
    assert "repetitions_skipped" not in result["inputs"]
    assert list((tmp_path / "work").glob("bench-tuning-*")) == []  # temporary folders removed


def test_a_slow_repetition_skips_the_rest_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[int, bool]] = []
    monkeypatch.setattr(tuning, "launch", fake_launch({42: (0.9, 0.95)}, calls))
    monkeypatch.setattr(tuning, "MAX_REPETITION_SECONDS", -1.0)
    result = tuning.run(tmp_path / "work", tmp_path / "results")
    assert calls == [(42, False), (42, True)]
    assert result["inputs"]["repetitions"] == 1 and result["inputs"]["seeds_planned"] == [42, 43]
    assert "the other 1 skipped" in result["inputs"]["repetitions_skipped"]
    assert result["goal_met"] is False
