"""What a Vertex run's own records say, as `summary.json` and `report.html` in
`<runs_dir>/<job id>/`, the files a local run leaves: for `make report` (launch.vertexreport) and
for `make run WAIT=1` when the run ends (launch.submit).

Read through the real client libraries (`launch.vertexreader.Reader`):

- the PipelineJob: its state and times, each task's state and create -> start -> end (aiplatform_v1
  `PipelineTaskDetail.create_time`, `start_time`, `end_time`, `state`), output parameters (its
  `execution`'s metadata under `output:<name>`, as aiplatform's `PipelineJob.run` reads them,
  google/cloud/aiplatform/pipeline_jobs.py) and output artifacts (`outputs`);
- each job a task's `gcp_resources` names (GCPC's job_remote_runner writes `{"resources":
  [{"resourceType": "CustomJob", "resourceUri": "https://<endpoint>/v1/<job name>"}]}`): its state
  and create -> start -> end (aiplatform_v1 `CustomJob.start_time`: "Time when the CustomJob for
  the first time entered the JOB_STATE_RUNNING state"), and a tuning job's trials
  (`HyperparameterTuningJob.trials`);
- a Dataflow job (prepare_engine=beam: `DATAFLOW_JOB`, dataflow_v1beta3): its state and times
  (`start_time` equals `create_time` for all but FlexRS jobs; `current_state_time` is the end once
  the state is terminal) and its first messages of importance JOB_MESSAGE_BASIC and above
  (`MessagesV1Beta3.ListJobMessages`), timed from its creation: the workers' start-up, for which
  Google publishes no figure (docs/training.md#preparing-on-apache-beam);
- the trainer's metrics.json beside the run's Model artifact (`_metrics`), the gate's decision
  (`_gate`) and the model version GCPC's ModelUploadOp made (`_model`).

Tasks are read by their state, times, outputs and `gcp_resources`, never by their names.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from launch import report
from launch.vertexreader import Reader

METRICS_FILE = "metrics.json"  # trainer.contract.METRICS_FILE (the trainer is not imported here)

_JOB_URI = re.compile(r"/v1/(projects/[^/]+/locations/[^/]+/(customJobs|hyperparameterTuningJobs)/[^/?#]+)$")
DATAFLOW_JOB = "DataflowJob"
# A gcp_resources' resourceUri by its resourceType: a Vertex job's as GCPC's job_remote_runner
# writes it (module docstring); a Dataflow job's as GCPC 2.22's flex-template launcher names it
# (container/preview/dataflow/flex_template/remote_runner.py) and its wait launcher parses it
# (container/v1/wait_gcp_resources/remote_runner.py, _DATAFLOW_URI_TEMPLATE).
_JOB_URIS = {
    "CustomJob": _JOB_URI,
    "HyperparameterTuningJob": _JOB_URI,
    DATAFLOW_JOB: re.compile(
        r"^https://dataflow\.googleapis\.com/v1b3/(projects/[^/]+/locations/[^/]+/jobs/[^/?#]+)$"
    ),
}
# Dataflow's terminal job states (dataflow_v1beta3 JobState: "a terminal job state").
DATAFLOW_TERMINAL = (
    "JOB_STATE_DONE",
    "JOB_STATE_FAILED",
    "JOB_STATE_CANCELLED",
    "JOB_STATE_UPDATED",
    "JOB_STATE_DRAINED",
)


def _plain(message: Any, field: str) -> Any:
    """A proto-plus message's field as plain JSON values (Struct, Value, maps, enums by name)."""
    from google.protobuf import json_format

    raw = type(message).pb(message)
    return json_format.MessageToDict(getattr(raw, field)) if raw.HasField(field) else {}


def _seconds(start: datetime.datetime | None, end: datetime.datetime | None) -> float | None:
    return round((end - start).total_seconds(), 2) if start and end else None


