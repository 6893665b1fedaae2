"""The image build: content tags, and the real Cloud Build, Storage and registry clients against
local fakes (a build that succeeds, one that fails, and a tag that already exists)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.cloud.devtools import cloudbuild_v1
from google.cloud.devtools.cloudbuild_v1.services.cloud_build.transports.grpc import CloudBuildGrpcTransport
from google.longrunning import operations_pb2
from google.protobuf import any_pb2

from components import image
from tests.fakes import GrpcFake, RegistryFake, insecure_client, storage_emulator

ROOT = Path(__file__).resolve().parents[2]


def make_context(root: Path, trainer_text: str = "print('hi')\n") -> Path:
    (root / "trainer").mkdir(parents=True)
    (root / "trainer" / "task.py").write_text(trainer_text)
    (root / "trainer" / "__pycache__").mkdir()
    (root / "trainer" / "__pycache__" / "task.cpython-311.pyc").write_bytes(b"\0cache")
    for name in image.CONTEXT_FILES:
        (root / name).write_text(f"{name}\n")
    return root


def test_tag_depends_on_content_only(tmp_path: Path) -> None:
    a = make_context(tmp_path / "a")
    b = make_context(tmp_path / "b")
    (b / "trainer" / "__pycache__" / "other.pyc").write_bytes(b"more cache")
    tag = image.context_tag(image.context_members(a))
    assert tag == image.context_tag(image.context_members(b))
    assert tag.startswith("src-") and len(tag) == 24
    (b / "trainer" / "task.py").write_text("print('changed')\n")
    assert image.context_tag(image.context_members(b)) != tag


def test_tarball_round_trip_gives_the_same_tag_and_bytes(tmp_path: Path) -> None:
    ctx = make_context(tmp_path / "ctx")
    first, second = io.BytesIO(), io.BytesIO()
    tag = image.write_context_tarball(ctx, first)
    assert image.write_context_tarball(ctx, second) == tag
    assert first.getvalue() == second.getvalue(), "the tarball must be reproducible"
    members = dict(image.tarball_members(first.getvalue()))
    assert set(members) == {"Dockerfile", "pyproject.toml", "uv.lock", "trainer/task.py"}
    assert image.context_tag(members.items()) == tag


def test_missing_context_files_are_named(tmp_path: Path) -> None:
    (tmp_path / "trainer").mkdir()
    with pytest.raises(ValueError, match=r"lacks Dockerfile, pyproject.toml, uv.lock"):
        list(image.context_members(tmp_path))


def test_this_checkout_has_a_complete_context() -> None:
    tag = image.check_build_context.python_func(context_dir=str(ROOT), repository="local/repo")
    assert tag.tag == image.context_tag(image.context_members(ROOT))
    assert tag.image_uri == f"local/repo/trainer:{tag.tag}" and tag.built is False


# --- the Vertex form against fakes -------------------------------------------------------------

BUCKET, OBJECT = "ctx-bucket", "contexts/ctx.tar.gz"


class CloudBuildFake:
    """CreateBuild answers a finished operation: SUCCESS with a digest, or FAILURE with a log URL."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.grpc = GrpcFake()
        self.grpc.add(
            "google.devtools.cloudbuild.v1.CloudBuild",
            "CreateBuild",
            cloudbuild_v1.CreateBuildRequest,
            self.create,
        )
        self.grpc.add(
            "google.longrunning.Operations", "GetOperation", operations_pb2.GetOperationRequest, self.get
        )
        self.operation: operations_pb2.Operation | None = None

    def create(self, request: cloudbuild_v1.CreateBuildRequest) -> operations_pb2.Operation:
        build = cloudbuild_v1.Build(request.build)
        build.id = "b-123"
        build.log_url = "https://console.cloud.google.com/cloud-build/builds/b-123"
        metadata, response = any_pb2.Any(), any_pb2.Any()
        op = operations_pb2.Operation(name="operations/build/p/b-123", done=True)
        if self.fail:
            build.status = cloudbuild_v1.Build.Status.FAILURE  # type: ignore[assignment]
            build.status_detail = "step 0 exited with 1"
            op.error.code, op.error.message = 2, "Build failed; check build logs for details"
        else:
            build.status = cloudbuild_v1.Build.Status.SUCCESS  # type: ignore[assignment]
            build.results.images.append(
                cloudbuild_v1.BuiltImage(name=build.images[0], digest="sha256:" + "ab" * 32)
            )
            response.Pack(cloudbuild_v1.Build.pb(build))
            op.response.CopyFrom(response)
        metadata.Pack(
            cloudbuild_v1.BuildOperationMetadata.pb(cloudbuild_v1.BuildOperationMetadata(build=build))
        )
        op.metadata.CopyFrom(metadata)
        self.operation = op
        return op

    def get(self, request: operations_pb2.GetOperationRequest) -> operations_pb2.Operation:
        assert self.operation is not None
        return self.operation


