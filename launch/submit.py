"""Running the compiled pipeline on Vertex AI: submit (`make run` with a project), wait, and
schedules (`make schedule`, `make schedules`, `make schedule-pause|resume|delete`).

Everything is sent by the real client libraries (google-cloud-storage, google-cloud-aiplatform's
`PipelineJob`/`PipelineJobSchedule`, kfp's `RegistryClient`); settings are validated first
(`launch.settings`), so a bad setting costs no request.

    python -m launch.submit schedule --cron '0 6 * * 1' [--timezone Europe/Paris]
        [--max_concurrent_runs 1] [--start_time ISO] [--end_time ISO] [--<parameter> VALUE ...]
    python -m launch.submit schedules | pause NAME | resume NAME | delete NAME
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from components.buildcontext import write_context_tarball
from launch import flags
from launch import settings as settings_mod
from launch.settings import Settings, SettingsError

ROOT = Path(__file__).resolve().parent.parent
COMPILED = ROOT / "compiled" / "pipeline.json"
TERMINAL = ("PIPELINE_STATE_SUCCEEDED", "PIPELINE_STATE_FAILED", "PIPELINE_STATE_CANCELLED")


def source_commit(root: Path = ROOT, environ: Mapping[str, str] = os.environ) -> str:
    """The checkout's commit, with `-dirty` when it has uncommitted changes. Where the source
    has no `.git` (Cloud Build hands its steps the source without it), `SOURCE_COMMIT` from the
    environment (cloudbuild.yaml sets it from the `$COMMIT_SHA` substitution); else ''."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        given = environ.get("SOURCE_COMMIT", "").strip()
        if given and not re.fullmatch(r"[0-9a-f]{7,40}", given):
            raise ValueError(
                f"SOURCE_COMMIT must be a git commit (7 to 40 hex digits), got {given!r}"
            ) from None
        return given
    return commit + ("-dirty" if dirty else "")


EMAIL = re.compile(r"^[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+$")


def check_notification_emails(emails: Any) -> list[str]:
    """`notification_emails` as VertexNotificationEmailOp may receive it: one to three addresses
    (GCPC's `vertex_notification_email` docstring and Google's "Configure email notifications"
    page: "up to 3 emails"). [] or None: no notification (the template without the handler)."""
    if emails in (None, []):
        return []
    if not isinstance(emails, list) or not all(isinstance(e, str) for e in emails):
        raise ValueError(f"notification_emails must be a JSON list of addresses, got {emails!r}")
    bad = [e for e in emails if not EMAIL.match(e)]
    if bad:
        raise ValueError(f"notification_emails: not e-mail addresses: {', '.join(map(repr, bad))}")
    if not 1 <= len(emails) <= 3:
        raise ValueError(
            f"notification_emails takes one to three addresses (Vertex's limit), got {len(emails)}"
        )
    return list(emails)


def pipeline_parameters(
    given: Mapping[str, Any], settings: Settings, context_uri: str, commit: str
) -> dict[str, Any]:
    """The PipelineJob's parameter values: the submitter's settings plus the flags given."""
    values = {k: v for k, v in given.items() if v is not None}
    labels = {**settings.labels, **values.pop("labels", {})}
    values.update(
        project=settings.project,
        location=settings.region,
        context_uri=context_uri,
        artifact_repository=settings.artifact_repository,
        source_commit=commit,
    )
    overrides = {
        "service_account": settings.service_account,
        "network": settings.network,
        "encryption_spec_key_name": settings.kms_key,
    }
    values.update({k: v for k, v in overrides.items() if v and k not in given})
    if labels:
        values["labels"] = labels
    return values


def check_hardware(values: Mapping[str, Any], compiled: Mapping[str, Any], region: str) -> None:
    """The worker pools the run will ask for, validated for `region` (GPU types it offers), and
    the registry's parameters (display name, a serving image that exists)."""
    from components import registry, worker_pools

    defaults = {
        name: p.get("defaultValue") for name, p in compiled["root"]["inputDefinitions"]["parameters"].items()
    }
    v = {**defaults, **values}
    registry.check_registry_parameters({**v, "location": region})
    hardware: dict[str, Any] = {
        k: int(v[k]) if isinstance(v[k], float) else v[k] for k in worker_pools.HARDWARE_PARAMETERS
    }
    worker_pools.build_worker_pool_specs(
        image_uri="check", command=["python"], args=[], **hardware, region=region
    )


