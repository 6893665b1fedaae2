from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# Small but learnable: the tiny backbone reaches high accuracy on it in 3 epochs.
SYNTHETIC_ARGS = dict(source="synthetic", image_size=64, synthetic_per_class=60, shards=8, seed=7)
FAST_TRAIN_FLAGS = [
    "--backbone=tiny",
    "--weights=none",
    "--image_size=64",
    "--epochs=3",
    "--per_replica_batch_size=16",
    "--learning_rate=0.003",
    "--dense_units=64",
]


@pytest.fixture(scope="session")
def synthetic_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic dataset prepared once per session through the real TFDS cassava builder."""
    from trainer.prepare import PrepareConfig, prepare

    out = tmp_path_factory.mktemp("data") / "synthetic64"
    prepare(PrepareConfig(output_dir=str(out), **SYNTHETIC_ARGS))  # type: ignore[arg-type]
    return out
