"""What Vertex AI Pipelines does with the compiled template, short of Google Cloud.

For one run's parameter values, `plan` resolves the tasks that feed the jobs as Vertex would (the
real `plan_jobs`, `apply_hyperparameters` and `upload_settings` bodies on the values the template
hands them; the importers from their compiled specs), and `launch`
renders one GCPC task's command line from the compiled template (its module, its args, the
payload through `tests.test_pipeline.render_payload`, the executor input and the `IfPresent`
arguments) and runs that launcher in-process. Only the final RPC is faked (`VertexFake`):
JobService over gRPC (the GAPIC client the launchers make, on an insecure channel), the
Model upload over REST (the upload launcher posts with `requests`), both parsing every request
strictly into its aiplatform_v1 request type, and, for a run with prepare_engine=beam, Dataflow's
REST API (`tests.fakes.DataflowApi`: the Flex Template launch parsed strictly into
dataflow_v1beta3's `LaunchFlexTemplateRequest`, the job polled by the wait launcher).

Two things Vertex does are mimicked here, as KFP's backend does them: numbers in parameter
values are written without a fraction when whole (`strconv.FormatFloat(v, 'f', -1, 64)` and
Go's protojson: the compiled `{"goal": 1.0}` reaches the launcher as `{"goal": 1}`), and the
run's system labels (`VERTEX_AI_PIPELINES_RUN_LABELS`, which every GCPC launcher merges into its
job's or model's labels) are set.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from google.cloud import aiplatform_v1
from google.cloud.aiplatform_v1.services.job_service.transports.grpc import JobServiceGrpcTransport
from google.protobuf import json_format

from tests.fakes import DataflowApi, GrpcFake, RestFake, StrictRequest, insecure_client, strict_json
from tests.test_pipeline import render_payload, task_inputs, walk

PROJECT = "p-proj"
IMAGE = "us-central1-docker.pkg.dev/p-proj/training/trainer@sha256:" + "1" * 64
REDUCTION_IMAGE = "us-central1-docker.pkg.dev/p-proj/training/trainer-reduction-server@sha256:" + "3" * 64
DATAFLOW_IMAGE = IMAGE.replace("/trainer@", "/trainer-dataflow@")
CPU_IMAGE = IMAGE.replace("/trainer@", "/trainer-cpu@")
SERVING_IMAGE = IMAGE.replace("/trainer@", "/trainer-serving@")
PIPELINE_JOB_NAME = "multiworker-cassava-training-20261201060000"
PIPELINE_JOB_UUID = "123"  # what render_payload substitutes for {{$.pipeline_job_uuid}}
RUN_ROOT = f"gs://p-proj-pipelines/root/123456789/{PIPELINE_JOB_NAME}"
SOURCE_COMMIT = "0123456789abcdef0123456789abcdef01234567"
# What Vertex puts in VERTEX_AI_PIPELINES_RUN_LABELS (a reserved PipelineJob label key).
SYSTEM_LABELS = {"vertex-ai-pipelines-run-billing-id": "4815162342"}
CLASS_NAMES = ["cbb", "cbsd", "cgm", "cmd", "healthy"]
BEST_TRIAL = {"learning_rate": 0.001, "dense_units": 256, "dropout": 0.3, "per_replica_batch_size": 32}
JOBS = "google.cloud.aiplatform.v1.JobService"
# GCPC modules of the launchers, by the job they create.
CUSTOM_JOB = "google_cloud_pipeline_components.container.v1.custom_job.launcher"
TUNING_JOB = "google_cloud_pipeline_components.container.v1.hyperparameter_tuning_job.launcher"
UPLOAD_MODEL = "google_cloud_pipeline_components.container.v1.model.upload_model.launcher"
DATAFLOW_LAUNCH = "google_cloud_pipeline_components.container.preview.dataflow.flex_template.launcher"
DATAFLOW_WAIT = "google_cloud_pipeline_components.container.v1.wait_gcp_resources.launcher"


def go_numbers(value: Any) -> Any:
    """`value` with every whole float made an int: how KFP's backend writes numbers into a
    placeholder (JSON has one number type; the compiled spec writes 1 as 1.0)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: go_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [go_numbers(v) for v in value]
    return value


def load_template(path: Path) -> dict[str, Any]:
    return go_numbers(json.loads(path.read_text()))


