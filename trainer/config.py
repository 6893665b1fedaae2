"""The trainer's configuration: one frozen dataclass, built and validated once from flags.

Flags use underscores because they double as Vertex AI tuning parameter ids: a trial receives
`--<parameter_id>=<value>`. Environment variables are read only here: as flag defaults (`AIP_*`)
and as the worker pool's hardware request (`gpu_request`). No TensorFlow, so a bad flag is
rejected (exit code 2) in milliseconds.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trainer import backbones, storage

HP_METRICS = ("val_accuracy", "val_loss", "accuracy", "loss")
"""Metrics the trainer computes every epoch, and so the only valid `--hp_metric` tags."""

MIN_IMAGE_SIZE, MAX_IMAGE_SIZE = 32, 1024
# The most pixels an image (folder source, serving request) may have, from its header before
# decoding: width x height, a GIF's frames added up (TensorFlow 2.21 decodes every frame). 67.1 MP
# is above full-frame photos (~61 MP), 8x the largest --image_size per side; one such JPEG raised
# peak memory by 231 MB decoded and resized (12 MP: 49 MB), and preparation decodes several at once.
MAX_IMAGE_PIXELS = 8192 * 8192
SPLITS = ("train", "validation", "test")
"""The splits every prepared dataset has."""
AUGMENT_POLICIES = ("auto", "none", "flip_lr", "flip", "leaf")
"""`--augment` (docs/training.md#augmentation-augment); `auto` follows the data (`resolve_augment`)."""
EXPORT_EPOCHS = ("best", "last")
"""`--export_epoch`: `best` exports the weights of the epoch with the best `--hp_metric` (the
earliest of equals), `last` those of the last epoch trained."""
LR_SCHEDULES = ("cosine", "constant")
"""`--lr_schedule`: `cosine` (linear warm-up, then cosine decay to zero) or `constant`."""
CLASS_WEIGHTS = ("none", "balanced")
"""`--class_weights`: `balanced` weighs each class's loss by n / (k * n_class) of the training split."""
ENCODINGS = ("raw", "jpeg", "png")
"""How prepared images are stored: `raw` uint8 pixels (no decode cost, the default), or
JPEG/PNG (smaller files, decoded once before the cache)."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything one training run needs, resolved and validated: a field per flag of
    `build_parser` (docs/contracts.md, section 1; see its help for the flags not listed here):

      per_replica_batch_size: examples per replica per step (x the replicas in sync: the global batch).
      image_size: side of the square images the model sees (others are resized on the device).
      dense_units: width of the head's hidden layer (0: no hidden layer).
      mixed_precision: compute in float16 on GPUs (bfloat16 on CPUs); the output stays float32.
      seed: seeds weights initialisation and shuffling.
      augment: one of AUGMENT_POLICIES (in the model, on the device, in training only).
      warmup_epochs: epochs of linear warm-up of the cosine schedule (at most half the run).
    """

    data_dir: str
    model_dir: str
    checkpoint_dir: str
    tensorboard_dir: str
    epochs: int = 2
    per_replica_batch_size: int = 64
    learning_rate: float = 1e-4
    image_size: int = 224
    backbone: str = backbones.DEFAULT
    weights: str = "imagenet"
    fine_tune_fraction: float = 0.0
    dense_units: int = 1016
    dropout: float = 0.2
    mixed_precision: bool = False
    xla: bool = False
    hp_metric: str = "val_accuracy"
    seed: int = 42
    shuffle_buffer: int = 2048
    augment: str = "auto"
    lr_schedule: str = "cosine"
    warmup_epochs: float = 1.0
    lr_reference_batch_size: int = 0
    label_smoothing: float = 0.0
    class_weights: str = "none"
    export_epoch: str = "best"
    early_stopping_patience: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


PATH_FIELDS = ("data_dir", "model_dir", "checkpoint_dir", "tensorboard_dir")
STATE_FIELDS = tuple(
    f.name for f in dataclasses.fields(TrainConfig) if f.name not in (*PATH_FIELDS, "hp_metric")
)
"""Every field that shapes training (not the folders, whose data the dataset's fingerprint pins,
nor the reported metric's name). A backup may only be resumed with the same values, or the model
published would be trained half one way and half the other."""


def metric_goal(metric: str) -> str:
    """The direction in which `metric` (one of HP_METRICS) improves: `max` or `min`."""
    if metric.endswith("accuracy"):
        return "max"
    if metric.endswith("loss"):
        return "min"
    raise ValueError(f"no direction is known for the metric {metric!r}; expected one of {HP_METRICS}")


# --- argparse types: each names what is allowed -------------------------------------------


def whole_number(text: str) -> int:
    """An integer flag's value: `32`, or a whole-valued number such as `32.0` or `3.2e1`, as tuning
    trials receive INTEGER and DISCRETE values (docs/facts.md, fact 25;
    googleapis/python-aiplatform issue #866). `32.5`, `nan` and `inf` are refused."""
    with contextlib.suppress(ValueError):
        return int(text)
    try:
        number = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not math.isfinite(number) or not number.is_integer():
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
    return int(number)


def int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = whole_number(text)
        if value < low or (high is not None and value > high):
            allowed = f"between {low} and {high}" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"must be an integer {allowed}, got {value}")
        return value

    return parse


