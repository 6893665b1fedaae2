"""The one place this project reaches into kfp.local's internals: timing each step, sending
its output to the step's log, and tying each step's process to the launcher's life.

kfp.local (kfp 2.17) has no public hook around a task: `watch_steps` wraps
`task_dispatcher.run_single_task_implementation` for a run's length, and `StepTee` reads kfp's log
lines (`logging_utils`: `HH:MM:SS.mmm - LEVEL - message`); tests/launch/test_kfp_local.py checks
both against the installed kfp. kfp.local starts each step as `sh -ec '<script>' ...` through
`subprocess_task_handler.run_local_subprocess`; the script (`kfp.dsl.component_factory`) ends in
`_KFP_RUNTIME=true python3 -m kfp.dsl.executor_main ...`, which dash does not exec, and neither
process learns of the launcher's death. `tie_to_launcher` makes sh exec the executor with
PR_SET_PDEATHSIG=SIGTERM (local/lifeline.py), which local.jobs turns into stopping its replicas.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import signal
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

from launch import console
from local import lifeline

PATCHED = "kfp.local.task_dispatcher.run_single_task_implementation"
PATCHED_SUBPROCESS = "kfp.local.subprocess_task_handler.run_local_subprocess"
PATCHED_SUBPROCESS_PARAMETERS = ("full_command", "env_vars")
# kfp.local's warning on every step whose image is not plain Python (`subprocess_task_handler.py`,
# `SubprocessTaskHandler.validate_image`): ours run on the GCPC image by design (docs/facts.md, facts 5, 6).
KFP_IMAGE_WARNING = "You may be attemping to run a task that uses custom or non-Python base image"
# ... and on every step with a display name (`orchestrator.task_executor._warn_local_only_noops`):
# the display names are Vertex's, and the local run shows them as its step names.
KFP_NOOP_WARNING = "no effect in the current local runner"
# The parameters of the patched function in the pinned kfp (checked by the test).
PATCHED_PARAMETERS = (
    "pipeline_resource_name",
    "component_name",
    "component_spec",
    "executor_spec",
    "arguments",
    "pipeline_root",
    "runner",
    "raise_on_error",
    "block_input_artifact",
    "unique_pipeline_id",
)


@dataclasses.dataclass
class Step:
    name: str
    status: str = "RUNNING"
    seconds: float = 0.0
    log: str = ""
    outputs: dict[str, Any] = dataclasses.field(default_factory=dict)


_KFP_LINE = re.compile(r"^\d\d:\d\d:\d\d\.\d{3} - (INFO|WARNING|ERROR) - ")


class StepTee(io.TextIOBase):
    """sys.stdout during a local run: everything to the current step's log; the screen gets the
    steps' own output without kfp.local's bookkeeping (executor input dumps, output listings)."""

    def __init__(self, screen: TextIO, verbose: bool = True) -> None:
        self.screen = screen
        self.verbose = verbose
        self.open_line = False  # the step's "▶ name" line waits for its end or a first line
        self.log: TextIO | None = None
        self.step = ""
        self._buffer = ""
        self._hiding_json = False
        self._hiding_outputs = False
        # (step, text) of every "WARNING: " line a step printed: summary.json's, repeated at the end.
        self.warnings: list[tuple[str, str]] = []

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if self.log:
            self.log.write(text)
            self.log.flush()
        *lines, self._buffer = (self._buffer + text).split("\n")
        for line in lines:
            shown = self._filter(line)
            if shown is not None and shown.startswith(f"  {self.step}: WARNING: "):
                self.warnings.append((self.step, shown.removeprefix(f"  {self.step}: WARNING: ")))
            if shown is not None and not self.verbose:
                shown = console.headline(shown.removeprefix(f"  {self.step}: "))
            if shown is not None:
                self.screen.write(("\n" if self.open_line else "") + shown + "\n")
                self.open_line = False
                self.screen.flush()
        return len(text)

    def flush(self) -> None:
        self.screen.flush()

    def _filter(self, line: str) -> str | None:
        body = line[4:] if line.startswith("    ") else line
        if self._hiding_json:
            self._hiding_json = line != "    }"
            return None
        if _KFP_LINE.match(line):
            self._hiding_outputs = line.rstrip().endswith("outputs:")
            return None
        if self._hiding_outputs and (line.startswith("    ") or not line.strip()):
            return None
        self._hiding_outputs = False
        if body.startswith("[KFP Executor"):
            self._hiding_json = body.rstrip().endswith("Got executor_input:")
            return None
        if not body.strip() or set(body.strip()) == {"-"}:
            return None
        return body if body.startswith("[") else f"  {self.step}: {body}"


# The line of kfp's step script that starts the executor (after kfp.local put its Python there).
_EXECUTOR_LINE = re.compile(r"^([ \t]*)_KFP_RUNTIME=true (\S+ -m kfp\.dsl\.executor_main\b)", re.MULTILINE)


def tie_to_launcher(full_command: list[str]) -> list[str]:
    """The step's command, sh exec'ing its executor, which gets SIGTERM when the launcher dies.
    RuntimeError for a command of another shape: better no run than steps outliving it."""
    if full_command[:2] != ["sh", "-ec"] or len(full_command) < 3:
        raise RuntimeError(
            f"a step command launch/kfp_local.py does not know ({full_command[:2]}): declare the component "
            "with install_kfp_package=False, as the others, which kfp starts as `sh -ec <script>`"
        )
    script, found = _EXECUTOR_LINE.subn(r"\1export _KFP_RUNTIME=true; exec \2", full_command[2])
    if found != 1:
        raise RuntimeError(
            "kfp.local's step script changed (launch/kfp_local.py expects one "
            f"'_KFP_RUNTIME=true <python> -m kfp.dsl.executor_main' line): {full_command[2]!r}"
        )
    return lifeline.with_parent_death_signal(["sh", "-ec", script, *full_command[3:]], signal.SIGTERM)


def display_names(pipeline_func: Any) -> dict[str, str]:
    """component name -> the task's display name, over every nested DAG of the pipeline."""
    from google.protobuf import json_format

    spec = json_format.MessageToDict(pipeline_func.pipeline_spec)
    names: dict[str, str] = {}

    def walk(dag: Mapping[str, Any]) -> None:
        for task in dag.get("tasks", {}).values():
            ref = task["componentRef"]["name"]
            names.setdefault(ref, task["taskInfo"]["name"])
            component = spec["components"][ref]
            if "dag" in component:
                walk(component["dag"])

    walk(spec["root"]["dag"])
    return names