def _timing(
    created: datetime.datetime | None,
    started: datetime.datetime | None,
    ended: datetime.datetime | None,
    origin: datetime.datetime | None,
    now: datetime.datetime,
) -> dict[str, Any]:
    """The times of a task, job or trial and the parts the timeline draws: `queued_seconds` (create
    -> start, None when either is unknown), `run_seconds` (start -> end, or -> now while it runs),
    `offset_seconds` (from the run's creation to its creation, else start) and `seconds` (its bar)."""
    first = created or started
    last = ended or (now if started else None)
    return {
        "created": created.isoformat() if created else None,
        "started": started.isoformat() if started else None,
        "ended": ended.isoformat() if ended else None,
        "queued_seconds": _seconds(created, started),
        "run_seconds": _seconds(started, last),
        "seconds": _seconds(first, last) or 0.0,
        "offset_seconds": _seconds(origin, first) if origin and first else None,
    }


def launched_jobs(outputs: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(resource type, job name) of each CustomJob, HyperparameterTuningJob or DataflowJob named
    in a task's `gcp_resources` output parameter (a JSON string: GCPC's GcpResources message)."""
    try:
        resources = json.loads(outputs.get("gcp_resources", "")).get("resources", [])
    except (TypeError, ValueError, AttributeError):  # TypeError: not a string
        return []
    found = []
    for resource in resources if isinstance(resources, list) else []:
        kind = str(resource.get("resourceType")) if isinstance(resource, dict) else ""
        if kind in _JOB_URIS and (match := _JOB_URIS[kind].search(str(resource.get("resourceUri", "")))):
            found.append((kind, match.group(1)))
    return found


def _dataflow_entry(
    read: tuple[Any, list[Any]] | None, origin: datetime.datetime | None, now: datetime.datetime
) -> dict[str, Any]:
    """A Dataflow job's part of its `jobs` entry: state, times and first messages (`Reader.dataflow_job`)."""
    from google.cloud import dataflow_v1beta3 as dataflow

    if read is None:
        return {"state": "UNKNOWN"}
    job, messages = read
    state = dataflow.JobState(job.current_state).name
    ended = job.current_state_time if state in DATAFLOW_TERMINAL else None
    return {
        "state": state,
        **_timing(job.create_time, job.start_time or job.create_time, ended, origin, now),
        "job_id": job.id,
        "messages": [
            {
                "seconds": _seconds(job.create_time, m.time),
                "importance": dataflow.JobMessageImportance(m.message_importance).name,
                "text": m.message_text,
            }
            for m in sorted(messages, key=lambda m: m.time)
        ],
    }


