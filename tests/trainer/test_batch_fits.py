"""The global batch (`--per_replica_batch_size` x replicas) may not exceed the training split:
`python -m trainer.task` refuses with one line and status 2 before the strategy or the model is
built, naming the largest `--per_replica_batch_size` that fits; a batch exactly the split's size
trains. Real processes on the session's synthetic dataset (300 training images)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import FAST_TRAIN_FLAGS
from tests.processes import ROOT, trainer_env, vertex_cluster
from trainer import data, datasetinfo

TRAIN_IMAGES = 300  # SYNTHETIC_ARGS: 5 classes x 60, the cassava builder's train split


def trainer(
    data_dir: Path, out: Path, batch: int, *, epochs: int = 1, tf_config: str | None = None
) -> subprocess.CompletedProcess[str]:
    flags = [f for f in FAST_TRAIN_FLAGS if not f.startswith(("--per_replica_batch_size", "--epochs"))]
    env = {"TF_CPP_MIN_LOG_LEVEL": "3", **({"TF_CONFIG": tf_config} if tf_config else {})}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer.task",
            f"--data_dir={data_dir}",
            f"--model_dir={out / 'model'}",
            *flags,
            f"--per_replica_batch_size={batch}",
            f"--epochs={epochs}",
        ],
        cwd=ROOT,
        env=trainer_env(env),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def error_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("python -m trainer.task")]


def test_the_split_is_what_this_test_assumes(synthetic_dir: Path) -> None:
    assert datasetinfo.read_metadata(str(synthetic_dir)).splits["train"].count == TRAIN_IMAGES


@pytest.mark.process
def test_one_image_more_than_the_split_is_refused_before_anything_is_built(
    synthetic_dir: Path, tmp_path: Path
) -> None:
    done = trainer(synthetic_dir, tmp_path, TRAIN_IMAGES + 1)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-3000:]
    expected = (
        "python -m trainer.task: error: --per_replica_batch_size 301 x 1 replica = a global batch of 301, "
        f"more than the 300 images of the training split ({synthetic_dir}/metadata.json): not one step "
        "fits in an epoch; the largest --per_replica_batch_size that fits is 300"
    )
    assert error_lines(done) == [expected], done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    # Before the strategy: no config line logged, nothing written (no backup state, no model).
    assert "config:" not in done.stdout, done.stdout[-2000:]
    assert not (tmp_path / "model").exists() and not (tmp_path / "model_checkpoints").exists()


@pytest.mark.process
def test_a_two_machine_job_is_refused_before_its_strategy_waits_for_the_other(
    synthetic_dir: Path, tmp_path: Path
) -> None:
    """One replica of a chief + worker cluster, alone: were the check after the strategy,
    MultiWorkerMirroredStrategy would wait for the missing peer; it exits at once instead, and
    counts the replicas as the strategy would (2 machines x 1 CPU)."""
    cluster = vertex_cluster(1)
    started = time.monotonic()
    done = trainer(
        synthetic_dir,
        tmp_path,
        151,
        tf_config=json.dumps({"cluster": cluster, "task": {"type": "chief", "index": 0}}),
    )
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-3000:]
    (line,) = error_lines(done)
    assert (
        "--per_replica_batch_size 151 x 2 replicas = a global batch of 302, more than the 300 images" in line
    )
    assert line.endswith("the largest --per_replica_batch_size that fits is 150"), line
    assert time.monotonic() - started < 120


@pytest.mark.serial
def test_a_global_batch_of_exactly_the_split_trains(synthetic_dir: Path, tmp_path: Path) -> None:
    done = trainer(synthetic_dir, tmp_path, TRAIN_IMAGES)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    metrics = json.loads((tmp_path / "model" / "metrics.json").read_text())
    assert metrics["global_batch_size"] == TRAIN_IMAGES and metrics["epochs_completed"] == 1
    assert "global batch 300, 1 steps/epoch" in done.stdout, done.stdout[-3000:]


@pytest.mark.parametrize(
    ("per_replica", "replicas", "fits", "words"),
    [
        (300, 1, True, ""),
        (150, 2, True, ""),
        (301, 1, False, "the largest --per_replica_batch_size that fits is 300"),
        (76, 4, False, "x 4 replicas = a global batch of 304, more than the 300 images"),
        (76, 4, False, "the largest --per_replica_batch_size that fits is 75"),
        (1, 301, False, "no --per_replica_batch_size fits 301 replicas: use fewer replicas or more data"),
    ],
)
def test_the_rule(synthetic_dir: Path, per_replica: int, replicas: int, fits: bool, words: str) -> None:
    meta = datasetinfo.read_metadata(str(synthetic_dir))
    if fits:
        data.check_global_batch(meta, per_replica, replicas, "d")
        return
    with pytest.raises(data.BatchTooLarge) as refused:
        data.check_global_batch(meta, per_replica, replicas, "d")
    assert words in str(refused.value) and "\n" not in str(refused.value)