def champion_name(region: str) -> str:
    return f"projects/123456/locations/{region}/models/777"


# --- resolving the tasks that feed the jobs ------------------------------------------------------


@dataclasses.dataclass
class Run:
    """One run of the template: its parameter values, every upstream output the GCPC tasks read
    ((task display name, output) -> value), the importers' artifacts, the worker pools each
    `*-worker-pools` task returned (and their warnings), and what each launcher sent."""

    spec: dict[str, Any]
    region: str
    root: dict[str, Any]
    upstream: dict[tuple[str, str], Any] = dataclasses.field(default_factory=dict)
    artifacts: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    pools: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)
    warnings: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    requests: dict[str, Any] = dataclasses.field(default_factory=dict)
    endpoints: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    outputs: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    # Where the files a step writes through Cloud Storage FUSE (/gcs/<bucket>/...) land here: the
    # plan's Flex Template spec file, with prepare_engine=beam.
    fuse_root: Path | None = None

    @property
    def tune(self) -> bool:
        return bool(self.root["tune"])

    @property
    def dataflow(self) -> bool:
        """The preparation runs on Dataflow (prepare_engine=beam): the launch and wait steps
        take the place of the prepare-dataset job."""
        return self.root["prepare_engine"] == "beam"

    def local_file(self, uri: str) -> Path:
        """Where a file a step wrote at `uri` (gs://...) through FUSE lies here."""
        assert self.fuse_root is not None and uri.startswith("gs://"), uri
        return self.fuse_root / uri[len("gs://") :]

    def job_dir(self, job: str) -> str:
        """The folder the plan made for `job` (prepare, tuning, training, evaluation): its output
        artifact's URI, as the backend places it under the run's root."""
        return f"{RUN_ROOT}/{walk(self.spec)['plan-jobs']['key']}/{job}_job"


def vertex_placeholders(run: Run) -> dict[str, str]:
    return {
        "{{$.pipeline_job_name}}": PIPELINE_JOB_NAME,
        "{{$.pipeline_job_uuid}}": PIPELINE_JOB_UUID,
        "{{$.pipeline_persistent_resource_id}}": "",
        "{{$.pipeline_google_cloud_project_id}}": PROJECT,
        "{{$.pipeline_google_cloud_location}}": run.region,
    }


@contextmanager
def upstream_known(display: str) -> Iterator[None]:
    """A KeyError while resolving `display`'s inputs, said for what it is."""
    try:
        yield
    except KeyError as err:
        raise AssertionError(
            f"{display}: the template reads {err.args[0]!r}, which this harness does not produce "
            "(a new parameter or upstream task: add it to tests/conformance/harness.py `plan`)"
        ) from err


def typed_inputs(run: Run, display: str) -> dict[str, Any]:
    """A task's parameter inputs as its executor receives them: Vertex's placeholders
    substituted, and numbers cast to the component's declared types (the KFP executor does)."""
    with upstream_known(display):
        inputs = task_inputs(run.spec, display, run.upstream, run.root)
    definitions = walk(run.spec)[display]["component"].get("inputDefinitions", {}).get("parameters", {})
    out = {}
    for name, value in inputs.items():
        if isinstance(value, str):
            for placeholder, text in vertex_placeholders(run).items():
                value = value.replace(placeholder, text)
        kind = definitions.get(name, {}).get("parameterType")
        if kind == "NUMBER_INTEGER" and isinstance(value, float):
            value = int(value)
        elif kind == "NUMBER_DOUBLE" and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        out[name] = value
    return out


def call_body(run: Run, display: str, func: Callable[..., Any], **artifacts: Any) -> Any:
    """Runs a lightweight component's body (`func`, its `python_func`) on the task's inputs."""
    inputs = typed_inputs(run, display)
    accepted = inspect.signature(func).parameters
    unknown = set(inputs) - set(accepted)
    assert not unknown, (
        f"{display}: the template hands {sorted(unknown)}, which {func.__name__} does not take"
    )
    return func(**{k: v for k, v in inputs.items() if k in accepted}, **artifacts)


