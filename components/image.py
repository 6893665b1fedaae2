"""Step 1, the trainer image: built by Cloud Build from a tarball of the build context.

The image tag is a content hash of the context (`context_tag`), so an unchanged trainer is
never rebuilt: when `<repository>/<image>:<tag>` already exists the build is skipped. The
output is always the image pinned by digest (`...@sha256:...`), so every job of one run uses
exactly the same bits.

Vertex form: `build_trainer_image` (Cloud Build + the registry's manifest API).
Local form: `check_build_context` builds nothing (local runs use this checkout) but checks the
context and computes the same tag.
"""

from typing import NamedTuple

from kfp import dsl

from components import runtime
from components.buildcontext import (
    CONTEXT_DIRS,
    CONTEXT_FILES,
    context_members,
    context_tag,
    tarball_members,
    write_context_tarball,
)

__all__ = [
    "CONTEXT_DIRS",
    "CONTEXT_FILES",
    "build_trainer_image",
    "check_build_context",
    "context_members",
    "context_tag",
    "registry_manifest_url",
    "tarball_members",
    "write_context_tarball",
]


def registry_manifest_url(image: str, tag: str) -> str:
    """The Docker Registry v2 manifest URL of `image:tag` (Artifact Registry speaks it).

    Like docker itself, a registry on a loopback address is spoken to over plain HTTP."""
    host, _, path = image.partition("/")
    scheme = "http" if host.split(":")[0] in ("127.0.0.1", "localhost") else "https"
    return f"{scheme}://{host}/v2/{path}/manifests/{tag}"


@dsl.component(
    base_image=runtime.BASE_IMAGE,
    install_kfp_package=False,
    packages_to_install=[runtime.CLOUD_BUILD],
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


@dsl.component(base_image=runtime.BASE_IMAGE, install_kfp_package=False, additional_funcs=[context_tag])
def check_build_context(context_dir: str, repository: str, image_name: str = "trainer") -> NamedTuple(
    "Outputs", image_uri=str, tag=str, built=bool
):
    """Local form of the image build: checks the checkout's build context and computes the tag
    the Vertex build would give it. Nothing is built: local jobs run this checkout's trainer."""
    import collections

    from components.buildcontext import context_members

    tag = context_tag(context_members(context_dir))
    Outputs = collections.namedtuple("Outputs", ["image_uri", "tag", "built"])
    print(f"build context {context_dir}: tag {tag} (local runs use the checkout, nothing built)")
    return Outputs(f"{repository}/{image_name}:{tag}", tag, False)
