"""The image build: content tags, and the Vertex form against local fakes at the protocol
level: Cloud Build's REST API (the request body parsed strictly into the real `Build` type),
the real Storage client on an emulator and the registry's manifest API."""

from __future__ import annotations

import hashlib
import io
import itertools
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import google.auth.credentials
import pytest
import yaml
from google.cloud.devtools import cloudbuild_v1
from google.longrunning import operations_pb2
from google.protobuf import json_format

from components import buildcontext, image
from local import steps
from tests.fakes import RegistryFake, RestFake, storage_emulator

ROOT = Path(__file__).resolve().parents[2]


def make_context(root: Path, trainer_text: str = "print('hi')\n") -> Path:
    (root / "trainer").mkdir(parents=True)
    (root / "trainer" / "task.py").write_text(trainer_text)
    (root / "trainer" / "__pycache__").mkdir()
    (root / "trainer" / "__pycache__" / "task.cpython-311.pyc").write_bytes(b"\0cache")
    for name in buildcontext.CONTEXT_FILES:
        (root / name).write_text(f"{name}\n")
    return root


def test_tag_depends_on_content_only(tmp_path: Path) -> None:
    a = make_context(tmp_path / "a")
    b = make_context(tmp_path / "b")
    (b / "trainer" / "__pycache__" / "other.pyc").write_bytes(b"more cache")
    tag = buildcontext.context_tag(buildcontext.context_members(a))
    assert tag == buildcontext.context_tag(buildcontext.context_members(b))
    assert tag.startswith("src-") and len(tag) == 24
    (b / "trainer" / "task.py").write_text("print('changed')\n")
    assert buildcontext.context_tag(buildcontext.context_members(b)) != tag


def test_tarball_round_trip_gives_the_same_tag_and_bytes(tmp_path: Path) -> None:
    ctx = make_context(tmp_path / "ctx")
    first, second = io.BytesIO(), io.BytesIO()
    tag = buildcontext.write_context_tarball(ctx, first)
    assert buildcontext.write_context_tarball(ctx, second) == tag
    assert first.getvalue() == second.getvalue(), "the tarball must be reproducible"
    members = dict(buildcontext.tarball_members(first.getvalue()))
    assert set(members) == {*buildcontext.CONTEXT_FILES, "trainer/task.py"}
    assert buildcontext.context_tag(members.items()) == tag


def test_missing_context_files_are_named(tmp_path: Path) -> None:
    (tmp_path / "trainer").mkdir()
    with pytest.raises(ValueError, match="lacks " + re.escape(", ".join(buildcontext.CONTEXT_FILES))):
        list(buildcontext.context_members(tmp_path))


def test_this_checkout_has_a_complete_context() -> None:
    tag = steps.check_build_context.python_func(context_dir=str(ROOT), repository="local/repo")
    assert tag.tag == buildcontext.context_tag(buildcontext.context_members(ROOT))
    assert tag.image_uri == f"local/repo/trainer:{tag.tag}" and tag.built is False
    assert tag.serving_image_uri == ""
    both = steps.check_build_context.python_func(
        context_dir=str(ROOT), repository="local/repo", serving_image="custom"
    )
    assert (both.image_uri, both.built) == (tag.image_uri, False)
    assert both.serving_image_uri == f"local/repo/trainer-serving:{tag.tag}"
    assert tag.cpu_image_uri == f"local/repo/trainer-cpu:{tag.tag}", "the same outputs as the Vertex build"


# --- the Vertex form against fakes -------------------------------------------------------------

BUCKET, OBJECT = "ctx-bucket", "contexts/ctx.tar.gz"
BUILDS = r"/v1/projects/([^/]+)/locations/([^/]+)/builds"
OPERATION = "projects/p/locations/us-central1/operations/op-1"
LOG_URL = "https://console.cloud.google.com/cloud-build/builds;region=us-central1/b-123?project=p"


def digest_of(ref: str) -> str:
    return "sha256:" + hashlib.sha256(ref.encode()).hexdigest()


