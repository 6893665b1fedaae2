"""The machines' and the jobs' parameters and rules: worker pools and GPUs, scheduling, timeout,
service account, network, CMEK, TensorBoard, labels, the image build's settings.

Google's rules and their sources are `RULES`, below (docs/options.md#the-rules shows them);
scheduling_strategy's values are its row's choices (`SCHEDULING_STRATEGIES`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from components import hardware, image, registry, worker_pools
from components.hardware import V100
from pipeline.options.common import Parameter as _p
from pipeline.options.common import Problem, duration_seconds, whole

# aiplatform_v1 `Scheduling.Strategy`, less the deprecated ON_DEMAND and LOW_COST. The GCPC
# launcher looks the name up in the enum, so `spot` would fail there with `KeyError: 'spot'`,
# after the image build and the dataset job (docs/facts.md, fact 28).
SCHEDULING_STRATEGIES = ("STANDARD", "SPOT", "FLEX_START")
PARAMETERS: tuple[_p, ...] = (
    _p(
        "build_location",
        str,
        "",
        "Cloud Build region of the image build ('': the Vertex location; or global), the BUILD_REGION setting.",
        targets=("vertex",),
    ),
    _p(
        "build_machine_type",
        str,
        "E2_HIGHCPU_8",
        "Cloud Build worker of the image build (BuildOptions.MachineType; UNSPECIFIED: the default "
        "worker; not sent with build_worker_pool, whose workers are the pool's).",
        targets=("vertex",),
    ),
    _p(
        "build_service_account",
        str,
        "",
        "Service account the image build runs as, an e-mail or projects/P/serviceAccounts/EMAIL "
        "('': Cloud Build's default; logs then go to Cloud Logging only).",
        targets=("vertex",),
    ),
    _p(
        "build_worker_pool",
        str,
        "",
        "Cloud Build private pool of the image build, projects/P/locations/REGION/workerPools/POOL "
        "('': the default pool); the build runs in the pool's region.",
        targets=("vertex",),
    ),
    _p("prepare_machine_type", str, "n1-standard-8", "CPU machine of the preparation and evaluation jobs."),
    _p("chief_machine_type", str, "n1-standard-8", "Machine of the chief (pool 0, one replica)."),
    _p("chief_accelerator_type", str, V100, "GPU of the chief ('' for none).", ""),
    _p("chief_accelerator_count", int, 1, "GPUs of the chief.", 0),
    _p("worker_count", int, 1, "Workers in pool 1 (0: the chief trains alone)."),
    _p("worker_machine_type", str, "n1-standard-8", "Machine of each worker."),
    _p("worker_accelerator_type", str, V100, "GPU of each worker ('' for none).", ""),
    _p("worker_accelerator_count", int, 1, "GPUs of each worker.", 0),
    _p(
        "boot_disk_type",
        str,
        "pd-ssd",
        "Boot disk type of every replica: pd-ssd, pd-standard or hyperdisk-balanced.",
    ),
    _p("boot_disk_size_gb", int, 100, "Boot disk size of every replica."),
    _p("reduction_server_count", int, 0, "Reduction Server replicas (pool 2; 0: none)."),
    _p("reduction_server_machine_type", str, "n1-highcpu-16", "Machine of each Reduction Server replica."),
    _p(
        "check_gpu_region",
        bool,
        True,
        "Refuse a GPU the region table does not list for the region (false: warn and proceed).",
    ),
    _p("timeout", str, "86400s", "Longest run of each job.", "1800s"),
    _p(
        "restart_job_on_worker_restart",
        bool,
        True,
        "Restart the whole job when a replica restarts (resumes from backup).",
    ),
    _p(
        "scheduling_strategy",
        str,
        "STANDARD",
        "STANDARD, SPOT or FLEX_START.",
        choices=SCHEDULING_STRATEGIES,
    ),
    _p("service_account", str, "", "Service account the jobs run as ('' : Vertex's default)."),
    _p("network", str, "", "VPC network to peer, projects/<number>/global/networks/<name>."),
    _p("encryption_spec_key_name", str, "", "CMEK key of the jobs and the model."),
    _p("tensorboard", str, "", "Vertex TensorBoard resource for the training job."),
    _p("labels", dict, {}, "Labels of the jobs and the model version."),
)

# This capability's rows of docs/options.md#the-rules (`make docs`): parameters | rule | source.
RULES = """
| hardware (`chief_*`, `worker_*`, `boot_disk_*`, `reduction_server_*`, `prepare_machine_type`) | the GPU tables of docs/vertex.md#gpus-for-training-what-google-allows-and-what-this-project-checks, per pool; K80 and GB200 refused; `check_gpu_region=false` makes the region table a warning | docs/vertex.md#gpus-for-training-what-google-allows-and-what-this-project-checks |
| `scheduling_strategy=FLEX_START` | L4, A100, A100 80GB, H100, H100 Mega, H200 or B200 GPUs in every pool; the same machine configuration in every pool (so no Reduction Server pool); `timeout` at most 7 days | "Schedule training jobs based on resource availability", https://cloud.google.com/vertex-ai/docs/training/schedule-jobs-dws |
| `timeout` | a protobuf Duration in seconds, `86400s`; each job's, and each tuning trial's (`trial_job_spec.scheduling.timeout`) | aiplatform_v1 `Scheduling.timeout` |
| `service_account`, `network` | a service account e-mail; `projects/<number>/global/networks/<name>` | aiplatform_v1 `CustomJobSpec` |
| `tensorboard`, `service_account` | `projects/<p>/locations/<region>/tensorboards/<id>` in the job's region, and only with a service account | aiplatform `jobs.py` ("service_account is required with provided tensorboard"); "Use Vertex AI TensorBoard with custom training" ("the TensorBoard instance must be in the same region as the training job") |
| `encryption_spec_key_name` | `projects/<p>/locations/<region>/keyRings/<r>/cryptoKeys/<k>`, in the job's region exactly: `global` and multi-region keys are refused too (`kms_key_problem`, which the `KMS_KEY` setting also goes by) | aiplatform_v1 `EncryptionSpec.kms_key_name` ("The Cloud KMS key must be in the same region as the resource"); "Customer-managed encryption keys (CMEK)" (Vertex AI docs) |
| `labels` | keys 1-63 lowercase letters (international too), digits, `_`, `-`, starting with a letter; values 1-63 of the same (GCPC's launchers drop an empty one); at most 59, none named `pipeline_run`, `source_commit`, `gate` or `dataset` (the run adds those four to the model version, and GCPC its billing label) | aiplatform_v1 `CustomJob.labels`, Google Cloud "Labels" |
| `build_location` (the `BUILD_REGION` setting) | `''` (the Vertex region), `global` or a Cloud Build region; when a project restricted to six regions is refused, an unset `BUILD_REGION` retries once in the restricted region of the same continent (`components.image.restricted_build_fallback` says which), saying so in one line; a chosen one fails naming `BUILD_REGION`; a job region that is not a Cloud Build location (`us-east7`) needs `BUILD_REGION` | "Cloud Build locations", https://cloud.google.com/build/docs/locations |
| `build_machine_type`, `build_service_account`, `build_worker_pool` (Vertex) | the build's worker: a name of Cloud Build's `BuildOptions.MachineType` (default `E2_HIGHCPU_8`; `UNSPECIFIED`: Cloud Build's default worker); the account it runs as: `''` (Cloud Build's default), an e-mail (taken as an account of `project`) or `projects/P/serviceAccounts/EMAIL`, and then its logs go to Cloud Logging only (`CLOUD_LOGGING_ONLY`); its private pool: `''` or `projects/P/locations/REGION/workerPools/POOL`, the build then runs in the pool's region (a different `build_location` is refused) and sends no machine type (the pool's workers are the pool's). Checked before any work (`components.image.build_settings`); roles: docs/vertex.md#3-cloud-builds-service-account | google-cloud-build `cloudbuild_v1` `BuildOptions`, `Build.service_account`; "Increase vCPU for builds", https://cloud.google.com/build/docs/optimize-builds/increase-vcpu-for-builds; "Configure user-specified service accounts", https://cloud.google.com/build/docs/securing-builds/configure-user-specified-service-accounts; "Run builds in a private pool", https://cloud.google.com/build/docs/private-pools/run-builds-in-private-pool |
"""


FLEX_START_GPUS = (
    "NVIDIA_L4",
    "NVIDIA_TESLA_A100",
    "NVIDIA_A100_80GB",
    "NVIDIA_H100_80GB",
    "NVIDIA_H100_MEGA_80GB",
    "NVIDIA_H200_141GB",
    "NVIDIA_B200",
)


FLEX_START_MAX_SECONDS = 7 * 24 * 3600


# The model version also gets pipeline_run and source_commit (components.registry.upload_settings),
# gate and dataset (the gate's decision, the dataset's fingerprint: components.evaluation.evaluate_model),
# and every GCPC launcher adds Vertex's system label vertex-ai-pipelines-run-billing-id (GCPC's
# VERTEX_AI_PIPELINES_RUN_LABELS, merged into each job's and model's labels). The run's own keys
# are refused as the user's: they would be overwritten without a word.
RUN_LABELS = ("pipeline_run", "source_commit", "gate", "dataset")


MAX_LABELS = 64 - len(RUN_LABELS) - 1


SERVICE_ACCOUNT = re.compile(
    r"^([a-z][a-z0-9-]{4,28}[a-z0-9]@[a-z][a-z0-9-]{4,28}[a-z0-9]\.iam\.gserviceaccount\.com"
    r"|[0-9]+-compute@developer\.gserviceaccount\.com|[a-z][a-z0-9-]{4,28}[a-z0-9]@appspot\.gserviceaccount\.com)$"
)


NETWORK = re.compile(r"^projects/[0-9]+/global/networks/[a-z]([a-z0-9-]{0,61}[a-z0-9])?$")


KMS_KEY = re.compile(r"^projects/[^/]+/locations/([^/]+)/keyRings/[^/]+/cryptoKeys/[^/]+$")


TENSORBOARD = re.compile(r"^projects/[^/]+/locations/([^/]+)/tensorboards/[0-9]+$")


# Vertex documents no minimum for `Scheduling.timeout` ("The maximum job running time"), but a
# job cannot work in less: its replicas import TensorFlow (about 6 s on a small machine) and read
# the dataset before the first step, after a Vertex replica's VM and image pull.
MIN_TIMEOUT_SECONDS = 60


def kms_key_problem(key: str, region: str) -> str:
    """What is wrong with `key` as the CMEK key of Vertex AI resources in `region` ("": nothing;
    `region` "": the form only), for `encryption_spec_key_name` and the KMS_KEY setting.

    Vertex: "The Cloud KMS key must be in the same region as the resource. It must have the format
    projects/{project}/locations/{location}/keyRings/{key_ring}/cryptoKeys/{crypto_key}"
    (`EncryptionSpec`, https://cloud.google.com/vertex-ai/docs/reference/rest/v1/EncryptionSpec;
    https://cloud.google.com/vertex-ai/docs/general/cmek). A key ring's location may also be
    `global` or a multi-region such as `us`, `europe` or `asia`
    (https://cloud.google.com/kms/docs/locations): neither is the resource's region, so neither
    is accepted, even over a region inside it (a `us` key for us-central1)."""
    form = f"projects/<project>/locations/{region or '<region>'}/keyRings/<ring>/cryptoKeys/<key>"
    match = KMS_KEY.match(key)
    if not match:
        return f"must be {form}, got {key!r}"
    location = match.group(1)
    if not region or location == region:
        return ""
    kind = " (a global key)" if location == "global" else "" if "-" in location else " (a multi-region)"
    return (
        f"the key is in {location}{kind}; Vertex AI needs a CMEK key in the region of its resources, "
        f"{region}: {form} (global and multi-region keys are refused)"
    )


def label_problems(labels: Any) -> list[str]:
    """Why `labels` cannot label a Vertex resource (module docstring), one message per problem."""
    if not isinstance(labels, Mapping):
        return [f"labels must be a mapping of label keys to values, got {labels!r}"]

    def ok(text: str) -> bool:  # what the upload step would keep as it is (upper- and titlecase not)
        return registry.label_value(text) == text

    out = []
    for key, value in labels.items():
        if not isinstance(key, str) or not isinstance(value, str):
            out.append(f"label {key!r}: keys and values must be strings, got {value!r}")
        elif not (1 <= len(key) <= 63 and key[0].isalpha() and ok(key)):
            out.append(
                f"label key {key!r} is not valid: 1 to 63 lowercase letters, digits, _ or -, starting "
                "with a lowercase letter"
            )
        elif not (1 <= len(value) <= 63 and ok(value)):
            # Vertex takes an empty value, but GCPC's launchers drop it from every request
            # (json_util.recursive_remove_empty keeps only truthy values): refused, not lost.
            out.append(
                f"label {key}={value!r}: values are 1 to 63 lowercase letters, digits, _ or - (an empty "
                "one would be dropped without a word by the pipeline's GCPC launchers)"
            )
    taken = sorted(set(labels) & set(RUN_LABELS))
    if taken:
        out.append(f"label keys {taken}: the run sets {', '.join(RUN_LABELS)} on the model version itself")
    if len(labels) > MAX_LABELS:
        out.append(
            f"{len(labels)} labels: at most {MAX_LABELS} (Vertex's 64, less the {64 - MAX_LABELS} the run adds: "
            f"{', '.join(RUN_LABELS)} and vertex-ai-pipelines-run-billing-id)"
        )
    return out


def build_pools(values: Mapping[str, Any], **options: Any) -> list[dict[str, Any]]:
    """`build_worker_pool_specs` on the hardware parameters in `values`, for a check (its
    ValueError propagates)."""
    given = {k: values[k] for k in worker_pools.HARDWARE_PARAMETERS if k in values}
    return worker_pools.build_worker_pool_specs("check", ["python"], [], **{**given, **options})


def pool_shape(m: Mapping[str, Any]) -> str:
    """`machine + N x GPU`, or the machine alone, of a built pool's `machine_spec`."""
    gpus = f" + {m['accelerator_count']} x {m['accelerator_type']}" if "accelerator_type" in m else ""
    return m["machine_type"] + gpus


def hardware_problems(values: Mapping[str, Any], region: str, warnings: list[str]) -> list[Problem]:
    problems = []
    try:
        build_pools(values, region=region, warnings=warnings)
    except ValueError as err:
        for line in str(err).splitlines():
            name, _, message = line.partition(": ")
            problems.append(Problem((name,), message))
    try:
        hardware.validate_machine(str(values.get("prepare_machine_type", "")), "", 0)
    except ValueError as err:
        problems.append(Problem(("prepare_machine_type",), str(err)))
    return problems


def flex_start_problems(v: Mapping[str, Any]) -> list[Problem]:
    doc = "(Dynamic Workload Scheduler; https://cloud.google.com/vertex-ai/docs/training/schedule-jobs-dws)"
    problems = []

    def bad(message: str, *names: str) -> None:
        problems.append(Problem(("scheduling_strategy", *names), message))

    try:  # the chief's and the workers' pools as they will be built (no region: hardware_problems')
        pools = [s["machine_spec"] for s in build_pools(v, reduction_server_count=0)]
    except ValueError:  # hardware_problems names what is refused; these pools as given
        given = {k: v[k] for k in worker_pools.HARDWARE_PARAMETERS if k.startswith(("chief_", "worker_"))}
        if not (whole(given["worker_count"]) and given["worker_count"] > 0):
            given["worker_count"] = 0  # a refused count builds no worker pool
        pools = [worker_pools.machine_spec(m, g, n) for _, m, g, n, _ in worker_pools.trainer_pools(**given)]
    for role, pool in zip(("chief", "worker"), pools, strict=False):
        gpu = pool.get("accelerator_type", "")
        if gpu not in FLEX_START_GPUS:
            bad(
                f"FLEX_START needs L4, A100, H100, H200 or B200 GPUs {doc}; the {role} pool has "
                f"{gpu or 'no GPU'}. Allowed: {', '.join(FLEX_START_GPUS)}; or use STANDARD or SPOT",
                f"{role}_accelerator_type",
            )
    if len(pools) == 2 and pools[0] != pools[1]:
        bad(
            f"FLEX_START needs the same machine configuration in every worker pool {doc}; the chief "
            f"has {pool_shape(pools[0])}, the workers {pool_shape(pools[1])}",
            "worker_machine_type",
        )
    if v["reduction_server_count"]:
        bad(
            "FLEX_START needs the same machine configuration in every worker pool, and a Reduction "
            f"Server pool runs on other (CPU) machines {doc}: set reduction_server_count 0",
            "reduction_server_count",
        )
    seconds = duration_seconds(v["timeout"])
    if seconds is not None and seconds > FLEX_START_MAX_SECONDS:
        bad(
            f"FLEX_START needs a timeout of at most 7 days ({FLEX_START_MAX_SECONDS}s) {doc}, got "
            f"{v['timeout']}",
            "timeout",
        )
    return problems


def job_settings_problems(v: Mapping[str, Any], region: str) -> list[Problem]:
    problems = []

    def bad(message: str, *names: str) -> None:
        problems.append(Problem(names, message))

    build = v.get("build_location", "")
    if build and build not in image.CLOUD_BUILD_REGIONS:
        bad(
            f"{build!r} is not a Cloud Build location (https://cloud.google.com/build/docs/locations): "
            f"'' (the job's region), global, or one of {', '.join(image.CLOUD_BUILD_REGIONS[1:])}",
            "build_location",
        )
    elif not build and not v.get("build_worker_pool") and region and region not in image.CLOUD_BUILD_REGIONS:
        bad(
            f"the image build would run in the job's region {region}, which is not a Cloud Build location "
            "(https://cloud.google.com/build/docs/locations, as this project's table has them): set "
            "BUILD_REGION (build_location) to global or a Cloud Build region",
            "build_location",
        )
    names = ("build_machine_type", "build_service_account", "build_worker_pool")
    try:  # the Vertex target's alone
        if names[0] in v:
            image.build_settings(v["project"], region, build, *(v[n] for n in names))
    except ValueError as err:  # it names the parameters it is about
        bad(str(err), *(n for n in (*names, "build_location") if n in str(err)))
    seconds = duration_seconds(v["timeout"])
    if seconds is None or seconds <= 0:
        bad(
            f"must be a duration in seconds like '86400s' (protobuf Duration), got {v['timeout']!r}",
            "timeout",
        )
    elif seconds < MIN_TIMEOUT_SECONDS:
        bad(
            f"{v['timeout']} is shorter than any job can run (replicas start, import TensorFlow and "
            f"read the data first): give at least '{MIN_TIMEOUT_SECONDS}s'",
            "timeout",
        )
    account = v["service_account"]
    if account and not SERVICE_ACCOUNT.match(account):
        bad(
            f"{account!r} is not a service account e-mail (<name>@<project>.iam.gserviceaccount.com)",
            "service_account",
        )
    if v["network"] and not NETWORK.match(v["network"]):
        bad(f"must be projects/<project number>/global/networks/<name>, got {v['network']!r}", "network")
    key = v["encryption_spec_key_name"]
    if key and (problem := kms_key_problem(key, region)):
        bad(problem, "encryption_spec_key_name")
    board = v["tensorboard"]
    if board:
        match = TENSORBOARD.match(board)
        if not match:
            bad(f"must be projects/<p>/locations/<region>/tensorboards/<id>, got {board!r}", "tensorboard")
        elif region and match.group(1) != region:
            bad(
                f"the TensorBoard is in {match.group(1)}; it must be in the job's region {region}",
                "tensorboard",
            )
        if not account:
            bad(
                'a TensorBoard needs a service account (aiplatform: "service_account is required '
                'with provided tensorboard"): set service_account (or SERVICE_ACCOUNT), with '
                "roles/storage.admin and roles/aiplatform.user "
                "(docs/vertex.md#the-iam-roles-a-first-run-needs)",
                "tensorboard",
                "service_account",
            )
    for message in label_problems(v["labels"]):
        bad(message, "labels")
    return problems
