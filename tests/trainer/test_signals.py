"""SIGTERM and SIGKILL in real trainer and preparation processes, run by the local job runner as
Vertex runs a CustomJob: a replica stopped mid-training saves its backup at once and the
restarted job resumes at the next step; a cancelled job publishes nothing and leaves nothing
behind; a preparation replica killed once is restarted."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from local import jobs
from tests.conftest import FAST_TRAIN_FLAGS

pytestmark = pytest.mark.serial

# 2 images per replica and step: 75 steps per epoch of the 300 training images, so that a stop
# requested early in an epoch lands well inside it (the replicas look for one about every second).
STEPS = 75


def train_specs(data_dir: Path, epochs: int, per_replica_batch_size: int = 2) -> list[dict[str, Any]]:
    flags = [
        f"--data_dir={data_dir}",
        *[f for f in FAST_TRAIN_FLAGS if not f.startswith(("--epochs", "--per_replica_batch_size"))],
        f"--per_replica_batch_size={per_replica_batch_size}",
        f"--epochs={epochs}",
    ]
    container = {"image_uri": "img", "command": ["python", "-m", "trainer.task"], "args": flags}
    return [
        {"replica_count": 1, "container_spec": container},
        {"replica_count": 1, "container_spec": container},
    ]


def find_replica(job_id: str, role: str) -> int:
    """The pid of the replica of `job_id` (its CLOUD_ML_JOB_ID) with this TF_CONFIG task type."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"CLOUD_ML_JOB_ID={job_id}".encode() in environ and any(
            e.startswith(b"TF_CONFIG=") and f'"type": "{role}"'.encode() in e for e in environ
        ):
            return int(entry.name)
    raise AssertionError(f"no {role} replica of {job_id} is running")


