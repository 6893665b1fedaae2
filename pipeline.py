"""The pipeline: the DAG and nothing else.

    image build -> prepare dataset -> same task as the champion? -> [tune -> best trial]
        -> train -> evaluate the new model and the champion on this run's test split -> gate
        -> upload a new model version -> [move the champion alias]

`create_pipeline("vertex")` wires the Google Cloud Pipeline Components (compiled by
`make compile` to `compiled/pipeline.json`, and with the failure e-mail exit handler to
`compiled/pipeline-notify.json`); `create_pipeline("local")` wires the same DAG with the local
stand-ins of `local.steps`, which take the same specs (run by `make run` with no project
configured). The steps that differ are looked up in `BACKENDS`, one entry per target.
Every parameter, its type, its defaults and its help live once, in `PARAMETERS`: the compiled
spec, the local run's flags and the docs are all generated from it.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kfp import compiler, dsl

from components import evaluation, image, prepare, registry, training, tuning, worker_pools
from local import steps as local_steps

PIPELINE_NAME = "multiworker-cassava-training"
TARGETS = ("vertex", "local")
ROOT = Path(__file__).resolve().parent
COMPILED = ROOT / "compiled" / "pipeline.json"
COMPILED_NOTIFY = ROOT / "compiled" / "pipeline-notify.json"
_REQUIRED = object()


@dataclasses.dataclass(frozen=True)
class Parameter:
    """One pipeline parameter. `default` is the compiled (Vertex) default (`_REQUIRED`: none,
    the submitter must give it); `local` the local run's default; `targets` where it exists."""

    name: str
    type: type
    default: Any
    help: str
    local: Any = None
    targets: tuple[str, ...] = TARGETS

    def default_for(self, target: str) -> Any:
        if target == "local" and self.local is not None:
            return self.local
        return self.default


def _p(
    name: str, type_: type, default: Any, help_: str, local: Any = None, targets: tuple[str, ...] = TARGETS
) -> Parameter:
    return Parameter(name, type_, default, help_, local, targets)


