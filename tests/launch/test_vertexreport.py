"""A Vertex run gets what a local run gets: `make report RUN=...` and `make run WAIT=1` write
`local_runs/<job id>/summary.json` and `report.html` from the run's own records.

The real aiplatform SDK talks REST to a fake Vertex API (tests/fakes.py's RestFake) serving a
PipelineJob, its CustomJobs and a HyperparameterTuningJob, each built from the aiplatform_v1 types
and sent as their JSON; the real storage client reads metrics.json from gcp-storage-emulator.
The fake run's task names are made up on purpose: the report reads tasks by their state, times,
outputs and `gcp_resources`, never by name."""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud.aiplatform_v1 import types as v1

from launch import cli, report, settings, submit, vertexreport, vertexrun
from tests.conftest import TEST_BUCKET
from tests.fakes import RestFake

ROOT = Path(__file__).resolve().parents[2]
PARENT = "projects/p-proj/locations/us-central1"
JOB_ID = "multiworker-cassava-training-20260101000000"
NAME = f"{PARENT}/pipelineJobs/{JOB_ID}"
T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
MODEL_DIR = f"gs://{TEST_BUCKET}/root/run/train/model"
HISTORY = {"loss": [1.2, 0.8, 0.5], "val_loss": [1.1, 0.9, 0.7], "accuracy": [0.4, 0.6, 0.8]}
HISTORY["val_accuracy"] = [0.5, 0.6, 0.75]
METRICS = {
    "test_accuracy": 0.81,
    "macro_f1": 0.79,
    "test_loss": 0.6,
    "val_accuracy": 0.75,
    "val_loss": 0.7,
    "images_per_second": 123.0,
    "epochs_completed": 3,
    "best_epoch": 3,
    "export_epoch": "best",
    "stopped_early": False,
    "num_workers": 2,
    "history": HISTORY,
    "confusion_matrix": {
        "labels": ["a", "b"],
        "rows": "true",
        "columns": "predicted",
        "matrix": [[4, 1], [0, 5]],
    },
    "per_class": {"a": {"precision": 1.0, "recall": 0.8, "f1": 0.89, "support": 5}},
    "wall_seconds": 300.0,
}


def at(seconds: float | None) -> datetime.datetime | None:
    return None if seconds is None else T0 + datetime.timedelta(seconds=seconds)


def resources(kind: str, name: str) -> str:
    """A launcher's gcp_resources, as GCPC's job_remote_runner writes it."""
    uri = f"https://us-central1-aiplatform.googleapis.com/v1/{name}"
    return json.dumps({"resources": [{"resourceType": kind, "resourceUri": uri}]})


def task(
    task_id: int,
    name: str,
    state: str,
    times: tuple[float | None, float | None, float | None],
    parent: int = 1,
    outputs: dict[str, Any] | None = None,
    artifacts: dict[str, list[v1.Artifact]] | None = None,
) -> v1.PipelineTaskDetail:
    created, started, ended = (at(t) for t in times)
    return v1.PipelineTaskDetail(
        task_id=task_id,
        parent_task_id=parent if task_id != 1 else 0,
        task_name=name,
        state=state,
        create_time=created,
        start_time=started,
        end_time=ended,
        execution=v1.Execution(metadata={f"output:{k}": v for k, v in (outputs or {}).items()}),
        outputs={k: v1.PipelineTaskDetail.ArtifactList(artifacts=a) for k, a in (artifacts or {}).items()},
    )


PREPARE_JOB = f"{PARENT}/customJobs/111"
TRAIN_JOB = f"{PARENT}/customJobs/222"
TUNING_JOB = f"{PARENT}/hyperparameterTuningJobs/333"
VERSION = "projects/p-proj/locations/us-central1/models/42@3"
# The gate's `comparison` output (evaluation.json's), as trainer.pairedstats.compare writes it.
COMPARISON = {
    "examples": 10,
    "accuracy": {"challenger": 0.81, "champion": 0.7, "difference": 0.11, "ci95": [0.0, 0.3]},
    "macro_f1": {"challenger": 0.8, "champion": 0.69, "difference": 0.11, "ci95": [-0.01, 0.29]},
    "mcnemar": {"b": 2, "c": 1, "p_value": 1.0},
}
SERVING_IMAGE = "us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-15:latest"


