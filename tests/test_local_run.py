"""The local target end to end, as a user runs it: `python -m launch.cli run` (what `make run`
calls) with no Google Cloud configuration; a replica killed mid-training; a failing step."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks import charfolder
from local import jobs
from tests.conftest import FAST_TRAIN_FLAGS

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.serial


def cli_command(runs: Path, *flags: str) -> list[str]:
    """What `make run` runs, into a private runs folder and registry."""
    registry = str(runs / "registry")
    return [
        sys.executable,
        "-m",
        "launch.cli",
        "run",
        "--runs_dir",
        str(runs),
        "--registry_dir",
        registry,
        *flags,
    ]


NO_PROJECT = {k: v for k, v in os.environ.items() if k != "PROJECT_ID"}


def cli(runs: Path, *flags: str, timeout: float = 540) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cli_command(runs, *flags),
        cwd=ROOT,
        env=NO_PROJECT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def summary(runs: Path) -> dict[str, Any]:
    return json.loads((runs / "latest" / "summary.json").read_text())


# Two full runs, the second tuned: 250 to 300 s on a loaded clean clone (2026-11-28), near pytest's default 600.
@pytest.mark.timeout(1200)
def test_make_run_on_an_image_folder_then_tuned_registers_two_versions(tmp_path: Path) -> None:
    """`make run ARGS="--dataset_source folder:PATH"` and nothing else, then the same folder tuned.

    The folder is eight characters whose class depends on orientation, tilted, blurred and in
    twelve faces (benchmarks/charfolder.py). `make bench BENCH=folder` measured 0.977 with the
    defaults and 0.953 after 60 epochs on this folder, and five more runs of this command
    0.95-1.00 (two replicas do not train in the same order twice), one on a loaded machine 0.89;
    the former backbone and defaults ended near chance (0.15) on such a folder, so 0.85 still
    tells a learning run from a broken one. The first run carries every assertion on what a
    default run shows and leaves (screen, summary, registry, report); the second, what a second
    run does with a champion there (the gate compares both on this run's test split)."""
    data = charfolder.render(tmp_path / "chars", "hard", seed=0)
    runs = tmp_path / "runs"
    first = cli(runs, "--dataset_source", f"folder:{data}")
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-3000:]
    screen = first.stdout.splitlines()
    assert screen[0].startswith("make run: running the pipeline LOCALLY")
    # A console a person reads: a line per step, progress, results; the rest is in the logs.
    assert len(screen) <= 60, first.stdout
    for noise in ("I0000", "port.cc", "cuInit", "absl::InitializeLog", "config: {", "\x1b", "\r"):
        assert noise not in first.stdout, noise
    shown = [line.strip() for line in screen]
    assert any("PROMOTE: " in line for line in screen) and screen[-2].startswith("summary: ")
    logs = runs / "latest" / "logs"
    assert (
        "I0000" in (logs / "train-model.log").read_text()
        or "config: {" in (logs / "train-model.log").read_text()
    )
    s = summary(runs)
    assert s["status"] == "SUCCEEDED" and s["target"] == "local"
    metrics = s["metrics"]
    assert metrics["test_accuracy"] >= 0.85 and metrics["macro_f1"] >= 0.85, metrics
    assert sorted(metrics["per_class"]) == sorted(charfolder.CLASSES)
    # Every class learnt, the mirror pairs included, well above chance (0.125); one class's
    # recall moves by 1/16 per image, and went as low as 0.75 in those runs.
    assert all(m["recall"] >= 0.5 for m in metrics["per_class"].values()), metrics["per_class"]
    assert metrics["num_workers"] == 2  # one chief and one worker, really distributed
    # The local default trains up to 30 epochs and stops after 5 without improvement; this
    # folder's validation split is learnt in about ten (val_accuracy reaches 1.0), so the run
    # stops early and says so, and which epoch it exports.
    completed, best = metrics["epochs_completed"], metrics["best_epoch"]
    assert metrics["stopped_early"] is True and completed == best + 5 < 30, metrics
    assert f"epoch {completed}/30 done" in "\n".join(shown), first.stdout
    assert f"epoch {completed + 1}/30 done" not in "\n".join(shown), first.stdout
    assert any(
        line.startswith("early stopping: no improvement of val_accuracy for 5 epochs") for line in shown
    )
    assert any(line.startswith(f"exporting epoch {best} (best val_accuracy=") for line in shown)
    assert s["model"]["version"] == "1" and s["model"]["champion"] is True
    steps = {step["name"]: step for step in s["steps"]}
    steps_run = ("build-trainer-image", "prepare-dataset", "train-model", "evaluate-models", "evaluate-model")
    for name in (*steps_run, "upload-model"):
        assert steps[name]["status"] == "SUCCESS" and steps[name]["seconds"] > 0
    assert "tune-hyperparameters" not in steps
    version = Path(s["model"]["path"])
    record = json.loads((version / "version.json").read_text())
    assert len(record["serving_check"]) == 5 and (version / "model" / "saved_model.pb").exists()
    assert list(record["evaluation"]["models"]) == ["challenger"]  # no champion to compare with yet
    assert record["description"].startswith("Promoted on accuracy over this run's test split")
    # No augmentation for a folder (auto): a flip would turn a b into a d.
    assert json.loads((version / "model" / "config.json").read_text())["augment"] == "none"
    aliases = runs / "registry" / "cassava-classifier" / "aliases.json"
    assert json.loads(aliases.read_text()) == {"default": "1", "champion": "1"}
    report = Path(s["report"]).read_text()
    # curves, confusion matrix, the steps' timeline
    assert len(re.findall(r"src='data:image/png;base64,iVBOR", report)) == 3
    assert s["wall_seconds"] > 0 and (runs / "latest").resolve() == Path(s["report"]).parent

    # New images of the same classes, fewer (20 to train, 4 to test per class: the carved
    # validation split still holds a global batch), the chief alone (the first run showed two
    # workers) and two epochs (it showed the defaults): tuning, two trials at once and the
    # training with the best one, in less of make test.
    fewer = tmp_path / "fewer"
    for split, count in (("train", 20), ("test", 4)):
        for label in sorted((data / split).iterdir()):
            (fewer / split / label.name).mkdir(parents=True)
            for image in sorted(label.iterdir())[:count]:
                shutil.copyfile(image, fewer / split / label.name / image.name)
    second = cli(
        runs,
        *("--dataset_source", f"folder:{fewer}"),
        *("--tune", "true", "--max_trial_count", "2", "--parallel_trial_count", "2"),
        *("--worker_count", "0", "--epochs", "2"),
    )
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-3000:]
    t = summary(runs)
    assert t["run_id"] != s["run_id"] and t["model"]["version"] == "2"
    # The gate compared both models on this run's test split: version 1 was evaluated again.
    evaluated = json.loads((Path(t["model"]["path"]) / "version.json").read_text())["evaluation"]
    assert sorted(evaluated["models"]) == ["challenger", "champion"]
    assert s["gate"]["champion_score"] == -1.0 and s["gate"]["metric"] == "accuracy"
    gate = t["gate"]
    assert gate["champion_score"] == evaluated["models"]["champion"]["accuracy"]
    assert gate["score"] == evaluated["models"]["challenger"]["accuracy"]
    assert evaluated["models"]["champion"]["examples"] == evaluated["models"]["challenger"]["examples"] > 0
    assert any(line.strip().startswith("evaluated champion: accuracy") for line in second.stdout.splitlines())
    # Two epochs of one replica on so few images do not reach the champion: version 2 is
    # registered and the champion alias stays on version 1; the decision follows the scores.
    promoted = gate["score"] >= max(gate["champion_score"], 0.9)  # min_score's default
    assert gate["promote"] is promoted and t["model"]["champion"] is promoted, gate
    champion = "2" if promoted else "1"
    assert json.loads(aliases.read_text()) == {"default": champion, "champion": champion}
    trials = t["tuning"]["trials"]
    assert len(trials) >= 2 and all(tr["state"] in ("SUCCEEDED", "INFEASIBLE") for tr in trials)
    best = t["tuning"]["best"]
    for name, value in best["hyperparameters"].items():
        assert t["training_hyperparameters"][name] == pytest.approx(float(value)), name
    assert len(re.findall(r"src='data:image/png;base64,iVBOR", Path(t["report"]).read_text())) == 4


