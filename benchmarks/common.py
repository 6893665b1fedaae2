"""What every benchmark shares: paths, the machine's description, the result file, running
one side of a comparison in its own process with its peak memory measured, and the local run.

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
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from local import ROOT
from local.gpus import local_gpus

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


# --- the machine ---------------------------------------------------------------------------


def _proc_value(path: str, key: str) -> str | None:
    """The value of `key` in a `key: value` /proc file (cpuinfo, meminfo, status)."""
    try:
        with open(path, encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith(key)), None)
    except OSError:
        return None


def _from_kib(value: str | None, unit: int = 1024) -> float | None:
    """A /proc figure in KiB ("123 kB") in `unit` KiB (MiB by default)."""
    return round(int(value.split()[0]) / unit, 1) if value else None


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def machine_info() -> dict[str, Any]:
    gpus = local_gpus()  # from the NVIDIA driver, no TensorFlow import
    try:
        tensorflow: str | None = importlib.metadata.version("tensorflow")
    except importlib.metadata.PackageNotFoundError:
        tensorflow = None
    return {
        "cpu_count": _cpus(),
        "cpu_model": _proc_value("/proc/cpuinfo", "model name") or platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "tensorflow": tensorflow,
        "gpu": gpus[0] if gpus else None,
        "gpu_count": len(gpus),
        "memory_gib": _from_kib(_proc_value("/proc/meminfo", "MemTotal:"), MIB),
        "platform": platform.platform(),
    }


# --- results --------------------------------------------------------------------------------


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
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
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


# --- processes ------------------------------------------------------------------------------


class ChildError(RuntimeError):
    """A measurement process failed; the message ends with the tail of its output."""


def _run(
    command: Sequence[str], log: Path, timeout: float, env: Mapping[str, str] | None = None
) -> tuple[int, float, Any, float | None]:
    """Runs `command`, output into `log`: (exit code, wall seconds, its own `os.wait4` rusage, the
    share of the machine's CPU time other processes used meanwhile)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    busy_before = _cpu_busy_seconds()
    started = time.perf_counter()
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        # SIGTERM first: `make run` stops its replicas (their own sessions) on it, SIGKILL would
        # leave them running; SIGKILL after a grace period.
        timers = [threading.Timer(timeout, proc.terminate), threading.Timer(timeout + 60, proc.kill)]
        for timer in timers:
            timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            for timer in timers:
                timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - started
    busy_after = _cpu_busy_seconds()
    other = None
    if busy_before is not None and busy_after is not None and wall > 0:
        others = max(0.0, busy_after - busy_before - usage.ru_utime - usage.ru_stime)
        other = round(min(1.0, others / (wall * _cpus())), 3)
    return proc.returncode, wall, usage, other


def _cpu_busy_seconds() -> float | None:
    """CPU seconds the whole machine has spent busy since boot (/proc/stat)."""
    try:
        with open("/proc/stat", encoding="utf-8") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # less idle and iowait


def run_child(
    target: str,
    kwargs: Mapping[str, Any],
    *,
    log: Path,
    timeout: float = 1800,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """`target` ("module:function") called with `kwargs` in a fresh process (`benchmarks.child`): its
    figures plus the process's `peak_rss_mib` (wait4's ru_maxrss) and `other_cpu_share`."""
    with tempfile.TemporaryDirectory(prefix="bench-child-") as tmp:
        args_path, out_path = Path(tmp) / "args.json", Path(tmp) / "figures.json"
        args_path.write_text(json.dumps(dict(kwargs)), encoding="utf-8")
        child_env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
            "PYTHONUNBUFFERED": "1",
            "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
            "TF_USE_LEGACY_KERAS": os.environ.get("TF_USE_LEGACY_KERAS", "1"),
            **(env or {}),
        }
        command = [sys.executable, "-m", "benchmarks.child", target, str(args_path), str(out_path)]
        code, wall, usage, other = _run(command, log, timeout, child_env)
        if code != 0:
            why = "timed out" if wall >= timeout else f"exited with {code}"
            raise ChildError(f"{target} {why}; last output ({log}):\n{tail(log)}")
        figures = json.loads(out_path.read_text(encoding="utf-8"))
    # ru_maxrss is in KiB on Linux.
    return {**figures, "peak_rss_mib": round(usage.ru_maxrss / 1024, 1), "other_cpu_share": other}


def alternate(
    bench: str,
    sides: Mapping[str, tuple[str, Mapping[str, Any]]],
    repeats: int,
    work: Path,
    env: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Every run's figures by side: each side (`name: (target, kwargs)`, with `env[name]` added to
    its environment) in its own process (`run_child`), the sides alternating, `repeats` times."""
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for repeat in range(repeats):
        for side, (target, kwargs) in sides.items():
            log = work / "logs" / f"{bench}-{side}-{repeat}.log"
            figures = run_child(target, kwargs, log=log, env=(env or {}).get(side))
            say(
                f"{bench} {side} run {repeat + 1}/{repeats}: {figures['images_per_second']:,.1f} img/s, "
                f"peak RSS {figures['peak_rss_mib']:,.0f} MiB"
            )
            runs[side].append(figures)
    return runs


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


@dataclasses.dataclass
class LocalRun:
    """One local `make run` and what it left."""

    summary: dict[str, Any]
    wall_seconds: float
    other_cpu_share: float | None = None
    log: str = ""


def local_run(folder: Path, *flags: str, log: Path, timeout: float = 3600) -> LocalRun:
    """What `make run` runs with no project configured (`python -m launch.cli run --target local`),
    plus `flags`, into `folder/runs` and `folder/registry`; wall time includes interpreter and imports."""
    runs, registry = str(folder / "runs"), str(folder / "registry")
    command = [sys.executable, "-m", "launch.cli", "run", "--target", "local", "--runs_dir", runs]
    command += ["--registry_dir", registry, *flags]
    code, wall, _, other = _run(command, log, timeout)
    summary = folder / "runs" / "latest" / "summary.json"
    if code != 0 or not summary.exists():
        why = f"timed out after {timeout:.0f} s" if wall >= timeout else f"failed (exit {code})"
        raise RuntimeError(f"{' '.join(command)} {why}; the end of its output ({log}):\n{tail(log)}")
    return LocalRun(json.loads(summary.read_text(encoding="utf-8")), wall, other, str(log))


def tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no output)"
    return "\n".join(text.splitlines()[-lines:])


# --- in the child processes -------------------------------------------------------------------


def rss_self_mib(peak: bool = False) -> float | None:
    """This process's current resident memory (VmRSS), or its peak so far (VmHWM)."""
    return _from_kib(_proc_value("/proc/self/status", "VmHWM:" if peak else "VmRSS:"))


def ours_resnet50(
    image_size: int, batch_size: int, num_classes: int, mixed_precision: bool, xla: bool
) -> Any:
    """(model, strategy, precision policy): the trainer's ResNet50 (random weights, every layer
    trained) built and compiled as `trainer.task.run` does."""
    from trainer import distribute, task
    from trainer import model as model_lib
    from trainer._tf import keras, tf
    from trainer.config import TrainConfig

    strategy = distribute.create_strategy(distribute.ClusterInfo())
    config = TrainConfig(
        data_dir="unused",
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
    precision = task.precision_policy(mixed_precision, bool(tf.config.list_physical_devices("GPU")))
    keras.mixed_precision.set_global_policy(precision)
    with strategy.scope():
        model = model_lib.build_model(config, num_classes, image_size)
        model_lib.compile_model(model, config)
    return model, strategy, precision
