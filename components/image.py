"""Step 1, the trainer image: built by Cloud Build from a tarball of the build context.

The image tag is a content hash of the context (`context_tag`), so an unchanged trainer is
never rebuilt: when `<repository>/<image>:<tag>` already exists the build is skipped. The
output is always the image pinned by digest (`...@sha256:...`), so every job of one run uses
exactly the same bits.

Vertex form: `build_trainer_image` (Cloud Build + the registry's manifest API).
Local form: `check_build_context` builds nothing (local runs use this checkout) but checks the
context and computes the same tag.
"""

import hashlib
import io
import os
import tarfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

from kfp import dsl

from components import runtime

# The build context: what the Dockerfile may COPY. Keep in step with .dockerignore.
CONTEXT_FILES = ("Dockerfile", "pyproject.toml", "uv.lock")
CONTEXT_DIRS = ("trainer",)
_SKIP_PARTS = ("__pycache__",)
_SKIP_SUFFIXES = (".pyc", ".pyo")


def context_tag(members: Iterable[tuple[str, bytes]]) -> str:
    """The image tag for a build context: `src-` and 20 hex digits of a hash over the sorted
    (relative path, content) pairs. File order, timestamps and owners do not count."""

    outer = hashlib.sha256()
    for name, data in sorted(members):
        outer.update(name.encode() + b"\0" + hashlib.sha256(data).hexdigest().encode() + b"\n")
    return "src-" + outer.hexdigest()[:20]


def tarball_members(data: bytes) -> list[tuple[str, bytes]]:
    """The regular files of a (gzipped) context tarball as (relative path, content)."""
    import io
    import tarfile

    out = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        for info in tar.getmembers():
            if info.isfile():
                f = tar.extractfile(info)
                name = info.name[2:] if info.name.startswith("./") else info.name
                out.append((name, f.read() if f else b""))
    return out


def context_members(root: str | os.PathLike[str]) -> Iterator[tuple[str, bytes]]:
    """The build context of a checkout, as (relative path, content), caches left out."""
    base = Path(root)
    missing = [name for name in (*CONTEXT_FILES, *CONTEXT_DIRS) if not (base / name).exists()]
    if missing:
        raise ValueError(
            f"build context {base} lacks {', '.join(missing)}; it needs {', '.join(CONTEXT_FILES)} "
            f"and the folders {', '.join(CONTEXT_DIRS)}/"
        )
    for name in CONTEXT_FILES:
        yield name, (base / name).read_bytes()
    for folder in CONTEXT_DIRS:
        for path in sorted((base / folder).rglob("*")):
            rel = path.relative_to(base)
            if path.is_file() and not set(rel.parts) & set(_SKIP_PARTS) and path.suffix not in _SKIP_SUFFIXES:
                yield rel.as_posix(), path.read_bytes()


def write_context_tarball(root: str | os.PathLike[str], out: io.BufferedIOBase | str) -> str:
    """Packs the build context into a reproducible .tar.gz; returns its `context_tag`."""
    members = list(context_members(root))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    import gzip

    payload = gzip.compress(buf.getvalue(), mtime=0)
    if isinstance(out, str):
        Path(out).write_bytes(payload)
    else:
        out.write(payload)
    return context_tag(members)


def registry_manifest_url(image: str, tag: str) -> str:
    """The Docker Registry v2 manifest URL of `image:tag` (Artifact Registry speaks it).

    Like docker itself, a registry on a loopback address is spoken to over plain HTTP."""
    host, _, path = image.partition("/")
    scheme = "http" if host.split(":")[0] in ("127.0.0.1", "localhost") else "https"
    return f"{scheme}://{host}/v2/{path}/manifests/{tag}"