def taken(spec: dict[str, Any], tune: bool, prepare_engine: str = "job") -> dict[str, Any]:
    """The template as a run with this `tune` and `prepare_engine` runs it: the branches Vertex
    skips are left out (the steps after them are the same in every branch, under the same
    display names)."""
    import copy

    from pipeline import cost

    out = copy.deepcopy(spec)
    for component in out["components"].values():
        tasks = component.get("dag", {}).get("tasks", {})
        scenario: dict[str, bool | str] = {"tune": tune, "prepare_engine": prepare_engine}
        for name in [n for n, t in tasks.items() if not cost._taken(t, scenario)]:
            del tasks[name]
    return out


def plan_jobs(run: Run) -> None:
    """What the `plan-jobs` task outputs: the real `plan_jobs` body on the inputs the template
    hands it (any input it does not take fails the test), with the job folders the backend
    would make; its warnings (printed by the step) in `run.warnings`."""
    import contextlib
    import io

    from kfp import dsl

    from components import plan

    jobs = {
        f"{job}_job": dsl.Artifact(uri=run.job_dir(job))
        for job in ("prepare", "tuning", "training", "evaluation")
    }
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), pytest.MonkeyPatch.context() as patch:
        if run.fuse_root is not None:  # the step writes through Vertex's FUSE mount: here, a folder
            patch.setattr(plan, "fuse_path", lambda uri: str(run.local_file(uri)))
        out = call_body(run, "plan-jobs", plan.plan_jobs.python_func, **jobs)
    run.warnings["plan-jobs"] = [
        line for line in printed.getvalue().splitlines() if line.startswith("WARNING:")
    ]
    for key, value in out._asdict().items():
        run.upstream[("plan-jobs", key)] = go_numbers(value)
    for job in ("prepare", "tuning", "training", "evaluation"):
        run.pools[job] = out._asdict()[f"{job}_pools"]


def imported(run: Run, display: str) -> dict[str, Any]:
    """The artifact a `dsl.importer` task makes, from its compiled importer spec."""
    component = walk(run.spec)[display]["component"]
    importer = run.spec["deploymentSpec"]["executors"][component["executorLabel"]]["importer"]
    inputs = typed_inputs(run, display)

    def fill(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: fill(v) for k, v in value.items()}
        if isinstance(value, str):
            return re.sub(
                r"\{\{\$\.inputs\.parameters\['([^']+)'\]\}\}", lambda m: str(inputs[m.group(1)]), value
            )
        return value

    return {
        "name": display,
        "type": importer["typeSchema"],
        "uri": inputs[importer["artifactUri"]["runtimeParameter"]],
        "metadata": fill(importer.get("metadata", {})),
    }


def plan(spec: dict[str, Any], root: dict[str, Any], fuse_root: Path | None = None) -> Run:
    """Every output the GCPC tasks of a run with these parameter values read; the files the
    steps write to Cloud Storage through FUSE go under `fuse_root`."""
    from components import plan, registry

    engine = str(root["prepare_engine"])
    run = Run(
        spec=taken(spec, bool(root["tune"]), engine),
        region=root["location"],
        root=go_numbers(root),
        fuse_root=fuse_root,
    )
    tasks = walk(run.spec)
    run.upstream[("build-trainer-image", "image_uri")] = IMAGE
    run.upstream[("build-trainer-image", "cpu_image_uri")] = CPU_IMAGE
    # The build step makes the custom serving image when the run's serving_image asks for it.
    run.upstream[("build-trainer-image", "serving_image_uri")] = (
        SERVING_IMAGE if root["serving_image"] == "custom" else ""
    )
    run.upstream[("build-trainer-image", "dataflow_image_uri")] = DATAFLOW_IMAGE if engine == "beam" else ""
    # What components.image.build_trainer_image outputs: the training job's chief and workers run
    # the reduction-server stage's image when reducers are asked for, else the trainer image.
    run.upstream[("build-trainer-image", "training_image_uri")] = (
        REDUCTION_IMAGE if run.root["reduction_server_count"] else IMAGE
    )
    champion = champion_name(run.region)
    run.upstream[("find-champion", "class_names")] = CLASS_NAMES
    run.upstream[("find-champion", "champion_uri")] = f"gs://{PROJECT}-models/champion/model"
    run.upstream[("find-champion", "champion_version")] = f"{champion}@3"
    run.upstream[("find-champion", "exists")] = True
    run.upstream[("find-champion", "resource_name")] = champion
    run.upstream[("find-champion", "resource_uri")] = (
        f"https://{run.region}-aiplatform.googleapis.com/v1/{champion}"
    )
    plan_jobs(run)
    if run.tune:
        # The best trial's step: the plan's training pools with the best trial's values.
        pools, values = plan.apply_hyperparameters(run.pools["training"], BEST_TRIAL, plan.TUNABLE)
        run.pools["training"] = pools
        run.upstream[("best-trial", "worker_pool_specs")] = go_numbers(pools)
        run.upstream[("best-trial", "hyperparameters")] = values
    settings = call_body(run, "upload-settings", registry.upload_settings.python_func)
    for output in ("serving_image", "artifact_uri", "predict_route", "health_route", "labels"):
        run.upstream[("upload-settings", output)] = getattr(settings, output)
    for importer in ("serving-container", "parent-model"):
        run.artifacts[f"{tasks[importer]['key']}-artifact"] = imported(run, importer)
    return run


