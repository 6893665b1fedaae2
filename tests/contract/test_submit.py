"""`make run` (Vertex target) and `make schedule` against local fakes: the real aiplatform SDK
over REST to a fake Vertex API, the real storage client to gcp-storage-emulator, kfp's
RegistryClient to a fake Artifact Registry; and every bad setting stopped before any request."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.auth.credentials import AnonymousCredentials

import pipeline
from components import buildcontext
from launch import cli, cloud, schedules, settings, submit
from tests.conftest import TEST_BUCKET
from tests.fakes import RestFake

ROOT = Path(__file__).resolve().parents[2]
BUCKET = TEST_BUCKET
JOBS = r"/v1/projects/p-proj/locations/us-central1/pipelineJobs"


@pytest.fixture
def vertex(monkeypatch: pytest.MonkeyPatch) -> Iterator[RestFake]:
    fake = RestFake()
    jobs: dict[str, dict[str, Any]] = {}

    def create_job(_m: Any, query: dict[str, list[str]], body: dict[str, Any]) -> tuple[int, Any]:
        name = f"projects/p-proj/locations/us-central1/pipelineJobs/{query['pipelineJobId'][0]}"
        jobs[name] = {**body, "name": name, "state": "PIPELINE_STATE_PENDING", "polls": 0}
        return 200, {k: v for k, v in jobs[name].items() if k != "polls"}

    def get_job(match: re.Match[str], _q: Any, _b: Any) -> tuple[int, Any]:
        job = jobs[match.group(1)]
        job["polls"] += 1
        running = job["polls"] < 3
        job["state"] = "PIPELINE_STATE_RUNNING" if running else "PIPELINE_STATE_SUCCEEDED"
        tasks = [{"taskName": "train-model", "state": "RUNNING" if running else "SUCCEEDED"}]
        return 200, {**{k: v for k, v in job.items() if k != "polls"}, "jobDetail": {"taskDetails": tasks}}

    def create_schedule(_m: Any, _q: Any, body: dict[str, Any]) -> tuple[int, Any]:
        return 200, {**body, "name": "projects/p-proj/locations/us-central1/schedules/77", "state": "ACTIVE"}

    # submit() first probes the pipeline-root bucket's owner through Resource Manager (no fake of
    # that service here): record the probe instead (docs/facts.md, fact 13).
    from google.cloud.aiplatform.utils import gcs_utils

    probes: list[str] = []
    monkeypatch.setattr(
        gcs_utils,
        "create_gcs_bucket_for_pipeline_artifacts_if_it_does_not_exist",
        lambda output_artifacts_gcs_dir=None, **_: probes.append(output_artifacts_gcs_dir),
    )
    fake.probes = probes  # type: ignore[attr-defined]
    fake.route("POST", JOBS, create_job)
    fake.route("GET", r"/v1/(projects/p-proj/locations/us-central1/pipelineJobs/[^/]+)", get_job)
    fake.route("POST", r"/v1/projects/p-proj/locations/us-central1/schedules", create_schedule)
    yield fake
    fake.stop()


def env(vertex: RestFake, **extra: str) -> dict[str, str]:
    return {
        "PROJECT_ID": "p-proj",
        "REGION": "us-central1",
        "PIPELINE_ROOT": f"gs://{BUCKET}/root",
        "SERVICE_ACCOUNT": "pipelines@p-proj.iam.gserviceaccount.com",
        "ARTIFACT_REPOSITORY": "us-central1-docker.pkg.dev/p-proj/training",
        "TEMPLATE_REPOSITORY": "https://us-central1-kfp.pkg.dev/p-proj/pipelines",
        "NETWORK": "projects/123456/global/networks/vpc",
        "LABELS": "team=ml",
        "API_ENDPOINT": f"http://{vertex.address}",
        **extra,
    }


def test_submit_uploads_the_context_and_creates_the_pipeline_job(
    vertex: RestFake, gcs: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    config = settings.load(env(vertex), Path("/nonexistent"))
    code = submit.submit(
        config,
        {"epochs": 5, "tune": True, "labels": {"run": "nightly"}},
        wait=True,
        credentials=AnonymousCredentials(),
        transport="rest",
        poll_seconds=0.01,
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "console: https://console.cloud.google.com/vertex-ai/locations/us-central1/pipelines/runs/" in out
    assert "train-model" in out and "SUCCEEDED" in out and "run ended PIPELINE_STATE_SUCCEEDED" in out

    # The context is in the bucket, under its content tag.
    tag = buildcontext.context_tag(buildcontext.context_members(ROOT))
    blob = gcs.bucket(BUCKET).blob(f"root/contexts/{tag}.tar.gz")
    assert blob.exists()
    assert buildcontext.context_tag(buildcontext.tarball_members(blob.download_as_bytes())) == tag

    assert vertex.probes == [f"gs://{BUCKET}/root"]  # type: ignore[attr-defined]
    [body] = vertex.bodies("POST", JOBS)
    assert body["pipelineSpec"]["pipelineInfo"]["name"] == "multiworker-cassava-training"
    runtime = body["runtimeConfig"]
    assert runtime["gcsOutputDirectory"] == f"gs://{BUCKET}/root"
    values = runtime["parameterValues"]
    assert values["project"] == "p-proj" and values["location"] == "us-central1"
    assert values["context_uri"] == f"gs://{BUCKET}/root/contexts/{tag}.tar.gz"
    assert values["artifact_repository"] == "us-central1-docker.pkg.dev/p-proj/training"
    assert values["epochs"] == 5 and values["tune"] is True
    assert values["labels"] == {"team": "ml", "run": "nightly"}
    assert values["service_account"] == "pipelines@p-proj.iam.gserviceaccount.com"
    assert values["network"] == "projects/123456/global/networks/vpc"
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", values["source_commit"])
    assert body["serviceAccount"] == "pipelines@p-proj.iam.gserviceaccount.com"
    assert body["network"] == "projects/123456/global/networks/vpc"
    assert body["labels"]["team"] == "ml" and body["labels"]["source_commit"] == values["source_commit"][:63]
    assert body["preflightValidations"] is True  # Google's own checks, unless turned off


def test_preflight_validations_can_be_turned_off(vertex: RestFake, gcs: Any) -> None:
    config = settings.load(env(vertex, PREFLIGHT_VALIDATIONS="false"), Path("/nonexistent"))
    assert submit.submit(config, {}, credentials=AnonymousCredentials(), transport="rest") == 0
    [body] = vertex.bodies("POST", JOBS)
    assert not body.get("preflightValidations")  # proto3: false is not sent
    with pytest.raises(settings.SettingsError) as info:
        settings.load(env(vertex, PREFLIGHT_VALIDATIONS="maybe"), Path("/nonexistent"))
    assert info.value.settings == ["PREFLIGHT_VALIDATIONS"]


def test_a_run_refused_by_the_preflight_validations_is_one_line(
    vertex: RestFake, gcs: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Vertex answers 400 with CreatePipelineJobApiErrorDetail entries; the SDK turns them into
    `Exception("PipelineJob Preflight validations failed ...")` (pipeline_jobs.submit, whose
    pattern the fake's message follows: the details' form on the wire only a real run shows)."""

    def refuse(_m: Any, _q: Any, body: dict[str, Any]) -> tuple[int, Any]:
        assert body["preflightValidations"] is True
        detail = (
            'type.googleapis.com/google.cloud.aiplatform.v1.CreatePipelineJobApiErrorDetail"\n'
            "  error_cause=SERVICE_ACCOUNT, message=pipelines@p-proj cannot act as the job's account, cause=null"
        )
        return 400, {"error": {"code": 400, "message": detail, "status": "INVALID_ARGUMENT"}}

    vertex.routes.insert(0, ("POST", JOBS, refuse))
    config = settings.load(env(vertex), Path("/nonexistent"))
    with pytest.raises(submit.PreflightRefused) as info:
        submit.submit(config, {}, credentials=AnonymousCredentials(), transport="rest")

    def refused() -> int:
        raise info.value

    assert submit.exit_status("make run", refused) == 2
    line = capsys.readouterr().err.removesuffix("\n")  # what `make run` prints
    assert "\n" not in line
    assert line.startswith("make run: Vertex's preflight validations refused the run, nothing was created: ")
    assert "1. pipelines@p-proj cannot act as the job's account" in line
    assert "PREFLIGHT_VALIDATIONS=false" in line