V100 = "NVIDIA_TESLA_V100"
PARAMETERS: tuple[Parameter, ...] = (
    # Where: given by the submitter (make run / schedule), never baked into the compiled JSON.
    _p("project", str, _REQUIRED, "Google Cloud project of every job and of the model.", "local"),
    _p("location", str, _REQUIRED, "Region of every job and of the model (e.g. us-central1).", "us-central1"),
    _p(
        "context_uri",
        str,
        _REQUIRED,
        "gs:// URI of the build context tarball (Vertex) or the checkout folder (local).",
        ".",
    ),
    _p(
        "artifact_repository",
        str,
        _REQUIRED,
        "Artifact Registry repository, <region>-docker.pkg.dev/<project>/<repo>.",
        "local",
    ),
    _p(
        "build_location",
        str,
        "",
        "Cloud Build region of the image build ('': the Vertex location; or global), the BUILD_REGION setting.",
        targets=("vertex",),
    ),
    _p("source_commit", str, "", "Git commit of the source, recorded on the model version."),
    _p("registry_dir", str, "local_runs/registry", "Folder of the local model registry.", targets=("local",)),
    # Data.
    _p("dataset_source", str, "tfds:cassava", "tfds:NAME, folder:PATH or synthetic.", "synthetic"),
    _p("image_size", int, 300, "Image side in pixels (the codelab resizes to 300).", 64),
    _p("dataset_shards", int, 32, "TFRecord shards per split (>= workers, for FILE sharding).", 8),
    _p("synthetic_per_class", int, 60, "Training images per class of the synthetic source."),
    _p("seed", int, 42, "Seed of the split carving and of training."),
    _p("prepare_machine_type", str, "n1-standard-8", "CPU machine of the preparation and evaluation jobs."),
    # Model and training.
    _p("backbone", str, "resnet50", "resnet50, resnet101, efficientnet_b0, mobilenet_v2 or tiny.", "tiny"),
    _p("weights", str, "imagenet", "imagenet, none, or a weights file (gs://...).", "none"),
    _p("fine_tune_fraction", float, -1.0, "Backbone fraction trained (-1: the trainer's default)."),
    _p(
        "epochs",
        int,
        2,
        "Training epochs (the most, when early_stopping_patience may end training sooner).",
        30,
    ),
    _p(
        "learning_rate",
        float,
        1e-4,
        "Adam learning rate at lr_reference_batch_size (the peak of the schedule scales with the global batch).",
        1.5e-3,
    ),
    _p("per_replica_batch_size", int, 64, "Batch size per replica (global = x replicas).", 16),
    _p("dense_units", int, 1016, "Units of the dense layer of the head (0: none).", 64),
    _p("dropout", float, 0.2, "Dropout before the classifier."),
    _p("mixed_precision", bool, True, "mixed_float16 compute (GPUs).", False),
    _p("xla", bool, True, "Compile the train step with XLA.", False),
    _p(
        "augment",
        str,
        "auto",
        "Augmentation: none, flip_lr, flip, leaf (flips, 90-degree rotations, brightness, contrast, "
        "crop) or auto (leaf for tfds:cassava, flip for synthetic, none for a folder).",
    ),
    _p("lr_schedule", str, "cosine", "cosine (linear warm-up, then cosine decay) or constant."),
    _p("warmup_epochs", float, 1.0, "Warm-up epochs of the cosine schedule (at most half the run)."),
    _p(
        "lr_reference_batch_size",
        int,
        0,
        "Global batch learning_rate is meant for; the peak rate scales linearly with the global "
        "batch (0: the per-replica batch, so learning_rate is one replica's rate).",
    ),
    _p("label_smoothing", float, 0.0, "Label smoothing of the cross-entropy, in [0, 1)."),
    _p("class_weights", str, "none", "none or balanced (each class weighs the same in the loss)."),
    _p(
        "export_epoch",
        str,
        "best",
        "best (the epoch with the best validation accuracy, kept as training goes) or last. Tuning "
        "trials are measured the same way (BEST_MEASUREMENT or LAST_MEASUREMENT).",
    ),
    _p(
        "early_stopping_patience",
        int,
        0,
        "Stop training when validation accuracy has not improved for this many epochs (0: never).",
        5,
    ),
    # Hardware.
    _p("chief_machine_type", str, "n1-standard-8", "Machine of the chief (pool 0, one replica)."),
    _p("chief_accelerator_type", str, V100, "GPU of the chief ('' for none).", ""),
    _p("chief_accelerator_count", int, 1, "GPUs of the chief.", 0),
    _p("worker_count", int, 1, "Workers in pool 1 (0: the chief trains alone)."),
    _p("worker_machine_type", str, "n1-standard-8", "Machine of each worker."),
    _p("worker_accelerator_type", str, V100, "GPU of each worker ('' for none).", ""),
    _p("worker_accelerator_count", int, 1, "GPUs of each worker.", 0),
    _p("boot_disk_type", str, "pd-ssd", "Boot disk type of every replica."),
    _p("boot_disk_size_gb", int, 100, "Boot disk size of every replica."),
    _p("reduction_server_count", int, 0, "Reduction Server replicas (pool 2; 0: none)."),
    _p("reduction_server_machine_type", str, "n1-highcpu-16", "Machine of each Reduction Server replica."),
    _p(
        "check_gpu_region",
        bool,
        True,
        "Refuse a GPU the region table does not list for the region (false: warn and proceed).",
    ),
    # Job settings.
    _p("timeout", str, "86400s", "Longest run of each job.", "1800s"),
    _p(
        "restart_job_on_worker_restart",
        bool,
        True,
        "Restart the whole job when a replica restarts (resumes from backup).",
    ),
    _p("scheduling_strategy", str, "STANDARD", "STANDARD, SPOT or FLEX_START."),
    _p("service_account", str, "", "Service account the jobs run as ('' : Vertex's default)."),
    _p("network", str, "", "VPC network to peer, projects/<number>/global/networks/<name>."),
    _p("encryption_spec_key_name", str, "", "CMEK key of the jobs and the model."),
    _p("tensorboard", str, "", "Vertex TensorBoard resource for the training job."),
    _p("labels", dict, {}, "Labels of the jobs and the model version."),
    # Tuning.
    _p("tune", bool, False, "Run a hyperparameter tuning job first; train with the best trial."),
    _p("max_trial_count", int, 8, "Trials of the tuning job.", 2),
    _p("parallel_trial_count", int, 2, "Trials run at once.", 1),
    _p("max_failed_trial_count", int, 0, "Failed trials that fail the tuning job (0: Vertex decides)."),
    _p(
        "search_algorithm",
        str,
        "ALGORITHM_UNSPECIFIED",
        "ALGORITHM_UNSPECIFIED (Bayesian), GRID_SEARCH (every parameter INTEGER, DISCRETE or "
        "CATEGORICAL) or RANDOM_SEARCH.",
    ),
    _p(
        "search_space",
        list,
        tuning.VERTEX_SEARCH_SPACE,
        "The tuning job's parameters: a list of Vertex StudySpec.ParameterSpec (parameter_id; one of "
        "double_value_spec or integer_value_spec {min_value, max_value}, discrete_value_spec or "
        "categorical_value_spec {values}; scale_type UNIT_LINEAR_SCALE, UNIT_LOG_SCALE or "
        "UNIT_REVERSE_LOG_SCALE), snake_case or camelCase; ids among learning_rate, "
        "per_replica_batch_size, dense_units, dropout, epochs. make run takes inline JSON, @FILE or "
        "a .json/.yaml/.yml file. Default on Vertex: learning_rate 1e-4..1e-2 log, dense_units "
        "32..1024 log, dropout 0..0.5, per_replica_batch_size 16/32/64; locally (two short trials): "
        "learning_rate 5e-4..5e-3 log and dropout 0..0.3, centred on the local defaults "
        "(docs/options.md).",
        tuning.LOCAL_SEARCH_SPACE,
    ),
    # Gate and registry.
    _p(
        "gate_metric",
        str,
        "accuracy",
        "What the gate compares on this run's test split: accuracy, or macro_f1 (the mean per-class "
        "F1, which an imbalanced test split cannot flatter).",
    ),
    _p(
        "min_score",
        float,
        0.5,
        "Lowest gate_metric on this run's test split a model needs to become the champion.",
        0.9,
    ),
    _p(
        "model_display_name", str, "cassava-classifier", "The registry model that gets a new version per run."
    ),
    _p(
        "serving_image",
        str,
        "auto",
        "auto (Vertex's prebuilt TensorFlow image of serving_tf_version while it is available for "
        "more than 30 more days on the run's date, else the custom image; docs/serving.md), prebuilt, "
        "custom (an image built from Dockerfile.serving beside the trainer's, on the trainer's "
        "TensorFlow, CPU or GPU) or an image URI.",
    ),
    _p(
        "serving_tf_version",
        str,
        registry.DEFAULT_SERVING_TF_VERSION,
        f"TF version of the prebuilt serving image: {', '.join(registry.PREBUILT_TF_SERVING_VERSIONS)}.",
    ),
    _p(
        "serving_accelerator",
        str,
        "cpu",
        "cpu or gpu: which prebuilt TensorFlow serving image (the custom image serves on either).",
    ),
    _p(
        "notification_emails",
        list,
        _REQUIRED,
        "One to three addresses e-mailed when the run ends (Vertex only). Given: the run uses "
        "the template with a notification exit handler; not given: the template without one.",
        targets=("vertex",),
    ),
)

