"""The model's and the training's parameters (the trainer's flags), judged by the trainer's own
parsers on the flags a run would hand its jobs (`python -m trainer.flagcheck`), and a local
folder source (`python -m trainer.preparation.sourcecheck`): the flags are built by the very functions the
planning step runs (`trainer_commands`), so what the pre-flight checks is what the jobs get."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from components import plan, prepare
from local import ROOT
from pipeline.options.common import Parameter as _p
from pipeline.options.common import Problem, replicas, whole

PARAMETERS: tuple[_p, ...] = (
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
)

# This capability's rows of docs/options.md#the-rules (`make docs`): parameters | rule | source.
RULES = """
| model and data flags (`backbone`, `weights`, `epochs`, `learning_rate`, `per_replica_batch_size`, `dense_units`, `dropout`, `image_size`, `seed`, `fine_tune_fraction`, `dataset_shards`, `synthetic_per_class`, ...) | whatever the trainer's own parsers accept, applied to the exact flags the run would hand the jobs (`python -m trainer.flagcheck`, no TensorFlow, ~0.1 s); `fine_tune_fraction` is -1 (the trainer's default) or 0 to 1 | `trainer/config.py`, `trainer/prepare.py` |
"""


# The inputs of `components.prepare.build_prepare_args` (its `trainer.prepare` flags), by the
# pipeline parameter the planning step hands each (`components.plan.plan_jobs`).
PREPARE_INPUTS = {
    "source": "dataset_source",
    "image_size": "image_size",
    "shards": "dataset_shards",
    "seed": "seed",
    "synthetic_per_class": "synthetic_per_class",
    "engine": "prepare_engine",
}


def trainer_commands(values: Mapping[str, Any]) -> dict[str, list[str]]:
    """The flags the run hands `trainer.task` and `trainer.prepare` (`components.plan.build_trainer_args`,
    `components.prepare.build_prepare_args`), less the folders (Vertex gives them; flagcheck stands
    in) and the champion's class names (read at run time)."""
    flags = {name: values[name] for name in plan.MODEL_FLAGS}
    task, _ = plan.build_trainer_args("/check/dataset", values["image_size"], flags, plan.TUNABLE)
    inputs = {arg: values[name] for arg, name in PREPARE_INPUTS.items() if name in values}
    try:
        prepare_argv = prepare.build_prepare_args(**inputs)
    except ValueError:
        # A source the step refuses: handed over as given, for the preparation's own parser to name.
        built = prepare.build_prepare_args(**{**inputs, "source": "tfds:stand-in"})
        prepare_argv = [f"--source={inputs['source']}" if a == "--source=tfds:stand-in" else a for a in built]
    return {
        "trainer.task": [a for a in task if not a.startswith("--data_dir=")],
        "trainer.prepare": prepare_argv,
    }


def trainer_check(module: str, request: Any, timeout: float | None = None) -> Any:
    """The JSON answer of `python -m <module>` to the JSON `request` on its stdin: a process, since
    the pipeline's layers never import the trainer (tests/conftest.py answers in-process)."""
    result = subprocess.run(
        [sys.executable, "-m", module],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise RuntimeError(f"python -m {module} failed: {result.stderr.strip()[-2000:]}")
    return json.loads(result.stdout)


def trainer_flag_problems(values: Mapping[str, Any]) -> list[Problem]:
    """The trainer's own parsers' verdict on the flags this run would hand its jobs, each problem
    named by the pipeline parameter behind the flag (`trainer_check`: trainer.flagcheck)."""
    problems = []
    for found in trainer_check("trainer.flagcheck", trainer_commands(values)):
        program = found["program"]
        rename: Mapping[str, str] = {} if program == "trainer.task" else PREPARE_INPUTS
        names = tuple(rename.get(flag, flag) for flag in found["flags"])
        problems.append(Problem(names or (program,), f"{program} says: {found['message']}"))
    return problems


def source_problems(values: Mapping[str, Any]) -> list[Problem]:
    """A local `folder:PATH` source judged by the preparation's own rules (trainer.preparation.sourcecheck),
    and the global batch against its training split. Other sources are checked by the preparation job."""
    source = str(values.get("dataset_source", ""))
    if not source.startswith("folder:"):
        return []
    answer = trainer_check("trainer.preparation.sourcecheck", {"source": source}, timeout=120)
    problems = [Problem(("dataset_source",), f"trainer.prepare says: {p}") for p in answer["problems"]]
    counts = answer.get("counts") or {}
    train: Any = (counts.get("prepared") or {}).get("train")
    batch: Any = values.get("per_replica_batch_size")
    known = counts.get("complete") and isinstance(train, int) and whole(batch)
    count = replicas(values)
    if problems or not known or batch * count <= train:
        return problems
    return [
        Problem(
            ("per_replica_batch_size", "worker_count"),
            f"a global batch of {batch * count} ({batch} per replica x {count} replicas) is larger "
            f"than the {train} training images {source} gives: not one step could be made; give "
            f"per_replica_batch_size at most {max(1, train // count)}",
        )
    ]
