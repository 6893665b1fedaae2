"""The compiled pipeline: fresh, strictly valid, the expected DAG, explicit placement of every
GCPC op, no unresolved channels, and job payloads that parse into the real API types."""

from __future__ import annotations

import difflib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from google.cloud import aiplatform_v1
from google.protobuf import json_format
from kfp import compiler
from kfp.pipeline_spec import pipeline_spec_pb2

import pipeline
from components import worker_pools
from tests.processes import ROOT


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


def test_the_local_pipeline_is_built_without_aiplatform_gcpc_or_tensorflow() -> None:
    """What every local `make run` pays before its first step: importing GCPC's tuning module for
    the study's metric cost it about 5 s (it imports aiplatform)."""
    probe = (
        "import sys, tempfile\n"
        "from kfp import compiler\n"
        "import launch.cli\n"
        "from pipeline import dag\n"
        "compiler.Compiler().compile(dag.create_pipeline('local'), tempfile.mktemp(suffix='.json'))\n"
        "heavy = ('google.cloud.aiplatform', 'google_cloud_pipeline_components', 'tensorflow')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[-2] == "[]", done.stdout


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


def test_the_dag_has_every_step(spec: dict[str, Any], local_spec: dict[str, Any]) -> None:
    """The steps the project is about stay distinct (image build, preparation, tuning, the
    multi-worker training, evaluation, upload); the bookkeeping that had steps of its own (worker
    pools, trainer and evaluation flags, artifact records, the task check, the alias move) lives
    in the plan and in the steps that consume it: each such step was a VM start on Vertex."""
    for target, compiled, registry_steps in (
        ("vertex", spec, ("serving-container", "parent-model", "upload-model", "evaluate-model")),
        ("local", local_spec, ("evaluate-model", "upload-model")),
    ):
        tasks = walk(compiled)
        for step in (
            "build-trainer-image",
            "find-champion",
            "plan-jobs",
            "prepare-dataset",
            "tune-hyperparameters",
            "best-trial",
            "train-model",
            "evaluate-models",
            "upload-settings",
            *registry_steps,
        ):
            assert step in tasks, f"{target}: no task {step}; tasks: {sorted(tasks)}"
        folded = {t for t in tasks if t.endswith(("-worker-pools", "-trainer-args", "-args"))}
        folded |= {"register-dataset", "check-same-task", "model-from-job", "no-overrides", "set-champion"}
        folded |= {"measurement-selection", "upload-new-version", "upload-first-version"}
        assert not folded & set(tasks), f"{target}: {sorted(folded & set(tasks))}"


def test_only_a_run_with_recipients_calls_the_email_op(spec: dict[str, Any], fresh_notify: Path) -> None:
    """Google documents one to three recipients for VertexNotificationEmailOp and nothing about
    none: the template without recipients has no exit handler and no such parameter."""
    assert not [t for t in walk(spec) if "notification" in t]
    assert "notification_emails" not in spec["root"]["inputDefinitions"]["parameters"]
    assert "vertex_notification_email" not in json.dumps(spec["deploymentSpec"])
    notify = json.loads(fresh_notify.read_text())
    tasks = walk(notify)
    # Everything but the e-mail runs under the exit handler; the recipients are required.
    assert tasks["train-model"]["parents"][0] == "train-and-register"  # the exit handler's group
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
    upload then creates a second model of the same name); a cached plan hands a new run an old
    run's job folders (and makes every job downstream a cache hit: a schedule would retrain
    nothing); a cached gate writes no decision on the new version and moves no alias."""
    tasks = walk(spec)
    never = {"build-trainer-image", "find-champion", "plan-jobs", "upload-model", "evaluate-model"}
    assert never <= set(pipeline.NEVER_CACHED)
    for name, task in tasks.items():
        if name in pipeline.NEVER_CACHED:
            assert not cached(task), f"{name} would be served from Vertex's cache"
    # Pure steps keep caching (the policy is this list, not caching off everywhere).
    assert cached(tasks["upload-settings"]) and cached(tasks["best-trial"])


def source_of(tasks: dict[str, Any], display: str, name: str) -> tuple[str, str]:
    """(producing task's display name, output key) of input `name` of task `display`, followed
    through the conditions and the sub-DAG it runs in; ("", parameter) for a pipeline parameter."""
    keys = {t["key"]: n for n, t in tasks.items()}
    t = tasks[display]
    inputs = t["task"]["inputs"]
    source = inputs.get("parameters", {}).get(name) or inputs.get("artifacts", {}).get(name)
    assert source is not None, (display, name)
    for kind, key in (
        ("taskOutputParameter", "outputParameterKey"),
        ("taskOutputArtifact", "outputArtifactKey"),
    ):
        if kind in source:
            return keys[source[kind]["producerTask"]], source[kind][key]
    ref = source.get("componentInputParameter") or source.get("componentInputArtifact")
    if not t["parents"]:
        return "", ref.removeprefix("pipelinechannel--")
    return source_of(tasks, t["parents"][-1], ref)


def test_every_job_writes_into_a_folder_made_by_this_run(spec: dict[str, Any]) -> None:
    tasks = walk(spec)
    for job, folder in (
        ("prepare-dataset", "prepare_dir"),
        ("tune-hyperparameters", "tuning_dir"),
        ("train-model", "training_dir"),
        ("evaluate-models", "evaluation_dir"),
    ):
        assert source_of(tasks, job, "base_output_directory") == ("plan-jobs", folder), job
    assert not cached(tasks["plan-jobs"])


def dependencies(tasks: dict[str, Any], name: str) -> set[str]:
    keys = {t["key"]: display for display, t in tasks.items()}
    return {keys[d] for d in tasks[name]["task"].get("dependentTasks", [])}


def test_dependencies_and_conditions(spec: dict[str, Any], local_spec: dict[str, Any]) -> None:
    tasks = walk(spec)
    assert tasks["tune-hyperparameters"]["parents"][-1] == "tuning-enabled"
    conditions = {t["task"].get("triggerPolicy", {}).get("condition", "") for t in tasks.values()}
    assert "inputs.parameter_values['pipelinechannel--tune'] == true" in conditions
    assert "!(inputs.parameter_values['pipelinechannel--tune'] == true)" in conditions
    assert dependencies(tasks, "best-trial") == {"tune-hyperparameters"}
    # One training job per branch, each in its condition's DAG: the tuned one on the best
    # trial's pools, the other on the plan's (which the best trial's step starts from).
    pools = {}
    for name, component in spec["components"].items():
        for task in component.get("dag", {}).get("tasks", {}).values():
            if task["taskInfo"]["name"] == "train-model":
                pools[name] = task["inputs"]["parameters"]["worker_pool_specs"]
    # Two branches of the preparation (a job, or Dataflow on prepare_engine=beam), each with both.
    assert len(pools) == 4, pools
    tuned = [
        v
        for v in pools.values()
        if v.get("taskOutputParameter", {}).get("outputParameterKey") == "worker_pool_specs"
    ]
    assert sorted(v["taskOutputParameter"]["producerTask"] for v in tuned) == ["best-trial", "best-trial-2"]
    untuned = [v for v in pools.values() if v not in tuned]
    assert untuned == [{"componentInputParameter": "pipelinechannel--plan-jobs-training_pools"}] * 2
    assert source_of(tasks, "best-trial", "training_pools") == ("plan-jobs", "training_pools")
    # The trials and the final training start only once the dataset is prepared.
    assert {"prepare-dataset", "plan-jobs"} <= upstream(tasks, "tune-hyperparameters")
    assert {"prepare-dataset", "plan-jobs"} <= upstream(tasks, "train-model")
    assert {"build-trainer-image", "find-champion"} <= dependencies(tasks, "plan-jobs")
    assert "train-model" in dependencies(tasks, "evaluate-models")
    # Vertex: the upload once the evaluation ran, then the gate on the uploaded version.
    assert {"evaluate-models", "parent-model", "serving-container"} <= dependencies(tasks, "upload-model")
    assert source_of(tasks, "evaluate-model", "uploaded") == ("upload-model", "model")
    # The local registry has no version before the decision: the gate, then the upload.
    local = walk(local_spec)
    assert "evaluate-models" in dependencies(local, "evaluate-model")
    assert source_of(local, "upload-model", "model") == ("evaluate-model", "model")
    assert source_of(local, "upload-model", "promote") == ("evaluate-model", "promote")


def test_no_artifact_is_joined_by_one_of(spec: dict[str, Any], local_spec: dict[str, Any]) -> None:
    """kubeflow/pipelines#13436: an artifact `dsl.OneOf` has no confirmed Vertex support. The
    steps after tuning are the same in either branch, and one upload takes a parent model
    that may be empty: nothing joins two branches' outputs."""
    for compiled in (spec, local_spec):
        text = json.dumps(compiled)
        assert "Condition-branches-output" not in text and "valueFromOneof" not in text
        for component in compiled["components"].values():
            outputs = component.get("dag", {}).get("outputs", {})
            for kind in ("artifacts", "parameters"):
                for selector in outputs.get(kind, {}).values():
                    assert (
                        len(
                            selector.get(
                                "artifactSelectors",
                                selector.get("valueFromOneof", {}).get("parameterSelectors", []),
                            )
                        )
                        <= 1
                    )


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
    five-class champion. The uncached find-champion reads the champion's class names before any
    work; the plan hands them to the preparation job, which refuses a source of other classes as
    soon as it has listed them (`trainer.prepare --champion_class_names`), and both the tuning
    job and the final training wait for the preparation; the gate compares the class names again."""
    tasks = walk(spec if target == "vertex" else local_spec)
    assert source_of(tasks, "plan-jobs", "champion_class_names") == ("find-champion", "class_names")
    assert source_of(tasks, "prepare-dataset", "worker_pool_specs") == ("plan-jobs", "prepare_pools")
    assert tasks["find-champion"]["parents"] == () and tasks["plan-jobs"]["parents"] == ()
    for job in ("tune-hyperparameters", "train-model"):
        assert "prepare-dataset" in upstream(tasks, job), f"{job} can start before the preparation"
    assert "train-model" not in upstream(tasks, "find-champion")
    assert not cached(tasks["find-champion"])
    assert source_of(tasks, "evaluate-model", "champion_class_names") == ("find-champion", "class_names")
    assert source_of(tasks, "evaluate-model", "champion_version") == ("find-champion", "champion_version")


@pytest.mark.parametrize("target", ["vertex", "local"])
def test_the_gate_compares_both_models_evaluated_by_one_job_on_this_runs_test_split(
    target: str, spec: dict[str, Any], local_spec: dict[str, Any]
) -> None:
    """The champion is re-evaluated on this run's data: the plan gives the evaluation job this
    run's dataset, the new model and the champion's SavedModel folder from find-champion
    (tests/components/test_steps.py runs the plan); the gate reads that job's output folder and
    waits for it; the alias moves only from the champion the gate compared with."""
    tasks = walk(spec if target == "vertex" else local_spec)
    assert source_of(tasks, "plan-jobs", "champion_uri") == ("find-champion", "champion_uri")
    assert source_of(tasks, "plan-jobs", "prepare_machine_type") == ("", "prepare_machine_type")
    assert source_of(tasks, "evaluate-models", "worker_pool_specs") == ("plan-jobs", "evaluation_pools")
    assert source_of(tasks, "evaluate-model", "evaluation_dir") == ("plan-jobs", "evaluation_dir")
    assert source_of(tasks, "evaluate-model", "model_uri") == ("plan-jobs", "model_uri")
    assert source_of(tasks, "evaluate-model", "dataset_uri") == ("plan-jobs", "dataset_uri")
    assert "evaluate-models" in upstream(tasks, "evaluate-model")
    for name in ("gate_metric", "min_score"):
        assert source_of(tasks, "evaluate-model", name) == ("", name)
    if target == "local":
        champion = source_of(tasks, "upload-model", "evaluated_champion")
        assert champion == ("find-champion", "champion_version")


def test_every_gcpc_op_is_placed_explicitly(spec: dict[str, Any]) -> None:
    executors = spec["deploymentSpec"]["executors"]
    checked = 0
    for display, t in walk(spec).items():
        container = executors.get(t["component"].get("executorLabel", ""), {}).get("container", {})
        # A GCPC op runs one of GCPC's launchers; our own components only share its image.
        if not any("google_cloud_pipeline_components.container" in c for c in container.get("command", [])):
            continue
        if display in ("vertex-pipelines-notification-email", "wait-dataflow-preparation"):
            continue  # no project or location inputs: the e-mail goes from Vertex; the wait reads the job's URI
        params = t["task"]["inputs"]["parameters"]
        for key in ("project", "location"):
            assert key in params, f"{display} has no explicit {key} (GCPC defaults to us-central1)"
            assert params[key]["componentInputParameter"] in (key, f"pipelinechannel--{key}"), display
        checked += 1
    assert checked == 6  # prepare (as a job, or launched on Dataflow), tune, train, evaluate, upload


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
    # ("", name): an input of the sub-DAG the task runs in (train-and-register's), by its name.
    upstream = {
        f"{tasks[task]['key']}-{output}" if task else output: value for (task, output), value in given.items()
    }
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
        ("plan-jobs", "training_pools"): pools,  # the tuning-disabled branch's training job
        ("best-trial", "worker_pool_specs"): pools,  # the tuning-enabled branch's
        ("plan-jobs", "training_dir"): "gs://b/root/run/train",
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
    upstream = {("plan-jobs", "prepare_pools"): pools, ("plan-jobs", "prepare_dir"): "gs://b/root/run/prep"}
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
        ("plan-jobs", "tuning_pools"): default_pools(spec),
        ("plan-jobs", "tuning_dir"): "gs://b/root/run/tune",
        ("plan-jobs", "measurement_selection_type"): "LAST_MEASUREMENT",
    }
    root = root_values(
        spec, project="p", location="europe-west4", search_algorithm="RANDOM_SEARCH", timeout="5400s"
    )
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
    tasks = walk(spec)
    assert source_of(tasks, "plan-jobs", "export_epoch") == ("", "export_epoch")
    chosen_by = source_of(tasks, "tune-hyperparameters", "study_spec_measurement_selection_type")
    assert chosen_by == ("plan-jobs", "measurement_selection_type")
    assert len(job.trial_job_spec.worker_pool_specs) == 2
    # Each trial is a CustomJob of trial_job_spec: it runs at most the run's timeout.
    assert job.trial_job_spec.scheduling.timeout.ToSeconds() == 5400
    # The trials' flags leave out exactly the declared space's ids: the plan gets the same space.
    assert source_of(tasks, "plan-jobs", "search_space") == ("", "search_space")
    assert source_of(tasks, "tune-hyperparameters", "study_spec_parameters") == ("", "search_space")


def test_upload_payload_is_a_model(spec: dict[str, Any]) -> None:
    root = root_values(spec, project="p", location="us-central1")
    upstream = {("upload-settings", "labels"): {"pipeline_run": "run-1", "source_commit": "abc"}}
    payload = render_payload(spec, "upload-model", upstream, root)
    payload.pop("pipeline_job")  # an UploadModelRequest field the launcher moves out of the Model
    model = json_format.ParseDict(
        payload, aiplatform_v1.Model.pb(aiplatform_v1.Model()), ignore_unknown_fields=False
    )
    assert model.display_name == "cassava-classifier"
    assert dict(model.labels) == {"pipeline_run": "run-1", "source_commit": "abc"}
    assert list(model.version_aliases) == []  # the alias moves only after the gate
    # The gate writes its figures on the version afterwards (`registry.record_on_version`): the
    # upload sets no description, which on a new version would be the model's, not the version's.
    assert model.description == ""


def test_evaluation_payload_is_one_cpu_replica_running_trainer_evaluate(spec: dict[str, Any]) -> None:
    pools = worker_pools.build_worker_pool_specs(
        image_uri="img@sha256:" + "0" * 64,
        command=["python", "-m", "trainer.evaluate"],
        args=["--data_dir=gs://b/data", "--model_dir=gs://b/train/model", "--champion_dir=gs://b/v3/model"],
        chief_machine_type="n1-standard-8",
    )
    upstream = {
        ("plan-jobs", "evaluation_pools"): pools,
        ("plan-jobs", "evaluation_dir"): "gs://b/root/run/evaluate",
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
        {("build-trainer-image", "serving_image_uri"): "", ("plan-jobs", "model_uri"): "gs://b/m/run/1"},
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
    trial would start and bill reducers of its own, parallel_trial_count at a time. The CPU jobs
    (preparation, evaluation) run the cpu image, which has no CUDA wheels to pull."""
    from kfp import dsl

    from components import plan

    tasks = walk(spec)
    assert source_of(tasks, "plan-jobs", "training_image_uri") == (
        "build-trainer-image",
        "training_image_uri",
    )
    assert source_of(tasks, "plan-jobs", "image_uri") == ("build-trainer-image", "image_uri")
    assert source_of(tasks, "plan-jobs", "cpu_image_uri") == ("build-trainer-image", "cpu_image_uri")
    assert source_of(tasks, "plan-jobs", "reduction_server_count") == ("", "reduction_server_count")
    build = tasks["build-trainer-image"]["task"]["inputs"]["parameters"]
    assert build["reduction_server_count"]["componentInputParameter"] == "reduction_server_count"
    assert build["serving_tf_version"]["componentInputParameter"] == "serving_tf_version"
    values = root_values(spec, location="us-central1", reduction_server_count=2)
    out = plan.plan_jobs.python_func(
        image_uri="trainer@sha256:" + "0" * 64,
        training_image_uri="reducer@sha256:" + "1" * 64,
        cpu_image_uri="cpu@sha256:" + "2" * 64,
        champion_class_names=[],
        champion_uri="",
        model_root="gs://models-bucket/kept",
        pipeline_run="run-1",
        region="us-central1",
        dataflow_image_uri="",
        **{name: values[name] for name in pipeline.dag.PLAN_PARAMETERS},
        **{
            n: dsl.Artifact(uri=f"gs://b/{n}")
            for n in ("prepare_job", "tuning_job", "training_job", "evaluation_job")
        },
    )
    assert [p["replica_count"] for p in out.training_pools] == [1, 1, 2]
    assert out.model_uri == "gs://models-bucket/kept/cassava-classifier/run-1/1"
    assert out.training_pools[0]["container_spec"]["image_uri"].startswith("reducer@")
    assert len(out.tuning_pools) == 2 and out.tuning_pools[0]["container_spec"]["image_uri"].startswith(
        "trainer@"
    )
    for pools in (out.prepare_pools, out.evaluation_pools):
        assert [p["container_spec"]["image_uri"] for p in pools] == ["cpu@sha256:" + "2" * 64]


# --- prepare_engine=beam on Vertex: the Dataflow Flex Template launch ---------------------------


DATAFLOW_KEY = "projects/p/locations/us-central1/keyRings/r/cryptoKeys/k"
DATAFLOW_IMAGE = "us-central1-docker.pkg.dev/p/r/trainer-dataflow@sha256:" + "2" * 64


def dataflow_launch(spec: dict[str, Any], folder: Path) -> tuple[Any, str]:
    """(the real plan's outputs, the rendered `--payload` of launch-dataflow-preparation) for a
    Vertex run with prepare_engine=beam; the plan writes its spec file under `folder`."""
    from kfp import dsl

    from components import plan

    root = root_values(
        spec,
        project="p",
        location="us-central1",
        labels={"team": "ml"},
        prepare_engine="beam",
        dataset_source="folder:gs://b/images",
        service_account="trainer@p.iam.gserviceaccount.com",
        network="projects/123/global/networks/vpc",
        encryption_spec_key_name=DATAFLOW_KEY,
    )
    out = plan.plan_jobs.python_func(
        image_uri="us-central1-docker.pkg.dev/p/r/trainer@sha256:" + "0" * 64,
        training_image_uri="us-central1-docker.pkg.dev/p/r/trainer@sha256:" + "0" * 64,
        cpu_image_uri="us-central1-docker.pkg.dev/p/r/trainer-cpu@sha256:" + "0" * 64,
        champion_class_names=["a", "b"],
        champion_uri="",
        model_root="gs://b/models",
        pipeline_run="run-1",
        region="us-central1",
        dataflow_image_uri=DATAFLOW_IMAGE,
        **{name: root[name] for name in pipeline.dag.PLAN_PARAMETERS},
        prepare_job=dsl.Artifact(uri=str(folder / "prepare_job")),
        **{n: dsl.Artifact(uri=f"gs://b/{n}") for n in ("tuning_job", "training_job", "evaluation_job")},
    )
    upstream = {
        ("plan-jobs", name): getattr(out, name)
        for name in ("dataflow_template", "dataflow_parameters", "dataflow_temp_location", "dataflow_network")
    }
    upstream[("build-trainer-image", "dataflow_image_uri")] = DATAFLOW_IMAGE
    return out, json.dumps(render_payload(spec, "launch-dataflow-preparation", upstream, root))


def test_the_dataflow_launch_is_a_flex_template_request_of_the_dataflow_image(
    spec: dict[str, Any], tmp_path: Path
) -> None:
    """The launch GCPC's flex-template launcher would POST, its placeholders rendered from the
    real plan's outputs, parsed strictly into google.cloud.dataflow_v1beta3 types after the
    launcher drops empty values; the spec file the plan wrote, into `ContainerSpec`; and the
    parameters, handed to trainer.prepare as the Flex Template launcher hands them (--name=value),
    accepted by its parser."""
    from google.cloud import dataflow_v1beta3
    from google_cloud_pipeline_components.container.v1.gcp_launcher.utils.json_util import (
        recursive_remove_empty,
    )

    from trainer.prepare import parse_args

    out, rendered = dataflow_launch(spec, tmp_path)
    image, key = DATAFLOW_IMAGE, DATAFLOW_KEY
    container = json_format.ParseDict(
        json.loads(Path(out.dataflow_template).read_text()),
        dataflow_v1beta3.ContainerSpec.pb(dataflow_v1beta3.ContainerSpec()),
        ignore_unknown_fields=False,
    )
    assert container.image == image
    assert dataflow_v1beta3.SDKInfo.Language(container.sdk_info.language).name == "PYTHON"
    assert sorted(p.name for p in container.metadata.parameters) == sorted(out.dataflow_parameters)

    payload = recursive_remove_empty(json.loads(rendered))
    request = json_format.ParseDict(
        {**payload, "project_id": "p", "location": "us-central1"},
        dataflow_v1beta3.LaunchFlexTemplateRequest.pb(dataflow_v1beta3.LaunchFlexTemplateRequest()),
        ignore_unknown_fields=False,
    )
    launch = request.launch_parameter
    assert launch.container_spec_gcs_path == out.dataflow_template
    env = launch.environment
    assert env.sdk_container_image == image
    assert (env.max_workers, env.machine_type) == (8, "n1-standard-4")
    assert env.service_account_email == "trainer@p.iam.gserviceaccount.com"
    assert env.network == "vpc"  # Dataflow takes the network's name
    assert env.kms_key_name == key
    assert env.temp_location == env.staging_location == out.dataflow_temp_location
    assert dict(env.additional_user_labels) == {"team": "ml"}  # the launcher adds the run's own
    assert dict(launch.parameters) == out.dataflow_parameters
    assert out.dataflow_parameters["output_dir"] == out.dataset_uri
    assert out.dataflow_parameters["champion_class_names"] == '["a", "b"]'

    config = parse_args([f"--{name}={value}" for name, value in launch.parameters.items()])
    assert (config.engine, config.overwrite, config.output_dir) == ("beam", True, out.dataset_uri)
    assert config.source == "folder:gs://b/images" and config.champion_class_names == ("a", "b")


def test_the_dataflow_branch_runs_only_with_prepare_engine_beam_and_feeds_the_same_training(
    spec: dict[str, Any],
) -> None:
    tasks = walk(spec)
    launch, wait = tasks["launch-dataflow-preparation"], tasks["wait-dataflow-preparation"]
    assert wait["task"]["dependentTasks"] == [launch["key"]]
    assert launch["parents"][-1] == "prepare-on-dataflow" and wait["parents"][-1] == "prepare-on-dataflow"
    assert tasks["prepare-dataset"]["parents"][-1] == "prepare-in-a-job"
    condition = "inputs.parameter_values['pipelinechannel--prepare_engine'] == 'beam'"
    on_dataflow = tasks["prepare-on-dataflow"]["task"]["triggerPolicy"]["condition"]
    in_a_job = tasks["prepare-in-a-job"]["task"]["triggerPolicy"]["condition"]
    assert (on_dataflow, in_a_job) == (condition, f"!({condition})")

    def steps_under(component: dict[str, Any]) -> list[str]:
        names = []
        for task in component.get("dag", {}).get("tasks", {}).values():
            if not task["taskInfo"]["name"].startswith("condition-branches"):  # KFP's own groups
                names.append(task["taskInfo"]["name"])
            names += steps_under(spec["components"][task["componentRef"]["name"]])
        return names

    # The same steps after the preparation in both branches (tuned or not in each).
    dataflow = steps_under(tasks["prepare-on-dataflow"]["component"])
    job = steps_under(tasks["prepare-in-a-job"]["component"])
    swapped = [n for n in job if n != "prepare-dataset"]
    assert sorted(dataflow) == sorted([*swapped, "launch-dataflow-preparation", "wait-dataflow-preparation"])
    assert dataflow.count("train-model") == job.count("train-model") == 2


def launch_and_wait(
    spec: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, states: tuple[str, ...]
) -> tuple[Any, Any, Path]:
    """The Dataflow branch's two GCPC steps run by their real launchers, as the compiled template
    wires them, against a local fake of Dataflow's API (`tests.fakes.DataflowApi`, its job going
    through `states`): launch-dataflow-preparation on its rendered payload, then
    wait-dataflow-preparation on the `gcp_resources` the launch wrote. (the fake, the plan's
    outputs, the wait's output file); the wait's exception propagates."""
    import google.auth
    from google.oauth2.credentials import Credentials
    from google_cloud_pipeline_components.container.preview.dataflow.flex_template import launcher
    from google_cloud_pipeline_components.container.v1.wait_gcp_resources import launcher as wait_launcher

    from tests.fakes import DataflowApi, RestFake

    out, rendered = dataflow_launch(spec, tmp_path)
    monkeypatch.setenv(
        "VERTEX_AI_PIPELINES_RUN_LABELS", json.dumps({"vertex-ai-pipelines-run-billing-id": "7"})
    )
    monkeypatch.setattr(google.auth, "default", lambda *a, **k: (Credentials(token="dataflow-token"), "p"))
    rest = RestFake()
    dataflow = DataflowApi(rest, states)
    DataflowApi.point_gcpc_launchers(monkeypatch, rest.address)
    launched, waited = tmp_path / "launch_gcp_resources", tmp_path / "wait_gcp_resources"
    try:
        launcher.main(
            ["--type", "DataflowJob", "--project", "p", "--location", "us-central1",
             "--payload", rendered, "--gcp_resources", str(launched)]
        )  # fmt: skip
        wait = walk(spec)["wait-dataflow-preparation"]["component"]["executorLabel"]
        given = {("launch-dataflow-preparation", "gcp_resources"): launched.read_text()}
        payload = json.dumps(render_payload(spec, "wait-dataflow-preparation", given, {}))
        argv = [payload if a.startswith("{{$.inputs") else a for a in executor_args(spec, wait)]
        argv[argv.index("--gcp_resources") + 1] = str(waited)
        wait_launcher.main(argv)
    finally:
        rest.stop()
    assert not dataflow.refused, dataflow.refused
    return dataflow, out, waited


def executor_args(spec: dict[str, Any], executor: str) -> list[str]:
    return list(spec["deploymentSpec"]["executors"][executor]["container"]["args"])


def test_gcpcs_launchers_send_the_launch_to_dataflow_and_wait_for_the_job(
    spec: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real launchers of GCPC 2.22 (`container/preview/dataflow/flex_template`, then
    `container/v1/wait_gcp_resources`) against a local fake of Dataflow's REST API: the request
    the launch POSTs (the run's labels merged in, empty values dropped, a job name made) parses
    strictly into `LaunchFlexTemplateRequest`; it writes the job's URI as gcp_resources; the wait
    step takes that URI apart, polls that job until `JOB_STATE_DONE` and passes the URI on."""
    dataflow, out, waited = launch_and_wait(
        spec, tmp_path, monkeypatch, ("JOB_STATE_QUEUED", "JOB_STATE_RUNNING", "JOB_STATE_DONE")
    )
    (request,) = dataflow.launched
    launch_parameter = request.launch_parameter
    assert launch_parameter.job_name.startswith("dataflowjob-")
    assert launch_parameter.environment.sdk_container_image == DATAFLOW_IMAGE
    assert dict(launch_parameter.environment.additional_user_labels) == {
        "team": "ml",
        "vertex-ai-pipelines-run-billing-id": "7",
    }
    assert dict(launch_parameter.parameters) == out.dataflow_parameters
    job = dataflow.job_id(1)
    uri = f"https://dataflow.googleapis.com/v1b3/projects/p/locations/us-central1/jobs/{job}"
    assert json.loads(waited.read_text())["resources"] == [
        {"resourceType": "DataflowJob", "resourceUri": uri}
    ]
    assert dataflow.polled == [job, job, job]


@pytest.mark.parametrize("state", ["JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_DRAINED"])
def test_the_wait_step_fails_the_run_when_the_dataflow_job_does_not_finish_done(
    spec: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: str
) -> None:
    """A Dataflow job that ends in any state but DONE (a bad image fails it:
    docs/training.md#preparing-on-apache-beam) fails
    the wait step, so the training never starts on a half-written dataset."""
    with pytest.raises(RuntimeError, match=f"failed with error state: {state}"):
        launch_and_wait(spec, tmp_path, monkeypatch, ("JOB_STATE_RUNNING", state))