# Steps that read or write state outside the pipeline (the Artifact Registry, the Model
# Registry) or that make a run's job folders: never served from Vertex's execution cache. A
# cached `find-champion` answers with the registry as it was when it first ran; a cached
# `*-worker-pools` hands a new run the job folder of an older one (the tuning trials then find
# that run's backups), and everything downstream of it is then a cache hit too: a scheduled run
# would retrain nothing. Vertex keys its cache on a task's inputs, outputs and component spec
# ("Configure execution caching", Vertex AI Pipelines docs); `PipelineJob(enable_caching=None)`
# keeps these compiled per-task options (aiplatform `pipeline_jobs.py`:
# `_set_enable_caching_value` runs only when it is not None).
NEVER_CACHED = (
    "build-trainer-image",
    "prepare-worker-pools",
    "tuning-worker-pools",
    "training-worker-pools",
    "evaluation-worker-pools",
    "find-champion",
    "upload-new-version",
    "upload-first-version",
    "set-champion",
    "upload-model",
)


def _uncached(task: dsl.PipelineTask, name: str) -> dsl.PipelineTask:
    task.set_display_name(name)
    if name in NEVER_CACHED:
        task.set_caching_options(False)
    return task


def parameters_for(target: str) -> tuple[Parameter, ...]:
    if target not in TARGETS:
        raise ValueError(f"target must be one of {', '.join(TARGETS)}, got {target!r}")
    return tuple(p for p in PARAMETERS if target in p.targets)


