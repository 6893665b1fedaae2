"""How a local run ends when it is stopped or its report cannot be drawn: `launch.cli.run_local`
driving a small real kfp.local pipeline (the project's own DAG takes a minute to reach a step
worth stopping; tests/test_local_run.py stops that one with Ctrl-C). Every stop path leaves
summary.json saying how the run ended, no process of the run, nothing in the temp folder."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.serial

# A launcher whose pipeline is one step that says it started, then sleeps (ignoring SIGINT when
# asked: a step slow to stop). Written to a file: kfp reads a component's source with inspect.
_LAUNCHER = """
import sys
from pathlib import Path

from kfp import dsl

import pipeline
from launch import cli, report


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def sleeper(stubborn: bool) -> str:
    import signal
    import time

    if stubborn:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("STEP STARTED", flush=True)
    time.sleep(float(__import__("os").environ.get("SLEEP", "120")))
    return "done"


@dsl.pipeline(name="stopping-test")
def tiny(registry_dir: str, stubborn: bool) -> None:
    sleeper(stubborn=stubborn).set_display_name("sleeper")


pipeline.create_pipeline = lambda target: tiny
if len(sys.argv) > 3 and sys.argv[3] == "broken-report":
    def broken(*args, **kwargs):
        raise RuntimeError("no picture today")
    report.write_report = broken
if len(sys.argv) > 3 and sys.argv[3] == "read-only":  # the runs folder turns read-only at the end
    import os

    real_replace = os.replace

    def replace(src, dst):
        if str(dst).endswith("summary.json"):
            raise OSError(30, "Read-only file system")
        return real_replace(src, dst)

    os.replace = replace
if len(sys.argv) > 3 and sys.argv[3] == "lost-signal":  # the handler's exception lost, as in a __del__
    import os
    import signal
    import time

    def losing(**kwargs):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except KeyboardInterrupt:
            pass
        return tiny(**kwargs)

    losing.pipeline_spec = tiny.pipeline_spec
    pipeline.create_pipeline = lambda target: losing