class Screen(io.StringIO):
    """The job's screen: runs `action` the first time a line matches `pattern`, and keeps the
    time of the first line with each of `timed`."""

    def __init__(self, pattern: str, action: Callable[[], None], timed: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.pattern, self.action, self.timed = re.compile(pattern), action, timed
        self.fired: float | None = None
        self.seen: dict[str, float] = {}
        self.lock = threading.Lock()

    def write(self, text: str) -> int:
        with self.lock:
            if self.fired is None and self.pattern.search(text):
                self.fired = time.monotonic()
                self.action()
            for t in self.timed:
                if t in text:
                    self.seen.setdefault(t, time.monotonic())
            return super().write(text)


@pytest.fixture
def machine_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private TMPDIR for the runner and what it starts: it must stay empty."""
    folder = tmp_path / "machine-tmp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    return folder


def assert_nothing_left(tmp_path: Path, machine_tmp: Path) -> None:
    from trainer import storage  # TensorFlow: not at collection

    model = tmp_path / "job" / "model"
    assert storage.leftovers(str(model)) == [], "an interrupted export left its staging folder"
    assert list(machine_tmp.iterdir()) == [], "something was left in TMPDIR"
    assert not (tmp_path / "logs" / ".tmp").exists(), "the replicas' temporary folders were not deleted"


def test_the_runner_and_the_trainer_agree_on_the_exit_status_of_a_stop() -> None:
    from trainer.callbacks import TERMINATED_EXIT_CODE

    assert jobs.TERMINATED == TERMINATED_EXIT_CODE == 143


def test_sigterm_to_one_replica_saves_at_once_and_the_restarted_job_resumes_mid_epoch(
    synthetic_dir: Path, tmp_path: Path, machine_tmp: Path
) -> None:
    job_id = f"sigterm-{os.getpid()}-{time.time_ns()}"
    restart = "restarting the whole job"
    # SIGTERM to the worker alone, as Vertex stops one replica's VM, early in the first epoch.
    screen = Screen(
        rf"\[worker-0\]   step 7/{STEPS} ",
        lambda: os.kill(find_replica(job_id, "worker"), signal.SIGTERM),
        timed=(restart,),
    )
    result = jobs.run_job(
        train_specs(synthetic_dir, epochs=1),
        str(tmp_path / "job"),
        display_name="train",
        project="local",
        log_dir=tmp_path / "logs",
        timeout="300s",
        restart_job_on_worker_restart=True,
        job_id=job_id,
        out=screen,
    )
    out = screen.getvalue()
    assert screen.fired is not None, out[-3000:]
    assert result.attempts == 2, out[-3000:]
    # It exited by itself, with the trainer's status, within seconds (not SIGKILLed after the
    # runner's 10 s grace period, which would read "killed by signal 9").
    # (Either replica may be the one the runner sees first: both stop.)
    assert re.search(rf"(chief|worker)-0 exited with status 143 \(it stopped on SIGTERM\): {restart}", out), (
        out[-3000:]
    )
    assert screen.seen[restart] - screen.fired < 10
    # Both replicas saved the backup at the same step, the chief having learnt of the signal
    # from the worker, and the restarted job resumed at the next step of the same epoch.
    first, second = out.split(restart, 1)
    saved = re.search(
        rf"\[worker-0\] SIGTERM received by this replica: backing up epoch 1 at step (\d+)/{STEPS}", first
    )
    assert saved, first[-3000:]
    step = int(saved.group(1))
    assert 7 <= step < STEPS
    assert (
        f"[chief-0] SIGTERM received by another replica: backing up epoch 1 at step {step}/{STEPS}" in first
    )
    assert "published" not in first
    assert f"[train chief-0] [chief-0] epoch 1/1 resumed from the backup at step {step + 1}" in second, (
        second[:3000]
    )
    assert f"[train worker-0] [worker-0] epoch 1/1 resumed from the backup at step {step + 1}" in second
    metrics = json.loads((tmp_path / "job" / "model" / "metrics.json").read_text())
    assert metrics["epochs_completed"] == 1
    assert_nothing_left(tmp_path, machine_tmp)


def test_a_job_cancelled_as_training_ends_publishes_nothing_and_leaves_nothing(
    synthetic_dir: Path, tmp_path: Path, machine_tmp: Path
) -> None:
    """Ctrl-C (here the runner's `cancel`) as the last epoch ends, where the chief used to go on
    to publish a complete model into a run reported CANCELLED."""
    cancel = threading.Event()
    screen = Screen(r"\[chief-0\] epoch 1/1 done", cancel.set)
    with pytest.raises(jobs.JobCancelled):
        jobs.run_job(
            train_specs(synthetic_dir, epochs=1, per_replica_batch_size=8),
            str(tmp_path / "job"),
            display_name="train",
            project="local",
            log_dir=tmp_path / "logs",
            timeout="300s",
            restart_job_on_worker_restart=True,
            out=screen,
            cancel=cancel,
        )
    out = screen.getvalue()
    assert screen.fired is not None, out[-3000:]
    assert not (tmp_path / "job" / "model").exists(), out[-3000:]
    for name in ("chief-0", "worker-0"):
        log = (tmp_path / "logs" / f"{name}.log").read_text()
        assert "SIGTERM received" in log and "exiting with status 143" in log, log[-3000:]
    assert "published" not in out and "restarting" not in out
    assert_nothing_left(tmp_path, machine_tmp)


def test_a_preparation_replica_killed_once_is_restarted_and_the_job_succeeds(
    tmp_path: Path, machine_tmp: Path
) -> None:
    """The preparation job (one replica, restart_job_on_worker_restart=False in pipeline.py):
    Vertex restarts a replica's VM whatever that setting; its publish is atomic, so a restart
    is safe."""
    job_id = f"prepare-{os.getpid()}-{time.time_ns()}"
    args = ["--source=synthetic", "--image_size=32", "--synthetic_per_class=12", "--shards=2", "--overwrite"]
    container = {"image_uri": "img", "command": ["python", "-m", "trainer.prepare"], "args": args}
    screen = Screen(
        r"\[prepare chief-0\] prepare: ", lambda: os.kill(find_replica(job_id, "chief"), signal.SIGKILL)
    )
    result = jobs.run_job(
        [{"replica_count": 1, "container_spec": container}],
        str(tmp_path / "job"),
        display_name="prepare",
        project="local",
        log_dir=tmp_path / "logs",
        timeout="300s",
        restart_job_on_worker_restart=False,
        job_id=job_id,
        out=screen,
    )
    out = screen.getvalue()
    assert result.attempts == 1, out[-3000:]
    assert "chief-0 was killed by signal 9 (SIGKILL): restarting it" in out, out[-3000:]
    assert (tmp_path / "job" / "model" / "metadata.json").exists()
    assert_nothing_left(tmp_path, machine_tmp)
