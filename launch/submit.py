"""Running the compiled pipeline on Vertex AI: submit (`make run` with a project) and wait.
Schedules are `launch.schedules`, built on this. Settings and make's variables (in the environment,
never through a shell) are checked before any request. Exit status: docs/running.md#exit-codes-and-make.
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
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from components.buildcontext import write_context_tarball
from launch import cloud, trainingconfig
from launch import settings as settings_mod
from launch.cloud import GoogleRefused, GoogleUnreachable
from launch.settings import Settings, SettingsError
from local import ROOT

# The states a run waits in no more (aiplatform's pipeline_jobs._PIPELINE_COMPLETE_STATES).
TERMINAL = (
    "PIPELINE_STATE_SUCCEEDED",
    "PIPELINE_STATE_FAILED",
    "PIPELINE_STATE_CANCELLED",
    "PIPELINE_STATE_PAUSED",
)


def source_commit(root: Path = ROOT, environ: Mapping[str, str] = os.environ) -> str:
    """The checkout's commit, `-dirty` with uncommitted changes; without `.git` (Cloud Build's
    source), `SOURCE_COMMIT` (cloudbuild.yaml sets it from `$COMMIT_SHA`); else ''."""
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
        "build_location": settings.build_region,
        "persistent_resource_id": settings.persistent_resource_id,
    }
    values.update({k: v for k, v in overrides.items() if v and k not in given})
    if labels:
        values["labels"] = labels
    return values


def run_values(values: Mapping[str, Any], compiled: Mapping[str, Any]) -> dict[str, Any]:
    """The run's parameter values: the compiled template's defaults with `values` over them."""
    declared = compiled["root"]["inputDefinitions"]["parameters"]
    v = {**{name: p.get("defaultValue") for name, p in declared.items()}, **values}
    # The template's JSON numbers are doubles: an INTEGER parameter's default reads 1.0.
    integer = {name for name, p in declared.items() if p.get("parameterType") == "NUMBER_INTEGER"}
    return {
        k: int(x) if k in integer and isinstance(x, float) and x.is_integer() else x for k, x in v.items()
    }


def upload_context(settings: Settings, root: Path = ROOT, credentials: Any = None) -> str:
    """Uploads the build context to `<PIPELINE_ROOT>/contexts/<tag>.tar.gz` once per content (made,
    a refused file named, before any contact); returns its gs:// URI."""
    import google.cloud.storage as storage

    buf = io.BytesIO()
    tag = write_context_tarball(root, buf)
    prefix = settings.pipeline_root.removeprefix(f"gs://{settings.bucket}").strip("/")
    name = "/".join(p for p in (prefix, "contexts", f"{tag}.tar.gz") if p)
    client = storage.Client(project=settings.project, credentials=credentials)  # finds the credentials
    service = (f"Cloud Storage for gs://{settings.bucket}", str(client.api_endpoint), "")
    cloud.reach(service)
    blob = client.bucket(settings.bucket).blob(name)
    with cloud.reaching("the build context's upload", service):
        if not blob.exists():
            blob.upload_from_string(buf.getvalue(), content_type="application/gzip")
            print(f"uploaded the build context to gs://{settings.bucket}/{name}")
        else:
            print(f"build context unchanged: gs://{settings.bucket}/{name}")
    return f"gs://{settings.bucket}/{name}"


def init_aiplatform(settings: Settings, credentials: Any = None, transport: str | None = None) -> None:
    """aiplatform's defaults for this machine's requests; its credentials found, before any contact."""
    from google.cloud import aiplatform
    from google.cloud.aiplatform import initializer

    aiplatform.init(  # a None is left as it was (aiplatform/initializer.py, `init`)
        project=settings.project,
        location=settings.region,
        credentials=credentials,
        api_endpoint=settings.api_endpoint or None,
        # REST for a plain-HTTP API_ENDPOINT, as `cloud.client_args`.
        api_transport=transport or ("rest" if settings.api_endpoint.startswith("http://") else None),
        encryption_spec_key_name=settings.kms_key or None,
    )
    initializer.global_config.credentials  # noqa: B018


class PersistentResourceRefused(ValueError):
    """The run's persistent resource cannot run its jobs: one line; nothing was created (exit 2)."""


