"""`make run`: runs the pipeline, locally or on Vertex AI.

    python -m launch.cli run [--target auto|local|vertex] [--<parameter> VALUE ...]

`auto` (the default) picks `vertex` when PROJECT_ID is set (environment or env.sh), else `local`.
The local target runs `pipeline.create_pipeline("local")` with kfp.local
(`SubprocessRunner(use_venv=False)`) into `local_runs/<run_id>/`. What a run shows, leaves and
exits with: docs/running.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import psutil

import pipeline.step as step
from components import tuning
from launch import kfp_local, report, settings, trainingconfig
from launch.flags import RUNS_DIR, TARGETS, build_parser

# The keys of the trainer's metrics.json the run summary shows (tests/test_contracts.py pins them).
METRICS_READ = report.SUMMARY_METRICS


def configured_project(environ: Mapping[str, str], env_file: Path = Path("env.sh")) -> str:
    """PROJECT_ID from the environment, else from env.sh (read as `launch.settings` reads it)."""
    return environ.get("PROJECT_ID") or settings.read_env_file(env_file).get("PROJECT_ID", "")


def local_arguments(ns: argparse.Namespace, parameters: Sequence[Any]) -> dict[str, Any]:
    return {
        q.name: q.default_for("local") if getattr(ns, q.name) is None else getattr(ns, q.name)
        for q in parameters
    }


# A local run's free space: ResNet50 writes about 0.5 GB plus the prepared dataset; a full disk fails late.
MIN_FREE_BYTES = 2**30


def runs_dir_problem(runs_dir: Path) -> str:
    """Why `runs_dir` cannot hold this run's folder and its `latest` link ("" when it can); a
    `latest` that is not a link is the user's, never deleted."""
    if runs_dir.exists() and not runs_dir.is_dir():
        return f"--runs_dir {runs_dir} exists and is not a folder: give a folder (default {RUNS_DIR})"
    latest = runs_dir / "latest"
    if os.path.lexists(latest) and not latest.is_symlink():
        kind = "a folder" if latest.is_dir() else "a file"
        return (
            f"{latest} is {kind}, not the link `make run` keeps to the last run: move or rename it "
            "(it is never deleted), or give another --runs_dir"
        )
    existing = runs_dir.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"--runs_dir {runs_dir} cannot be created: {existing} is not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "is not writable" if existing == runs_dir.absolute() else f"cannot be created in {existing}"
        return f"--runs_dir {runs_dir} {where}: give a folder you can write"
    free = shutil.disk_usage(existing).free
    if free < MIN_FREE_BYTES:
        return (
            f"--runs_dir {runs_dir}: {free / 2**20:.0f} MiB free on its file system; a local run needs at "
            f"least {MIN_FREE_BYTES / 2**30:.0f} GiB: free some space or give a --runs_dir on another disk"
        )
    return ""


def _point_latest(runs_dir: Path, run_id: str, screen: TextIO) -> None:
    """`latest` -> this run, a new link renamed over the old one; a non-link is left, with a warning."""
    latest = runs_dir / "latest"
    fresh = runs_dir / f".latest-{run_id}"
    try:
        fresh.symlink_to(run_id)
        if os.path.lexists(latest) and not latest.is_symlink():
            raise IsADirectoryError(f"{latest} is not a link")
        os.replace(fresh, latest)
    except OSError as err:
        with contextlib.suppress(OSError):
            fresh.unlink()
        screen.write(f"WARNING: {latest} was not updated ({err}); this run is in {runs_dir / run_id}\n")