def upload_context(settings: Settings, root: Path = ROOT, credentials: Any = None) -> str:
    """Uploads the build context tarball to `<PIPELINE_ROOT>/contexts/<tag>.tar.gz` (once per
    content) and returns its gs:// URI."""
    import google.cloud.storage as storage

    buf = io.BytesIO()
    tag = write_context_tarball(root, buf)
    prefix = settings.pipeline_root.removeprefix(f"gs://{settings.bucket}").strip("/")
    name = "/".join(p for p in (prefix, "contexts", f"{tag}.tar.gz") if p)
    client = storage.Client(project=settings.project, credentials=credentials)
    blob = client.bucket(settings.bucket).blob(name)
    if not blob.exists():
        blob.upload_from_string(buf.getvalue(), content_type="application/gzip")
        print(f"uploaded the build context to gs://{settings.bucket}/{name}")
    else:
        print(f"build context unchanged: gs://{settings.bucket}/{name}")
    return f"gs://{settings.bucket}/{name}"


def init_aiplatform(settings: Settings, credentials: Any = None, transport: str | None = None) -> None:
    from google.cloud import aiplatform

    kwargs: dict[str, Any] = {"project": settings.project, "location": settings.region}
    if credentials is not None:
        kwargs["credentials"] = credentials
    if settings.api_endpoint:
        kwargs["api_endpoint"] = settings.api_endpoint
    if transport:
        kwargs["api_transport"] = transport
    if settings.kms_key:
        kwargs["encryption_spec_key_name"] = settings.kms_key
    aiplatform.init(**kwargs)


def build_pipeline_job(
    settings: Settings,
    values: Mapping[str, Any],
    template: Path = COMPILED,
    display_name: str = "",
    template_uri: str = "",
) -> Any:
    """The `aiplatform.PipelineJob` for the compiled template, or for its version in Artifact
    Registry when `template_uri` is given (the SDK reads it from there and the run names it:
    `template_path` takes `https://<region>-kfp.pkg.dev/...` URIs). Unknown parameters are
    rejected here, before any request to Vertex."""
    from google.cloud import aiplatform

    job = aiplatform.PipelineJob(
        display_name=display_name or "multiworker-cassava-training",
        template_path=template_uri or str(template),
        pipeline_root=settings.pipeline_root,
        parameter_values=dict(values),
        enable_caching=settings.enable_caching,
        labels={**settings.labels, "source_commit": str(values.get("source_commit", ""))[:63] or "unknown"},
        encryption_spec_key_name=settings.kms_key or None,
        project=settings.project,
        location=settings.region,
    )
    return job


def console_url(resource_name: str) -> str:
    """The Cloud console page of a pipeline run, from its resource name
    (`projects/<p>/locations/<l>/pipelineJobs/<id>`)."""
    match = re.fullmatch(r"projects/([^/]+)/locations/([^/]+)/pipelineJobs/([^/]+)", resource_name)
    if not match:
        raise ValueError(f"not a pipeline job resource name: {resource_name!r}")
    project, location, run = match.groups()
    return f"https://console.cloud.google.com/vertex-ai/locations/{location}/pipelines/runs/{run}?project={project}"


def watch(job: Any, out: Any = None, poll_seconds: float = 15.0) -> str:
    """Waits for the job, printing each task's state as it changes; returns the final state."""
    out = out or sys.stdout
    seen: dict[str, str] = {}
    while True:
        state = job.state.name  # each read fetches the job
        for task in job.task_details:
            task_state = type(task).State(task.state).name
            if seen.get(task.task_name) != task_state:
                seen[task.task_name] = task_state
                out.write(f"  {task.task_name:<32} {task_state}\n")
                out.flush()
        if state in TERMINAL:
            return str(state)
        time.sleep(poll_seconds)


