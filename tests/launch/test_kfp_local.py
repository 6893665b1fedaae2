"""The one adapter onto kfp.local's internals (launch/kfp_local.py) against the installed kfp:
when an upgrade moves or reshapes what it wraps, these fail, naming what changed."""

from __future__ import annotations

import inspect
import io
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kfp.local import logging_utils, task_dispatcher

from launch import kfp_local

# Deadlines on processes of its own: in the serial tier, beside one other serial test at most (make test).
pytestmark = pytest.mark.serial


def test_the_wrapped_function_is_where_and_what_the_adapter_expects() -> None:
    module, _, name = kfp_local.PATCHED.rpartition(".")
    assert module == task_dispatcher.__name__
    function = getattr(task_dispatcher, name, None)
    assert callable(function), f"kfp moved or removed {kfp_local.PATCHED}"
    assert tuple(inspect.signature(function).parameters) == kfp_local.PATCHED_PARAMETERS, (
        f"{kfp_local.PATCHED} changed its parameters: update launch/kfp_local.py"
    )
    # The adapter reads the component name by keyword, else as the second positional argument.
    assert kfp_local.PATCHED_PARAMETERS[1] == "component_name"


def test_kfp_local_log_lines_are_recognised() -> None:
    """The console hides kfp.local's own bookkeeping lines by their format."""
    out = io.StringIO()
    with logging_utils.local_logger_context():
        handler = logging.getLogger().handlers[0]
        assert isinstance(handler, logging.StreamHandler)
        handler.setStream(out)
        logging.getLogger().info("Executing task 'x'")
    [line] = out.getvalue().splitlines()
    assert kfp_local._KFP_LINE.match(line), f"kfp.local's log format changed: {line!r}"


def test_watch_steps_restores_the_original() -> None:
    original = task_dispatcher.run_single_task_implementation
    tee = kfp_local.StepTee(io.StringIO())
    steps: list[kfp_local.Step] = []
    with kfp_local.watch_steps(tee, {}, Path("."), steps):
        assert task_dispatcher.run_single_task_implementation is not original
    assert task_dispatcher.run_single_task_implementation is original


def test_the_subprocess_function_is_where_and_what_the_adapter_expects() -> None:
    from kfp.local import subprocess_task_handler

    module, _, name = kfp_local.PATCHED_SUBPROCESS.rpartition(".")
    assert module == subprocess_task_handler.__name__
    function = getattr(subprocess_task_handler, name, None)
    assert callable(function), f"kfp moved or removed {kfp_local.PATCHED_SUBPROCESS}"
    assert tuple(inspect.signature(function).parameters) == kfp_local.PATCHED_SUBPROCESS_PARAMETERS


def test_tie_to_launcher_refuses_a_command_it_does_not_know() -> None:
    with pytest.raises(RuntimeError, match="install_kfp_package=False"):
        kfp_local.tie_to_launcher(["bash", "-c", "python3 -m kfp.dsl.executor_main"])
    with pytest.raises(RuntimeError, match="step script changed"):
        kfp_local.tie_to_launcher(["sh", "-ec", "python3 -m kfp.dsl.executor_main", "src"])


# A launcher in miniature: runs one kfp.local component (a real step: kfp's own command, executor
# and subprocess handler) under watch_steps, the component sleeping until it is killed.
_LAUNCHER = """
import io, pathlib, sys
from kfp import dsl, local
from launch import kfp_local

@dsl.component(base_image="python:3.11", install_kfp_package=False)
def sleeper() -> None:
    import time
    time.sleep(120)

local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=sys.argv[1],
           workspace_root=sys.argv[1], raise_on_error=False)
with kfp_local.watch_steps(kfp_local.StepTee(io.StringIO()), {}, pathlib.Path(sys.argv[1]), []):
    sleeper()
"""


def test_a_step_dies_with_the_launcher_even_when_the_launcher_is_killed(tmp_path: Path) -> None:
    """SIGKILL of the launcher alone (no handler can run) still ends the step: it was exec'd by
    its sh (so it is the launcher's own child) and has PR_SET_PDEATHSIG."""
    script = tmp_path / "launcher.py"  # a file: kfp reads the component's source with inspect
    script.write_text(_LAUNCHER)
    root = Path(__file__).resolve().parents[2]
    launcher = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path)],
        cwd=root,
        env={**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(root)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        step = None
        deadline = time.monotonic() + 60
        while step is None and time.monotonic() < deadline:
            for entry in Path("/proc").iterdir():
                if entry.name.isdigit():
                    try:
                        stat = (entry / "stat").read_text()
                        cmdline = (entry / "cmdline").read_bytes()
                    except OSError:
                        continue
                    ppid = int(stat.rsplit(")", 1)[1].split()[1])
                    if ppid == launcher.pid and b"kfp.dsl.executor_main" in cmdline:
                        step = int(entry.name)  # the executor itself, the launcher's child: sh exec'd it
            time.sleep(0.2)
        assert step is not None, "the step's executor never ran as the launcher's own child"
        time.sleep(1)  # well inside the component's sleep
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and Path(f"/proc/{step}").exists():
            if "State:\tZ" in Path(f"/proc/{step}/status").read_text():
                break
            time.sleep(0.1)
        alive = Path(f"/proc/{step}").exists() and "State:\tZ" not in Path(f"/proc/{step}/status").read_text()
        assert not alive, "the step outlived the launcher"
    finally:
        if launcher.poll() is None:
            launcher.kill()


def test_the_silenced_image_warning_is_the_one_kfp_gives() -> None:
    """kfp.local warns about every step's non-Python image; watch_steps silences those texts only,
    so a kfp that rewords it shows its warning again rather than hiding another."""
    import warnings

    from kfp.local import subprocess_task_handler
    from kfp.local.orchestrator import task_executor

    assert kfp_local.KFP_IMAGE_WARNING in inspect.getsource(subprocess_task_handler)
    noop = inspect.getsource(task_executor)
    assert "settings {no_op_settings} have '" in noop and kfp_local.KFP_NOOP_WARNING in noop
    tee = kfp_local.StepTee(io.StringIO())
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with kfp_local.watch_steps(tee, {}, Path("."), []):
            warnings.warn(kfp_local.KFP_IMAGE_WARNING + ' "gcpc" in a Python environment.', stacklevel=1)
            warnings.warn(
                "Task 'x': settings ['display_name'] have no effect in the current local runner and will be "
                "ignored.",
                stacklevel=1,
            )
            warnings.warn("another warning", stacklevel=1)
    assert [str(w.message) for w in seen] == ["another warning"]


def test_a_steps_warnings_reach_the_screen_and_are_kept_for_the_summary() -> None:
    """A champion nobody can use is said by find-champion in its log; the screen showed only
    `find-champion success`. Every "WARNING: " line of a step's own code is shown under it and
    kept (launch.cli puts them in summary.json and repeats them at the end)."""
    screen = io.StringIO()
    tee = kfp_local.StepTee(screen, verbose=False)
    tee.step = "find-champion"
    tee.write("cassava has no 'champion' version yet\n")
    tee.write("WARNING: cassava: champion version 7 is damaged, so this run has no usable champion\n")
    tee.write("[prepare-dataset chief-0] WARNING: a replica's own line\n")
    assert (
        screen.getvalue()
        == "    WARNING: cassava: champion version 7 is damaged, so this run has no usable champion\n"
    )
    assert tee.warnings == [
        ("find-champion", "cassava: champion version 7 is damaged, so this run has no usable champion")
    ]