@pytest.fixture
def cloud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Storage emulator holding a context tarball, a registry fake, google.auth stubbed."""
    import google.auth
    import google.cloud.storage as storage
    from google.auth.credentials import AnonymousCredentials

    ctx = make_context(tmp_path / "ctx")
    buf = io.BytesIO()
    tag = image.write_context_tarball(ctx, buf)
    monkeypatch.setattr(google.auth, "default", lambda **_: (AnonymousCredentials(), "p"))
    registry = RegistryFake()
    with storage_emulator() as url:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", url)
        client = storage.Client(project="p")
        client.create_bucket(BUCKET).blob(OBJECT).upload_from_string(buf.getvalue())
        yield {"tag": tag, "registry": registry, "repository": f"{registry.host}/p/repo"}
    registry.stop()


def run_build(cloud: dict[str, Any], fake: CloudBuildFake, monkeypatch: pytest.MonkeyPatch) -> Any:
    fake.grpc.start()
    monkeypatch.setattr(
        cloudbuild_v1,
        "CloudBuildClient",
        insecure_client(cloudbuild_v1.CloudBuildClient, CloudBuildGrpcTransport, fake.grpc.address),
    )
    try:
        return image.build_trainer_image.python_func(
            project="p",
            location="us-central1",
            context_uri=f"gs://{BUCKET}/{OBJECT}",
            repository=cloud["repository"],
        )
    finally:
        fake.grpc.stop()


def test_builds_when_the_tag_is_new_and_returns_the_digest(
    cloud: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = CloudBuildFake()
    out = run_build(cloud, fake, monkeypatch)
    image_ref = f"{cloud['repository']}/trainer:{cloud['tag']}"
    assert out.image_uri == f"{cloud['repository']}/trainer@sha256:{'ab' * 32}"
    assert (out.tag, out.built) == (cloud["tag"], True)
    [request] = fake.grpc.calls("CreateBuild")
    assert request.project_id == "p" and request.parent == "projects/p/locations/us-central1"
    assert request.build.source.storage_source.bucket == BUCKET
    assert request.build.source.storage_source.object_ == OBJECT
    assert list(request.build.images) == [image_ref]
    assert list(request.build.steps[0].args) == ["build", "--tag", image_ref, "."]
    assert cloud["registry"].requests == [f"/v2/p/repo/trainer/manifests/{cloud['tag']}"]


def test_skips_the_build_when_the_tag_exists(cloud: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    cloud["registry"].manifests[f"p/repo/trainer:{cloud['tag']}"] = "sha256:" + "cd" * 32
    fake = CloudBuildFake()
    out = run_build(cloud, fake, monkeypatch)
    assert out.image_uri == f"{cloud['repository']}/trainer@sha256:{'cd' * 32}"
    assert out.built is False
    assert fake.grpc.calls("CreateBuild") == []


def test_a_failed_build_fails_with_its_log_url(
    cloud: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(RuntimeError) as err:
        run_build(cloud, CloudBuildFake(fail=True), monkeypatch)
    message = str(err.value)
    assert "b-123" in message and "FAILURE" in message and "step 0 exited with 1" in message
    assert "https://console.cloud.google.com/cloud-build/builds/b-123" in message


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
