"""Out of memory, as on Vertex (`local.jobs.ReplicaOutOfMemoryError`): a replica the kernel's OOM
killer ended is not restarted, the job fails at once with Vertex's words (`ran out-of-memory`), the replica's peak
memory, the memory this machine allows and what to lower. It is told apart from a preemption-like
SIGKILL by the `oom_kill` counter of the runner's memory cgroup, which its replicas inherit
(`MemoryProbe`), read at the replica's start and death; where none can be read, by a peak of at
least `OOM_PEAK_FRACTION` of the limit, and the message says so. The peak is the replica's `VmHWM`
(`/proc/<pid>/status`) while it runs (the exec shim keeps the pid), and `os.wait4`'s `ru_maxrss`
when reaped, counted only above the runner's own peak (fork and exec carry the parent's
high-water mark into it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Vertex AI's error for a replica out of memory: AI Platform Training's wording ("The replica
# master 0 ran out-of-memory and exited with a non-zero status of 9(SIGKILL)", tensorflow/models#5591
# and #9352) with Vertex's replica names (GoogleCloudPlatform/vertex-ai-samples#1504). Vertex
# restarts a worker that exits non-zero unless its error is a "common error" (permanent; "Restart
# workers during the training job", https://cloud.google.com/vertex-ai/docs/training/understanding-training-service);
# the page does not say whether out of memory is, the reports above end with the job failed, and
# the same batch would run out of memory again: here it is permanent.
VERTEX_OOM_WORDS = "The replica {pool} ran out-of-memory and exited with a non-zero status of 9(SIGKILL)"
OOM_PEAK_FRACTION = 0.4
"""Where no cgroup `oom_kill` counter can be read, a SIGKILLed replica whose peak reached this share
of the limit is judged out of memory: the OOM killer ends the largest process, and of the local
default two replicas the largest holds about half of what is in use, less the runner's share."""
UNLIMITED = 1 << 60
"""cgroup v1 writes "no limit" as a huge number (9223372036854771712); anything above is one."""


def _size(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} bytes"


@dataclasses.dataclass(frozen=True)
class MemoryProbe:
    """Where the runner reads its cgroups, the cgroup mount and `/proc/meminfo` (tests: fakes)."""

    proc_cgroup: str = "/proc/self/cgroup"
    cgroup_root: str = "/sys/fs/cgroup"
    meminfo: str = "/proc/meminfo"

    def _paths(self) -> tuple[list[str], list[str]]:
        """The parts of this process's cgroup v2 and v1 memory-controller paths ([]: the root), as
        `trainer.data.cgroup_memory_limit` parses them (the layers cannot share it)."""
        v2, v1 = "/", "/"
        with contextlib.suppress(OSError):
            for line in Path(self.proc_cgroup).read_text(encoding="utf-8").splitlines():
                hierarchy, _, rest = line.strip().partition(":")
                controllers, _, path = rest.partition(":")
                if hierarchy == "0" and not controllers:
                    v2 = path or "/"
                elif "memory" in controllers.split(","):
                    v1 = path or "/"
        return [p for p in v2.split("/") if p], [p for p in v1.split("/") if p]

    def oom_kills(self) -> tuple[int, str] | None:
        """The `oom_kill` count and the file it came from, None when no file has one; best first:
        cgroup v2 `memory.events` (processes "killed by any kind of OOM killer" in the cgroup and
        below: the kernel's cgroup-v2 documentation), at the mount's root or `unified/`; v1
        `memory.oom_control` (Linux 4.13+, not counted in ancestors); last the mount's root itself,
        all a container may see."""
        rel2, rel1 = self._paths()
        root = Path(self.cgroup_root)
        files = [
            root.joinpath(*rel2, "memory.events"),
            root.joinpath("unified", *rel2, "memory.events"),
            root.joinpath("memory", *rel1, "memory.oom_control"),
            root / "memory.events",
            root / "memory" / "memory.oom_control",
        ]
        counts = ((self.oom_kills_in(str(file)), str(file)) for file in files)
        return next(((count, file) for count, file in counts if count is not None), None)

    def oom_kills_in(self, file: str) -> int | None:
        """The count in `file` (a replica's start and its death compare one file)."""
        with contextlib.suppress(OSError):
            for line in Path(file).read_text(encoding="utf-8").splitlines():
                key, _, value = line.strip().partition(" ")
                if key == "oom_kill" and value.strip().isdigit():
                    return int(value)
        return None

    def memory_limit(self) -> tuple[int, str]:
        """The memory a replica started here may use, and where that came from: the lowest
        limit of this cgroup and its ancestors, else the machine's `MemTotal`."""
        v2, v1 = self._paths()
        root = Path(self.cgroup_root)
        files = []
        for base, parts, name in (
            (root, v2, "memory.max"),
            (root / "unified", v2, "memory.max"),
            (root / "memory", v1, "memory.limit_in_bytes"),
        ):
            files += [base.joinpath(*parts[:i], name) for i in range(len(parts), -1, -1)]
        total = None
        with contextlib.suppress(OSError, ValueError, IndexError):
            for line in Path(self.meminfo).read_text(encoding="utf-8").splitlines():
                if line.startswith("MemTotal:"):
                    total = int(line.split()[1]) * 1024  # kB
        if total is None:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        # The machine's first: it wins a tie, as the first of equal cgroup limits does.
        limits = [(total, f"the machine's memory, MemTotal in {self.meminfo}")]
        for file in files:
            with contextlib.suppress(OSError):
                text = file.read_text(encoding="utf-8").strip()
                if text.isdigit() and int(text) < UNLIMITED:
                    limits.append((int(text), f"the cgroup's limit, {file}"))
        return min(limits, key=lambda limit: limit[0])


