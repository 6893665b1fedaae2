"""The one place TensorFlow is imported, so tf-keras (not Keras 3) is what `tf.keras` means.

Keras 3 fails under MultiWorkerMirroredStrategy and its BackupAndRestore is not multi-worker
safe (docs/facts.md, fact 1); tf-keras, pinned to TensorFlow's minor version, works.
"""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import tensorflow as tf
import tf_keras as keras

__all__ = ["keras", "tf"]
