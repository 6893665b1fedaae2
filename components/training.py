"""Step 4, training: the multi-worker CustomJob (`CustomTrainingJobOp` on Vertex, the local job
runner on the local target) running `python -m trainer.task`.

Command-line contract handed to the trainer image (see `build_trainer_args`):
    python -m trainer.task --data_dir DATASET_URI --backbone B --weights W --image_size N
        --epochs N --learning_rate F --per_replica_batch_size N --dense_units N --dropout F
        --mixed_precision BOOL --xla BOOL --seed N --augment POLICY --lr_schedule S
        --warmup_epochs F --lr_reference_batch_size N --label_smoothing F --class_weights W
        --export_epoch best|last --early_stopping_patience N [--fine_tune_fraction F]
`--model_dir`, `--checkpoint_dir` and `--tensorboard_dir` are left to their defaults, the
AIP_MODEL_DIR, AIP_CHECKPOINT_DIR and AIP_TENSORBOARD_LOG_DIR Vertex derives from the job's
base output directory (per trial in a tuning job): the model is `<base>/model`.

The flags are built by plain functions, not steps of their own: the planning step
(`components.plan.plan_jobs`) builds the tuning and training jobs' flags before the dataset is
prepared, and the best-trial step puts the best trial's values into the training job's flags
(`apply_hyperparameters`); a step of their own would be one more VM start each on Vertex
(docs/architecture.md, "The critical path"). The pre-flight (`pipeline.rules.trainer_commands`)
calls `build_trainer_args` itself, so the trainer's parsers check the very command line the
jobs get. One spelling of the flags: `build_trainer_args`.
"""

from typing import Any


def train_command() -> list:
    """The training job's command (a function, so that steps can be handed it)."""
    return ["python", "-m", "trainer.task"]


def tunable() -> dict:
    """The hyperparameters a tuning job may set, and their kinds: a trial's values arrive as JSON
    numbers (`32.0`), which `build_trainer_args` and `apply_hyperparameters` write as the kind
    says. The one list: `TUNABLE`, `components.tuning.TUNABLE_FLAGS` and the steps read it."""
    return {
        "learning_rate": "float",
        "per_replica_batch_size": "int",
        "dense_units": "int",
        "dropout": "float",
        "epochs": "int",
    }


TRAIN_COMMAND = train_command()
TUNABLE = tunable()
# The pipeline parameters `build_trainer_args` turns into `trainer.task` flags (beside the
# dataset's URI and image size), under their own names: the planning step takes exactly these
# (tests/components/test_steps.py keeps the list equal to its inputs).
MODEL_FLAGS = (
    "backbone",
    "weights",
    "epochs",
    "learning_rate",
    "per_replica_batch_size",
    "dense_units",
    "dropout",
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
    """A tunable hyperparameter's value as its kind (`TUNABLE`, handed in as `kinds`: this runs
    inside steps): a whole number for an int (`32.0` -> 32; `32.5` refused)."""
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
    """(args, hyperparameters): the `trainer.task` flags of one job, and the tunable values they
    carry. `flags` holds every name of `MODEL_FLAGS`; `kinds` is `TUNABLE`. Flags named in
    `leave_out`, and the parameters a tuning job's `search_space` declares (StudySpec
    ParameterSpecs, either JSON form), are omitted: a tuning job adds `--<parameter_id>=<value>`
    per trial. `fine_tune_fraction` < 0 leaves the trainer's default."""
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


def apply_hyperparameters(pools: list, hyperparameters: dict, kinds: dict) -> tuple:
    """(pools, values): the training job's worker pools with `hyperparameters` (the best trial's)
    written over the trainer's flags of the same names, in every pool that runs the trainer (the
    Reduction Server pool has no args), and every tunable value the job now carries. `kinds` is
    `TUNABLE`. A hyperparameter the job's flags do not carry is refused."""
    import copy

    typed = {name: typed_hyperparameter(name, value, kinds) for name, value in hyperparameters.items()}
    out = copy.deepcopy(pools)
    carried: dict = {}
    for pool in out:
        container = pool.get("container_spec", {})
        if not container.get("args"):
            continue
        args = []
        for arg in container["args"]:
            name, sep, value = str(arg).removeprefix("--").partition("=")
            if sep and name in typed:
                arg = f"--{name}={typed[name]}"
            if sep and name in kinds:
                carried[name] = typed.get(name, typed_hyperparameter(name, value, kinds))
            args.append(arg)
        container["args"] = args
    missing = sorted(set(typed) - set(carried))
    if missing:
        raise ValueError(f"the training job's flags carry no {missing} to set from the best trial")
    return out, carried
