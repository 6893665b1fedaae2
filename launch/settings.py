"""The Google Cloud settings of `make run` (Vertex target), `make schedule` and `make e2e`.

Read from the environment, else from `env.sh` (`env.sh.example` documents each), and validated
before any request: every problem at once, naming the setting, what it got and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import io
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path

from components.image import CLOUD_BUILD_REGIONS
from pipeline.options import jobs as job_rules
from pipeline.options.common import dot_folders
from pipeline.options.persistent_resource import persistent_resource_id_problem

# Setting -> what it is (env.sh.example's comment); the order is env.sh.example's.
SETTINGS: dict[str, str] = {
    "PROJECT_ID": "Google Cloud project id (e.g. my-project)",
    "REGION": (
        "Vertex AI region of every job, e.g. us-central1 (checked against google-cloud-aiplatform's list)"
    ),
    "PIPELINE_ROOT": "gs://<bucket>/<path> where runs keep their artifacts (and the build context)",
    "BUILD_REGION": (
        "Cloud Build region of the trainer image build: global or a region (default: REGION). Some "
        "projects may only build in us-central1, us-west2, europe-west1, asia-east1, "
        "australia-southeast1 or southamerica-east1"
    ),
    "SERVICE_ACCOUNT": (
        "service account the pipeline and its jobs run as (<name>@<project>.iam.gserviceaccount.com)"
    ),
    "ARTIFACT_REPOSITORY": (
        "Docker repository for the trainer image: <region>-docker.pkg.dev/<project>/<repo>"
    ),
    "TEMPLATE_REPOSITORY": (
        "KFP repository for schedule templates: https://<region>-kfp.pkg.dev/<project>/<repo>"
    ),
    "NETWORK": "VPC network to peer: projects/<project number>/global/networks/<name>",
    "KMS_KEY": (
        "CMEK key: projects/<p>/locations/<REGION>/keyRings/<ring>/cryptoKeys/<key>, in REGION itself "
        "(Vertex refuses global and multi-region keys)"
    ),
    "PERSISTENT_RESOURCE_ID": (
        "ID of a Vertex persistent resource in PROJECT_ID and REGION that the preparation, training and "
        "evaluation jobs run on instead of machines started for each (default: none, on demand). It "
        "bills while it exists, busy or idle: "
        "docs/architecture.md#a-warm-pool-the-jobs-on-a-vertex-persistent-resource says when it pays"
    ),
    "LABELS": "labels of the run, its jobs and the model: key=value,key=value",
    "API_ENDPOINT": (
        "Vertex API endpoint of the requests make run, make schedule and make schedules send from "
        "this machine: <region>-aiplatform.googleapis.com (default) or a Private Service Connect one "
        "(<name>.p.googleapis.com). It does not reach the pipeline: its steps and GCPC's jobs always "
        "call <region>-aiplatform.googleapis.com "
        "(docs/guarantees.md#the-local-target-is-as-strict-as-vertex)"
    ),
    "EXPERIMENT": (
        "Vertex Experiment make run's runs are recorded in: 4 to 128 lowercase letters, digits or - "
        "(a schedule cannot record its runs in one)"
    ),
    "ENABLE_CACHING": (
        "leave unset to keep each step's compiled caching option (the registry steps and job "
        "folders are never cached); false turns caching off for every step"
    ),
    "PREFLIGHT_VALIDATIONS": (
        "leave unset to have Vertex validate the run's components before it creates the run "
        "(PipelineJob.preflight_validations), make schedule's runs too; false skips Google's check"
    ),
}
# The settings `load` requires by default (`make run`'s Vertex target, `make gpu-check`).
REQUIRED = ("PROJECT_ID", "REGION", "PIPELINE_ROOT", "ARTIFACT_REPOSITORY")

_PROJECT_ID = r"[a-z][a-z0-9-]{4,28}[a-z0-9]"
_REPOSITORY = r"[a-z][a-z0-9-]{0,62}"
_PROJECT = re.compile(f"^{_PROJECT_ID}$")
_REGION = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")
_EXPERIMENT = re.compile(r"^[a-z0-9-]{4,128}$")
_BUCKET_URI = re.compile(r"^gs://[a-z0-9][a-z0-9._-]{1,220}[a-z0-9](/[^\s]*)?$")
_DOCKER_REPO = re.compile(rf"^([a-z0-9-]+)-docker\.pkg\.dev/{_PROJECT_ID}/{_REPOSITORY}$")
_KFP_REPO = re.compile(rf"^https://([a-z0-9-]+)-kfp\.pkg\.dev/{_PROJECT_ID}/{_REPOSITORY}$")
# Google's endpoints, Private Service Connect's (<name>.p.googleapis.com) among them, or a local stub.
_ENDPOINT = re.compile(r"^([a-z0-9.-]+\.googleapis\.com|http://127\.0\.0\.1:[0-9]+)$")


class SettingsError(ValueError):
    """Every bad setting, one per line, each starting with the setting's name (`REGION='x' is...`);
    a settings file that cannot be read is one line starting with its path."""

    @property
    def settings(self) -> list[str]:
        """The setting each line names, in order (none for an unreadable file)."""
        return re.findall(r"^([A-Z][A-Z0-9_]*)(?=[= ])", str(self), re.MULTILINE)


def vertex_regions() -> frozenset[str]:
    """google-cloud-aiplatform's `constants.base.SUPPORTED_REGIONS` (what `aiplatform.init()`
    checks its location against) less `global`: "Vertex AI doesn't support a global location" for
    training and pipelines (https://cloud.google.com/vertex-ai/docs/general/locations). Imported
    late: the SDK takes seconds to import."""
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
    preflight_validations: bool = True
    build_region: str = ""
    persistent_resource_id: str = ""

    @property
    def bucket(self) -> str:
        return self.pipeline_root.removeprefix("gs://").split("/", 1)[0]


# env.sh is a few dozen short lines: a far larger file is not one, refused rather than read.
ENV_FILE_MAX_BYTES = 1 << 20
_UTF8_BOM = b"\xef\xbb\xbf"
# Longest first: UTF-32's little-endian mark starts with UTF-16's.
_WIDE_BOMS = {
    b"\xff\xfe\x00\x00": "UTF-32 little-endian",
    b"\x00\x00\xfe\xff": "UTF-32 big-endian",
    b"\xff\xfe": "UTF-16 little-endian",
    b"\xfe\xff": "UTF-16 big-endian",
}


_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _line_of(data: bytes, offset: int) -> str:
    line = data.count(b"\n", 0, offset) + 1
    column = offset - (data.rfind(b"\n", 0, offset) + 1) + 1
    return f"byte offset {offset} (line {line}, column {column})"


def read_user_text(path: Path, max_bytes: int, expected: str, remedy: str, too_large: str) -> str | None:
    """The text of a file the user names (env.sh, --training_config), or None when there is none.
    Anything but a regular UTF-8 text file of at most `max_bytes` is a one-line SettingsError. It is
    looked at (stat) before it is opened, without blocking: a FIFO or a device is never waited on."""
    name = str(path)
    try:
        before = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise SettingsError(
                f"{name} is a symbolic link to {os.readlink(path)!r}, which does not exist: point it at "
                "your settings file, or remove it to run without one"
            ) from None
        return None
    except NotADirectoryError:
        return None  # a part of the path is a file: there is no env.sh there
    except OSError as err:
        raise SettingsError(
            f"{name} cannot be examined ({err.strerror}): check the file and its folder"
        ) from None
    if not stat.S_ISREG(before.st_mode):
        raise SettingsError(f"{name} is {_kind(before.st_mode)}, not a file: {expected}; {remedy}")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as err:
        raise SettingsError(
            f"{name} cannot be read ({err.strerror}): make it readable (chmod u+r {name})"
        ) from None
    with os.fdopen(fd, "rb") as file:
        now = os.fstat(file.fileno())
        if not stat.S_ISREG(now.st_mode):  # replaced between the two looks
            raise SettingsError(f"{name} is {_kind(now.st_mode)}, not a file: {expected}")
        data = file.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise SettingsError(
            f"{name} is larger than {max_bytes // (1 << 20)} MiB ({now.st_size} bytes): {too_large}; {remedy}"
        )
    # A UTF-8 byte-order mark (what some editors put first) is not part of the first key; offsets
    # below count it, as they are offsets in the file.
    skip = len(_UTF8_BOM) if data.startswith(_UTF8_BOM) else 0
    for bom, encoding in _WIDE_BOMS.items():
        if data.startswith(bom):
            raise SettingsError(
                f"{name} is {encoding} text (byte-order mark {bom.hex(' ').upper()} at byte offset 0), "
                "not UTF-8: save it as UTF-8"
            )
    nul = data.find(b"\x00")
    if nul >= 0:
        raise SettingsError(
            f"{name} has a NUL byte at {_line_of(data, nul)}: it is UTF-16 text or binary, not UTF-8 text; "
            "save it as UTF-8"
        )
    try:
        return data[skip:].decode("utf-8")
    except UnicodeDecodeError as err:
        offset = skip + err.start
        raise SettingsError(
            f"{name} is not UTF-8 text: byte 0x{data[offset]:02X} at {_line_of(data, offset)} cannot be decoded "
            "(Latin-1 or another legacy encoding?); save it as UTF-8"
        ) from None


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines, read by python-dotenv as `source env.sh` would (`export`, quotes, #
    comments, the last of a key given twice; no `${VAR}` expansion). No file: {}."""
    from dotenv.parser import parse_stream  # what dotenv_values parses with, minus its warnings

    text = read_user_text(
        path,
        ENV_FILE_MAX_BYTES,
        "the settings are read from a regular file of KEY=VALUE lines (see env.sh.example)",
        f"move it away and copy env.sh.example to {path}",
        "it is not a settings file of KEY=VALUE lines",
    )
    if text is None:
        return {}
    bindings = list(parse_stream(io.StringIO(text)))
    # An assignment python-dotenv cannot parse (an unclosed quote) would drop its setting silently
    # (KMS_KEY, SERVICE_ACCOUNT; a PROJECT_ID, and the run goes local); `source env.sh` fails on it.
    # Other lines it cannot parse (not assignments) are ignored, as `source` runs past a bad command.
    for b in bindings:
        if b.error and re.match(r"\s*(export\s+)?[A-Za-z_][A-Za-z0-9_]*\s*=", b.original.string):
            raise SettingsError(
                f"{path} line {b.original.line}: {b.original.string.strip()!r} cannot be read as KEY=VALUE "
                "(an unclosed quote?); fix it as `source env.sh` would need"
            )
    return {b.key: b.value or "" for b in bindings if b.key and re.fullmatch(r"[A-Z_][A-Z0-9_]*", b.key)}


def load(
    environ: Mapping[str, str], env_file: Path = Path("env.sh"), required: tuple[str, ...] | None = None
) -> Settings:
    """Settings from the environment over env.sh; raises SettingsError naming every problem."""
    values = {**read_env_file(env_file), **{k: v for k, v in environ.items() if k in SETTINGS and v}}
    need = REQUIRED if required is None else required
    problems = [f"{key} is not set: {SETTINGS[key]}" for key in need if not values.get(key)]
    # google-auth opens GOOGLE_APPLICATION_CREDENTIALS as is: a missing file is its own one-line
    # DefaultCredentialsError, but a folder an IsADirectoryError traceback at the first client.
    key_file = environ.get("GOOGLE_APPLICATION_CREDENTIALS", "")
    if key_file and os.path.exists(key_file) and not os.path.isfile(key_file):
        problems.append(
            f"GOOGLE_APPLICATION_CREDENTIALS={key_file!r} is a folder or a device, not a key file: point it "
            "at a service account key's JSON file, or unset it to use `gcloud auth application-default login`"
        )

    def check(key: str, pattern: re.Pattern[str]) -> re.Match[str] | None:
        value = values.get(key, "")
        match = pattern.match(value) if value else None
        if value and not match:
            problems.append(f"{key}={value!r} is not valid: expected {SETTINGS[key]}")
        return match

    check("PROJECT_ID", _PROJECT)
    if check("REGION", _REGION) and (problem := region_problem(values["REGION"])):
        problems.append(problem)
    if check("PIPELINE_ROOT", _BUCKET_URI) and dot_folders(values["PIPELINE_ROOT"]):
        problems.append(
            f"PIPELINE_ROOT={values['PIPELINE_ROOT']!r} is not valid: an empty, . or .. folder in its path "
            "would put the run's files elsewhere than their gs:// URIs say"
        )
    # The Vertex Experiment is a metadata context named so (aiplatform_v1 CreateContextRequest.context_id:
    # "4-128 characters", "/[a-z][0-9]-/"); a bad name failed inside PipelineJob.submit, after the uploads.
    check("EXPERIMENT", _EXPERIMENT)
    build_region = values.get("BUILD_REGION", "")
    if build_region and build_region not in CLOUD_BUILD_REGIONS:
        problems.append(
            f"BUILD_REGION={build_region!r} is not a Cloud Build location: global or one of "
            f"{', '.join(CLOUD_BUILD_REGIONS[1:])} (https://cloud.google.com/build/docs/locations)"
        )
    # The forms of the pipeline parameters they fill: one home, pipeline/options/jobs.py.
    check("SERVICE_ACCOUNT", job_rules.SERVICE_ACCOUNT)
    check("NETWORK", job_rules.NETWORK)
    check("API_ENDPOINT", _ENDPOINT)
    region = values.get("REGION", "")
    for key, pattern in (("ARTIFACT_REPOSITORY", _DOCKER_REPO), ("TEMPLATE_REPOSITORY", _KFP_REPO)):
        match = check(key, pattern)
        if match and region and match.group(1) not in (region, region.split("-")[0], "global"):
            problems.append(f"{key}={values[key]!r} is in {match.group(1)}, not in REGION {region}")
    kms_key = values.get("KMS_KEY", "")
    if kms_key and (problem := job_rules.kms_key_problem(kms_key, region)):
        problems.append(f"KMS_KEY={kms_key!r} is not valid: {problem}")
    resource_id = values.get("PERSISTENT_RESOURCE_ID", "")
    if resource_id and (problem := persistent_resource_id_problem(resource_id)):
        problems.append(f"PERSISTENT_RESOURCE_ID={resource_id!r} is not valid: {problem}")
    labels: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in values.get("LABELS", "").split(","))):
        key, _, value = item.partition("=")
        problems += [
            f"LABELS item {item!r} is not valid: {p}" for p in job_rules.label_problems({key: value})
        ]
        labels[key] = value
    caching = values.get("ENABLE_CACHING", "").lower()
    if caching == "true":
        # aiplatform's PipelineJob(enable_caching=True) rewrites every task's cachingOptions
        # (pipeline_jobs._set_enable_caching_value), the registry lookups included.
        problems.append(
            "ENABLE_CACHING='true' is not allowed: it would cache every step, the Model Registry lookups "
            "included (stale answers); leave it unset (each step's compiled option) or set false"
        )
    elif caching not in ("", "false"):
        problems.append(f"ENABLE_CACHING={caching!r} is not valid: expected false, or unset")
    preflight = values.get("PREFLIGHT_VALIDATIONS", "").lower()
    if preflight not in ("", "true", "false"):
        problems.append(
            f"PREFLIGHT_VALIDATIONS={preflight!r} is not valid: expected true, false, or unset (true)"
        )
    if problems:
        raise SettingsError("\n".join(problems))
    # Each text field is the setting of its name (REGION: region), as given.
    texts = {f.name: values.get(f.name.upper(), "") for f in dataclasses.fields(Settings) if f.type == "str"}
    texts.update(project=values.get("PROJECT_ID", ""), pipeline_root=texts["pipeline_root"].rstrip("/"))
    return Settings(
        **texts,
        labels=labels,
        enable_caching=False if caching == "false" else None,
        preflight_validations=preflight != "false",
    )


def example() -> str:
    """The text of env.sh.example."""
    lines = [
        "# Google Cloud settings for `make run` (Vertex target), `make schedule` and `make e2e`.",
        "# Copy to env.sh (git-ignored) and fill in; the environment overrides this file.",
        "# With no PROJECT_ID, `make run` runs the pipeline locally instead.",
        "# Keep it a plain UTF-8 text file (Latin-1 or UTF-16 is refused, naming the line).",
        "",
    ]
    samples = {  # the others are empty
        "PROJECT_ID": "my-project",
        "REGION": "us-central1",
        "PIPELINE_ROOT": "gs://my-project-pipelines/root",
        "SERVICE_ACCOUNT": "pipelines@my-project.iam.gserviceaccount.com",
        "ARTIFACT_REPOSITORY": "us-central1-docker.pkg.dev/my-project/training",
        "TEMPLATE_REPOSITORY": "https://us-central1-kfp.pkg.dev/my-project/pipelines",
        "LABELS": "team=ml,env=dev",
    }
    for key, help_ in SETTINGS.items():
        lines.append(f"# {help_}{' (required)' if key in REQUIRED else ''}")
        lines.append(f"export {key}={samples.get(key, '')}")
        lines.append("")
    return "\n".join(lines)