def finished_run() -> tuple[v1.PipelineJob, dict[str, Any]]:
    """A run that succeeded: a preparation job, a tuning job in a condition group, a training job,
    the model folder, the gate, an importer of the parent model and the upload of version 3; and
    a branch that was not triggered. Returns the PipelineJob and the jobs it names."""
    tasks = [
        task(1, JOB_ID, "SUCCEEDED", (0, 5, 2000)),
        task(
            2,
            "a-launcher",
            "SUCCEEDED",
            (10, 40, 400),
            outputs={"gcp_resources": resources("CustomJob", PREPARE_JOB)},
        ),
        task(3, "some-group", "SUCCEEDED", (400, 401, 900)),
        task(
            4,
            "searching",
            "SUCCEEDED",
            (402, 430, 890),
            parent=3,
            outputs={"gcp_resources": resources("HyperparameterTuningJob", TUNING_JOB)},
        ),
        task(
            5,
            "another-launcher",
            "SUCCEEDED",
            (900, 930, 1500),
            outputs={"gcp_resources": resources("CustomJob", TRAIN_JOB)},
        ),
        task(
            6,
            "folder-step",
            "SUCCEEDED",
            (1500, 1530, 1540),
            outputs={"model_uri": MODEL_DIR},
            artifacts={"model": [v1.Artifact(schema_title="system.Model", uri=MODEL_DIR)]},
        ),
        task(
            7,
            "judge",
            "SUCCEEDED",
            (1540, 1570, 1600),
            outputs={
                "promote": True,
                "reason": "accuracy 0.8100 >= min_score 0.5; no champion yet",
                "description": "accuracy 0.8100 on 10 test images",
                "score": 0.81,
                "champion_score": -1.0,
                "champion": True,
                "evaluation_import": f"{VERSION.split('@')[0]}/evaluations/9",
                "comparison": COMPARISON,
            },
        ),
        task(
            8,
            "imports-parent",
            "SUCCEEDED",
            (1600, 1601, 1602),
            artifacts={
                "artifact": [
                    v1.Artifact(
                        schema_title="google.VertexModel", metadata={"resourceName": VERSION.split("@")[0]}
                    )
                ]
            },
        ),
        task(
            9,
            "registers",
            "SUCCEEDED",
            (1602, 1630, 1700),
            outputs={
                "gcp_resources": json.dumps(
                    {"resources": [{"resourceType": "VertexLro", "resourceUri": "x"}]}
                )
            },
            artifacts={
                "model": [v1.Artifact(schema_title="google.VertexModel", metadata={"resourceName": VERSION})]
            },
        ),
        task(10, "never-ran", "NOT_TRIGGERED", (None, None, None)),
    ]
    job = v1.PipelineJob(
        name=NAME,
        display_name="multiworker-cassava-training",
        state="PIPELINE_STATE_SUCCEEDED",
        create_time=at(0),
        start_time=at(5),
        end_time=at(2000),
        # make run sends only the flags given: the gate's metric and rule are the template's defaults.
        pipeline_spec={
            "pipelineInfo": {"name": "multiworker-cassava-training"},
            "root": {
                "inputDefinitions": {
                    "parameters": {
                        "gate_metric": {"defaultValue": "accuracy", "parameterType": "STRING"},
                        "gate_rule": {"defaultValue": "not_worse", "parameterType": "STRING"},
                        "epochs": {"defaultValue": 2, "parameterType": "NUMBER_INTEGER"},
                    }
                }
            },
        },
        runtime_config=v1.PipelineJob.RuntimeConfig(
            parameter_values={"model_display_name": "cassava", "epochs": 3}
        ),
        job_detail=v1.PipelineJobDetail(task_details=tasks),
    )
    trials = [
        v1.Trial(
            id="1",
            state="SUCCEEDED",
            parameters=[v1.Trial.Parameter(parameter_id="learning_rate", value=0.01)],
            final_measurement=v1.Measurement(
                metrics=[v1.Measurement.Metric(metric_id="val_accuracy", value=0.7)]
            ),
            start_time=at(500),
            end_time=at(700),
        ),
        v1.Trial(
            id="2",
            state="SUCCEEDED",
            parameters=[v1.Trial.Parameter(parameter_id="learning_rate", value=0.001)],
            final_measurement=v1.Measurement(
                metrics=[v1.Measurement.Metric(metric_id="val_accuracy", value=0.8)]
            ),
            start_time=at(510),
            end_time=at(850),
        ),
    ]
    jobs = {
        PREPARE_JOB: v1.CustomJob(
            name=PREPARE_JOB,
            state="JOB_STATE_SUCCEEDED",
            create_time=at(41),
            start_time=at(161),
            end_time=at(390),
        ),
        TRAIN_JOB: v1.CustomJob(
            name=TRAIN_JOB,
            state="JOB_STATE_SUCCEEDED",
            create_time=at(931),
            start_time=at(1111),
            end_time=at(1490),
        ),
        TUNING_JOB: v1.HyperparameterTuningJob(
            name=TUNING_JOB,
            state="JOB_STATE_SUCCEEDED",
            create_time=at(431),
            start_time=at(491),
            end_time=at(880),
            study_spec=v1.StudySpec(
                metrics=[v1.StudySpec.MetricSpec(metric_id="val_accuracy", goal="MAXIMIZE")]
            ),
            trials=trials,
        ),
        VERSION: v1.Model(
            name=VERSION.split("@")[0],
            version_id="3",
            version_aliases=["default", "champion"],
            container_spec=v1.ModelContainerSpec(image_uri=SERVING_IMAGE),
        ),
    }
    return job, jobs