def first_model(run: Run) -> Run:
    """The same run when the registry has no model of that name yet: find-champion's outputs
    for none (the parent importer's resourceName empty: GCPC's upload launcher then uploads a
    first model)."""
    again = dataclasses.replace(
        run, upstream=dict(run.upstream), artifacts=dict(run.artifacts), requests={}, endpoints={}, outputs={}
    )
    models = (
        f"https://{run.region}-aiplatform.googleapis.com/v1/projects/{PROJECT}/locations/{run.region}/models"
    )
    again.upstream.update(
        {
            ("find-champion", "exists"): False,
            ("find-champion", "resource_name"): "",
            ("find-champion", "resource_uri"): models,
            ("find-champion", "class_names"): [],
            ("find-champion", "champion_uri"): "",
            ("find-champion", "champion_version"): "",
        }
    )
    key = walk(run.spec)["parent-model"]["key"]
    again.artifacts[f"{key}-artifact"] = imported(again, "parent-model")
    return again


def launched_tasks(run: Run) -> list[str]:
    """The GCPC tasks this run reaches, in order."""
    prepare = (
        ["launch-dataflow-preparation", "wait-dataflow-preparation"] if run.dataflow else ["prepare-dataset"]
    )
    tuning = ["tune-hyperparameters"] if run.tune else []
    return [*prepare, *tuning, "train-model", "evaluate-models", "upload-model"]


# --- rendering and running a launcher -------------------------------------------------------------


def _artifact_inputs(run: Run, display: str) -> dict[str, dict[str, Any]]:
    out = {}
    for name, source in walk(run.spec)[display]["task"]["inputs"].get("artifacts", {}).items():
        if "componentInputArtifact" in source:
            key = source["componentInputArtifact"].removeprefix("pipelinechannel--")
        else:
            key = f"{source['taskOutputArtifact']['producerTask']}-{source['taskOutputArtifact']['outputArtifactKey']}"
        out[name] = run.artifacts[key]
    return out


