"""The third-party private names the trainer still needs, each checked against the library.

Every private name of a library that `trainer/` relies on is used here and nowhere else, and
tests/trainer/test_adapters.py exercises each against the installed libraries, so an upgrade
that changes one fails there, not in a job; `check_*` also run before each use. No TensorFlow
at import: the checks import the libraries they check when they run.
"""

from __future__ import annotations

import inspect
from typing import Any

# --- tf-keras BackupAndRestore ----------------------------------------------------------------

TF_KERAS_CHECKED_VERSION = "2.21.0"
# tf_keras/src/callbacks.py, BackupAndRestore: `def _backup(self, epoch, batch=0):
# self._training_state.back_up(epoch=epoch, batch=batch)`.
BACKUP_METHOD = "_backup"
BACKUP_METHOD_PARAMS = ("self", "epoch", "batch")
# tf_keras/src/callbacks.py, CallbackList: reads `getattr(cb, "_supports_tf_logs", False)`.
TENSOR_LOGS_ATTRIBUTE = "_supports_tf_logs"


def check_backup_and_restore() -> None:
    """Raises RuntimeError unless tf-keras's `BackupAndRestore` still has `_backup(self, epoch,
    batch=0)`, the save `back_up` calls."""
    from trainer._tf import keras

    method = getattr(keras.callbacks.BackupAndRestore, BACKUP_METHOD, None)
    parameters: Any = inspect.signature(method).parameters if callable(method) else {}
    params, default = tuple(parameters), getattr(parameters.get("batch"), "default", None)
    if params == BACKUP_METHOD_PARAMS and default == 0:
        return
    found = f"parameters {params}" if params != BACKUP_METHOD_PARAMS else f"batch default {default!r}"
    raise RuntimeError(
        f"tf_keras {keras.__version__}: BackupAndRestore.{BACKUP_METHOD} has "
        f"{found if callable(method) else 'no such method'}, expected "
        f"parameters {BACKUP_METHOD_PARAMS} with batch=0 (as in tf_keras {TF_KERAS_CHECKED_VERSION}); "
        "trainer.adapters.back_up (trainer.callbacks.Backup's save) needs updating for this tf_keras"
    )


def back_up(callback: Any, epoch: int, batch: int = 0) -> None:
    """Saves the backup of `callback`, a tf-keras `BackupAndRestore` inside `fit`, as at step
    `batch` (0-based) of epoch `epoch` (0-based): a restart resumes at the step after it."""
    getattr(callback, BACKUP_METHOD)(epoch=epoch, batch=batch)


def take_tensor_logs(callback: Any) -> None:
    """Makes tf-keras hand `callback` its logs as tensors: otherwise Keras converts them to
    numbers after every step, which makes each step wait for the device (only speed depends on
    it, so only the tests check it: a real `fit` must hand the callback tensors)."""
    setattr(callback, TENSOR_LOGS_ATTRIBUTE, True)


# --- tf-keras BackupAndRestore's checkpoint layout ---------------------------------------------

# tf_keras/src/distribute/worker_training_state.py, WorkerTrainingState.__init__: the chief (or a
# single machine) writes `os.path.join(checkpoint_dir, "chief")` through a CheckpointManager with
# max_to_keep=1, other workers a temporary folder they delete; the position is two tf.Variables,
# `name="ckpt_saved_epoch"` and `name="ckpt_saved_batch"`, checkpointed with the model under the
# same names.
BACKUP_CHIEF_FOLDER = "chief"
SAVED_EPOCH_KEY = "ckpt_saved_epoch/.ATTRIBUTES/VARIABLE_VALUE"
SAVED_BATCH_KEY = "ckpt_saved_batch/.ATTRIBUTES/VARIABLE_VALUE"


# --- TFDS's download-manager hook ----------------------------------------------------------------

# A builder's `_split_generators` gets its files with `dl_manager.download_and_extract(URL)`, from a
# download manager `download_and_prepare` makes with `self._make_download_manager(download_dir=...,
# download_config=...)` (tensorflow_datasets 4.9.10: core/dataset_builder.py, the call in
# `download_and_prepare` at line 726, the method at line 1287). TFDS has no public way to pass one
# in, and `DownloadConfig(manual_dir=)` checks files against the URL's registered checksum, so it
# takes only the real archive. So `trainer.preparation.localarchive.local_archive` overrides that method on one
# builder instance, in a `with` block; tests/trainer/test_prepare.py fails if TFDS stops doing so.
TFDS_DOWNLOAD_MANAGER_HOOK = "_make_download_manager"
TFDS_DOWNLOAD_MANAGER_HOOK_PARAMS = ("self", "download_dir", "download_config")
TFDS_CHECKED_VERSION = "4.9.10"


def check_tfds_download_manager_hook() -> None:
    """Raises RuntimeError unless TFDS's DatasetBuilder still has the method
    `trainer.preparation.localarchive.local_archive` overrides, with the parameters it expects."""
    import tensorflow_datasets as tfds

    method = getattr(tfds.core.DatasetBuilder, TFDS_DOWNLOAD_MANAGER_HOOK, None)
    params = tuple(inspect.signature(method).parameters) if callable(method) else None
    if params != TFDS_DOWNLOAD_MANAGER_HOOK_PARAMS:
        raise RuntimeError(
            f"tensorflow_datasets {tfds.__version__}: DatasetBuilder.{TFDS_DOWNLOAD_MANAGER_HOOK} "
            f"has parameters {params}, expected {TFDS_DOWNLOAD_MANAGER_HOOK_PARAMS} (as in TFDS "
            f"{TFDS_CHECKED_VERSION}); trainer.preparation.localarchive.local_archive needs updating for this TFDS"
        )