def submit(
    settings: Settings,
    given: Mapping[str, Any],
    *,
    wait: bool = False,
    credentials: Any = None,
    transport: str | None = None,
    root: Path = ROOT,
    template: Path = COMPILED,
    poll_seconds: float = 15.0,
) -> int:
    """Uploads the context and submits the run; with `wait`, follows it to the end. The template
    is the one with the e-mail exit handler only when `notification_emails` are given."""
    given, template = _with_template(given, template)
    compiled = json.loads(template.read_text())
    check_hardware(given, compiled, settings.region)
    init_aiplatform(settings, credentials, transport)
    commit = source_commit(root)
    context_uri = upload_context(settings, root, credentials)
    values = pipeline_parameters(given, settings, context_uri, commit)
    job = build_pipeline_job(settings, values, template)
    job.submit(
        service_account=settings.service_account or None,
        network=settings.network or None,
        experiment=settings.experiment or None,
    )
    print(f"submitted {job.resource_name}\nconsole: {console_url(job.resource_name)}", flush=True)
    if not wait:
        return 0
    state = watch(job, poll_seconds=poll_seconds)
    print(f"run ended {state}")
    return 0 if state == "PIPELINE_STATE_SUCCEEDED" else 1


def _with_template(given: Mapping[str, Any], template: Path) -> tuple[dict[str, Any], Path]:
    """Validates `notification_emails`; picks the notify template for a run that has them (when
    `template` is the default one) and drops the parameter for a run that has none."""
    import pipeline

    values = dict(given)
    emails = check_notification_emails(values.pop("notification_emails", None))
    if emails:
        values["notification_emails"] = emails
        if template == pipeline.COMPILED:
            template = pipeline.COMPILED_NOTIFY
    return values, template


def main(ns: argparse.Namespace, environ: Mapping[str, str], project: str) -> int:
    """`make run` with a project configured (called by launch.cli)."""
    import pipeline

    try:
        settings = settings_mod.load(environ)
    except SettingsError as err:
        print(
            f"make run: cannot submit to Vertex AI; fix these settings (env or env.sh):\n{err}",
            file=sys.stderr,
        )
        return 2
    print(
        f"make run: submitting to Vertex AI in project {settings.project}, {settings.region} (PROJECT_ID is set)",
        flush=True,
    )
    given = {
        q.name: getattr(ns, q.name)
        for q in pipeline.parameters_for("vertex")
        if getattr(ns, q.name, None) is not None
    }
    try:
        return submit(settings, given, wait=environ.get("WAIT", "") not in ("", "0", "false"))
    except ValueError as err:
        print(f"make run: {err}", file=sys.stderr)
        return 2


# --- schedules ----------------------------------------------------------------------------------


def upload_template(
    settings: Settings, template: Path = COMPILED, commit: str = "", auth: Any = None, host: str = ""
) -> str:
    """Uploads the compiled template to Artifact Registry, tagged with the commit and `latest`;
    returns the template version's URI (under TEMPLATE_REPOSITORY; `host` sends the upload
    elsewhere, for tests)."""
    from kfp.registry import RegistryClient

    if not settings.template_repository:
        raise SettingsError(
            f"TEMPLATE_REPOSITORY is not set: {settings_mod.SETTINGS['TEMPLATE_REPOSITORY'][0]}"
        )
    import pipeline

    client = RegistryClient(host=host or settings.template_repository, auth=auth)
    # Both templates are versions of one package (one pipeline name): the e-mailing one's tags
    # carry a suffix, so `<commit>` and `latest` always name the template without the handler.
    suffix = "-notify" if template.name == pipeline.COMPILED_NOTIFY.name else ""
    tags = [
        t + suffix
        for t in (
            commit.replace("-dirty", "")[:40] if commit and not commit.endswith("-dirty") else "",
            "latest",
        )
        if t
    ]
    package, version = client.upload_pipeline(file_name=str(template), tags=tags)
    uri = f"{settings.template_repository.rstrip('/')}/{package}/{version}"
    print(f"template {uri} (tags: {', '.join(tags)})")
    return uri


