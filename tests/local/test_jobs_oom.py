"""Out of memory in the local job runner: an OOM kill is named, with the replica's peak and the
limit, and fails the job at once; a SIGKILL that was no OOM kill is still restarted as a
preemption. The cgroup files are fakes that the replica bumps before it SIGKILLs itself (what the
kernel does when its OOM killer ends a process), except in the last test, a real kernel OOM kill
inside a memory cgroup of its own, run where this machine lets the tests make one."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from local import jobs, lifeline, memory

# Deadlines on processes of its own: in the serial tier, beside one other serial test at most (make test).
pytestmark = pytest.mark.serial

MIB = 1 << 20

# A replica that holds `megabytes` of memory (touched, so resident) for a second (the runner reads
# its peak while it runs), then, as worker-0, dies by SIGKILL: after adding one to the fake cgroup
# counter (`oom`), without touching it (`kill`), or once that way and then never again
# (`kill-once`). The chief exits 0; with `oom-peer` it waits for worker-0's end and fails with
# status 1, as a peer of a vanished replica does (its collectives break).
REPLICA = r"""
import json, os, signal, sys, time
out, mode, megabytes, counter = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
name = "{type}-{index}".format(**json.loads(os.environ["TF_CONFIG"])["task"])
held = bytearray(megabytes << 20)
for i in range(0, len(held), 4096):
    held[i] = 1
print(f"{name} holds {megabytes} MiB", flush=True)
dying = os.path.join(out, "dying")
if name != "worker-0" and mode == "oom-peer":
    while not os.path.exists(dying):
        time.sleep(0.01)
    time.sleep(0.05)
    print("my peer is gone", flush=True)
    sys.exit(1)
if name != "worker-0":
    sys.exit(0)
time.sleep(1)
once = os.path.join(out, "once")
if mode == "kill-once":
    if os.path.exists(once):
        sys.exit(0)
    open(once, "w").close()
if mode in ("oom", "oom-peer"):
    text = open(counter).read()
    lines = [l.split() for l in text.splitlines()]
    with open(counter, "w") as f:
        f.writelines(f"{k} {int(v) + (k == 'oom_kill')}\n" for k, v in lines)
    print("the OOM killer chose me", flush=True)
    open(dying, "w").close()
