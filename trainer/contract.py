"""What the trainer promises to the code that reads its output: file names and JSON keys.

The pipeline's components cannot import this package (the Google Cloud Pipeline Components
image has no trainer), so each reading module lists the keys it reads (`METRICS_READ`,
`METADATA_READ`) and `tests/test_contracts.py` checks them against the declarations here.
docs/contracts.md describes each file. Standard library only.
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
METADATA_FORMAT_VERSION = 2

METRICS = {
    # Exact figures of the published model, reloaded, over the whole validation and test splits.
    "val_loss": "the published model's loss over the whole validation split",
    "val_accuracy": "its accuracy over the whole validation split",
    "val_examples": "the validation split's images",
    "test_loss": "the published model's loss over the whole test split",
    "test_accuracy": "its accuracy over the whole test split",
    "test_examples": "the test split's images",
    "confusion_matrix": '`{labels, rows: "true class", columns: "predicted class", matrix}` over the test '
    "split (CONFUSION_MATRIX_KEYS)",
    "per_class": "`{class name: {precision, recall, f1, support}}` on the test split (trainer.metrics)",
    "macro_f1": "the mean F1 over the classes with test images",
    "train_loss": "the exported epoch's training loss (null when no epoch was recorded)",
    "train_accuracy": "the exported epoch's training accuracy (null when no epoch was recorded)",
    "epochs_completed": "epochs trained (fewer than --epochs after an early stop)",
    "best_epoch": "the exported epoch, 1-based: the best by selection_metric, or the last "
    '(docs/training.md, "Which epoch is exported")',
    "export_epoch": "--export_epoch: best or last",
    "selection_metric": "the metric the best epoch is chosen by: --hp_metric",
    "stopped_early": "whether --early_stopping_patience ended training before --epochs",
    "history": "`{metric: [value per epoch]}`, Keras History's shape (loss, accuracy, val_loss, "
    "val_accuracy, images_per_second, epoch_seconds, ...)",
    "class_names": "the dataset's classes: a model is only compared with, and may only replace, a "
    "champion of the same class names in the same order",
    "images_per_second": "mean training throughput, the first epoch left out (it also fills the cache; null: no epoch)",
    "hp_metric": "the tuning metric's name",
    # How it was trained.
    "num_workers": "training machines (the chief and the workers)",
    "replicas": "replicas in sync (the distribution strategy's)",
    "global_batch_size": "--per_replica_batch_size x replicas",
    "precision_policy": "the Keras precision policy (float32 or mixed_float16)",
    "dataset_fingerprint": "the prepared dataset's fingerprint (its metadata.json)",
    "wall_seconds": "the chief's run time",
}
"""Every top-level key of metrics.json, and what it holds: the trainer writes exactly these (`make
docs` writes docs/contracts.md's table from here)."""
METRICS_KEYS = tuple(METRICS)

CONFUSION_MATRIX_KEYS = ("labels", "rows", "columns", "matrix")
"""metrics.json's `confusion_matrix`: `matrix[true][predicted]`, in the order of `labels`."""

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
    "fingerprint",  # "sha256:<hex>" over the manifest: classes, image form, splits' counts, shards
)
"""Every top-level key of a prepared dataset's metadata.json."""

METADATA_SPLIT_KEYS = ("count", "class_counts", "shards")
"""Each split in metadata.json's `splits` (plus `carved_from` for a split carved from train)."""

METADATA_SHARD_KEYS = ("name", "bytes", "records", "sha256")
"""One shard in a split's `shards` (a list in shard order)."""

METADATA_SOURCE_INFO_KEYS = {
    "tfds": ("tfds_name", "tfds_version", "tfds_downloads"),
    "synthetic": ("tfds_name", "tfds_version", "generator", "synthetic_per_class", "seed"),
    "folder": ("folder", "skipped", "listing"),
}
"""`source_info`, the source's identity, by kind of `source` (`listing`:
trainer.preparation.shards.folder_listing)."""

# --- in the evaluation job's output folder (`python -m trainer.evaluate`) --------------------
EVALUATION_FILE = "evaluation.json"

EVALUATION_KEYS = (
    "split",  # the split evaluated ("test")
    "data_dir",
    "dataset_fingerprint",
    "class_names",
    "method",  # how the models were run (their serving signature)
    "models",  # {challenger|champion: EVALUATION_MODEL_KEYS}; no champion: challenger alone
    "comparison",  # EVALUATION_COMPARISON_KEYS: challenger vs champion, paired; null: no champion
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

EVALUATION_COMPARISON_KEYS = ("examples", "accuracy", "macro_f1", "mcnemar", "bootstrap")
"""evaluation.json's `comparison` (trainer.pairedstats.compare): `accuracy` and `macro_f1` are each
EVALUATION_DIFFERENCE_KEYS, `mcnemar` EVALUATION_MCNEMAR_KEYS, `bootstrap` EVALUATION_BOOTSTRAP_KEYS."""

EVALUATION_DIFFERENCE_KEYS = ("challenger", "champion", "difference", "ci95")
EVALUATION_MCNEMAR_KEYS = ("b", "c", "p_value")
EVALUATION_BOOTSTRAP_KEYS = ("resamples", "seed", "confidence", "interval")