def command_line(run: Run, display: str, folder: Path) -> tuple[str, list[str], dict[str, Path]]:
    """The launcher module, its args as Vertex would start it, and its output files."""
    component = walk(run.spec)[display]["component"]
    container = run.spec["deploymentSpec"]["executors"][component["executorLabel"]]["container"]
    command = container["command"]
    assert command[:3] == ["python3", "-u", "-m"], command
    inputs = typed_inputs(run, display)
    artifacts = _artifact_inputs(run, display)
    outputs = component.get("outputDefinitions", {})
    files = {name: folder / display / name for name in outputs.get("parameters", {})}
    files["executor_output"] = folder / display / "executor_output.json"
    executor_input = {
        "inputs": {
            "parameterValues": inputs,
            "artifacts": {name: {"artifacts": [artifact]} for name, artifact in artifacts.items()},
        },
        "outputs": {
            "parameters": {name: {"outputFile": str(files[name])} for name in outputs.get("parameters", {})},
            "artifacts": {
                name: {
                    "artifacts": [
                        {
                            "name": name,
                            "type": definition["artifactType"],
                            "uri": f"{RUN_ROOT}/{walk(run.spec)[display]['key']}/{name}",
                            "metadata": {},
                        }
                    ]
                }
                for name, definition in outputs.get("artifacts", {}).items()
            },
            "outputFile": str(files["executor_output"]),
        },
    }

    def substitute(text: str) -> str:
        def parameter(m: re.Match[str]) -> str:
            value = inputs[m.group(1)]
            return value if isinstance(value, str) else json.dumps(value)

        text = re.sub(r"\{\{\$\.inputs\.parameters\['([^']+)'\]\}\}", parameter, text)
        text = re.sub(
            r"\{\{\$\.outputs\.parameters\['([^']+)'\]\.output_file\}\}",
            lambda m: str(files[m.group(1)]),
            text,
        )
        text = re.sub(
            r"\{\{\$\.inputs\.artifacts\['([^']+)'\]\.metadata\['([^']+)'\]\}\}",
            lambda m: str(artifacts[m.group(1)]["metadata"][m.group(2)]),
            text,
        )
        text = text.replace("{{$}}", json.dumps(executor_input))
        assert "{{$" not in text, f"{display}: a placeholder this harness cannot fill: {text[:300]}"
        return text

    args: list[str] = []
    raw = container["args"]
    for index, arg in enumerate(raw):
        if index and raw[index - 1] == "--payload":
            with upstream_known(display):
                payload = render_payload(run.spec, display, run.upstream, run.root)
            args.append(json.dumps(payload))
        elif arg.startswith('{"IfPresent"'):
            present = json.loads(arg)["IfPresent"]
            if present["InputName"] in inputs or present["InputName"] in artifacts:
                args += [substitute(a) for a in present.get("Then", [])]
            else:
                args += [substitute(a) for a in present.get("Else", [])]
        else:
            args.append(substitute(arg))
    return command[3], args, files


def launch(run: Run, display: str, vertex: VertexFake, folder: Path) -> None:
    """Runs the task's launcher against `vertex`; keeps its create request in `run.requests`
    (the wait step creates nothing: the job it polled), and its output parameters as what the
    steps after it read."""
    module, args, files = command_line(run, display, folder)
    stale = [str(path) for path in files.values() if path.exists()]
    assert not stale, f"{display}: output files of an earlier launch (the launcher would resume): {stale}"
    vertex.reset()
    try:
        importlib.import_module(module).main(args)
    except BaseException as err:
        refused = vertex.refusals()
        if refused:
            raise AssertionError(f"{display}: the fake refused the request: {refused}") from err
        raise
    assert not vertex.refusals(), f"{display}: {vertex.refusals()}"
    creates = [r for name, r in vertex.requests() if name.startswith(("Create", "Upload", "Launch"))]
    polls = [r for name, r in vertex.requests() if name.startswith("Get")]
    # GCPC's Dataflow launcher only launches (its remote_runner returns once the job exists);
    # the wait step only polls the job the launch named.
    expected = {DATAFLOW_LAUNCH: (1, False), DATAFLOW_WAIT: (0, True)}.get(module, (1, True))
    assert len(creates) == expected[0], (
        f"{display}: expected {expected[0]} create request(s), got {[n for n, _ in vertex.requests()]}"
    )
    assert bool(polls) is expected[1], f"{display}: polled {polls}"
    run.requests[display] = creates[0] if creates else polls
    run.endpoints[display] = list(vertex.endpoints)
    run.outputs[display] = {
        name: json.loads(path.read_text()) for name, path in files.items() if path.exists()
    }
    run.outputs[display]["module"] = module
    for name in component_outputs(run, display):
        run.upstream[(display, name)] = files[name].read_text()


def component_outputs(run: Run, display: str) -> list[str]:
    """The names of the task's output parameters."""
    component = walk(run.spec)[display]["component"]
    return list(component.get("outputDefinitions", {}).get("parameters", {}))


# --- the fake Vertex API --------------------------------------------------------------------------


