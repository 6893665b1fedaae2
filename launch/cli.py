"""`make run`: runs the pipeline, locally or on Vertex AI.

    python -m launch.cli run [--target auto|local|vertex] [--<parameter> VALUE ...]

`auto` (the default) picks `vertex` when a Google Cloud project is configured (PROJECT_ID in the
environment or in env.sh) and `local` otherwise, and says which in its first line. Every
pipeline parameter is a flag (`--epochs 5 --tune true --labels '{"team": "ml"}'`); the local
target starts from the local defaults (synthetic data, tiny model, one chief and one worker).

The local target runs the DAG of `pipeline.create_pipeline("local")` with kfp.local
(`SubprocessRunner(use_venv=False)`) and leaves `local_runs/<run_id>/` with every step's
artifacts (`pipeline_root/`) and log (`logs/<step>.log`), `summary.json` and `report.html`;
`local_runs/latest` points to it. Exit status: 0 when the run succeeded, 1 when a step failed
(its log tail is shown), 2 on bad flags, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from launch import kfp_local, report, settings, trainingconfig
from launch.flags import TARGETS, build_parser

# The keys of the trainer's metrics.json the run summary shows (tests/test_contracts.py pins them).
METRICS_READ = (
    "test_accuracy",
    "macro_f1",
    "per_class",
    "test_loss",
    "val_accuracy",
    "val_loss",
    "images_per_second",
    "epochs_completed",
    "best_epoch",
    "export_epoch",
    "stopped_early",
    "num_workers",
)


def configured_project(environ: Mapping[str, str], env_file: Path = Path("env.sh")) -> str:
    """PROJECT_ID from the environment, else from env.sh (read as `launch.settings` reads it)."""
    return environ.get("PROJECT_ID") or settings.read_env_file(env_file).get("PROJECT_ID", "")


def local_arguments(ns: argparse.Namespace, parameters: Sequence[Any]) -> dict[str, Any]:
    return {
        q.name: q.default_for("local") if getattr(ns, q.name) is None else getattr(ns, q.name)
        for q in parameters
    }


def validate_local(args: Mapping[str, Any]) -> list[str]:
    """Every rule (`components.options`) and the local target's own (no more GPUs than this
    machine has, at most 8 workers, a local serving environment, a registry folder this run can
    write), before any step starts.
    Raises OptionsError naming every bad parameter; returns warnings."""
    from components import options, registry
    from local import jobs, servingenv

    problems: list[options.Problem] = []
    warnings: list[str] = []
    try:
        warnings = options.check(args, "local")
    except options.OptionsError as err:
        problems += err.problems
    # GPUs asked of a machine without them: refused before any step, in the line the local job
    # runner and every replica would give (local.jobs.gpu_shortfall, trainer.distribute's rule).
    gpus = jobs.local_gpus()
    pools = [("chief", "chief", 0)] + ([("worker", "worker", 1)] if args["worker_count"] else [])
    for role, prefix, pool in pools:
        same = prefix == "worker" and not args["worker_machine_type"]  # copies the chief's
        source = "chief" if same else prefix
        asked = args[f"{source}_accelerator_count"]
        if isinstance(asked, int) and asked > 0:
            problem = jobs.gpu_shortfall(
                f"workerpool{pool}",
                role,
                str(args[f"{source}_machine_type"]),
                str(args[f"{source}_accelerator_type"]),
                asked,
                gpus,
                f"this machine ({jobs.GPU_DRIVER_DIR})",
            )
            if problem:
                problems.append(
                    options.Problem(
                        (f"{prefix}_accelerator_count",),
                        f"{problem}; set it to 0 (and {prefix}_accelerator_type to '') to train on CPU",
                    )
                )
    if isinstance(args["worker_count"], int) and args["worker_count"] > 8:
        problems.append(
            options.Problem(
                ("worker_count",),
                f"{args['worker_count']} is more processes than a local run should start (max 8)",
            )
        )
    try:  # the serving image this run would register with (auto: decided on today's date)
        prebuilt = (
            registry.resolve_serving_image(args["serving_image"], args["serving_tf_version"]) == "prebuilt"
        )
    except ValueError:
        prebuilt = False  # an unknown version: named by options.check above
    if prebuilt and args["serving_tf_version"] not in servingenv.PINS:
        # The local registry serves each version under its serving image's TensorFlow.
        problems.append(
            options.Problem(
                ("serving_tf_version",),
                f"{args['serving_tf_version']} has no local serving environment; the local target "
                f"checks models under: {', '.join(sorted(servingenv.PINS))}",
            )
        )
    if problem := _registry_dir_problem(Path(args["registry_dir"])):
        problems.append(options.Problem(("registry_dir",), problem))
    if problems:
        raise options.OptionsError(problems)
    return warnings


def _registry_dir_problem(registry_dir: Path) -> str:
    """The registry folder is written only by the last step (upload-model): check now that it is
    a folder this run can write (or create), not after the whole run."""
    import tempfile

    if registry_dir.exists() and not registry_dir.is_dir():
        return f"{registry_dir} exists and is not a folder"
    existing = registry_dir
    while not existing.exists():  # a folder to create: its nearest existing parent must be writable
        existing = existing.absolute().parent
    if not existing.is_dir():
        return f"{registry_dir} cannot be created: {existing} is not a folder"
    try:
        handle, probe = tempfile.mkstemp(prefix=".write-check-", dir=existing)
        os.close(handle)
        os.remove(probe)
    except OSError as err:
        what = "is not writable" if existing == registry_dir else f"cannot be created in {existing}"
        return f"{registry_dir} {what} ({err.strerror or err}): give --registry_dir a folder you can write"
    return ""


# --- the local run ----------------------------------------------------------------------------


def _artifact_path(outputs: Mapping[str, Any], name: str) -> str | None:
    artifact = outputs.get(name)
    return getattr(artifact, "path", None) if artifact is not None else None


def run_local(
    args: dict[str, Any], runs_dir: Path, screen: TextIO = sys.stdout, verbose: bool = False
) -> int:
    """Runs the local pipeline; writes summary.json and report.html; returns the exit status."""
    from kfp import local

    import pipeline

    run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)
    run_dir = (runs_dir / run_id).resolve()
    logs = run_dir / "logs"
    logs.mkdir(parents=True)
    latest = runs_dir / "latest"
    with contextlib.suppress(FileNotFoundError):
        latest.unlink()
    latest.symlink_to(run_id)
    args = {**args, "registry_dir": str(Path(args["registry_dir"]).resolve())}
    (run_dir / "parameters.json").write_text(json.dumps(args, indent=1))
    screen.write(f"run {run_id}: {run_dir}\n")

    pipeline_func = pipeline.create_pipeline("local")
    names = kfp_local.display_names(_spec_dict(pipeline_func))
    workspace = run_dir / "workspace"
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(run_dir / "pipeline_root"),
        # Without it kfp.local makes a /tmp/kfp-workspace-* folder every run and never deletes it
        # (kfp/local/config.py, `init`: `tempfile.mkdtemp(prefix='kfp-workspace-')`).
        workspace_root=str(workspace),
        raise_on_error=False,
    )
    steps: list[kfp_local.Step] = []
    tee = kfp_local.StepTee(screen, verbose=verbose)
    status, error = "SUCCEEDED", ""
    start = time.monotonic()
    warnings.filterwarnings("ignore", message="You may be attemping to run a task")
    warnings.filterwarnings("ignore", message=".*have no effect in the current local runner")
    try:
        with kfp_local.watch_steps(tee, names, logs, steps), contextlib.redirect_stdout(tee):
            pipeline_func(**args)
    except KeyboardInterrupt:
        status, error = "CANCELLED", "interrupted"
        screen.write("interrupted: stopping the running step and its processes\n")
        _reap_children()
    except Exception as err:  # noqa: BLE001 (kfp.local's own failure, not a step's: reported, not dumped)
        status, error = "FAILED", f"{type(err).__name__}: {err}"
    wall = time.monotonic() - start
    with contextlib.suppress(OSError):
        workspace.rmdir()  # only when empty: no component of this pipeline writes there
    failed = [s for s in steps if s.status != "SUCCESS"]
    if failed and status == "SUCCEEDED":
        status = "FAILED"
    # The failed step's own error (`JobFailed: ... was killed by signal 9 (SIGKILL) ...`): the
    # cause, which the end of a long log may no longer show.
    cause = kfp_local.step_error(failed[0].log) if failed else ""
    step_failure = f"step {failed[0].name} failed" + (f": {cause}" if cause else "") if failed else ""
    by_name = {s.name: s for s in steps}

    metrics, trials = None, None
    model_step = by_name.get("model-from-job")
    if model_step and model_step.status == "SUCCESS":
        metrics_path = Path(model_step.outputs["model_uri"]) / "metrics.json"
        metrics = json.loads(metrics_path.read_text())
    trials_path = (
        _artifact_path(by_name["tune-hyperparameters"].outputs, "trials")
        if "tune-hyperparameters" in by_name
        else None
    )
    if trials_path and Path(trials_path).exists():
        trials = json.loads(Path(trials_path).read_text())
    summary: dict[str, Any] = {
        "pipeline": pipeline.PIPELINE_NAME,
        "run_id": run_id,
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
    if "evaluate-model" in by_name and by_name["evaluate-model"].status == "SUCCESS":
        gate = by_name["evaluate-model"].outputs
        summary["gate"] = {
            "promote": gate["promote"],
            "reason": gate["reason"],
            # Both on this run's test split (champion_score -1: there was no champion).
            "metric": args.get("gate_metric"),
            "score": gate["score"],
            "champion_score": gate["champion_score"],
        }
    upload = by_name.get("upload-model")
    if upload and upload.status == "SUCCESS":
        summary["model"] = {
            "name": args["model_display_name"],
            "version": upload.outputs["version"],
            "path": upload.outputs["path"],
            "champion": upload.outputs["champion"],
        }
    if trials is not None:
        best = by_name.get("best-trial")
        summary["tuning"] = {
            "metric_id": "val_accuracy",
            "trials": trials,
            "best": {k: best.outputs[k] for k in ("trial_id", "value", "hyperparameters")}
            if best and best.status == "SUCCESS"
            else None,
        }
    final_args = by_name.get("training-trainer-args")
    if final_args and final_args.status == "SUCCESS":
        summary["training_hyperparameters"] = final_args.outputs["hyperparameters"]
    report.write_report(run_dir / "report.html", summary, metrics, trials)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))

    if verbose:
        screen.write(
            "\n" + "\n".join(f"  {s.name:<28} {s.status:<8} {s.seconds:6.1f}s" for s in steps) + "\n"
        )
    if status == "SUCCEEDED":
        m, model = summary["metrics"], summary["model"]
        screen.write(
            f"SUCCEEDED in {wall:.0f}s: test_accuracy {m.get('test_accuracy', float('nan')):.4f}; "
            f"{model['name']} version {model['version']}{' (champion)' if model['champion'] else ''} at {model['path']}\n"
            f"summary: {run_dir / 'summary.json'}\nreport:  {run_dir / 'report.html'}\n"
        )
        return 0
    if failed:
        screen.write(f"\n{status}: step {failed[0].name} failed; the end of its log ({failed[0].log}):\n")
        screen.write(kfp_local.log_tail(failed[0].log) + "\n")
        if cause:  # last, where it cannot scroll away
            screen.write(f"{status}: {step_failure}\n")
    else:
        screen.write(f"\n{status}: {error}\n")
    screen.write(f"summary: {run_dir / 'summary.json'}\n")
    return 130 if status == "CANCELLED" else 1


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:  # the field after the state is the ppid
                out.append(int(entry.name))
    return out


def _reap_children(timeout: float = 30.0) -> None:
    """After Ctrl-C, waits for the step's process (which stops its replicas) to exit, so the
    prompt comes back only when nothing of the run is left; kills it when it takes too long.
    Longer than `local.jobs`' grace period (10 s), in which the replicas save their backup."""
    import signal

    if not Path("/proc").is_dir():
        return
    deadline = time.monotonic() + timeout
    while (children := _children(os.getpid())) and time.monotonic() < deadline:
        for child in children:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(child, os.WNOHANG)
        time.sleep(0.1)
    for child in _children(os.getpid()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)  # its replicas die with it (PR_SET_PDEATHSIG)


def _spec_dict(pipeline_func: Any) -> dict[str, Any]:
    from google.protobuf import json_format

    return json_format.MessageToDict(pipeline_func.pipeline_spec)


# --- entry point ------------------------------------------------------------------------------


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
    project = configured_project(env)
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
            warnings = validate_local(args)
        except ValueError as err:
            parser.error(f"bad parameters (nothing was started):\n{err}")
        for warning in warnings:
            print(f"WARNING: {warning}", flush=True)
        return run_local(args, Path(ns.runs_dir), verbose=ns.verbose)
    from launch import submit

    return submit.main(ns, env, project)


if __name__ == "__main__":
    sys.exit(main())
