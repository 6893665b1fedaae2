"""The one adapter onto kfp.local's internals (launch/kfp_local.py) against the installed kfp:
when an upgrade moves or reshapes what it wraps, these fail, naming what changed."""

from __future__ import annotations

import inspect
import io
import logging

from kfp.local import logging_utils, task_dispatcher

from launch import kfp_local


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
    with kfp_local.watch_steps(tee, {}, __import__("pathlib").Path("."), steps):
        assert task_dispatcher.run_single_task_implementation is not original
    assert task_dispatcher.run_single_task_implementation is original