def find_replica(job_id: str, role: str) -> int | None:
    """The pid of a replica of `job_id` (its CLOUD_ML_JOB_ID) with this TF_CONFIG task type."""
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
    return None


class KillOnLine(io.StringIO):
    """The job's screen: SIGKILLs the worker the first time epoch 2 starts."""

    def __init__(self, job_id: str) -> None:
        super().__init__()
        self.job_id, self.killed = job_id, threading.Event()

    def write(self, text: str) -> int:
        if not self.killed.is_set() and "worker-0] epoch 2/" in text and "started" in text:
            pid = find_replica(self.job_id, "worker")
            if pid:
                os.kill(pid, signal.SIGKILL)
                self.killed.set()
        return super().write(text)


def test_a_replica_killed_mid_training_restarts_the_job_which_resumes(
    synthetic_dir: Path, tmp_path: Path
) -> None:
    job_id = f"fault-{os.getpid()}-{time.time_ns()}"
    flags = [f"--data_dir={synthetic_dir}", *FAST_TRAIN_FLAGS]  # three epochs: killed in the second
    container = {"image_uri": "img", "command": ["python", "-m", "trainer.task"], "args": flags}
    specs = [
        {"replica_count": 1, "container_spec": container},
        {"replica_count": 1, "container_spec": container},
    ]
    screen = KillOnLine(job_id)
    result = jobs.run_job(
        specs,
        str(tmp_path / "job"),
        display_name="train",
        project="local",
        log_dir=tmp_path / "logs",
        timeout="400s",
        restart_job_on_worker_restart=True,
        job_id=job_id,
        out=screen,
    )
    output = screen.getvalue()
    assert screen.killed.is_set(), output[-3000:]
    assert result.attempts == 2, output[-3000:]
    assert "restarting the whole job" in output
    metrics = json.loads((tmp_path / "job" / "model" / "metrics.json").read_text())
    assert metrics["epochs_completed"] == 3
    # The second attempt resumed from the backup instead of starting again at epoch 1.
    second_attempt = output.split("restarting the whole job")[1]
    assert "[train chief-0] [chief-0] epoch 1/3 started" not in second_attempt
    assert re.search(r"\[train chief-0\] \[chief-0\] epoch [23]/3 started", second_attempt)


