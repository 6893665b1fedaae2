"""The local tuner takes the declared search space as the Vertex job does: either JSON form,
strictly parsed, each trial getting exactly the declared flags within their ranges; GRID_SEARCH
walks an all-discrete space; no trial is stopped early (Vertex's op cannot ask for it)."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from components import tuning
from local import tuner

# A trial: records its flags, reports val_accuracy for each of --epochs epochs.
TRIAL = r"""
import json, os, sys
flags = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--"))
if os.environ.get("TF_CONFIG") and json.loads(os.environ["TF_CONFIG"])["task"]["type"] != "chief":
    sys.exit(0)
path = os.environ["CLOUD_ML_HP_METRIC_FILE"]
os.makedirs(os.path.dirname(path), exist_ok=True)
epochs = int(float(flags["epochs"]))
units = float(flags.get("dense_units", 64))
with open(path, "w") as f:
    for step in range(1, epochs + 1):
        f.write(json.dumps({"val_accuracy": min(1.0, units / 1000 + step / 100), "global_step": str(step)}) + "\n")
with open(os.environ["AIP_MODEL_DIR"].rstrip("/") + ".flags", "w") as f:
    json.dump(flags, f)
"""


def run(
    tmp_path: Path, space: list[dict[str, Any]], program: str = TRIAL, **kwargs: Any
) -> list[dict[str, Any]]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "trial.py"
    script.write_text(program)
    base = ["--learning_rate=0.003", "--dropout=0.2"]  # what tuning-trainer-args left in
    container = {"image_uri": "img", "command": [sys.executable, str(script)], "args": base}
    args: dict[str, Any] = {"max_trial_count": 3, "parallel_trial_count": 1, "out": io.StringIO()}
    return tuner.run_tuning(
        [{"replica_count": 1, "container_spec": container}],
        str(tmp_path / "tune"),
        tuning.study_metrics(),
        space,
        **{**args, **kwargs},
    )


def flags_of(tmp_path: Path, trial: dict[str, Any]) -> dict[str, str]:
    return json.loads((tmp_path / "tune" / trial["id"] / "model.flags").read_text())


CAMEL = [
    {
        "parameterId": "epochs",
        "integerValueSpec": {"minValue": 2, "maxValue": 4},
        "scaleType": "UNIT_LINEAR_SCALE",
    },
    {
        "parameterId": "dense_units",
        "discreteValueSpec": {"values": [32, 64, 128]},
        "scaleType": "UNIT_LOG_SCALE",
    },
]


def test_a_declared_space_reaches_the_trials_in_either_json_form(tmp_path: Path) -> None:
    for form, space in (("camel", CAMEL), ("snake", tuning.canonical_search_space(CAMEL))):
        table = run(tmp_path / form, space, algorithm="RANDOM_SEARCH", seed=1)
        assert [t["state"] for t in table] == ["SUCCEEDED"] * 3
        for t in table:
            flags = flags_of(tmp_path / form, t)
            params = {p["parameterId"]: p["value"] for p in t["parameters"]}
            assert set(params) == {"epochs", "dense_units"}
            # Declared flags as a Vertex trial gets them (doubles); the others as the job's args.
            assert flags["epochs"] in ("2.0", "3.0", "4.0") and flags["dense_units"] in (
                "32.0",
                "64.0",
                "128.0",
            )
            assert (flags["learning_rate"], flags["dropout"]) == ("0.003", "0.2")
            # Every epoch ran: no trial is stopped early, and the final measurement is the best.
            assert len(t["measurements"]) == int(params["epochs"])
            assert t["finalMeasurement"]["stepCount"] == str(int(params["epochs"]))


def test_grid_search_walks_an_all_discrete_space(tmp_path: Path) -> None:
    space = [
        {"parameter_id": "epochs", "integer_value_spec": {"min_value": "2", "max_value": "3"}},
        {"parameter_id": "dense_units", "discrete_value_spec": {"values": [32.0, 64.0]}},
    ]
    # More trials than grid points, two at a time: every point once, then the study is done
    # (Vertex: "The study is done when the service exhausts the parameter search space").
    table = run(tmp_path, space, algorithm="GRID_SEARCH", max_trial_count=6, parallel_trial_count=2)
    seen = [(flags_of(tmp_path, t)["epochs"], flags_of(tmp_path, t)["dense_units"]) for t in table]
    assert sorted(seen) == [("2.0", "32.0"), ("2.0", "64.0"), ("3.0", "32.0"), ("3.0", "64.0")]
    with pytest.raises(ValueError, match="GRID_SEARCH needs integer, discrete or categorical parameters"):
        tuner.make_sampler(
            "GRID_SEARCH", tuner.parse_study(tuning.study_metrics(), tuning.LOCAL_SEARCH_SPACE), 0
        )


def test_the_timeout_bounds_each_trial_as_vertex_bounds_each_trials_custom_job(tmp_path: Path) -> None:
    """Vertex: each trial is a CustomJob of `trial_job_spec`, whose `scheduling.timeout` is "the
    maximum job running time" (aiplatform_v1 `HyperparameterTuningJob`, `Scheduling`): the two
    short trials together outlast the timeout and both succeed; the long one is stopped."""
    nap = r"""