def check_persistent_resource(settings: Settings, values: Mapping[str, Any], client: Any = None) -> list[str]:
    """Reads the run's persistent resource (if any) before anything is uploaded or created, and
    judges it by `persistent_resource_fit`: PersistentResourceRefused when missing or unfit; prints
    and returns the warnings. Through aiplatform_v1's client, not aiplatform's `PersistentResource`,
    whose read retries a 429/500/503 for 120 s (aiplatform/base.py `_get_gca_resource`)."""
    from google.api_core import exceptions
    from google.cloud import aiplatform_v1
    from google.cloud.aiplatform import initializer

    from pipeline.options import persistent_resource

    resource_id = str(values.get("persistent_resource_id") or "")
    if not resource_id:
        return []
    name = f"projects/{settings.project}/locations/{settings.region}/persistentResources/{resource_id}"
    if client is None:  # with the credentials init_aiplatform found
        client = aiplatform_v1.PersistentResourceServiceClient(
            **cloud.client_args(cloud.vertex_endpoint(settings), initializer.global_config.credentials)
        )
    try:
        with cloud.calling_vertex(
            f"reading the persistent resource {name}", settings, "; nothing of the run was sent"
        ):
            resource = client.get_persistent_resource(name=name)
    except exceptions.NotFound:
        raise PersistentResourceRefused(
            f"persistent_resource_id: there is no persistent resource {resource_id!r} in project "
            f"{settings.project}, region {settings.region} (the run's): `gcloud ai persistent-resources "
            f"list --region {settings.region}` lists them; create it ({persistent_resource.PERSISTENT_RESOURCE_DOC}) "
            "or leave PERSISTENT_RESOURCE_ID unset to run on demand"
        ) from None
    problems, warnings = persistent_resource.persistent_resource_fit(resource, values, settings.region)
    if problems:
        raise PersistentResourceRefused(
            f"persistent_resource_id: the persistent resource {resource.name or name} cannot run this run's "
            f"jobs: {'; '.join(problems)}. Change the resource or the run, or leave persistent_resource_id "
            f"empty (PERSISTENT_RESOURCE_ID unset) to run on demand ({persistent_resource.PERSISTENT_RESOURCE_DOC})"
        )
    print(
        f"persistent resource {resource.name or name}: RUNNING; {', '.join(persistent_resource.PERSISTENT_RESOURCE_JOBS)} "
        "run on it",
        flush=True,
    )
    for warning in warnings:
        print(f"WARNING: {warning}", flush=True)
    return warnings


def build_pipeline_job(settings: Settings, values: Mapping[str, Any], template_path: str) -> Any:
    """The `aiplatform.PipelineJob` of a compiled template or its Artifact Registry version
    (`https://<region>-kfp.pkg.dev/...`); unknown parameters are rejected here, before any request.
    The v1 class, never the preview one sending v1beta1 `RuntimeConfig.default_runtime`
    (aiplatform/preview/pipelinejob/pipeline_jobs.py): docs/architecture.md#the-pipelines-own-steps-not-on-the-resource."""
    from google.cloud import aiplatform

    return aiplatform.PipelineJob(
        display_name="multiworker-cassava-training",
        template_path=template_path,
        pipeline_root=settings.pipeline_root,
        parameter_values=dict(values),
        enable_caching=settings.enable_caching,
        labels={**settings.labels, "source_commit": str(values.get("source_commit", ""))[:63] or "unknown"},
        encryption_spec_key_name=settings.kms_key or None,
        project=settings.project,
        location=settings.region,
    )


def console_url(name: str) -> str:
    """The Cloud console page of a pipeline run or a CustomJob, from its resource name, as aiplatform
    composes it (`PipelineJob._dashboard_uri`; `jobs._Job._dashboard_uri`, job type `training`); ""
    for another name (shown once the job exists: never a reason to stop)."""
    match = re.fullmatch(r"projects/([^/]+)/locations/([^/]+)/(pipelineJobs|customJobs)/([^/]+)", name)
    if not match:
        return ""
    project, location, kind, job = match.groups()
    page = (
        "vertex-ai/locations/{}/pipelines/runs"
        if kind == "pipelineJobs"
        else "agent-platform/locations/{}/training"
    )
    return f"https://console.cloud.google.com/{page.format(location)}/{job}?project={project}"


def watch(job: Any, poll_seconds: float = 15.0) -> str:
    """Waits for the job, printing each task's state as it changes; returns the final state."""
    seen: dict[str, str] = {}
    while True:
        state = job.state.name  # each read fetches the job
        for task in job.task_details:
            task_state = type(task).State(task.state).name
            if seen.get(task.task_name) != task_state:
                seen[task.task_name] = task_state
                print(f"  {task.task_name:<32} {task_state}", flush=True)
        if state in TERMINAL:
            return str(state)
        time.sleep(poll_seconds)


