"""The local stand-in for a Vertex CustomJob: one process per replica of each worker pool.

Given the same `worker_pool_specs` Vertex receives, it starts every replica of pools 0 and 1 as
a process running the spec's command and args (the trainer from this checkout instead of the
image: `python` becomes this interpreter) with the environment Vertex gives a container:
`TF_CONFIG` (chief = pool 0, worker = pool 1), `CLUSTER_SPEC`, `AIP_MODEL_DIR`,
`AIP_CHECKPOINT_DIR`, `AIP_TENSORBOARD_LOG_DIR` (from the base output directory),
`CLOUD_ML_PROJECT_ID` and `CLOUD_ML_JOB_ID`, on free loopback ports. Also `TMPDIR`, a folder
of the job's (`<log_dir>/.tmp/<replica>`) deleted after every attempt: on Vertex a replica's
temporary files die with its container; here they would stay in /tmp after a SIGKILL
(TensorFlow's autograph, for one, writes its generated modules there).

Each pool's `container_spec.env` (aiplatform_v1 `EnvVar{name, value}`; the trainer pools carry
their GPU request there, `TRAINER_POOL_*`) reaches its replicas as Vertex passes it to the
container. A name Vertex sets itself (`AIP_*`, `CLOUD_ML_*`, `TF_CONFIG`, `CLUSTER_SPEC`), a name
that is no C identifier, or a value with a `$(VAR_NAME)` reference (Vertex expands those, this
runner does not) is refused before anything starts.

No silent CPU training: a pool that asks for GPUs (`machine_spec.accelerator_count`) on a machine
that has fewer is refused before any process starts, with the trainer's one line
(`gpu_shortfall`, worded as `trainer.distribute.gpu_shortfall`; tests/local/test_jobs_gpus.py
keeps them equal). The GPUs are found without TensorFlow: the entries of
`/proc/driver/nvidia/gpus` (one per GPU the NVIDIA driver has; `local_gpus`), narrowed by
`CUDA_VISIBLE_DEVICES` when it is set.

Each replica's output is prefixed on screen and saved to `<log_dir>/<role>-<index>.log`. The
job has a timeout; no replica outlives it, whatever ends it (failure, timeout, Ctrl-C, SIGTERM,
`cancel`; and SIGKILL of the runner through PR_SET_PDEATHSIG on Linux). Stopping the replicas
sends them SIGTERM, waits `grace_seconds` for them to save their backup and exit, then SIGKILLs
what is left.

Restarts, as on Vertex (docs/contracts.md, section 7). A replica killed by a signal, or exiting
with status 143 (`TERMINATED`: it stopped on SIGTERM after saving its backup), is what a VM
restart looks like. With `restart_job_on_worker_restart` the whole job is restarted and the
trainer resumes from its backup in AIP_CHECKPOINT_DIR; without it that replica alone is started
again, as Vertex restarts a replica on a new VM whatever that setting (the preparation job's
case). Either way at most `max_restarts` times, after which the job fails with an error naming
the replica and the signal (`killed by signal 9 (SIGKILL) after 3 restart(s)`). A replica that
exits with any other non-zero status fails the job.

Out of memory, as on Vertex (`ReplicaOutOfMemoryError`): a replica the kernel's OOM killer ended is
not restarted, the job fails at once with Vertex's words (`ran out-of-memory`), the replica's peak
memory, the memory this machine allows and what to lower. It is told apart from a preemption-like
SIGKILL by the `oom_kill` counter of the runner's memory cgroup (which its replicas inherit):
cgroup v2 `memory.events`, or v1 `memory.oom_control`, read when the replica starts and after it
died (`MemoryProbe`, whose paths tests replace). Where no counter can be read, a SIGKILL of a
replica whose peak reached `OOM_PEAK_FRACTION` of that memory counts as out of memory, and the
message says it was judged so. The peak is the kernel's high-water mark of the replica's resident
memory: `VmHWM` of `/proc/<pid>/status`, read while it runs (the exec shim below keeps the pid:
the process started is the replica, and exec gives it a memory map of its own), and `os.wait4`'s
`ru_maxrss` when it is reaped, which also covers its last moments but starts from the runner's own
peak (fork and exec carry the parent's high-water mark into it), so counts only above that.
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
from pathlib import Path, PurePosixPath
from typing import Any, TextIO

from local import lifeline

CHECKOUT = Path(__file__).resolve().parent.parent
ROLES = ("chief", "worker")  # TF_CONFIG task types of pools 0 and 1


class JobFailed(RuntimeError):
    """The job failed; the message names the replica, its exit and the tail of its log."""


class JobCancelled(JobFailed):
    """The job was cancelled (`cancel` was set); every replica was stopped."""


class ReplicaOutOfMemoryError(JobFailed):
    """A replica ran out of memory (the kernel's OOM killer ended it); the job was not restarted.
    The message's first line names the replica, its peak memory, the limit and what to lower."""


# The exit status of a trainer replica that stopped on SIGTERM after saving its backup
# (trainer.callbacks.TERMINATED_EXIT_CODE: 128 + SIGTERM, what TensorFlow's
# PreemptionCheckpointHandler exits with on Google Cloud). This layer does not import the
# trainer; tests/local/test_jobs.py checks the two are equal.
TERMINATED = 143


def describe_exit(code: int) -> str:
    """`killed by signal 9 (SIGKILL)`, `exited with status 143 (stopped on SIGTERM)`, ..."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown signal"
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


# Variables Vertex sets in every container (docs/contracts.md, section 2): a pool's env may not
# name them (what would the replica see? Vertex does not say), here refused.
RESERVED_ENV = ("TF_CONFIG", "CLUSTER_SPEC")
RESERVED_ENV_PREFIXES = ("AIP_", "CLOUD_ML_")


def container_env(pool: int, container: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """A pool's `container_spec.env` as (name, value) pairs; raises ValueError naming what Vertex
    would set itself or what this runner cannot reproduce. Vertex's `EnvVar.name` "must be a valid C
    identifier", and a value's `$(VAR_NAME)` references are expanded (aiplatform_v1 `EnvVar`)."""
    pairs: list[tuple[str, str]] = []
    problems: list[str] = []
    for item in container.get("env", []) or []:
        name, value = str(item.get("name", "")), str(item.get("value", ""))
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            problems.append(f"{name!r} is not a C identifier (aiplatform_v1 EnvVar.name)")
        elif name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIXES):
            problems.append(
                f"{name} is set by Vertex AI itself (names {', '.join(RESERVED_ENV)} and "
                f"{', '.join(p + '*' for p in RESERVED_ENV_PREFIXES)} are reserved)"
            )
        elif "$(" in value.replace("$$(", ""):
            problems.append(
                f"{name}={value!r}: Vertex AI expands $(VAR_NAME) references, the local runner does not"
            )
        pairs.append((name, value))
    if problems:
        raise ValueError(f"pool {pool} container_spec.env: " + "; ".join(problems))
    return tuple(pairs)