import json, os, sys, time
time.sleep(float(sys.argv[-1].split("=")[1]))
path = os.environ["CLOUD_ML_HP_METRIC_FILE"]
os.makedirs(os.path.dirname(path), exist_ok=True)
open(path, "w").write(json.dumps({"val_accuracy": 0.5, "global_step": "1"}))
"""
    space = [{"parameter_id": "nap", "discrete_value_spec": {"values": [1.1, 1.2, 60.0]}}]
    table = run(tmp_path, space, nap, algorithm="GRID_SEARCH", timeout="2s")
    states = {t["parameters"][0]["value"]: t["state"] for t in table}
    assert states == {1.1: "SUCCEEDED", 1.2: "SUCCEEDED", 60.0: "INFEASIBLE"}


def test_a_study_that_fails_stops_the_trials_still_running(tmp_path: Path) -> None:
    """max_failed_trial_count reached: the job fails, and the trial still running is stopped (its
    replica never gets to write its file), not waited for."""
    program = r"""
import os, sys, time
nap = float(sys.argv[-1].split("=")[1])
if nap == 0:
    sys.exit(1)
time.sleep(nap)
open(os.environ["AIP_MODEL_DIR"].rstrip("/") + ".finished", "w").close()
"""
    space = [{"parameter_id": "nap", "discrete_value_spec": {"values": [0.0, 30.0]}}]
    with pytest.raises(RuntimeError, match="max_failed_trial_count"):
        run(
            tmp_path,
            space,
            program,
            algorithm="GRID_SEARCH",
            parallel_trial_count=2,
            max_failed_trial_count=1,
        )
    assert not list((tmp_path / "tune").glob("*/model.finished"))


def test_each_trial_restarts_as_the_training_job_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """trial_job_spec.scheduling carries restart_job_on_worker_restart, as the training job's does."""
    seen: list[bool] = []
    real = tuner.jobs.run_job

    def run_job(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["restart_job_on_worker_restart"])
        return real(*args, **kwargs)

    monkeypatch.setattr(tuner.jobs, "run_job", run_job)
    run(tmp_path, CAMEL, algorithm="RANDOM_SEARCH", max_trial_count=2, restart_job_on_worker_restart=True)
    assert seen == [True, True]


def test_the_local_default_space_is_sampled_within_its_ranges() -> None:
    import optuna

    spec = tuner.parse_study(tuning.study_metrics(), tuning.LOCAL_SEARCH_SPACE)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    draws = [tuner.suggest(study.ask(), spec) for _ in range(200)]
    assert {frozenset(d) for d in draws} == {frozenset({"learning_rate", "dropout"})}
    assert all(5e-4 <= d["learning_rate"] <= 5e-3 and 0 <= d["dropout"] <= 0.3 for d in draws)


@pytest.mark.parametrize("kind", ["double_value_spec", "integer_value_spec"])
def test_a_reverse_log_scale_spreads_the_top_of_the_range(kind: str) -> None:
    """UNIT_REVERSE_LOG_SCALE, as Vertex describes it: values near the top spread out more, so
    random draws crowd there (a linear scale's median is 50.5 on [1, 100], a log scale's 10)."""
    import statistics

    import optuna

    space = [
        {
            "parameter_id": "x",
            kind: {"min_value": 1, "max_value": 100},
            "scale_type": "UNIT_REVERSE_LOG_SCALE",
        }
    ]
    spec = tuner.parse_study(tuning.study_metrics(), space)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    draws = [tuner.suggest(study.ask(), spec)["x"] for _ in range(200)]
    assert all(1 <= x <= 100 for x in draws) and statistics.median(draws) > 80


def test_unknown_fields_are_refused_as_the_api_refuses_them() -> None:
    with pytest.raises(ValueError, match=r'parameter 1: .*no field named "minimum"'):
        tuner.parse_study(
            tuning.study_metrics(), [{"parameter_id": "dropout", "double_value_spec": {"minimum": 0.1}}]
        )
    # kfp.local hands JSON numbers over as doubles, an enum's number too (2.0).
    spec = tuner.parse_study(
        [{"metric_id": "val_accuracy", "goal": 1.0}],
        [
            {
                "parameter_id": "dense_units",
                "integer_value_spec": {"min_value": 32.0, "max_value": 64.0},
                "scale_type": 2.0,
            }
        ],
    )
    assert spec.parameters[0].integer_value_spec.max_value == 64
