"""The one place TensorFlow is imported, so tf-keras (not Keras 3) is what `tf.keras` means.

Keras 3 fails under MultiWorkerMirroredStrategy and its BackupAndRestore is not multi-worker
safe (docs/facts.md, fact 1); tf-keras, pinned to TensorFlow's minor version, works.
"""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
if not os.path.exists("/proc/driver/nvidia/version"):
    # No GPU: host memory through TensorFlow's BFC allocator, which keeps freed blocks where malloc
    # unmapped and faulted them in every step (docs/facts.md, fact 39); capped at the machine's
    # memory (64 GiB unless set), so no cache budget is refused below it. With a GPU: not measured.
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
    os.environ.setdefault(
        "TF_CPU_BFC_MEM_LIMIT_IN_MB", str(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >> 20)
    )

import tensorflow as tf
import tf_keras as keras

__all__ = ["keras", "tf"]