class GpusMissing(ValueError):
    """A pool asks for more GPUs than this machine has; the message is the trainer's one line."""


GPU_DRIVER_DIR = "/proc/driver/nvidia/gpus"


def local_gpus(driver_dir: str = GPU_DRIVER_DIR, environ: Mapping[str, str] | None = None) -> list[str]:
    """The GPUs a process started here would see, without TensorFlow: the NVIDIA driver's
    `/proc/driver/nvidia/gpus/<PCI bus id>/` entries (their `information` file's `Model:`, else the
    bus id), in bus order, narrowed by `CUDA_VISIBLE_DEVICES` when it is set (its indices, up to
    the first that is not a non-negative number, as CUDA reads it). Empty without the driver."""
    env = os.environ if environ is None else environ
    try:
        buses = sorted(os.listdir(driver_dir))
    except OSError:
        return []
    names = []
    for bus in buses:
        model = bus
        with contextlib.suppress(OSError):
            for line in Path(driver_dir, bus, "information").read_text(errors="replace").splitlines():
                if line.startswith("Model:"):
                    model = line.partition(":")[2].strip() or bus
                    break
        names.append(model)
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return names
    picked = []
    for item in visible.split(","):
        item = item.strip()
        if not item.isdigit() or int(item) >= len(names):
            break
        picked.append(names[int(item)])
    return picked