class VertexFake:
    """JobService (gRPC: custom jobs and tuning jobs, each PENDING, then RUNNING, then SUCCEEDED
    as it is polled) and the Model upload (REST: `models:upload`, then its operation, done on its
    first poll). Every request is parsed strictly into its aiplatform_v1 request type. Dataflow's
    API (`DataflowApi`) is served beside the upload, its jobs QUEUED, RUNNING, then DONE."""

    def __init__(self) -> None:
        self.grpc = GrpcFake()
        self.rest = RestFake()
        self.dataflow = DataflowApi(self.rest)
        self.strict: dict[str, StrictRequest] = {}
        self.endpoints: list[str] = []
        self.uploads: list[tuple[str, Any]] = []  # (method, request or operation name)
        self.rest_refused: list[str] = []
        self._jobs: dict[str, Any] = {}
        self._operations: dict[str, dict[str, Any]] = {}
        self._count = 0
        self._serve("CreateCustomJob", aiplatform_v1.CreateCustomJobRequest, self._create_custom_job)
        self._serve("GetCustomJob", aiplatform_v1.GetCustomJobRequest, self._get)
        self._serve(
            "CreateHyperparameterTuningJob",
            aiplatform_v1.CreateHyperparameterTuningJobRequest,
            self._create_tuning_job,
        )
        self._serve("GetHyperparameterTuningJob", aiplatform_v1.GetHyperparameterTuningJobRequest, self._get)
        self.rest.route("POST", r"/v1/(projects/[^/]+/locations/[^/]+)/models:upload", self._upload)
        self.rest.route(
            "GET", r"/v1/(projects/[^/]+/locations/[^/]+/models/[^/]+/operations/[^/]+)", self._operation
        )

    def _serve(self, method: str, request_type: Any, handler: Callable[[Any], Any]) -> None:
        self.strict[method] = StrictRequest(request_type)
        self.grpc.add(JOBS, method, self.strict[method], handler)

    def _name(self, parent: str, collection: str) -> str:
        self._count += 1
        return f"{parent}/{collection}/{4200 + self._count}"

    def _create_custom_job(self, request: aiplatform_v1.CreateCustomJobRequest) -> aiplatform_v1.CustomJob:
        job = aiplatform_v1.CustomJob(request.custom_job)
        job.name = self._name(request.parent, "customJobs")
        job.state = aiplatform_v1.JobState.JOB_STATE_PENDING  # type: ignore[assignment]
        self._jobs[job.name] = job
        return job

    def _create_tuning_job(
        self, request: aiplatform_v1.CreateHyperparameterTuningJobRequest
    ) -> aiplatform_v1.HyperparameterTuningJob:
        job = aiplatform_v1.HyperparameterTuningJob(request.hyperparameter_tuning_job)
        job.name = self._name(request.parent, "hyperparameterTuningJobs")
        job.state = aiplatform_v1.JobState.JOB_STATE_PENDING  # type: ignore[assignment]
        self._jobs[job.name] = job
        return job

    def _get(self, request: Any) -> Any:
        job = self._jobs[request.name]
        states = aiplatform_v1.JobState
        job.state = (
            states.JOB_STATE_RUNNING if job.state == states.JOB_STATE_PENDING else states.JOB_STATE_SUCCEEDED
        )
        return job

    def _upload(self, match: re.Match[str], _query: Any, body: Any) -> tuple[int, Any]:
        parent = match.group(1)
        try:
            request = strict_json(aiplatform_v1.UploadModelRequest, {**body, "parent": parent})
        except (json_format.ParseError, TypeError, AttributeError) as err:
            self.rest_refused.append(f"UploadModelRequest: {err}")
            return 400, {"error": {"code": 400, "message": str(err), "status": "INVALID_ARGUMENT"}}
        self.uploads.append(("UploadModel", request))
        model = request.parent_model or self._name(parent.replace(f"/{PROJECT}/", "/123456/"), "models")
        operation = f"{model}/operations/{9000 + self._count}"
        version = "2" if request.parent_model else "1"
        self._operations[operation] = {
            "name": operation,
            "done": True,
            "response": {
                "@type": "type.googleapis.com/google.cloud.aiplatform.v1.UploadModelResponse",
                "model": model,
                "modelVersionId": version,
            },
        }
        return 200, {"name": operation, "metadata": {}}

    def _operation(self, match: re.Match[str], _query: Any, _body: Any) -> tuple[int, Any]:
        self.uploads.append(("GetOperation", match.group(1)))
        return 200, self._operations[match.group(1)]

    def requests(self) -> list[tuple[str, Any]]:
        dataflow = [("LaunchFlexTemplate", r) for r in self.dataflow.launched]
        dataflow += [("GetDataflowJob", job) for job in self.dataflow.polled]
        return [*self.grpc.requests, *self.uploads, *dataflow]

    def refusals(self) -> list[str]:
        return (
            [r for s in self.strict.values() for r in s.refused] + self.rest_refused + self.dataflow.refused
        )

    def reset(self) -> None:
        self.grpc.requests.clear()
        self.uploads.clear()
        self.dataflow.reset()
        self.endpoints.clear()
        self.rest_refused.clear()
        for strict in self.strict.values():
            strict.refused.clear()

    def start(self) -> VertexFake:
        self.grpc.start()
        return self

    def stop(self) -> None:
        self.grpc.stop()
        self.rest.stop()