def _dag(target: str, p: dict[str, Any]) -> None:
    """The DAG, for either target; `p` maps parameter names to pipeline channels. Where the
    targets differ, `BACKENDS[target]` says which step stands where."""
    steps = BACKENDS[target]
    where = {"project": p["project"], "location": p["location"]}
    job_settings = {
        "timeout": p["timeout"],
        "restart_job_on_worker_restart": p["restart_job_on_worker_restart"],
        "service_account": p["service_account"],
        "network": p["network"],
        "encryption_spec_key_name": p["encryption_spec_key_name"],
        "labels": p["labels"],
    }
    hardware = {k: p[k] for k in worker_pools.HARDWARE_PARAMETERS}
    model_flags = {k: p[k] for k in training.MODEL_FLAGS}

    # 1. The trainer image.
    built = steps.build_image(p)
    _uncached(built, "build-trainer-image")
    image_uri = built.outputs["image_uri"]

    def cpu_job(
        names: tuple[str, str], command: list[str], args: Any
    ) -> tuple[dsl.PipelineTask, dsl.PipelineTask]:
        """A one-replica CPU job on the trainer image (`_cpu_pools`), not restarted as a whole:
        its worker pool specs and the job, named `names` (pools, job)."""
        pools = _uncached(_cpu_pools(image_uri, command, args, p), names[0])
        job = steps.custom_job(
            names[1], where, pools, {**job_settings, "restart_job_on_worker_restart": False}
        )
        return pools, job

    # 2-3. The dataset, prepared by a one-replica CPU job.
    prep_args = prepare.prepare_args(
        source=p["dataset_source"],
        image_size=p["image_size"],
        shards=p["dataset_shards"],
        seed=p["seed"],
        synthetic_per_class=p["synthetic_per_class"],
    )
    prep_pools, prep_job = cpu_job(
        ("prepare-worker-pools", "prepare-dataset"), prepare.PREPARE_COMMAND, prep_args.output
    )
    dataset = prepare.register_dataset(
        base_output_directory=prep_pools.outputs["base_output_directory"]
    ).after(prep_job)

    # The champion, read before any training: a run whose dataset is of another task (other
    # class names, or the same in another order) than the champion's is refused here, not after
    # hours of training (the gate refuses it too).
    champion = _uncached(steps.find_champion(where, p), "find-champion")
    same_task = registry.check_same_task(
        dataset=dataset.outputs["dataset"],
        champion_class_names=champion.outputs["class_names"],
        model_display_name=p["model_display_name"],
    ).set_display_name("check-same-task")

    # 4-5. Tuning (optional), then the final multi-worker training, both after the check.
    with dsl.If(p["tune"] == True, name="tuning-enabled"):  # noqa: E712 (a KFP condition)
        tune_args = training.trainer_args(
            dataset=dataset.outputs["dataset"],
            **model_flags,
            search_space=p["search_space"],
        ).set_display_name("tuning-trainer-args")
        tune_args.after(same_task)
        # The trials get no Reduction Server: every trial would start (and bill) reducers of its
        # own, parallel_trial_count at a time, for short trainings; the final job has them.
        tune_pools = worker_pools.worker_pool_specs(
            image_uri=image_uri,
            command=training.TRAIN_COMMAND,
            args=tune_args.outputs["args"],
            **{**hardware, "reduction_server_count": 0},
            region=p["location"],
        )
        _uncached(tune_pools, "tuning-worker-pools")
        best_hyperparameters = steps.tuning(where, p, tune_pools)
    with dsl.Else(name="tuning-disabled"):
        no_tuning = training.no_overrides()
    train_args = training.trainer_args(
        dataset=dataset.outputs["dataset"],
        **model_flags,
        hyperparameters=dsl.OneOf(best_hyperparameters, no_tuning.output),
    ).set_display_name("training-trainer-args")
    train_args.after(same_task)
    train_pools = worker_pools.worker_pool_specs(
        image_uri=built.outputs["training_image_uri"],
        command=training.TRAIN_COMMAND,
        args=train_args.outputs["args"],
        **hardware,
        region=p["location"],
    )
    _uncached(train_pools, "training-worker-pools")
    train_job = steps.custom_job(
        "train-model",
        where,
        train_pools,
        job_settings,
        strategy=p["scheduling_strategy"],
        tensorboard=p["tensorboard"],
    )
    model = training.model_from_job(base_output_directory=train_pools.outputs["base_output_directory"]).after(
        train_job
    )

    # 6. The new model and the champion (read above) evaluated side by side on this run's test
    # split by a one-replica CPU job on the trainer image; the gate compares those figures.
    eval_args = evaluation.evaluation_args(
        dataset=dataset.outputs["dataset"],
        model=model.outputs["model"],
        champion_uri=champion.outputs["champion_uri"],
    ).set_display_name("evaluation-args")
    eval_pools, eval_job = cpu_job(
        ("evaluation-worker-pools", "evaluate-models"), evaluation.EVALUATE_COMMAND, eval_args.output
    )

    # 7. Upload a new version, move the alias when the gate passed.
    settings = registry.upload_settings(
        location=p["location"],
        serving_image=p["serving_image"],
        tf_version=p["serving_tf_version"],
        serving_accelerator=p["serving_accelerator"],
        custom_image_uri=built.outputs["serving_image_uri"],
        labels=p["labels"],
        source_commit=p["source_commit"],
        pipeline_run=dsl.PIPELINE_JOB_NAME_PLACEHOLDER,
    )
    gate = evaluation.evaluate_model(
        model=model.outputs["model"],
        evaluation_dir=eval_pools.outputs["base_output_directory"],
        gate_metric=p["gate_metric"],
        min_score=p["min_score"],
        champion_class_names=champion.outputs["class_names"],
        champion_version=champion.outputs["champion_version"],
    ).after(eval_job)
    steps.registry(where, p, model, settings, champion, gate, eval_pools)