class CloudBuildFake:
    """Cloud Build's REST API: `POST .../builds` parses the body strictly into the real `Build`
    (an unknown or misspelt field, or one not in REST's camelCase, is a 400) and answers a
    long-running Operation; `GET` of the operation answers not-done (`WORKING`) for
    `polls_before_done` polls, then `outcome`: SUCCESS with a digest for each image, or FAILURE
    with a log URL; `None` never ends. `flaky_polls` answers that many polls with 503 first."""

    def __init__(
        self, outcome: str | None = "SUCCESS", polls_before_done: int = 2, flaky_polls: int = 0
    ) -> None:
        self.outcome, self.polls_before_done, self.flaky_polls = outcome, polls_before_done, flaky_polls
        self.rest = RestFake()
        self.rest.route("POST", BUILDS, self.create)
        self.rest.route("GET", r"/v1/(projects/[^/]+/locations/[^/]+/operations/[^/]+)", self.get)
        self.api_root = f"http://{self.rest.address}"
        self.build: cloudbuild_v1.Build | None = None
        self.polls = 0

    def operation(self, done: bool = False) -> dict[str, Any]:
        assert self.build is not None
        op = operations_pb2.Operation(name=OPERATION, done=done)
        op.metadata.Pack(
            cloudbuild_v1.BuildOperationMetadata.pb(cloudbuild_v1.BuildOperationMetadata(build=self.build))
        )
        if done and self.build.status == cloudbuild_v1.Build.Status.SUCCESS:
            op.response.Pack(cloudbuild_v1.Build.pb(self.build))
        elif done:
            op.error.code, op.error.message = 2, "Build failed; check build logs for details"
        return json_format.MessageToDict(op)

    def create(self, _match: Any, _query: Any, body: Any) -> tuple[int, Any]:
        try:
            parsed = json_format.ParseDict(
                body, cloudbuild_v1.Build.pb(cloudbuild_v1.Build()), ignore_unknown_fields=False
            )
        except json_format.ParseError as err:
            return 400, {"error": {"code": 400, "message": str(err), "status": "INVALID_ARGUMENT"}}
        # ParseDict also takes proto field names (google-cloud-build's `object_` among them): the
        # REST API's JSON names only, in canonical form, are what the round trip gives back.
        if json_format.MessageToDict(parsed) != body:
            return 400, {"error": {"code": 400, "message": f"not canonical REST JSON: {body}"}}
        self.build = cloudbuild_v1.Build.wrap(parsed)
        self.build.id, self.build.log_url = "b-123", LOG_URL
        self.build.status = cloudbuild_v1.Build.Status.QUEUED
        return 200, self.operation()

    def get(self, match: re.Match[str], _query: Any, _body: Any) -> tuple[int, Any]:
        assert self.build is not None and match.group(1) == OPERATION
        if self.flaky_polls:
            self.flaky_polls -= 1
            return 503, {"error": {"code": 503, "message": "try again", "status": "UNAVAILABLE"}}
        self.polls += 1
        if self.polls > 50:  # a poller that never gives up fails here rather than hanging the test
            return 400, {"error": {"code": 400, "message": "polled too often"}}
        if self.outcome is None or self.polls <= self.polls_before_done:
            self.build.status = cloudbuild_v1.Build.Status.WORKING  # type: ignore[assignment]
            return 200, self.operation()
        if self.outcome == "SUCCESS":
            self.build.status = cloudbuild_v1.Build.Status.SUCCESS  # type: ignore[assignment]
            for ref in self.build.images:
                self.build.results.images.append(cloudbuild_v1.BuiltImage(name=ref, digest=digest_of(ref)))
        else:
            self.build.status = cloudbuild_v1.Build.Status.FAILURE  # type: ignore[assignment]
            self.build.status_detail = "step 0 exited with 1"
        return 200, self.operation(done=True)

    def posts(self) -> list[Any]:
        return self.rest.bodies("POST", BUILDS)


SERVICE_ACCOUNT = "pipelines@p.iam.gserviceaccount.com"


class TokenCredentials(google.auth.credentials.Credentials):
    """A service account's credentials that refresh to a fixed token (AuthorizedSession
    refreshes and retries once on a 401, as it does on Vertex)."""

    service_account_email = SERVICE_ACCOUNT

    def refresh(self, request: Any) -> None:
        self.token = "token"


