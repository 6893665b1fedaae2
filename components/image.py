"""Step 1, the trainer image: built by Cloud Build from a tarball of the build context.

The tag is a content hash of the context (`context_tag`), so an unchanged trainer is never
rebuilt; the outputs are images pinned by digest, so every job of one run uses the same bits.

Vertex form: `build_trainer_image` speaks Cloud Build's REST API and the registry's manifest API
through google-auth's `AuthorizedSession` (nothing installed at run time). Local form:
`local.steps.check_build_context` builds nothing but checks the context and computes the same tag.
"""

from typing import Any, NamedTuple

from kfp import dsl

from components import stepimage
from components.buildcontext import context_tag, tarball_members
from components.servingimage import (
    prebuilt_days_left,
    prebuilt_tf_serving_table,
    resolve_serving_image,
    serving_policy,
)


def registry_digest(session: Any, image: str, tag: str) -> str:
    """The digest of `image:tag` from a HEAD of its manifest, "" when absent (404 only). 401/403
    raise PermissionError naming the roles needed (reader to read, writer for the build's push:
    https://cloud.google.com/iam/docs/roles-permissions/artifactregistry); any other answer
    RuntimeError with the status and the start of the error body."""
    import requests

    # The Docker Registry v2 manifest URL (plain HTTP on loopback, as docker does).
    host, _, path = image.partition("/")
    scheme = "http" if host.split(":")[0] in ("127.0.0.1", "localhost") else "https"
    url = f"{scheme}://{host}/v2/{path}/manifests/{tag}"
    accept = (
        "application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, "
        "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json"
    )
    head = session.head(url, headers={"Accept": accept}, timeout=60)
    digest = head.headers.get("Docker-Content-Digest", "")
    if head.status_code == 200 and digest:
        return digest
    if head.status_code == 404:
        return ""
    try:  # an answer to HEAD has no body: ask once more with GET for the registry's message
        body = session.get(url, headers={"Accept": accept}, timeout=60).text[:300]
    except requests.RequestException as err:
        body = f"(no body: {err})"
    if head.status_code in (401, 403):
        who = getattr(getattr(session, "credentials", None), "service_account_email", "") or ""
        account = f" ({who})" if who and who != "default" else ""
        repository = image.rsplit("/", 1)[0]
        raise PermissionError(
            f"the pipeline's service account{account} cannot read the Artifact Registry repository "
            f"{repository}: the registry answered {head.status_code} to HEAD {url}: {body!r}. Grant it "
            "roles/artifactregistry.reader there (the build pushes as Cloud Build's service account, "
            "which needs roles/artifactregistry.writer); docs/vertex.md#the-iam-roles-a-first-run-needs"
        )
    if head.status_code == 200:
        raise RuntimeError(f"the registry answered 200 without a Docker-Content-Digest for {image}:{tag}")
    raise RuntimeError(f"the registry answered {head.status_code} for {image}:{tag} ({url}): {body!r}")


