"""`make gpu-check`: a project's first contact with its GPUs, before any training run.

Submits one one-replica Vertex AI CustomJob (the real `aiplatform_v1.CustomJob`, sent by the real
`JobServiceClient`) running `python -m trainer.gpucheck` on the image `make run` would train with,
on the pipeline's chief machine, checked by `components.worker_pools.build_worker_pool_specs`
before any request; waits, then prints what the check wrote (`gpu_check.json` in the job's
`AIP_MODEL_DIR`). What it checks, its settings and exit status: docs/vertex.md#make-gpu-check.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import secrets
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from launch import settings as settings_mod
from launch.cli import configured_project
from launch.cloud import client_args, reach, vertex_endpoint, vertex_service
from launch.flags import parse_bool
from launch.settings import Settings
from launch.submit import console_url, exit_status, load_settings
from local import ROOT

PROG = "make gpu-check"
COMMAND = ["python", "-m", "trainer.gpucheck"]
# What trainer.gpucheck writes into AIP_MODEL_DIR (its RESULT_FILE; not imported: the test keeps them equal).
RESULT_FILE = "gpu_check.json"
RESULT_READ = (
    "ok",
    "error",
    "pool",
    "role",
    "tensorflow",
    "devices",
    "gpus",
    "nvidia_smi",
    "driver",
    "xla",
    "all_reduce",
)
"""The keys of the check's summary read here (`trainer.gpucheck.RESULT_KEYS` declares them)."""
HARDWARE = ("chief_machine_type", "chief_accelerator_type", "chief_accelerator_count")
# The states after which a CustomJob changes no more: GCPC's launcher waits for SUCCEEDED,
# FAILED, CANCELLED and PAUSED (job_remote_runner._JOB_COMPLETE_STATES); EXPIRED and
# PARTIALLY_SUCCEEDED are final too (aiplatform_v1 JobState).
TERMINAL = (
    "JOB_STATE_SUCCEEDED",
    "JOB_STATE_FAILED",
    "JOB_STATE_CANCELLED",
    "JOB_STATE_PAUSED",
    "JOB_STATE_EXPIRED",
    "JOB_STATE_PARTIALLY_SUCCEEDED",
)


def hardware_defaults() -> dict[str, Any]:
    """The pipeline's chief machine, as compiled for Vertex (`pipeline.PARAMETERS`)."""
    import pipeline

    return {q.name: q.default_for("vertex") for q in pipeline.parameters_for("vertex") if q.name in HARDWARE}


def duration(text: str) -> int:
    """`--timeout`: whole seconds as Vertex writes durations (`1800s`), from 60 s to 7 days."""
    match = re.fullmatch(r"([0-9]{1,7})s", text.strip())
    if not match or not 60 <= int(match.group(1)) <= 7 * 24 * 3600:
        raise argparse.ArgumentTypeError(
            f"expected whole seconds like '1800s', from 60s to 604800s (7 days), got {text!r}"
        )
    return int(match.group(1))


def image_reference(text: str) -> str:
    """`--image`: a container image reference, `<host>/<path>:<tag>` or `<host>/<path>@sha256:<digest>`."""
    if not re.fullmatch(
        r"[a-z0-9][a-z0-9.-]*(:[0-9]+)?/[a-z0-9._/-]+(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}|@sha256:[0-9a-f]{64})?",
        text,
    ):
        raise argparse.ArgumentTypeError(
            "expected an image like <region>-docker.pkg.dev/<project>/<repository>/trainer:<tag> "
            f"(or @sha256:<digest>), got {text!r}"
        )
    return text


def build_parser(defaults: Mapping[str, Any]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"{PROG} ARGS=...",
        description="One Vertex AI job on this checkout's trainer image: the GPUs it sees, one NCCL all-reduce.",
    )
    p.add_argument("--chief_machine_type", default=defaults["chief_machine_type"], help="Machine type.")
    p.add_argument(
        "--chief_accelerator_type", default=defaults["chief_accelerator_type"], help="GPU type ('' for none)."
    )
    p.add_argument("--chief_accelerator_count", type=int, default=defaults["chief_accelerator_count"])
    p.add_argument(
        "--check_gpu_region",
        type=parse_bool,
        default=True,
        help="false: a GPU this project's region table does not list for REGION is a warning.",
    )
    p.add_argument(
        "--image",
        type=image_reference,
        default=None,
        help="The image to check (default: this checkout's trainer image in ARTIFACT_REPOSITORY).",
    )
    p.add_argument("--timeout", type=duration, default=1800, help="Job timeout (default 1800s).")
    p.add_argument("--no_wait", action="store_true", help="Submit and return: do not wait for the result.")
    return p