def collect(
    job: Any, reader: Reader, now: datetime.datetime | None = None, console: str = ""
) -> tuple[dict[str, Any], dict[str, Any] | None, list[Any] | None]:
    """summary.json's content for the aiplatform_v1 PipelineJob `job`, with the metrics and
    trials the report draws (as `launch.cli` gives them for a local run)."""
    from google.cloud.aiplatform_v1.types import JobState, PipelineTaskDetail

    now = now or datetime.datetime.now(datetime.UTC)
    origin = job.create_time or job.start_time
    job_id = job.name.rsplit("/", 1)[-1]
    tasks = list(job.job_detail.task_details)
    parents = {t.parent_task_id for t in tasks if t.parent_task_id}
    # The run's parameters: those sent over the template's defaults (make run sends the flags given).
    declared = _plain(job, "pipeline_spec").get("root", {}).get("inputDefinitions", {}).get("parameters", {})
    defaults = {name: p["defaultValue"] for name, p in declared.items() if "defaultValue" in p}
    parameters = {**defaults, **_plain(job, "runtime_config").get("parameterValues", {})}
    steps: list[dict[str, Any]] = []
    jobs: list[dict[str, Any]] = []
    outputs_of: dict[int, dict[str, Any]] = {}
    artifacts_of: dict[int, list[dict[str, Any]]] = {}
    trials: list[Any] | None = None
    tuning: dict[str, Any] | None = None
    for task in tasks:
        metadata = _plain(task.execution, "metadata") if task.execution else {}
        outputs = {k.removeprefix("output:"): v for k, v in metadata.items() if k.startswith("output:")}
        outputs_of[task.task_id] = outputs
        artifacts_of[task.task_id] = [
            {
                "schema_title": a.schema_title,
                "uri": a.uri,
                "metadata": _plain(a, "metadata"),
            }
            for listed in task.outputs.values()
            for a in listed.artifacts
        ]
        step: dict[str, Any] = {
            "name": task.task_name,
            "status": PipelineTaskDetail.State(task.state).name,
            **_timing(task.create_time, task.start_time, task.end_time, origin, now),
            "task_id": task.task_id,
            "parent_task_id": task.parent_task_id,
            # The run's own task (its name is the job id) and the DAG's groups (conditions, loops:
            # the parents of other tasks) hold steps; they are listed, not drawn.
            "group": task.task_id in parents or task.task_name == job_id,
        }
        if task.task_unique_name and task.task_unique_name != task.task_name:
            step["unique_name"] = task.task_unique_name
        if task.error and task.error.message:
            step["error"] = task.error.message
        if launched := launched_jobs(outputs):
            step["jobs"] = [name for _, name in launched]
        steps.append(step)
        for kind, name in launched:
            entry: dict[str, Any] = {
                "task": task.task_name,
                "task_id": task.task_id,
                "type": kind,
                "name": name,
            }
            if kind == DATAFLOW_JOB:
                # The launch and the wait step both name it: read and listed once, under the first.
                if name not in {j["name"] for j in jobs}:
                    jobs.append({**entry, **_dataflow_entry(reader.dataflow_job(name), origin, now)})
                continue
            found = reader.job(name)
            if found is None:
                jobs.append({**entry, "state": "UNKNOWN"})
                continue
            entry["state"] = JobState(found.state).name
            entry.update(_timing(found.create_time, found.start_time, found.end_time, origin, now))
            if found.error and found.error.message:
                entry["error"] = found.error.message
            if kind == "HyperparameterTuningJob":
                trials, entry["trials"], tuning = _tuning(found, origin, now)
            jobs.append(entry)
    state = job.state.name if job.state is not None else "PIPELINE_STATE_UNSPECIFIED"
    status = state.removeprefix("PIPELINE_STATE_")
    failed = next((s for s in steps if s["status"] == "FAILED" and not s["group"]), None)
    cause = f": {failed['error']}" if failed and failed.get("error") else ""
    error = (job.error and job.error.message) or (f"step {failed['name']} failed{cause}" if failed else "")
    run_timing = _timing(job.create_time, job.start_time, job.end_time, origin, now)
    metrics = _metrics(tasks, artifacts_of, reader)
    gate = _gate(outputs_of, parameters)
    summary: dict[str, Any] = {
        "pipeline": _plain(job, "pipeline_spec").get("pipelineInfo", {}).get("name") or job.display_name,
        "run_id": job_id,
        "target": "vertex",
        "status": status,
        "state": state,
        "error": error,
        "resource_name": job.name,
        "console": console,
        **{k: run_timing[k] for k in ("created", "started", "ended", "queued_seconds")},
        "wall_seconds": run_timing["seconds"],
        "as_of": now.isoformat(),
        "steps": sorted(steps, key=_order),
        "jobs": sorted(jobs, key=_order),
        "metrics": {k: metrics[k] for k in report.SUMMARY_METRICS if k in metrics} if metrics else {},
        "model": _model(outputs_of, artifacts_of, parameters, gate, status, reader),
        "report": None,
        "parameters": parameters,
        # Vertex's preflight validations were asked for at submission (the run exists: they passed).
        "preflight_validations": bool(job.preflight_validations),
    }
    if gate:
        summary["gate"] = gate
    if tuning is not None:
        summary["tuning"] = tuning
    if reader.unreadable:
        summary["unreadable"] = list(reader.unreadable)
    return summary, metrics, trials