def _cpu_pools(image_uri: Any, command: list[str], args: Any, p: dict[str, Any]) -> dsl.PipelineTask:
    """The worker pool specs of a one-replica CPU job (`prepare_machine_type`) on the trainer image."""
    return worker_pools.worker_pool_specs(
        image_uri=image_uri,
        command=command,
        args=args,
        chief_machine_type=p["prepare_machine_type"],
        chief_accelerator_type="",
        chief_accelerator_count=0,
        worker_count=0,
        worker_machine_type="",
        worker_accelerator_type="",
        worker_accelerator_count=0,
        boot_disk_type=p["boot_disk_type"],
        boot_disk_size_gb=p["boot_disk_size_gb"],
        region=p["location"],
    )


def _vertex_image(p: dict[str, Any]) -> dsl.PipelineTask:
    return image.build_trainer_image(
        project=p["project"],
        location=p["location"],
        context_uri=p["context_uri"],
        repository=p["artifact_repository"],
        serving_image=p["serving_image"],
        serving_tf_version=p["serving_tf_version"],
        reduction_server_count=p["reduction_server_count"],
        build_location=p["build_location"],
    )


def _local_image(p: dict[str, Any]) -> dsl.PipelineTask:
    return local_steps.check_build_context(
        context_dir=p["context_uri"],
        repository=p["artifact_repository"],
        serving_image=p["serving_image"],
        serving_tf_version=p["serving_tf_version"],
        reduction_server_count=p["reduction_server_count"],
    )


