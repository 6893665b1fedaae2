"""Step 2, the plan: every job's worker pools, flags and folder, built by one step.

One step, as every container step of a Vertex run is a CustomJob on a fresh VM (Google's
"Specify the machine configuration for a pipeline step";
docs/architecture.md#the-critical-path-machine-starts-on-vertex).

    prepare   python -m trainer.prepare   one CPU replica (`prepare_machine_type`), cpu image
    tuning    python -m trainer.task      the trainer pools, without Reduction Server
    training  python -m trainer.task      the trainer pools (on the training image)
    evaluate  python -m trainer.evaluate  one CPU replica (`prepare_machine_type`), cpu image

Each job's folder is an output artifact used only for its URI, the job's `base_output_directory`
(docs/contracts.md#2-the-environment-of-a-replica); never cached (`pipeline.step`): a cached plan
would hand a new run an older run's folders. The trainer's command line is spelled once, in
`build_trainer_args` (docs/contracts.md#1-the-trainers-command-line-python--m-trainertask), which
the pre-flight (`pipeline.options.trainer_flags`) calls too.
"""

from typing import Any, NamedTuple

from kfp import dsl

from components import hardware, stepimage
from components.evaluation import build_evaluation_args, evaluate_command
from components.prepare import (
    build_prepare_args,
    dataflow_parameters,
    dataflow_template_spec,
    prepare_command,
)
from components.reductionserver import reduction_server_pool, reduction_server_problems
from components.registry import check_model_display_name, registry_folder
from components.servingimage import servable_folder
from components.stepimage import fuse_path, multi_region
from components.worker_pools import (
    build_worker_pool_specs,
    hardware_parameters,
    machine_spec,
    pool_env,
    trainer_pools,
)


def train_command() -> list:
    """The training job's command."""
    return ["python", "-m", "trainer.task"]


def hyperparameters() -> list:
    """The hyperparameters a tuning job may set: (name, kind, Vertex default, local default, help),
    each a pipeline parameter (`pipeline.options`) and an input of `plan_jobs` of the same name."""
    return [
        (
            "learning_rate",
            "float",
            1e-4,
            1.5e-3,
            "Adam learning rate at lr_reference_batch_size (the peak of the schedule scales with the global batch).",
        ),
        ("per_replica_batch_size", "int", 64, 16, "Batch size per replica (global = x replicas)."),
        ("dense_units", "int", 1016, 64, "Units of the dense layer of the head (0: none)."),
        ("dropout", "float", 0.2, None, "Dropout before the classifier."),
        (
            "epochs",
            "int",
            2,
            30,
            "Training epochs (the most, when early_stopping_patience may end training sooner).",
        ),
    ]


def tunable() -> dict:
    """The tunable hyperparameters' kinds, by name (`hyperparameters()`)."""
    return {row[0]: row[1] for row in hyperparameters()}


TUNABLE = tunable()
# The pipeline parameters `build_trainer_args` turns into `trainer.task` flags of the same names
# (beside the dataset's URI and image size).
MODEL_FLAGS = (
    "backbone",
    "weights",
    *TUNABLE,
    "mixed_precision",
    "xla",
    "augment",
    "lr_schedule",
    "warmup_epochs",
    "lr_reference_batch_size",
    "label_smoothing",
    "class_weights",
    "export_epoch",
    "early_stopping_patience",
    "fine_tune_fraction",
    "seed",
)


def typed_hyperparameter(name: str, value: Any, kinds: dict) -> Any:
    """A tunable hyperparameter's value as its kind (`kinds`: `TUNABLE`): a trial's values arrive
    as JSON numbers, so an int is made whole (`32.0` -> 32; `32.5` refused)."""
    if name not in kinds:
        raise ValueError(f"unknown hyperparameter {name!r}; allowed: {sorted(kinds)}")
    if kinds[name] == "int":
        number = float(value)
        if number != int(number):
            raise ValueError(f"hyperparameter {name} must be a whole number, got {value!r}")
        return int(number)
    return float(value)