@dsl.component(
    base_image=runtime.BASE_IMAGE,
    packages_to_install=[runtime.CLOUD_BUILD, runtime.STORAGE],
    additional_funcs=[context_tag, tarball_members, registry_manifest_url],
)
def build_trainer_image(
    project: str,
    location: str,
    context_uri: str,
    repository: str,
    image_name: str = "trainer",
    timeout_seconds: int = 3600,
) -> NamedTuple("Outputs", image_uri=str, tag=str, built=bool):
    """Builds `<repository>/<image_name>:<content tag>` with Cloud Build unless it exists.

    Args:
        context_uri: gs:// URI of the build context tarball (Dockerfile, trainer/, pyproject.toml,
            uv.lock), written by `make run`.
        repository: Artifact Registry repository, `<region>-docker.pkg.dev/<project>/<repo>`.
    Returns:
        image_uri: the image pinned by digest, `<repository>/<image_name>@sha256:...`.
        tag: the content tag; built: False when the tag existed and the build was skipped.
    Raises:
        RuntimeError naming the build, its status and its log URL when the build fails.
    """
    import collections
    import re

    import google.auth
    import google.auth.transport.requests
    import google.cloud.storage as storage
    from google.cloud.devtools import cloudbuild_v1
    from google.protobuf import duration_pb2

    match = re.match(r"^gs://([^/]+)/(.+)$", context_uri)
    if not match:
        raise ValueError(f"context_uri must be gs://<bucket>/<object>, got {context_uri!r}")
    bucket, blob_name = match.groups()
    if not re.match(
        r"^[a-z0-9-]+-docker\.pkg\.dev/[^/]+/[^/]+$|^(127\.0\.0\.1|localhost)(:\d+)?/", repository
    ):
        raise ValueError(
            f"repository must be <region>-docker.pkg.dev/<project>/<repository>, got {repository!r}"
        )
    Outputs = collections.namedtuple("Outputs", ["image_uri", "tag", "built"])

    data = storage.Client(project=project).bucket(bucket).blob(blob_name).download_as_bytes()
    tag = context_tag(tarball_members(data))
    image = f"{repository}/{image_name}"

    credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    session = google.auth.transport.requests.AuthorizedSession(credentials)
    manifest_types = ", ".join(
        [
            "application/vnd.oci.image.index.v1+json",
            "application/vnd.docker.distribution.manifest.list.v2+json",
            "application/vnd.oci.image.manifest.v1+json",
            "application/vnd.docker.distribution.manifest.v2+json",
        ]
    )
    head = session.head(registry_manifest_url(image, tag), headers={"Accept": manifest_types}, timeout=60)
    if head.status_code == 200 and head.headers.get("Docker-Content-Digest"):
        digest = head.headers["Docker-Content-Digest"]
        print(f"{image}:{tag} exists ({digest}); build skipped")
        return Outputs(f"{image}@{digest}", tag, False)
    if head.status_code not in (404, 401, 403) and head.status_code != 200:
        raise RuntimeError(f"registry answered {head.status_code} for {image}:{tag}: {head.text[:300]}")

    client = cloudbuild_v1.CloudBuildClient()
    build = cloudbuild_v1.Build(
        source=cloudbuild_v1.Source(
            storage_source=cloudbuild_v1.StorageSource(bucket=bucket, object_=blob_name)
        ),
        steps=[
            cloudbuild_v1.BuildStep(
                name="gcr.io/cloud-builders/docker",
                args=["build", "--tag", f"{image}:{tag}", "."],
            )
        ],
        images=[f"{image}:{tag}"],
        timeout=duration_pb2.Duration(seconds=timeout_seconds),
        tags=["trainer-image", tag],
    )
    operation = client.create_build(
        request=cloudbuild_v1.CreateBuildRequest(
            parent=f"projects/{project}/locations/{location}", project_id=project, build=build
        )
    )
    build_id = operation.metadata.build.id if operation.metadata else "?"
    print(f"Cloud Build {build_id} started: {image}:{tag}")
    try:
        result = operation.result(timeout=timeout_seconds + 300)
    except Exception as err:  # the operation carries the failed Build in its metadata
        failed = operation.metadata.build if operation.metadata else None
        log_url = failed.log_url if failed else "(unknown)"
        status = cloudbuild_v1.Build.Status(failed.status).name if failed else "UNKNOWN"
        detail = failed.status_detail if failed else str(err)
        raise RuntimeError(
            f"Cloud Build {build_id} for {image}:{tag} ended {status}: {detail}; log: {log_url}"
        ) from err
    if result.status != cloudbuild_v1.Build.Status.SUCCESS:
        raise RuntimeError(
            f"Cloud Build {result.id} for {image}:{tag} ended "
            f"{cloudbuild_v1.Build.Status(result.status).name}: {result.status_detail}; log: {result.log_url}"
        )
    digests = [i.digest for i in result.results.images if i.name == f"{image}:{tag}" and i.digest]
    if not digests:
        raise RuntimeError(f"Cloud Build {result.id} succeeded but reported no digest for {image}:{tag}")
    print(f"built {image}:{tag} ({digests[0]}) in Cloud Build {result.id}; log: {result.log_url}")
    return Outputs(f"{image}@{digests[0]}", tag, True)


@dsl.component(base_image=runtime.BASE_IMAGE, additional_funcs=[context_tag])
def check_build_context(context_dir: str, repository: str, image_name: str = "trainer") -> NamedTuple(
    "Outputs", image_uri=str, tag=str, built=bool
):
    """Local form of the image build: checks the checkout's build context and computes the tag
    the Vertex build would give it. Nothing is built: local jobs run this checkout's trainer."""
    import collections

    from components.image import context_members

    tag = context_tag(context_members(context_dir))
    Outputs = collections.namedtuple("Outputs", ["image_uri", "tag", "built"])
    print(f"build context {context_dir}: tag {tag} (local runs use the checkout, nothing built)")
    return Outputs(f"{repository}/{image_name}:{tag}", tag, False)
