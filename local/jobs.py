"""The local stand-in for a Vertex CustomJob: one process per replica of each worker pool.

Each replica of pools 0 and 1 of the `worker_pool_specs` Vertex receives runs as a process of its
command and args (`python`: this interpreter, the checkout's trainer standing in for the image)
with the environment Vertex gives a container (`replica_env`), on free loopback ports, and
`TMPDIR=<log_dir>/.tmp/<replica>`, deleted after every attempt as a container's files die with it
(TensorFlow's autograph writes there). Output is prefixed on screen and saved to
`<log_dir>/<role>-<index>.log`. No replica outlives the job, whatever ends it (SIGKILL of the
runner too, through PR_SET_PDEATHSIG on Linux): SIGTERM, `grace_seconds` to save the backup, then
SIGKILL.

Restarts, as on Vertex (docs/contracts.md, section 7): a replica killed by a signal, or exiting
143 (`TERMINATED`), is a VM restart: the whole job restarts with `restart_job_on_worker_restart`
(the trainer resumes from AIP_CHECKPOINT_DIR), else that replica alone (Vertex restarts its VM
whatever that setting); at most `max_restarts` times. Any other non-zero exit fails the job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import resource
import shutil
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

from local import ROOT, lifeline
from local.gpus import GPU_DRIVER_DIR, GpusMissing, gpu_shortfall, local_gpus
from local.memory import MemoryProbe, out_of_memory, out_of_memory_message
from local.specs import check_worker_pool_specs, container_env

ROLES = ("chief", "worker")  # TF_CONFIG task types of pools 0 and 1


class JobFailed(RuntimeError):
    """The job failed; the message names the replica, its exit and the tail of its log."""


class JobCancelled(JobFailed):
    """The job was cancelled (`cancel` was set); every replica was stopped."""


class ReplicaOutOfMemoryError(JobFailed):
    """A replica ran out of memory; the job was not restarted (`local.memory`)."""


# A trainer replica's exit after saving its backup on SIGTERM: trainer.callbacks.TERMINATED_EXIT_CODE
# (128 + SIGTERM, as TensorFlow's PreemptionCheckpointHandler exits on Google Cloud; a test keeps them equal).
TERMINATED = 143


def describe_exit(code: int) -> str:
    """`killed by signal 9 (SIGKILL)`, `exited with status 143 (stopped on SIGTERM)`, ..."""
    if code < 0:
        name = next((s.name for s in signal.Signals if s == -code), "unknown signal")
        return f"was killed by signal {-code} ({name})"
    if code == TERMINATED:
        return f"exited with status {code} (it stopped on SIGTERM)"
    return f"exited with status {code}"


@dataclasses.dataclass(frozen=True)
class Replica:
    pool: int
    index: int
    role: str  # chief / worker
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()  # its pool's container_spec.env

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"


@dataclasses.dataclass
class JobResult:
    attempts: int
    seconds: float
    replicas: list[str]


def parse_duration(text: str) -> float:
    """A Vertex duration ("3600s", "1.5s") in seconds."""
    match = re.fullmatch(r"(\d+(\.\d+)?)s", text.strip())
    if not match:
        raise ValueError(f"timeout must be a duration like '3600s', got {text!r}")
    return float(match.group(1))


def free_ports(n: int) -> list[int]:
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def refuse_missing_gpus(specs: Sequence[Mapping[str, Any]], gpus: Sequence[str]) -> None:
    """Raises GpusMissing when pool 0 or 1 asks for more GPUs per replica than `gpus`."""
    for pool, spec in enumerate(specs[: len(ROLES)]):
        machine = (spec or {}).get("machine_spec", {})
        problem = gpu_shortfall(
            f"workerpool{pool}",
            ROLES[pool],
            str(machine.get("machine_type", "")),
            str(machine.get("accelerator_type", "")),
            int(machine.get("accelerator_count", 0) or 0),
            gpus,
            f"this machine ({GPU_DRIVER_DIR})",
        )
        if problem:
            raise GpusMissing(problem)


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
            # Pool 2 (Reduction Server or parameter servers), pool 3 (an evaluator): their images
            # cannot run here, and TF_CONFIG/CLUSTER_SPEC then name pools 0 and 1 only.
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
        env = container_env(pool, container)
        out += [Replica(pool, i, ROLES[pool], tuple(command), env) for i in range(count)]
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


@dataclasses.dataclass(eq=False)
class _Running:
    """A replica's process, with what it takes to start it again."""

    replica: Replica
    env: Mapping[str, str]
    log_path: Path
    tmp_dir: Path
    probe: MemoryProbe = dataclasses.field(default_factory=MemoryProbe)
    tail: deque[str] = dataclasses.field(default_factory=lambda: deque(maxlen=40))
    process: subprocess.Popen[str] | None = None
    thread: threading.Thread | None = None
    kills_before: tuple[int, str] | None = None  # the cgroup's oom_kill count at start
    peak: int | None = None  # bytes: the kernel's high-water mark of its resident memory
    seen_peak: int | None = None  # bytes: the highest VmHWM read while it ran
    oom: tuple[str, int, str] | None = None  # set when it ran out of memory (`oom_cause`)
    oom_checked: bool = False

    def start(self, header: str, display_name: str, out: TextIO) -> None:
        shutil.rmtree(self.tmp_dir, ignore_errors=True)  # a restart is a new VM: no file of the last
        self.tmp_dir.mkdir(parents=True)
        self.kills_before, self.peak, self.seen_peak = self.probe.oom_kills(), None, None
        self.oom, self.oom_checked = None, False
        log_file = self.log_path.open("a")
        log_file.write(f"--- {header}: {' '.join(self.replica.command)}\n")
        log_file.flush()
        self.process = subprocess.Popen(
            # SIGKILLed by Linux when the runner dies (an exec shim: the pid started is the replica's).
            lifeline.with_parent_death_signal(self.replica.command, signal.SIGKILL),
            cwd=ROOT,
            env=dict(self.env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",  # one byte that is not UTF-8 (a Latin-1 path in a log line) stops no pump
            bufsize=1,
            start_new_session=True,  # its own process group: stopped as one, spared the terminal's Ctrl-C
        )
        assert self.process.stdout is not None
        self.thread = threading.Thread(
            target=_pump,
            args=(self.process.stdout, f"[{display_name} {self.replica.name}] ", log_file, self.tail, out),
            daemon=True,
        )
        self.thread.start()

    @property
    def code(self) -> int | None:
        """Its exit status (negative: the killing signal), None while it runs; on Linux each call
        also follows its peak memory (`local.memory`'s docstring)."""
        assert self.process is not None
        if self.process.returncode is None and sys.platform.startswith("linux"):
            try:
                pid, status, usage = os.wait4(self.process.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: Popen knows its status
                return self.process.poll()
            if pid == 0:
                self._read_hwm()
                return None
            self.process.returncode = os.waitstatus_to_exitcode(status)
            reaped = usage.ru_maxrss * 1024  # KiB on Linux
            runner = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            self.peak = max(reaped if reaped > runner else 0, self.seen_peak or 0) or None
        return self.process.poll()

    def _read_hwm(self) -> None:
        """`VmHWM`: the peak of its resident memory since its exec."""
        assert self.process is not None
        with contextlib.suppress(OSError, ValueError, IndexError):
            for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    self.seen_peak = max(self.seen_peak or 0, int(line.split()[1]) * 1024)  # kB
                    return

    def oom_cause(self) -> tuple[str, int, str] | None:
        """(how it was recognised, the memory limit, its source) when it ran out of memory, else
        None; decided once it has ended (kept in `oom`)."""
        code = self.code
        if code != -signal.SIGKILL:
            return None
        if self.oom_checked:
            return self.oom
        self.oom_checked = True
        limit, where = self.probe.memory_limit()
        kills: tuple[int, int, str] | None = None
        if self.kills_before is not None:
            before, file = self.kills_before
            after = self.probe.oom_kills_in(file)
            if after == before:
                # The kernel counts the kill just after sending SIGKILL: give it a moment.
                time.sleep(0.1)
                after = self.probe.oom_kills_in(file)
            if after is not None:
                kills = (before, after, file)
        how = out_of_memory(code, kills, self.peak, limit)
        self.oom = (how, limit, where) if how else None
        return self.oom


def _signal_group(process: subprocess.Popen[str], signum: int) -> None:
    """The replica's whole process group, its own process exited or not: processes it started
    (worker pools of its own) would outlive the job otherwise."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


def _stop_all(running: Sequence[_Running], grace: float) -> None:
    """SIGTERM, `grace` seconds to save and exit, then SIGKILL (at once on a second Ctrl-C)."""
    processes = [r.process for r in running if r.process is not None]
    try:
        for process in processes:
            _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for process in processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
    finally:
        for process in processes:
            _signal_group(process, signal.SIGKILL)
            process.wait()


def _pump(stream: TextIO, prefix: str, log_file: TextIO, tail: deque[str], out: TextIO) -> None:
    with log_file:
        for line in iter(stream.readline, ""):
            log_file.write(line)
            log_file.flush()
            tail.append(line.rstrip("\n"))
            out.write(f"{prefix}{line}")
            out.flush()


# Set by `_sigterm_as_interrupt`'s handler; the supervising loop checks it every 0.2 s.
_SIGTERM = threading.Event()


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so replicas stop too. Python can drop a handler's exception
    (trainer.prepare.sigterm_unwinds), so both signals are also recorded for the supervising
    loop; a second one does not cut the clean-up short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        if not _SIGTERM.is_set():
            _SIGTERM.set()
            raise KeyboardInterrupt(f"signal {signum}")

    _SIGTERM.clear()
    previous = {signum: signal.signal(signum, handler) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, before in previous.items():
            signal.signal(signum, before)
        _SIGTERM.clear()


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
    grace_seconds: float = 10.0,
    cancel: threading.Event | None = None,
    memory: MemoryProbe | None = None,
) -> JobResult:
    """Runs the job to completion; raises JobFailed naming the replica and its log tail
    (JobCancelled, ReplicaOutOfMemoryError: never restarted; `memory` names the files read), or
    ValueError (specs Vertex would refuse) or GpusMissing before any start."""
    stream = out or sys.stdout

    def say(message: str) -> None:
        stream.write(f"[{display_name}] {message}\n")
        stream.flush()

    seconds = parse_duration(timeout)
    reps = replicas(worker_pool_specs, log=say)
    refuse_missing_gpus(worker_pool_specs, local_gpus())
    logs = Path(log_dir)
    logs.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    job_id = job_id or f"local-{display_name}-{int(time.time())}"
    probe = memory or MemoryProbe()
    restarts = 0

    def attempt(number: int) -> tuple[str, _Running | None]:
        """One run of every replica: ("ok"|"restart"|"failed"|"oom"|"timeout", the replica to
        blame); a restartable replica restarts alone here when the job is not restarted whole."""
        nonlocal restarts
        addresses: dict[str, list[str]] = {}
        for rep, port in zip(reps, free_ports(len(reps)), strict=True):
            addresses.setdefault(rep.role, []).append(f"127.0.0.1:{port}")
        tmp_root = logs / ".tmp"
        running: list[_Running] = []
        try:
            for rep in reps:
                env = {
                    **os.environ,
                    **replica_env(rep, addresses, base_output_directory, project, job_id),
                    **dict(rep.env),  # the pool's container_spec.env (never a name of Vertex's own)
                    "TMPDIR": str(tmp_root / rep.name),
                    **(extra_env or {}),
                }
                r = _Running(rep, env, logs / f"{rep.name}.log", tmp_root / rep.name, probe)
                running.append(r)
                r.start(f"attempt {number}", display_name, stream)
            done: set[str] = set()
            while True:
                if _SIGTERM.is_set():
                    raise KeyboardInterrupt("signal (recorded)")
                if cancel is not None and cancel.is_set():
                    raise JobCancelled(f"{display_name} was cancelled; every replica was stopped")
                for r in running:
                    code = r.code
                    if code is None or r.replica.name in done:
                        continue
                    if code == 0:
                        done.add(r.replica.name)
                        continue
                    # Out of memory, this replica or one that died before it (its peers fail
                    # when it vanishes): as on Vertex, permanent, the job fails at once.
                    starved = next((o for o in (r, *running) if o.oom_cause() is not None), None)
                    if starved is not None:
                        return "oom", starved
                    if not (code < 0 or code == TERMINATED):
                        return "failed", r
                    if restart_job_on_worker_restart or restarts >= max_restarts:
                        return "restart", r
                    restarts += 1
                    say(
                        f"{r.replica.name} {describe_exit(code)}: restarting it, as Vertex restarts a "
                        f"replica's VM ({restarts}/{max_restarts} restarts)"
                    )
                    if r.thread is not None:
                        r.thread.join(timeout=5)
                    r.start(f"attempt {number}, restart {restarts}", display_name, stream)
                if len(done) == len(running):
                    return "ok", None
                if time.monotonic() > start + seconds:
                    return "timeout", None
                time.sleep(0.2)
        finally:
            _stop_all(running, grace_seconds)
            for r in running:
                if r.thread is not None:
                    r.thread.join(timeout=5)
            shutil.rmtree(tmp_root, ignore_errors=True)

    number = 1
    with _sigterm_as_interrupt():
        while True:
            say(f"attempt {number}: starting {', '.join(r.name for r in reps)}")
            outcome, culprit = attempt(number)
            if outcome == "ok":
                return JobResult(number, time.monotonic() - start, [r.name for r in reps])
            if outcome == "timeout":
                raise JobFailed(
                    f"{display_name} ran past its timeout of {timeout}; every replica was stopped"
                )
            assert culprit is not None and culprit.process is not None
            how = describe_exit(culprit.process.returncode)
            if outcome == "restart" and restart_job_on_worker_restart and restarts < max_restarts:
                restarts += 1
                say(
                    f"{culprit.replica.name} {how}: restarting the whole job ({restarts}/{max_restarts} restarts)"
                )
                number += 1
                continue
            after = f" after {restarts} restart(s)" if restarts else ""
            error = ReplicaOutOfMemoryError if outcome == "oom" else JobFailed
            what = out_of_memory_message(culprit, after) if outcome == "oom" else how + after
            # Indented: the step's log then has one traceback line at the margin, the exception's
            # (launch.kfp_local.step_error reads it), however many tracebacks the tail holds.
            tail = "\n".join(f"    {line}" for line in culprit.tail)
            raise error(
                f"{display_name}: replica {culprit.replica.name} {what} (log: {culprit.log_path}); "
                f"last lines:\n{tail}"
            )