def build_trainer_args(
    data_dir: str,
    image_size: float,
    flags: dict,
    kinds: dict,
    leave_out: tuple = (),
    search_space: list | None = None,
) -> tuple:
    """(args, hyperparameters): one job's `trainer.task` flags from `flags` (every name of
    `MODEL_FLAGS`) and the tunable values they carry, less those in `leave_out` or declared by a
    tuning job's `search_space` (StudySpec ParameterSpecs; each trial adds its own).
    `fine_tune_fraction` < 0 leaves the trainer's default."""
    tuned = [str(s.get("parameter_id", s.get("parameterId", ""))) for s in (search_space or [])]
    untunable = sorted(set(tuned) - set(kinds))
    if untunable:
        raise ValueError(
            f"search_space declares {untunable}, which are not flags a tuning job may set; allowed: {sorted(kinds)}"
        )
    omitted = {*leave_out, *tuned}
    # The pipeline's own values, as given: the step's inputs are typed by KFP, and the pre-flight
    # hands a user's value to the trainer's parser, which names what is wrong with it.
    resolved = {name: flags[name] for name in kinds}
    values = {
        "data_dir": data_dir,
        "backbone": flags["backbone"],
        "weights": flags["weights"],
        # Numbers may come back as floats (kfp.local, JSON): the image size is a whole number.
        "image_size": int(image_size),
        "mixed_precision": str(bool(flags["mixed_precision"])).lower(),
        "xla": str(bool(flags["xla"])).lower(),
        "seed": int(flags["seed"]),
        "augment": flags["augment"],
        "lr_schedule": flags["lr_schedule"],
        "warmup_epochs": float(flags["warmup_epochs"]),
        "lr_reference_batch_size": int(flags["lr_reference_batch_size"]),
        "label_smoothing": float(flags["label_smoothing"]),
        "class_weights": flags["class_weights"],
        "export_epoch": flags["export_epoch"],
        "early_stopping_patience": int(flags["early_stopping_patience"]),
        **resolved,
    }
    if float(flags["fine_tune_fraction"]) >= 0:
        values["fine_tune_fraction"] = float(flags["fine_tune_fraction"])
    args = [f"--{name}={value}" for name, value in values.items() if name not in omitted]
    return args, resolved


def apply_hyperparameters(pools: list, best: dict, kinds: dict) -> tuple:
    """(pools, values): the training job's pools with `best` (the best trial's values) written over
    the flags of the same names, and every tunable value the job now carries. A hyperparameter
    the job's flags do not carry is refused."""
    import copy

    typed = {name: typed_hyperparameter(name, value, kinds) for name, value in best.items()}
    out = copy.deepcopy(pools)
    carried: dict = {}

    def rewrite(arg: Any) -> Any:
        name, sep, value = str(arg).removeprefix("--").partition("=")
        if sep and name in kinds:
            carried[name] = typed.get(name, typed_hyperparameter(name, value, kinds))
        return f"--{name}={typed[name]}" if sep and name in typed else arg

    for pool in out:
        container = pool.get("container_spec", {})
        if container.get("args"):
            container["args"] = [rewrite(arg) for arg in container["args"]]
    missing = sorted(set(typed) - set(carried))
    if missing:
        raise ValueError(f"the training job's flags carry no {missing} to set from the best trial")
    return out, carried


# What a step that calls `apply_hyperparameters` ships with it (`components.tuning.BEST_TRIAL_FUNCS`).
HYPERPARAMETER_FUNCS = [hyperparameters, tunable, typed_hyperparameter, apply_hyperparameters]


def measurement_selection(export_epoch: str) -> str:
    """The study's measurement selection (aiplatform_v1 `StudySpec.MeasurementSelectionType`) that
    matches the epoch the trainer exports, so a trial is judged by the model it would publish."""
    selections = {"best": "BEST_MEASUREMENT", "last": "LAST_MEASUREMENT"}
    if export_epoch not in selections:
        raise ValueError(f"export_epoch must be best or last, got {export_epoch!r}")
    return selections[export_epoch]


def stable_model_uri(model_root: str, training_folder: str, model_display_name: str, run: str) -> str:
    """Where the training job publishes the model (its `servable_folder`). A registered version
    keeps pointing at its aiplatform_v1 `Model.artifact_uri` after the run's folder is deleted, so
    on Vertex `<model_root>/<model's folder>/<run>` (`model_root` "": `gs://<bucket>/models`);
    locally, whose registry keeps its own copy, the job's `model/`."""
    if not model_root and not training_folder.startswith("gs://"):
        return servable_folder(training_folder.rstrip("/") + "/model")
    root = (
        model_root.rstrip("/") or "gs://" + training_folder.removeprefix("gs://").split("/", 1)[0] + "/models"
    )
    return servable_folder(f"{root}/{registry_folder(model_display_name)}/{run}")


def describe_pools(name: str, folder: str, specs: list) -> None:
    """One line per pool, in the step's log."""
    print(f"{name} job in {folder}:")
    for index, spec in enumerate(specs):
        m = spec["machine_spec"]
        gpus = f" + {m['accelerator_count']} x {m['accelerator_type']}" if "accelerator_type" in m else ""
        print(f"  pool {index}: {spec['replica_count']} x {m['machine_type']}{gpus}")


