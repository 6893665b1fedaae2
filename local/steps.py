"""The local backend's KFP components: each takes the same inputs as the Vertex step it stands in
for and runs it on this machine, as strictly as Vertex (see
docs/guarantees.md#the-local-target-is-as-strict-as-vertex).

Their bodies run in kfp.local's executor, where `kfp.dsl` has no decorators: they import only
plain modules (`local.jobs`, `local.tuner`, `local.servingenv`, `local.registry`,
`components.buildcontext`); helpers from `components` travel as `additional_funcs`.
"""

from typing import NamedTuple

from kfp import dsl

from components import stepimage
from components.buildcontext import context_tag
from components.image import image_outputs, trainer_images
from components.registry import (
    check_model_display_name,
    registry_folder,
    task_mismatch,
)
from components.servingimage import (
    UNDEPLOYABLE_FUNCS,
    prebuilt_days_left,
    prebuilt_tf_serving_table,
    prebuilt_tf_version,
    resolve_serving_image,
    serving_policy,
    undeployable,
)
from components.tuning import BEST_TRIAL_FUNCS, best_trial_outputs

# The metrics.json and evaluation.json keys read here (tests/test_contracts.py checks them against
# trainer/contract.py and the code below).
METRICS_READ = ("test_accuracy", "class_names")
EVALUATION_READ = (
    "split",
    "dataset_fingerprint",
    "models",
    "examples",
    "accuracy",
    "macro_f1",
    "loss",
    "recorded",
    "comparison",
)


@dsl.component(
    base_image=stepimage.BASE_IMAGE,
    install_kfp_package=False,
    additional_funcs=[
        context_tag,
        prebuilt_tf_serving_table,
        serving_policy,
        prebuilt_days_left,
        resolve_serving_image,
        trainer_images,
        image_outputs,
    ],
)
def check_build_context(
    context_dir: str,
    repository: str,
    image_name: str = "trainer",
    serving_image: str = "auto",
    serving_tf_version: str = "2.15",
    serving_accelerator: str = "cpu",
    reduction_server_count: int = 0,
    prepare_engine: str = "job",
) -> NamedTuple(
    "Outputs",
    image_uri=str,
    tag=str,
    built=bool,
    serving_image_uri=str,
    training_image_uri=str,
    dataflow_image_uri=str,
    cpu_image_uri=str,
):
    """Local form of the image build: checks the build context and names the images, tag and all,
    that the Vertex build would make (`components.image.trainer_images`); builds nothing (local
    jobs, Beam's DirectRunner too, run in this checkout's environment)."""
    from components.buildcontext import context_members

    tag = context_tag(context_members(context_dir))
    print(f"build context {context_dir}: tag {tag} (local runs use the checkout, nothing built)")
    custom = resolve_serving_image(serving_image, serving_tf_version) == "custom"
    wanted = trainer_images(
        f"{repository}/{image_name}", serving_accelerator, reduction_server_count, prepare_engine, custom
    )
    return image_outputs({out: f"{image}:{tag}" for out, (image, _, _) in wanted.items()}, tag, False)


@dsl.component(base_image=stepimage.BASE_IMAGE, install_kfp_package=False)
def local_custom_job(
    display_name: str,
    project: str,
    worker_pool_specs: list,
    base_output_directory: str,
    timeout: str = "3600s",
    restart_job_on_worker_restart: bool = False,
    max_restarts: int = 3,
) -> NamedTuple("Outputs", attempts=int, seconds=float):
    """Local form of `CustomTrainingJobOp` (`local.jobs`)."""
    import collections
    import os

    from local import jobs

    result = jobs.run_job(
        worker_pool_specs,
        base_output_directory,
        display_name=display_name,
        project=project,
        log_dir=os.path.join(base_output_directory, "replica_logs"),
        timeout=timeout,
        restart_job_on_worker_restart=restart_job_on_worker_restart,
        max_restarts=max_restarts,
    )
    print(f"done in {result.seconds:.1f}s, {result.attempts} attempt(s)")
    Outputs = collections.namedtuple("Outputs", ["attempts", "seconds"])
    return Outputs(result.attempts, result.seconds)