def prepare(
    settings: Settings,
    given: Mapping[str, Any],
    root: Path,
    credentials: Any,
    transport: str | None,
    pinned: bool = False,
) -> tuple[Path, dict[str, Any], str]:
    """Before a run or a schedule (`pinned`: no uncommitted changes) is sent: every option checked,
    the persistent resource read, the build context uploaded. Returns the template (with the e-mail
    exit handler only given `notification_emails`), the run's parameter values and the commit."""
    import pipeline
    from pipeline import options
    from pipeline.options import notification

    given = dict(given)
    emails = notification.check_notification_emails(given.pop("notification_emails", None))
    if emails:
        given["notification_emails"] = emails
    template = pipeline.template_for(emails)
    compiled = json.loads(template.read_text())
    # The run's values, with stand-ins for the context and commit (not options), checked before any request.
    checked = run_values(pipeline_parameters(given, settings, "gs://check/context.tar.gz", ""), compiled)
    for warning in options.check(checked, "vertex", settings.region):
        print(f"WARNING: {warning}", flush=True)
    commit = source_commit(root)
    if pinned and commit.endswith("-dirty"):
        raise ValueError(
            "the checkout has uncommitted changes: a schedule must be pinned to a commit; commit first"
        )
    if pinned and not commit:
        raise ValueError(
            "no git commit found (not a git checkout, no commit yet, or git refused the folder): a "
            "schedule must be pinned to a commit; commit, or set SOURCE_COMMIT"
        )
    init_aiplatform(settings, credentials, transport)
    # For a schedule, as it is today (docs/architecture.md#a-warm-pool-the-jobs-on-a-vertex-persistent-resource).
    check_persistent_resource(settings, checked)
    with cloud.refused_as(
        f"the build context's upload to gs://{settings.bucket}",
        f"roles/storage.objectAdmin on gs://{settings.bucket}",
        settings,
    ):
        context_uri = upload_context(settings, root, credentials)
    return template, pipeline_parameters(given, settings, context_uri, commit), commit


def submit(
    settings: Settings,
    given: Mapping[str, Any],
    *,
    wait: bool = False,
    credentials: Any = None,
    transport: str | None = None,
    root: Path = ROOT,
    poll_seconds: float = 15.0,
    runs_dir: Path | None = None,
) -> int:
    """Uploads the context and submits the run; with `wait`, follows it to the end, then writes
    its report (`write_run_report`, given `runs_dir`)."""
    template, values, _ = prepare(settings, given, root, credentials, transport)
    job = build_pipeline_job(settings, values, str(template))
    with cloud.calling_vertex(
        "the pipeline run's submission", settings, "; the run was not created", "the pipeline run"
    ):
        try:
            job.submit(
                service_account=settings.service_account or None,
                network=settings.network or None,
                experiment=settings.experiment or None,
                # aiplatform_v1 `PipelineJob.preflight_validations`: "Whether to do component level
                # validations before job creation".
                enable_preflight_validations=settings.preflight_validations,
            )
        except Exception as err:  # the SDK raises a bare Exception for these only
            if str(err).startswith(PREFLIGHT_FAILED):
                raise PreflightRefused(str(err)) from err
            # The experiment's lookup wraps its failure (a 403, no network) in a bare RuntimeError
            # (aiplatform metadata/experiment_resources.py): before the run's creation, the cause is
            # said as any refusal is; after it, the run goes on unrecorded, and says so.
            if not (isinstance(err, RuntimeError) and isinstance(err.__cause__, Exception)):
                raise
            if not job._gca_resource.name:  # the run was not created
                raise err.__cause__ from err
            if not settings.experiment:
                raise
            print(f"WARNING: the run is not recorded in EXPERIMENT={settings.experiment}: {err.__cause__}")
    console = console_url(job.resource_name)
    print(f"submitted {job.resource_name}\nconsole: {console}", flush=True)
    if not wait:
        return 0
    with cloud.reaching(
        "following the run", cloud.vertex_service(settings), f"; the run was submitted and goes on: {console}"
    ):
        state = watch(job, poll_seconds=poll_seconds)
    print(f"run ended {state}")
    if runs_dir is not None:
        write_run_report(job, settings, runs_dir, credentials)
    return 0 if state == "PIPELINE_STATE_SUCCEEDED" else 1


def write_run_report(job: Any, settings: Settings, runs_dir: Path, credentials: Any = None) -> None:
    """`make run WAIT=1` at the run's end: summary.json and report.html as `make report` writes
    them; one that cannot be written is a warning, never a change to how the run ended."""
    from launch import vertexreader, vertexrun

    reader = vertexreader.Reader(settings, credentials)
    try:
        vertexrun.write(job.gca_resource, reader, runs_dir, console=console_url(job.resource_name))
    except Exception as err:  # noqa: BLE001 (named in the warning; the run's end is what counts)
        why = (
            str(err)
            if isinstance(err, (GoogleUnreachable, GoogleRefused))
            else f"{type(err).__name__}: {err}"
        )
        print(
            f"WARNING: the run's report was not written ({why}); "
            f"`make report RUN={job.resource_name}` writes it",
            flush=True,
        )