@dsl.component(
    base_image=stepimage.BASE_IMAGE,
    install_kfp_package=False,
    additional_funcs=[
        hardware.gpu_tables,
        hardware.allowed_counts,
        hardware.validate_machine,
        pool_env,
        hardware_parameters,
        multi_region,
        reduction_server_problems,
        reduction_server_pool,
        trainer_pools,
        machine_spec,
        build_worker_pool_specs,
        prepare_command,
        train_command,
        evaluate_command,
        hyperparameters,
        tunable,
        build_prepare_args,
        dataflow_parameters,
        dataflow_template_spec,
        fuse_path,
        typed_hyperparameter,
        build_trainer_args,
        build_evaluation_args,
        describe_pools,
        measurement_selection,
        check_model_display_name,
        registry_folder,
        servable_folder,
        stable_model_uri,
    ],
)
def plan_jobs(
    image_uri: str,
    training_image_uri: str,
    cpu_image_uri: str,
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
    prepare_engine: str,
    network: str,
    dataflow_image_uri: str,
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
    dataflow_template=str,
    dataflow_parameters=dict,
    dataflow_temp_location=str,
    dataflow_network=str,
):
    """The four jobs' worker pools and folders, validated: a bad machine, GPU or flag fails here,
    before any job starts. The tuning pools are planned whether or not the run tunes."""
    flags = dict(locals())  # the parameters, by name (before any other local is made)
    import collections

    kinds = tunable()
    jobs = ("prepare", "tuning", "training", "evaluate")
    folders = {
        name: job.uri.rstrip("/")
        for name, job in zip(jobs, (prepare_job, tuning_job, training_job, evaluation_job), strict=True)
    }
    dataset_uri = folders["prepare"] + "/model"
    model_uri = stable_model_uri(model_root, folders["training"], model_display_name, pipeline_run)
    hardware_flags = {name: flags[name] for name in hardware_parameters()}
    cpu_job: dict[str, Any] = {
        "chief_machine_type": prepare_machine_type,
        "boot_disk_type": boot_disk_type,
        "boot_disk_size_gb": boot_disk_size_gb,
    }
    warnings: list = []
    prepare_args = build_prepare_args(
        source=dataset_source,
        image_size=image_size,
        shards=dataset_shards,
        seed=seed,
        synthetic_per_class=synthetic_per_class,
        champion_class_names=champion_class_names,
        engine=prepare_engine,
    )
    prepare_pools = build_worker_pool_specs(
        image_uri=cpu_image_uri,
        command=prepare_command(),
        args=prepare_args,
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
    training_args, carried = build_trainer_args(dataset_uri, image_size, flags, kinds)
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
        image_uri=cpu_image_uri,
        command=evaluate_command(),
        args=build_evaluation_args(dataset_uri, model_uri, champion_uri),
        region=region,
        **cpu_job,
    )
    # A Beam preparation on Dataflow: its Flex Template spec file, in the preparation's folder.
    dataflow_template = folders["prepare"] + "/dataflow-template.json"
    dataflow = dataflow_parameters(prepare_args, dataset_uri) if prepare_engine == "beam" else {}
    if dataflow and dataflow_image_uri:
        import json
        import os

        spec_path = fuse_path(dataflow_template)
        os.makedirs(os.path.dirname(spec_path), exist_ok=True)
        with open(spec_path, "w") as f:
            json.dump(dataflow_template_spec(dataflow_image_uri, dataflow), f, indent=2, sort_keys=True)
        print(f"dataflow template: {dataflow_template} ({dataflow_image_uri})")
    for warning in warnings:
        print(f"WARNING: {warning}")
    for name, specs in zip(
        jobs, (prepare_pools, tuning_pools, training_pools, evaluation_pools), strict=True
    ):
        describe_pools(name, folders[name], specs)
    print(f"the model: {model_uri}")
    print("training args:", " ".join(training_args))
    Outputs = collections.namedtuple(
        "Outputs",
        "prepare_pools prepare_dir tuning_pools tuning_dir measurement_selection_type training_pools "
        "training_dir evaluation_pools evaluation_dir dataset_uri model_uri hyperparameters "
        "dataflow_template dataflow_parameters dataflow_temp_location dataflow_network",
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
        carried,
        dataflow_template,
        dataflow,
        folders["prepare"] + "/dataflow-tmp",
        # Dataflow takes a network's name where a Vertex job takes projects/<n>/global/networks/<name>.
        network.rstrip("/").rsplit("/", 1)[-1],
    )