def running_run() -> tuple[v1.PipelineJob, dict[str, Any]]:
    """The same run at 1000 s: preparation done, training's job running, nothing after."""
    finished, jobs = finished_run()
    tasks = [
        task(1, JOB_ID, "RUNNING", (0, 5, None)),
        finished.job_detail.task_details[1],  # a-launcher, done
        task(
            5,
            "another-launcher",
            "RUNNING",
            (900, 930, None),
            outputs={"gcp_resources": resources("CustomJob", TRAIN_JOB)},
        ),
    ]
    job = v1.PipelineJob(
        name=NAME,
        state="PIPELINE_STATE_RUNNING",
        create_time=at(0),
        start_time=at(5),
        pipeline_spec=finished.pipeline_spec,
        runtime_config=finished.runtime_config,
        job_detail=v1.PipelineJobDetail(task_details=tasks),
    )
    train = v1.CustomJob(name=TRAIN_JOB, state="JOB_STATE_RUNNING", create_time=at(931), start_time=at(960))
    return job, {PREPARE_JOB: jobs[PREPARE_JOB], TRAIN_JOB: train}


class VertexRuns:
    """The fake Vertex API's pipeline runs and jobs (GET only), as their JSON."""

    def __init__(self) -> None:
        self.rest = RestFake()
        self.resources: dict[str, Any] = {}
        pattern = rf"/v1/({PARENT}/(pipelineJobs|customJobs|hyperparameterTuningJobs|models)/[^/?]+)"
        self.rest.route("GET", pattern, self.get)

    def serve(self, job: v1.PipelineJob, jobs: dict[str, Any]) -> None:
        self.resources = {job.name: job, **jobs}

    def get(self, match: re.Match[str], _q: Any, _b: Any) -> tuple[int, Any]:
        found = self.resources.get(urllib.parse.unquote(match.group(1)))
        if found is None:
            return 404, {
                "error": {"code": 404, "message": f"{match.group(1)} not found", "status": "NOT_FOUND"}
            }
        return 200, json.loads(type(found).to_json(found, use_integers_for_enums=False))

    def paths(self) -> list[str]:
        return [path for method, path, _, _ in self.rest.requests if method == "GET"]


@pytest.fixture
def vertex() -> Iterator[VertexRuns]:
    fake = VertexRuns()
    yield fake
    fake.rest.stop()


@pytest.fixture
def model_folder(gcs: Any) -> str:
    gcs.bucket(TEST_BUCKET).blob("root/run/train/model/metrics.json").upload_from_string(json.dumps(METRICS))
    return MODEL_DIR


def env(vertex: VertexRuns, **extra: str) -> dict[str, str]:
    return {
        "PROJECT_ID": "p-proj",
        "REGION": "us-central1",
        "PIPELINE_ROOT": f"gs://{TEST_BUCKET}/root",
        "ARTIFACT_REPOSITORY": "us-central1-docker.pkg.dev/p-proj/training",
        "API_ENDPOINT": f"http://{vertex.rest.address}",
        **extra,
    }


def make_report(vertex: VertexRuns, tmp_path: Path, run: str, **extra: str) -> int:
    return vertexreport.main(
        [run, "--runs_dir", str(tmp_path / "runs")],
        env(vertex, **extra),
        Path("/nonexistent"),
        credentials=AnonymousCredentials(),
        transport="rest",
        now=at(1000),
    )


# --- make report -----------------------------------------------------------------------------