@dsl.component(base_image=stepimage.BASE_IMAGE, install_kfp_package=False)
def local_tuning_job(
    project: str,
    worker_pool_specs: list,
    base_output_directory: str,
    study_spec_metrics: list,
    study_spec_parameters: list,
    max_trial_count: int,
    parallel_trial_count: int,
    trials: dsl.Output[dsl.Artifact],
    max_failed_trial_count: int = 0,
    study_spec_algorithm: str = "ALGORITHM_UNSPECIFIED",
    measurement_selection: str = "BEST_MEASUREMENT",
    seed: int = 0,
    timeout: str = "3600s",
    restart_job_on_worker_restart: bool = False,
) -> int:
    """Local form of `HyperparameterTuningJobRunOp` (`local.tuner`), seeded with the run's `seed`
    (Vertex's Vizier takes none). `trials` gets the trials table; returns its size."""
    import json

    from local import tuner

    table = tuner.run_tuning(
        worker_pool_specs,
        base_output_directory,
        study_spec_metrics,
        study_spec_parameters,
        max_trial_count=max_trial_count,
        parallel_trial_count=parallel_trial_count,
        max_failed_trial_count=max_failed_trial_count,
        algorithm=study_spec_algorithm,
        measurement_selection=measurement_selection,
        seed=seed,
        project=project,
        timeout=timeout,
        restart_job_on_worker_restart=restart_job_on_worker_restart,
    )
    with open(trials.path, "w") as f:
        json.dump(table, f, indent=1)
    trials.metadata["count"] = len(table)
    return len(table)


@dsl.component(base_image=stepimage.BASE_IMAGE, install_kfp_package=False, additional_funcs=BEST_TRIAL_FUNCS)
def local_best_trial(
    trials: dsl.Input[dsl.Artifact],
    training_pools: list,
    metric_id: str = "val_accuracy",
    goal: str = "MAXIMIZE",
) -> NamedTuple("Outputs", worker_pool_specs=list, hyperparameters=dict, trial_id=str, value=float):
    """Local form of `best_trial`, on the local tuner's trials table."""
    import json

    with open(trials.path) as f:
        return best_trial_outputs(json.load(f), training_pools, metric_id, goal)


# --- the model registry, in a folder (every file access through `local.registry`) ------------
# <registry_dir>/<model folder>/<version>/model/  the SavedModel (and its metrics.json, config.json)
# <registry_dir>/<model folder>/<version>/version.json  the record, and its files' sizes and sha256
# <registry_dir>/<model folder>/aliases.json  {"default": "1", "champion": "<version>"}
# <registry_dir>/<model folder>/.lock  held (fcntl) while a version is added and the alias moved


def champion_record(model_fd: int, model_dir: str) -> dict:
    """The `champion` version of the model folder `model_dir` (open as `model_fd`): `version`,
    `path` (its SavedModel), and its metrics.json's `test_accuracy` and `class_names`; {} when
    there is no aliases.json or no such alias; {"version", "unusable", "fix", "state"} when that
    version cannot be used. A damaged aliases.json raises `local.registry.Damaged`."""
    from local import registry

    version = (registry.read_aliases(model_fd, model_dir) or {}).get("champion")
    if version is None:
        return {}
    try:
        path, metrics, record = registry.read_version(model_fd, model_dir, version)
    except registry.Damaged as err:  # of the champion's files: no usable champion
        unusable = f"{err.path} {err.problem}"
        return {"version": version, "unusable": unusable, "fix": err.fix, "state": "is damaged"}
    why = undeployable(str(record.get("serving_image", "")))
    if why:  # as on Vertex (`components.registry.find_champion`)
        fix = "put champion on a version registered with a serving image that is still available"
        return {"version": version, "unusable": why, "fix": fix, "state": "cannot be deployed"}
    return {
        "version": version,
        "path": path,
        "test_accuracy": float(metrics["test_accuracy"]),
        "class_names": [str(c) for c in metrics["class_names"]],
    }