def _vertex_custom_job(
    name: str, where: dict[str, Any], pools: dsl.PipelineTask, settings: dict[str, Any], **extra: Any
) -> dsl.PipelineTask:
    from google_cloud_pipeline_components.v1.custom_job import CustomTrainingJobOp

    return CustomTrainingJobOp(
        **where,
        display_name=name,
        worker_pool_specs=pools.outputs["worker_pool_specs"],
        base_output_directory=pools.outputs["base_output_directory"],
        **settings,
        **extra,
    ).set_display_name(name)


def _local_custom_job(
    name: str, where: dict[str, Any], pools: dsl.PipelineTask, settings: dict[str, Any], **extra: Any
) -> dsl.PipelineTask:
    """The local runner takes the same specs; the job settings it cannot honour (service account,
    network, CMEK, labels, scheduling strategy, TensorBoard) are Vertex's alone."""
    return local_steps.local_custom_job(
        display_name=name,
        project=where["project"],
        worker_pool_specs=pools.outputs["worker_pool_specs"],
        base_output_directory=pools.outputs["base_output_directory"],
        timeout=settings["timeout"],
        restart_job_on_worker_restart=settings["restart_job_on_worker_restart"],
    ).set_display_name(name)


def _study(p: dict[str, Any]) -> dict[str, Any]:
    """The study both tuning steps get: the fixed metric and the declared `search_space` (checked
    by `components.options` before the run; `make run` hands it over in the proto JSON form)."""
    return {
        "study_spec_metrics": tuning.study_metrics(),
        "study_spec_parameters": p["search_space"],
        "max_trial_count": p["max_trial_count"],
        "parallel_trial_count": p["parallel_trial_count"],
    }


def _selection(p: dict[str, Any]) -> Any:
    """The study's measurement selection, from `export_epoch` (a step: it is a run's value)."""
    return (
        tuning.measurement_selection(export_epoch=p["export_epoch"])
        .set_display_name("measurement-selection")
        .output
    )


def _vertex_tuning(where: dict[str, Any], p: dict[str, Any], pools: dsl.PipelineTask) -> Any:
    """The tuning job and the best-trial step; returns the best hyperparameters channel.

    No automated early stopping: GCPC 2.22's op builds the payload's study_spec from its metrics,
    parameters, algorithm and measurement selection alone, and has no input for
    `median_automated_stopping_spec` or `decay_curve_stopping_spec`, so every trial runs all its
    epochs unless `early_stopping_patience` stops it (the local tuner does the same). The
    measurement selection follows `export_epoch` (`tuning.measurement_selection`)."""
    from google_cloud_pipeline_components.v1.hyperparameter_tuning_job import HyperparameterTuningJobRunOp

    job = HyperparameterTuningJobRunOp(
        **where,
        display_name="tune-hyperparameters",
        base_output_directory=pools.outputs["base_output_directory"],
        worker_pool_specs=pools.outputs["worker_pool_specs"],
        **_study(p),
        max_failed_trial_count=p["max_failed_trial_count"],
        study_spec_algorithm=p["search_algorithm"],
        study_spec_measurement_selection_type=_selection(p),
        encryption_spec_key_name=p["encryption_spec_key_name"],
        service_account=p["service_account"],
        network=p["network"],
    ).set_display_name("tune-hyperparameters")
    best = tuning.best_trial(**where, gcp_resources=job.outputs["gcp_resources"], metric_id=tuning.METRIC_ID)
    return best.outputs["hyperparameters"]