@pytest.mark.usefixtures("fresh_aiplatform", "model_folder")
def test_the_report_of_a_finished_run(
    vertex: VertexRuns, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    vertex.serve(*finished_run())
    assert make_report(vertex, tmp_path, JOB_ID) == 0
    folder = tmp_path / "runs" / JOB_ID
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["target"] == "vertex" and summary["status"] == "SUCCEEDED"
    assert summary["resource_name"] == NAME and summary["run_id"] == JOB_ID
    assert summary["pipeline"] == "multiworker-cassava-training"
    assert summary["wall_seconds"] == 2000.0 and summary["queued_seconds"] == 5.0
    assert summary["console"].endswith(f"/pipelines/runs/{JOB_ID}?project=p-proj")
    assert "unreadable" not in summary, summary.get("unreadable")

    steps = {s["name"]: s for s in summary["steps"]}
    assert steps["a-launcher"]["status"] == "SUCCEEDED"
    assert steps["a-launcher"]["queued_seconds"] == 30.0 and steps["a-launcher"]["run_seconds"] == 360.0
    assert steps["a-launcher"]["offset_seconds"] == 10.0 and steps["a-launcher"]["seconds"] == 390.0
    assert steps["a-launcher"]["created"] == "2026-01-01T00:00:10+00:00"
    assert steps["a-launcher"]["jobs"] == [PREPARE_JOB]
    assert steps["never-ran"]["status"] == "NOT_TRIGGERED" and steps["never-ran"]["offset_seconds"] is None
    assert steps[JOB_ID]["group"] and steps["some-group"]["group"] and not steps["searching"]["group"]
    # Creation order, what never started last.
    assert [s["name"] for s in summary["steps"]][-1] == "never-ran"
    assert [s["name"] for s in summary["steps"]][:3] == [JOB_ID, "a-launcher", "some-group"]

    jobs = {j["name"]: j for j in summary["jobs"]}
    assert set(jobs) == {PREPARE_JOB, TRAIN_JOB, TUNING_JOB}  # not the upload's VertexLro
    prepare = jobs[PREPARE_JOB]
    assert prepare["type"] == "CustomJob" and prepare["task"] == "a-launcher"
    assert prepare["state"] == "JOB_STATE_SUCCEEDED"
    assert (prepare["queued_seconds"], prepare["run_seconds"], prepare["offset_seconds"]) == (
        120.0,
        229.0,
        41.0,
    )
    assert jobs[TRAIN_JOB]["queued_seconds"] == 180.0
    tuning_job = jobs[TUNING_JOB]
    assert tuning_job["type"] == "HyperparameterTuningJob" and tuning_job["task"] == "searching"
    assert [(t["id"], t["state"], t["run_seconds"]) for t in tuning_job["trials"]] == [
        ("1", "SUCCEEDED", 200.0),
        ("2", "SUCCEEDED", 340.0),
    ]

    assert summary["metrics"] == {k: METRICS[k] for k in report.SUMMARY_METRICS}
    assert summary["gate"] == {
        "promote": True,
        "reason": "accuracy 0.8100 >= min_score 0.5; no champion yet",
        "description": "accuracy 0.8100 on 10 test images",
        "score": 0.81,
        "champion_score": -1.0,
        "metric": "accuracy",
        "champion": True,
        "evaluation_import": f"{VERSION.split('@')[0]}/evaluations/9",
        "rule": "not_worse",
        "comparison": COMPARISON,
    }
    assert summary["parameters"]["epochs"] == 3  # sent, over the template's default
    assert summary["model"] == {
        "name": "cassava",
        "version": "3",
        "path": VERSION,
        "resource_name": VERSION,
        "champion": True,
        "aliases": ["champion", "default"],
        "serving_image": SERVING_IMAGE,
    }
    assert summary["tuning"]["metric_id"] == "val_accuracy" and summary["tuning"]["goal"] == "MAXIMIZE"
    assert summary["tuning"]["best"]["trial_id"] == "2"
    assert [t["id"] for t in summary["tuning"]["trials"]] == ["1", "2"]
    assert summary["parameters"]["model_display_name"] == "cassava"

    page = (folder / "report.html").read_text()
    assert summary["report"] == str((folder / "report.html").resolve())
    for picture in ("step timeline", "training curves", "confusion matrix", "tuning trials"):
        assert re.search(
            rf"<img alt='{picture}' src='data:image/png;base64,[A-Za-z0-9+/=]{{100,}}'>", page
        ), picture
    assert "the light part is the wait before Vertex started it" in page
    assert f"<td>{PREPARE_JOB}</td>" in page and "<td>120.0</td>" in page  # the jobs table
    assert "<td>promote</td>" in page and "<td>3</td>" in page
    assert "Paired comparison" in page and "gate_rule=not_worse" in page

    # The Gantt chart's bars: the steps (no groups) in creation order, each job under its
    # launcher, a tuning job's trials under it; the create -> start part where known.
    bars = report.timeline_rows(summary)
    assert [b["label"] for b in bars] == [
        "a-launcher",
        "\u21b3 CustomJob 111",
        "searching",
        "\u21b3 HyperparameterTuningJob 333",
        "\u21b3 trial 1",
        "\u21b3 trial 2",
        "another-launcher",
        "\u21b3 CustomJob 222",
        "folder-step",
        "judge",
        "imports-parent",
        "registers",
    ]
    assert (bars[0]["start"], bars[0]["queued"], bars[0]["run"]) == (10.0, 30.0, 360.0)
    assert (bars[1]["start"], bars[1]["queued"], bars[1]["run"]) == (41.0, 120.0, 229.0)
    assert bars[4]["queued"] is None and bars[4]["start"] == 500.0
    assert not any(b["running"] for b in bars)

    out = capsys.readouterr().out
    assert f"run {JOB_ID}: SUCCEEDED (2000 s)" in out
    assert re.search(r"a-launcher\s+SUCCEEDED\s+waited\s+30\.0s\s+ran\s+360\.0s", out)
    assert f"summary: {folder.resolve() / 'summary.json'}" in out
    # Only reads: the run, then its three jobs, then the model version.
    version = VERSION.replace("@", "%40")
    assert vertex.paths() == [
        f"/v1/{NAME}",
        f"/v1/{PREPARE_JOB}",
        f"/v1/{TUNING_JOB}",
        f"/v1/{TRAIN_JOB}",
        f"/v1/{version}",
    ]
    assert "aliases ['champion', 'default']" in out and "preflight validations: " in out


DATAFLOW_JOB = "2026-01-01_00_02_10-1234567890"
DATAFLOW_URI = (
    f"https://dataflow.googleapis.com/v1b3/projects/p-proj/locations/us-central1/jobs/{DATAFLOW_JOB}"
)
DATAFLOW_PATH = f"/v1b3/projects/p-proj/locations/us-central1/jobs/{DATAFLOW_JOB}"


def dataflow_run(vertex: VertexRuns) -> list[dict[str, list[str]]]:
    """A run with prepare_engine=beam: a launch task and a wait task both naming one Dataflow job
    (GCPC's flex-template launcher writes its gcp_resources, the wait step passes them on), the
    training's CustomJob after them. The fake serves the Dataflow job and its messages, built from
    dataflow_v1beta3's types, beside the Vertex API; returns the Dataflow requests' queries."""
    from google.cloud import dataflow_v1beta3 as dataflow

    finished, jobs = finished_run()
    named = json.dumps({"resources": [{"resourceType": "DataflowJob", "resourceUri": DATAFLOW_URI}]})
    tasks = [
        task(1, JOB_ID, "SUCCEEDED", (0, 5, 2000)),
        task(2, "launches", "SUCCEEDED", (10, 100, 130), outputs={"gcp_resources": named}),
        task(3, "waits", "SUCCEEDED", (130, 160, 880), outputs={"gcp_resources": named}),
        task(
            4,
            "trains",
            "SUCCEEDED",
            (900, 930, 1500),
            outputs={"gcp_resources": resources("CustomJob", TRAIN_JOB)},
        ),
    ]
    job = v1.PipelineJob(finished)
    job.job_detail = v1.PipelineJobDetail(task_details=tasks)
    vertex.serve(job, {TRAIN_JOB: jobs[TRAIN_JOB]})
    flow = dataflow.Job(
        id=DATAFLOW_JOB,
        project_id="p-proj",
        location="us-central1",
        current_state=dataflow.JobState.JOB_STATE_DONE,
        create_time=at(130),
        start_time=at(130),
        current_state_time=at(850),
    )
    said = [
        (at(232), dataflow.JobMessageImportance.JOB_MESSAGE_BASIC, "Workers have started successfully."),
        (at(135), dataflow.JobMessageImportance.JOB_MESSAGE_BASIC, "Starting 8 workers in us-central1-b..."),
        (at(848), dataflow.JobMessageImportance.JOB_MESSAGE_BASIC, "Worker pool stopped."),
    ]
    messages = dataflow.ListJobMessagesResponse(
        job_messages=[
            dataflow.JobMessage(id=str(i), time=t, message_importance=level, message_text=text)
            for i, (t, level, text) in enumerate(said)
        ]
    )
    queries: list[dict[str, list[str]]] = []

    def answer(message: Any) -> Any:
        def handler(_m: Any, query: dict[str, list[str]], _b: Any) -> tuple[int, Any]:
            queries.append(query)
            return 200, json.loads(type(message).to_json(message, use_integers_for_enums=False))

        return handler

    vertex.rest.route("GET", re.escape(DATAFLOW_PATH), answer(flow))
    vertex.rest.route("GET", re.escape(f"{DATAFLOW_PATH}/messages"), answer(messages))
    return queries


@pytest.mark.usefixtures("fresh_aiplatform", "model_folder")
def test_a_dataflow_preparation_is_reported_with_its_times_and_first_messages(
    vertex: VertexRuns, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """prepare_engine=beam: the Dataflow job the launch and wait steps name is read once with the
    real dataflow_v1beta3 client (REST, at the fake), and its messages' times from its creation
    are kept and printed: that is where a real run says how long Dataflow took to start workers."""
    queries = dataflow_run(vertex)
    code = vertexreport.main(
        [JOB_ID, "--runs_dir", str(tmp_path / "runs")],
        env(vertex),
        Path("/nonexistent"),
        credentials=AnonymousCredentials(),
        transport="rest",
        now=at(2000),
        dataflow_endpoint=f"http://{vertex.rest.address}",
    )
    assert code == 0
    summary = json.loads((tmp_path / "runs" / JOB_ID / "summary.json").read_text())
    assert "unreadable" not in summary, summary["unreadable"]
    [flow] = [j for j in summary["jobs"] if j["type"] == "DataflowJob"]
    assert flow["name"] == f"projects/p-proj/locations/us-central1/jobs/{DATAFLOW_JOB}"
    assert flow["task"] == "launches" and flow["job_id"] == DATAFLOW_JOB
    assert flow["state"] == "JOB_STATE_DONE"
    assert (flow["offset_seconds"], flow["seconds"]) == (130.0, 720.0)
    assert [(m["seconds"], m["text"]) for m in flow["messages"]] == [
        (5.0, "Starting 8 workers in us-central1-b..."),
        (102.0, "Workers have started successfully."),
        (718.0, "Worker pool stopped."),
    ]
    steps = {s["name"]: s for s in summary["steps"]}
    assert steps["waits"]["jobs"] == steps["launches"]["jobs"] == [flow["name"]]
    # The job once, its messages once, at the level asked (BASIC and above).
    assert len(queries) == 2
    from google.cloud import dataflow_v1beta3 as dataflow

    assert queries[0].get("view") == [str(int(dataflow.JobView.JOB_VIEW_SUMMARY))]
    assert queries[1].get("minimumImportance") == [str(int(dataflow.JobMessageImportance.JOB_MESSAGE_BASIC))]
    out = capsys.readouterr().out
    assert f"dataflow job {DATAFLOW_JOB}: JOB_STATE_DONE, 720 s; its first messages:" in out
    assert "+  102.0s Workers have started successfully." in out
    assert [b["label"] for b in report.timeline_rows(summary)][:3] == [
        "launches",
        f"\u21b3 DataflowJob {DATAFLOW_JOB}",
        "waits",
    ]


@pytest.mark.usefixtures("fresh_aiplatform", "gcs")
def test_a_run_still_running_is_reported_as_running(vertex: VertexRuns, tmp_path: Path) -> None:
    vertex.serve(*running_run())
    # The resource name form: its own project and region; PROJECT_ID and REGION are not needed.
    code = make_report(vertex, tmp_path, NAME, PROJECT_ID="", REGION="")
    assert code == 0
    folder = tmp_path / "runs" / JOB_ID
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "RUNNING" and summary["state"] == "PIPELINE_STATE_RUNNING"
    assert summary["ended"] is None and summary["as_of"] == "2026-01-01T00:16:40+00:00"
    assert summary["wall_seconds"] == 1000.0  # so far
    steps = {s["name"]: s for s in summary["steps"]}
    training = steps["another-launcher"]
    assert training["status"] == "RUNNING" and training["ended"] is None
    assert training["queued_seconds"] == 30.0 and training["run_seconds"] == 70.0  # till now
    [job] = [j for j in summary["jobs"] if j["name"] == TRAIN_JOB]
    assert job["state"] == "JOB_STATE_RUNNING" and job["ended"] is None
    assert (job["queued_seconds"], job["run_seconds"]) == (29.0, 40.0)
    assert summary["model"] is None and "gate" not in summary and summary["metrics"] == {}
    bars = report.timeline_rows(summary)
    assert [b["running"] for b in bars] == [False, False, True, True]
    page = (folder / "report.html").read_text()
    assert "<h1>multiworker-cassava-training: RUNNING</h1>" in page
    assert "Read at 2026-01-01T00:16:40+00:00." in page
    assert "<img alt='step timeline'" in page and "training curves" not in page


@pytest.mark.usefixtures("fresh_aiplatform", "gcs")
def test_what_cannot_be_read_is_named_and_the_report_goes_on(vertex: VertexRuns, tmp_path: Path) -> None:
    """A job that is gone (404) and a model folder without metrics.json: recorded, not fatal."""
    job, jobs = finished_run()
    del jobs[TRAIN_JOB]
    vertex.serve(job, jobs)
    assert make_report(vertex, tmp_path, JOB_ID) == 0
    summary = json.loads((tmp_path / "runs" / JOB_ID / "summary.json").read_text())
    unreadable = summary["unreadable"]
    assert any(u.startswith(f"{TRAIN_JOB}: 404") for u in unreadable), unreadable
    assert any(u.startswith(f"{MODEL_DIR}/metrics.json: 404") for u in unreadable), unreadable
    assert {j["name"]: j["state"] for j in summary["jobs"]}[TRAIN_JOB] == "UNKNOWN"
    assert summary["metrics"] == {} and summary["model"]["version"] == "3"
    assert (tmp_path / "runs" / JOB_ID / "report.html").exists()


@pytest.mark.parametrize(
    "run",
    [
        "",
        "Not-A-Run",
        "projects/p-proj/pipelineJobs/abc",
        f"{PARENT}/pipelineJobs/ABC",
        f"{PARENT}/customJobs/123",
        f"https://console.cloud.google.com/vertex-ai/locations/us-central1/pipelines/runs/{JOB_ID}?project=p-proj",
        "projects/p-proj/locations/mars-north1/pipelineJobs/abc",
    ],
)
def test_a_run_of_a_wrong_form_is_refused_in_one_line(
    vertex: VertexRuns, tmp_path: Path, capsys: pytest.CaptureFixture[str], run: str
) -> None:
    assert make_report(vertex, tmp_path, run) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("make report: RUN")
    if "mars" in run:
        assert "is not a Vertex AI region" in line
    else:
        assert (
            "a pipeline job id" in line and "projects/<project>/locations/<region>/pipelineJobs/<id>" in line
        )
    assert vertex.rest.requests == [] and not (tmp_path / "runs").exists()


def test_a_bare_job_id_needs_the_project_and_region(vertex: VertexRuns, tmp_path: Path) -> None:
    with pytest.raises(settings.SettingsError) as info:
        vertexreport.run_settings(
            vertexreport.parse_run(JOB_ID), {"REGION": "us-central1"}, Path("/nonexistent")
        )
    assert info.value.settings == ["PROJECT_ID"]
    run = vertexreport.parse_run(f" projects/123456/locations/europe-west4/pipelineJobs/{JOB_ID} ")
    config = vertexreport.run_settings(run, {}, Path("/nonexistent"))
    assert (config.project, config.region, run.job_id) == ("123456", "europe-west4", JOB_ID)
    assert make_report(vertex, tmp_path, JOB_ID, PROJECT_ID="") == 2


def test_a_run_in_another_region_is_not_asked_of_env_shs_endpoint() -> None:
    """An endpoint serves one region: Vertex refuses another region's resource there (400)."""
    run = vertexreport.parse_run(f"projects/p-proj/locations/europe-west4/pipelineJobs/{JOB_ID}")
    default = {"REGION": "us-central1", "API_ENDPOINT": "us-central1-aiplatform.googleapis.com"}
    assert vertexreport.run_settings(run, default, Path("/nonexistent")).api_endpoint == ""
    private = {"REGION": "us-central1", "API_ENDPOINT": "vertex.p.googleapis.com"}
    with pytest.raises(settings.SettingsError) as info:
        vertexreport.run_settings(run, private, Path("/nonexistent"))
    assert info.value.settings == ["API_ENDPOINT"]


@pytest.mark.usefixtures("fresh_aiplatform")
def test_a_run_vertex_does_not_know_is_one_line(
    vertex: VertexRuns, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert make_report(vertex, tmp_path, "no-such-run") == 1
    [line] = [line for line in capsys.readouterr().err.splitlines() if line]
    assert line.startswith(
        f"make report: Vertex AI has no pipeline run {PARENT}/pipelineJobs/no-such-run (404"
    )


@pytest.mark.usefixtures("fresh_aiplatform")
def test_unreachable_vertex_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = vertexreport.main(
        [JOB_ID, "--runs_dir", str(tmp_path)],
        {"PROJECT_ID": "p-proj", "REGION": "us-central1", "API_ENDPOINT": f"http://127.0.0.1:{port}"},
        Path("/nonexistent"),
        credentials=AnonymousCredentials(),
        transport="rest",
    )
    assert code == 1
    [line] = [line for line in capsys.readouterr().err.splitlines() if line]
    assert line.startswith(
        f"make report: cannot reach Vertex AI in us-central1 at 127.0.0.1:{port} (connection refused)"
    )
    assert "Likely causes" in line and "API_ENDPOINT" in line


# --- make run WAIT=1 ------------------------------------------------------------------------


@pytest.mark.usefixtures("fresh_aiplatform", "model_folder")
def test_make_run_wait_writes_the_report_when_the_run_ends(
    vertex: VertexRuns, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """submit() as `make run WAIT=1` calls it: the run is created, followed to its end (two polls),
    then reported from the PipelineJob the last poll read."""
    from google.cloud.aiplatform.utils import gcs_utils

    monkeypatch.setattr(
        gcs_utils, "create_gcs_bucket_for_pipeline_artifacts_if_it_does_not_exist", lambda **_: None
    )
    finished, jobs = finished_run()
    polls = []

    def create(_m: Any, query: dict[str, list[str]], body: dict[str, Any]) -> tuple[int, Any]:
        name = f"{PARENT}/pipelineJobs/{query['pipelineJobId'][0]}"
        finished.name = name
        return 200, {**body, "name": name, "state": "PIPELINE_STATE_PENDING"}

    def get(match: re.Match[str], query: Any, body: Any) -> tuple[int, Any]:
        if "/pipelineJobs/" in match.group(1):
            polls.append(match.group(1))
            if len(polls) < 2:
                return 200, {"name": match.group(1), "state": "PIPELINE_STATE_RUNNING"}
            vertex.serve(finished, jobs)
        return vertex.get(match, query, body)

    vertex.rest.routes.clear()
    vertex.rest.route("POST", rf"/v1/{PARENT}/pipelineJobs", create)
    vertex.rest.route("GET", rf"/v1/({PARENT}/(pipelineJobs|customJobs|hyperparameterTuningJobs)/[^/]+)", get)
    config = settings.load(env(vertex), Path("/nonexistent"))
    code = submit.submit(
        config,
        {},
        wait=True,
        credentials=AnonymousCredentials(),
        transport="rest",
        poll_seconds=0.01,
        runs_dir=tmp_path / "runs",
    )
    assert code == 0
    run_id = finished.name.rsplit("/", 1)[-1]
    summary = json.loads((tmp_path / "runs" / run_id / "summary.json").read_text())
    assert summary["status"] == "SUCCEEDED" and summary["model"]["version"] == "3"
    assert {j["name"] for j in summary["jobs"]} == {PREPARE_JOB, TRAIN_JOB, TUNING_JOB}
    assert summary["metrics"]["test_accuracy"] == 0.81
    assert "<img alt='step timeline'" in (tmp_path / "runs" / run_id / "report.html").read_text()
    out = capsys.readouterr().out
    assert out.index("run ended PIPELINE_STATE_SUCCEEDED") < out.index(f"run {run_id}: SUCCEEDED")


@pytest.mark.usefixtures("fresh_aiplatform")
def test_a_report_that_cannot_be_written_never_changes_how_the_run_ended(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job, _ = finished_run()

    class Followed:  # what submit() holds after watch(): the SDK's PipelineJob, last read
        gca_resource = job
        resource_name = NAME

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = settings.load(
        {
            "PROJECT_ID": "p-proj",
            "REGION": "us-central1",
            "PIPELINE_ROOT": f"gs://{TEST_BUCKET}/root",
            "ARTIFACT_REPOSITORY": "us-central1-docker.pkg.dev/p-proj/training",
            "API_ENDPOINT": f"http://127.0.0.1:{port}",
        },
        Path("/nonexistent"),
    )
    submit.init_aiplatform(config, AnonymousCredentials(), "rest")
    submit.write_run_report(Followed(), config, tmp_path / "runs", AnonymousCredentials())
    out = capsys.readouterr().out
    [line] = [line for line in out.splitlines() if line.startswith("WARNING")]
    assert "the run's report was not written" in line and f"make report RUN={NAME}" in line


# --- the local target's timeline, the summaries' keys, the make target -----------------------


def test_the_local_report_draws_the_steps_end_to_end(tmp_path: Path) -> None:
    """launch.cli's summary.json has each step's seconds, not its start: kfp.local runs one step
    at a time, so the bars are laid end to end."""
    summary = {
        "pipeline": "p",
        "run_id": "r1",
        "target": "local",
        "status": "FAILED",
        "error": "step train-model failed: JobFailed: replica chief-0 ...",
        "wall_seconds": 9.0,
        "model": None,
        "steps": [
            {"name": "prepare", "status": "SUCCESS", "seconds": 2.0, "log": "x"},
            {"name": "train-model", "status": "FAILURE", "seconds": 6.5, "log": "y"},
        ],
    }
    bars = report.timeline_rows(summary)
    assert [(b["label"], b["start"], b["queued"], b["run"]) for b in bars] == [
        ("prepare", 0.0, None, 2.0),
        ("train-model", 2.0, None, 6.5),
    ]
    page = report.write_report(tmp_path / "r.html", summary, None, None).read_text()
    assert re.search(r"<img alt='step timeline' src='data:image/png;base64,[A-Za-z0-9+/=]{100,}'>", page)
    assert "laid end to end" in page
    assert "<tr><td>train-model</td><td>FAILURE</td><td>6.5</td></tr>" in page  # the steps table as before
    assert "step train-model failed" in page


def test_both_targets_summaries_show_the_same_metrics_keys() -> None:
    from trainer import contract

    assert cli.METRICS_READ == report.SUMMARY_METRICS  # what launch.vertexrun shows
    assert set(report.SUMMARY_METRICS) <= set(contract.METRICS_KEYS)
    assert vertexrun.METRICS_FILE == contract.METRICS_FILE


def test_launched_jobs_are_read_from_gcp_resources_alone() -> None:
    assert vertexrun.launched_jobs({"gcp_resources": resources("CustomJob", PREPARE_JOB)}) == [
        ("CustomJob", PREPARE_JOB)
    ]
    assert vertexrun.launched_jobs({"gcp_resources": resources("VertexLro", f"{PARENT}/operations/9")}) == []
    assert vertexrun.launched_jobs({"gcp_resources": "not json"}) == []
    assert vertexrun.launched_jobs({"Output": "x"}) == []


@pytest.mark.process
@pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed")
def test_make_report_hands_run_over_verbatim_and_refuses_a_wrong_form(tmp_path: Path) -> None:
    pwned = tmp_path / "pwned"
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS", "GOOGLE_"))}
    environ.pop("PROJECT_ID", None)
    result = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "-C",
            str(ROOT),
            "-o",
            ".venv/.setup-stamp",
            f"PY={sys.executable}",
            "report",
            f'RUN=$(shell touch {pwned}) x"; touch {pwned}; echo "',
        ],
        env={**environ, "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert not pwned.exists()
    [line] = [line for line in result.stderr.splitlines() if line.startswith("make report: RUN=")]
    assert line.startswith(f"make report: RUN='$(shell touch {pwned}) x") and "is not a pipeline run" in line
    assert "make report: exit code 2, usage or settings error" in result.stderr


@pytest.mark.usefixtures("fresh_aiplatform", "model_folder")
def test_a_promotion_the_alias_never_reached_is_not_reported_as_champion(
    vertex: VertexRuns, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The gate promoted, but its compare-and-set refused (another run moved the alias): the
    report follows the gate's `champion` output and the registry's aliases, not `promote`."""
    job, jobs = finished_run()
    judge = next(t for t in job.job_detail.task_details if t.task_name == "judge")
    judge.execution.metadata.update(
        {"output:champion": False, "output:evaluation_import": "refused: 400 bad"}
    )
    jobs[VERSION] = v1.Model(
        name=VERSION.split("@")[0],
        version_id="3",
        container_spec=v1.ModelContainerSpec(image_uri=SERVING_IMAGE),
    )
    vertex.serve(job, jobs)
    assert make_report(vertex, tmp_path, JOB_ID) == 0
    summary = json.loads((tmp_path / "runs" / JOB_ID / "summary.json").read_text())
    assert summary["gate"]["promote"] is True and summary["model"]["champion"] is False
    assert summary["model"]["aliases"] == []
    assert summary["gate"]["evaluation_import"].startswith("refused")
    assert "refused: 400 bad" in capsys.readouterr().out