@contextmanager
def launchers_against(vertex: VertexFake, monkeypatch: pytest.MonkeyPatch) -> Iterator[VertexFake]:
    """The GCPC launchers, in this process, talking to `vertex`: their JobService client made on
    an insecure channel to the fake (the regional endpoint they ask for is kept), their REST calls
    sent to the fake, credentials that need no Google account, no polling sleeps, and Vertex's
    system labels in the environment."""
    import google.auth
    from google.oauth2.credentials import Credentials
    from google_cloud_pipeline_components.container.v1.gcp_launcher import (
        job_remote_runner,
        lro_remote_runner,
    )

    make = insecure_client(aiplatform_v1.JobServiceClient, JobServiceGrpcTransport, vertex.grpc.address)

    def job_client(*args: Any, **kwargs: Any) -> Any:
        options = kwargs.get("client_options", args[0] if args else None)
        vertex.endpoints.append(str(getattr(options, "api_endpoint", options)))
        return make(*args, **kwargs)

    import requests as real

    class Requests:
        """`requests` as the upload launcher uses it, sent to the fake instead of Google."""

        @staticmethod
        def _local(url: str, headers: dict[str, str] | None) -> str:
            match = re.match(r"^https://([a-z0-9-]+-aiplatform\.googleapis\.com)(/.*)$", url)
            assert match, f"the launcher called {url}, not a Vertex regional endpoint"
            assert (headers or {}).get("Authorization", "").startswith("Bearer "), "no bearer token"
            vertex.endpoints.append(match.group(1))
            return f"http://{vertex.rest.address}{match.group(2)}"

        def post(self, url: str, data: Any = None, headers: dict[str, str] | None = None) -> Any:
            return real.post(url=self._local(url, headers), data=data, headers=headers, timeout=30)

        def get(self, url: str, data: Any = None, headers: dict[str, str] | None = None) -> Any:
            return real.get(url=self._local(url, headers), data=data, headers=headers, timeout=30)

    monkeypatch.setattr(job_remote_runner.aiplatform.gapic, "JobServiceClient", job_client)
    monkeypatch.setattr(job_remote_runner, "_POLLING_INTERVAL_IN_SECONDS", 0)
    monkeypatch.setattr(lro_remote_runner, "_POLLING_INTERVAL_IN_SECONDS", 0)
    monkeypatch.setattr(lro_remote_runner, "requests", Requests())
    DataflowApi.point_gcpc_launchers(monkeypatch, vertex.rest.address, vertex.endpoints)
    monkeypatch.setattr(google.auth, "default", lambda *a, **k: (Credentials(token="conformance"), PROJECT))
    monkeypatch.setenv("VERTEX_AI_PIPELINES_RUN_LABELS", json.dumps(SYSTEM_LABELS))
    yield vertex


# --- reading requests -----------------------------------------------------------------------------


def as_dict(request: Any) -> dict[str, Any]:
    """A captured request as JSON data (proto field names; enums by name; durations as "86400s";
    fields left at their default absent)."""
    return json_format.MessageToDict(type(request).pb(request), preserving_proto_field_name=True)


def lookup(data: Any, path: str) -> Any:
    """`path` in `data`: dotted keys, list indexes (`worker_pool_specs[1]`), and a final `#` for
    a length; None where a field is absent."""
    count = path.endswith("#")
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", path.rstrip("#")):
        if part.startswith("["):
            index = int(part[1:-1])
            data = data[index] if isinstance(data, list) and index < len(data) else None
        else:
            data = data.get(part) if isinstance(data, dict) else None
        if data is None:
            break
    if count:
        return len(data) if data is not None else 0
    return data