def checkout_image(settings: Settings, root: Path = ROOT) -> tuple[str, str]:
    """(`<ARTIFACT_REPOSITORY>/trainer`, the content tag of this checkout's build context): the
    image the pipeline's build step makes from the same context (`components.image.build_trainer_image`)."""
    from components.buildcontext import context_members, context_tag

    return f"{settings.artifact_repository}/trainer", context_tag(context_members(root))


def build_custom_job(
    settings: Settings, pool: Mapping[str, Any], output_dir: str, timeout_seconds: int, display_name: str
) -> Any:
    """The `aiplatform_v1.CustomJob`, its worker pool parsed strictly (a field Vertex does not
    declare fails here, not at Google), not retried (`Scheduling.disable_retries`: "Indicates if
    the job should retry for internal errors after the job starts running")."""
    from google.cloud import aiplatform_v1

    spec = aiplatform_v1.CustomJobSpec(
        worker_pool_specs=[aiplatform_v1.WorkerPoolSpec.from_json(json.dumps(pool))],
        base_output_directory=aiplatform_v1.GcsDestination(output_uri_prefix=output_dir),
        scheduling=aiplatform_v1.Scheduling(
            timeout=datetime.timedelta(seconds=timeout_seconds), disable_retries=True
        ),
        service_account=settings.service_account,
        network=settings.network,
    )
    job = aiplatform_v1.CustomJob(display_name=display_name, job_spec=spec, labels=dict(settings.labels))
    if settings.kms_key:
        job.encryption_spec = aiplatform_v1.EncryptionSpec(kms_key_name=settings.kms_key)
    return job


def read_result(storage_client: Any, output_dir: str) -> dict[str, Any] | None:
    """The check's summary from `<base_output_directory>/model/gpu_check.json` (Vertex's
    AIP_MODEL_DIR of a CustomJob: aiplatform_v1 `CustomJobSpec.base_output_directory`), or None."""
    from google.api_core import exceptions
    from google.cloud.storage import Blob

    blob = Blob.from_uri(f"{output_dir}/model/{RESULT_FILE}", client=storage_client)
    try:
        result = json.loads(blob.download_as_text())
    except exceptions.NotFound:
        return None
    return result if isinstance(result, dict) else None


def describe(result: Mapping[str, Any]) -> list[str]:
    gpus = result.get("gpus")
    devices = ", ".join(result.get("devices") or []) or "none"
    lines = [
        f"  {result.get('pool')} ({result.get('role')}): TensorFlow {result.get('tensorflow')} sees "
        + f"{gpus} GPU{'' if gpus == 1 else 's'} (devices: {devices})"
    ]
    lines += [f"  nvidia-smi: {line}" for line in result.get("nvidia_smi") or ["not in the image"]]
    lines.append(f"  {result.get('driver') or 'no NVIDIA driver seen'}")
    if xla := result.get("xla"):
        lines.append(
            f"  XLA on GPU:0: {'ran' if xla.get('correct') else 'FAILED'} {xla.get('error', '')}".rstrip()
        )
    if reduced := result.get("all_reduce"):
        bandwidth = reduced.get("bus_gb_per_second")
        lines.append(
            f"  NCCL all-reduce of {reduced.get('megabytes'):g} MiB over {reduced.get('gpus')} GPU(s): "
            f"first {reduced.get('first_seconds'):.3f} s (set-up included), then "
            f"{reduced.get('seconds', 0) * 1000:.2f} ms each"
            + (f", bus bandwidth {bandwidth:.1f} GB/s" if bandwidth else "")
            + ("" if reduced.get("correct") else ", WRONG SUM")
        )
    elif not result.get("error"):
        lines.append("  no GPU: no NCCL all-reduce")
    return lines


def wait(job_client: Any, name: str, poll_seconds: float) -> Any:
    """Polls the job until it ends, printing each new state; returns the final job. Ours, not
    the SDK's `CustomJob.wait()`: that one logs through aiplatform's logger and shows no state."""
    last = ""
    started = time.monotonic()
    while True:
        job = job_client.get_custom_job(name=name)
        state = job.state.name
        if state != last:
            print(f"{PROG}: {state} ({time.monotonic() - started:.0f} s)", flush=True)
            last = state
        if state in TERMINAL:
            return job
        time.sleep(poll_seconds)


