"""Out of memory, as on Vertex (`local.jobs.ReplicaOutOfMemoryError`): a replica the kernel's OOM
killer ended is not restarted, the job fails at once with Vertex's words (`ran out-of-memory`), the replica's peak
memory, the memory this machine allows and what to lower. It is told apart from a preemption-like
SIGKILL by the `oom_kill` counter of the runner's memory cgroup (which its replicas inherit):
cgroup v2 `memory.events`, or v1 `memory.oom_control`, read when the replica starts and after it
died (`MemoryProbe`, whose paths tests replace). Where no counter can be read, a SIGKILL of a
replica whose peak reached `OOM_PEAK_FRACTION` of that memory counts as out of memory, and the
message says it was judged so. The peak is the kernel's high-water mark of the replica's resident
memory: `VmHWM` of `/proc/<pid>/status`, read while it runs (the runner's exec shim, `local.jobs`, keeps the pid:
the process started is the replica, and exec gives it a memory map of its own), and `os.wait4`'s
`ru_maxrss` when it is reaped, which also covers its last moments but starts from the runner's own
peak (fork and exec carry the parent's high-water mark into it), so counts only above that.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

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


def out_of_memory_message(display_name: str, culprit: Any, restarts: int) -> str:
    """One line saying that the replica `culprit` (the job runner's, `local.jobs`) ran out of
    memory (Vertex's words), its peak, the limit, how that was known and what to lower; then its
    log tail, as for any failed replica."""
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
