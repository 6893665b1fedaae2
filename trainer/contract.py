"""What the trainer promises to the code that reads its output: file names and JSON keys.

The pipeline's components read these files but cannot import this package (they run on the
Google Cloud Pipeline Components image, which has no trainer), so each reading module keeps its
own list of the keys it reads (`METRICS_READ`, `METADATA_READ`) and `tests/test_contracts.py`
checks every such list against the declarations here. docs/contracts.md describes each file.
Standard library only: no TensorFlow, so the contract can be checked in milliseconds.
"""

from __future__ import annotations

# --- beside the SavedModel, in --model_dir (published atomically by the chief) ----------------
SAVED_MODEL_FILE = "saved_model.pb"
METRICS_FILE = "metrics.json"
CONFIG_FILE = "config.json"

# --- in --checkpoint_dir (the chief's; kept across restarts) ----------------------------------
HISTORY_FILE = "history.json"
STATE_FILE = "run_state.json"
BEST_FILE = "best.json"  # the export candidate: {metric, goal, epoch, value, checkpoint, ...}
BEST_DIR = "best"  # its weights: a copy of that epoch's backup, `epoch-<NNNN>.*`

# --- in a prepared dataset's folder (`python -m trainer.prepare` output) --------------------
METADATA_FILE = "metadata.json"
METADATA_FORMAT_VERSION = 1

METRICS_KEYS = (
    # Exact figures of the published model over the whole validation and test splits.
    "val_loss",
    "val_accuracy",
    "val_examples",
    "test_loss",
    "test_accuracy",
    "test_examples",
    "confusion_matrix",  # {labels, rows, columns, matrix}: see CONFUSION_MATRIX_KEYS
    "per_class",  # {class name: {precision, recall, f1, support}} on the test split (trainer.metrics)
    "macro_f1",  # mean F1 over the classes with test images
    # The exported epoch's training figures (None when no epoch was recorded).
    "train_loss",
    "train_accuracy",
    "epochs_completed",  # epochs trained (fewer than --epochs after an early stop)
    # Which epoch was exported (docs/training.md, "Which epoch is exported").
    "best_epoch",  # the exported epoch, 1-based: the best by selection_metric, or the last
    "export_epoch",  # --export_epoch: "best" or "last"
    "selection_metric",  # the metric the best epoch is chosen by: --hp_metric
    "stopped_early",  # whether --early_stopping_patience ended training before --epochs
    "history",  # {metric: [value per epoch]}, Keras History's shape
    "class_names",
    "images_per_second",  # mean training throughput, the first epoch left out (None: no epoch)
    "hp_metric",
    # How it was trained.
    "num_workers",
    "replicas",
    "global_batch_size",
    "precision_policy",
    "dataset_fingerprint",
    "wall_seconds",
)
"""Every top-level key of metrics.json: the trainer writes exactly these."""

CONFUSION_MATRIX_KEYS = ("labels", "rows", "columns", "matrix")
"""The keys of metrics.json's `confusion_matrix`: `matrix[true][predicted]` counts over the test
split, rows and columns in the order of `labels` (the class names)."""

METADATA_KEYS = (
    "format_version",  # METADATA_FORMAT_VERSION; readers refuse any other
    "source",
    "source_info",
    "class_names",
    "num_classes",
    "image_size",
    "channels",
    "encoding",
    "seed",
    "splits",  # {train|validation|test: METADATA_SPLIT_KEYS}
    "fingerprint",  # "sha256:<hex>" over every shard's name and content
)
"""Every top-level key of a prepared dataset's metadata.json."""

METADATA_SPLIT_KEYS = ("count", "class_counts", "shards")
"""The keys of each split in metadata.json's `splits` (plus `carved_from` for a split that was
carved from train)."""

# --- in the evaluation job's output folder (`python -m trainer.evaluate`) --------------------
EVALUATION_FILE = "evaluation.json"

EVALUATION_KEYS = (
    "split",  # the split evaluated ("test")
    "data_dir",
    "dataset_fingerprint",
    "class_names",
    "method",  # how the models were run (their serving signature)
    "models",  # {challenger|champion: EVALUATION_MODEL_KEYS}; no champion: challenger alone
)
"""Every top-level key of evaluation.json."""

EVALUATION_MODEL_KEYS = (
    "model_dir",
    "examples",
    "loss",
    "accuracy",
    "macro_f1",
    "per_class",  # as metrics.json's
    "confusion_matrix",  # as metrics.json's (CONFUSION_MATRIX_KEYS)
    "recorded",  # {accuracy, macro_f1, dataset_fingerprint}: what the model's own metrics.json says
    "seconds",
)
"""The keys of each model's entry in evaluation.json's `models`."""
