"""Step 2, the plan: every job's worker pools, flags and folder, built by one step.

On Vertex AI Pipelines every container step is a CustomJob of its own, started on a fresh VM
(Google's "Specify the machine configuration for a pipeline step"), so each piece of
bookkeeping that had a step of its own (worker pool specs, trainer flags, evaluation flags) was
one more machine start on the run's critical path (`pipeline.cost`). `plan_jobs` builds them all
once the image is known and the registry has been read, before the dataset is prepared: the
dataset's folder is the preparation job's own output folder, and the model's the training job's,
so neither needs the job to have run.

    prepare   python -m trainer.prepare   one CPU replica (`prepare_machine_type`)
    tuning    python -m trainer.task      the trainer pools, without Reduction Server
    training  python -m trainer.task      the trainer pools (on the training image)
    evaluate  python -m trainer.evaluate  one CPU replica (`prepare_machine_type`)

Each job's folder is an output artifact of this step, used only for its URI: the backend places
it under the pipeline root (gs:// on Vertex, a local folder on the local target), and it becomes
the job's `base_output_directory` (Vertex derives AIP_MODEL_DIR, AIP_CHECKPOINT_DIR and
AIP_TENSORBOARD_LOG_DIR from it: model/, checkpoints/, logs/). This step is never cached
(`pipeline.caching`): a cached plan would hand a new run the folders of an older one.
"""

from typing import Any, NamedTuple

from kfp import dsl

from components import hardware, runtime
from components.evaluation import build_evaluation_args, evaluate_command
from components.prepare import build_prepare_args, prepare_command
from components.registry import check_model_display_name, registry_folder
from components.training import build_trainer_args, train_command, tunable, typed_hyperparameter
from components.tuning import measurement_selection
from components.worker_pools import build_worker_pool_specs, pool_env


def stable_model_uri(model_root: str, training_folder: str, model_display_name: str, run: str) -> str:
    """Where the training job publishes the model: a run's folder under the pipeline root may be
    deleted once the run is over (a lifecycle rule on the bucket), but a registered version keeps
    pointing at its `artifact_uri` (aiplatform_v1 `Model.artifact_uri`), and a redeploy or the next
    run's `find-champion` reads it. So on Vertex the model goes to `<model_root>/<model's
    folder>/<run>`, `model_root` defaulting to `gs://<the training folder's bucket>/models`;
    elsewhere (the local target, whose registry keeps its own copy) to the job's `model/`."""
    if not model_root and not training_folder.startswith("gs://"):
        return training_folder.rstrip("/") + "/model"
    root = (
        model_root.rstrip("/") or "gs://" + training_folder.removeprefix("gs://").split("/", 1)[0] + "/models"
    )
    return f"{root}/{registry_folder(model_display_name)}/{run}"


def describe_pools(name: str, folder: str, specs: list) -> None:
    """One line per pool, in the step's log."""
    print(f"{name} job in {folder}:")
    for index, spec in enumerate(specs):
        m = spec["machine_spec"]
        gpus = f" + {m['accelerator_count']} x {m['accelerator_type']}" if "accelerator_type" in m else ""
        print(f"  pool {index}: {spec['replica_count']} x {m['machine_type']}{gpus}")


