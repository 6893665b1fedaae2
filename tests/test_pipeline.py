"""The compiled pipeline: fresh, strictly valid, the expected DAG, explicit placement of every
GCPC op, no unresolved channels, and job payloads that parse into the real API types."""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path
from typing import Any

import pytest
from google.cloud import aiplatform_v1
from google.protobuf import json_format
from kfp import compiler
from kfp.pipeline_spec import pipeline_spec_pb2

import pipeline
from components import worker_pools


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pipeline.compile_pipeline(tmp_path_factory.mktemp("compiled") / "pipeline.json")


@pytest.fixture(scope="module")
def spec(fresh: Path) -> dict[str, Any]:
    return json.loads(fresh.read_text())


@pytest.fixture(scope="module")
def local_spec(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The local target's DAG, compiled as `make run` compiles it (in the process, not committed)."""
    out = tmp_path_factory.mktemp("compiled") / "pipeline-local.json"
    compiler.Compiler().compile(pipeline.create_pipeline("local"), str(out))
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def fresh_notify(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pipeline.compile_pipeline(
        tmp_path_factory.mktemp("compiled") / "pipeline-notify.json", notify=True
    )


@pytest.mark.parametrize("notify", [False, True])
def test_committed_spec_is_fresh(fresh: Path, fresh_notify: Path, notify: bool) -> None:
    target = pipeline.COMPILED_NOTIFY if notify else pipeline.COMPILED
    new = (fresh_notify if notify else fresh).read_text()
    committed = target.read_text() if target.exists() else ""
    if committed != new:
        diff = "".join(
            list(
                difflib.unified_diff(
                    committed.splitlines(True), new.splitlines(True), "committed", "fresh", n=1
                )
            )[:40]
        )
        pytest.fail(f"compiled/{target.name} is stale: run `make compile` and commit it.\n{diff[:3000]}")


def test_compiling_twice_gives_the_same_bytes(fresh: Path, tmp_path: Path) -> None:
    again = pipeline.compile_pipeline(tmp_path / "again.json")
    assert again.read_bytes() == fresh.read_bytes()


def test_parses_strictly_into_pipeline_spec(spec: dict[str, Any]) -> None:
    parsed = json_format.ParseDict(spec, pipeline_spec_pb2.PipelineSpec(), ignore_unknown_fields=False)
    assert parsed.pipeline_info.name == pipeline.PIPELINE_NAME


def test_no_unresolved_channels(fresh: Path) -> None:
    assert "{{channel:" not in fresh.read_text()


def walk(
    spec: dict[str, Any], dag: dict[str, Any] | None = None, parents: tuple[str, ...] = ()
) -> dict[str, Any]:
    """display name -> (task, its component, the enclosing task names) over all nested DAGs."""
    out: dict[str, Any] = {}
    for name, task in (dag or spec["root"]["dag"])["tasks"].items():
        component = spec["components"][task["componentRef"]["name"]]
        out[task["taskInfo"]["name"]] = {
            "key": name,
            "task": task,
            "component": component,
            "parents": parents,
        }
        if "dag" in component:
            out.update(walk(spec, component["dag"], (*parents, task["taskInfo"]["name"])))
    return out


def test_the_dag_has_every_step(spec: dict[str, Any]) -> None:
    tasks = walk(spec)
    for step in (
        "build-trainer-image",
        "prepare-dataset",
        "register-dataset",
        "tune-hyperparameters",
        "best-trial",
        "train-model",
        "model-from-job",
        "evaluate-model",
        "find-champion",
        "check-same-task",
        "serving-container",
        "upload-new-version",
        "upload-first-version",
        "set-champion",
    ):
        assert step in tasks, f"no task {step}; tasks: {sorted(tasks)}"


def test_only_a_run_with_recipients_calls_the_email_op(spec: dict[str, Any], fresh_notify: Path) -> None:
    """Google documents one to three recipients for VertexNotificationEmailOp and nothing about
    none: the template without recipients has no exit handler and no such parameter."""
    assert not [t for t in walk(spec) if "notification" in t]
    assert "notification_emails" not in spec["root"]["inputDefinitions"]["parameters"]
    assert "vertex_notification_email" not in json.dumps(spec["deploymentSpec"])
    notify = json.loads(fresh_notify.read_text())
    tasks = walk(notify)
    # Everything but the e-mail runs under the exit handler; the recipients are required.
    assert tasks["train-model"]["parents"][0] == "train-and-register"
    assert tasks["vertex-pipelines-notification-email"]["parents"] == ()
    emails = notify["root"]["inputDefinitions"]["parameters"]["notification_emails"]
    assert "defaultValue" not in emails and not emails.get("isOptional")
    steps = {name for name in walk(spec) if not name.startswith("condition-branches")}
    assert steps | {"vertex-pipelines-notification-email", "train-and-register"} == {
        name for name in tasks if not name.startswith("condition-branches")
    }
    assert pipeline.template_for([]) == pipeline.COMPILED
    assert pipeline.template_for(["a@b.co"]) == pipeline.COMPILED_NOTIFY


def cached(task: dict[str, Any]) -> bool:
    return bool(task["task"].get("cachingOptions", {}).get("enableCache", False))


def test_steps_that_touch_state_outside_the_pipeline_are_never_cached(spec: dict[str, Any]) -> None:
    """A cached find-champion answers with the registry as it was when it first ran (the next
    upload then creates a second model of the same name); a cached *-worker-pools step hands a
    new run an old run's job folder (and makes every job downstream a cache hit: a schedule
    would retrain nothing)."""
    tasks = walk(spec)
    never = {
        "build-trainer-image",  # asks Artifact Registry whether the image exists
        "find-champion",
        "upload-new-version",
        "upload-first-version",
        "set-champion",
        "prepare-worker-pools",
        "tuning-worker-pools",
        "training-worker-pools",
    }
    assert never <= set(pipeline.NEVER_CACHED)
    for name, task in tasks.items():
        if name in pipeline.NEVER_CACHED:
            assert not cached(task), f"{name} would be served from Vertex's cache"
    # Pure steps keep caching (the policy is this list, not caching off everywhere).
    assert cached(tasks["training-trainer-args"]) and cached(tasks["evaluate-model"])


def test_every_job_writes_into_a_folder_made_by_this_run(spec: dict[str, Any]) -> None:
    tasks = walk(spec)
    keys = {t["key"]: name for name, t in tasks.items()}
    for job in ("prepare-dataset", "tune-hyperparameters", "train-model"):
        source = tasks[job]["task"]["inputs"]["parameters"]["base_output_directory"]
        if "taskOutputParameter" in source:
            producer = keys[source["taskOutputParameter"]["producerTask"]]
        else:  # passed into a sub-DAG: the channel is named after its producer
            channel = source["componentInputParameter"].removeprefix("pipelinechannel--")
            producer = next(n for n in tasks if channel.startswith(f"{tasks[n]['key']}-"))
        assert producer.endswith("-worker-pools") and not cached(tasks[producer]), (job, producer)


def dependencies(tasks: dict[str, Any], name: str) -> set[str]:
    keys = {t["key"]: display for display, t in tasks.items()}
    return {keys[d] for d in tasks[name]["task"].get("dependentTasks", [])}


def test_dependencies_and_conditions(spec: dict[str, Any]) -> None:
    tasks = walk(spec)
    assert tasks["tune-hyperparameters"]["parents"][-1] == "tuning-enabled"
    conditions = {t["task"].get("triggerPolicy", {}).get("condition", "") for t in tasks.values()}
    assert "inputs.parameter_values['pipelinechannel--tune'] == true" in conditions
    assert "!(inputs.parameter_values['pipelinechannel--tune'] == true)" in conditions
    assert "inputs.parameter_values['pipelinechannel--evaluate-model-promote'] == true" in conditions
    assert tasks["set-champion"]["parents"][-1] == "gate-passed"
    assert dependencies(tasks, "best-trial") == {"tune-hyperparameters"}
    assert {"prepare-dataset", "prepare-worker-pools"} <= dependencies(tasks, "register-dataset")
    assert {"train-model", "training-worker-pools"} <= dependencies(tasks, "model-from-job")
    assert {"register-dataset"} <= dependencies(tasks, "training-trainer-args")
    # The final training waits for the tuning branch (its hyperparameters come out of it).
    assert any(d.startswith("condition-branches") for d in dependencies(tasks, "training-trainer-args"))
    assert {"model-from-job", "find-champion"} <= dependencies(tasks, "evaluate-model")
    assert "parent-model" in dependencies(tasks, "upload-new-version")
    # The upload waits for the gate (the .after() lands on the enclosing If/Else group).
    [branches] = {p for p in tasks["upload-new-version"]["parents"] if p.startswith("condition-branches")}
    assert "evaluate-model" in dependencies(tasks, branches)


def upstream(tasks: dict[str, Any], name: str) -> set[str]:
    """Every step `name` waits for: its own dependencies and those of the groups (conditions)
    it runs in, and theirs, transitively."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        current = todo.pop()
        for waits_for in dependencies(tasks, current) | {
            d for parent in tasks[current]["parents"] for d in dependencies(tasks, parent)
        }:
            if waits_for not in seen:
                seen.add(waits_for)
                todo.append(waits_for)
    return seen


def producer(tasks: dict[str, Any], source: dict[str, Any]) -> tuple[str, str]:
    """(display name of the producing task, output key) of a task input wired to an output."""
    keys = {t["key"]: display for display, t in tasks.items()}
    if "taskOutputArtifact" in source:
        out = source["taskOutputArtifact"]
        return keys[out["producerTask"]], out["outputArtifactKey"]
    out = source["taskOutputParameter"]
    return keys[out["producerTask"]], out["outputParameterKey"]


@pytest.mark.parametrize("target", ["vertex", "local"])
def test_a_dataset_of_another_task_is_refused_before_any_training(
    spec: dict[str, Any], local_spec: dict[str, Any], target: str
) -> None:
    """A one-class folder scores 1.0: its model must never be compared with (nor replace) a
    five-class champion. `check-same-task` compares the prepared dataset's class names with the
    champion's, found before training by an uncached `find-champion`, and both the tuning job and
    the final training wait for it; the gate compares the class names again."""
    tasks = walk(spec if target == "vertex" else local_spec)
    check = tasks["check-same-task"]
    inputs = check["task"]["inputs"]
    assert producer(tasks, inputs["artifacts"]["dataset"]) == ("register-dataset", "dataset")
    assert producer(tasks, inputs["parameters"]["champion_class_names"]) == ("find-champion", "class_names")
    assert check["parents"] == ()  # runs on every run, not under a condition
    for job in ("tune-hyperparameters", "train-model"):
        assert "check-same-task" in upstream(tasks, job), f"{job} can start before check-same-task"
    # Directly, not only through the tuning branch (the .after() of the tuning args lands on it).
    assert "check-same-task" in dependencies(tasks, "training-trainer-args")
    assert "train-model" not in upstream(tasks, "find-champion")
    assert not cached(tasks["find-champion"])
    gate = tasks["evaluate-model"]["task"]["inputs"]["parameters"]
    assert producer(tasks, gate["champion_class_names"]) == ("find-champion", "class_names")
    assert producer(tasks, gate["champion_version"]) == ("find-champion", "champion_version")


@pytest.mark.parametrize("target", ["vertex", "local"])
def test_the_gate_compares_both_models_evaluated_by_one_job_on_this_runs_test_split(
    target: str, spec: dict[str, Any], local_spec: dict[str, Any]
) -> None:
    """The champion is re-evaluated on this run's data: the evaluation job gets this run's
    dataset, the new model and the champion's SavedModel folder from find-champion; the gate
    reads that job's output folder and waits for it; the alias moves only from the champion the
    gate compared with."""
    tasks = walk(spec if target == "vertex" else local_spec)
    args = tasks["evaluation-args"]["task"]["inputs"]
    assert producer(tasks, args["artifacts"]["dataset"]) == ("register-dataset", "dataset")
    assert producer(tasks, args["artifacts"]["model"]) == ("model-from-job", "model")
    assert producer(tasks, args["parameters"]["champion_uri"]) == ("find-champion", "champion_uri")
    pools = tasks["evaluation-worker-pools"]["task"]["inputs"]["parameters"]
    assert producer(tasks, pools["args"]) == ("evaluation-args", "Output")
    assert pools["chief_machine_type"]["componentInputParameter"].endswith("prepare_machine_type")
    assert pools["worker_count"]["runtimeValue"]["constant"] == 0  # one CPU replica
    assert not cached(tasks["evaluation-worker-pools"])
    job = tasks["evaluate-models"]["task"]["inputs"]["parameters"]
    assert producer(tasks, job["worker_pool_specs"]) == ("evaluation-worker-pools", "worker_pool_specs")
    gate = tasks["evaluate-model"]
    params = gate["task"]["inputs"]["parameters"]
    assert producer(tasks, params["evaluation_dir"]) == ("evaluation-worker-pools", "base_output_directory")
    assert "evaluate-models" in dependencies(tasks, "evaluate-model")
    for name in ("gate_metric", "min_score"):
        assert params[name]["componentInputParameter"].endswith(name)
    if target == "vertex":  # inside the gate-passed condition: a channel from find-champion
        champion = tasks["set-champion"]["task"]["inputs"]["parameters"]["evaluated_champion"]
        assert champion == {"componentInputParameter": "pipelinechannel--find-champion-champion_version"}
    else:
        champion = tasks["upload-model"]["task"]["inputs"]["parameters"]["evaluated_champion"]
        assert producer(tasks, champion) == ("find-champion", "champion_version")


def test_every_gcpc_op_is_placed_explicitly(spec: dict[str, Any]) -> None:
    executors = spec["deploymentSpec"]["executors"]
    checked = 0
    for display, t in walk(spec).items():
        container = executors.get(t["component"].get("executorLabel", ""), {}).get("container", {})
        # A GCPC op runs one of GCPC's launchers; our own components only share its image.
        if not any("google_cloud_pipeline_components.container" in c for c in container.get("command", [])):
            continue
        if display == "vertex-pipelines-notification-email":
            continue
        params = t["task"]["inputs"]["parameters"]
        for key in ("project", "location"):
            assert key in params, f"{display} has no explicit {key} (GCPC defaults to us-central1)"
            assert params[key]["componentInputParameter"] in (key, f"pipelinechannel--{key}"), display
        checked += 1
    assert checked == 6  # prepare, tune, train, evaluate, upload x2


def test_defaults_are_the_codelab_and_nothing_from_this_machine(spec: dict[str, Any], fresh: Path) -> None:
    params = spec["root"]["inputDefinitions"]["parameters"]
    required = {name for name, p in params.items() if "defaultValue" not in p}
    assert required == {"project", "location", "context_uri", "artifact_repository"}
    defaults = {name: p["defaultValue"] for name, p in params.items() if "defaultValue" in p}
    assert defaults["dataset_source"] == "tfds:cassava"
    assert defaults["backbone"] == "resnet50" and defaults["weights"] == "imagenet"
    assert (defaults["epochs"], defaults["per_replica_batch_size"]) == (2, 64)
    for role in ("chief", "worker"):
        assert defaults[f"{role}_machine_type"] == "n1-standard-8"
        assert defaults[f"{role}_accelerator_type"] == "NVIDIA_TESLA_V100"
        assert defaults[f"{role}_accelerator_count"] == 1
    assert defaults["worker_count"] == 1 and defaults["tune"] is False
    text = fresh.read_text()
    for leak in (str(Path.home()), str(pipeline.ROOT), "/tmp/"):
        assert leak not in text, f"{leak!r} is baked into the compiled pipeline"


# --- job payloads, placeholders rendered, into the real API types ------------------------------


def root_values(spec: dict[str, Any], **given: Any) -> dict[str, Any]:
    params = spec["root"]["inputDefinitions"]["parameters"]
    values = {
        # JSON has one number type: the backend hands NUMBER_INTEGER parameters over as ints.
        name: int(p["defaultValue"]) if p["parameterType"] == "NUMBER_INTEGER" else p["defaultValue"]
        for name, p in params.items()
        if "defaultValue" in p
    }
    return {**values, **given}


def render_payload(
    spec: dict[str, Any], display: str, given: dict[tuple[str, str], Any], root: dict[str, Any]
) -> dict[str, Any]:
    """The `--payload` of a GCPC task with its input placeholders replaced by values: pipeline
    parameters from `root`, upstream outputs from `given` ((task display name, output) ->
    value), else the component defaults."""
    inputs = task_inputs(spec, display, given, root)
    component = walk(spec)[display]["component"]
    args = spec["deploymentSpec"]["executors"][component["executorLabel"]]["container"]["args"]
    payload = args[args.index("--payload") + 1]
    if payload.startswith('{"Concat"'):
        payload = "".join(json.loads(payload)["Concat"])

    def value(match: re.Match[str]) -> str:
        v = inputs[match.group(1)]
        return v if isinstance(v, str) else json.dumps(v)

    rendered = re.sub(r"\{\{\$\.inputs\.parameters\['([^']+)'\]\}\}", value, payload)
    # What Vertex substitutes for its own placeholders (no persistent resource: empty).
    rendered = rendered.replace("{{$.pipeline_job_uuid}}", "123")
    rendered = rendered.replace("{{$.pipeline_persistent_resource_id}}", "")
    assert "{{$" not in rendered, rendered
    return json.loads(rendered)


def task_inputs(
    spec: dict[str, Any], display: str, given: dict[tuple[str, str], Any], root: dict[str, Any]
) -> dict[str, Any]:
    """A task's parameter inputs as Vertex resolves them (see `render_payload`)."""
    tasks = walk(spec)
    upstream = {f"{tasks[task]['key']}-{output}": value for (task, output), value in given.items()}
    t = tasks[display]
    component = t["component"]
    inputs: dict[str, Any] = {
        name: p["defaultValue"]
        for name, p in component.get("inputDefinitions", {}).get("parameters", {}).items()
        if "defaultValue" in p
    }
    for name, source in t["task"]["inputs"].get("parameters", {}).items():
        if "runtimeValue" in source:
            inputs[name] = source["runtimeValue"]["constant"]
        elif "componentInputParameter" in source:
            ref = source["componentInputParameter"].removeprefix("pipelinechannel--")
            inputs[name] = root[ref] if ref in root else upstream[ref]
        else:
            producer = source["taskOutputParameter"]
            inputs[name] = upstream[f"{producer['producerTask']}-{producer['outputParameterKey']}"]
    return inputs


def default_pools(spec: dict[str, Any]) -> list[dict[str, Any]]:
    d = root_values(spec)
    return worker_pools.build_worker_pool_specs(
        image_uri="us-central1-docker.pkg.dev/p/r/trainer@sha256:" + "0" * 64,
        command=["python", "-m", "trainer.task"],
        args=["--data_dir=gs://b/data", "--epochs=2"],
        **{k: d[k] for k in worker_pools.HARDWARE_PARAMETERS},
        region="us-central1",
    )


def test_training_payload_is_a_custom_job(spec: dict[str, Any]) -> None:
    pools = default_pools(spec)
    root = root_values(spec, project="p", location="us-central1", labels={"team": "ml"})
    upstream = {
        ("training-worker-pools", "worker_pool_specs"): pools,
        ("training-worker-pools", "base_output_directory"): "gs://b/root/run/train",
    }
    payload = render_payload(spec, "train-model", upstream, root)
    job = json_format.ParseDict(
        payload, aiplatform_v1.CustomJob.pb(aiplatform_v1.CustomJob()), ignore_unknown_fields=False
    )
    chief, workers = job.job_spec.worker_pool_specs
    assert (chief.replica_count, workers.replica_count) == (1, 1)
    for pool in (chief, workers):
        assert pool.machine_spec.machine_type == "n1-standard-8"
        assert aiplatform_v1.AcceleratorType(pool.machine_spec.accelerator_type).name == "NVIDIA_TESLA_V100"
        assert pool.machine_spec.accelerator_count == 1
        assert list(pool.container_spec.command) == ["python", "-m", "trainer.task"]
    assert job.job_spec.scheduling.restart_job_on_worker_restart is True
    assert job.job_spec.base_output_directory.output_uri_prefix == "gs://b/root/run/train"
    assert dict(job.labels) == {"team": "ml"}


def test_preparation_payload_is_one_cpu_replica(spec: dict[str, Any]) -> None:
    pools = worker_pools.build_worker_pool_specs(
        image_uri="img@sha256:" + "0" * 64,
        command=["python", "-m", "trainer.prepare"],
        args=["--source=tfds:cassava"],
        chief_machine_type="n1-standard-8",
    )
    upstream = {
        ("prepare-worker-pools", "worker_pool_specs"): pools,
        ("prepare-worker-pools", "base_output_directory"): "gs://b/root/run/prep",
    }
    payload = render_payload(
        spec, "prepare-dataset", upstream, root_values(spec, project="p", location="us-central1")
    )
    job = json_format.ParseDict(
        payload, aiplatform_v1.CustomJob.pb(aiplatform_v1.CustomJob()), ignore_unknown_fields=False
    )
    [pool] = job.job_spec.worker_pool_specs
    assert pool.replica_count == 1 and pool.machine_spec.accelerator_count == 0
    assert job.job_spec.scheduling.restart_job_on_worker_restart is False


def test_tuning_payload_is_a_hyperparameter_tuning_job(spec: dict[str, Any]) -> None:
    upstream = {
        ("tuning-worker-pools", "worker_pool_specs"): default_pools(spec),
        ("tuning-worker-pools", "base_output_directory"): "gs://b/root/run/tune",
        ("measurement-selection", "Output"): "LAST_MEASUREMENT",
    }
    root = root_values(spec, project="p", location="europe-west4", search_algorithm="RANDOM_SEARCH")
    payload = render_payload(spec, "tune-hyperparameters", upstream, root)
    job = json_format.ParseDict(
        payload,
        aiplatform_v1.HyperparameterTuningJob.pb(aiplatform_v1.HyperparameterTuningJob()),
        ignore_unknown_fields=False,
    )
    assert (job.max_trial_count, job.parallel_trial_count) == (8, 2)
    assert job.study_spec.algorithm == aiplatform_v1.StudySpec.Algorithm.RANDOM_SEARCH
    assert {p.parameter_id for p in job.study_spec.parameters} == {
        "learning_rate",
        "dense_units",
        "dropout",
        "per_replica_batch_size",
    }
    assert [m.metric_id for m in job.study_spec.metrics] == ["val_accuracy"]
    # The study judges a trial by the epoch the trainer would export (export_epoch=last here).
    selection = aiplatform_v1.StudySpec.MeasurementSelectionType.LAST_MEASUREMENT
    assert job.study_spec.measurement_selection_type == selection
    selection_task = walk(spec)["measurement-selection"]["task"]["inputs"]["parameters"]
    assert selection_task["export_epoch"] == {"componentInputParameter": "pipelinechannel--export_epoch"}
    assert len(job.trial_job_spec.worker_pool_specs) == 2
    # The trials' flags leave out exactly the declared space's ids: trainer_args gets the same space.
    tuned_args = walk(spec)["tuning-trainer-args"]["task"]["inputs"]["parameters"]["search_space"]
    assert tuned_args == {"componentInputParameter": "pipelinechannel--search_space"}


def test_upload_payload_is_a_model(spec: dict[str, Any]) -> None:
    root = root_values(spec, project="p", location="us-central1")
    description = "Promoted on macro_f1 over this run's test split (20 images, ...): accuracy 0.9000"
    upstream = {
        ("upload-settings", "labels"): {"pipeline_run": "run-1", "source_commit": "abc"},
        ("evaluate-model", "description"): description,
    }
    payload = render_payload(spec, "upload-new-version", upstream, root)
    payload.pop("pipeline_job")  # an UploadModelRequest field the launcher moves out of the Model
    model = json_format.ParseDict(
        payload, aiplatform_v1.Model.pb(aiplatform_v1.Model()), ignore_unknown_fields=False
    )
    assert model.display_name == "cassava-classifier"
    assert dict(model.labels) == {"pipeline_run": "run-1", "source_commit": "abc"}
    assert list(model.version_aliases) == []  # the alias moves only after the gate (set-champion)
    assert model.description == description  # the gate's like-for-like figures, on the version


def test_evaluation_payload_is_one_cpu_replica_running_trainer_evaluate(spec: dict[str, Any]) -> None:
    pools = worker_pools.build_worker_pool_specs(
        image_uri="img@sha256:" + "0" * 64,
        command=["python", "-m", "trainer.evaluate"],
        args=["--data_dir=gs://b/data", "--model_dir=gs://b/train/model", "--champion_dir=gs://b/v3/model"],
        chief_machine_type="n1-standard-8",
    )
    upstream = {
        ("evaluation-worker-pools", "worker_pool_specs"): pools,
        ("evaluation-worker-pools", "base_output_directory"): "gs://b/root/run/evaluate",
    }
    root = root_values(spec, project="p", location="us-central1", labels={"team": "ml"})
    payload = render_payload(spec, "evaluate-models", upstream, root)
    job = json_format.ParseDict(
        payload, aiplatform_v1.CustomJob.pb(aiplatform_v1.CustomJob()), ignore_unknown_fields=False
    )
    [pool] = job.job_spec.worker_pool_specs
    assert pool.replica_count == 1 and pool.machine_spec.accelerator_count == 0
    assert list(pool.container_spec.command) == ["python", "-m", "trainer.evaluate"]
    assert job.job_spec.scheduling.restart_job_on_worker_restart is False
    assert job.job_spec.base_output_directory.output_uri_prefix == "gs://b/root/run/evaluate"
    assert dict(job.labels) == {"team": "ml"}


def test_the_default_upload_names_a_serving_image_that_exists(spec: dict[str, Any]) -> None:
    """With the compiled defaults, the serving image `upload-settings` hands the importer (and so
    ModelUploadOp's containerSpec) is one of Vertex's prebuilt images that exist."""
    from google.cloud.aiplatform.constants import prediction

    from components import registry

    inputs = task_inputs(
        spec,
        "upload-settings",
        {("build-trainer-image", "serving_image_uri"): ""},
        root_values(spec, project="p", location="europe-west4"),
    )
    image = registry.upload_settings.python_func(**inputs).serving_image
    assert image in prediction.TF_CONTAINER_URIS, image
    assert image == "europe-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-15:latest"
    importer = walk(spec)["serving-container"]["task"]["inputs"]["parameters"]
    channel = json.dumps(importer)
    assert "upload-settings" in channel and "serving_image" in channel


def test_only_the_final_training_job_gets_reduction_server_and_its_image(spec: dict[str, Any]) -> None:
    """The training job runs the image the build step made for it (`training_image_uri`: the
    reduction-server stage when reducers are asked for) with the pipeline's reducer count; the
    tuning trials run the plain trainer image with no reducers whatever the parameter says: every
    trial would start and bill reducers of its own, parallel_trial_count at a time."""
    tasks = walk(spec)
    train = tasks["training-worker-pools"]["task"]["inputs"]["parameters"]
    tune = tasks["tuning-worker-pools"]["task"]["inputs"]["parameters"]
    assert train["image_uri"]["taskOutputParameter"]["outputParameterKey"] == "training_image_uri"
    # Inside the tuning condition, the build's output arrives as the condition's input.
    assert tune["image_uri"]["componentInputParameter"] == "pipelinechannel--build-trainer-image-image_uri"
    assert train["reduction_server_count"]["componentInputParameter"] == "reduction_server_count"
    assert tune["reduction_server_count"]["runtimeValue"]["constant"] == 0
    build = tasks["build-trainer-image"]["task"]["inputs"]["parameters"]
    assert build["reduction_server_count"]["componentInputParameter"] == "reduction_server_count"
    assert build["serving_tf_version"]["componentInputParameter"] == "serving_tf_version"
