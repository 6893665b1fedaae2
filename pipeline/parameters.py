"""Every pipeline parameter, once: its name, type, compiled (Vertex) default, local default, the
targets it exists on and its help (`PARAMETERS`). The compiled spec's parameters
(`pipeline.dag.create_pipeline`), the flags of `make run` and `make schedule` (`launch.flags`) and
the pipeline's docstring come from it. A rule on the value alone is data on the row (`choices`,
`bounds`); every other rule is in `pipeline.rules`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from components import evaluation, plan, servingimage, tuning
from components.hardware import V100

TARGETS = ("vertex", "local")
# aiplatform_v1 `Scheduling.Strategy`, less the deprecated ON_DEMAND and LOW_COST. The GCPC
# launcher looks the name up in the enum, so `spot` would fail there with `KeyError: 'spot'`,
# after the image build and the dataset job (docs/facts.md, fact 28).
SCHEDULING_STRATEGIES = ("STANDARD", "SPOT", "FLEX_START")
# The compiled default of a parameter the submitter must give (no default in the template).
REQUIRED = object()


@dataclasses.dataclass(frozen=True)
class Parameter:
    """One pipeline parameter. `default` is the compiled (Vertex) default (`REQUIRED`: none);
    `choices` the only values allowed (case matters), `bounds` the (lowest, highest) number
    allowed (`math.inf`: no highest; a whole number for an `int` row): pipeline.rules checks them."""

    name: str
    type: type
    default: Any
    help: str
    local: Any = None
    targets: tuple[str, ...] = TARGETS
    choices: tuple[str, ...] = ()
    bounds: tuple[float, float] | None = None

    def default_for(self, target: str) -> Any:
        if target == "local" and self.local is not None:
            return self.local
        return self.default


_p = Parameter  # the rows below: name, type, default, help, local default, targets


PARAMETERS: tuple[Parameter, ...] = (
    # Where: given by the submitter (make run / schedule), never baked into the compiled JSON.
    _p("project", str, REQUIRED, "Google Cloud project of every job and of the model.", "local"),
    _p("location", str, REQUIRED, "Region of every job and of the model (e.g. us-central1).", "us-central1"),
    _p(
        "context_uri",
        str,
        REQUIRED,
        "gs:// URI of the build context tarball (Vertex) or the checkout folder (local).",
        ".",
    ),
    _p(
        "artifact_repository",
        str,
        REQUIRED,
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
    _p(
        "build_machine_type",
        str,
        "E2_HIGHCPU_8",
        "Cloud Build worker of the image build (BuildOptions.MachineType; UNSPECIFIED: the default "
        "worker; not sent with build_worker_pool, whose workers are the pool's).",
        targets=("vertex",),
    ),
    _p(
        "build_service_account",
        str,
        "",
        "Service account the image build runs as, an e-mail or projects/P/serviceAccounts/EMAIL "
        "('': Cloud Build's default; logs then go to Cloud Logging only).",
        targets=("vertex",),
    ),
    _p(
        "build_worker_pool",
        str,
        "",
        "Cloud Build private pool of the image build, projects/P/locations/REGION/workerPools/POOL "
        "('': the default pool); the build runs in the pool's region.",
        targets=("vertex",),
    ),
    _p("source_commit", str, "", "Git commit of the source, recorded on the model version."),
    _p("registry_dir", str, "local_runs/registry", "Folder of the local model registry.", targets=("local",)),
    _p(
        "model_root",
        str,
        "",
        "gs:// folder the registered models are kept in, outside the runs' folders (each run's model in "
        "<model_root>/<model>/<run>/; '': gs://<the pipeline root's bucket>/models).",
        targets=("vertex",),
    ),
    # Data.
    _p("dataset_source", str, "tfds:cassava", "tfds:NAME, folder:PATH or synthetic.", "synthetic"),
    _p("image_size", int, 300, "Image side in pixels (the codelab resizes to 300).", 64),
    _p("dataset_shards", int, 32, "TFRecord shards per split (>= workers, for FILE sharding).", 8),
    _p(
        "prepare_engine",
        str,
        "job",
        "How the dataset is prepared: job (one process on one machine) or beam (an Apache Beam "
        "pipeline: on Dataflow on Vertex, in Beam's local worker processes locally; resumable; the "
        "same bytes). docs/training.md#preparing-on-apache-beam.",
    ),
    _p(
        "dataflow_max_workers",
        int,
        8,
        "prepare_engine=beam: the most Dataflow workers the preparation may scale to.",
        targets=("vertex",),
        # dataflow_v1beta3 FlexTemplateRuntimeEnvironment.max_workers: "from 1 to 1000". GCPC's
        # launcher drops a 0 from the request (json_util.recursive_remove_empty), so Dataflow
        # would choose the count.
        bounds=(1, 1000),
    ),
    _p(
        "dataflow_machine_type",
        str,
        "n1-standard-4",
        "prepare_engine=beam: the Dataflow workers' machine type.",
        targets=("vertex",),
    ),
    _p(
        "dataflow_subnetwork",
        str,
        "",
        "prepare_engine=beam: the Dataflow workers' subnetwork, regions/REGION/subnetworks/NAME or "
        "(Shared VPC) https://www.googleapis.com/compute/v1/projects/HOST/regions/REGION/subnetworks/NAME; "
        "needed with a custom-mode network ('': the network alone, taken as auto-mode).",
        targets=("vertex",),
    ),
    _p("synthetic_per_class", int, 60, "Training images per class of the synthetic source."),
    _p("seed", int, 42, "Seed of the split carving and of training."),
    _p("prepare_machine_type", str, "n1-standard-8", "CPU machine of the preparation and evaluation jobs."),
    # Model and training.
    _p(
        "backbone",
        str,
        "resnet50",
        "A backbone of the trainer's registry (trainer/backbones.py), checked by its --backbone choices.",
        "tiny",
    ),
    _p("weights", str, "imagenet", "imagenet, none, or a weights file (gs://...).", "none"),
    _p("fine_tune_fraction", float, -1.0, "Backbone fraction trained (-1: the trainer's default)."),
    # The tunable hyperparameters, one row each in `components.plan.hyperparameters()`.
    *(
        _p(name, {"int": int, "float": float}[kind], default, help_, local)
        for name, kind, default, local, help_ in plan.hyperparameters()
    ),
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
    _p(
        "scheduling_strategy",
        str,
        "STANDARD",
        "STANDARD, SPOT or FLEX_START.",
        choices=SCHEDULING_STRATEGIES,
    ),
    _p("service_account", str, "", "Service account the jobs run as ('' : Vertex's default)."),
    _p("network", str, "", "VPC network to peer, projects/<number>/global/networks/<name>."),
    _p("encryption_spec_key_name", str, "", "CMEK key of the jobs and the model."),
    _p("tensorboard", str, "", "Vertex TensorBoard resource for the training job."),
    _p("labels", dict, {}, "Labels of the jobs and the model version."),
    _p(
        "persistent_resource_id",
        str,
        "",
        "ID of a Vertex persistent resource, in the run's project and region, that the preparation, "
        "training and evaluation jobs run on instead of machines started for each ('': on demand; "
        "the PERSISTENT_RESOURCE_ID setting). It needs a pool for each job's machines, the run's "
        "network, CMEK key and service account; tuning trials and the pipeline's own steps still "
        "start machines (docs/architecture.md#a-warm-pool-the-jobs-on-a-vertex-persistent-resource).",
        targets=("vertex",),
    ),
    # Tuning.
    _p("tune", bool, False, "Run a hyperparameter tuning job first; train with the best trial."),
    _p("max_trial_count", int, 8, "Trials of the tuning job.", 2, bounds=(1, math.inf)),
    _p("parallel_trial_count", int, 2, "Trials run at once.", 1),
    _p(
        "max_failed_trial_count",
        int,
        0,
        "Failed trials that fail the tuning job (0: Vertex decides).",
        bounds=(0, math.inf),
    ),
    _p(
        "search_algorithm",
        str,
        "ALGORITHM_UNSPECIFIED",
        "ALGORITHM_UNSPECIFIED (Bayesian), GRID_SEARCH (every parameter INTEGER, DISCRETE or "
        "CATEGORICAL) or RANDOM_SEARCH.",
        choices=tuning.ALGORITHMS,
    ),
    _p(
        "search_space",
        list,
        tuning.VERTEX_SEARCH_SPACE,
        "The tuning job's parameters: a list of Vertex StudySpec.ParameterSpec (parameter_id; one of "
        "double_value_spec or integer_value_spec {min_value, max_value}, discrete_value_spec or "
        "categorical_value_spec {values}; scale_type UNIT_LINEAR_SCALE, UNIT_LOG_SCALE or "
        "UNIT_REVERSE_LOG_SCALE), snake_case or camelCase; ids among "
        + ", ".join(plan.TUNABLE)
        + ". make run takes inline JSON, @FILE or "
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
        choices=evaluation.GATE_METRICS,
    ),
    _p(
        "min_score",
        float,
        0.5,
        "Lowest gate_metric on this run's test split a model needs to become the champion.",
        0.9,
        bounds=(0, 1),
    ),
    _p(
        "gate_rule",
        str,
        "not_worse",
        "How the new model must compare with the champion on this run's test split: not_worse "
        "(at least its gate_metric), significantly_better (the paired 95% interval above 0, and "
        "McNemar p < 0.05 on accuracy) or non_inferior (the interval's lower end above -gate_margin).",
        choices=evaluation.GATE_RULES,
    ),
    _p(
        "gate_margin",
        float,
        0.01,
        "The margin of gate_rule=non_inferior, in gate_metric units (0 to 1).",
        bounds=(0, 1),
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
        "custom (TensorFlow Serving, built from Dockerfile.serving beside the trainer's image) "
        "or an image URI.",
    ),
    _p(
        "serving_tf_version",
        str,
        servingimage.DEFAULT_SERVING_TF_VERSION,
        f"TF version of the prebuilt serving image: {', '.join(servingimage.PREBUILT_TF_SERVING_VERSIONS)}.",
    ),
    _p(
        "serving_accelerator",
        str,
        "cpu",
        "cpu or gpu: which variant of the prebuilt or the custom serving image.",
    ),
    _p(
        "notification_emails",
        list,
        REQUIRED,
        "One to three addresses e-mailed when the run ends (Vertex only). Given: the run uses "
        "the template with a notification exit handler; not given: the template without one.",
        targets=("vertex",),
    ),
)


def parameters_for(target: str) -> tuple[Parameter, ...]:
    if target not in TARGETS:
        raise ValueError(f"target must be one of {', '.join(TARGETS)}, got {target!r}")
    return tuple(p for p in PARAMETERS if target in p.targets)