stubborn = len(sys.argv) > 2 and sys.argv[2] == "stubborn"
sys.exit(cli.run_local({"registry_dir": "reg", "stubborn": stubborn}, Path(sys.argv[1])))
"""


def _launcher(tmp_path: Path, *argv: str, sleep: float = 120) -> tuple[subprocess.Popen[str], Path, Path]:
    script = tmp_path / "launcher.py"
    script.write_text(_LAUNCHER)
    runs, system_tmp = tmp_path / "runs", tmp_path / "system-tmp"
    system_tmp.mkdir()
    proc = subprocess.Popen(
        [sys.executable, str(script), str(runs), *argv],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(system_tmp), "SLEEP": str(sleep)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # signals go where each test sends them, not to pytest's group
    )
    return proc, runs, system_tmp


def _wait_for_step(proc: subprocess.Popen[str], runs: Path) -> None:
    """Until the step's log says it started (the screen shows a step's own lines only verbose)."""
    log = runs / "latest" / "logs" / "sleeper.log"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None:
        if log.exists() and "STEP STARTED" in log.read_text(errors="replace"):
            return
        time.sleep(0.2)
    proc.kill()
    out, err = proc.communicate()
    pytest.fail(f"the step never started:\n{out}\n{err}")


def _descendants(pid: int) -> list[int]:
    living = []
    for child in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):  # gone since the listing
            if child.status() != psutil.STATUS_ZOMBIE:
                living.append(child.pid)
    return living


def _summary(runs: Path) -> dict[str, Any]:
    return json.loads((runs / "latest" / "summary.json").read_text())


def _assert_clean(runs: Path, system_tmp: Path, processes: list[int]) -> None:
    deadline = time.monotonic() + 5
    alive = processes
    while alive and time.monotonic() < deadline:
        alive = [
            p
            for p in processes
            if Path(f"/proc/{p}").exists() and "State:\tZ" not in Path(f"/proc/{p}/status").read_text()
        ]
        time.sleep(0.1)
    assert not alive, f"processes of the run left running: {alive}"
    assert not list(system_tmp.iterdir()), "the run left files in the system temp folder"
    assert not (runs / "latest" / "tmp").exists(), "the run's own temp folder was not removed"


def test_sigterm_to_the_launcher_alone_stops_the_step_and_writes_the_summary(tmp_path: Path) -> None:
    proc, runs, system_tmp = _launcher(tmp_path)
    _wait_for_step(proc, runs)
    processes = _descendants(proc.pid)
    assert processes, "the step's process is not the launcher's descendant"
    start = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)  # the launcher only, as `kill PID` or an IDE's stop button
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    assert time.monotonic() - start < 20
    assert "Traceback" not in err, err
    summary = _summary(runs)
    assert summary["status"] == "CANCELLED" and summary["error"] == "interrupted (SIGTERM)"
    assert summary["stopped"]["signal"] == "SIGTERM"
    assert summary["stopped"]["during"] == ["sleeper"]
    assert summary["stopped"]["processes_left"] == []
    assert [s["status"] for s in summary["steps"]] == ["CANCELLED"]
    _assert_clean(runs, system_tmp, processes)


def test_a_signal_whose_exception_was_lost_still_stops_the_run_before_the_next_step(tmp_path: Path) -> None:
    """Python loses an exception a signal handler raises inside a __del__ or a weakref callback:
    the signal the handler recorded still stops the run, and no step starts after it."""
    proc, runs, _ = _launcher(tmp_path, "gentle", "lost-signal", sleep=20)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    summary = _summary(runs)
    assert summary["status"] == "CANCELLED" and summary["stopped"]["signal"] == "SIGTERM"
    assert summary["steps"] == [] and summary["stopped"]["not_started"] == ["sleeper"]


def test_a_second_signal_kills_a_slow_step_at_once_and_still_writes_the_summary(tmp_path: Path) -> None:
    proc, runs, system_tmp = _launcher(tmp_path, "stubborn")
    _wait_for_step(proc, runs)
    processes = _descendants(proc.pid)
    os.killpg(proc.pid, signal.SIGTERM)  # the whole group, as a CI cancel does
    time.sleep(1.5)  # the step ignores it: the launcher waits (up to 30 s) ...
    assert proc.poll() is None
    start = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)  # ... until a second request
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, out + err
    assert time.monotonic() - start < 10
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "stopping again: killing the run's processes now" in out
    summary = _summary(runs)
    assert summary["status"] == "CANCELLED" and summary["stopped"]["processes_left"] == []
    _assert_clean(runs, system_tmp, processes)


def test_a_report_that_cannot_be_drawn_never_fails_a_successful_run(tmp_path: Path) -> None:
    proc, runs, system_tmp = _launcher(tmp_path, "gentle", "broken-report", sleep=0)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    assert "SUCCEEDED" in out and "report.html was not written (RuntimeError: no picture today)" in out
    summary = _summary(runs)
    assert summary["status"] == "SUCCEEDED"
    assert summary["report_error"] == "RuntimeError: no picture today" and summary["report"] is None
    _assert_clean(runs, system_tmp, [])


def test_a_runs_folder_that_turned_read_only_is_one_line_and_the_status_stays(tmp_path: Path) -> None:
    proc, runs, system_tmp = _launcher(tmp_path, "gentle", "read-only", sleep=0)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    assert "Traceback" not in out + err, out + err
    [warning] = [line for line in out.splitlines() if "summary.json was not written" in line]
    assert "Read-only file system" in warning and warning.endswith("the run ended SUCCEEDED"), warning
    assert "SUCCEEDED in " in out and "summary: " not in out
    assert not (runs / "latest" / "summary.json").exists()
    assert not list((runs / "latest").glob(".summary.json.partial"))
    _assert_clean(runs, system_tmp, [])


CHILD = """
import os, signal, sys, time
from launch import cli
def stopped(signum, frame):
    open(sys.argv[1], "w").write("SIGTERM")
    sys.exit(143)
signal.signal(signal.SIGTERM, stopped)
cli.stop_with_make(poll_s=0.1)
open(sys.argv[1] + ".ready", "w").close()
time.sleep(60)
"""
MAKE = """
import subprocess, sys, time
subprocess.Popen(["bash", "-c", sys.argv[1] + " || true"]).wait()
"""


@pytest.mark.parametrize("victim", ["make", "shell"])
def test_a_run_stops_when_the_make_that_started_it_is_killed(tmp_path: Path, victim: str) -> None:
    """An IDE's stop button signals only `make`: SIGKILL to make (or to the recipe's shell) left
    launch.cli and its steps running. The run now gets SIGTERM, which stops it cleanly."""
    seen = tmp_path / "seen"
    child = f"{sys.executable} -c {shlex.quote(CHILD)} {seen}"
    env = {**os.environ, "MAKELEVEL": "1", "PYTHONPATH": str(ROOT)}
    make = subprocess.Popen([sys.executable, "-c", MAKE, child], env=env, cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while not Path(f"{seen}.ready").exists():
            assert time.monotonic() < deadline and make.poll() is None
            time.sleep(0.05)
        if victim == "make":
            make.kill()
        else:
            shell = int(subprocess.check_output(["pgrep", "-P", str(make.pid), "bash"]).split()[0])
            os.kill(shell, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not seen.exists():
            assert time.monotonic() < deadline, "the run was not told to stop"
            time.sleep(0.05)
        assert seen.read_text() == "SIGTERM"
    finally:
        make.kill()
        make.wait()