os.kill(os.getpid(), signal.SIGKILL)
"""


def pools(tmp_path: Path, mode: str, megabytes: int, counter: Path) -> list[dict[str, Any]]:
    script = tmp_path / "replica.py"
    script.write_text(REPLICA)
    container = {
        "image_uri": "img",
        "command": ["python", str(script)],
        "args": [str(tmp_path), mode, str(megabytes), str(counter)],
    }
    return [
        {"machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": 1, "container_spec": container},
        {"machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": 1, "container_spec": container},
    ]


def fake_cgroup_v2(
    tmp_path: Path, limit: int | None, counter: bool = True
) -> tuple[memory.MemoryProbe, Path]:
    """A cgroup v2 mount with the runner in /job: `memory.events` (oom_kill 0) when `counter`,
    `memory.max` when `limit`, and a MemTotal of 64 GiB."""
    root = tmp_path / "cgroup"
    (root / "job").mkdir(parents=True)
    events = root / "job" / "memory.events"
    if counter:
        events.write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 0\noom_group_kill 0\n")
    if limit is not None:
        (root / "job" / "memory.max").write_text(f"{limit}\n")
    (tmp_path / "proc_cgroup").write_text("0::/job\n")
    (tmp_path / "meminfo").write_text("MemTotal:       67108864 kB\nMemFree:        1 kB\n")
    probe = memory.MemoryProbe(
        proc_cgroup=str(tmp_path / "proc_cgroup"), cgroup_root=str(root), meminfo=str(tmp_path / "meminfo")
    )
    return probe, events


def run(
    tmp_path: Path, mode: str, megabytes: int, probe: memory.MemoryProbe, counter: Path, **kwargs: Any
) -> tuple[jobs.JobResult, str]:
    out = io.StringIO()
    try:
        result = jobs.run_job(
            pools(tmp_path, mode, megabytes, counter),
            str(tmp_path / "base") + "/",
            display_name="train",
            project="proj",
            log_dir=tmp_path / "logs",
            out=out,
            memory=probe,
            **kwargs,
        )
    except jobs.JobFailed as err:
        err.add_note(out.getvalue())
        raise
    return result, out.getvalue()


@pytest.mark.parametrize("restart_job", [True, False])
def test_an_oom_kill_fails_the_job_at_once_in_vertex_s_words_with_the_figures(
    tmp_path: Path, restart_job: bool
) -> None:
    probe, events = fake_cgroup_v2(tmp_path, limit=256 * MIB)
    with pytest.raises(jobs.ReplicaOutOfMemoryError) as failed:
        run(tmp_path, "oom", 64, probe, events, restart_job_on_worker_restart=restart_job, max_restarts=3)
    message = str(failed.value)
    first = message.splitlines()[0]
    assert first.startswith(
        "train: replica worker-0 ran out-of-memory and was killed by signal 9 (SIGKILL): "
    )
    # Vertex's own words, with Vertex's name of the replica (pool 1, index 0).
    assert (
        '"The replica workerpool1-0 ran out-of-memory and exited with a non-zero status of 9(SIGKILL)"'
        in first
    )
    assert f"limit 256.0 MiB (the cgroup's limit, {tmp_path / 'cgroup' / 'job' / 'memory.max'}" in first
    assert f"the OOM killer's count in {events} went from 0 to 1 while it ran" in first
    assert "Lower what one replica holds at once: --per_replica_batch_size, or --image_size" in first
    # The peak is the replica's own (64 MiB held after exec; the shim before it never held that).
    peak = float(first.split("peak memory ")[1].split(" MiB")[0])
    assert 64 <= peak < 256, first
    assert "the OOM killer chose me" in message  # its log tail follows
    # Not restarted: one attempt, one start of worker-0, nothing said about restarting.
    screen = failed.value.__notes__[0]
    assert "restarting" not in screen and screen.count("attempt ") == 1, screen
    assert (tmp_path / "logs" / "worker-0.log").read_text().count("--- attempt") == 1
    assert isinstance(failed.value, jobs.JobFailed)  # what the tuner and the steps catch


def test_the_peak_is_the_replica_s_not_the_runner_s(tmp_path: Path) -> None:
    """Fork and exec carry the parent's high-water mark into the child's `ru_maxrss`: a runner that
    once held 320 MiB would make every replica look that large. The peak reported is the replica's
    own (its VmHWM), 32 MiB and the interpreter."""
    ballast = bytearray(320 * MIB)
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1
    del ballast
    probe, events = fake_cgroup_v2(tmp_path, limit=1 << 30)
    with pytest.raises(jobs.ReplicaOutOfMemoryError) as failed:
        run(tmp_path, "oom", 32, probe, events)
    first = str(failed.value).splitlines()[0]
    peak = float(first.split("peak memory ")[1].split(" MiB")[0])
    assert 32 <= peak < 128, first


def test_a_peer_that_fails_because_the_replica_vanished_does_not_hide_the_oom_kill(tmp_path: Path) -> None:
    """The chief exits 1 just after worker-0 is OOM-killed; the runner, seeing the chief's exit,
    names the replica that ran out of memory, not the chief's status 1."""
    probe, events = fake_cgroup_v2(tmp_path, limit=1 << 30)
    with pytest.raises(jobs.ReplicaOutOfMemoryError) as failed:
        run(tmp_path, "oom-peer", 8, probe, events, restart_job_on_worker_restart=True)
    assert str(failed.value).startswith("train: replica worker-0 ran out-of-memory"), failed.value


