"""The Google Cloud settings of `make run` (Vertex target), `make schedule` and `make e2e`.

Read from the environment, else from `env.sh` (KEY=VALUE lines; `env.sh.example` documents each
one), and validated before any request is sent: every problem is reported at once, naming the
setting, what it got and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Mapping
from pathlib import Path

from components import options

# Setting -> (what it is, required). The order is env.sh.example's.
SETTINGS: dict[str, tuple[str, bool]] = {
    "PROJECT_ID": ("Google Cloud project id (e.g. my-project)", True),
    "REGION": (
        "Vertex AI region of every job, e.g. us-central1 (checked against google-cloud-aiplatform's list)",
        True,
    ),
    "PIPELINE_ROOT": ("gs://<bucket>/<path> where runs keep their artifacts (and the build context)", True),
    "BUILD_REGION": (
        (
            "Cloud Build region of the trainer image build: global or a region (default: REGION). Some "
            "projects may only build in us-central1, us-west2, europe-west1, asia-east1, "
            "australia-southeast1 or southamerica-east1"
        ),
        False,
    ),
    "SERVICE_ACCOUNT": (
        "service account the pipeline and its jobs run as (<name>@<project>.iam.gserviceaccount.com)",
        False,
    ),
    "ARTIFACT_REPOSITORY": (
        "Docker repository for the trainer image: <region>-docker.pkg.dev/<project>/<repo>",
        True,
    ),
    "TEMPLATE_REPOSITORY": (
        "KFP repository for schedule templates: https://<region>-kfp.pkg.dev/<project>/<repo>",
        False,
    ),
    "NETWORK": ("VPC network to peer: projects/<project number>/global/networks/<name>", False),
    "KMS_KEY": (
        (
            "CMEK key: projects/<p>/locations/<REGION>/keyRings/<ring>/cryptoKeys/<key>, in REGION itself "
            "(Vertex refuses global and multi-region keys)"
        ),
        False,
    ),
    "LABELS": ("labels of the run, its jobs and the model: key=value,key=value", False),
    "API_ENDPOINT": (
        (
            "Vertex API endpoint of the requests make run, make schedule and make schedules send from "
            "this machine: <region>-aiplatform.googleapis.com (default) or a Private Service Connect one "
            "(<name>.p.googleapis.com). It does not reach the pipeline: its steps and GCPC's jobs always "
            "call <region>-aiplatform.googleapis.com (docs/vertex-fidelity.md)"
        ),
        False,
    ),
    "EXPERIMENT": ("Vertex Experiment the runs are recorded in", False),
    "ENABLE_CACHING": (
        (
            "leave unset to keep each step's compiled caching option (the registry steps and job "
            "folders are never cached); false turns caching off for every step"
        ),
        False,
    ),
}

_PROJECT = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")
_REGION = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")
_BUCKET_URI = re.compile(r"^gs://[a-z0-9][a-z0-9._-]{1,220}[a-z0-9](/[^\s]*)?$")
_DOCKER_REPO = re.compile(
    r"^([a-z0-9-]+)-docker\.pkg\.dev/[a-z][a-z0-9-]{4,28}[a-z0-9]/[a-z][a-z0-9-]{0,62}$"
)
_KFP_REPO = re.compile(
    r"^https://([a-z0-9-]+)-kfp\.pkg\.dev/[a-z][a-z0-9-]{4,28}[a-z0-9]/[a-z][a-z0-9-]{0,62}$"
)
# The same forms as the pipeline parameters they fill (service_account, network; the CMEK key's
# whole rule is `options.kms_key_problem`, shared with encryption_spec_key_name): one home,
# components/options.py.
_SERVICE_ACCOUNT, _NETWORK = options.SERVICE_ACCOUNT, options.NETWORK
_LABEL = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
_ENDPOINT = re.compile(
    r"^([a-z0-9.-]+\.googleapis\.com|[a-z0-9.-]+\.p\.googleapis\.com|http://127\.0\.0\.1:[0-9]+)$"
)


class SettingsError(ValueError):
    """Every bad setting, one per line."""


def vertex_regions() -> frozenset[str]:
    """The regions Vertex AI serves, as the installed google-cloud-aiplatform lists them:
    `google.cloud.aiplatform.constants.base.SUPPORTED_REGIONS`, the list `aiplatform.init()`
    checks its location against (`utils.validate_region`). Less `global`: "Vertex AI doesn't
    support a global location" for training and pipelines ("Vertex AI locations",
    https://cloud.google.com/vertex-ai/docs/general/locations; `global` is for generative AI
    endpoints). Imported here, not at the top: the SDK takes seconds to import, and only the
    Vertex target needs it."""
    from google.cloud.aiplatform.constants import base

    return frozenset(base.SUPPORTED_REGIONS) - {"global"}


def region_problem(region: str) -> str | None:
    """Why `region` is not a Vertex AI region (naming the closest ones), or None."""
    regions = vertex_regions()
    if region in regions:
        return None
    close = difflib.get_close_matches(region, sorted(regions), n=3, cutoff=0.6)
    hint = f"closest: {', '.join(close)}" if close else f"one of: {', '.join(sorted(regions))}"
    return (
        f"REGION={region!r} is not a Vertex AI region (google-cloud-aiplatform lists {len(regions)}, "
        f"google.cloud.aiplatform.constants.base.SUPPORTED_REGIONS); {hint}"
    )


@dataclasses.dataclass(frozen=True)
class Settings:
    project: str
    region: str
    pipeline_root: str
    artifact_repository: str
    service_account: str = ""
    template_repository: str = ""
    network: str = ""
    kms_key: str = ""
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    api_endpoint: str = ""
    experiment: str = ""
    enable_caching: bool | None = None
    build_region: str = ""

    @property
    def bucket(self) -> str:
        return self.pipeline_root.removeprefix("gs://").split("/", 1)[0]


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines (`export` allowed, quotes stripped, # comments)."""
    values: dict[str, str] = {}
    if not path.exists():
        return values
    for line in path.read_text().splitlines():
        match = re.match(r"^\s*(?:export\s+)?([A-Z_][A-Z0-9_]*)\s*=\s*(.*)$", line)
        if not match:
            continue
        raw = match.group(2).strip()
        if raw[:1] in ("'", '"'):
            quote = raw[0]
            raw = raw[1:].split(quote, 1)[0]
        else:
            raw = raw.split("#", 1)[0].strip()
        values[match.group(1)] = raw
    return values