def float_in(
    low: float, high: float, *, low_open: bool = False, high_open: bool = False
) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        too_low = value <= low if low_open else value < low
        too_high = value >= high if high_open else value > high
        if not math.isfinite(value) or too_low or too_high:
            left, right = "(" if low_open else "[", ")" if high_open else "]"
            raise argparse.ArgumentTypeError(
                f"must be a number in {left}{low:g}, {high:g}{right}, got {text}"
            )
        return value

    return parse


def parse_bool(text: str) -> bool:
    """`true/false`, `1/0`, `yes/no`: tuning passes categorical values as text."""
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"must be true or false, got {text!r}")


def augment_policy(text: str) -> str:
    """An `--augment` policy (the flag's old values `true`/`false` read as `flip`/`none`)."""
    lowered = text.strip().lower()
    legacy = {"true": "flip", "1": "flip", "yes": "flip", "false": "none", "0": "none", "no": "none"}
    lowered = legacy.get(lowered, lowered)
    if lowered not in AUGMENT_POLICIES:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(AUGMENT_POLICIES)}, got {text!r}")
    return lowered


def resolve_augment(policy: str, source: str) -> str:
    """The policy `auto` stands for, given the prepared dataset's source
    (docs/training.md#augmentation-augment)."""
    if policy != "auto":
        return policy
    return {"tfds:cassava": "leaf", "synthetic": "flip"}.get(source, "none")


def _weights(text: str) -> str:
    if text.lower() in ("imagenet", "none"):
        return text.lower()
    if not text.strip():
        raise argparse.ArgumentTypeError("must be 'imagenet', 'none' or a path to a weights file")
    return text


def _path(text: str) -> str:
    if not text.strip() or ("://" in text and not text.partition("://")[2].strip("/")):
        raise argparse.ArgumentTypeError("must be a non-empty path (local, /gcs/... or gs://BUCKET/...)")
    return text.rstrip("/") or "/"  # the root in any spelling ("//") stays the root