def _local_tuning(where: dict[str, Any], p: dict[str, Any], pools: dsl.PipelineTask) -> Any:
    job = local_steps.local_tuning_job(
        project=where["project"],
        worker_pool_specs=pools.outputs["worker_pool_specs"],
        base_output_directory=pools.outputs["base_output_directory"],
        **_study(p),
        max_failed_trial_count=p["max_failed_trial_count"],
        study_spec_algorithm=p["search_algorithm"],
        measurement_selection=_selection(p),
        seed=p["seed"],
        timeout=p["timeout"],
    ).set_display_name("tune-hyperparameters")
    best = local_steps.local_best_trial(trials=job.outputs["trials"], metric_id=tuning.METRIC_ID)
    return best.set_display_name("best-trial").outputs["hyperparameters"]


def _vertex_find_champion(where: dict[str, Any], p: dict[str, Any]) -> dsl.PipelineTask:
    return registry.find_champion(**where, model_display_name=p["model_display_name"])


def _local_find_champion(where: dict[str, Any], p: dict[str, Any]) -> dsl.PipelineTask:
    return local_steps.local_find_champion(
        registry_dir=p["registry_dir"], model_display_name=p["model_display_name"]
    )


def _vertex_registry(
    where: dict[str, Any],
    p: dict[str, Any],
    model: dsl.PipelineTask,
    settings: dsl.PipelineTask,
    champion: dsl.PipelineTask,
    gate: dsl.PipelineTask,
    evaluated: dsl.PipelineTask,
) -> None:
    """ModelUploadOp (the gate's figures as the version's description), then set_champion when
    the gate passed. `evaluated` (the evaluation job's pools) is the local registry's alone."""
    from google_cloud_pipeline_components.types.artifact_types import UnmanagedContainerModel, VertexModel
    from google_cloud_pipeline_components.v1.model import ModelUploadOp

    unmanaged = dsl.importer(
        artifact_uri=model.outputs["model_uri"],
        artifact_class=UnmanagedContainerModel,
        metadata={"containerSpec": {"imageUri": settings.outputs["serving_image"]}},
    ).set_display_name("serving-container")
    upload = {
        **where,
        "display_name": p["model_display_name"],
        "unmanaged_container_model": unmanaged.output,
        "labels": settings.outputs["labels"],
        "description": gate.outputs["description"],
        "encryption_spec_key_name": p["encryption_spec_key_name"],
    }
    with dsl.If(champion.outputs["exists"] == True, name="model-exists"):  # noqa: E712
        parent = dsl.importer(
            artifact_uri=champion.outputs["resource_uri"],
            artifact_class=VertexModel,
            metadata={"resourceName": champion.outputs["resource_name"]},
        ).set_display_name("parent-model")
        as_version = _uncached(ModelUploadOp(**upload, parent_model=parent.output), "upload-new-version")
        as_version.after(gate)
    with dsl.Else(name="first-model"):
        as_first = _uncached(ModelUploadOp(**upload), "upload-first-version")
        as_first.after(gate)
    uploaded = dsl.OneOf(as_version.outputs["model"], as_first.outputs["model"])
    with dsl.If(gate.outputs["promote"] == True, name="gate-passed"):  # noqa: E712
        _uncached(
            registry.set_champion(
                **where, model=uploaded, evaluated_champion=champion.outputs["champion_version"]
            ),
            "set-champion",
        )


def _local_registry(
    where: dict[str, Any],
    p: dict[str, Any],
    model: dsl.PipelineTask,
    settings: dsl.PipelineTask,
    champion: dsl.PipelineTask,
    gate: dsl.PipelineTask,
    evaluated: dsl.PipelineTask,
) -> None:
    upload = local_steps.local_upload_model(
        model=model.outputs["model"],
        registry_dir=p["registry_dir"],
        model_display_name=p["model_display_name"],
        serving_image=settings.outputs["serving_image"],
        labels=settings.outputs["labels"],
        promote=gate.outputs["promote"],
        gate_reason=gate.outputs["reason"],
        description=gate.outputs["description"],
        evaluated_champion=champion.outputs["champion_version"],
        evaluation_dir=evaluated.outputs["base_output_directory"],
    )
    _uncached(upload, "upload-model")


