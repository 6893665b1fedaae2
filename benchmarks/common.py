"""What every benchmark shares: paths, the machine's description, the result file, and
running one side of a comparison in its own process with its peak memory measured.

Nothing here imports TensorFlow: the runner stays light and every measurement happens in a
child process (`python -m benchmarks.child MODULE:FUNCTION ...`).
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from local import ROOT

RESULTS_DIR = ROOT / "benchmarks" / "results"
BENCHMARKS_MD = ROOT / "BENCHMARKS.md"
WORK_DIR = Path(os.environ.get("BENCH_WORK_DIR", ROOT / "build" / "bench"))
"""Datasets the benchmarks build (cached between runs: `/build/` is git-ignored) and logs."""

RESULT_KEYS = ("name", "inputs", "machine", "figures", "ratio", "goal", "goal_met", "when")
"""Keys every result file has. Optional: `summary` (one line for the table), `skipped` (why
it did not run), `notes`."""
MACHINE_KEYS = ("cpu_count", "cpu_model", "python", "tensorflow", "gpu")

MIB = 1024 * 1024


def say(message: str) -> None:
    """Progress on the terminal (the runner's only output besides the result files)."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)  # noqa: T201


# --- the machine ----------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_names() -> list[str]:
    """NVIDIA GPUs as `nvidia-smi` names them; empty without a driver (no TensorFlow import)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / MIB, 1)
    except OSError:
        pass
    return None


def machine_info() -> dict[str, Any]:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    gpus = gpu_names()
    return {
        "cpu_count": usable,
        "cpu_model": cpu_model(),
        "python": platform.python_version(),
        "tensorflow": _version("tensorflow"),
        "gpu": gpus[0] if gpus else None,
        "gpu_count": len(gpus),
        "memory_gib": _memory_gib(),
        "platform": platform.platform(),
    }


# --- results --------------------------------------------------------------------------------


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def resnet50_config(data_dir: str, image_size: int, batch_size: int, mixed_precision: bool, xla: bool) -> Any:
    """The trainer's TrainConfig for the ResNet50 side of the train and gpu benchmarks: random
    weights (no download), every layer trained, nothing written."""
    from trainer.config import TrainConfig

    return TrainConfig(
        data_dir=data_dir,
        model_dir="unused",
        checkpoint_dir="unused",
        tensorboard_dir="unused",
        per_replica_batch_size=batch_size,
        image_size=image_size,
        backbone="resnet50",
        weights="none",
        fine_tune_fraction=1.0,
        mixed_precision=mixed_precision,
        xla=xla,
    )


def make_result(
    name: str,
    *,
    inputs: Mapping[str, Any],
    figures: Mapping[str, Any],
    ratio: float | None,
    goal: Mapping[str, Any],
    goal_met: bool | None,
    machine: Mapping[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    result = {
        "name": name,
        "inputs": dict(inputs),
        "machine": dict(machine if machine is not None else machine_info()),
        "figures": dict(figures),
        "ratio": None if ratio is None else round(float(ratio), 3),
        "goal": dict(goal),
        "goal_met": goal_met,
        "when": now_iso(),
        **{k: v for k, v in extra.items() if v is not None},  # e.g. no `notes` when there are none
    }
    problems = validate_result(result)
    if problems:
        raise ValueError(f"result of benchmark {name!r} is malformed: {'; '.join(problems)}")
    return result


def validate_result(result: Any) -> list[str]:
    """What is wrong with a result file's content (empty when nothing is)."""
    if not isinstance(result, dict):
        return [f"expected a JSON object, got {type(result).__name__}"]
    problems = [f"missing key {k!r}" for k in RESULT_KEYS if k not in result]
    if problems:
        return problems
    if not isinstance(result["name"], str) or not result["name"]:
        problems.append("name must be a non-empty string")
    for key in ("inputs", "machine", "figures", "goal"):
        if not isinstance(result[key], dict):
            problems.append(f"{key} must be an object")
    if isinstance(result["machine"], dict):
        problems += [f"machine lacks {k!r}" for k in MACHINE_KEYS if k not in result["machine"]]
    ratio = result["ratio"]
    if ratio is not None and (isinstance(ratio, bool) or not isinstance(ratio, int | float) or ratio <= 0):
        problems.append(f"ratio must be a positive number or null, got {ratio!r}")
    if result["goal_met"] not in (True, False, None):
        problems.append(f"goal_met must be true, false or null, got {result['goal_met']!r}")
    if "skipped" in result and not (isinstance(result["skipped"], str) and result["skipped"]):
        problems.append("skipped, when present, must say why")
    try:
        datetime.datetime.fromisoformat(str(result["when"]))
    except ValueError:
        problems.append(f"when must be an ISO timestamp, got {result['when']!r}")
    return problems


def write_result(result: Mapping[str, Any], results_dir: Path = RESULTS_DIR) -> Path:
    problems = validate_result(dict(result))
    if problems:
        raise ValueError(f"refusing to write a malformed result: {'; '.join(problems)}")
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{result['name']}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def load_results(results_dir: Path = RESULTS_DIR) -> dict[str, dict[str, Any]]:
    results = {}
    for path in sorted(results_dir.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        problems = validate_result(data)
        if problems:
            raise ValueError(f"{path}: {'; '.join(problems)}")
        results[data["name"]] = data
    return results


# --- child processes ------------------------------------------------------------------------


class ChildError(RuntimeError):
    """A measurement process failed; the message ends with the tail of its output."""


@dataclasses.dataclass
class ChildRun:
    figures: dict[str, Any]
    peak_rss_mib: float
    """The process's peak resident memory (its own, from wait4's rusage)."""
    wall_seconds: float
    """Process start to exit, TensorFlow import included."""
    log: Path
    other_cpu_share: float | None = None
    """The share of the machine's CPU time that other processes used while this one ran
    (0: the machine was ours; 0.5 on 2 CPUs: something else kept a whole CPU busy)."""

    def merged(self) -> dict[str, Any]:
        """The child's figures plus what the parent measured about it."""
        return {**self.figures, "peak_rss_mib": self.peak_rss_mib, "other_cpu_share": self.other_cpu_share}


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("TF_USE_LEGACY_KERAS", "1")
    env.update(extra or {})
    return env


def run_child(
    target: str,
    kwargs: Mapping[str, Any],
    *,
    log: Path,
    timeout: float = 1800,
    env: Mapping[str, str] | None = None,
) -> ChildRun:
    """Runs `target` ("module:function") with `kwargs` in a fresh Python process.

    The function returns a JSON-able dict of figures; the process's peak RSS comes from the
    kernel's accounting of that one child (`os.wait4`), so sides never share a high-water mark.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-child-") as tmp:
        args_path, out_path = Path(tmp) / "args.json", Path(tmp) / "figures.json"
        args_path.write_text(json.dumps(dict(kwargs)), encoding="utf-8")
        busy_before = _cpu_busy_seconds()
        started = time.perf_counter()
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.child", target, str(args_path), str(out_path)],
                cwd=ROOT,
                env=child_env(env),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
            timer = threading.Timer(timeout, proc.kill)
            timer.start()
            try:
                _, status, usage = os.wait4(proc.pid, 0)
            finally:
                timer.cancel()
            proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - started
        busy_after = _cpu_busy_seconds()
        if proc.returncode != 0:
            why = "timed out" if wall >= timeout else f"exited with {proc.returncode}"
            raise ChildError(f"{target} {why}; last output ({log}):\n{tail(log)}")
        figures = json.loads(out_path.read_text(encoding="utf-8"))
    # ru_maxrss is in KiB on Linux.
    return ChildRun(
        figures=figures,
        peak_rss_mib=round(usage.ru_maxrss / 1024, 1),
        wall_seconds=wall,
        log=log,
        other_cpu_share=_other_share(busy_before, busy_after, usage.ru_utime + usage.ru_stime, wall),
    )


def _cpu_busy_seconds() -> float | None:
    """CPU seconds the whole machine has spent busy since boot (/proc/stat)."""
    try:
        with open("/proc/stat", encoding="utf-8") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _other_share(before: float | None, after: float | None, own_cpu: float, wall: float) -> float | None:
    if before is None or after is None or wall <= 0:
        return None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    others = max(0.0, (after - before) - own_cpu)
    return round(min(1.0, others / (wall * cpus)), 3)


BUSY_SHARE = 0.15


def busy_note(runs: Iterable[Mapping[str, Any]]) -> str | None:
    """A warning for the table when other processes took a noticeable share of the CPUs."""
    shares = [r["other_cpu_share"] for r in runs if r.get("other_cpu_share") is not None]
    if not shares or max(shares) < BUSY_SHARE:
        return None
    return (
        f"Other processes used up to {max(shares):.0%} of the CPUs during these runs "
        "(figures.runs[].other_cpu_share): the figures are noisy"
    )


def local_run_command(folder: Path, *flags: str) -> list[str]:
    """What `make run` runs with no project configured, into `folder`'s own runs folder and
    registry (`folder/runs`, `folder/registry`), with extra pipeline `flags`."""
    return [
        sys.executable,
        "-m",
        "launch.cli",
        "run",
        "--target",
        "local",
        "--runs_dir",
        str(folder / "runs"),
        "--registry_dir",
        str(folder / "registry"),
        *flags,
    ]


def tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no output)"
    return "\n".join(text.splitlines()[-lines:])


def peak_rss_self_mib() -> float | None:
    """This process's peak RSS so far (VmHWM), for figures reported from inside a child."""
    try:
        with open("/proc/self/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def rss_self_mib() -> float | None:
    """This process's current RSS (VmRSS)."""
    try:
        with open("/proc/self/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def best(runs: Sequence[Mapping[str, Any]], key: str) -> float:
    """The highest figure among repeated runs: the least disturbed by a noisy machine."""
    return max(float(r[key]) for r in runs)