def load(
    environ: Mapping[str, str], env_file: Path = Path("env.sh"), required: tuple[str, ...] | None = None
) -> Settings:
    """Settings from the environment over env.sh; raises SettingsError naming every problem."""
    values = {**read_env_file(env_file), **{k: v for k, v in environ.items() if k in SETTINGS and v}}
    need = required if required is not None else tuple(k for k, (_, req) in SETTINGS.items() if req)
    problems = [f"{key} is not set: {SETTINGS[key][0]}" for key in need if not values.get(key)]

    def check(key: str, pattern: re.Pattern[str]) -> re.Match[str] | None:
        value = values.get(key, "")
        if not value:
            return None
        match = pattern.match(value)
        if not match:
            problems.append(f"{key}={value!r} is not valid: expected {SETTINGS[key][0]}")
        return match

    check("PROJECT_ID", _PROJECT)
    if check("REGION", _REGION) and (problem := region_problem(values["REGION"])):
        problems.append(problem)
    check("PIPELINE_ROOT", _BUCKET_URI)
    build_region = values.get("BUILD_REGION", "")
    if build_region:
        from components import image

        if build_region not in image.CLOUD_BUILD_REGIONS:
            problems.append(
                f"BUILD_REGION={build_region!r} is not a Cloud Build location: global or one of "
                f"{', '.join(image.CLOUD_BUILD_REGIONS[1:])} (https://cloud.google.com/build/docs/locations)"
            )
    check("SERVICE_ACCOUNT", _SERVICE_ACCOUNT)
    check("NETWORK", _NETWORK)
    check("API_ENDPOINT", _ENDPOINT)
    region = values.get("REGION", "")
    for key, pattern in (("ARTIFACT_REPOSITORY", _DOCKER_REPO), ("TEMPLATE_REPOSITORY", _KFP_REPO)):
        match = check(key, pattern)
        if match and region and match.group(1) not in (region, region.split("-")[0], "global"):
            problems.append(f"{key}={values[key]!r} is in {match.group(1)}, not in REGION {region}")
    kms_key = values.get("KMS_KEY", "")
    if kms_key and (problem := options.kms_key_problem(kms_key, region)):
        problems.append(f"KMS_KEY={kms_key!r} is not valid: {problem}")
    labels: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in values.get("LABELS", "").split(","))):
        key, _, value = item.partition("=")
        if not _LABEL.match(key) or not _LABEL_VALUE.match(value):
            problems.append(
                f"LABELS item {item!r} is not valid: keys start with a lowercase letter; keys and values use "
                "lowercase letters, digits, _ and -, at most 63 characters"
            )
        labels[key] = value
    caching = values.get("ENABLE_CACHING", "").lower()
    if caching == "true":
        # aiplatform's PipelineJob(enable_caching=True) rewrites every task's cachingOptions
        # (pipeline_jobs._set_enable_caching_value), the registry lookups included.
        problems.append(
            "ENABLE_CACHING='true' is not allowed: it would force caching on every step, including "
            "the Model Registry lookups whose cached answers are stale; leave it unset (each step's "
            "compiled option: only pure steps are cached) or set false"
        )
    elif caching not in ("", "false"):
        problems.append(f"ENABLE_CACHING={caching!r} is not valid: expected false, or unset")
    if problems:
        raise SettingsError("\n".join(problems))
    return Settings(
        project=values.get("PROJECT_ID", ""),
        region=region,
        pipeline_root=values.get("PIPELINE_ROOT", "").rstrip("/"),
        artifact_repository=values.get("ARTIFACT_REPOSITORY", ""),
        service_account=values.get("SERVICE_ACCOUNT", ""),
        template_repository=values.get("TEMPLATE_REPOSITORY", ""),
        network=values.get("NETWORK", ""),
        kms_key=values.get("KMS_KEY", ""),
        labels=labels,
        api_endpoint=values.get("API_ENDPOINT", ""),
        experiment=values.get("EXPERIMENT", ""),
        enable_caching=False if caching == "false" else None,
        build_region=build_region,
    )