@pytest.fixture
def cloud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Storage emulator holding a context tarball, a registry fake, google.auth stubbed."""
    import google.auth
    import google.cloud.storage as storage

    ctx = make_context(tmp_path / "ctx")
    buf = io.BytesIO()
    tag = buildcontext.write_context_tarball(ctx, buf)
    monkeypatch.setattr(google.auth, "default", lambda **_: (TokenCredentials(), "p"))
    registry = RegistryFake()
    with storage_emulator() as url:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", url)
        client = storage.Client(project="p")
        client.create_bucket(BUCKET).blob(OBJECT).upload_from_string(buf.getvalue())
        yield {"tag": tag, "registry": registry, "repository": f"{registry.host}/p/repo"}
    registry.stop()


def run_build(cloud: dict[str, Any], fake: CloudBuildFake, **args: Any) -> Any:
    try:
        return image.build_trainer_image.python_func(
            **{
                "project": "p",
                "location": "us-central1",
                "context_uri": f"gs://{BUCKET}/{OBJECT}",
                "repository": cloud["repository"],
                "api_root": fake.api_root,
                "poll_seconds": 0.01,
                # A choice that does not depend on the day (auto: tests/components/test_serving_policy.py).
                "serving_image": "prebuilt",
                **args,
            }
        )
    finally:
        fake.rest.stop()


def test_builds_when_the_tag_is_new_and_returns_the_digest(
    cloud: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    fake = CloudBuildFake(polls_before_done=3)
    out = run_build(cloud, fake)
    image_ref = f"{cloud['repository']}/trainer:{cloud['tag']}"
    cpu_ref = f"{cloud['repository']}/trainer-cpu:{cloud['tag']}"
    assert out.image_uri == f"{cloud['repository']}/trainer@{digest_of(image_ref)}"
    assert out.cpu_image_uri == f"{cloud['repository']}/trainer-cpu@{digest_of(cpu_ref)}"
    assert (out.tag, out.built, out.serving_image_uri) == (cloud["tag"], True, "")
    assert out.training_image_uri == out.image_uri, "no reducers asked: training runs the trainer image"
    [(_, path, query, _)] = [r for r in fake.rest.requests if r[0] == "POST"]
    assert path == "/v1/projects/p/locations/us-central1/builds" and query == {"projectId": ["p"]}
    build = fake.build
    assert build is not None
    assert build.source.storage_source.bucket == BUCKET and build.source.storage_source.object_ == OBJECT
    assert list(build.images) == [image_ref, cpu_ref]
    step, cpu_step = build.steps
    assert step.name == cpu_step.name == "gcr.io/cloud-builders/docker"
    assert list(step.args) == [
        "build",
        "--file",
        "Dockerfile",
        "--target",
        "trainer",
        "--tag",
        image_ref,
        ".",
    ]
    assert list(cpu_step.args) == ["build", "--file", "Dockerfile", "--target", "cpu", "--tag", cpu_ref, "."]
    assert list(step.env) == ["DOCKER_BUILDKIT=1"], "BuildKit builds only the stages the target needs"
    assert build.timeout.total_seconds() == 3600
    # build_machine_type's default: not Cloud Build's smallest worker; no pool, no account of its own.
    assert build.options.machine_type == cloudbuild_v1.BuildOptions.MachineType.E2_HIGHCPU_8
    assert (build.options.pool.name, build.service_account) == ("", "")
    # the operation was polled until done: not done three times, then done
    polls = [r for r in fake.rest.requests if r[0] == "GET"]
    assert len(polls) == 4 and all(r[1] == f"/v1/{OPERATION}" for r in polls)
    assert cloud["registry"].requests == [
        f"HEAD /v2/p/repo/trainer/manifests/{cloud['tag']}",
        f"HEAD /v2/p/repo/trainer-cpu/manifests/{cloud['tag']}",
    ]
    # progress: a line when the build starts, one per status change (not one per poll)
    log = capsys.readouterr().out
    assert log.count("Cloud Build b-123 started") == 1 and LOG_URL in log
    assert log.count("Cloud Build b-123: WORKING") == 1 and log.count("Cloud Build b-123: SUCCESS") == 1


def test_skips_the_build_when_the_tag_exists(cloud: dict[str, Any]) -> None:
    cloud["registry"].manifests[f"p/repo/trainer:{cloud['tag']}"] = "sha256:" + "cd" * 32
    cloud["registry"].manifests[f"p/repo/trainer-cpu:{cloud['tag']}"] = "sha256:" + "ab" * 32
    fake = CloudBuildFake()
    out = run_build(cloud, fake)
    assert out.image_uri == f"{cloud['repository']}/trainer@sha256:{'cd' * 32}"
    assert out.cpu_image_uri == f"{cloud['repository']}/trainer-cpu@sha256:{'ab' * 32}"
    assert (out.built, out.serving_image_uri) == (False, "")
    assert fake.rest.requests == []


def test_a_failed_build_fails_with_its_log_url(cloud: dict[str, Any]) -> None:
    fake = CloudBuildFake(outcome="FAILURE")
    with pytest.raises(RuntimeError) as err:
        run_build(cloud, fake)
    message = str(err.value)
    assert "b-123" in message and "FAILURE" in message and "step 0 exited with 1" in message
    assert LOG_URL in message
    assert fake.polls == 3, "the failure is read from the finished operation"


@pytest.mark.parametrize("status", [401, 403])
def test_a_registry_permission_error_names_the_role_and_starts_no_build(
    cloud: dict[str, Any], status: int
) -> None:
    key = f"p/repo/trainer:{cloud['tag']}"
    cloud["registry"].errors[key] = (status, '{"errors":[{"code":"DENIED","message":"Permission denied"}]}')
    fake = CloudBuildFake()
    with pytest.raises(PermissionError) as err:
        run_build(cloud, fake)
    message = str(err.value)
    assert "cannot read the Artifact Registry repository" in message and cloud["repository"] in message
    assert SERVICE_ACCOUNT in message
    assert "roles/artifactregistry.reader" in message and "roles/artifactregistry.writer" in message
    assert "docs/vertex.md#the-iam-roles-a-first-run-needs" in message
    assert str(status) in message and "Permission denied" in message
    assert fake.rest.requests == [], "no build may start when the registry could not be read"


def test_any_other_registry_answer_fails_with_its_status_and_body(cloud: dict[str, Any]) -> None:
    cloud["registry"].errors[f"p/repo/trainer:{cloud['tag']}"] = (500, "backend exploded: " + "x" * 1000)
    fake = CloudBuildFake()
    with pytest.raises(RuntimeError, match=r"answered 500 .*backend exploded: x+'$") as err:
        run_build(cloud, fake)
    assert len(str(err.value)) < 700, "only the start of the body"
    assert fake.rest.requests == []


def test_the_serving_image_is_built_in_the_same_build_when_asked(cloud: dict[str, Any]) -> None:
    fake = CloudBuildFake()
    out = run_build(cloud, fake, serving_image="custom")
    trainer = f"{cloud['repository']}/trainer:{cloud['tag']}"
    serving = f"{cloud['repository']}/trainer-serving:{cloud['tag']}"
    assert out.image_uri == f"{cloud['repository']}/trainer@{digest_of(trainer)}"
    assert out.serving_image_uri == f"{cloud['repository']}/trainer-serving@{digest_of(serving)}"
    assert out.built is True
    cpu = f"{cloud['repository']}/trainer-cpu:{cloud['tag']}"
    assert fake.build is not None and list(fake.build.images) == [trainer, cpu, serving]
    assert [list(s.args) for s in fake.build.steps] == [
        ["build", "--file", "Dockerfile", "--target", "trainer", "--tag", trainer, "."],
        ["build", "--file", "Dockerfile", "--target", "cpu", "--tag", cpu, "."],
        ["build", "--file", "Dockerfile.serving", "--target", "cpu", "--tag", serving, "."],
    ]
    assert cloud["registry"].requests == [
        f"HEAD /v2/p/repo/trainer/manifests/{cloud['tag']}",
        f"HEAD /v2/p/repo/trainer-cpu/manifests/{cloud['tag']}",
        f"HEAD /v2/p/repo/trainer-serving/manifests/{cloud['tag']}",
    ]


def test_a_gpu_deployment_gets_the_gpu_stage_of_the_serving_image(cloud: dict[str, Any]) -> None:
    fake = CloudBuildFake()
    out = run_build(cloud, fake, serving_image="custom", serving_accelerator="gpu")
    serving = f"{cloud['repository']}/trainer-serving-gpu:{cloud['tag']}"
    assert out.serving_image_uri == f"{cloud['repository']}/trainer-serving-gpu@{digest_of(serving)}"
    assert fake.build is not None
    assert list(fake.build.steps[-1].args) == [
        "build",
        "--file",
        "Dockerfile.serving",
        "--target",
        "gpu",
        "--tag",
        serving,
        ".",
    ]
    local = steps.check_build_context.python_func(
        context_dir=str(ROOT), repository="r", serving_image="custom", serving_accelerator="gpu"
    )
    assert local.serving_image_uri == f"r/trainer-serving-gpu:{local.tag}"


def test_a_missing_serving_image_is_built_even_when_the_trainer_exists(cloud: dict[str, Any]) -> None:
    cloud["registry"].manifests[f"p/repo/trainer:{cloud['tag']}"] = "sha256:" + "cd" * 32
    cloud["registry"].manifests[f"p/repo/trainer-cpu:{cloud['tag']}"] = "sha256:" + "ab" * 32
    fake = CloudBuildFake()
    out = run_build(cloud, fake, serving_image="custom")
    serving = f"{cloud['repository']}/trainer-serving:{cloud['tag']}"
    assert len(fake.posts()) == 1 and fake.build is not None
    assert list(fake.build.images) == [serving], "the existing trainer tag is not rebuilt"
    assert out.image_uri == f"{cloud['repository']}/trainer@sha256:{'cd' * 32}"
    assert out.serving_image_uri == f"{cloud['repository']}/trainer-serving@{digest_of(serving)}"
    assert out.built is True


def test_the_build_is_skipped_only_when_both_tags_exist(cloud: dict[str, Any]) -> None:
    cloud["registry"].manifests[f"p/repo/trainer:{cloud['tag']}"] = "sha256:" + "cd" * 32
    cloud["registry"].manifests[f"p/repo/trainer-cpu:{cloud['tag']}"] = "sha256:" + "ab" * 32
    cloud["registry"].manifests[f"p/repo/trainer-serving:{cloud['tag']}"] = "sha256:" + "ef" * 32
    fake = CloudBuildFake()
    out = run_build(cloud, fake, serving_image="custom")
    assert out.serving_image_uri == f"{cloud['repository']}/trainer-serving@sha256:{'ef' * 32}"
    assert out.built is False and fake.rest.requests == []


def test_a_build_that_never_ends_times_out_clearly(
    cloud: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = CloudBuildFake(outcome=None)
    clock = itertools.count(start=0, step=1000)  # each reading of the clock is 1000 s later
    monkeypatch.setattr(time, "monotonic", lambda: float(next(clock)))
    with pytest.raises(
        TimeoutError, match=r"Cloud Build b-123 .* not done after \d+s \(last status WORKING\)"
    ):
        run_build(cloud, fake, timeout_seconds=600)
    assert fake.polls >= 1


def test_a_transient_poll_error_is_retried(cloud: dict[str, Any]) -> None:
    fake = CloudBuildFake(flaky_polls=2)
    out = run_build(cloud, fake)
    assert out.built is True and fake.polls == 3


def test_a_refused_build_names_the_cloud_build_role(cloud: dict[str, Any]) -> None:
    fake = CloudBuildFake()
    fake.rest.routes.insert(
        0, ("POST", BUILDS, lambda *_: (403, {"error": {"code": 403, "message": "denied"}}))
    )
    with pytest.raises(RuntimeError, match=r"403 .*denied.*roles/cloudbuild.builds.editor") as err:
        run_build(cloud, fake)
    assert "docs/vertex.md#the-iam-roles-a-first-run-needs" in str(err.value)
    assert "serviceAccountUser" not in str(err.value)


def test_a_build_refused_for_act_as_names_the_service_account_user_role(cloud: dict[str, Any]) -> None:
    """Since Cloud Build's default service account change (May-June 2024) the build runs as the
    Compute Engine default service account, and its submitter (the image step) needs actAs on it."""
    refusal = {
        "error": {
            "code": 403,
            "message": "The caller does not have permission to act as service account "
            "projects/p/serviceAccounts/123-compute@developer.gserviceaccount.com",
            "status": "PERMISSION_DENIED",
        }
    }
    fake = CloudBuildFake()
    fake.rest.routes.insert(0, ("POST", BUILDS, lambda *_: (403, refusal)))
    with pytest.raises(RuntimeError) as err:
        run_build(cloud, fake)
    text = str(err.value)
    assert "roles/iam.serviceAccountUser" in text and "compute@developer.gserviceaccount.com" in text
    assert "docs/vertex.md#the-iam-roles-a-first-run-needs" in text
    assert "roles/cloudbuild.builds.editor" not in text
    assert len(fake.posts()) == 1, "a permission refusal is not retried elsewhere"


def test_the_compiled_component_installs_nothing(tmp_path: Path) -> None:
    from kfp import compiler

    spec = image.build_trainer_image.component_spec
    container = spec.implementation.container
    assert container is not None and container.image == image.stepimage.BASE_IMAGE
    assert not any("pip install" in part for part in [*(container.command or []), *(container.args or [])])
    compiler.Compiler().compile(image.build_trainer_image, str(tmp_path / "c.yaml"))
    text = (tmp_path / "c.yaml").read_text()
    assert "pip install" not in text and "packages_to_install" not in text
    [executor] = yaml.safe_load(text)["deploymentSpec"]["executors"].values()
    assert executor["container"]["image"] == image.stepimage.BASE_IMAGE
    program = executor["container"]["command"][-1]
    assert "google.cloud.devtools" not in program, "google-cloud-build is not in the GCPC image"
    inputs = yaml.safe_load(text)["root"]["inputDefinitions"]["parameters"]
    assert inputs["api_root"]["defaultValue"] == "https://cloudbuild.googleapis.com"
    assert inputs["serving_image"]["defaultValue"] == "auto"
    namespace: dict[str, Any] = {}
    exec(compile(program, "component.py", "exec"), namespace)  # the shipped source stands alone
    assert {"build_trainer_image", "registry_digest", "run_cloud_build"} <= set(namespace)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("context_uri", "/tmp/ctx.tar.gz", "context_uri must be gs://"),
        ("repository", "docker.io/me/repo", "repository must be <region>-docker.pkg.dev"),
    ],
)
def test_bad_locations_are_rejected_before_any_request(field: str, value: str, match: str) -> None:
    args = {
        "project": "p",
        "location": "us-central1",
        "context_uri": "gs://b/c.tgz",
        "repository": "us-docker.pkg.dev/p/r",
    }
    with pytest.raises(ValueError, match=match):
        image.build_trainer_image.python_func(**{**args, field: value})


def test_the_build_runs_in_build_location_not_the_vertex_region(cloud: dict[str, Any]) -> None:
    fake = CloudBuildFake()
    run_build(cloud, fake, build_location="europe-west1")
    [(_, path, _, _)] = [r for r in fake.rest.requests if r[0] == "POST"]
    assert path == "/v1/projects/p/locations/europe-west1/builds"


def test_a_region_restricted_project_is_told_to_set_build_region(cloud: dict[str, Any]) -> None:
    """The refusal Cloud Build gives a project restricted to six regions (Cloud Build locations doc)."""
    fake = CloudBuildFake()
    refusal = {
        "error": {
            "code": 400,
            "message": "FAILED_PRECONDITION: this project cannot run builds in this region",
            "status": "FAILED_PRECONDITION",
        }
    }
    fake.rest.routes.insert(0, ("POST", BUILDS, lambda *_: (400, refusal)))
    with pytest.raises(RuntimeError) as err:
        run_build(cloud, fake, build_location="europe-west4")
    text = str(err.value)
    assert "cannot build in europe-west4" in text and "Set BUILD_REGION" in text
    assert "us-central1, us-west2, europe-west1, asia-east1, australia-southeast1, southamerica-east1" in text
    assert len(fake.posts()) == 1, "a region the user chose is never replaced"


# The answer Cloud Build gives a project restricted to six regions (seen by users; the page is
# https://cloud.google.com/build/docs/locations#restricted_regions_for_some_projects).
RESTRICTED_REFUSAL = {
    "error": {
        "code": 400,
        "message": "due to quota restrictions, Cloud Build cannot run builds in this region, see "
        "https://cloud.google.com/build/docs/locations#restricted_regions_for_some_projects",
        "status": "FAILED_PRECONDITION",
    }
}


def restrict_to_six_regions(fake: CloudBuildFake) -> None:
    """The fake refuses builds outside Cloud Build's six restricted regions, as Cloud Build does
    for a restricted project; builds in the six go on to the fake's normal handler."""

    def create(match: re.Match[str], query: Any, body: Any) -> tuple[int, Any]:
        if match.group(2) not in image.RESTRICTED_BUILD_REGIONS:
            return 400, RESTRICTED_REFUSAL
        return fake.create(match, query, body)

    fake.rest.routes.insert(0, ("POST", BUILDS, create))