def build_parser(
    parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser,
) -> argparse.ArgumentParser:
    p = parser_class(
        prog="python -m trainer.task",
        description="Train an image classifier (transfer learning) on a prepared dataset, on one "
        "machine or as one task of a MultiWorkerMirroredStrategy cluster described by TF_CONFIG.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = p.add_argument
    add("--data_dir", type=_path, required=True, help="Prepared dataset (trainer.prepare output).")
    add("--model_dir", type=_path, help="SavedModel output. Default: $AIP_MODEL_DIR.")
    add(
        "--checkpoint_dir",
        type=_path,
        help="Backup of progress, every epoch. Default: $AIP_CHECKPOINT_DIR, else <model_dir>_checkpoints.",
    )
    add(
        "--tensorboard_dir",
        type=_path,
        help="TensorBoard logs. Default: $AIP_TENSORBOARD_LOG_DIR, else <model_dir>_logs.",
    )
    add("--epochs", type=int_in(1, 10_000))
    add("--per_replica_batch_size", type=int_in(1, 65_536))
    add("--learning_rate", type=float_in(0, 1, low_open=True))
    add("--image_size", type=int_in(MIN_IMAGE_SIZE, MAX_IMAGE_SIZE))
    add("--backbone", choices=backbones.NAMES)
    add(
        "--weights",
        type=_weights,
        help="'imagenet' (downloaded at run time), 'none', or a weights file (local or GCS) "
        "for offline and VPC-SC projects.",
    )
    add(
        "--fine_tune_fraction",
        type=float_in(0, 1),
        help="Fraction of the backbone's layers, from the top, that are trained (0: head only). "
        "Default: 0 with pretrained weights, 1 with --weights none.",
    )
    add("--dense_units", type=int_in(0, 65_536))
    add("--dropout", type=float_in(0, 1, high_open=True))
    add("--mixed_precision", type=parse_bool)
    add("--xla", type=parse_bool)
    add(
        "--hp_metric",
        choices=HP_METRICS,
        help="Reported to a tuning job every epoch; picks the best epoch and stops early.",
    )
    add("--seed", type=int_in(0, 2**31 - 1))
    add("--shuffle_buffer", type=int_in(1, 10_000_000))
    add("--augment", type=augment_policy, help="; ".join(AUGMENT_POLICIES))
    add("--lr_schedule", choices=LR_SCHEDULES)
    add("--warmup_epochs", type=float_in(0, 100))
    add(
        "--lr_reference_batch_size",
        type=int_in(0, 1_000_000),
        help="Global batch size --learning_rate is meant for (linear scaling); 0: the per-replica batch size.",
    )
    add("--label_smoothing", type=float_in(0, 1, high_open=True))
    add("--class_weights", choices=CLASS_WEIGHTS)
    add(
        "--export_epoch",
        choices=EXPORT_EPOCHS,
        help="Export the epoch with the best --hp_metric, or the last epoch trained.",
    )
    add(
        "--early_stopping_patience",
        type=int_in(0),
        help="Stop when --hp_metric has not improved for this many epochs (0: off).",
    )
    # The other flags' defaults are their TrainConfig fields' (--fine_tune_fraction's follows --weights).
    derived = (*PATH_FIELDS, "fine_tune_fraction")
    p.set_defaults(**{f.name: f.default for f in dataclasses.fields(TrainConfig) if f.name not in derived})
    return p


def parse_args(
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser,
) -> TrainConfig:
    """Flags (and the AIP_* defaults in `environ`) to a validated TrainConfig; on bad input, exits
    with status 2 and a message naming the flag and what is allowed."""
    env = os.environ if environ is None else environ
    parser = build_parser(parser_class)
    ns = parser.parse_args(argv)

    ns.model_dir = model_dir = ns.model_dir or env.get("AIP_MODEL_DIR", "").rstrip("/")
    if not model_dir:
        parser.error("--model_dir is required when AIP_MODEL_DIR is not set")
    if ns.weights == "imagenet" and not backbones.get(ns.backbone).imagenet:
        parser.error(
            f"--weights imagenet is not available for --backbone {ns.backbone}; use --weights none "
            "or a weights file"
        )
    if ns.fine_tune_fraction is None:
        # A randomly initialised backbone is useless frozen: train all of it.
        ns.fine_tune_fraction = 1.0 if ns.weights == "none" else 0.0
    for name, variable, suffix in (
        ("checkpoint_dir", "AIP_CHECKPOINT_DIR", "_checkpoints"),
        ("tensorboard_dir", "AIP_TENSORBOARD_LOG_DIR", "_logs"),
    ):
        path = getattr(ns, name) or env.get(variable, "").rstrip("/") or model_dir + suffix
        if storage.holds(model_dir, path):
            parser.error(
                f"--{name} must not be --model_dir or inside it ({path}): the "
                "model folder is published as a whole when training ends"
            )
        setattr(ns, name, path)
    if storage.holds(model_dir, ns.data_dir):
        parser.error(
            f"--model_dir must not be --data_dir or hold it ({ns.data_dir}): the model folder is "
            "published as a whole when training ends"
        )
    if any(c in ns.checkpoint_dir for c in "[*?"):  # tf.train.latest_checkpoint globs the folder's path
        parser.error(
            f"--checkpoint_dir must not hold [, * or ? ({ns.checkpoint_dir}): TensorFlow finds the backup "
            "to resume from as a file pattern; without --checkpoint_dir, that is $AIP_CHECKPOINT_DIR or "
            "--model_dir + '_checkpoints'"
        )
    return TrainConfig(**vars(ns))  # a flag per field


# --- the worker pool's hardware request ----------------------------------------------------

# What a replica's worker pool asked Vertex for, in its container's environment: written by
# `components.worker_pools.build_worker_pool_specs` into every trainer pool's `container_spec.env`
# (that layer cannot import this one: tests/components/test_pool_env.py checks the names are the same).
POOL_MACHINE_TYPE_ENV = "TRAINER_POOL_MACHINE_TYPE"
POOL_ACCELERATOR_TYPE_ENV = "TRAINER_POOL_ACCELERATOR_TYPE"
POOL_ACCELERATOR_COUNT_ENV = "TRAINER_POOL_ACCELERATOR_COUNT"
POOL_ENV = (POOL_MACHINE_TYPE_ENV, POOL_ACCELERATOR_TYPE_ENV, POOL_ACCELERATOR_COUNT_ENV)
NO_ACCELERATOR = "ACCELERATOR_TYPE_UNSPECIFIED"
"""`TRAINER_POOL_ACCELERATOR_TYPE` of a pool without GPUs: aiplatform_v1 `AcceleratorType`'s
name for none (an environment variable's value is required, so it is never empty)."""


@dataclasses.dataclass(frozen=True)
class GpuRequest:
    """What this replica's worker pool asked for: its machine type and its GPUs (type "" and
    count 0 for none)."""

    machine_type: str
    accelerator_type: str = ""
    accelerator_count: int = 0


def gpu_request(environ: Mapping[str, str] | None = None) -> GpuRequest | None:
    """The worker pool's request from `TRAINER_POOL_*` (docs/contracts.md, section 2), or None when
    none is set (nothing to check). Raises ValueError naming each bad or missing variable."""
    env = os.environ if environ is None else environ
    values = {name: env.get(name) for name in POOL_ENV}
    if all(value is None for value in values.values()):
        return None
    problems = [
        f"{name} is not set (the worker pool specs set {', '.join(POOL_ENV)} together)"
        for name, value in values.items()
        if value is None
    ]
    machine, gpu, count_text = ((values[name] or "").strip() for name in POOL_ENV)
    if values[POOL_MACHINE_TYPE_ENV] is not None and not re.fullmatch(r"[a-z][a-z0-9-]*", machine):
        problems.append(
            f"{POOL_MACHINE_TYPE_ENV}={machine!r} is not a Compute Engine machine type (e.g. n1-standard-8)"
        )
    if values[POOL_ACCELERATOR_TYPE_ENV] is not None and not re.fullmatch(r"[A-Z][A-Z0-9_]*", gpu):
        problems.append(
            f"{POOL_ACCELERATOR_TYPE_ENV}={gpu!r} is not an accelerator type: expected an aiplatform_v1 "
            f"AcceleratorType name (e.g. NVIDIA_TESLA_V100), or {NO_ACCELERATOR} for none"
        )
    if values[POOL_ACCELERATOR_COUNT_ENV] is not None and not re.fullmatch(r"[0-9]{1,4}", count_text):
        problems.append(
            f"{POOL_ACCELERATOR_COUNT_ENV}={count_text!r} is not valid: expected a whole number >= 0 "
            "(the GPUs of each replica of the pool)"
        )
    elif not problems and int(count_text) and gpu == NO_ACCELERATOR:
        problems.append(
            f"{POOL_ACCELERATOR_COUNT_ENV}={int(count_text)} with {POOL_ACCELERATOR_TYPE_ENV}={NO_ACCELERATOR}: "
            "a GPU count needs a GPU type"
        )
    elif not problems and not int(count_text) and gpu != NO_ACCELERATOR:
        problems.append(
            f"{POOL_ACCELERATOR_TYPE_ENV}={gpu} with {POOL_ACCELERATOR_COUNT_ENV}=0: a GPU type needs "
            f"a count >= 1 (or {NO_ACCELERATOR} for none)"
        )
    if problems:
        raise ValueError("; ".join(problems))
    return GpuRequest(machine, "" if gpu == NO_ACCELERATOR else gpu, int(count_text))