# How aiplatform's PipelineJob.submit raises Vertex's preflight refusal: `Exception("<this> with the
# following errors:\n1. ...")` (google/cloud/aiplatform/pipeline_jobs.py, `submit`).
PREFLIGHT_FAILED = "PipelineJob Preflight validations failed"


class PreflightRefused(ValueError):
    """Vertex's preflight validations refused the run before it was created."""

    def __init__(self, text: str) -> None:
        errors = [line.strip() for line in text.splitlines()[1:] if line.strip()]
        super().__init__(
            "Vertex's preflight validations refused the run, nothing was created: "
            + ("; ".join(errors) or text)
            + " (PREFLIGHT_VALIDATIONS=false skips Google's check)"
        )


def no_credentials(prog: str, err: Exception) -> str:
    """One line: what is missing, and ADC's three sources in its search order ("How Application
    Default Credentials works", https://cloud.google.com/docs/authentication/application-default-credentials)."""
    from google.auth import exceptions

    what = (
        "the Google Cloud credentials were refused"
        if isinstance(err, exceptions.RefreshError)
        else "no Google Cloud credentials"
    )
    return (
        f"{prog}: {what} ({cloud.said(err)}); provide Application Default Credentials: run "
        "`gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS to a "
        "service account key file, or run where a service account is attached (Compute Engine, "
        "Cloud Build, Cloud Run, GKE)"
    )


def check_wait(text: str) -> bool:
    """WAIT (`make run WAIT=1`): follow the Vertex run to its end."""
    if text.lower() not in ("", "0", "false", "no", "1", "true", "yes"):
        raise ValueError(
            f"WAIT={text!r} is not valid: expected 1, true or yes (follow the run to its end), "
            "or 0, false, no or empty (submit and return)"
        )
    return text.lower() in ("1", "true", "yes")


def load_settings(prog: str, load: Callable[[], Settings], doing: str = "reach") -> Settings | None:
    """The settings `load` reads; None when any is bad, each named on stderr (exit code 2, nothing sent)."""
    try:
        return load()
    except SettingsError as err:
        print(
            f"{prog}: cannot {doing} Vertex AI; fix these settings (env or env.sh):\n{err}", file=sys.stderr
        )
        return None


def exit_status(prog: str, request: Callable[[], int]) -> int:
    """`request`'s exit status; what stops it is one line on stderr: Google Cloud out of reach (1),
    no credentials (google-auth raises these before the request is sent) or a refused input (2)."""
    from google.auth import exceptions as auth

    try:
        return request()
    except GoogleUnreachable as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 1
    except (auth.DefaultCredentialsError, auth.RefreshError) as err:
        print(no_credentials(prog, err), file=sys.stderr)
        return 2
    except ValueError as err:
        from pipeline import options

        why = f"bad parameters (nothing was sent):\n{err}" if isinstance(err, options.OptionsError) else err
        print(f"{prog}: {why}", file=sys.stderr)
        return 2


def with_flags(prog: str, ns: argparse.Namespace, request: Callable[[dict[str, Any]], int]) -> int:
    """`exit_status` of `request` given the parameters set by flags (`--training_config` applied)."""
    import pipeline

    try:
        trainingconfig.apply_to_namespace(ns, "vertex")
    except ValueError as err:
        print(f"{prog}: --training_config: {err}", file=sys.stderr)
        return 2
    given = {
        q.name: getattr(ns, q.name)
        for q in pipeline.parameters_for("vertex")
        if getattr(ns, q.name, None) is not None
    }
    return exit_status(prog, lambda: request(given))


def main(ns: argparse.Namespace, environ: Mapping[str, str], project: str) -> int:
    """`make run` with a project configured (called by launch.cli)."""
    try:
        wait = check_wait(environ.get("WAIT", ""))
    except ValueError as err:
        print(f"make run: {err}", file=sys.stderr)
        return 2
    settings = load_settings("make run", lambda: settings_mod.load(environ), "submit to")
    if settings is None:
        return 2
    print(
        f"make run: submitting to Vertex AI in project {settings.project}, {settings.region} (PROJECT_ID is set)",
        flush=True,
    )
    runs_dir = Path(ns.runs_dir)
    return with_flags("make run", ns, lambda given: submit(settings, given, wait=wait, runs_dir=runs_dir))