class _Stop:
    """SIGTERM (`kill PID`, an IDE's stop button, a CI cancel) and SIGHUP unwind a local run as
    Ctrl-C does; a second request kills what is left at once. A terminal's SIGINT reaches the whole
    process group; the others may reach this process only, so they are passed on as SIGINT."""

    def __init__(self) -> None:
        self.signal = ""
        self.again = False

    def handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.signal:
            self.again = True
        else:
            self.signal = name
            if signum != signal.SIGINT:
                _signal_descendants(signal.SIGINT, same_group=True)
        raise KeyboardInterrupt(name)

    def remember(self, signum: int, frame: Any) -> None:
        """The handler around a few lines that must complete (summary.json): a signal is remembered only."""
        self.again = self.again or bool(self.signal)
        self.signal = self.signal or signal.Signals(signum).name


@contextlib.contextmanager
def _handling(handler: Any) -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP go to `handler` meanwhile."""
    previous = {
        signum: signal.signal(signum, handler) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    }
    try:
        yield
    finally:
        for signum, handler_before in previous.items():
            signal.signal(signum, handler_before)


def run_local(
    args: dict[str, Any], runs_dir: Path, screen: TextIO = sys.stdout, verbose: bool = False
) -> int:
    """Runs the local pipeline; writes summary.json, then report.html; returns the exit status.
    However it stops, summary.json says how; no process is left."""
    stop = _Stop()  # outside the main thread, signal.signal raises ValueError: nothing has started
    with _handling(stop.handle):
        return _run_local(args, runs_dir, screen, verbose, stop)


def _run_local(args: dict[str, Any], runs_dir: Path, screen: TextIO, verbose: bool, stop: _Stop) -> int:
    from kfp import local

    import pipeline

    run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)
    run_dir = (runs_dir / run_id).resolve()
    logs = run_dir / "logs"
    logs.mkdir(parents=True)
    _point_latest(runs_dir, run_id, screen)
    args = {**args, "registry_dir": str(Path(args["registry_dir"]).resolve())}
    (run_dir / "parameters.json").write_text(json.dumps(args, indent=1))
    screen.write(f"run {run_id}: {run_dir}\n")

    pipeline_func = pipeline.create_pipeline("local")
    names = kfp_local.display_names(pipeline_func)
    workspace = run_dir / "workspace"
    # Removed at the end: each kfp.local step writes `$(mktemp -d)/ephemeral_component.py` and
    # never removes it (kfp/dsl/component_factory.py).
    scratch = run_dir / "tmp"
    scratch.mkdir()
    steps: list[kfp_local.Step] = []
    tee = kfp_local.StepTee(screen, verbose=verbose)
    status, error = "SUCCEEDED", ""
    start = time.monotonic()
    saved_tmpdir = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(scratch)
    try:
        local.init(
            runner=local.SubprocessRunner(use_venv=False),
            pipeline_root=str(run_dir / "pipeline_root"),
            # Without it kfp.local makes a /tmp/kfp-workspace-* folder every run and never deletes
            # it (kfp/local/config.py, `init`: `tempfile.mkdtemp(prefix='kfp-workspace-')`).
            workspace_root=str(workspace),
            raise_on_error=False,
        )
        with (
            kfp_local.watch_steps(tee, names, logs, steps, lambda: stop.signal),
            contextlib.redirect_stdout(tee),
        ):
            pipeline_func(**args)
        # The handler's KeyboardInterrupt is lost when it lands in a __del__ or a weakref callback
        # (Python prints it and goes on): the signal it recorded still ends the run as cancelled.
        if stop.signal:
            raise KeyboardInterrupt(stop.signal)
    except KeyboardInterrupt:
        how = stop.signal or "SIGINT"
        status, error = "CANCELLED", f"interrupted ({how})"
        screen.write(f"\ninterrupted ({how}): stopping the running step and its processes\n")
        _stop_children(stop, screen)
    except Exception as err:  # noqa: BLE001 (kfp.local's own failure, not a step's: reported, not dumped)
        status, error = "FAILED", f"{type(err).__name__}: {err}"
    finally:
        if saved_tmpdir is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_tmpdir
    wall = time.monotonic() - start
    with _handling(stop.remember):
        left = _descendants()
        shutil.rmtree(scratch, ignore_errors=True)
        with contextlib.suppress(OSError):
            workspace.rmdir()  # only when empty: no component of this pipeline writes there
        for s in steps:
            if s.status == "RUNNING":  # interrupted: kfp.local never returned its status
                s.status = "CANCELLED"
        summary, metrics, trials = _summary(args, run_dir, status, error, steps, wall)
        summary["warnings"] = [{"step": step, "warning": text} for step, text in tee.warnings]
        if status == "CANCELLED":
            summary["stopped"] = {
                "signal": stop.signal or "SIGINT",
                "during": [s.name for s in steps if s.status == "CANCELLED"],
                "not_started": [n for n in dict.fromkeys(names.values()) if n not in {s.name for s in steps}],
                "processes_left": [_describe(process) for process in left],
            }
        summary_path, status = run_dir / "summary.json", summary["status"]
        try:  # here, where a stop request is only noted: every stop the launcher survives writes it
            report.write_json(summary_path, summary)
            written = True
        except OSError as err:  # a folder that cannot be written: one WARNING line
            written, summary["report"] = False, None
            screen.write(
                f"WARNING: {summary_path} was not written ({err.strerror or err}); the run ended {status}\n"
            )
    if written:  # the report last: a picture that cannot be drawn never changes how the run ended
        report.draw_report(run_dir, summary, metrics, trials, guard=lambda: _handling(stop.remember))
    if summary.get("report_error"):
        screen.write(f"WARNING: report.html was not written ({summary['report_error']})\n")
    failed = [s for s in steps if s.status not in ("SUCCESS", "CANCELLED")]
    if tee.warnings:  # again at the end, where they cannot scroll away (a damaged registry...)
        screen.write("".join(f"WARNING: {step}: {text}\n" for step, text in tee.warnings))
    if verbose:
        screen.write(
            "\n" + "\n".join(f"  {s.name:<28} {s.status:<9} {s.seconds:6.1f}s" for s in steps) + "\n"
        )
    if status == "SUCCEEDED":
        m, model = summary["metrics"], summary["model"]
        registered = (
            f"{model['name']} version {model['version']}{' (champion)' if model['champion'] else ''} at {model['path']}"
            if model
            else "no model registered"
        )
        screen.write(
            f"SUCCEEDED in {wall:.0f}s: test_accuracy {m.get('test_accuracy', float('nan')):.4f}; {registered}\n"
            + (f"summary: {summary_path}\n" if written else "")
            + (f"report:  {summary['report']}\n" if summary["report"] else "")
        )
        return 0
    if failed and status == "FAILED":
        screen.write(f"\n{status}: step {failed[0].name} failed; the end of its log ({failed[0].log}):\n")
        screen.write(kfp_local.log_tail(failed[0].log))
    screen.write(f"\n{status}: {summary['error']}\n")  # after the log, where it cannot scroll away
    if summary.get("stopped", {}).get("processes_left"):
        screen.write(f"WARNING: processes still running: {summary['stopped']['processes_left']}\n")
    if written:
        screen.write(f"summary: {summary_path}\n")
    return 130 if status == "CANCELLED" else 1


def _summary(
    args: dict[str, Any], run_dir: Path, status: str, error: str, steps: list[kfp_local.Step], wall: float
) -> tuple[dict[str, Any], dict[str, Any] | None, list[Any] | None]:
    """summary.json's content, with the metrics and trials the report draws; anything unreadable
    is named in the summary, never raised."""
    import pipeline

    failed = [s for s in steps if s.status not in ("SUCCESS", "CANCELLED")]
    if failed and status == "SUCCEEDED":
        status = "FAILED"
    # The failed step's own error: the cause, which the end of a long log may no longer show.
    cause = kfp_local.step_error(failed[0].log) if failed else ""
    step_failure = f"step {failed[0].name} failed" + (f": {cause}" if cause else "") if failed else ""
    by_name = {s.name: s for s in steps}
    unreadable: list[str] = []

    def read_json(path: Path, kind: type) -> Any:
        try:
            value = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            unreadable.append(f"{path}: {err}")
            return None
        return value if isinstance(value, kind) else None

    metrics, trials = None, None
    plan, trained, tune = by_name.get(step.PLAN), by_name.get(step.TRAIN), by_name.get(step.TUNE)
    if plan and trained and trained.status == "SUCCESS":
        metrics = read_json(Path(plan.outputs["model_uri"]) / "metrics.json", dict)
    trials_path = getattr(tune.outputs.get("trials"), "path", None) if tune else None
    if trials_path and Path(trials_path).exists():
        trials = read_json(Path(trials_path), list)
    summary: dict[str, Any] = {
        "pipeline": pipeline.PIPELINE_NAME,
        "run_id": run_dir.name,
        "target": "local",
        "status": status,
        "error": error or step_failure,
        "steps": [
            {"name": s.name, "status": s.status, "seconds": round(s.seconds, 2), "log": s.log} for s in steps
        ],
        "metrics": {k: metrics[k] for k in METRICS_READ if k in metrics} if metrics else {},
        "model": None,
        "report": str(run_dir / "report.html"),
        "wall_seconds": round(wall, 2),
        "parameters": args,
    }
    if unreadable:
        summary["unreadable"] = unreadable
    if step.GATE in by_name and by_name[step.GATE].status == "SUCCESS":
        gate = by_name[step.GATE].outputs
        summary["gate"] = {
            "promote": gate["promote"],
            "reason": gate["reason"],
            # Both on this run's test split (champion_score -1: there was no champion).
            "metric": args.get("gate_metric"),
            "score": gate["score"],
            "champion_score": gate["champion_score"],
            # The paired comparison behind the decision (evaluation.json's; {}: no champion).
            "rule": args.get("gate_rule"),
            "comparison": gate.get("comparison") or None,
        }
    upload = by_name.get(step.UPLOAD)
    if upload and upload.status == "SUCCESS":
        summary["model"] = {
            "name": args["model_display_name"],
            **{k: upload.outputs[k] for k in ("version", "path", "champion")},
        }
    if trials is not None:
        best = by_name.get(step.BEST_TRIAL)
        summary["tuning"] = {
            "metric_id": tuning.METRIC_ID,
            "trials": trials,
            "best": {k: best.outputs[k] for k in ("trial_id", "value", "hyperparameters")}
            if best and best.status == "SUCCESS"
            else None,
        }
    # The final training's tunable values: the best trial's when the run tuned, else the plan's.
    final = by_name.get(step.BEST_TRIAL) or plan
    if final and final.status == "SUCCESS":
        summary["training_hyperparameters"] = final.outputs["hyperparameters"]
    return summary, metrics, trials


def _descendants(same_group: bool = False) -> list[Any]:
    """Every living (not zombie) process below this one; `same_group`: of its process group only."""
    group = os.getpgid(0)
    living = []
    for process in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error, OSError):
            if process.status() != psutil.STATUS_ZOMBIE and (
                not same_group or os.getpgid(process.pid) == group
            ):
                living.append(process)
    return living


def _signal_descendants(signum: int, same_group: bool = False) -> None:
    for process in _descendants(same_group):
        with contextlib.suppress(psutil.Error):
            process.send_signal(signum)


def _describe(process: Any) -> str:
    try:
        command = " ".join(process.cmdline())
    except psutil.Error:
        command = "?"
    return f"{process.pid} {command.strip()[:160]}"


def _stop_children(stop: _Stop, screen: TextIO, timeout: float = 30.0) -> None:
    """Waits for the running step (its replicas save their backup in local.jobs' 10 s grace) and
    kills what is left after `timeout`, or at once on a second request (replicas: PR_SET_PDEATHSIG)."""
    deadline = time.monotonic() + timeout
    with contextlib.suppress(KeyboardInterrupt):
        while _descendants() and time.monotonic() < deadline and not stop.again:
            _reap()
            time.sleep(0.1)
    with _handling(stop.remember):
        if stop.again:
            screen.write("stopping again: killing the run's processes now\n")
        for _ in range(50):  # a process forking while it is killed leaves a child: a few rounds
            if not _descendants():
                break
            _signal_descendants(signal.SIGKILL)
            time.sleep(0.1)
            _reap()


def _reap() -> None:
    """Collects this process's exited children (kfp.local let go of them on the interrupt)."""
    for child in psutil.Process().children():
        with contextlib.suppress(ChildProcessError):
            os.waitpid(child.pid, os.WNOHANG)


def stop_with_make(environ: Mapping[str, str] = os.environ, poll_s: float = 0.5) -> None:
    """SIGTERM to this process (a clean stop) when the `make` that started it goes (an IDE or a
    CI runner signals only make): PR_SET_PDEATHSIG for its shell's death (GNU make passes SIGTERM
    to it), and a thread watching make itself (under MAKELEVEL): SIGKILL to make leaves the shell
    running. Linux only."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGTERM))  # 1: PR_SET_PDEATHSIG
    if "MAKELEVEL" not in environ:
        return
    try:
        shell = psutil.Process(os.getppid())
        make = shell.ppid()
    except psutil.Error:
        return

    def watch() -> None:
        # make's end reparents the shell (to init or a subreaper), even while make is unreaped; a
        # shell gone (psutil.Error) has had PR_SET_PDEATHSIG send SIGTERM already.
        with contextlib.suppress(psutil.Error):
            while shell.ppid() == make:
                time.sleep(poll_s)
            os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="stop-with-make", daemon=True).start()


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    import pipeline

    env = os.environ if environ is None else environ
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "run":
        print(
            "usage: python -m launch.cli run [--target auto|local|vertex] [--<parameter> VALUE ...]",
            file=sys.stderr,
        )
        return 2
    peek = argparse.ArgumentParser(add_help=False)
    peek.add_argument("--target", choices=TARGETS, default="auto")
    known, _ = peek.parse_known_args(argv[1:])
    try:
        project = configured_project(env)
    except settings.SettingsError as err:
        print(f"make run: {err}", file=sys.stderr)
        return 2
    target = known.target if known.target != "auto" else ("vertex" if project else "local")
    parser = build_parser(pipeline.parameters_for(target))
    ns = parser.parse_args(argv[1:])
    if target == "local":
        why = (
            "forced by --target local"
            if known.target == "local"
            else "no PROJECT_ID in the environment or env.sh"
        )
        print(f"make run: running the pipeline LOCALLY on this machine ({why})", flush=True)
        try:
            trainingconfig.apply_to_namespace(ns, "local")
        except ValueError as err:
            parser.error(f"--training_config: {err}")
        args = local_arguments(ns, pipeline.parameters_for("local"))
        try:
            warnings = pipeline.options.check(args, "local")
        except ValueError as err:
            parser.error(f"bad parameters (nothing was started):\n{err}")
        if problem := runs_dir_problem(Path(ns.runs_dir)):
            parser.error(f"{problem} (nothing was started)")
        if any(c.isspace() for c in sys.executable):  # kfp.local writes it unquoted into each step's script
            parser.error(
                f"the Python running this, {sys.executable}, has a space in its path, which kfp.local "
                "writes unquoted into each step's shell script: clone the project into a folder whose "
                "path has no spaces (nothing was started)"
            )
        for warning in warnings:
            print(f"WARNING: {warning}", flush=True)
        stop_with_make(env)
        return run_local(args, Path(ns.runs_dir), verbose=ns.verbose)
    from launch import submit

    return submit.main(ns, env, project)


if __name__ == "__main__":
    sys.exit(main())