def _order(entry: Mapping[str, Any]) -> tuple[bool, float, str]:
    """Creation order; what has not started yet last, by name."""
    offset = entry.get("offset_seconds")
    return (offset is None, offset or 0.0, str(entry.get("name", "")))


def _tuning(
    job: Any, origin: Any, now: datetime.datetime
) -> tuple[list[Any], list[dict[str, Any]], dict[str, Any]]:
    """The trials (aiplatform_v1 Trial JSON, as the best-trial step writes it), their times (a start and
    an end, no creation time), and the study's metric, goal, trials and best (components.tuning's pick)."""
    from google.cloud.aiplatform_v1.types import StudySpec, Trial

    from components.tuning import pick_best_trial

    table = [json.loads(Trial.to_json(t, use_integers_for_enums=False)) for t in job.trials]
    times = [
        {
            "id": t.id,
            "state": Trial.State(t.state).name,
            **_timing(None, t.start_time, t.end_time, origin, now),
        }
        for t in job.trials
    ]
    metric = next(iter(job.study_spec.metrics), None)
    metric_id = metric.metric_id if metric else ""
    goal = StudySpec.MetricSpec.GoalType(metric.goal).name if metric else ""
    try:
        best = pick_best_trial(table, metric_id, goal)
    except (RuntimeError, ValueError):
        best = None
    return table, times, {"metric_id": metric_id, "goal": goal, "trials": table, "best": best}


def _metrics(
    tasks: Sequence[Any], artifacts_of: Mapping[int, list[dict[str, Any]]], reader: Reader
) -> dict[str, Any] | None:
    """The trainer's metrics.json beside the run's model: in the folder of a `system.Model` output
    artifact of a task that succeeded (the last such one, when there are several)."""
    from google.cloud.aiplatform_v1.types import PipelineTaskDetail

    done = (PipelineTaskDetail.State.SUCCEEDED, PipelineTaskDetail.State.SKIPPED)
    models = [
        a
        for t in sorted(tasks, key=lambda t: t.end_time.timestamp() if t.end_time else 0.0)
        if t.state in done
        for a in artifacts_of[t.task_id]
        if a["schema_title"] == "system.Model" and a["uri"].startswith("gs://")
    ]
    if not models:
        return None
    text = reader.text(models[-1]["uri"].rstrip("/") + "/" + METRICS_FILE)
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as err:
        reader.unreadable.append(f"{models[-1]['uri']}/{METRICS_FILE}: {err}")
        return None
    return value if isinstance(value, dict) else None