def create_schedule(
    settings: Settings,
    given: Mapping[str, Any],
    *,
    cron: str,
    timezone: str = "",
    max_concurrent_runs: int = 1,
    start_time: str | None = None,
    end_time: str | None = None,
    credentials: Any = None,
    transport: str | None = None,
    registry_auth: Any = None,
    registry_host: str = "",
    root: Path = ROOT,
    template: Path = COMPILED,
) -> Any:
    """A Vertex pipeline schedule of the template version pinned to this commit."""
    from google.cloud import aiplatform

    if len(cron.split()) != 5:
        raise ValueError(f"CRON must have five fields (minute hour day month weekday), got {cron!r}")
    if max_concurrent_runs < 1:
        raise ValueError(f"max_concurrent_runs must be >= 1, got {max_concurrent_runs}")
    commit = source_commit(root)
    if commit.endswith("-dirty"):
        raise ValueError(
            "the checkout has uncommitted changes: a schedule must be pinned to a commit; commit first"
        )
    given, template = _with_template(given, template)
    compiled = json.loads(template.read_text())
    check_hardware(given, compiled, settings.region)
    init_aiplatform(settings, credentials, transport)
    context_uri = upload_context(settings, root, credentials)
    template_uri = upload_template(settings, template, commit, registry_auth, registry_host)
    values = pipeline_parameters(given, settings, context_uri, commit)
    job = build_pipeline_job(settings, values, template, template_uri=template_uri)
    schedule = aiplatform.PipelineJobSchedule(
        pipeline_job=job, display_name=f"multiworker-cassava-training-{commit[:8]}"
    )
    schedule.create(
        cron=f"TZ={timezone} {cron}" if timezone else cron,
        max_concurrent_run_count=max_concurrent_runs,
        start_time=start_time,
        end_time=end_time,
        service_account=settings.service_account or None,
        network=settings.network or None,
    )
    print(f"created schedule {schedule.resource_name}")
    return schedule


def schedule_command(argv: Sequence[str], environ: Mapping[str, str] = os.environ) -> int:
    import pipeline

    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    action, rest = argv[0], list(argv[1:])
    try:
        settings = settings_mod.load(environ)
    except SettingsError as err:
        print(f"cannot reach Vertex AI; fix these settings (env or env.sh):\n{err}", file=sys.stderr)
        return 2
    from google.cloud import aiplatform

    if action == "schedule":
        parser = flags.build_parser(pipeline.parameters_for("vertex"))
        parser.prog = "make schedule CRON=..."
        parser.add_argument("--cron", required=True)
        parser.add_argument("--timezone", default="")
        parser.add_argument("--max_concurrent_runs", type=int, default=1)
        parser.add_argument("--start_time", default=None)
        parser.add_argument("--end_time", default=None)
        ns = parser.parse_args(rest)
        given = {
            q.name: getattr(ns, q.name)
            for q in pipeline.parameters_for("vertex")
            if getattr(ns, q.name) is not None
        }
        try:
            create_schedule(
                settings,
                given,
                cron=ns.cron,
                timezone=ns.timezone,
                max_concurrent_runs=ns.max_concurrent_runs,
                start_time=ns.start_time,
                end_time=ns.end_time,
            )
        except ValueError as err:
            print(f"make schedule: {err}", file=sys.stderr)
            return 2
        return 0
    init_aiplatform(settings)
    if action == "schedules":
        for s in aiplatform.PipelineJobSchedule.list():
            state = s.state.name if s.state is not None else "?"
            print(f"{s.resource_name}  {s.display_name}  {state}  cron={s.cron!r}")
        return 0
    if action in ("pause", "resume", "delete") and len(rest) == 1:
        schedule = aiplatform.PipelineJobSchedule.get(rest[0])
        getattr(schedule, action)()
        print(
            f"{action}d {schedule.resource_name}" if action != "pause" else f"paused {schedule.resource_name}"
        )
        return 0
    print(
        f"unknown schedule command {' '.join(argv)!r}; use schedule, schedules, pause NAME, resume NAME or delete NAME",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(schedule_command(sys.argv[1:]))