def test_the_step_error_of_an_oom_kill_is_the_out_of_memory_line(tmp_path: Path) -> None:
    """launch.kfp_local.step_error reads the exception's name from the step's traceback: the new
    class must be one it recognises, so summary.json says "ran out-of-memory"."""
    from launch import kfp_local

    probe, events = fake_cgroup_v2(tmp_path, limit=256 * MIB)
    step = (
        "import json, sys\nfrom pathlib import Path\nfrom local import jobs, memory\n"
        "root = Path(sys.argv[2])\n"
        "jobs.run_job(json.loads(sys.argv[1]), str(root / 'base'), display_name='train-model', "
        "project='p', log_dir=root / 'logs', memory=memory.MemoryProbe(**json.loads(sys.argv[3])))\n"
    )
    log = tmp_path / "train-model.log"
    with log.open("w") as out:
        code = subprocess.run(
            [
                sys.executable,
                "-c",
                step,
                json.dumps(pools(tmp_path, "oom", 8, events)),
                str(tmp_path),
                json.dumps({"proc_cgroup": probe.proc_cgroup, "cgroup_root": probe.cgroup_root}),
            ],
            cwd=jobs.ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        ).returncode
    assert code == 1
    assert kfp_local.step_error(str(log)).startswith(
        "ReplicaOutOfMemoryError: train-model: replica worker-0 ran out-of-memory and was killed by signal 9"
    ), log.read_text()[-3000:]


def test_a_sigkill_the_counter_did_not_see_is_restarted_as_a_preemption(tmp_path: Path) -> None:
    """The counter decides: a replica at 4x the limit's share is still a preemption when the OOM
    killer did not count it (a VM going away, `kill -9`)."""
    probe, events = fake_cgroup_v2(tmp_path, limit=16 * MIB)
    result, screen = run(tmp_path, "kill-once", 64, probe, events, restart_job_on_worker_restart=True)
    assert result.attempts == 2, screen
    assert "worker-0 was killed by signal 9 (SIGKILL): restarting the whole job (1/3 restarts)" in screen


def test_without_a_counter_a_kill_at_a_large_peak_is_judged_out_of_memory(tmp_path: Path) -> None:
    probe, events = fake_cgroup_v2(tmp_path, limit=96 * MIB, counter=False)
    with pytest.raises(jobs.ReplicaOutOfMemoryError, match="ran out-of-memory") as failed:
        run(tmp_path, "kill", 64, probe, events, restart_job_on_worker_restart=True)
    first = str(failed.value).splitlines()[0]
    assert "limit 96.0 MiB" in first and "no cgroup oom_kill counter could be read" in first, first


def test_without_a_counter_a_kill_at_a_small_peak_is_a_preemption(tmp_path: Path) -> None:
    probe, events = fake_cgroup_v2(tmp_path, limit=None, counter=False)  # MemTotal: 64 GiB
    result, screen = run(tmp_path, "kill-once", 16, probe, events, restart_job_on_worker_restart=True)
    assert result.attempts == 2, screen


def test_the_decision_rule() -> None:
    kill = -signal.SIGKILL
    assert memory.out_of_memory(kill, (2, 3, "memory.events"), 10, 1000) is not None
    assert memory.out_of_memory(kill, (3, 3, "memory.events"), 999, 1000) is None  # the counter decides
    assert memory.out_of_memory(-signal.SIGTERM, (2, 3, "memory.events"), 999, 1000) is None
    assert memory.out_of_memory(1, (2, 3, "memory.events"), 999, 1000) is None
    assert memory.out_of_memory(kill, None, 400, 1000) is not None  # OOM_PEAK_FRACTION = 0.4
    assert memory.out_of_memory(kill, None, 399, 1000) is None
    assert memory.out_of_memory(kill, None, None, 1000) is None


