"""One value for each of `components.plan.MODEL_FLAGS`: the flags the tests hand
`plan.build_trainer_args`, a small CPU model (every model flag needs one: `build_trainer_args`
reads each). Tests that need other values copy it and override."""

from __future__ import annotations

from typing import Any

MODEL_FLAG_VALUES: dict[str, Any] = {
    "backbone": "tiny",
    "weights": "none",
    "epochs": 3,
    "learning_rate": 0.003,
    "per_replica_batch_size": 16,
    "dense_units": 64,
    "dropout": 0.2,
    "mixed_precision": False,
    "xla": False,
    "fine_tune_fraction": -1.0,
    "seed": 42,
    "augment": "auto",
    "lr_schedule": "cosine",
    "warmup_epochs": 1.0,
    "lr_reference_batch_size": 0,
    "label_smoothing": 0.0,
    "class_weights": "none",
    "export_epoch": "best",
    "early_stopping_patience": 0,
}