def register_version(
    model_path: str,
    registry_dir: str,
    model_display_name: str,
    promote: bool,
    gate_reason: str,
    details: dict,
    evaluated_champion: str = "",
) -> tuple:
    """Adds the SavedModel folder `model_path` as the next version of `model_display_name`; returns
    (version, its folder, whether it took the alias, why). Under the model's lock (one version per
    run), the alias moves only if the gate (`promote`) passed, it is still on `evaluated_champion`
    (the version the gate compared with; "": none usable; Vertex's rule:
    `components.registry.record_on_version`) and the task is the same; a damaged champion counts
    as none. `details` go into version.json."""
    import json
    import os
    import time

    from local import registry

    with open(os.path.join(model_path, "metrics.json")) as f:
        metrics = json.load(f)
    accuracy = float(metrics["test_accuracy"])
    class_names = [str(c) for c in metrics["class_names"]]
    root = os.path.join(os.path.abspath(registry_dir), registry_folder(model_display_name))
    model_fd = registry.make_model(registry_dir, registry_folder(model_display_name))
    try:
        with registry.locked(model_fd, root):
            aliases = registry.read_aliases(model_fd, root) or {}
            current = champion_record(model_fd, root)
            damaged = current.pop("unusable", "")
            before = {"version": current["version"], "unusable": damaged} if damaged else current or None
            none = "no champion"
            if damaged:
                none = f"no usable champion (champion version {current['version']} {current['state']}: {damaged})"
                current = {}
            other_task = task_mismatch(class_names, current.get("class_names", []), model_display_name)
            was = f"champion version {current.get('version')}"
            moved_since = current.get("version", "") != evaluated_champion
            champion = promote and not other_task and not moved_since
            if not promote:
                reason = f"the gate held it: {gate_reason}"
            elif other_task:
                reason = f"{was} is of another task: {other_task}"
            elif moved_since:  # another run moved the alias after this run's gate read the registry
                compared = f"version {evaluated_champion}" if evaluated_champion else "no version"
                now = f"version {current['version']}" if current else none
                reason = (
                    f"champion is now on {now}, but was on {compared} when this run's gate compared: this "
                    "model was never compared with the champion now; run again to compare them on "
                    "like-for-like data"
                )
            elif not current:
                reason = f"the gate passed it ({gate_reason}) and there is {none} yet"
            else:
                reason = f"the gate passed it against {was} ({gate_reason})"
            record = {
                "model": model_display_name,
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                **details,
                "test_accuracy": accuracy,
                "class_names": class_names,
                "gate": {"promote": promote, "reason": gate_reason},
                "alias": {"name": "champion", "moved": champion, "reason": reason, "before": before},
            }
            version, where = registry.publish(model_fd, root, model_path, record, aliases)
            aliases.setdefault("default", version)
            if champion:  # `default` moves with it, as on Vertex (`record_on_version`)
                aliases["champion"] = aliases["default"] = version
            registry.write_aliases(model_fd, aliases)
    finally:
        os.close(model_fd)
    return version, where, champion, reason


# What a component that reads the champion ships (`additional_funcs`).
CHAMPION_FUNCS = [check_model_display_name, registry_folder, *UNDEPLOYABLE_FUNCS, champion_record]


@dsl.component(base_image=stepimage.BASE_IMAGE, install_kfp_package=False, additional_funcs=CHAMPION_FUNCS)
def local_find_champion(registry_dir: str, model_display_name: str) -> NamedTuple(
    "Outputs",
    exists=bool,
    resource_name=str,
    resource_uri=str,
    champion_version=str,
    champion_uri=str,
    class_names=list,
):
    """Local form of `find_champion` on the registry folder: the champion's version, SavedModel folder
    and class names ("", "", [] for none; a damaged champion is none, said with the path and fix)."""
    import collections
    import os

    from local import registry

    Outputs = collections.namedtuple(
        "Outputs", "exists resource_name resource_uri champion_version champion_uri class_names"
    )
    folder = registry_folder(model_display_name)
    model_dir = os.path.join(os.path.abspath(registry_dir), folder)
    registry_fd = registry.open_registry(registry_dir, create=False)
    model_fd = current = None
    if registry_fd is not None:
        try:
            model_fd = registry.open_model(registry_fd, registry_dir, folder, create=False)
        finally:
            os.close(registry_fd)
    if model_fd is not None:
        try:
            if registry.read_aliases(model_fd, model_dir) is not None:
                current = champion_record(model_fd, model_dir)
        finally:
            os.close(model_fd)
    if current is None:
        print(f"no model {model_display_name!r} in {registry_dir} yet: the upload creates it")
        return Outputs(False, "", "", "", "", [])
    if not current:
        print(f"{model_display_name} has no 'champion' version yet")
        return Outputs(True, model_dir, model_dir, "", "", [])
    if "unusable" in current:
        print(
            f"WARNING: {model_display_name}: champion version {current['version']} {current['state']}, so this run has no "
            f"usable champion and compares with none: {current['unusable']}; if the gate passes, the new "
            f"model takes champion and version {current['version']} stays in the registry; to keep it as "
            f"champion instead, {current['fix']}"
        )
        return Outputs(True, model_dir, model_dir, "", "", [])
    print(
        f"{model_display_name}: champion is version {current['version']} ({current['path']}), recorded "
        f"test_accuracy {current['test_accuracy']:.4f} on its own test split, classes {current['class_names']}"
    )
    return Outputs(True, model_dir, model_dir, current["version"], current["path"], current["class_names"])