def example() -> str:
    """The text of env.sh.example."""
    lines = [
        "# Google Cloud settings for `make run` (Vertex target), `make schedule` and `make e2e`.",
        "# Copy to env.sh (git-ignored) and fill in; the environment overrides this file.",
        "# With no PROJECT_ID, `make run` runs the pipeline locally instead.",
        "",
    ]
    samples = {
        "PROJECT_ID": "my-project",
        "REGION": "us-central1",
        "PIPELINE_ROOT": "gs://my-project-pipelines/root",
        "BUILD_REGION": "",
        "SERVICE_ACCOUNT": "pipelines@my-project.iam.gserviceaccount.com",
        "ARTIFACT_REPOSITORY": "us-central1-docker.pkg.dev/my-project/training",
        "TEMPLATE_REPOSITORY": "https://us-central1-kfp.pkg.dev/my-project/pipelines",
        "NETWORK": "",
        "KMS_KEY": "",
        "LABELS": "team=ml,env=dev",
        "API_ENDPOINT": "",
        "EXPERIMENT": "",
        "ENABLE_CACHING": "",
    }
    for key, (help_, required) in SETTINGS.items():
        lines.append(f"# {help_}{' (required)' if required else ''}")
        lines.append(f"export {key}={samples[key]}")
        lines.append("")
    return "\n".join(lines)