@contextlib.contextmanager
def watch_steps(
    tee: StepTee, names: Mapping[str, str], logs: Path, steps: list[Step], stopped: Callable[[], str] = str
) -> Iterator[None]:
    """Times every kfp.local task, sends its output to logs/<step>.log and shows progress. No step
    starts once `stopped()` names a signal: the handler's KeyboardInterrupt may have been lost."""
    from kfp.local import subprocess_task_handler, task_dispatcher

    original = task_dispatcher.run_single_task_implementation
    original_subprocess = subprocess_task_handler.run_local_subprocess

    def tied(full_command: list[str], env_vars: dict[str, str] | None = None) -> int:
        return original_subprocess(full_command=tie_to_launcher(full_command), env_vars=env_vars)

    def watched(*args: Any, **kwargs: Any) -> Any:
        if stopped():
            raise KeyboardInterrupt(stopped())
        component = kwargs.get("component_name") or args[1]
        name = names.get(component, component.removeprefix("comp-"))
        step = Step(name, log=str(logs / f"{name}.log"))
        steps.append(step)
        tee.screen.write(f"▶ {name}" + ("\n" if tee.verbose else " "))
        tee.open_line = not tee.verbose
        tee.screen.flush()
        start = time.monotonic()
        with open(step.log, "a") as log_file:
            tee.log, tee.step = log_file, name
            try:
                outputs, status = original(*args, **kwargs)
            finally:
                tee.log = None
                step.seconds = time.monotonic() - start
        step.status = str(getattr(status, "name", status))
        step.outputs = dict(outputs or {})
        mark = "✓" if step.status == "SUCCESS" else "✗"
        named = "" if tee.open_line else f"{name} "  # nothing shown since it started: finish its line
        tee.screen.write(f"{mark} {named}{step.status.lower()} in {step.seconds:.1f}s\n")
        tee.open_line = False
        tee.screen.flush()
        return outputs, status

    task_dispatcher.run_single_task_implementation = watched
    subprocess_task_handler.run_local_subprocess = tied
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=re.escape(KFP_IMAGE_WARNING))
            warnings.filterwarnings(
                "ignore", message=r"Task .*: settings \[.*\] have " + re.escape(KFP_NOOP_WARNING)
            )
            yield
    finally:
        task_dispatcher.run_single_task_implementation = original
        subprocess_task_handler.run_local_subprocess = original_subprocess


def log_tail(path: str, lines: int = 25) -> str:
    """The end of a step's log, without kfp.local's bookkeeping."""
    tee = StepTee(io.StringIO())
    tee.step = Path(path).stem
    with contextlib.suppress(OSError):
        tee.write(Path(path).read_text() + "\n")
    shown = tee.screen.getvalue().splitlines()  # type: ignore[attr-defined]
    return "\n".join(shown[-lines:])


# A traceback's last line: the exception's qualified name, then its message's first line.
_EXCEPTION_LINE = re.compile(
    r"^(?:[A-Za-z_][\w.]*\.)?([A-Z]\w*(?:Error|Exception|Failed|Cancelled|Interrupt|Exit)): (.+)$"
)


def step_error(path: str) -> str:
    """Why a failed step failed: the last exception's first line in its log, without the module
    path (`JobFailed: prepare: replica chief-0 was killed ...`); "" when none. The executor's
    traceback is in the log (kfp/local/subprocess_task_handler.py sends its stderr to stdout)."""
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    lines = [line.strip() for line in lines]  # StepTee indents what the executor printed
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last):")]
    for line in lines[starts[-1] + 1 :] if starts else []:
        if match := _EXCEPTION_LINE.match(line):
            return f"{match.group(1)}: {match.group(2).strip()}"
    return ""