def build_regions(fake: CloudBuildFake) -> list[str]:
    return [re.fullmatch(BUILDS, path).group(2) for m, path, _, _ in fake.rest.requests if m == "POST"]  # type: ignore[union-attr]


def test_an_unchosen_build_region_falls_back_to_the_nearest_restricted_one(
    cloud: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    fake = CloudBuildFake()
    restrict_to_six_regions(fake)
    out = run_build(cloud, fake, location="europe-west4")  # build_location "": the Vertex region
    assert out.built is True and fake.build is not None
    assert build_regions(fake) == ["europe-west4", "europe-west1"], "one retry, on the same continent"
    assert fake.posts()[0] == fake.posts()[1], "the same build is asked for again"
    said = [line for line in capsys.readouterr().out.splitlines() if "refused to build in" in line]
    assert said == [
        (
            "Cloud Build refused to build in europe-west4 (this project may only build in us-central1, "
            "us-west2, europe-west1, asia-east1, australia-southeast1, southamerica-east1); BUILD_REGION "
            "is not set, so building in europe-west1, the restricted region on the same continent "
            "(https://cloud.google.com/build/docs/locations)"
        )
    ]


def test_an_unchosen_region_is_retried_once_only(cloud: dict[str, Any]) -> None:
    """A project restricted further than the documented six: the retry's refusal fails the step,
    naming both regions tried and BUILD_REGION."""
    fake = CloudBuildFake()
    fake.rest.routes.insert(0, ("POST", BUILDS, lambda *_: (400, RESTRICTED_REFUSAL)))
    with pytest.raises(RuntimeError) as err:
        run_build(cloud, fake, location="asia-northeast1")
    assert build_regions(fake) == ["asia-northeast1", "asia-east1"]
    text = str(err.value)
    assert "in asia-east1: 400" in text and "cannot build in asia-northeast1 or asia-east1" in text
    assert "Set BUILD_REGION" in text


def test_other_refusals_are_not_retried_elsewhere(cloud: dict[str, Any]) -> None:
    fake = CloudBuildFake()
    fake.rest.routes.insert(
        0, ("POST", BUILDS, lambda *_: (403, {"error": {"code": 403, "status": "PERMISSION_DENIED"}}))
    )
    with pytest.raises(RuntimeError, match=r"roles/cloudbuild\.builds\.editor"):
        run_build(cloud, fake, location="europe-west4")
    assert build_regions(fake) == ["europe-west4"]


def test_a_refused_restricted_region_has_nowhere_nearer(cloud: dict[str, Any]) -> None:
    fake = CloudBuildFake()
    fake.rest.routes.insert(0, ("POST", BUILDS, lambda *_: (400, RESTRICTED_REFUSAL)))
    with pytest.raises(RuntimeError, match="cannot build in us-central1 for this project"):
        run_build(cloud, fake)
    assert build_regions(fake) == ["us-central1"]


@pytest.mark.parametrize(
    ("region", "fallback"),
    [
        ("us-east4", "us-central1"),
        ("us-south1", "us-central1"),
        ("us-west1", "us-west2"),
        ("us-west4", "us-west2"),
        ("northamerica-northeast1", "us-central1"),
        ("northamerica-south1", "us-central1"),
        ("southamerica-west1", "southamerica-east1"),
        ("europe-west4", "europe-west1"),
        ("europe-north2", "europe-west1"),
        ("me-west1", "europe-west1"),
        ("africa-south1", "europe-west1"),
        ("asia-south1", "asia-east1"),
        ("asia-northeast3", "asia-east1"),
        ("australia-southeast2", "australia-southeast1"),
        ("europe-west1", ""),
        ("global", ""),
    ],
)
def test_the_fallback_rule(region: str, fallback: str) -> None:
    assert image.restricted_build_fallback(region) == fallback


def test_every_cloud_build_region_has_a_restricted_fallback() -> None:
    for region in image.CLOUD_BUILD_REGIONS:
        fallback = image.restricted_build_fallback(region)
        if region == "global" or region in image.RESTRICTED_BUILD_REGIONS:
            assert fallback == "", region
        else:
            assert fallback in image.RESTRICTED_BUILD_REGIONS, region
            assert fallback.split("-")[0] == region.split("-")[0] or region.startswith(
                ("northamerica-", "me-", "africa-")
            ), f"{region} -> {fallback}: same continent first"


def test_the_reduction_server_image_is_built_only_for_a_job_with_reducers(cloud: dict[str, Any]) -> None:
    """Google's NCCL plugin (the `reduction-server` stage) goes only into the image of a training
    job that asked for Reduction Server replicas; every other job runs the trainer stage."""
    fake = CloudBuildFake()
    out = run_build(cloud, fake, reduction_server_count=2)
    trainer = f"{cloud['repository']}/trainer:{cloud['tag']}"
    reducers = f"{cloud['repository']}/trainer-reduction-server:{cloud['tag']}"
    assert out.image_uri == f"{cloud['repository']}/trainer@{digest_of(trainer)}"
    assert out.training_image_uri == f"{cloud['repository']}/trainer-reduction-server@{digest_of(reducers)}"
    cpu = f"{cloud['repository']}/trainer-cpu:{cloud['tag']}"
    assert fake.build is not None and list(fake.build.images) == [trainer, cpu, reducers]
    assert [list(s.args)[:5] for s in fake.build.steps] == [
        ["build", "--file", "Dockerfile", "--target", "trainer"],
        ["build", "--file", "Dockerfile", "--target", "cpu"],
        ["build", "--file", "Dockerfile", "--target", "reduction-server"],
    ]


@pytest.mark.parametrize(("days_left", "serving_built"), [(200, False), (31, False), (30, True), (-3, True)])
def test_auto_builds_the_serving_image_when_the_prebuilt_one_is_ending(
    cloud: dict[str, Any], monkeypatch: pytest.MonkeyPatch, days_left: int, serving_built: bool
) -> None:
    """serving_image=auto decides on the run's day, once: the serving image is built (and then
    registered) from 30 days before the prebuilt image's end of availability."""
    monkeypatch.setattr(image, "prebuilt_days_left", lambda version, today="": ("2027-01-14", days_left))
    from components import servingimage

    monkeypatch.setattr(
        servingimage, "prebuilt_days_left", lambda version, today="": ("2027-01-14", days_left)
    )
    fake = CloudBuildFake()
    out = run_build(cloud, fake, serving_image="auto", serving_tf_version="2.15")
    assert bool(out.serving_image_uri) is serving_built
    assert fake.build is not None and len(fake.build.steps) == (3 if serving_built else 2)


# --- the build's worker, service account and private pool (build_machine_type, ...) --------------


def test_the_machine_types_are_cloud_builds_own() -> None:
    """The names `build_settings` allows are those of the installed BuildOptions.MachineType (the
    component cannot import google-cloud-build: the GCPC image lacks it)."""
    allowed = {m.name for m in cloudbuild_v1.BuildOptions.MachineType}  # type: ignore[attr-defined]
    for name in allowed:
        image.build_settings("p", "us-central1", "", name, "", "")
    with pytest.raises(ValueError, match="build_machine_type"):
        image.build_settings("p", "us-central1", "", "E2_HIGHCPU_64", "", "")


def test_a_service_account_and_a_private_pool_reach_the_build(cloud: dict[str, Any]) -> None:
    """The request parses strictly into the real Build: the account in the resource form Cloud
    Build requires, logs to Cloud Logging (required with a user's account), the pool's name and
    no machineType (the pool's workers are the pool's), created in the pool's region."""
    fake = CloudBuildFake()
    pool = "projects/p/locations/europe-west1/workerPools/builders"
    run_build(cloud, fake, build_service_account="builder@p.iam.gserviceaccount.com", build_worker_pool=pool)
    assert fake.build is not None
    assert fake.build.service_account == "projects/p/serviceAccounts/builder@p.iam.gserviceaccount.com"
    assert fake.build.options.logging == cloudbuild_v1.BuildOptions.LoggingMode.CLOUD_LOGGING_ONLY
    assert fake.build.options.pool.name == pool
    assert fake.build.options.machine_type == cloudbuild_v1.BuildOptions.MachineType.UNSPECIFIED
    [(_, path, _, _)] = [r for r in fake.rest.requests if r[0] == "POST"]
    assert path == "/v1/projects/p/locations/europe-west1/builds"


def test_unspecified_sends_no_machine_type(cloud: dict[str, Any]) -> None:
    fake = CloudBuildFake()
    run_build(cloud, fake, build_machine_type="UNSPECIFIED")
    [body] = fake.posts()
    assert "options" not in body and "serviceAccount" not in body


@pytest.mark.parametrize(
    ("given", "parameter"),
    [
        ({"build_machine_type": "e2-highcpu-8"}, "build_machine_type"),
        ({"build_service_account": "builder"}, "build_service_account"),
        ({"build_worker_pool": "builders"}, "build_worker_pool"),
        (
            {
                "build_worker_pool": "projects/p/locations/us-east1/workerPools/w",
                "build_location": "us-west1",
            },
            "build_location",
        ),
    ],
)
def test_bad_build_settings_are_refused_before_any_request(
    cloud: dict[str, Any], given: dict[str, str], parameter: str
) -> None:
    fake = CloudBuildFake()
    with pytest.raises(ValueError, match=parameter):
        run_build(cloud, fake, **given)
    assert fake.rest.requests == [] and cloud["registry"].requests == []


def test_a_schedules_run_needs_no_context_once_its_images_exist(cloud: dict[str, Any]) -> None:
    """A schedule's runs reuse the context uploaded when it was made (`contexts/<tag>.tar.gz`):
    with the context pruned, the build step reads the tag from the name; only a build needs the
    tarball, and its absence is then named before any build is asked for."""
    import google.cloud.storage as storage

    named = f"root/contexts/{cloud['tag']}.tar.gz"
    uri = f"gs://{BUCKET}/{named}"  # never uploaded: as if pruned
    assert not storage.Client(project="p").bucket(BUCKET).blob(named).exists()
    fake = CloudBuildFake()
    with pytest.raises(FileNotFoundError, match="contexts"):
        run_build(cloud, fake, context_uri=uri)
    assert not [r for r in fake.rest.requests if r[0] == "POST"]
    cloud["registry"].manifests[f"p/repo/trainer:{cloud['tag']}"] = "sha256:" + "cd" * 32
    cloud["registry"].manifests[f"p/repo/trainer-cpu:{cloud['tag']}"] = "sha256:" + "ab" * 32
    out = run_build(cloud, CloudBuildFake(), context_uri=uri)
    assert (out.tag, out.built) == (cloud["tag"], False)