def test_the_probe_reads_v2_v1_and_hybrid_hierarchies(tmp_path: Path) -> None:
    root, proc = tmp_path / "cg", tmp_path / "cgroup"
    probe = memory.MemoryProbe(
        proc_cgroup=str(proc), cgroup_root=str(root), meminfo=str(tmp_path / "meminfo")
    )
    (tmp_path / "meminfo").write_text("MemTotal:        8388608 kB\n")  # 8 GiB

    # v1 (this sandbox's layout): the memory controller's own path; the lowest limit of the
    # cgroup and its ancestors; v1 writes "no limit" as a huge number.
    proc.write_text("9:name=systemd:/\n4:memory:/api/box\n0::/\n")
    (root / "memory" / "api" / "box").mkdir(parents=True)
    (root / "memory" / "api" / "box" / "memory.oom_control").write_text(
        "oom_kill_disable 0\nunder_oom 0\noom_kill 7\n"
    )
    (root / "memory" / "api" / "box" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (root / "memory" / "api" / "memory.limit_in_bytes").write_text(f"{2 << 30}\n")
    box = root / "memory" / "api" / "box" / "memory.oom_control"
    assert probe.oom_kills() == (7, str(box))
    assert probe.memory_limit() == (
        2 << 30,
        f"the cgroup's limit, {root / 'memory' / 'api' / 'memory.limit_in_bytes'}",
    )

    # v2 at unified/ (hybrid) comes first when it has memory.events; "max" is no limit.
    (root / "unified" / "svc").mkdir(parents=True)
    (root / "unified" / "svc" / "memory.events").write_text("oom 2\noom_kill 2\n")
    (root / "unified" / "svc" / "memory.max").write_text("max\n")
    proc.write_text("4:memory:/api/box\n0::/svc\n")
    assert probe.oom_kills() == (2, str(root / "unified" / "svc" / "memory.events"))

    # No cgroup limit below the machine's memory: MemTotal.
    (root / "memory" / "api" / "memory.limit_in_bytes").write_text(f"{16 << 30}\n")
    assert probe.memory_limit() == (8 << 30, f"the machine's memory, MemTotal in {tmp_path / 'meminfo'}")

    # Nothing readable: no counter.
    empty = memory.MemoryProbe(proc_cgroup=str(tmp_path / "none"), cgroup_root=str(tmp_path / "none"))
    assert empty.oom_kills() is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the exec shim is Linux's")
def test_the_process_started_is_the_replica_itself(tmp_path: Path) -> None:
    """The PR_SET_PDEATHSIG shim execs the replica in place: the pid the runner waits for (and
    whose rusage gives the peak) is the replica's, running the replica's command."""
    replica = "import os, sys, time; print(os.getpid(), flush=True); time.sleep(30)"
    process = subprocess.Popen(
        lifeline.with_parent_death_signal([sys.executable, "-c", replica]), stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        assert int(process.stdout.readline()) == process.pid
        cmdline = Path(f"/proc/{process.pid}/cmdline").read_text().split("\0")
        assert cmdline[:3] == [sys.executable, "-c", replica]
    finally:
        process.kill()
        process.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the exec shim is Linux's")
def test_a_replica_whose_parent_died_before_the_shim_armed_it_never_runs() -> None:
    """The parent killed between fork and prctl: the shim is then init's child, and prctl would
    never fire. It finds its parent changed and takes the signal itself, before the command."""
    command = lifeline.with_parent_death_signal([sys.executable, "-c", "print('ran')"], signal.SIGTERM)
    assert subprocess.run(command, capture_output=True, text=True).stdout == "ran\n"  # its parent alive
    command[command.index(str(os.getpid()))] = "1"  # as if the parent had died: another one (init)
    result = subprocess.run(command, capture_output=True, text=True)
    assert (result.returncode, result.stdout) == (-signal.SIGTERM, "")


# --- a real kernel OOM kill, in a memory cgroup of its own ----------------------------------


def _own_memory_cgroup(limit: int) -> Iterator[Path]:
    """A new memory cgroup under this process's, limited to `limit` bytes without swap; skips
    the test where this machine does not let it make one (not root, cgroupfs read-only, the v2
    memory controller not delegated)."""
    probe = memory.MemoryProbe()
    v2, v1 = probe._paths()
    root = Path(probe.cgroup_root)
    name = f"test-oom-{uuid.uuid4().hex[:8]}"
    candidates = [
        (root.joinpath("memory", *v1, name), "memory.limit_in_bytes", "memory.memsw.limit_in_bytes"),
        (root.joinpath(*v2, name), "memory.max", "memory.swap.max"),
    ]
    for path, limit_file, swap_file in candidates:
        if not (path.parent / limit_file).exists():
            continue
        try:
            path.mkdir()
        except OSError:
            continue
        try:
            (path / limit_file).write_text(str(limit))
            if (path / swap_file).exists():
                (path / swap_file).write_text(str(limit) if swap_file.startswith("memory.memsw") else "0")
        except OSError:
            path.rmdir()
            continue
        try:
            yield path
        finally:
            for _ in range(50):  # the killed processes leave the cgroup as they are reaped
                try:
                    path.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
        return
    pytest.skip(
        "this machine lets the tests make no memory cgroup of their own (root and a writable cgroupfs needed)"
    )


@pytest.fixture
def memory_cgroup() -> Iterator[Path]:
    yield from _own_memory_cgroup(1 << 30)


# The runner, moved into the cgroup first (its replicas inherit it), reading the real files.
RUNNER = r"""
import json, os, sys
from pathlib import Path
cgroup, pools, root = sys.argv[1], json.loads(sys.argv[2]), Path(sys.argv[3])
with open(Path(cgroup) / "cgroup.procs", "w") as f:
    f.write(str(os.getpid()))  # this process: its replicas inherit the cgroup
from local import jobs, memory
try:
    jobs.run_job(pools, str(root / "base"), display_name="train", project="p", log_dir=root / "logs",
                 restart_job_on_worker_restart=True)
    print(json.dumps({"error": None}))
except jobs.JobFailed as err:
    print(json.dumps({"type": type(err).__name__, "error": str(err)}))
"""

# Grows by 64 MiB at a time (touched) until the kernel ends it: far past the cgroup's 1 GiB.
GREEDY = r"""
import json, os, sys
name = "{type}-{index}".format(**json.loads(os.environ["TF_CONFIG"])["task"])
if name != "worker-0":
    sys.exit(0)
held = []
for _ in range(128):
    block = bytearray(64 << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    held.append(block)
print("survived 8 GiB", flush=True)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="cgroups are Linux's")
def test_a_real_oom_kill_in_a_1_gib_cgroup_is_recognised(tmp_path: Path, memory_cgroup: Path) -> None:
    script = tmp_path / "greedy.py"
    script.write_text(GREEDY)
    container = {"image_uri": "img", "command": ["python", str(script)]}
    spec = {
        "machine_spec": {"machine_type": "n1-standard-4"},
        "replica_count": 1,
        "container_spec": container,
    }
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, str(memory_cgroup), json.dumps([spec, spec]), str(tmp_path)],
        cwd=jobs.ROOT,
        env={**os.environ, "PYTHONPATH": str(jobs.ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["type"] == "ReplicaOutOfMemoryError", outcome
    first = outcome["error"].splitlines()[0]
    assert "replica worker-0 ran out-of-memory and was killed by signal 9 (SIGKILL): peak memory " in first
    assert "limit 1.0 GiB (the cgroup's limit, " in first and "went from 0 to 1 while it ran" in first, first
    peak = first.split("peak memory ")[1].split(",")[0]
    assert peak.endswith(("MiB", "GiB")), first
    assert "survived" not in outcome["error"]


def test_the_hint_names_the_flags_of_the_command_that_ran_out_of_memory() -> None:
    """The commands the plan gives each job (components.plan): a training replica is told of its
    batch; a preparation or evaluation replica, which holds no batch of the model's, is not."""
    from components import plan

    train = memory.memory_hint(plan.train_command())
    prepare = memory.memory_hint(plan.prepare_command())
    evaluate = memory.memory_hint(plan.evaluate_command())
    assert train == "--per_replica_batch_size, or --image_size"
    assert "--per_replica_batch_size" not in prepare and "prepare_engine=beam" in prepare
    assert "--per_replica_batch_size" not in evaluate and "prepare_machine_type" in evaluate
