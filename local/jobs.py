"""The local stand-in for a Vertex CustomJob: one process per replica of each worker pool.

Given the same `worker_pool_specs` Vertex receives, it starts every replica of pools 0 and 1 as
a process running the spec's command and args (the trainer from this checkout instead of the
image: `python` becomes this interpreter) with the environment Vertex gives a container:
`TF_CONFIG` (chief = pool 0, worker = pool 1), `CLUSTER_SPEC`, `AIP_MODEL_DIR`,
`AIP_CHECKPOINT_DIR`, `AIP_TENSORBOARD_LOG_DIR` (from the base output directory),
`CLOUD_ML_PROJECT_ID` and `CLOUD_ML_JOB_ID`, on free loopback ports.

Each replica's output is prefixed on screen and saved to `<log_dir>/<role>-<index>.log`. The
job has a timeout; no replica outlives it, whatever ends it (failure, timeout, Ctrl-C,
SIGTERM; and SIGKILL of the runner through PR_SET_PDEATHSIG on Linux). A replica killed by a
signal is what a VM restart looks like: with `restart_job_on_worker_restart` the whole job is
restarted (up to `max_restarts`) and the trainer resumes from its backup in AIP_CHECKPOINT_DIR.
A replica that exits with an error fails the job, as on Vertex.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

CHECKOUT = Path(__file__).resolve().parent.parent
ROLES = ("chief", "worker")  # TF_CONFIG task types of pools 0 and 1


class JobFailed(RuntimeError):
    """The job failed; the message names the replica, its exit and the tail of its log."""


@dataclasses.dataclass(frozen=True)
class Replica:
    pool: int
    index: int
    role: str  # chief / worker
    command: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"


@dataclasses.dataclass
class JobResult:
    attempts: int
    seconds: float
    log_dir: str
    replicas: list[str]


def parse_duration(text: str) -> float:
    """A Vertex duration ("3600s", "1.5s") in seconds."""
    match = re.fullmatch(r"(\d+(\.\d+)?)s", text.strip())
    if not match:
        raise ValueError(f"timeout must be a duration like '3600s', got {text!r}")
    return float(match.group(1))


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def check_worker_pool_specs(specs: Sequence[Mapping[str, Any]]) -> None:
    """Each pool must parse into the real `aiplatform_v1.WorkerPoolSpec`, unknown fields refused,
    as the GCPC launcher's `CustomJob` would have to (a misspelt field, an accelerator name
    that is not in `AcceleratorType`, a fractional count): the local job runs only what Vertex
    would accept. An empty pool is allowed between pools (Vertex: "{}" keeps a pool's place)."""
    from google.cloud import aiplatform_v1
    from google.protobuf import json_format

    problems = []
    for index, spec in enumerate(specs):
        if not spec:
            continue
        try:
            json_format.ParseDict(
                dict(spec),
                aiplatform_v1.WorkerPoolSpec.pb(aiplatform_v1.WorkerPoolSpec()),
                ignore_unknown_fields=False,
            )
        except json_format.ParseError as err:
            problems.append(f"pool {index}: {err}")
    if problems:
        raise ValueError("worker_pool_specs would be refused by Vertex AI: " + "; ".join(problems))


def replicas(specs: Sequence[Mapping[str, Any]], log: Callable[[str], object] = print) -> list[Replica]:
    """The local processes for these worker pool specs (pools 2-3 are noted, not run)."""
    if not specs or not specs[0]:
        raise ValueError("worker_pool_specs needs pool 0 (the chief)")
    check_worker_pool_specs(specs)
    out: list[Replica] = []
    for pool, spec in enumerate(specs):
        if not spec:
            continue
        count = int(spec.get("replica_count", 1))
        if pool >= len(ROLES):
            # Vertex starts them (pool 2: Reduction Server or parameter servers, pool 3: an
            # evaluator); their images (Google's reducer) cannot run here, and TF_CONFIG/
            # CLUSTER_SPEC then name pools 0 and 1 only.
            log(f"pool {pool} ({count} replica(s), {spec['container_spec']['image_uri']}) is not run locally")
            continue
        if pool == 0 and count != 1:
            raise ValueError(f"pool 0 (the chief) must have exactly one replica, got {count}")
        container = spec["container_spec"]
        command = [*container.get("command", []), *container.get("args", [])]
        if not command:
            raise ValueError(f"pool {pool} has no command")
        if command[0] in ("python", "python3"):
            command[0] = sys.executable  # this checkout's environment stands in for the image
        out += [Replica(pool, i, ROLES[pool], tuple(command)) for i in range(count)]
    return out


def replica_env(
    replica: Replica,
    addresses: Mapping[str, list[str]],
    base_output_directory: str,
    project: str,
    job_id: str,
) -> dict[str, str]:
    """What Vertex sets in a replica's container."""
    base = base_output_directory.rstrip("/")
    cluster_spec = {
        "cluster": {f"workerpool{ROLES.index(role)}": hosts for role, hosts in addresses.items()},
        "environment": "cloud",
        "task": {"type": f"workerpool{replica.pool}", "index": replica.index},
        "job": json.dumps({"job_id": job_id}),
    }
    return {
        "TF_CONFIG": json.dumps(
            {
                "cluster": dict(addresses),
                "task": {"type": replica.role, "index": replica.index},
                "environment": "cloud",
            }
        ),
        "CLUSTER_SPEC": json.dumps(cluster_spec),
        "AIP_MODEL_DIR": f"{base}/model/",
        "AIP_CHECKPOINT_DIR": f"{base}/checkpoints/",
        "AIP_TENSORBOARD_LOG_DIR": f"{base}/logs/",
        "CLOUD_ML_PROJECT_ID": project,
        "CLOUD_ML_JOB_ID": job_id,
        "PYTHONUNBUFFERED": "1",
        # TensorFlow's C++ start-up chatter, unless the user asked for it.
        "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
    }


# Each replica starts through this shim, which asks Linux to SIGKILL it when the runner dies
# (PR_SET_PDEATHSIG survives exec), then execs the replica's command. It is a separate step, not
# a preexec_fn: running Python between fork and exec crashes when gRPC (the tuner's aiplatform
# types) is loaded, and forces a plain fork.
_PDEATHSIG_EXEC = (
    "import ctypes, os, signal, sys\n"
    "try:\n"
    "    ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGKILL)\n"
    "except (OSError, AttributeError):\n"
    "    pass\n"
    "os.execvp(sys.argv[1], sys.argv[1:])\n"
)


def _with_parent_death_signal(command: Sequence[str]) -> list[str]:
    if not sys.platform.startswith("linux"):
        return list(command)
    return [sys.executable, "-c", _PDEATHSIG_EXEC, *command]


class _Running:
    def __init__(
        self, replica: Replica, process: subprocess.Popen[str], log_path: Path, tail: deque[str]
    ) -> None:
        self.replica, self.process, self.log_path, self.tail = replica, process, log_path, tail


def _kill_all(running: Sequence[_Running]) -> None:
    for r in running:
        if r.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(r.process.pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    for r in running:
        try:
            r.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(r.process.pid, signal.SIGKILL)
            r.process.wait()


def _pump(stream: TextIO, prefix: str, log_file: TextIO, tail: deque[str], out: TextIO) -> None:
    for line in iter(stream.readline, ""):
        log_file.write(line)
        log_file.flush()
        tail.append(line.rstrip("\n"))
        out.write(f"{prefix}{line}")
        out.flush()


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (kfp.local or a CI runner stopping us) unwinds like Ctrl-C, so replicas die too."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _attempt(
    reps: Sequence[Replica],
    base_output_directory: str,
    project: str,
    job_id: str,
    log_dir: Path,
    deadline: float,
    display_name: str,
    extra_env: Mapping[str, str],
    out: TextIO,
    attempt: int,
) -> tuple[str, _Running | None]:
    """One run of every replica: ("ok"|"restart"|"failed"|"timeout", the replica to blame)."""
    ports = free_ports(len(reps))
    addresses: dict[str, list[str]] = {}
    for rep, port in zip(reps, ports, strict=True):
        addresses.setdefault(rep.role, []).append(f"127.0.0.1:{port}")
    running: list[_Running] = []
    threads: list[threading.Thread] = []
    try:
        for rep in reps:
            env = {
                **os.environ,
                **replica_env(rep, addresses, base_output_directory, project, job_id),
                **extra_env,
            }
            log_path = log_dir / f"{rep.name}.log"
            log_file = log_path.open("a")
            log_file.write(f"--- attempt {attempt}: {' '.join(rep.command)}\n")
            process = subprocess.Popen(
                _with_parent_death_signal(rep.command),
                cwd=CHECKOUT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                bufsize=1,
                start_new_session=True,  # its own process group: stopped as one, spared the terminal's Ctrl-C
            )
            tail: deque[str] = deque(maxlen=40)
            running.append(_Running(rep, process, log_path, tail))
            assert process.stdout is not None
            thread = threading.Thread(
                target=_pump,
                args=(process.stdout, f"[{display_name} {rep.name}] ", log_file, tail, out),
                daemon=True,
            )
            thread.start()
            threads.append(thread)
        while True:
            codes = [r.process.poll() for r in running]
            for r, code in zip(running, codes, strict=True):
                if code is not None and code < 0:
                    return "restart", r
                if code is not None and code > 0:
                    return "failed", r
            if all(code == 0 for code in codes):
                return "ok", None
            if time.monotonic() > deadline:
                return "timeout", None
            time.sleep(0.2)
    finally:
        _kill_all(running)
        for thread in threads:
            thread.join(timeout=5)


def run_job(
    worker_pool_specs: Sequence[Mapping[str, Any]],
    base_output_directory: str,
    *,
    display_name: str,
    project: str,
    log_dir: str | os.PathLike[str],
    timeout: str = "3600s",
    restart_job_on_worker_restart: bool = False,
    max_restarts: int = 3,
    job_id: str | None = None,
    extra_env: Mapping[str, str] | None = None,
    out: TextIO | None = None,
) -> JobResult:
    """Runs the job to completion; raises JobFailed naming the replica and its log tail."""
    stream = out or sys.stdout
    seconds = parse_duration(timeout)
    reps = replicas(worker_pool_specs, log=lambda m: stream.write(f"[{display_name}] {m}\n"))
    logs = Path(log_dir)
    logs.mkdir(parents=True, exist_ok=True)
    job = job_id or f"local-{display_name}-{int(time.time())}"
    start = time.monotonic()
    deadline = start + seconds
    attempt = 1
    with _sigterm_as_interrupt():
        while True:
            roles = ", ".join(r.name for r in reps)
            stream.write(f"[{display_name}] attempt {attempt}: starting {roles}\n")
            outcome, culprit = _attempt(
                reps,
                base_output_directory,
                project,
                job,
                logs,
                deadline,
                display_name,
                extra_env or {},
                stream,
                attempt,
            )
            if outcome == "ok":
                return JobResult(attempt, time.monotonic() - start, str(logs), [r.name for r in reps])
            if outcome == "timeout":
                raise JobFailed(
                    f"{display_name} ran past its timeout of {timeout}; every replica was stopped"
                )
            assert culprit is not None
            code = culprit.process.returncode
            tail = "\n".join(culprit.tail)
            if outcome == "restart" and restart_job_on_worker_restart and attempt <= max_restarts:
                stream.write(
                    f"[{display_name}] {culprit.replica.name} was killed (signal {-code}): "
                    f"restarting the whole job ({attempt}/{max_restarts} restarts)\n"
                )
                attempt += 1
                continue
            how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
            raise JobFailed(
                f"{display_name}: replica {culprit.replica.name} {how} (log: {culprit.log_path}); "
                f"last lines:\n{tail}"
            )