def gpu_shortfall(
    pool: str,
    role: str,
    machine_type: str,
    accelerator_type: str,
    asked: int,
    devices: Sequence[str],
    seen_by: str,
) -> str | None:
    """`trainer.distribute.gpu_shortfall`'s rule and words, for this layer (which does not import
    the trainer; tests/local/test_jobs_gpus.py checks both give the same line)."""
    gpus = len(devices)
    if gpus >= asked:
        return None
    seen = ", ".join(devices) or "none"
    return (
        f"GPU check failed: {pool} ({role}) asked for {asked} x {accelerator_type} on "
        f"{machine_type}, but {seen_by} sees {gpus} GPU{'' if gpus == 1 else 's'} "
        f"(devices: {seen}); refusing to train on CPU (docs/gpus.md)"
    )


def refuse_missing_gpus(specs: Sequence[Mapping[str, Any]], gpus: Sequence[str]) -> None:
    """Raises GpusMissing (one line) when a pool this runner starts (0 and 1) asks for more GPUs
    per replica than `gpus` (`local_gpus`): before any process starts."""
    for pool, spec in enumerate(specs[: len(ROLES)]):
        machine = (spec or {}).get("machine_spec", {})
        asked = int(machine.get("accelerator_count", 0) or 0)
        problem = gpu_shortfall(
            f"workerpool{pool}",
            ROLES[pool],
            str(machine.get("machine_type", "")),
            str(machine.get("accelerator_type", "")),
            asked,
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


# --- out of memory: told apart from a preemption ------------------------------------------------

# What Vertex AI does when a replica runs out of memory. Its error reads "The replica
# workerpool0-0 ran out-of-memory and exited with a non-zero status of 9(SIGKILL)": the training
# service's wording since AI Platform Training ("The replica master 0 ran out-of-memory and exited
# with a non-zero status of 9(SIGKILL)", reported in tensorflow/models#5591 and #9352), with
# Vertex's replica names ("The replica workerpool1-1 exited with a non-zero status of 1.
# Termination reason: Error.", GoogleCloudPlatform/vertex-ai-samples#1504). Google's "Understand
# the custom training service" (https://cloud.google.com/vertex-ai/docs/training/understanding-training-service,
# "Restart workers during the training job") restarts a worker that exits non-zero, except for an
# error of its "common errors" list, which is permanent and shuts the whole job down. Whether
# running out of memory is on that list the page as found here does not show; the reports above
# end with the job failed on that error. Restarting a replica that holds the same batch would run
# out of memory again, so here it is permanent: the job fails at once, never restarted.
VERTEX_OOM_WORDS = "The replica {pool} ran out-of-memory and exited with a non-zero status of 9(SIGKILL)"
OOM_PEAK_FRACTION = 0.4
"""Only where no cgroup `oom_kill` counter can be read: a replica killed by SIGKILL whose peak
resident memory reached this share of the memory limit is judged out of memory. The kernel's OOM
killer ends the largest process when memory runs out; with the local default of two replicas
sharing the machine, the largest holds about half of what is in use, less the runner's share."""
UNLIMITED = 1 << 60
"""cgroup v1 writes "no limit" as a huge number (9223372036854771712); anything above is one."""


def _size(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} bytes"


@dataclasses.dataclass(frozen=True)
class MemoryProbe:
    """Where the runner reads what tells an out-of-memory kill apart from a preemption: the
    runner's cgroups (`proc_cgroup`, a `/proc/<pid>/cgroup` file), the cgroup mount
    (`cgroup_root`) and `/proc/meminfo`. The defaults are the real files; tests point them at
    fakes."""

    proc_cgroup: str = "/proc/self/cgroup"
    cgroup_root: str = "/sys/fs/cgroup"
    meminfo: str = "/proc/meminfo"

    def _paths(self) -> tuple[str, str]:
        """This process's cgroup v2 path and cgroup v1 memory-controller path ("/" if unknown).
        `trainer.data.cgroup_memory_limit` parses the same file for the trainer's cache budget:
        the layers keep them apart (the trainer imports only itself; local never imports the
        trainer), so the few lines are written twice on purpose."""
        v2, v1 = "/", "/"
        with contextlib.suppress(OSError):
            for line in Path(self.proc_cgroup).read_text(encoding="utf-8").splitlines():
                hierarchy, _, rest = line.strip().partition(":")
                controllers, _, path = rest.partition(":")
                if hierarchy == "0" and not controllers:
                    v2 = path or "/"
                elif "memory" in controllers.split(","):
                    v1 = path or "/"
        return v2, v1

    def counter_files(self) -> list[Path]:
        """Where the `oom_kill` counter may be, best first: cgroup v2 `memory.events` of this
        cgroup (it counts the processes "killed by any kind of OOM killer" in it and below it:
        the kernel's cgroup-v2 documentation), at the mount's root or at `unified/` on hybrid
        hosts; else v1 `memory.oom_control` of this memory cgroup (its `oom_kill` line, Linux
        4.13 and later; not counted in ancestors). A container that sees only its own cgroup
        finds it at the mount's root, whatever /proc says: those come last."""
        v2, v1 = self._paths()
        root = Path(self.cgroup_root)
        rel2 = [p for p in PurePosixPath(v2).parts if p != "/"]
        rel1 = [p for p in PurePosixPath(v1).parts if p != "/"]
        return [
            root.joinpath(*rel2, "memory.events"),
            root.joinpath("unified", *rel2, "memory.events"),
            root.joinpath("memory", *rel1, "memory.oom_control"),
            root / "memory.events",
            root / "memory" / "memory.oom_control",
        ]

    def oom_kills(self) -> tuple[int, str] | None:
        """The `oom_kill` count and the file it came from; None when no file has one."""
        for file in self.counter_files():
            try:
                text = file.read_text(encoding="utf-8")
            except OSError:
                continue
            for line in text.splitlines():
                key, _, value = line.strip().partition(" ")
                if key == "oom_kill" and value.strip().isdigit():
                    return int(value), str(file)
        return None

    def oom_kills_in(self, file: str) -> int | None:
        """The count in the same file as before (a replica's start and its death compare one file)."""
        with contextlib.suppress(OSError):
            for line in Path(file).read_text(encoding="utf-8").splitlines():
                key, _, value = line.strip().partition(" ")
                if key == "oom_kill" and value.strip().isdigit():
                    return int(value)
        return None

    def memory_limit(self) -> tuple[int, str]:
        """The memory a replica started here may use: the lowest cgroup limit of this process's
        cgroup and its ancestors (v2 `memory.max`, v1 `memory.limit_in_bytes`), else the
        machine's `MemTotal`; and where that came from."""
        v2, v1 = self._paths()
        root = Path(self.cgroup_root)
        files = []
        for base, rel, name in (
            (root, v2, "memory.max"),
            (root / "unified", v2, "memory.max"),
            (root / "memory", v1, "memory.limit_in_bytes"),
        ):
            parts = [p for p in PurePosixPath(rel).parts if p != "/"]
            files += [base.joinpath(*parts[:i], name) for i in range(len(parts), -1, -1)]
        lowest: tuple[int, str] | None = None
        for file in files:
            try:
                text = file.read_text(encoding="utf-8").strip()
            except OSError:
                continue
            if text.isdigit() and int(text) < UNLIMITED and (lowest is None or int(text) < lowest[0]):
                lowest = (int(text), f"the cgroup's limit, {file}")
        total = None
        with contextlib.suppress(OSError, ValueError, IndexError):
            for line in Path(self.meminfo).read_text(encoding="utf-8").splitlines():
                if line.startswith("MemTotal:"):
                    total = int(line.split()[1]) * 1024  # kB
        if total is None:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if lowest is not None and lowest[0] < total:
            return lowest
        return total, f"the machine's memory, MemTotal in {self.meminfo}"


def out_of_memory(
    code: int,
    kills: tuple[int, int, str] | None,
    peak: int | None,
    limit: int,
) -> str | None:
    """How a replica's death was recognised as out of memory, or None when it was not: killed by
    SIGKILL (what the OOM killer sends) while the cgroup's `oom_kill` counter (`kills`: before,
    after, file) went up; where no counter was read, killed by SIGKILL with a peak of at least
    OOM_PEAK_FRACTION of `limit`."""
    if code != -signal.SIGKILL:
        return None
    if kills is not None:
        before, after, file = kills
        if after > before:
            return f"the OOM killer's count in {file} went from {before} to {after} while it ran"
        return None
    if peak is not None and peak >= OOM_PEAK_FRACTION * limit:
        return (
            f"judged from its peak, {peak / limit:.0%} of the limit (no cgroup oom_kill counter "
            "could be read)"
        )
    return None


def _with_parent_death_signal(command: Sequence[str]) -> list[str]:
    """Each replica is SIGKILLed by Linux when the runner dies (local/lifeline.py: an exec shim,
    so the pid started is the replica's own after exec)."""
    return lifeline.with_parent_death_signal(command, signal.SIGKILL)


class _Running:
    """A replica's process, with what it takes to start it again."""

    def __init__(
        self,
        replica: Replica,
        env: Mapping[str, str],
        log_path: Path,
        tmp_dir: Path,
        probe: MemoryProbe | None = None,
    ) -> None:
        self.replica, self.env, self.log_path, self.tmp_dir = replica, env, log_path, tmp_dir
        self.probe = probe or MemoryProbe()
        self.tail: deque[str] = deque(maxlen=40)
        self.process: subprocess.Popen[str] | None = None
        self.thread: threading.Thread | None = None
        self.kills_before: tuple[int, str] | None = None  # the cgroup's oom_kill count at start
        self.peak: int | None = None  # bytes: the kernel's high-water mark of its resident memory
        self.seen_peak: int | None = None  # bytes: the highest VmHWM read while it ran
        self.oom: tuple[str, int, str] | None = None  # set when it ran out of memory (`oom_cause`)
        self.oom_checked = False

    def start(self, header: str, prefix: str, out: TextIO) -> None:
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        self.kills_before, self.peak, self.seen_peak = self.probe.oom_kills(), None, None
        self.oom, self.oom_checked = None, False
        log_file = self.log_path.open("a")
        log_file.write(f"--- {header}: {' '.join(self.replica.command)}\n")
        log_file.flush()
        self.process = subprocess.Popen(
            _with_parent_death_signal(self.replica.command),
            cwd=CHECKOUT,
            env=dict(self.env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,  # its own process group: stopped as one, spared the terminal's Ctrl-C
        )
        assert self.process.stdout is not None
        self.thread = threading.Thread(
            target=_pump, args=(self.process.stdout, prefix, log_file, self.tail, out), daemon=True
        )
        self.thread.start()

    @property
    def code(self) -> int | None:
        """Its exit status once it has ended (negative: the signal that killed it), None while it
        runs. On Linux each call also follows its peak memory (module docstring): `VmHWM` while
        it runs; once it has ended, reaped with `os.wait4`, `ru_maxrss` where it exceeds the
        runner's own peak (below that, it may be the runner's, inherited through fork and exec)."""
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
        """`VmHWM` of the running replica: the peak of its resident memory since its exec."""
        assert self.process is not None
        with contextlib.suppress(OSError, ValueError, IndexError):
            for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    hwm = int(line.split()[1]) * 1024  # kB
                    self.seen_peak = max(self.seen_peak or 0, hwm)
                    return

    def oom_cause(self) -> tuple[str, int, str] | None:
        """(how it was recognised, the memory limit, where the limit comes from) when it ran out
        of memory, else None; decided once it has ended (also kept in `oom`)."""
        code = self.code
        if code is None or code != -signal.SIGKILL:
            return None
        if self.oom_checked:
            return self.oom
        self.oom_checked = True
        limit, where = self.probe.memory_limit()
        kills: tuple[int, int, str] | None = None
        if self.kills_before is not None:
            before, file = self.kills_before
            after = self.probe.oom_kills_in(file)
            if after is not None and after == before:
                # The kernel counts the kill just after sending SIGKILL: give it a moment.
                time.sleep(0.1)
                after = self.probe.oom_kills_in(file)
            if after is not None:
                kills = (before, after, file)
        how = out_of_memory(code, kills, self.peak, limit)
        self.oom = (how, limit, where) if how else None
        return self.oom


def _signal_group(process: subprocess.Popen[str], signum: int) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signum)


def _stop_all(running: Sequence[_Running], grace: float) -> None:
    """SIGTERM to every replica still running, `grace` seconds for them to save and exit (the
    trainer backs up at once and exits with TERMINATED), then SIGKILL. A second Ctrl-C while
    waiting SIGKILLs at once."""
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
    """SIGTERM (kfp.local or a CI runner stopping us) unwinds like Ctrl-C, so replicas stop too.
    The handler's exception can be dropped by Python (raised inside a `__del__`, a weakref
    callback, C code that clears errors: trainer.prepare.sigterm_unwinds says how it was found), so
    the signal is also recorded and the supervising loop raises it again; a second SIGTERM during
    the clean-up (stopping the replicas) does not cut it short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        if not _SIGTERM.is_set():
            _SIGTERM.set()
            raise KeyboardInterrupt(f"signal {signum}")

    # Ctrl-C too: Python's own SIGINT handler raises KeyboardInterrupt the same way, and loses it
    # the same way; recorded, the supervising loop raises it again.
    _SIGTERM.clear()
    previous = {signum: signal.signal(signum, handler) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, before in previous.items():
            signal.signal(signum, before)
        _SIGTERM.clear()


def _restartable(code: int) -> bool:
    """Killed by a signal, or stopped on SIGTERM after saving: what a VM restart looks like."""
    return code < 0 or code == TERMINATED


@dataclasses.dataclass
class _Job:
    """What every attempt of one job shares."""

    reps: Sequence[Replica]
    base_output_directory: str
    project: str
    job_id: str
    log_dir: Path
    deadline: float
    display_name: str
    extra_env: Mapping[str, str]
    out: TextIO
    restart_job: bool
    max_restarts: int
    grace: float
    cancel: threading.Event | None
    memory: MemoryProbe = dataclasses.field(default_factory=MemoryProbe)
    restarts: int = 0

    def say(self, message: str) -> None:
        self.out.write(f"[{self.display_name}] {message}\n")
        self.out.flush()

    def attempt(self, number: int) -> tuple[str, _Running | None]:
        """One run of every replica: ("ok"|"restart"|"failed"|"oom"|"timeout", the replica to
        blame). A replica that is restartable restarts alone here when the job is not restarted
        whole; one that ran out of memory ("oom") is not restartable."""
        ports = free_ports(len(self.reps))
        addresses: dict[str, list[str]] = {}
        for rep, port in zip(self.reps, ports, strict=True):
            addresses.setdefault(rep.role, []).append(f"127.0.0.1:{port}")
        tmp_root = self.log_dir / ".tmp"
        running: list[_Running] = []
        try:
            for rep in self.reps:
                tmp_dir = tmp_root / rep.name
                env = {
                    **os.environ,
                    **replica_env(rep, addresses, self.base_output_directory, self.project, self.job_id),
                    **dict(rep.env),  # the pool's container_spec.env (never a name of Vertex's own)
                    "TMPDIR": str(tmp_dir),
                    **self.extra_env,
                }
                r = _Running(rep, env, self.log_dir / f"{rep.name}.log", tmp_dir, self.memory)
                running.append(r)
                r.start(f"attempt {number}", self._prefix(rep), self.out)
            done: set[str] = set()
            while True:
                if _SIGTERM.is_set():
                    raise KeyboardInterrupt("signal (recorded)")
                if self.cancel is not None and self.cancel.is_set():
                    raise JobCancelled(f"{self.display_name} was cancelled; every replica was stopped")
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
                    if not _restartable(code):
                        return "failed", r
                    if self.restart_job or self.restarts >= self.max_restarts:
                        return "restart", r
                    self.restarts += 1
                    self.say(
                        f"{r.replica.name} {describe_exit(code)}: restarting it, as Vertex restarts a "
                        f"replica's VM ({self.restarts}/{self.max_restarts} restarts)"
                    )
                    if r.thread is not None:
                        r.thread.join(timeout=5)
                    r.start(f"attempt {number}, restart {self.restarts}", self._prefix(r.replica), self.out)
                if len(done) == len(running):
                    return "ok", None
                if time.monotonic() > self.deadline:
                    return "timeout", None
                time.sleep(0.2)
        finally:
            _stop_all(running, self.grace)
            for r in running:
                if r.thread is not None:
                    r.thread.join(timeout=5)
            shutil.rmtree(tmp_root, ignore_errors=True)

    def _prefix(self, rep: Replica) -> str:
        return f"[{self.display_name} {rep.name}] "


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
    (JobCancelled when `cancel` is set: the replicas get SIGTERM, then SIGKILL after
    `grace_seconds`, and are not restarted; ReplicaOutOfMemoryError, at once, when a replica ran
    out of memory: `memory` says where to read the cgroup's counters, default the real files).
    Raises ValueError before starting anything when the specs would be refused, GpusMissing (one
    line) when a pool asks for GPUs this machine lacks."""
    stream = out or sys.stdout
    seconds = parse_duration(timeout)
    reps = replicas(worker_pool_specs, log=lambda m: stream.write(f"[{display_name}] {m}\n"))
    refuse_missing_gpus(worker_pool_specs, local_gpus())
    logs = Path(log_dir)
    logs.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    job = _Job(
        reps=reps,
        base_output_directory=base_output_directory,
        project=project,
        job_id=job_id or f"local-{display_name}-{int(time.time())}",
        log_dir=logs,
        deadline=start + seconds,
        display_name=display_name,
        extra_env=extra_env or {},
        out=stream,
        restart_job=restart_job_on_worker_restart,
        max_restarts=max_restarts,
        grace=grace_seconds,
        cancel=cancel,
        memory=memory or MemoryProbe(),
    )
    attempt = 1
    with _sigterm_as_interrupt():
        while True:
            job.say(f"attempt {attempt}: starting {', '.join(r.name for r in reps)}")
            outcome, culprit = job.attempt(attempt)
            if outcome == "ok":
                return JobResult(attempt, time.monotonic() - start, str(logs), [r.name for r in reps])
            if outcome == "timeout":
                raise JobFailed(
                    f"{display_name} ran past its timeout of {timeout}; every replica was stopped"
                )
            assert culprit is not None and culprit.process is not None
            if outcome == "oom":
                raise ReplicaOutOfMemoryError(_out_of_memory_message(display_name, culprit, job.restarts))
            code = culprit.process.returncode
            how = describe_exit(code)
            if outcome == "restart" and restart_job_on_worker_restart and job.restarts < max_restarts:
                job.restarts += 1
                job.say(
                    f"{culprit.replica.name} {how}: restarting the whole job "
                    f"({job.restarts}/{max_restarts} restarts)"
                )
                attempt += 1
                continue
            after = f" after {job.restarts} restart(s)" if job.restarts else ""
            # Indented: the step's log then has one traceback line at the margin, the exception's
            # (launch.kfp_local.step_error reads it), however many tracebacks the tail holds.
            tail = "\n".join(f"    {line}" for line in culprit.tail)
            raise JobFailed(
                f"{display_name}: replica {culprit.replica.name} {how}{after} (log: {culprit.log_path}); "
                f"last lines:\n{tail}"
            )


def memory_hint(command: Sequence[str]) -> str:
    """What to lower when a replica running `command` ran out of memory, in the flags of that
    command (the pipeline parameters of the same names) and the pipeline's own parameters where a
    flag has none (prepare_engine, prepare_machine_type): a training replica holds a batch of
    images and the model's activations for it; a preparation or evaluation replica holds decoded
    images, not a batch of the model's."""
    if "trainer.prepare" in command:
        return (
            "--image_size, or prepare_engine=beam (--engine beam), whose worker processes each hold "
            "one shard's pipeline; on Vertex, a larger prepare_machine_type"
        )
    if "trainer.evaluate" in command:
        return "--image_size; on Vertex, a larger prepare_machine_type (it also runs the evaluation)"
    return "--per_replica_batch_size, or --image_size"


def _out_of_memory_message(display_name: str, culprit: _Running, restarts: int) -> str:
    """One line saying that the replica ran out of memory (Vertex's words), its peak, the limit,
    how that was known and what to lower; then its log tail, as for any failed replica."""
    assert culprit.oom is not None
    how, limit, where = culprit.oom
    rep = culprit.replica
    peak = _size(culprit.peak) if culprit.peak is not None else "unknown"
    vertex = VERTEX_OOM_WORDS.format(pool=f"workerpool{rep.pool}-{rep.index}")
    after = f" after {restarts} restart(s)" if restarts else ""
    tail = "\n".join(f"    {line}" for line in culprit.tail)
    return (
        f"{display_name}: replica {rep.name} ran out-of-memory and was killed by signal 9 (SIGKILL)"
        f"{after}: peak memory {peak}, limit {_size(limit)} ({where}; {how}). Not restarted (it would "
        f'run out of memory again): the job fails, as Vertex AI\'s does with "{vertex}". Lower what '
        f"one replica holds at once: {memory_hint(rep.command)} (log: {culprit.log_path}); last lines:\n{tail}"
    )