@dsl.component(
    base_image=runtime.BASE_IMAGE,
    install_kfp_package=False,
    additional_funcs=[
        hardware.gpu_tables,
        hardware.allowed_counts,
        hardware.validate_machine,
        pool_env,
        build_worker_pool_specs,
        prepare_command,
        train_command,
        evaluate_command,
        tunable,
        build_prepare_args,
        typed_hyperparameter,
        build_trainer_args,
        build_evaluation_args,
        describe_pools,
        measurement_selection,
        check_model_display_name,
        registry_folder,
        stable_model_uri,
    ],
)
def plan_jobs(
    image_uri: str,
    training_image_uri: str,
    dataset_source: str,
    image_size: int,
    dataset_shards: int,
    synthetic_per_class: int,
    champion_class_names: list,
    champion_uri: str,
    model_root: str,
    model_display_name: str,
    pipeline_run: str,
    search_space: list,
    backbone: str,
    weights: str,
    epochs: int,
    learning_rate: float,
    per_replica_batch_size: int,
    dense_units: int,
    dropout: float,
    mixed_precision: bool,
    xla: bool,
    augment: str,
    lr_schedule: str,
    warmup_epochs: float,
    lr_reference_batch_size: int,
    label_smoothing: float,
    class_weights: str,
    export_epoch: str,
    early_stopping_patience: int,
    fine_tune_fraction: float,
    seed: int,
    chief_machine_type: str,
    chief_accelerator_type: str,
    chief_accelerator_count: int,
    worker_count: int,
    worker_machine_type: str,
    worker_accelerator_type: str,
    worker_accelerator_count: int,
    boot_disk_type: str,
    boot_disk_size_gb: int,
    reduction_server_count: int,
    reduction_server_machine_type: str,
    check_gpu_region: bool,
    prepare_machine_type: str,
    region: str,
    prepare_job: dsl.Output[dsl.Artifact],
    tuning_job: dsl.Output[dsl.Artifact],
    training_job: dsl.Output[dsl.Artifact],
    evaluation_job: dsl.Output[dsl.Artifact],
) -> NamedTuple(
    "Outputs",
    prepare_pools=list,
    prepare_dir=str,
    tuning_pools=list,
    tuning_dir=str,
    measurement_selection_type=str,
    training_pools=list,
    training_dir=str,
    evaluation_pools=list,
    evaluation_dir=str,
    dataset_uri=str,
    model_uri=str,
    hyperparameters=dict,
):
    """The four jobs' worker pools and folders (module docstring), validated: a bad machine, GPU
    or flag fails this step, before any job starts. The tuning pools are planned whether or not
    the run tunes (a few milliseconds), with the study's measurement selection
    (`tuning.measurement_selection`); `hyperparameters` are the tunable values the training
    job's flags carry (the best trial's step writes its own over them)."""
    flags = dict(locals())  # the parameters, by name (before any other local is made)
    import collections

    kinds = tunable()
    folders = {
        name: artifact.uri.rstrip("/")
        for name, artifact in (
            ("prepare", prepare_job),
            ("tuning", tuning_job),
            ("training", training_job),
            ("evaluate", evaluation_job),
        )
    }
    dataset_uri = folders["prepare"] + "/model"
    model_uri = stable_model_uri(model_root, folders["training"], model_display_name, pipeline_run)
    hardware_flags = {
        name: flags[name]
        for name in (
            "chief_machine_type",
            "chief_accelerator_type",
            "chief_accelerator_count",
            "worker_count",
            "worker_machine_type",
            "worker_accelerator_type",
            "worker_accelerator_count",
            "boot_disk_type",
            "boot_disk_size_gb",
            "reduction_server_count",
            "reduction_server_machine_type",
            "check_gpu_region",
        )
    }
    cpu_job: dict[str, Any] = {
        "chief_machine_type": prepare_machine_type,
        "boot_disk_type": boot_disk_type,
        "boot_disk_size_gb": boot_disk_size_gb,
    }
    warnings: list = []
    prepare_pools = build_worker_pool_specs(
        image_uri=image_uri,
        command=prepare_command(),
        args=build_prepare_args(
            source=dataset_source,
            image_size=image_size,
            shards=dataset_shards,
            seed=seed,
            synthetic_per_class=synthetic_per_class,
            champion_class_names=champion_class_names,
        ),
        region=region,
        **cpu_job,
    )
    tuning_args, _ = build_trainer_args(dataset_uri, image_size, flags, kinds, search_space=search_space)
    # The trials get no Reduction Server: every trial would start (and bill) reducers of its
    # own, parallel_trial_count at a time, for short trainings; the final job has them.
    tuning_pools = build_worker_pool_specs(
        image_uri=image_uri,
        command=train_command(),
        args=tuning_args,
        region=region,
        **{**hardware_flags, "reduction_server_count": 0},
    )
    training_args, hyperparameters = build_trainer_args(dataset_uri, image_size, flags, kinds)
    if model_uri != folders["training"] + "/model":
        training_args.append(f"--model_dir={model_uri}")
    training_pools = build_worker_pool_specs(
        image_uri=training_image_uri,
        command=train_command(),
        args=training_args,
        region=region,
        warnings=warnings,
        **hardware_flags,
    )
    evaluation_pools = build_worker_pool_specs(
        image_uri=image_uri,
        command=evaluate_command(),
        args=build_evaluation_args(dataset_uri, model_uri, champion_uri),
        region=region,
        **cpu_job,
    )
    for warning in warnings:
        print(f"WARNING: {warning}")
    for name, specs in (
        ("prepare", prepare_pools),
        ("tuning", tuning_pools),
        ("training", training_pools),
        ("evaluate", evaluation_pools),
    ):
        describe_pools(name, folders[name], specs)
    print(f"the model: {model_uri}")
    print("training args:", " ".join(training_args))
    Outputs = collections.namedtuple(
        "Outputs",
        [
            "prepare_pools",
            "prepare_dir",
            "tuning_pools",
            "tuning_dir",
            "measurement_selection_type",
            "training_pools",
            "training_dir",
            "evaluation_pools",
            "evaluation_dir",
            "dataset_uri",
            "model_uri",
            "hyperparameters",
        ],
    )
    return Outputs(
        prepare_pools,
        folders["prepare"],
        tuning_pools,
        folders["tuning"],
        measurement_selection(export_epoch),
        training_pools,
        folders["training"],
        evaluation_pools,
        folders["evaluate"],
        dataset_uri,
        model_uri,
        hyperparameters,
    )