@dataclasses.dataclass(frozen=True)
class Backend:
    """The steps that differ between the targets; everything else in `_dag` is shared."""

    build_image: Callable[[dict[str, Any]], dsl.PipelineTask]
    custom_job: Callable[..., dsl.PipelineTask]
    tuning: Callable[[dict[str, Any], dict[str, Any], dsl.PipelineTask], Any]
    find_champion: Callable[[dict[str, Any], dict[str, Any]], dsl.PipelineTask]
    # (where, parameters, model-from-job, upload-settings, find-champion, evaluate-model,
    # evaluation-worker-pools)
    registry: Callable[..., None]


BACKENDS = {
    "vertex": Backend(
        _vertex_image, _vertex_custom_job, _vertex_tuning, _vertex_find_champion, _vertex_registry
    ),
    "local": Backend(_local_image, _local_custom_job, _local_tuning, _local_find_champion, _local_registry),
}


def create_pipeline(target: str = "vertex", notify: bool = False) -> Callable[..., Any]:
    """The pipeline for `target` ("vertex" or "local"), with the parameters of `PARAMETERS`.

    `notify` (Vertex only) wraps the DAG in an exit handler that e-mails `notification_emails`
    with GCPC's `VertexNotificationEmailOp`. Google documents its recipients as one to three
    addresses and says nothing of an empty list, so a run without recipients must not call it
    at all: it gets the template compiled without the handler (`compiled/pipeline.json`); a run
    with recipients the one with it (`compiled/pipeline-notify.json`), where they are required.
    """
    if notify and target != "vertex":
        raise ValueError("notify exists only on the vertex target (the e-mail is sent by Vertex)")
    params = tuple(q for q in parameters_for(target) if notify or q.name != "notification_emails")
    # A Python signature lists the parameters without a default first.
    params = tuple(sorted(params, key=lambda q: q.default_for(target) is not _REQUIRED))

    def pipeline_func(*args: Any) -> None:
        bound = dict(zip((q.name for q in params), args, strict=True))
        if notify:
            from google_cloud_pipeline_components.v1.vertex_notification_email import (
                VertexNotificationEmailOp,
            )

            handler = VertexNotificationEmailOp(recipients=bound["notification_emails"])
            with dsl.ExitHandler(handler, name="train-and-register"):
                _dag(target, bound)
        else:
            _dag(target, bound)

    pipeline_func.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter(
                q.name,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                annotation=q.type,
                **({} if q.default_for(target) is _REQUIRED else {"default": q.default_for(target)}),
            )
            for q in params
        ]
    )
    pipeline_func.__doc__ = (
        "Multi-worker TensorFlow training, from source to the Model Registry.\n\nArgs:\n"
        + "".join(f"    {q.name}: {q.help}\n" for q in params)
    )
    pipeline_func.__name__ = pipeline_func.__qualname__ = PIPELINE_NAME.replace("-", "_")
    return dsl.pipeline(name=PIPELINE_NAME if target == "vertex" else f"{PIPELINE_NAME}-local")(pipeline_func)


def compile_pipeline(path: str | Path = COMPILED, notify: bool = False) -> Path:
    """Writes a Vertex pipeline spec (with the e-mail exit handler when `notify`); the bytes
    depend only on the sources."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(create_pipeline("vertex", notify=notify), str(out))
    return out


def template_for(notification_emails: Any) -> Path:
    """The compiled template a run uses: with the e-mail exit handler only when it has recipients."""
    return COMPILED_NOTIFY if notification_emails else COMPILED


if __name__ == "__main__":
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else COMPILED.parent
    for notify, name in ((False, COMPILED.name), (True, COMPILED_NOTIFY.name)):
        print(f"wrote {compile_pipeline(folder / name, notify=notify)}")  # noqa: T201
