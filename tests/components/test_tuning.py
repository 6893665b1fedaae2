"""The study spec against the real API types, and the best-trial step against a local fake
JobService holding a study with succeeded, failed and infeasible trials."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.cloud import aiplatform_v1
from google.cloud.aiplatform_v1.services.job_service.transports.grpc import JobServiceGrpcTransport
from google.protobuf import json_format
from kfp import dsl

from components import tuning
from tests.fakes import Abort, GrpcFake, insecure_client

JOB = "projects/p/locations/europe-west4/hyperparameterTuningJobs/42"


def test_study_spec_parses_into_the_api_type() -> None:
    spec = aiplatform_v1.StudySpec(
        metrics=tuning.study_metrics(), parameters=tuning.VERTEX_SEARCH_SPACE, algorithm="RANDOM_SEARCH"
    )
    by_id = {p.parameter_id: p for p in spec.parameters}
    assert set(by_id) == {"learning_rate", "dense_units", "dropout", "per_replica_batch_size"}
    lr = by_id["learning_rate"]
    assert lr.scale_type == aiplatform_v1.StudySpec.ParameterSpec.ScaleType.UNIT_LOG_SCALE
    assert 0 < lr.double_value_spec.min_value < lr.double_value_spec.max_value <= 0.1
    assert by_id["dense_units"].integer_value_spec.min_value >= 1
    assert list(by_id["per_replica_batch_size"].discrete_value_spec.values) == [16, 32, 64]
    [metric] = spec.metrics
    assert (metric.metric_id, metric.goal) == (
        "val_accuracy",
        aiplatform_v1.StudySpec.MetricSpec.GoalType.MAXIMIZE,
    )
    # The local target's copy is GCPC's value, so both targets' tuners get the same study.
    assert tuning.study_metrics() == tuning.LOCAL_STUDY_METRICS


def trial(tid: str, state: str, value: float | None = None, **params: float) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": tid,
        "state": state,
        "parameters": [{"parameterId": k, "value": v} for k, v in params.items()],
    }
    if value is not None:
        out["finalMeasurement"] = {
            "stepCount": "3",
            "metrics": [{"metricId": "val_accuracy", "value": value}],
        }
    return out


def test_pick_best_trial_ignores_failed_and_infeasible_trials() -> None:
    trials = [
        trial("1", "SUCCEEDED", 0.7, learning_rate=0.001),
        trial("2", "STOPPING", 0.99, learning_rate=0.01),  # only SUCCEEDED trials count
        {**trial("3", "INFEASIBLE", learning_rate=0.1), "infeasibleReason": "NaN loss"},
        trial("4", "SUCCEEDED", 0.8, learning_rate=0.003),
        trial("5", "SUCCEEDED", 0.8, learning_rate=0.005),  # a tie: the earlier trial wins
    ]
    best = tuning.pick_best_trial(trials, "val_accuracy", "MAXIMIZE")
    assert best == {"trial_id": "4", "value": 0.8, "parameters": {"learning_rate": 0.003}}
    assert tuning.pick_best_trial(trials, "val_accuracy", "MINIMIZE")["trial_id"] == "1"


def test_no_successful_trial_names_every_state() -> None:
    trials = [trial("1", "SUCCEEDED"), {**trial("2", "INFEASIBLE"), "infeasibleReason": "NaN loss"}]
    with pytest.raises(RuntimeError, match=r"no trial succeeded.*1: SUCCEEDED, 2: INFEASIBLE \(NaN loss\)"):
        tuning.pick_best_trial(trials, "val_accuracy", "MAXIMIZE")
    with pytest.raises(ValueError, match="goal must be MAXIMIZE or MINIMIZE"):
        tuning.pick_best_trial(trials, "val_accuracy", "maximize")


def tuning_job() -> aiplatform_v1.HyperparameterTuningJob:
    def t(
        tid: str, state: str, value: float | None, lr: float, units: float, batch: float
    ) -> aiplatform_v1.Trial:
        out = aiplatform_v1.Trial(
            id=tid,
            state=state,
            parameters=[
                {"parameter_id": "learning_rate", "value": lr},
                {"parameter_id": "dense_units", "value": units},
                {"parameter_id": "per_replica_batch_size", "value": batch},
            ],
        )
        if value is not None:
            out.final_measurement = aiplatform_v1.Measurement(
                metrics=[{"metric_id": "val_accuracy", "value": value}]
            )
        if state == "INFEASIBLE":  # how Vertex reports a failed trial
            out.infeasible_reason = (
                "loss was NaN" if tid == "3" else "replica workerpool0-0 exited with status 1"
            )
        return out

    return aiplatform_v1.HyperparameterTuningJob(
        name=JOB,
        study_spec=aiplatform_v1.StudySpec(
            metrics=tuning.study_metrics(), parameters=tuning.VERTEX_SEARCH_SPACE
        ),
        trials=[
            t("1", "SUCCEEDED", 0.61, 0.0003, 64.0, 32.0),
            t("2", "INFEASIBLE", None, 0.009, 512.0, 16.0),
            t("3", "INFEASIBLE", None, 0.01, 1024.0, 64.0),
            t("4", "SUCCEEDED", 0.83, 0.002, 256.0, 16.0),
        ],
    )


def gcp_resources(name: str) -> str:
    uri = f"https://europe-west4-aiplatform.googleapis.com/v1/{name}"
    return json.dumps({"resources": [{"resourceType": "HyperparameterTuningJob", "resourceUri": uri}]})


@pytest.fixture
def job_service(monkeypatch: pytest.MonkeyPatch) -> Any:
    jobs = {JOB: tuning_job()}
    fake = GrpcFake()

    def get(
        request: aiplatform_v1.GetHyperparameterTuningJobRequest,
    ) -> aiplatform_v1.HyperparameterTuningJob:
        if request.name not in jobs:
            raise Abort(grpc.StatusCode.NOT_FOUND, f"{request.name} not found")
        return jobs[request.name]

    fake.add(
        "google.cloud.aiplatform.v1.JobService",
        "GetHyperparameterTuningJob",
        aiplatform_v1.GetHyperparameterTuningJobRequest,
        get,
    )
    fake.start()
    monkeypatch.setattr(
        aiplatform_v1,
        "JobServiceClient",
        insecure_client(aiplatform_v1.JobServiceClient, JobServiceGrpcTransport, fake.address),
    )
    fake.jobs = jobs  # type: ignore[attr-defined]
    yield fake
    fake.stop()


PLANNED = [
    {
        "machine_spec": {"machine_type": "n1-standard-8"},
        "replica_count": 1,
        "container_spec": {
            "image_uri": "img",
            "args": [
                "--data_dir=gs://b/d",
                "--learning_rate=0.001",
                "--per_replica_batch_size=64",
                "--dense_units=64",
                "--dropout=0.2",
                "--epochs=2",
            ],
        },
    }
]


def test_best_trial_reads_the_job_and_writes_whole_numbers_into_the_training_flags(
    job_service: GrpcFake, tmp_path: Path
) -> None:
    trials = dsl.Artifact(uri=str(tmp_path / "trials"))
    out = tuning.best_trial.python_func(
        project="p",
        location="us-central1",
        gcp_resources=gcp_resources(JOB),
        training_pools=PLANNED,
        trials=trials,
    )
    assert (out.trial_id, out.value) == ("4", pytest.approx(0.83))
    # Every tunable value the final training carries: the best trial's, and the plan's others.
    assert out.hyperparameters == {
        "learning_rate": 0.002,
        "dense_units": 256,
        "per_replica_batch_size": 16,
        "dropout": 0.2,
        "epochs": 2,
    }
    assert isinstance(out.hyperparameters["dense_units"], int)
    assert isinstance(out.hyperparameters["per_replica_batch_size"], int)
    assert out.worker_pool_specs[0]["container_spec"]["args"] == [
        "--data_dir=gs://b/d",
        "--learning_rate=0.002",
        "--per_replica_batch_size=16",
        "--dense_units=256",
        "--dropout=0.2",
        "--epochs=2",
    ]
    [request] = job_service.calls("GetHyperparameterTuningJob")
    assert request.name == JOB
    table = json.loads(Path(trials.path).read_text())
    assert [t["state"] for t in table] == ["SUCCEEDED", "INFEASIBLE", "INFEASIBLE", "SUCCEEDED"]
    for row in table:  # the table is in the API's own JSON form
        json_format.ParseDict(row, aiplatform_v1.Trial.pb(aiplatform_v1.Trial()))
    assert trials.metadata["best_trial_id"] == "4"


def test_best_trial_with_only_failed_trials_fails_naming_them(job_service: GrpcFake, tmp_path: Path) -> None:
    failing = tuning_job()
    failing.name = JOB.replace("/42", "/43")
    del failing.trials[3]
    del failing.trials[0]
    job_service.jobs[failing.name] = failing  # type: ignore[attr-defined]
    with pytest.raises(
        RuntimeError,
        match=r"2: INFEASIBLE \(replica workerpool0-0 exited with status 1\), 3: INFEASIBLE \(loss was NaN\)",
    ):
        tuning.best_trial.python_func(
            project="p",
            location="us-central1",
            gcp_resources=gcp_resources(failing.name),
            training_pools=PLANNED,
            trials=dsl.Artifact(uri=str(tmp_path / "trials")),
        )


def test_gcp_resources_without_a_tuning_job_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="names no HyperparameterTuningJob"):
        tuning.best_trial.python_func(
            project="p",
            location="us-central1",
            gcp_resources=json.dumps({"resources": [{"resourceType": "CustomJob", "resourceUri": "x"}]}),
            training_pools=PLANNED,
            trials=dsl.Artifact(uri=str(tmp_path / "t")),
        )