def test_a_failing_step_fails_the_run_with_its_log_tail(tmp_path: Path) -> None:
    """An image whose header is sound and whose data is not: the launcher's up-front check reads
    headers only (trainer.preparation.sourcecheck), so the preparation job is the one to find it, and fail."""
    from PIL import Image

    images = tmp_path / "images"
    for name in ("cat", "dog"):
        (images / "train" / name).mkdir(parents=True)
        for i in range(30):  # enough for the default global batch of 32
            Image.new("RGB", (16, 16), (i * 8, 40 if name == "cat" else 200, 0)).save(
                images / "train" / name / f"{i}.png"
            )
    good = (images / "train" / "cat" / "0.png").read_bytes()
    (images / "train" / "cat" / "broken.png").write_bytes(good[:40] + b"\x00" * 60)  # IHDR kept
    result = cli(tmp_path / "runs", "--dataset_source", f"folder:{images}", timeout=240)
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    out = result.stdout
    assert "FAILED: step prepare-dataset failed" in out
    assert "replica chief-0 exited with status 1" in out  # the job's own report, from the step log
    assert "kfp/local/pipeline_orchestrator.py" not in out + result.stderr  # no traceback from inside kfp
    s = summary(tmp_path / "runs")
    assert s["status"] == "FAILED" and s["error"].startswith("step prepare-dataset failed: JobFailed: ")
    assert "replica chief-0 exited with status 1" in s["error"]  # the true cause, in the summary too
    assert [st["name"] for st in s["steps"] if st["status"] != "SUCCESS"] == ["prepare-dataset"]
    assert s["model"] is None


def test_bad_flags_stop_before_any_step(tmp_path: Path) -> None:
    result = cli(
        tmp_path / "runs",
        "--worker_accelerator_count",
        "1",
        "--worker_accelerator_type",
        "NVIDIA_TESLA_T4",
        timeout=60,
    )
    assert result.returncode == 2
    assert (
        "workerpool1 (worker) asked for 1 x NVIDIA_TESLA_T4" in result.stderr
        and "sees 0 GPUs" in result.stderr
    )
    assert not (tmp_path / "runs").exists()
    result = cli(tmp_path / "runs", "--epochs", "many", timeout=60)
    assert result.returncode == 2 and "--epochs" in result.stderr


def test_ctrl_c_stops_the_run_and_every_replica(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    # Its own process group, like a terminal's foreground job: Ctrl-C signals the whole group.
    proc = subprocess.Popen(
        cli_command(runs, "--epochs", "50", "--verbose"),  # every replica line, to catch epoch 1's start
        cwd=ROOT,
        env=NO_PROJECT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    for line in proc.stdout:
        lines.append(line)
        if "[train-model chief-0]" in line and "epoch 1/50 started" in line:
            break
    else:
        pytest.fail("training never started:\n" + "".join(lines[-40:]))
    replicas = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _is_replica(p, runs)]
    assert len(replicas) == 2, "expected the chief and the worker to be running"
    os.killpg(proc.pid, signal.SIGINT)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, "".join(lines[-20:]) + rest[-3000:]
    time.sleep(1)
    assert not [
        pid
        for pid in replicas
        if Path(f"/proc/{pid}").exists() and "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    ]
    assert summary(runs)["status"] == "CANCELLED"


def _is_replica(proc_dir: Path, runs: Path) -> bool:
    try:
        environ = (proc_dir / "environ").read_bytes()
    except OSError:
        return False
    return b"CLOUD_ML_JOB_ID=local-train-model" in environ and str(runs).encode() in environ