def _gate(
    outputs_of: Mapping[int, Mapping[str, Any]], parameters: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The gate's decision: the output parameters of the task that has `promote` (and `reason`)."""
    for outputs in outputs_of.values():
        if "promote" in outputs and "reason" in outputs:
            keys = ("champion", "description", "score", "champion_score", "evaluation_import")
            return {
                "promote": bool(outputs["promote"]),
                "reason": outputs["reason"],
                "metric": parameters.get("gate_metric"),
                **{key: outputs[key] for key in keys if key in outputs},
                # The paired comparison behind the decision, as a local run's summary has it.
                "rule": parameters.get("gate_rule"),
                "comparison": outputs.get("comparison") or None,
            }
    return None


def _model(
    outputs_of: Mapping[int, Mapping[str, Any]],
    artifacts_of: Mapping[int, list[dict[str, Any]]],
    parameters: Mapping[str, Any],
    gate: Mapping[str, Any] | None,
    status: str,
    reader: Reader,
) -> dict[str, Any] | None:
    """The model version the run made (`...models/<id>@<version>`): the `resourceName` of a
    `google.VertexModel` output of a launcher task (one with `gcp_resources`: an importer's is an
    input, not a version made), with the registry's aliases and serving image for it now."""
    for task_id, outputs in outputs_of.items():
        if "gcp_resources" not in outputs:
            continue
        for artifact in artifacts_of[task_id]:
            name = str(artifact["metadata"].get("resourceName", ""))
            if artifact["schema_title"] == "google.VertexModel" and "@" in name:
                model, _, version = name.partition("@")
                entry = {
                    "name": parameters.get("model_display_name") or model.rsplit("/", 1)[-1],
                    "version": version,
                    "path": name,
                    "resource_name": name,
                    # Whether the alias reached it: the gate's `champion` output (false when the
                    # compare-and-set refused, though it promoted), once the run got to its end.
                    "champion": bool(gate.get("champion")) if gate and status == "SUCCEEDED" else None,
                }
                found = reader.model_version(name)
                if found is not None:
                    # The registry's word, by version ID: the name read back may spell the project
                    # by its number where the upload spelled it by its ID.
                    entry["aliases"] = sorted(found.version_aliases)
                    entry["serving_image"] = found.container_spec.image_uri
                    if found.version_id == version and status == "SUCCEEDED":
                        entry["champion"] = "champion" in found.version_aliases
                return entry
    return None


def write(
    job: Any, reader: Reader, runs_dir: Path, now: datetime.datetime | None = None, console: str = ""
) -> None:
    """`<runs_dir>/<job id>/`'s summary.json, then report.html (`report.draw_report`), then `show`.
    OSError: summary.json was not written."""
    summary, metrics, trials = collect(job, reader, now, console)
    run_dir = (runs_dir / summary["run_id"]).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    summary["report"] = str(run_dir / "report.html")
    report.write_json(run_dir / "summary.json", summary)
    report.draw_report(run_dir, summary, metrics, trials)
    show(summary, run_dir)


def show(summary: Mapping[str, Any], run_dir: Path) -> None:
    """What `make report` and `make run WAIT=1` print: state, each step's wait and run, the files."""
    lines = [f"run {summary['run_id']}: {summary['status']} ({summary['wall_seconds']:.0f} s)"]
    for step in summary["steps"]:
        if step["group"]:
            continue
        queued, ran = step["queued_seconds"], step["run_seconds"]
        lines.append(
            f"  {step['name']:<32} {step['status']:<13}"
            + (f" waited {queued:7.1f}s" if queued is not None else " " * 15)
            + (f"  ran {ran:7.1f}s" if ran is not None else "")
        )
    for job in summary.get("jobs", []):
        if job["type"] != DATAFLOW_JOB or "messages" not in job:
            continue
        lines.append(
            f"  dataflow job {job['job_id']}: {job['state']}, {job['seconds']:.0f} s; its first messages:"
        )
        lines += [
            f"    +{m['seconds']:7.1f}s {m['text']}" for m in job["messages"][:10] if m["seconds"] is not None
        ]
    model, gate = summary.get("model") or {}, summary.get("gate") or {}
    if model:
        lines.append(
            f"  model version {model['path']}: aliases {model.get('aliases', 'not read')}, serving image "
            f"{model.get('serving_image', 'not read')}"
        )
    if gate.get("evaluation_import"):
        lines.append(f"  evaluation on the version: {gate['evaluation_import']}")
    lines.append(f"  preflight validations: {'passed' if summary.get('preflight_validations') else 'off'}")
    lines += [f"WARNING: not read: {warning}" for warning in summary.get("unreadable", [])]
    if summary.get("report_error"):
        lines.append(f"WARNING: report.html was not written ({summary['report_error']}); see summary.json")
    lines.append(f"summary: {run_dir / 'summary.json'}")
    if summary.get("report"):
        lines.append(f"report:  {summary['report']}")
    print("\n".join(lines), flush=True)