@dsl.component(
    base_image=stepimage.BASE_IMAGE,
    install_kfp_package=False,
    additional_funcs=[*CHAMPION_FUNCS, task_mismatch, register_version],
)
def local_upload_model(
    model: dsl.Input[dsl.Model],
    registry_dir: str,
    model_display_name: str,
    serving_image: str,
    artifact_uri: str,
    predict_route: str,
    labels: dict,
    promote: bool,
    gate_reason: str,
    description: str,
    evaluated_champion: str,
    evaluation_dir: str,
) -> NamedTuple("Outputs", version=str, path=str, champion=bool):
    """Local form of `ModelUploadOp` and the gate's alias move (`registry.record_on_version`):
    checks that the SavedModel serves (`python -m trainer.serve` on test images, under the
    serving image's TensorFlow), then registers it and moves the alias (`register_version`)."""
    import collections
    import json
    import os
    import subprocess
    import sys

    from components import servingimage
    from local import jobs, servingenv

    # Under the serving image's TensorFlow (a model that loads only under a newer TF would upload to
    # Vertex and then fail to deploy), in an environment of its own; a user's image, the trainer's.
    tf_serving = predict_route == servingimage.tf_serving_routes()["predict_route"]
    tf_version = servingimage.CUSTOM_SERVING_TF_VERSION if tf_serving else prebuilt_tf_version(serving_image)
    if tf_serving:
        # TensorFlow Serving is given `artifact_uri` and serves its highest numbered folder.
        numbered = (
            [int(n) for n in os.listdir(artifact_uri) if n.isdigit()] if os.path.isdir(artifact_uri) else []
        )
        served = os.path.join(artifact_uri, str(max(numbered))) if numbered else ""
        if not served or os.path.realpath(served) != os.path.realpath(model.path):
            raise RuntimeError(
                f"TensorFlow Serving given {artifact_uri} would serve {served or 'nothing'}, not the model "
                f"in {model.path}: nothing was registered"
            )
    python = str(servingenv.python_for(tf_version)) if tf_version else sys.executable
    under = f"TensorFlow {tf_version} (its serving image's)" if tf_version else "the trainer's TensorFlow"
    check = subprocess.run(
        [python, "-m", "trainer.serve", "--model_dir", model.path], capture_output=True, text=True
    )
    if check.returncode < 0:  # killed: no verdict on the model
        raise RuntimeError(
            f"the serving check of {model.path} (python -m trainer.serve under {under}) "
            f"{jobs.describe_exit(check.returncode)} before it finished: the model was not checked, "
            f"nothing was registered. Its last output: {check.stderr.strip()[-2000:]}"
        )
    if check.returncode != 0:
        raise RuntimeError(
            f"the model in {model.path} does not serve under {under}: {check.stderr.strip()[-2000:]}"
        )
    answers = [json.loads(line) for line in check.stdout.splitlines() if line.startswith("{")]
    print(
        f"serving check under {under}: {len(answers)} test images answered, "
        f"e.g. {answers[0]['image']} -> {answers[0]['class_name']}"
    )

    with open(os.path.join(evaluation_dir, "model", "evaluation.json")) as f:
        evaluated = json.load(f)
    details = {
        "source_uri": model.uri,
        "serving_image": serving_image,
        # What the Model's upload names on Vertex: the folder it copies to AIP_STORAGE_URI, routes.
        "artifact_uri": artifact_uri,
        "predict_route": predict_route,
        "labels": labels,
        "description": description,
        "evaluation": {
            "split": evaluated["split"],
            "dataset_fingerprint": evaluated["dataset_fingerprint"],
            "models": {
                role: {k: m.get(k) for k in ("examples", "accuracy", "macro_f1", "loss", "recorded")}
                for role, m in evaluated["models"].items()
            },
            # The paired comparison the gate judged (None: no champion).
            "comparison": evaluated.get("comparison"),
        },
        "serving_check": answers,
    }
    version, where, champion, reason = register_version(
        model.path, registry_dir, model_display_name, promote, gate_reason, details, evaluated_champion
    )
    # promote without champion: the gate passed it, but the alias moved or the task differs.
    note = " (champion)" if champion else f"; champion NOT moved: {reason}" if promote else ""
    print(f"registered {model_display_name} version {version} at {where}{note}")
    Outputs = collections.namedtuple("Outputs", ["version", "path", "champion"])
    return Outputs(version, where, champion)