def test_an_experiment_vertex_refuses_is_one_refusal_before_the_run(
    vertex: RestFake, gcs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiplatform wraps the experiment's lookup failing in a bare RuntimeError: its cause is said."""
    from google.api_core import exceptions
    from google.cloud import aiplatform

    def refused(self: Any, experiment: str) -> None:
        try:
            raise exceptions.PermissionDenied("Permission 'aiplatform.metadataStores.get' denied")
        except exceptions.PermissionDenied as cause:
            raise RuntimeError(f"Experiment {experiment} could not be found or created.") from cause

    monkeypatch.setattr(aiplatform.PipelineJob, "_validate_experiment", refused)
    config = settings.load(env(vertex, EXPERIMENT="exp-runs"), Path("/nonexistent"))
    with pytest.raises(submit.GoogleRefused) as err:
        submit.submit(config, {}, credentials=AnonymousCredentials(), transport="rest")
    assert "roles/aiplatform.user" in str(err.value)
    assert vertex.bodies("POST", r"/v1/projects/p-proj/locations/us-central1/pipelineJobs") == []


def test_a_run_created_but_not_recorded_in_its_experiment_goes_on_and_says_so(
    vertex: RestFake, gcs: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from google.api_core import exceptions
    from google.cloud import aiplatform

    monkeypatch.setattr(aiplatform.PipelineJob, "_validate_experiment", lambda self, experiment: None)

    def unrecorded(self: Any, experiment: str) -> None:
        raise RuntimeError("could not associate") from exceptions.ServiceUnavailable("503 try again")

    monkeypatch.setattr(aiplatform.PipelineJob, "_associate_to_experiment", unrecorded)
    config = settings.load(env(vertex, EXPERIMENT="exp-runs"), Path("/nonexistent"))
    assert submit.submit(config, {}, credentials=AnonymousCredentials(), transport="rest") == 0
    out = capsys.readouterr().out
    assert "WARNING: the run is not recorded in EXPERIMENT=exp-runs" in out and "submitted projects/" in out


@pytest.mark.parametrize("state", ["PIPELINE_STATE_FAILED", "PIPELINE_STATE_PAUSED"])
def test_a_failed_or_paused_run_exits_non_zero(vertex: RestFake, gcs: Any, state: str) -> None:
    """PAUSED ends the wait too (aiplatform's _PIPELINE_COMPLETE_STATES): it was waited on forever."""

    def failed(match: re.Match[str], _q: Any, _b: Any) -> tuple[int, Any]:
        return 200, {
            "name": match.group(1),
            "state": state,
            "jobDetail": {"taskDetails": [{"taskName": "train-model", "state": "FAILED"}]},
        }

    vertex.routes.insert(
        0, ("GET", r"/v1/(projects/p-proj/locations/us-central1/pipelineJobs/[^/]+)", failed)
    )
    config = settings.load(env(vertex), Path("/nonexistent"))
    code = submit.submit(
        config, {}, wait=True, credentials=AnonymousCredentials(), transport="rest", poll_seconds=0.01
    )
    assert code == 1


class FakeRegistryAuth:
    """No Google credentials for the fake registry host."""

    def __call__(self, request: Any) -> Any:
        return request


class KfpRegistryFake:
    """An Artifact Registry Kubeflow pipeline repository at `/p-proj/pipelines` ("Create, upload,
    and use a pipeline template", https://cloud.google.com/vertex-ai/docs/pipelines/create-pipeline-template):
    `POST` takes a multipart form with the template file in `content` and comma-separated `tags`,
    parses the file as YAML into a `PipelineSpec` (strictly: an unknown field is a 400), and
    answers `<pipelineInfo.name>/sha256:<digest of the bytes>`; `GET <package>/<version>` answers
    the bytes uploaded. Each upload is kept in `.uploads` (filename, bytes, tags)."""

    def __init__(self) -> None:
        self.rest = RestFake()
        self.uploads: list[dict[str, Any]] = []
        self.versions: dict[str, bytes] = {}
        self.rest.route("POST", r"/p-proj/pipelines/?", self.upload)
        self.rest.route("GET", r"/p-proj/pipelines/([^/]+/sha256:[0-9a-f]{64})", self.download)
        self.host = f"http://{self.rest.address}/p-proj/pipelines"

    @staticmethod
    def form(body: bytes) -> dict[str, tuple[str | None, Any]]:
        """The multipart/form-data fields of `body`: name -> (filename, bytes)."""
        import email.parser
        import email.policy

        boundary = body.split(b"\r\n", 1)[0].removeprefix(b"--")
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
            b"Content-Type: multipart/form-data; boundary=" + boundary + b"\r\n\r\n" + body
        )
        fields = {}
        for part in message.iter_parts():
            name = part.get_param("name", header="content-disposition")
            fields[str(name)] = (part.get_filename(), part.get_payload(decode=True))
        return fields

    def upload(self, _m: Any, _q: Any, body: Any) -> tuple[int, Any]:
        from google.protobuf import json_format
        from kfp.pipeline_spec import pipeline_spec_pb2

        fields = self.form(body)
        filename, content = fields["content"]
        try:
            document = yaml.load(content, Loader=yaml.CSafeLoader)  # libyaml: a second faster
            spec = json_format.ParseDict(document, pipeline_spec_pb2.PipelineSpec())
        except (yaml.YAMLError, json_format.ParseError) as err:
            return 400, {"error": {"code": 400, "message": f"not a pipeline template: {err}"}}
        tags = fields["tags"][1].decode().split(",") if "tags" in fields else []
        self.uploads.append({"filename": filename, "content": content, "tags": tags})
        version = f"{spec.pipeline_info.name}/sha256:{hashlib.sha256(content).hexdigest()}"
        self.versions[version] = content
        return 200, version.encode()

    def download(self, match: re.Match[str], _q: Any, _b: Any) -> tuple[int, Any]:
        return 200, self.versions[match.group(1)]


@pytest.mark.parametrize("emails", [None, ["ml-team@example.com"]])
def test_schedule_pins_the_template_version_of_this_commit(
    vertex: RestFake,
    gcs: Any,
    monkeypatch: pytest.MonkeyPatch,
    emails: list[str] | None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    registry = KfpRegistryFake()
    monkeypatch.setattr(submit, "source_commit", lambda root=ROOT: "a" * 40)
    # The SDK reads an Artifact Registry template over HTTPS with urllib: sent to the fake instead.
    from urllib import request as urllib_request

    from google.cloud.aiplatform.utils import yaml_utils

    real_urlopen = urllib_request.urlopen

    def urlopen(req: Any, *args: Any, **kwargs: Any) -> Any:
        url = req.full_url.replace("https://us-central1-kfp.pkg.dev", f"http://{registry.rest.address}")
        return real_urlopen(url, *args, **kwargs)

    monkeypatch.setattr(yaml_utils.request, "urlopen", urlopen)
    config = settings.load(
        env(
            vertex,
            TEMPLATE_REPOSITORY="https://us-central1-kfp.pkg.dev/p-proj/pipelines",
            EXPERIMENT="exp-runs",
        ),
        Path("/nonexistent"),
    )
    try:
        schedules.create_schedule(
            config,
            {"tune": True, "notification_emails": emails},
            cron="0 6 * * 1",
            timezone="Europe/Paris",
            max_concurrent_runs=2,
            start_time="2026-12-01T00:00:00Z",
            credentials=AnonymousCredentials(),
            transport="rest",
            registry_auth=FakeRegistryAuth(),
            registry_host=registry.host,
        )
    finally:
        registry.rest.stop()
    # The template goes up as Google's page shows it: a YAML file, with its tags, and it is the
    # compiled template itself (the same spec as the JSON `make run` submits).
    [upload] = registry.uploads
    template = pipeline.template_for(emails)
    assert upload["filename"] == f"{template.stem}.yaml"
    assert upload["content"].startswith(b"# PIPELINE DEFINITION\n# Name: multiworker-cassava-training\n")
    assert yaml.safe_load(upload["content"]) == json.loads(template.read_text())
    version = f"sha256:{hashlib.sha256(upload['content']).hexdigest()}"
    [body] = vertex.bodies("POST", r"/v1/projects/p-proj/locations/us-central1/schedules")
    assert body["cron"] == "TZ=Europe/Paris 0 6 * * 1"
    assert int(body["maxConcurrentRunCount"]) == 2
    assert body["startTime"].startswith("2026-12-01T00:00:00")
    job = body["createPipelineJobRequest"]["pipelineJob"]
    # The run names the template version it came from (read back from the registry by the SDK).
    assert (
        job["templateUri"]
        == f"https://us-central1-kfp.pkg.dev/p-proj/pipelines/multiworker-cassava-training/{version}"
    )
    assert [r[1] for r in registry.rest.requests if r[0] == "GET"] == [
        f"/p-proj/pipelines/multiworker-cassava-training/{version}"
    ]
    assert job["runtimeConfig"]["parameterValues"]["source_commit"] == "a" * 40
    assert job["runtimeConfig"]["parameterValues"]["tune"] is True
    assert job["serviceAccount"] == "pipelines@p-proj.iam.gserviceaccount.com"
    # Validated as make run's runs are; the experiment, which no schedule can record, is named.
    assert job["preflightValidations"] is True
    assert "EXPERIMENT" in capsys.readouterr().err
    # Every firing retrains: the registry steps and the job folders are never cached, and the
    # schedule's runs carry no caching override.
    tasks = spec_tasks(job["pipelineSpec"])
    for name in ("find-champion", "plan-jobs", "evaluate-model"):
        assert not enable_cache(tasks[name]), name
    # With recipients, the template with the e-mail exit handler, under tags of its own.
    suffix = "-notify" if emails else ""
    assert (b"vertex-pipelines-notification-email" in upload["content"]) is bool(emails)
    assert upload["tags"] == [f"{'a' * 40}{suffix}", f"latest{suffix}"]
    assert ("notification_emails" in job["runtimeConfig"]["parameterValues"]) is bool(emails)


def schedule_against(config: settings.Settings, registry_host: str) -> Any:
    """A weekly schedule of this checkout, its template sent to `registry_host`."""
    return schedules.create_schedule(
        config,
        {},
        cron="0 6 * * 1",
        credentials=AnonymousCredentials(),
        transport="rest",
        registry_auth=FakeRegistryAuth(),
        registry_host=registry_host,
    )


def test_schedule_with_a_template_registry_that_never_answers_is_named_within_seconds(
    vertex: RestFake, gcs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kfp's RegistryClient sets no timeout: the registry is probed first, as the bucket is."""
    import socket

    monkeypatch.setattr(submit, "source_commit", lambda root=ROOT: "a" * 40)
    config = settings.load(env(vertex), Path("/nonexistent"))
    with socket.socket() as hole:  # accepts connections (the kernel's backlog does), never answers
        hole.bind(("127.0.0.1", 0))
        hole.listen(16)
        with pytest.raises(cloud.GoogleUnreachable) as err:
            schedule_against(config, f"http://127.0.0.1:{hole.getsockname()[1]}")
    assert "Artifact Registry" in str(err.value)
    assert vertex.bodies("POST", r"/v1/projects/p-proj/locations/us-central1/schedules") == []


def test_schedules_refuse_a_dirty_checkout_and_bad_cron(
    vertex: RestFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = settings.load(env(vertex), Path("/nonexistent"))
    with pytest.raises(ValueError, match="CRON must have five fields"):
        schedules.create_schedule(config, {}, cron="every monday")
    monkeypatch.setattr(submit, "source_commit", lambda root=ROOT: "b" * 40 + "-dirty")
    with pytest.raises(ValueError, match="uncommitted changes"):
        schedules.create_schedule(config, {}, cron="0 6 * * 1")
    # No commit known (no .git, git refusing the folder): a schedule pinned to nothing is refused.
    monkeypatch.setattr(submit, "source_commit", lambda root=ROOT: "")
    with pytest.raises(ValueError, match="SOURCE_COMMIT"):
        schedules.create_schedule(config, {}, cron="0 6 * * 1")
    assert vertex.requests == []


@pytest.mark.parametrize(
    "overrides",
    [
        {"PIPELINE_ROOT": "my-bucket/root"},
        {"REGION": "US Central"},
        {"SERVICE_ACCOUNT": "me@gmail.com"},
        {"ARTIFACT_REPOSITORY": "europe-west4-docker.pkg.dev/p-proj/r"},  # not in REGION us-central1
        {"NETWORK": "vpc"},
        {"LABELS": "Team=ML"},
        {"PROJECT_ID": ""},
        {"PIPELINE_ROOT": "gs://p-proj-bucket/runs/../other"},
        {"PIPELINE_ROOT": "gs://p-proj-bucket//root"},
        {"EXPERIMENT": "My Experiment"},
        {"EXPERIMENT": "exp"},
    ],
)
def test_bad_settings_are_named_before_any_request(vertex: RestFake, overrides: dict[str, str]) -> None:
    with pytest.raises(settings.SettingsError) as info:
        settings.load(env(vertex, **overrides), Path("/nonexistent"))
    # A bad REGION also names the repositories, which are in us-central1, not in it.
    repositories = ["ARTIFACT_REPOSITORY", "TEMPLATE_REPOSITORY"] if "REGION" in overrides else []
    assert info.value.settings == [*overrides, *repositories]
    assert all(value in str(info.value) for value in overrides.values())
    assert vertex.requests == []


def test_a_gpu_the_region_does_not_offer_is_refused_before_any_request(vertex: RestFake, gcs: Any) -> None:
    config = settings.load(
        env(
            vertex,
            REGION="europe-west2",
            ARTIFACT_REPOSITORY="europe-west2-docker.pkg.dev/p-proj/r",
            TEMPLATE_REPOSITORY="https://europe-west2-kfp.pkg.dev/p-proj/pipelines",
        ),
        Path("/nonexistent"),
    )
    with pytest.raises(ValueError, match="NVIDIA_TESLA_V100 is not offered in europe-west2"):
        submit.submit(config, {}, credentials=AnonymousCredentials(), transport="rest")
    assert vertex.requests == []
    assert list(gcs.list_blobs(BUCKET)) == []


def test_make_run_with_bad_settings_exits_2_naming_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no env.sh here
    code = cli.main(["run"], {"PROJECT_ID": "p-proj", "REGION": "us-central1", "PIPELINE_ROOT": "bucket"})
    assert code == 2
    err = capsys.readouterr().err
    assert "PIPELINE_ROOT='bucket' is not valid" in err and "ARTIFACT_REPOSITORY is not set" in err


def test_env_sh_example_documents_every_setting() -> None:
    text = (ROOT / "env.sh.example").read_text()
    assert text == settings.example(), "env.sh.example is stale: run make docs"
    for key in settings.SETTINGS:
        assert f"export {key}=" in text
    assert settings.load({}, _write(text)).project == "my-project"  # the example itself is valid


def _write(text: str) -> Path:
    import tempfile

    path = Path(tempfile.mkdtemp()) / "env.sh"
    path.write_text(text)
    return path


def test_settings_from_env_sh_with_the_environment_on_top(tmp_path: Path) -> None:
    (tmp_path / "env.sh").write_text(
        "export PROJECT_ID=p-proj\nREGION='us-central1'  # region\nexport PIPELINE_ROOT=gs://b-bucket/x/\n"
        "ARTIFACT_REPOSITORY=us-central1-docker.pkg.dev/p-proj/training\nENABLE_CACHING=false\n"
    )
    config = settings.load({"REGION": "us-central1", "LABELS": "a=b"}, tmp_path / "env.sh")
    assert (config.project, config.pipeline_root, config.bucket) == ("p-proj", "gs://b-bucket/x", "b-bucket")
    assert config.enable_caching is False and config.labels == {"a": "b"}


# --- what Vertex must receive: caching, the commit, the e-mail handler -------------------------


def spec_tasks(pipeline_spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Display name -> task, over the root DAG and every component's DAG of a submitted spec."""
    dags = [pipeline_spec["root"]["dag"]] + [
        c["dag"] for c in pipeline_spec["components"].values() if "dag" in c
    ]
    return {t["taskInfo"]["name"]: t for dag in dags for t in dag["tasks"].values()}


def enable_cache(task: dict[str, Any]) -> bool:
    return bool(task.get("cachingOptions", {}).get("enableCache", False))


def submitted(vertex: RestFake, extra: dict[str, str] | None = None, **given: Any) -> dict[str, Any]:
    config = settings.load(env(vertex, **(extra or {})), Path("/nonexistent"))
    code = submit.submit(config, given, credentials=AnonymousCredentials(), transport="rest")
    assert code == 0
    [body] = vertex.bodies("POST", JOBS)
    return body


def test_make_run_keeps_each_steps_compiled_caching_option(vertex: RestFake, gcs: Any) -> None:
    """aiplatform's PipelineJob(enable_caching=True) would force caching on every task, the
    registry lookups included: `make run` passes no override unless the user set one."""
    tasks = spec_tasks(submitted(vertex)["pipelineSpec"])
    for name in ("find-champion", "evaluate-model", "upload-model", "plan-jobs"):
        assert not enable_cache(tasks[name]), name
    assert enable_cache(tasks["upload-settings"])


def test_enable_caching_false_turns_every_step_off_and_true_is_refused(vertex: RestFake, gcs: Any) -> None:
    tasks = spec_tasks(submitted(vertex, {"ENABLE_CACHING": "false"})["pipelineSpec"])
    assert not any(enable_cache(t) for t in tasks.values())
    with pytest.raises(settings.SettingsError) as info:
        settings.load(env(vertex, ENABLE_CACHING="true"), Path("/nonexistent"))
    assert info.value.settings == ["ENABLE_CACHING"]


def test_a_checkout_without_git_labels_the_run_with_source_commit(
    vertex: RestFake, gcs: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cloud Build hands its steps the source without .git; cloudbuild.yaml passes the
    trigger's $COMMIT_SHA as SOURCE_COMMIT, which must reach the run and the model labels."""
    import shutil

    for name in buildcontext.CONTEXT_FILES:
        shutil.copy(ROOT / name, tmp_path / name)
    for folder in buildcontext.CONTEXT_DIRS:
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    sha = "0123456789abcdef0123456789abcdef01234567"
    monkeypatch.setenv("SOURCE_COMMIT", sha)
    config = settings.load(env(vertex), Path("/nonexistent"))
    assert submit.submit(config, {}, credentials=AnonymousCredentials(), transport="rest", root=tmp_path) == 0
    [body] = vertex.bodies("POST", JOBS)
    assert body["runtimeConfig"]["parameterValues"]["source_commit"] == sha
    assert body["labels"]["source_commit"] == sha
    monkeypatch.setenv("SOURCE_COMMIT", "main; rm -rf /")
    with pytest.raises(ValueError, match="SOURCE_COMMIT must be a git commit"):
        submit.source_commit(tmp_path)


def test_only_a_run_with_recipients_gets_the_email_exit_handler(vertex: RestFake, gcs: Any) -> None:
    plain = submitted(vertex)
    assert not [n for n in spec_tasks(plain["pipelineSpec"]) if "notification" in n]
    assert "notification_emails" not in plain["runtimeConfig"]["parameterValues"]
    vertex.requests.clear()
    notify = submitted(vertex, notification_emails=["ml-team@example.com"])
    assert "vertex-pipelines-notification-email" in spec_tasks(notify["pipelineSpec"])
    assert notify["runtimeConfig"]["parameterValues"]["notification_emails"] == ["ml-team@example.com"]


@pytest.mark.parametrize(
    ("emails", "match"),
    [
        (["a@example.com", "b@example.com", "c@example.com", "d@example.com"], "one to three addresses"),
        (["not-an-address"], "not e-mail addresses: 'not-an-address'"),
        ("a@example.com", "must be a JSON list"),
    ],
)
def test_bad_recipients_are_refused_before_any_request(
    vertex: RestFake, gcs: Any, emails: Any, match: str
) -> None:
    config = settings.load(env(vertex), Path("/nonexistent"))
    with pytest.raises(ValueError, match=match):
        submit.submit(
            config, {"notification_emails": emails}, credentials=AnonymousCredentials(), transport="rest"
        )
    assert vertex.requests == []
    assert list(gcs.bucket(BUCKET).list_blobs()) == []


# --- make's schedule variables, checked before any request -------------------------------------


@pytest.mark.parametrize(
    "cron", ["0 6 * * 1", "*/15 0-23/2 1,15 JAN-JUN MON-FRI", "59 23 31 12 7", "  0  6 * * sun  "]
)
def test_unix_cron_expressions_pass(cron: str) -> None:
    assert schedules.check_cron(cron) == " ".join(cron.split())


@pytest.mark.parametrize(
    ("cron", "message"),
    [
        ("", "CRON is not set"),
        ("every monday", "CRON must have five fields"),
        ("0 6 * * 1 2026", "CRON must have five fields"),
        ("TZ=Europe/Paris 0 6 * * 1", "give the time zone as TIMEZONE="),
        ("0 6 * *\n1", "has a newline, tab or other non-printing character"),
        ("60 6 * * 1", "minute '60' (expected 0-59)"),
        ("0 6 0 * 1", "day of month '0' (expected 1-31)"),
        ("0 6 * 13 1", "month '13' (expected 1-12, JAN-DEC)"),
        ("0 6 * * FUN", "day of week 'FUN' (expected 0-7, SUN-SAT)"),
        ("0 5/2 * * 1", "hour '5/2'"),
        ("0 9-5 * * 1", "hour '9-5'"),
        ('x"; touch f; echo "', "is not a unix-cron expression"),
    ],
)
def test_bad_cron_is_named(cron: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        schedules.check_cron(cron)


def test_schedule_variables_are_all_named_at_once_before_any_request(vertex: RestFake) -> None:
    config = settings.load(env(vertex), Path("/nonexistent"))
    with pytest.raises(ValueError) as info:
        schedules.create_schedule(
            config,
            {},
            cron="0 6 * * 1",
            timezone="Europe/Pari",
            max_concurrent_runs=0,
            start_time="2026-12-01",
            end_time="tomorrow",
        )
    lines = str(info.value).splitlines()
    assert (
        lines[0].startswith("TIMEZONE='Europe/Pari' is not an IANA time zone name")
        and "closest: Europe/Paris" in lines[0]
    )
    assert lines[1].startswith("MAX_CONCURRENT='0' is not valid: expected an integer >= 1")
    assert (
        lines[2] == "START='2026-12-01' has no UTC offset: add Z (UTC) or +HH:MM, e.g. 2026-12-01T00:00:00Z"
    )
    assert lines[3].startswith("END='tomorrow' is not an ISO-8601 timestamp")
    assert vertex.requests == []


def test_schedule_times_are_sent_in_utc_and_must_be_in_order() -> None:
    options = schedules.schedule_options(
        "0 6 * * 1", "Europe/Paris", "3", "2026-12-01T07:00:00+01:00", "2027-01-01T00:00:00.5Z"
    )
    assert options == schedules.ScheduleOptions(
        cron="0 6 * * 1",
        timezone="Europe/Paris",
        max_concurrent_runs=3,
        start_time="2026-12-01T06:00:00Z",
        end_time="2027-01-01T00:00:00.500000Z",
    )
    with pytest.raises(ValueError, match="END='2026-11-30T00:00:00Z' is not after START="):
        schedules.schedule_options("0 6 * * 1", start="2026-12-01T00:00:00Z", end="2026-11-30T00:00:00Z")
    with pytest.raises(ValueError, match="START='9999-12-31T23:00:00-05:00' is out of range"):
        schedules.schedule_options("0 6 * * 1", start="9999-12-31T23:00:00-05:00")


@pytest.mark.parametrize("name", ["localtime", "posixrules", "Factory", "Mars/Olympus_Mons"])
def test_a_timezone_not_in_the_iana_database_is_refused(name: str) -> None:
    """Judged against the tzdata package, whatever this machine's own database holds or lacks."""
    with pytest.raises(ValueError, match="is not an IANA time zone name"):
        schedules.check_timezone(name)
    assert schedules.check_timezone("America/Argentina/Buenos_Aires") == "America/Argentina/Buenos_Aires"


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("projects/p-proj/locations/us-central1/schedules/77", True),
        ("projects/123456/locations/europe-west4/schedules/abc_1-2", True),
        ("", False),
        ("77", False),
        ("projects/p-proj/locations/us-central1/schedules/77/extra", False),
        ("projects/p-proj/locations/us-central1/schedules/$(touch x)", False),
    ],
)
def test_schedule_names_are_resource_names(name: str, ok: bool) -> None:
    if ok:
        assert schedules.check_schedule_name(name) == name
    else:
        with pytest.raises(ValueError, match=r"NAME( is not set|=.* is not a schedule's resource name)"):
            schedules.check_schedule_name(name)


@pytest.mark.parametrize(("wait", "expected"), [("", False), ("0", False), ("1", True), ("TRUE", True)])
def test_wait_values(wait: str, expected: bool) -> None:
    assert submit.check_wait(wait) is expected


def test_make_run_with_a_bad_wait_exits_2_before_the_settings(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "--target", "vertex"], {"WAIT": "sometimes"}) == 2
    assert "make run: WAIT='sometimes' is not valid" in capsys.readouterr().err


def test_build_region_is_its_own_setting_and_reaches_the_build_step(vertex: RestFake, gcs: Any) -> None:
    body = submitted(vertex, {"BUILD_REGION": "europe-west1"})
    assert body["runtimeConfig"]["parameterValues"]["build_location"] == "europe-west1"
    assert body["runtimeConfig"]["parameterValues"]["location"] == "us-central1"
    with pytest.raises(settings.SettingsError) as info:
        settings.load(env(vertex, BUILD_REGION="mars-1"), Path("/nonexistent"))
    assert info.value.settings == ["BUILD_REGION"]


def test_the_uploaded_template_is_what_kfp_compiles_to_yaml(tmp_path: Path) -> None:
    """`template_yaml` turns the JSON template into what kfp's compiler writes for a `.yaml`
    path (the file Google's pipeline-template page uploads): the same document, line for line,
    and the same header, whose default values kfp prints in its own (unsorted) key order."""
    import ast

    from kfp import compiler

    function = pipeline.create_pipeline("vertex")
    compiler.Compiler().compile(function, str(tmp_path / "pipeline.json"))
    compiler.Compiler().compile(function, str(tmp_path / "direct.yaml"))
    (tmp_path / "out").mkdir()
    converted = schedules.template_yaml(tmp_path / "pipeline.json", tmp_path / "out")
    assert converted == tmp_path / "out" / "pipeline.yaml"
    mine, kfps = converted.read_text().splitlines(), (tmp_path / "direct.yaml").read_text().splitlines()
    assert [line for line in mine if not line.startswith("#")] == [
        line for line in kfps if not line.startswith("#")
    ]

    def header(lines: list[str]) -> list[Any]:
        out: list[Any] = []
        for line in (line for line in lines if line.startswith("#")):
            name, default = re.fullmatch(r"(.*?)(?: \[Default: (.*)\])?", line).groups()  # type: ignore[union-attr]
            out.append((name, ast.literal_eval(default) if default else None))
        return out

    assert header(mine) == header(kfps) and len(header(mine)) > 10
    assert mine[0] == "# PIPELINE DEFINITION"
    again = schedules.template_yaml(tmp_path / "pipeline.json", tmp_path / "out")
    assert again.read_bytes() == converted.read_bytes()


def test_a_template_kfp_cannot_read_is_refused_before_any_upload(tmp_path: Path) -> None:
    bad = tmp_path / "pipeline.json"
    bad.write_text(json.dumps({"pipelineInfo": {"name": "x"}, "rooot": {}}))
    from google.protobuf import json_format

    with pytest.raises(json_format.ParseError, match="rooot"):
        schedules.template_yaml(bad, tmp_path)


def test_api_endpoint_reaches_this_machines_requests_only(vertex: RestFake, gcs: Any) -> None:
    """What env.sh.example and docs/guarantees.md#the-local-target-is-as-strict-as-vertex say of
    API_ENDPOINT: `make run`'s own requests go to it (here: the fake), but no value of the run
    carries it, and the in-pipeline clients build `<location>-aiplatform.googleapis.com`
    themselves (as GCPC's launchers do). If the endpoint is ever handed to the pipeline, this fails
    and the docs must change with it."""
    body = submitted(vertex)
    assert [r[1] for r in vertex.requests if r[0] == "POST"] == [JOBS]  # sent to API_ENDPOINT
    assert vertex.address not in json.dumps(body["runtimeConfig"])
    assert not any("endpoint" in name for name in body["runtimeConfig"]["parameterValues"])
    programs = json.dumps(body["pipelineSpec"]["deploymentSpec"]["executors"])
    assert 'f\\"{location}-aiplatform.googleapis.com\\"' in programs  # find-champion's client


# --- 403s name the role docs/vertex.md#the-iam-roles-a-first-run-needs gives for them -------------

DENIED_CREATE = (
    "Permission 'aiplatform.pipelineJobs.create' denied on resource "
    "'//aiplatform.googleapis.com/projects/p-proj/locations/us-central1' (or it may not exist)."
)
DENIED_ACT_AS = (
    "You do not have permission to act as service account 'pipelines@p-proj.iam.gserviceaccount.com' "
    "(or it may not exist): the caller does not have permission iam.serviceAccounts.actAs"
)


@pytest.mark.parametrize(
    ("said", "role"),
    [
        (DENIED_CREATE, "roles/aiplatform.user in project p-proj"),
        (DENIED_ACT_AS, "roles/iam.serviceAccountUser on pipelines@p-proj.iam.gserviceaccount.com"),
    ],
)
def test_a_run_refused_with_403_names_the_role(vertex: RestFake, gcs: Any, said: str, role: str) -> None:
    refusal = {"error": {"code": 403, "message": said, "status": "PERMISSION_DENIED"}}
    vertex.routes.insert(0, ("POST", JOBS, lambda *_: (403, refusal)))
    config = settings.load(env(vertex), Path("/nonexistent"))
    with pytest.raises(submit.GoogleRefused) as err:
        submit.submit(config, {}, credentials=AnonymousCredentials(), transport="rest")
    text = str(err.value)
    assert text.startswith("Google Cloud refused the pipeline run (403)")
    assert f"the account running make needs {role};" in text
    assert "docs/vertex.md#the-iam-roles-a-first-run-needs" in text
    assert said[:40] in text, "Google's own words are kept"
    assert err.value.__cause__ is not None, "the original error stays chained (its traceback is shown)"


def test_a_refused_context_upload_names_the_bucket_role(
    vertex: RestFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    from google.api_core import exceptions

    def refuse(*_: Any, **__: Any) -> str:
        raise exceptions.Forbidden(
            "POST https://storage.googleapis.com/upload: me@example.com does not have "
            "storage.objects.create access to the Google Cloud Storage object."
        )

    monkeypatch.setattr(submit, "upload_context", refuse)
    config = settings.load(env(vertex), Path("/nonexistent"))
    with pytest.raises(
        submit.GoogleRefused, match=r"needs roles/storage\.objectAdmin on gs://p-proj-pipelines;"
    ):
        submit.submit(config, {}, credentials=AnonymousCredentials(), transport="rest")
    assert vertex.bodies("POST", JOBS) == [], "no run is sent after a refused upload"


def test_a_refused_template_upload_names_the_writer_role(
    vertex: RestFake, gcs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = KfpRegistryFake()
    denied = {
        "error": {"code": 403, "message": "Permission 'artifactregistry.repositories.uploadArtifacts' denied"}
    }
    registry.rest.routes.insert(0, ("POST", r"/p-proj/pipelines/?", lambda *_: (403, denied)))
    monkeypatch.setattr(submit, "source_commit", lambda root=ROOT: "a" * 40)
    config = settings.load(env(vertex), Path("/nonexistent"))
    try:
        with pytest.raises(submit.GoogleRefused) as err:
            schedule_against(config, registry.host)
    finally:
        registry.rest.stop()
    text = str(err.value)
    assert "the template's upload to https://us-central1-kfp.pkg.dev/p-proj/pipelines (403)" in text
    assert "needs roles/artifactregistry.writer on https://us-central1-kfp.pkg.dev/p-proj/pipelines;" in text
    assert vertex.requests == [], "no schedule is sent after a refused upload"


def test_a_bucket_probe_refusal_names_the_bucket_reader_role(vertex: RestFake) -> None:
    config = settings.load(env(vertex), Path("/nonexistent"))
    said = "me@example.com does not have storage.buckets.get access to the Google Cloud Storage bucket."
    assert (
        cloud.missing_role(said, config, "?") == "roles/storage.legacyBucketReader on gs://p-proj-pipelines"
    )
    assert cloud.missing_role("no permission named", config, "the default") == "the default"
    # A service's host name is not a permission.
    assert cloud.missing_role("POST https://aiplatform.googleapis.com/v1: denied", config, "x") == "x"


@pytest.mark.parametrize(
    ("said", "cause"),
    [
        (
            "403 Vertex AI API has not been used in project 123456 before or it is disabled. SERVICE_DISABLED",
            "enable",
        ),
        (
            "403 Request is prohibited by organization's policy. vpcServiceControlsUniqueIdentifier: x",
            "perimeter",
        ),
        ("403 This API method requires billing to be enabled. BILLING_DISABLED", "billing"),
    ],
)
def test_a_refusal_no_role_mends_names_its_cause_not_a_role(vertex: RestFake, said: str, cause: str) -> None:
    from google.api_core import exceptions

    config = settings.load(env(vertex), Path("/nonexistent"))
    with (
        pytest.raises(submit.GoogleRefused) as err,
        cloud.refused_as("the run", "roles/aiplatform.user", config),
    ):
        raise exceptions.PermissionDenied(said)
    assert cause in str(err.value) and "roles/" not in str(err.value).split("Google said")[0]


def test_a_schedule_without_template_repository_names_the_setting_and_what_it_takes(tmp_path: Path) -> None:
    environ = {
        "PROJECT_ID": "p-proj",
        "REGION": "us-central1",
        "PIPELINE_ROOT": f"gs://{BUCKET}/root",
        "ARTIFACT_REPOSITORY": "us-central1-docker.pkg.dev/p-proj/training",
    }
    config = settings.load(environ, tmp_path / "no-env.sh")
    with pytest.raises(settings.SettingsError) as info:  # before any request: no credentials needed
        schedules.create_schedule(config, {}, cron="0 6 * * 1")
    assert info.value.settings == ["TEMPLATE_REPOSITORY"]
    assert settings.SETTINGS["TEMPLATE_REPOSITORY"] in str(info.value)  # its help, whole