def out_of_memory(
    code: int,
    kills: tuple[int, int, str] | None,
    peak: int | None,
    limit: int,
) -> str | None:
    """How a replica's death was recognised as out of memory, or None: SIGKILL while the
    `oom_kill` counter (`kills`: before, after, file) went up, else with a peak of at least
    OOM_PEAK_FRACTION of `limit`."""
    if code != -signal.SIGKILL:
        return None
    if kills is not None:
        before, after, file = kills
        went = f"the OOM killer's count in {file} went from {before} to {after} while it ran"
        return went if after > before else None
    if peak is None or peak < OOM_PEAK_FRACTION * limit:
        return None
    return f"judged from its peak, {peak / limit:.0%} of the limit (no cgroup oom_kill counter could be read)"


def memory_hint(command: Sequence[str]) -> str:
    """What to lower when a replica running `command` ran out of memory: its flags (pipeline
    parameters of the same names), else pipeline parameters."""
    if "trainer.prepare" in command:
        return (
            "--image_size, or prepare_engine=beam (--engine beam), whose worker processes each hold "
            "one shard's pipeline; on Vertex, a larger prepare_machine_type"
        )
    if "trainer.evaluate" in command:
        return "--image_size; on Vertex, a larger prepare_machine_type (it also runs the evaluation)"
    return "--per_replica_batch_size, or --image_size"


def out_of_memory_message(culprit: Any, after: str) -> str:
    """What `culprit`, a `local.jobs` replica, did when it ran out of memory (`after`: its
    restarts) and what to lower."""
    assert culprit.oom is not None
    how, limit, where = culprit.oom
    rep = culprit.replica
    peak = _size(culprit.peak) if culprit.peak is not None else "unknown"
    vertex = VERTEX_OOM_WORDS.format(pool=f"workerpool{rep.pool}-{rep.index}")
    return (
        f"ran out-of-memory and was killed by signal 9 (SIGKILL){after}: peak memory {peak}, limit "
        f"{_size(limit)} ({where}; {how}). Not restarted (it would run out of memory again): the job "
        f'fails, as Vertex AI\'s does with "{vertex}". Lower what one replica holds at once: '
        f"{memory_hint(rep.command)}"
    )