def run(
    settings: Settings,
    ns: argparse.Namespace,
    hardware: Mapping[str, Any],
    pool: dict[str, Any],
    *,
    credentials: Any,
    job_client: Any = None,
    storage_client: Any = None,
    session: Any = None,
    registry_host: str = "",
    root: Path = ROOT,
    poll_seconds: float = 15.0,
) -> int:
    """Finds the image, submits the job with `pool` on it and (unless `--no_wait`) reads its result;
    `registry_host` sends the image lookup elsewhere (tests)."""
    from google.cloud import aiplatform_v1

    if job_client is None:  # Vertex tried once first: out of reach is one line (launch.cloud.reach)
        reach(vertex_service(settings))
        job_client = aiplatform_v1.JobServiceClient(**client_args(vertex_endpoint(settings), credentials))
    if ns.image:
        image_uri = ns.image
    else:
        from components.image import registry_digest

        image, tag = checkout_image(settings, root)
        if session is None:
            from google.auth.transport.requests import AuthorizedSession

            session = AuthorizedSession(credentials)
        lookup = f"{registry_host}/{image.partition('/')[2]}" if registry_host else image
        try:
            digest = registry_digest(session, lookup, tag)
        except PermissionError as problem:
            print(
                f"{PROG}: cannot read the trainer image's tag with your credentials: {problem}",
                file=sys.stderr,
            )
            return 1
        if not digest:
            print(
                f"{PROG}: the trainer image of this checkout, {image}:{tag}, is not in Artifact Registry: "
                '`make run` builds it first, or give ARGS="--image <URI>" to check another image',
                file=sys.stderr,
            )
            return 2
        image_uri = f"{image}@{digest}"
        print(f"{PROG}: image {image}:{tag} ({digest})")
    pool["container_spec"]["image_uri"] = image_uri
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)
    output_dir = f"{settings.pipeline_root}/gpu-check/{stamp}"
    machine, gpu, gpus = (hardware[name] for name in HARDWARE)
    shape = f"{machine} + {gpus} x {gpu}" if gpus else f"{machine}, no GPU (the check will only list devices)"
    job = build_custom_job(settings, pool, output_dir, ns.timeout, f"gpu-check-{stamp}")
    created = job_client.create_custom_job(
        parent=f"projects/{settings.project}/locations/{settings.region}", custom_job=job
    )
    print(
        f"{PROG}: submitted {created.name} ({shape}) in {settings.region}\n"
        f"  console: {console_url(created.name)}\n"
        f"  logs:    gcloud ai custom-jobs stream-logs {created.name}\n"
        f"  result:  {output_dir}/model/{RESULT_FILE}",
        flush=True,
    )
    if ns.no_wait:
        return 0
    try:
        final = wait(job_client, created.name, poll_seconds)
    except KeyboardInterrupt:
        job_client.cancel_custom_job(name=created.name)
        print(f"{PROG}: interrupted: cancelled {created.name}", file=sys.stderr)
        return 130
    if storage_client is None:
        import google.cloud.storage as storage

        storage_client = storage.Client(project=settings.project, credentials=credentials)
    if result := read_result(storage_client, output_dir):
        print("\n".join(describe(result)))
    state = final.state.name
    if state == "JOB_STATE_SUCCEEDED" and result and result.get("ok"):
        print(f"{PROG}: OK: the image sees the GPUs it was given")
        return 0
    why = (
        (result or {}).get("error")
        or " ".join(final.error.message.split())
        or f"no {RESULT_FILE} was written (the job never ran the check: see its logs)"
    )
    print(f"{PROG}: the check failed ({state}): {why}", file=sys.stderr)
    return 1


def main(
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] = os.environ,
    env_file: Path = Path("env.sh"),
    **injected: Any,
) -> int:
    """`make gpu-check`; `injected` (credentials, clients) are for tests."""
    ns = build_parser(hardware_defaults()).parse_args(argv)  # exits 2 on a bad flag
    try:
        project = configured_project(environ, env_file)  # as `make run` finds it
    except settings_mod.SettingsError as err:
        sys.stderr.write(f"{PROG}: {err}\n")
        return 2
    if not project:
        sys.stderr.write(
            f"{PROG}: needs a Google Cloud project: set PROJECT_ID, REGION, PIPELINE_ROOT and "
            "ARTIFACT_REPOSITORY in env.sh or the environment; on this machine's own devices: "
            ".venv/bin/python -m trainer.gpucheck\n"
        )
        return 2
    config = load_settings(PROG, lambda: settings_mod.load(environ, env_file))  # REQUIRED, as `make run`
    if config is None:
        return 2
    from components.worker_pools import build_worker_pool_specs

    hardware = {name: getattr(ns, name) for name in HARDWARE}
    warnings: list[str] = []
    try:  # the flags, before any request: the job's one pool by the pipeline's own builder
        [pool] = build_worker_pool_specs(
            image_uri="check",
            command=COMMAND,
            args=[],
            **hardware,
            worker_count=0,
            region=config.region,
            check_gpu_region=ns.check_gpu_region,
            warnings=warnings,
        )
    except ValueError as problem:
        sys.stderr.write(f"{PROG}: bad flags (nothing was sent):\n{problem}\n")
        return 2
    sys.stdout.write("".join(f"WARNING: {warning}\n" for warning in warnings))

    def request() -> int:
        credentials = injected.pop("credentials", None)
        if credentials is None:
            import google.auth

            credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
        return run(config, ns, hardware, pool, credentials=credentials, **injected)

    return exit_status(PROG, request)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