# Where Cloud Build runs builds (https://cloud.google.com/build/docs/locations, 2026-11), plus
# `global`. The same page: "Depending on usage, certain projects may be restricted to only use Cloud
# Build in the following regions" (the second tuple; elsewhere FAILED_PRECONDITION: docs/facts.md, fact 29).
def cloud_build_regions() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(every Cloud Build location, the six a restricted project may use)."""
    regions = (  # noqa: SIM905 (one string reads as the doc's list)
        "global africa-south1 asia-east1 asia-east2 asia-northeast1 asia-northeast2 asia-northeast3 "
        "asia-south1 asia-south2 asia-southeast1 asia-southeast2 australia-southeast1 australia-southeast2 "
        "europe-central2 europe-north1 europe-north2 europe-southwest1 europe-west1 europe-west2 "
        "europe-west3 europe-west4 europe-west6 europe-west8 europe-west9 europe-west10 europe-west12 "
        "me-central1 me-central2 me-west1 northamerica-northeast1 northamerica-northeast2 "
        "northamerica-south1 southamerica-east1 southamerica-west1 us-central1 us-east1 us-east4 "
        "us-east5 us-south1 us-west1 us-west2 us-west3 us-west4"
    ).split()
    restricted = "us-central1 us-west2 europe-west1 asia-east1 australia-southeast1 southamerica-east1"
    return tuple(regions), tuple(restricted.split())


CLOUD_BUILD_REGIONS, RESTRICTED_BUILD_REGIONS = cloud_build_regions()


def restricted_build_fallback(location: str) -> str:
    """The restricted build region to retry a refused build in when `build_location` was not
    chosen: the one on the region's continent (Middle East and Africa, which have none: EMEA's
    europe-west1); "" when there is none to try (`global`, already one of the six, unknown)."""
    _, restricted = cloud_build_regions()
    area, dash, _ = location.partition("-")
    if location in restricted or not dash:
        return ""
    if location.startswith("us-west"):
        return "us-west2"
    area = {"northamerica": "us", "me": "europe", "africa": "europe"}.get(area, area)
    return next((region for region in restricted if region.startswith(f"{area}-")), "")


def build_settings(
    project: str,
    location: str,
    build_location: str,
    machine_type: str,
    service_account: str,
    worker_pool: str,
) -> tuple:
    """(the Build's `options` and `serviceAccount` as REST JSON, the region to build in) for
    build_machine_type, build_service_account and build_worker_pool; ValueError naming the
    parameter and what it allows.

    - `machineType`: google-cloud-build's `BuildOptions.MachineType` names (a test compares),
      UNSPECIFIED the default worker (https://cloud.google.com/build/docs/optimize-builds/increase-vcpu-for-builds);
      not sent with a private pool, whose workers are its `workerConfig.machineType`
      (https://cloud.google.com/build/docs/private-pools/private-pool-config-file-schema).
    - `pool.name` (BuildOptions.PoolOption): the build is created in the pool's region
      (https://cloud.google.com/build/docs/private-pools/run-builds-in-private-pool).
    - `serviceAccount` (Build.service_account; an e-mail is taken as an account of `project`): its
      logs must then avoid the default bucket, so CLOUD_LOGGING_ONLY
      (https://cloud.google.com/build/docs/securing-builds/configure-user-specified-service-accounts)."""
    import re

    machine_types = (
        "UNSPECIFIED",
        "N1_HIGHCPU_8",
        "N1_HIGHCPU_32",
        "E2_HIGHCPU_8",
        "E2_HIGHCPU_32",
        "E2_MEDIUM",
        "E2_STANDARD_2",
    )
    if machine_type not in machine_types:
        raise ValueError(
            f"build_machine_type {machine_type!r} is not a Cloud Build machine type: one of "
            f"{', '.join(machine_types)} (UNSPECIFIED: the default worker)"
        )
    pool = re.fullmatch(r"projects/[^/\s]+/locations/([a-z0-9-]+)/workerPools/[^/\s]+", worker_pool)
    if worker_pool and not pool:
        raise ValueError(
            f"build_worker_pool {worker_pool!r} is not projects/PROJECT/locations/REGION/workerPools/POOL "
            "('': Cloud Build's default pool)"
        )
    if pool and build_location and pool.group(1) != build_location:
        raise ValueError(
            f"build_worker_pool is in {pool.group(1)} but build_location is {build_location}: a build runs "
            "in its private pool's region (leave build_location '' or give the pool's region)"
        )
    if service_account and re.fullmatch(r"[^@/\s]+@[^@/\s]+\.[a-z]+", service_account):
        service_account = f"projects/{project}/serviceAccounts/{service_account}"
    if service_account and not re.fullmatch(r"projects/[^/\s]+/serviceAccounts/[^/\s]+", service_account):
        raise ValueError(
            f"build_service_account {service_account!r} is neither a service account's e-mail nor "
            "projects/PROJECT/serviceAccounts/EMAIL ('': Cloud Build's default service account)"
        )
    options = {
        "pool": {"name": worker_pool} if pool else None,
        "machineType": machine_type if not pool and machine_type != "UNSPECIFIED" else None,
        "logging": "CLOUD_LOGGING_ONLY" if service_account else None,
    }
    fields = {"options": {k: v for k, v in options.items() if v}, "serviceAccount": service_account}
    region = (pool.group(1) if pool else "") or build_location or location
    return {k: v for k, v in fields.items() if v}, region


# The poll below is ours, not google-cloud-build's Operation.result(): that says no status
# change on the way and retries no transient error (api_core's Retry would, without counting them).
def run_cloud_build(
    session: Any,
    api_root: str,
    project: str,
    location: str,
    build: dict,
    wait_seconds: float,
    poll_seconds: float,
    fall_back: bool = False,
) -> dict:
    """Starts `build` (a Build as REST JSON), polls its operation until done and returns the
    finished Build; RuntimeError (naming id, status, log URL) unless it succeeds, TimeoutError
    after `wait_seconds`.

    REST (Cloud Build v1; google-cloud-build's `cloudbuild_v1/services/cloud_build/transports/rest_base.py`):
    - `POST {api_root}/v1/{parent=projects/*/locations/*}/builds?projectId=...` answers an
      Operation whose `metadata.build` has `id`, `logUrl`, `status`:
      https://cloud.google.com/build/docs/api/reference/rest/v1/projects.locations.builds/create
    - `GET {api_root}/v1/{name=projects/*/locations/*/operations/*}`: once `done`, `response` is the
      Build (`status`, `statusDetail`, `logUrl`, `results.images[].name/.digest`) or `error` is set
      (the failed Build stays in `metadata`):
      https://cloud.google.com/build/docs/api/reference/rest/v1/projects.locations.operations/get

    A project restricted to six build regions is refused elsewhere with FAILED_PRECONDITION
    (https://cloud.google.com/build/docs/locations, "Restricted regions for some projects"): with
    `fall_back` (no region chosen) the build is asked for once more in
    `restricted_build_fallback(location)`; otherwise, or when refused again, the error names
    BUILD_REGION."""
    import time

    import requests

    root = api_root.rstrip("/")
    images = ", ".join(build.get("images", []))
    _, restricted = cloud_build_regions()

    def create(region: str) -> Any:
        return session.post(
            f"{root}/v1/projects/{project}/locations/{region}/builds",
            params={"projectId": project},
            json=build,
            timeout=60,
        )

    def region_refused(answer: Any) -> bool:
        return "FAILED_PRECONDITION" in answer.text and "region" in answer.text.lower()

    created, tried = create(location), [location]
    nearer = restricted_build_fallback(location) if fall_back else ""
    if created.status_code != 200 and nearer and region_refused(created):
        print(
            f"Cloud Build refused to build in {location} (this project may only build in "
            f"{', '.join(restricted)}); BUILD_REGION is not set, so building in {nearer}, the "
            "restricted region on the same continent (https://cloud.google.com/build/docs/locations)"
        )
        created = create(nearer)
        tried.append(nearer)
    if created.status_code != 200:
        hint = ""
        if created.status_code in (401, 403) and "act as" in created.text.lower():
            # Since Cloud Build's default service account change (May 2024) "the users submitting the
            # build must have the iam.serviceAccounts.actAs permission on the service account"
            # (https://cloud.google.com/build/docs/cloud-build-service-account-updates).
            hint = (
                " (grant the pipeline's service account roles/iam.serviceAccountUser on Cloud Build's "
                "service account, since May 2024 the Compute Engine default one, <project number>-compute"
                f"@developer.gserviceaccount.com of {project}; docs/vertex.md#the-iam-roles-a-first-run-needs)"
            )
        elif created.status_code in (401, 403):
            hint = (
                " (the pipeline's service account needs roles/cloudbuild.builds.editor, which holds "
                f"cloudbuild.builds.create, in project {project}; see docs/vertex.md#the-iam-roles-a-first-run-needs)"
            )
        elif region_refused(created):
            hint = (
                f" (Cloud Build cannot build in {' or '.join(tried)} for this project, restricted to "
                f"{', '.join(restricted)} (https://cloud.google.com/build/docs/locations). Set "
                "BUILD_REGION (the pipeline parameter build_location) to one of them or to global)"
            )
        raise RuntimeError(
            f"Cloud Build refused the build of {images} in {tried[-1]}: {created.status_code} "
            f"{created.text[:300]!r}{hint}"
        )
    operation = created.json()
    name = operation["name"]
    started = operation.get("metadata", {}).get("build", {})
    build_id, log_url = started.get("id", "?"), started.get("logUrl", "(unknown)")
    status = started.get("status", "STATUS_UNKNOWN")
    print(f"Cloud Build {build_id} started for {images} ({status}); log: {log_url}")

    deadline = time.monotonic() + wait_seconds
    failures = 0
    while not operation.get("done"):
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"Cloud Build {build_id} for {images} was not done after {wait_seconds:.0f}s "
                f"(last status {status}); it may still be running; log: {log_url}"
            )
        time.sleep(poll_seconds)
        try:
            polled = session.get(f"{root}/v1/{name}", timeout=60)
            problem = f"{polled.status_code} {polled.text[:300]!r}"
        except requests.RequestException as err:
            polled, problem = None, str(err)
        if polled is not None and polled.status_code == 200:
            operation, failures = polled.json(), 0
            now = operation.get("metadata", {}).get("build", {}).get("status", status)
            if now != status:
                status = now
                print(f"Cloud Build {build_id}: {status}")
            continue
        failures += 1
        if (polled is not None and polled.status_code not in (429, 500, 502, 503, 504)) or failures >= 5:
            raise RuntimeError(f"polling Cloud Build {build_id} ({name}) failed: {problem}; log: {log_url}")
        print(f"polling Cloud Build {build_id}: {problem}; trying again")

    result = operation.get("response") or operation.get("metadata", {}).get("build", {})
    status = result.get("status", "STATUS_UNKNOWN")
    if "error" in operation or status != "SUCCESS":
        error = operation.get("error", {}).get("message", "")
        detail = "; ".join(part for part in (result.get("statusDetail", ""), error) if part)
        raise RuntimeError(
            f"Cloud Build {result.get('id', build_id)} for {images} ended {status}: {detail}; "
            f"log: {result.get('logUrl', log_url)}"
        )
    return result


def trainer_images(
    base: str, serving_accelerator: str, reduction_server_count: int, prepare_engine: str, serving: bool
) -> dict:
    """{output: (image, Dockerfile, stage)} of each image the build step makes, on either target:
    `base` is `<repository>/<image_name>`; `serving`: `resolve_serving_image` decided `custom`."""
    wanted = {
        "image_uri": (base, "Dockerfile", "trainer"),
        "cpu_image_uri": (f"{base}-cpu", "Dockerfile", "cpu"),
    }
    if reduction_server_count > 0:
        wanted["training_image_uri"] = (f"{base}-reduction-server", "Dockerfile", "reduction-server")
    if prepare_engine == "beam":
        wanted["dataflow_image_uri"] = (f"{base}-dataflow", "Dockerfile", "dataflow")
    if serving:
        suffix = "-serving-gpu" if serving_accelerator == "gpu" else "-serving"
        wanted["serving_image_uri"] = (f"{base}{suffix}", "Dockerfile.serving", serving_accelerator)
    return wanted


def image_outputs(uris: dict, tag: str, built: bool) -> Any:
    """The image step's outputs from `uris` (by output name, `trainer_images`): "" for an image not
    asked for; the training image is the trainer's unless a reduction-server one is."""
    import collections

    Outputs = collections.namedtuple(
        "Outputs", "image_uri tag built serving_image_uri training_image_uri dataflow_image_uri cpu_image_uri"
    )
    defaults = {"serving_image_uri": "", "dataflow_image_uri": "", "training_image_uri": uris["image_uri"]}
    return Outputs(tag=tag, built=built, **{**defaults, **uris})


@dsl.component(
    base_image=stepimage.BASE_IMAGE,
    install_kfp_package=False,
    additional_funcs=[
        context_tag,
        tarball_members,
        registry_digest,
        cloud_build_regions,
        restricted_build_fallback,
        build_settings,
        run_cloud_build,
        prebuilt_tf_serving_table,
        serving_policy,
        prebuilt_days_left,
        resolve_serving_image,
        trainer_images,
        image_outputs,
    ],
)
def build_trainer_image(
    project: str,
    location: str,
    context_uri: str,
    repository: str,
    image_name: str = "trainer",
    serving_image: str = "auto",
    serving_tf_version: str = "2.15",
    serving_accelerator: str = "cpu",
    reduction_server_count: int = 0,
    prepare_engine: str = "job",
    timeout_seconds: int = 3600,
    api_root: str = "https://cloudbuild.googleapis.com",
    poll_seconds: float = 10.0,
    build_location: str = "",
    build_machine_type: str = "E2_HIGHCPU_8",
    build_service_account: str = "",
    build_worker_pool: str = "",
) -> NamedTuple(
    "Outputs",
    image_uri=str,
    tag=str,
    built=bool,
    serving_image_uri=str,
    training_image_uri=str,
    dataflow_image_uri=str,
    cpu_image_uri=str,
):
    """Builds, in one Cloud Build and only where the tag is absent, `<repository>/<image_name>:<tag>`
    (Dockerfile's `trainer` stage), `-cpu` (its `cpu` stage: no CUDA wheels, for the CPU jobs)
    and, when asked, `-reduction-server` (`reduction_server_count` > 0: the trainer plus Google's
    NCCL plugin), `-dataflow` (`prepare_engine` beam: plus Apache Beam and the Flex Template
    launcher) and `-serving` or `-serving-gpu` (Dockerfile.serving's `serving_accelerator` stage)
    when `servingimage.resolve_serving_image` decides `custom`: the run's one decision.

    Args:
        context_uri: gs:// URI of the build context tarball, written by `make run`.
        repository: Artifact Registry repository, `<region>-docker.pkg.dev/<project>/<repo>`.
        timeout_seconds: the build's timeout; the step waits at most that plus the build's
            queue TTL (one hour) and five minutes.
        api_root: Cloud Build's REST root (tests point it at a local fake).
        build_location: the Cloud Build region ("": `location`, the Vertex region; or `global`).
    Returns:
        Each image pinned by digest (`...@sha256:...`; "" for one not asked for), the tag, and
        `built` (False when every tag existed). `training_image_uri` is the reduction-server
        image when there is one, else `image_uri`.
    """
    import re

    import google.auth
    import google.auth.transport.requests
    import google.cloud.storage as storage

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
    settings, build_region = build_settings(
        project, location, build_location, build_machine_type, build_service_account, build_worker_pool
    )

    custom = resolve_serving_image(serving_image, serving_tf_version) == "custom"
    if serving_image == "auto":
        print(
            "serving_image=auto: "
            + ("the custom serving image" if custom else "Vertex's prebuilt one")
            + f" (prebuilt TensorFlow {serving_tf_version} ends on {prebuilt_days_left(serving_tf_version)[0]})"
        )
    # An uploaded context is named by its tag (`<PIPELINE_ROOT>/contexts/<tag>.tar.gz`): once a
    # schedule's images exist, a pruned `contexts/` costs its runs nothing.
    context = storage.Client(project=project).bucket(bucket).blob(blob_name)
    named = re.fullmatch(r"(?:.+/)?contexts/(src-[0-9a-f]{20})\.tar\.gz", blob_name)
    tag = named.group(1) if named else context_tag(tarball_members(context.download_as_bytes()))
    wanted = trainer_images(
        f"{repository}/{image_name}", serving_accelerator, reduction_server_count, prepare_engine, custom
    )

    credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    session = google.auth.transport.requests.AuthorizedSession(credentials)
    digests = {image: registry_digest(session, image, tag) for image, _, _ in wanted.values()}
    for image, digest in digests.items():
        print(f"{image}:{tag} " + (f"exists ({digest})" if digest else "is absent"))
    missing = [spec for spec in wanted.values() if not digests[spec[0]]]  # (image, Dockerfile, stage)

    if missing and named and not context.exists():
        raise FileNotFoundError(
            f"the build context {context_uri} is gone (contexts/ pruned?) and "
            f"{', '.join(f'{i}:{tag}' for i, _, _ in missing)} must be built from it: upload it again "
            "with `make run` or `make schedule` (docs/training.md, 'What may be deleted')"
        )
    if missing:
        queue_ttl = 3600
        build = {
            "source": {"storageSource": {"bucket": bucket, "object": blob_name}},
            # BuildKit builds only the stages a target needs; the steps share the worker's
            # Docker, so later builds of Dockerfile reuse the first's layers.
            "steps": [
                {
                    "name": "gcr.io/cloud-builders/docker",
                    "env": ["DOCKER_BUILDKIT=1"],
                    "args": [
                        "build",
                        "--file",
                        dockerfile,
                        "--target",
                        stage,
                        "--tag",
                        f"{image}:{tag}",
                        ".",
                    ],
                }
                for image, dockerfile, stage in missing
            ],
            "images": [f"{image}:{tag}" for image, _, _ in missing],
            "timeout": f"{timeout_seconds}s",
            "queueTtl": f"{queue_ttl}s",
            "tags": ["trainer-image", tag],
            **settings,
        }
        result = run_cloud_build(
            session,
            api_root,
            project,
            build_region,
            build,
            wait_seconds=timeout_seconds + queue_ttl + 300,
            poll_seconds=poll_seconds,
            fall_back=not build_location and not build_worker_pool,
        )
        reported = {i.get("name"): i.get("digest") for i in result.get("results", {}).get("images", [])}
        for image, _, _ in missing:
            if not reported.get(f"{image}:{tag}"):
                raise RuntimeError(
                    f"Cloud Build {result.get('id')} succeeded but reported no digest for {image}:{tag}; "
                    f"log: {result.get('logUrl')}"
                )
            digests[image] = reported[f"{image}:{tag}"]
            print(f"built {image}:{tag} ({digests[image]}) in Cloud Build {result.get('id')}")
    else:
        print("every image exists; build skipped")

    pinned = {out: f"{image}@{digests[image]}" for out, (image, _, _) in wanted.items()}
    return image_outputs(pinned, tag, bool(missing))
