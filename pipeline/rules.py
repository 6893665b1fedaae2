"""Every pipeline parameter's allowed values and every rule between parameters, for both targets,
in one place.

`check(values, target, region="")` applies them all, before any request and before any local work:
`make run` on both targets and `make schedule` call it (`launch.cli`, `launch.submit`). It reports
every bad parameter at once (`OptionsError`, one line per problem, each starting with the
parameter's name and saying what is allowed) and returns warnings. The local target adds its own
rules (this machine's GPUs and processes, its serving environments, a TFDS source it can prepare,
a registry folder it can write: `_local_problems`). The parameters themselves (names, types,
defaults) are `pipeline.parameters.PARAMETERS`. The steps that run on Vertex apply the same rules
where they can (`worker_pools` calls `hardware.validate_machine`); the trainer's own flags are
checked by the trainer's own parsers, through `python -m trainer.flagcheck`, on the very command
lines the steps build (`trainer_commands`, `trainer_flag_problems`). `notification_emails`, which
picks the template before its defaults are read, has its rule here too
(`check_notification_emails`, called by `launch.submit`).

Google's rules, each with its source:
- scheduling_strategy is aiplatform_v1 `Scheduling.Strategy`: STANDARD, SPOT or FLEX_START (the
  deprecated ON_DEMAND and LOW_COST left out). The GCPC launcher looks the name up in the enum, so
  `spot` fails there with `KeyError: 'spot'`, after the image build and the dataset job.
- FLEX_START (Dynamic Workload Scheduler) needs L4, A100, H100, H200 or B200 GPUs, a timeout of
  at most 7 days and "the same machine configuration for all worker pools" ("Schedule training
  jobs based on resource availability", https://cloud.google.com/vertex-ai/docs/training/schedule-jobs-dws):
  a Reduction Server pool (CPU machines) breaks the last rule.
- GRID_SEARCH needs every study parameter INTEGER, CATEGORICAL or DISCRETE (aiplatform_v1
  `StudySpec.Algorithm.GRID_SEARCH`: "Simple grid search within the feasible space. To use grid
  search, all parameters must be INTEGER, CATEGORICAL, or DISCRETE."): the declared
  `search_space`'s.
- search_space (checked when `tune` is true, the only time it is used): a list of
  `StudySpec.ParameterSpec` that parses strictly (`tuning.parse_search_space`); a parameter_id is
  "unique amongst all ParameterSpecs"; UNIT_LOG_SCALE and UNIT_REVERSE_LOG_SCALE need "the entire
  feasible space ... strictly positive"; scale_type is left "unset for CATEGORICAL parameters";
  DISCRETE values are "in increasing order and at least 1e-10 apart", at most 1,000 (aiplatform_v1
  `types/study.py`, `ParameterSpec`). This pipeline's own rules: every id is a trainer flag a
  tuning job may set (`tuning.TUNABLE_FLAGS`), every range has min < max, no conditional
  parameter specs, and every value a trial may get is accepted by the trainer's own parser.
- A TensorBoard needs a service account: aiplatform's `CustomJob.run` raises "service_account is
  required with provided tensorboard" (google/cloud/aiplatform/jobs.py), and "the TensorBoard
  instance must be in the same region as the training job" (Vertex AI docs, "Use Vertex AI
  TensorBoard with custom training").
- A CMEK key must be in the job's region, exactly: aiplatform_v1 `EncryptionSpec.kms_key_name`, "The
  Cloud KMS key must be in the same region as the resource" (REST reference `EncryptionSpec`, and
  the "Customer-managed encryption keys (CMEK)" guide). Cloud KMS's `global` and multi-region
  locations (`us`, `europe`, `asia`) are not regions, so their keys are refused too
  (`kms_key_problem`, the one rule the KMS_KEY setting also goes by).
- Labels: keys and values at most 63 characters of lowercase letters (international ones
  included), digits, `_` and `-`, keys starting with a lowercase letter, at most 64 labels on a
  resource (Google Cloud "Labels" doc; aiplatform_v1 `CustomJob.labels`). Three are added to the
  model version (pipeline_run, source_commit, and GCPC's vertex-ai-pipelines-run-billing-id).
- persistent_resource_id: a persistent resource's ID (aiplatform_v1
  `CreatePersistentResourceRequest.persistent_resource_id`), with STANDARD scheduling (this
  pipeline's rule); the resource itself, read when the run is submitted, must be RUNNING, on the
  run's network, CMEK key and service account, with a pool for each job's machines
  (`persistent_resource_fit`, called by `launch.submit`; docs/persistent-resource.md).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pipeline.step as step
from components import evaluation, hardware, image, plan, prepare, registry, tuning, worker_pools
from local import ROOT

SCHEDULING_STRATEGIES = ("STANDARD", "SPOT", "FLEX_START")
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
# gate and dataset (the gate's decision and the dataset fingerprint:
# components.evaluation.evaluate_model), and every GCPC launcher adds Vertex's system label
# vertex-ai-pipelines-run-billing-id (GCPC's VERTEX_AI_PIPELINES_RUN_LABELS, merged into each
# job's and model's labels). The run's own keys are refused as the user's: they would be
# overwritten without a word.
RUN_LABELS = ("pipeline_run", "source_commit", "gate", "dataset")
MAX_LABELS = 64 - len(RUN_LABELS) - 1
SERVICE_ACCOUNT = re.compile(
    r"^([a-z][a-z0-9-]{4,28}[a-z0-9]@[a-z][a-z0-9-]{4,28}[a-z0-9]\.iam\.gserviceaccount\.com"
    r"|[0-9]+-compute@developer\.gserviceaccount\.com)$"
)
NETWORK = re.compile(r"^projects/[0-9]+/global/networks/[a-z]([a-z0-9-]{0,61}[a-z0-9])?$")
KMS_KEY = re.compile(r"^projects/[^/]+/locations/([^/]+)/keyRings/[^/]+/cryptoKeys/[^/]+$")
TENSORBOARD = re.compile(r"^projects/[^/]+/locations/([^/]+)/tensorboards/[0-9]+$")
# A Cloud Storage folder (bucket names: 3 to 63 characters of lowercase letters, digits, - _ .).
MODEL_ROOT = re.compile(r"^gs://[a-z0-9][a-z0-9._-]{1,61}[a-z0-9](/[^\s#?*\[\]]*)?$")
DURATION = re.compile(r"^([0-9]{1,12})(\.[0-9]{1,9})?s$")
# The shortest job timeout accepted. Vertex documents no minimum for `Scheduling.timeout` ("The
# maximum job running time"), but a job cannot do any work in less: its replicas import
# TensorFlow (about 6 s on a small machine) and read the dataset before the first step, and a
# Vertex replica's VM and image pull come first. A shorter timeout only buys a failed job.
MIN_TIMEOUT_SECONDS = 60
# The first bytes of an HDF5 file (the HDF5 format specification, "Format Signature"): the one
# weights-file format `--weights PATH` loads (tf_keras `load_weights` of a single local file).
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


@dataclasses.dataclass(frozen=True)
class Problem:
    parameters: tuple[str, ...]
    message: str

    def __str__(self) -> str:
        return f"{', '.join(self.parameters)}: {self.message}"


class OptionsError(ValueError):
    """Every bad parameter, one per line, each line starting with the parameter's name."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("\n".join(map(str, problems)))

    @property
    def parameters(self) -> set[str]:
        return {name for p in self.problems for name in p.parameters}


def kms_key_problem(key: str, region: str) -> str:
    """What is wrong with `key` as the CMEK key of Vertex AI resources in `region` ("" when
    nothing is; `region` "" checks the form only). The one rule for both ways a key comes in: the
    pipeline parameter `encryption_spec_key_name` (`check`) and the KMS_KEY setting
    (`launch.settings.load`), so both give the same verdict in the same words.

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
    kind = ""
    if location == "global":
        kind = " (a global key)"
    elif "-" not in location:
        kind = " (a multi-region)"
    return (
        f"the key is in {location}{kind}; Vertex AI needs a CMEK key in the region of its resources, "
        f"{region}: {form} (global and multi-region keys are refused)"
    )


def duration_seconds(text: Any) -> float | None:
    """A Vertex duration ("3600s", "1.5s": protobuf Duration's JSON form) in seconds, or None."""
    match = DURATION.match(str(text).strip()) if isinstance(text, str) else None
    return float(match.group(1) + (match.group(2) or "")) if match else None


def label_problems(labels: Any, name: str = "labels") -> list[str]:
    """Why `labels` cannot label a Vertex resource (module docstring), one message per problem."""
    if not isinstance(labels, Mapping):
        return [f"{name} must be a mapping of label keys to values, got {labels!r}"]

    def ok(text: str) -> bool:
        return all((c.isalpha() and not c.isupper()) or c.isdigit() or c in "_-" for c in text)

    out = []
    for key, value in labels.items():
        if not isinstance(key, str) or not isinstance(value, str):
            out.append(f"label {key!r}: keys and values must be strings, got {value!r}")
        elif not (1 <= len(key) <= 63 and key[0].isalpha() and not key[0].isupper() and ok(key)):
            out.append(
                f"label key {key!r} is not valid: 1 to 63 lowercase letters, digits, _ or -, starting "
                "with a lowercase letter"
            )
        elif not (len(value) <= 63 and ok(value)):
            out.append(
                f"label {key}={value!r}: values are at most 63 lowercase letters, digits, _ or - (may be empty)"
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


# The inputs of `components.prepare.build_prepare_args` (its `trainer.prepare` flags), by the
# pipeline parameter the planning step hands each (`components.plan.plan_jobs`).
PREPARE_INPUTS = {
    "source": "dataset_source",
    "image_size": "image_size",
    "shards": "dataset_shards",
    "seed": "seed",
    "synthetic_per_class": "synthetic_per_class",
    "engine": "prepare_engine",
}


def trainer_commands(values: Mapping[str, Any]) -> dict[str, list[str]]:
    """The flags the run hands `trainer.task` and `trainer.prepare`, built by the very functions
    the planning step runs (`components.plan.build_trainer_args`,
    `components.prepare.build_prepare_args`), from the parameters `pipeline.dag` hands it
    (`dag.PLAN_PARAMETERS`). The folders are left out: the jobs get them from Vertex (flagcheck
    stands in for them), and so are the champion's class names, read at run time."""
    flags = {name: values[name] for name in plan.MODEL_FLAGS}
    task, _ = plan.build_trainer_args("/check/dataset", values["image_size"], flags, plan.TUNABLE)
    inputs = {arg: values[name] for arg, name in PREPARE_INPUTS.items() if name in values}
    try:
        prepare_argv = prepare.build_prepare_args(**inputs)
    except ValueError:
        # A source the step refuses (not tfds:, folder: or synthetic): the preparation's own
        # parser names it, so it is handed over as given, beside the other flags as built.
        stand_in = "tfds:stand-in"
        built = prepare.build_prepare_args(**{**inputs, "source": stand_in})
        prepare_argv = [f"--source={inputs['source']}" if a == f"--source={stand_in}" else a for a in built]
    return {
        "trainer.task": [a for a in task if not a.startswith("--data_dir=")],
        "trainer.prepare": prepare_argv,
    }


def trainer_check(module: str, request: Any, timeout: float | None = None) -> Any:
    """The JSON answer of `python -m <module>` (trainer.flagcheck or trainer.sourcecheck) to the
    JSON `request` on its stdin: a process, since the trainer is never imported by the pipeline's
    layers (no TensorFlow; ~0.1 s). The test suite answers in-process instead (tests/conftest.py),
    and one test per module goes through the process."""
    result = subprocess.run(
        [sys.executable, "-m", module],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise RuntimeError(f"python -m {module} failed: {result.stderr.strip()[-2000:]}")
    return json.loads(result.stdout)


def trainer_flag_problems(values: Mapping[str, Any]) -> list[Problem]:
    """The trainer's own parsers' verdict on the flags this run would hand its jobs, each problem
    named by the pipeline parameter behind the flag (`trainer_check`: trainer.flagcheck)."""
    to_parameter = PREPARE_INPUTS  # build_prepare_args's inputs are its flags' names
    problems = []
    for found in trainer_check("trainer.flagcheck", trainer_commands(values)):
        names = [
            flag if found["program"] == "trainer.task" else to_parameter.get(flag, flag)
            for flag in found["flags"]
        ]
        problems.append(
            Problem(tuple(names) or (found["program"],), f"{found['program']} says: {found['message']}")
        )
    return problems


def source_problems(values: Mapping[str, Any]) -> list[Problem]:
    """A local `folder:PATH` source judged by the preparation's own rules (`trainer_check`:
    trainer.sourcecheck, bounded to seconds), and the global batch
    against the training split it would prepare: a batch larger than the split cannot make one
    step. Other sources are checked by the preparation job (sourcecheck says so: nothing here)."""
    source = str(values.get("dataset_source", ""))
    if not source.startswith("folder:"):
        return []
    answer = trainer_check("trainer.sourcecheck", {"source": source}, timeout=120)
    problems = [Problem(("dataset_source",), f"trainer.prepare says: {p}") for p in answer["problems"]]
    counts = answer.get("counts") or {}
    train = (counts.get("prepared") or {}).get("train")
    replicas = 1 + (values["worker_count"] if _whole(values.get("worker_count")) else 0)
    batch = values.get("per_replica_batch_size")
    if (
        not problems
        and counts.get("complete")
        and isinstance(train, int)
        and isinstance(batch, int)
        and _whole(batch)
        and batch * replicas > train
    ):
        problems.append(
            Problem(
                ("per_replica_batch_size", "worker_count"),
                f"a global batch of {batch * replicas} ({batch} per replica x {replicas} replicas) is larger "
                f"than the {train} training images {source} gives: not one step could be made; give "
                f"per_replica_batch_size at most {max(1, train // replicas)}",
            )
        )
    return problems


def _hardware_problems(values: Mapping[str, Any], region: str, warnings: list[str]) -> list[Problem]:
    problems = []
    try:
        worker_pools.build_worker_pool_specs(
            image_uri="check",
            command=["python"],
            args=[],
            **{k: values[k] for k in worker_pools.HARDWARE_PARAMETERS if k in values},
            region=region,
            warnings=warnings,
        )
    except ValueError as err:
        for line in str(err).splitlines():
            name, _, message = line.partition(": ")
            problems.append(Problem((name,), message))
    try:
        hardware.validate_machine(str(values.get("prepare_machine_type", "")), "", 0)
    except ValueError as err:
        problems.append(Problem(("prepare_machine_type",), str(err)))
    return problems


def _flex_start_problems(v: Mapping[str, Any]) -> list[Problem]:
    doc = "(Dynamic Workload Scheduler; https://cloud.google.com/vertex-ai/docs/training/schedule-jobs-dws)"
    problems = []
    pools = [("chief", v["chief_machine_type"], v["chief_accelerator_type"], v["chief_accelerator_count"])]
    if v["worker_count"]:
        worker = (
            v["worker_machine_type"] or v["chief_machine_type"],
            v["worker_accelerator_type"] or v["chief_accelerator_type"],
            v["worker_accelerator_count"] or v["chief_accelerator_count"],
        )
        pools.append(("worker", *worker))
    for role, _, gpu, _ in pools:
        if gpu not in FLEX_START_GPUS:
            problems.append(
                Problem(
                    ("scheduling_strategy", f"{role}_accelerator_type"),
                    f"FLEX_START needs L4, A100, H100, H200 or B200 GPUs {doc}; the {role} pool has "
                    f"{gpu or 'no GPU'}. Allowed: {', '.join(FLEX_START_GPUS)}; or use STANDARD or SPOT",
                )
            )
    if len(pools) == 2 and pools[0][1:] != pools[1][1:]:
        problems.append(
            Problem(
                ("scheduling_strategy", "worker_machine_type"),
                f"FLEX_START needs the same machine configuration in every worker pool {doc}; the chief "
                f"has {pools[0][1]} + {pools[0][3]} x {pools[0][2]}, the workers {pools[1][1]} + "
                f"{pools[1][3]} x {pools[1][2]}",
            )
        )
    if v["reduction_server_count"]:
        problems.append(
            Problem(
                ("scheduling_strategy", "reduction_server_count"),
                "FLEX_START needs the same machine configuration in every worker pool, and a Reduction "
                f"Server pool runs on other (CPU) machines {doc}: set reduction_server_count 0",
            )
        )
    seconds = duration_seconds(v["timeout"])
    if seconds is not None and seconds > FLEX_START_MAX_SECONDS:
        problems.append(
            Problem(
                ("scheduling_strategy", "timeout"),
                f"FLEX_START needs a timeout of at most 7 days ({FLEX_START_MAX_SECONDS}s) {doc}, got "
                f"{v['timeout']}",
            )
        )
    return problems


# --- the persistent resource (persistent_resource_id, Vertex) ----------------------------------

# A persistent resource's ID: "The maximum length is 63 characters, and valid characters are
# /^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$/" (aiplatform_v1 `CreatePersistentResourceRequest
# .persistent_resource_id`, types/persistent_resource_service.py). A job names the resource by
# this ID alone, "in the same Project and Location" (`CustomJobSpec.persistent_resource_id`).
PERSISTENT_RESOURCE_ID = re.compile(r"^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$")
# The jobs that run on it: every CustomTrainingJobOp of the DAG (`pipeline.backends._vertex_custom_job`).
# Not the tuning trials: GCPC 2.22's HyperparameterTuningJobRunOp has no persistent_resource_id
# input (v1/hyperparameter_tuning_job/component.py), so they run on machines started for them.
PERSISTENT_RESOURCE_JOBS = (step.PREPARE, step.TRAIN, step.EVALUATE)
PERSISTENT_RESOURCE_DOC = "docs/persistent-resource.md"


def persistent_resource_id_problem(resource_id: str) -> str:
    """What is wrong with `resource_id` as a persistent resource's ID ("" when nothing is): the
    one rule of the parameter `persistent_resource_id` (`check`) and of the PERSISTENT_RESOURCE_ID
    setting (`launch.settings.load`), so both say the same in the same words."""
    if PERSISTENT_RESOURCE_ID.match(resource_id):
        return ""
    hint = ""
    if "/persistentResources/" in resource_id:
        hint = (
            f"; give the ID alone ({resource_id.rstrip('/').rsplit('/', 1)[-1]!r}): the resource is the "
            "run's project and region's"
        )
    return (
        "must be a persistent resource's ID: 1 to 63 lowercase letters, digits and hyphens, starting "
        "with a letter and not ending with a hyphen (aiplatform_v1 "
        f"CreatePersistentResourceRequest.persistent_resource_id), got {resource_id!r}{hint}"
    )


def _persistent_resource_problems(v: Mapping[str, Any], warnings: list[str]) -> list[Problem]:
    """The offline rules of `persistent_resource_id`; what the resource itself holds (its state,
    network, CMEK key, service account and pools) is read and judged when the run is submitted
    (`persistent_resource_fit`, called by `launch.submit`)."""
    resource_id = v.get("persistent_resource_id", "")
    if not resource_id:
        return []
    problems = []
    if problem := persistent_resource_id_problem(str(resource_id)):
        problems.append(Problem(("persistent_resource_id",), problem))
    strategy = v["scheduling_strategy"]
    if strategy != "STANDARD":
        # This pipeline's rule: the strategy says how the machines started for a job are had
        # (Spot VMs, Dynamic Workload Scheduler's queue); a job on a persistent resource is
        # started on none, it runs on the resource's. Google documents no combination.
        problems.append(
            Problem(
                ("persistent_resource_id", "scheduling_strategy"),
                f"scheduling_strategy {strategy} says how the machines started for the training job are "
                "had, and a job on a persistent resource runs on the resource's own machines: use "
                f"STANDARD with a persistent resource, or leave persistent_resource_id empty ({PERSISTENT_RESOURCE_DOC})",
            )
        )
    if v["tune"]:
        warnings.append(
            "tune=true with persistent_resource_id: the tuning job's trials run on machines started for "
            "them, not on the persistent resource (GCPC 2.22's HyperparameterTuningJobRunOp has no "
            "persistent_resource_id input); the preparation, final training and evaluation jobs run on it"
        )
    if v.get("prepare_engine") == "beam":
        warnings.append(
            "prepare_engine=beam with persistent_resource_id: the preparation runs on Dataflow's workers, "
            "not on the persistent resource; the training and evaluation jobs run on it"
        )
    return problems


def _default_boot_disk(machine_type: str) -> str:
    """aiplatform_v1 `DiskSpec.boot_disk_type`: "For non-A3U machines, the default value is
    "pd-ssd", for A3U machines, the default value is "hyperdisk-balanced"" (a3-ultragpu-*)."""
    return "hyperdisk-balanced" if machine_type.startswith("a3-ultragpu") else "pd-ssd"


def _machine_key(machine_type: str, accelerator: str, count: int, disk: str) -> tuple[str, str, int, str]:
    """What a job's worker pool and a resource pool must share: machine type, GPU type and count,
    boot disk type (an unset disk type is the default one)."""
    gpu = accelerator if accelerator not in ("", "ACCELERATOR_TYPE_UNSPECIFIED") and count else ""
    return (machine_type, gpu, int(count) if gpu else 0, disk or _default_boot_disk(machine_type))


def _machines(key: tuple[str, str, int, str]) -> str:
    machine, gpu, count, disk = key
    return f"{machine}{f' + {count} x {gpu}' if gpu else ''} ({disk} boot disk)"


def persistent_resource_jobs(v: Mapping[str, Any], region: str = "") -> dict[str, list[dict[str, Any]]]:
    """The worker pools of each job that runs on the persistent resource (`PERSISTENT_RESOURCE_JOBS`),
    built as the planning step builds them (`components.plan.plan_jobs`: the same builder and
    hardware arguments; the image and flags, which a resource pool does not constrain, left out).
    The preparation and evaluation jobs are one CPU replica of `prepare_machine_type`; the
    training job the chief, the workers and the Reduction Server pool."""

    def build(**hardware: Any) -> list[dict[str, Any]]:
        specs: list[dict[str, Any]] = worker_pools.build_worker_pool_specs(
            image_uri="check", command=["python"], args=[], region=region, **hardware
        )
        return specs

    cpu = build(
        chief_machine_type=v["prepare_machine_type"],
        boot_disk_type=v["boot_disk_type"],
        boot_disk_size_gb=v["boot_disk_size_gb"],
    )
    training = build(**{k: v[k] for k in worker_pools.HARDWARE_PARAMETERS if k in v})
    return {step.PREPARE: cpu, step.TRAIN: training, step.EVALUATE: cpu}


def persistent_resource_fit(
    resource: Any, v: Mapping[str, Any], region: str = ""
) -> tuple[list[str], list[str]]:
    """Why the aiplatform_v1 `PersistentResource` `resource` (as `get_persistent_resource` returns
    it, from the run's project and region) cannot run this run's jobs, one message per problem,
    and warnings. `v` are the run's parameter values (every offline rule passed).

    - `state` RUNNING ("the persistent resource is healthy and fully usable"; PROVISIONING,
      UPDATING and REBOOTING are not usable yet, STOPPING and ERROR not at all: `PersistentResource.State`).
    - `network` and `encryption_spec.kms_key_name` the run's `network` and
      `encryption_spec_key_name`: "The network and CMEK configs on the job should be consistent
      with those on the PersistentResource, otherwise, the job will be rejected"
      (`CustomJobSpec.persistent_resource_id`; GCPC's CustomTrainingJobOp says the same).
    - Its service account rule: with `resource_runtime_spec.service_account_spec
      .enable_custom_service_account`, "custom user-managed service account is enforced to run
      any workloads (for example, Vertex Jobs) on the resource. Otherwise, uses the Vertex AI
      Custom Code Service Agent" (`ServiceAccountSpec`): the run's `service_account` must be set
      when the resource enforces one, and a run that has one needs a resource that takes it
      (else its jobs would run as another identity than the one docs/iam.md grants roles to).
    - Each job's worker pools: a resource pool whose `machine_spec` (machine type, GPU type and
      count) and boot disk type are the pool's, holding its replicas: "values for machine-type and
      disk-type matches exactly with a corresponding resource pool", and "a replica-count less than
      or equal to the replica-count or max-replica-count of the corresponding resource pool"
      ("Run training jobs on a persistent resource",
      https://cloud.google.com/vertex-ai/docs/training/persistent-resource-train). The pools of one
      job with the same machines are counted together (its replicas run at once); the jobs of a
      run one after another, so they share a pool. Replicas other jobs hold now
      (`used_replica_count`) are a warning: the job waits for them."""
    problems: list[str] = []
    warnings: list[str] = []
    state = resource.state.name
    if state == "PROVISIONING":
        problems.append("it is still being created (PROVISIONING): run again once it is RUNNING")
    elif state in ("UPDATING", "REBOOTING"):
        problems.append(f"it is {state}, not usable until it is RUNNING again: run again then")
    elif state == "STOPPING":
        problems.append("it is being deleted (STOPPING)")
    elif state == "ERROR":
        said = " ".join(str(resource.error.message).split())
        problems.append(f"it is in ERROR{f' ({said})' if said else ''}")
    elif state != "RUNNING":
        problems.append(f"it is {state}, not RUNNING")
    consistent = (
        '(aiplatform_v1 CustomJobSpec.persistent_resource_id: "The network and CMEK configs on the job '
        'should be consistent with those on the PersistentResource, otherwise, the job will be rejected")'
    )
    network, run_network = str(resource.network), str(v.get("network", ""))
    if network != run_network:
        problems.append(
            f"its network is {network or 'none (not peered)'} and the run's network (NETWORK) is "
            f"{run_network or 'none'}: they must be the same {consistent}"
        )
    key, run_key = str(resource.encryption_spec.kms_key_name), str(v.get("encryption_spec_key_name", ""))
    if key != run_key:
        problems.append(
            f"its CMEK key is {key or 'none'} and the run's encryption_spec_key_name (KMS_KEY) is "
            f"{run_key or 'none'}: they must be the same (aiplatform_v1 CustomJobSpec.persistent_resource_id: "
            "a job whose CMEK config is not the resource's is rejected)"
        )
    enforced = bool(resource.resource_runtime_spec.service_account_spec.enable_custom_service_account)
    account = str(v.get("service_account", ""))
    if enforced and not account:
        problems.append(
            "it runs workloads only as a custom service account (created with "
            "enable_custom_service_account) and the run gives none: set service_account (SERVICE_ACCOUNT)"
        )
    elif account and not enforced:
        problems.append(
            "it was created without enable_custom_service_account, so a job on it runs as the Vertex AI "
            f"Custom Code Service Agent, not as the run's service_account {account} (aiplatform_v1 "
            "ServiceAccountSpec): create it with --enable-custom-service-account, or run without "
            "service_account"
        )
    pools = []
    for index, pool in enumerate(resource.resource_pools):
        spec = pool.machine_spec
        pool_key = _machine_key(
            spec.machine_type,
            spec.accelerator_type.name,
            spec.accelerator_count,
            pool.disk_spec.boot_disk_type,
        )
        autoscaled = "max_replica_count" in pool.autoscaling_spec
        size = int(pool.autoscaling_spec.max_replica_count if autoscaled else pool.replica_count)
        pools.append((pool.id or f"#{index}", pool_key, size, int(pool.used_replica_count)))
    listing = "; ".join(f"{name}: {_machines(k)} x {size}" for name, k, size, _ in pools) or "none"
    needs: dict[tuple[str, str, int, str], tuple[int, list[str]]] = {}
    for job, specs in persistent_resource_jobs(v, region).items():
        counts: dict[tuple[str, str, int, str], int] = {}
        for s in specs:
            m = s["machine_spec"]
            k = _machine_key(
                m["machine_type"],
                m.get("accelerator_type", ""),
                m.get("accelerator_count", 0),
                s.get("disk_spec", {}).get("boot_disk_type", ""),
            )
            counts[k] = counts.get(k, 0) + int(s["replica_count"])
        for k, n in counts.items():
            most, jobs = needs.get(k, (0, []))
            needs[k] = (max(most, n), [*jobs, job])
    for k, (n, jobs) in needs.items():
        who = f"{' and '.join(jobs)} need{'s' if len(jobs) == 1 else ''} {n} at once"
        matching = sorted((p for p in pools if p[1] == k), key=lambda p: -p[2])
        if not matching:
            problems.append(f"it has no pool of {_machines(k)}, which {who} (its pools: {listing})")
            continue
        name, _, size, used = matching[0]
        if size < n:
            problems.append(f"its pool {name} of {_machines(k)} holds {size}, and {who}")
        elif size - used < n:
            warnings.append(
                f"persistent_resource_id: {used} of the {size} machines of its pool {name} "
                f"({_machines(k)}) are in use now; {' and '.join(jobs)} wait{'s' if len(jobs) == 1 else ''} "
                f"for {n} to be free"
            )
    return problems, warnings


def _tuning_problems(v: Mapping[str, Any]) -> list[Problem]:
    problems = []
    algorithm = v["search_algorithm"]
    if algorithm not in tuning.ALGORITHMS:
        problems.append(
            Problem(
                ("search_algorithm",), f"must be one of {', '.join(tuning.ALGORITHMS)}, got {algorithm!r}"
            )
        )
    counts = {k: v[k] for k in ("max_trial_count", "parallel_trial_count", "max_failed_trial_count")}
    if not _whole(counts["max_trial_count"]) or counts["max_trial_count"] < 1:
        problems.append(
            Problem(("max_trial_count",), f"must be a whole number >= 1, got {counts['max_trial_count']!r}")
        )
    elif (
        not _whole(counts["parallel_trial_count"])
        or not 1 <= counts["parallel_trial_count"] <= counts["max_trial_count"]
    ):
        problems.append(
            Problem(
                ("parallel_trial_count",),
                f"must be from 1 to max_trial_count ({counts['max_trial_count']}), got {counts['parallel_trial_count']!r}",
            )
        )
    if not _whole(counts["max_failed_trial_count"]) or counts["max_failed_trial_count"] < 0:
        problems.append(
            Problem(
                ("max_failed_trial_count",),
                f"must be a whole number >= 0 (0: Vertex decides), got {counts['max_failed_trial_count']!r}",
            )
        )
    if v["tune"]:
        space_problems, specs = _search_space_problems(v)
        problems += space_problems
        continuous = [
            s.parameter_id for s in specs if tuning.value_spec_kind(s) not in tuning.GRID_VALUE_SPECS
        ]
        if algorithm == "GRID_SEARCH" and continuous:
            problems.append(
                Problem(
                    ("search_algorithm", "search_space"),
                    "GRID_SEARCH needs every study parameter INTEGER, CATEGORICAL or DISCRETE "
                    f"(aiplatform_v1 StudySpec.Algorithm); the search_space's {', '.join(continuous)} "
                    "are DOUBLE (double_value_spec). Use ALGORITHM_UNSPECIFIED (Bayesian) or "
                    "RANDOM_SEARCH, or declare them with integer_value_spec or discrete_value_spec",
                )
            )
    return problems


def _search_space_problems(v: Mapping[str, Any]) -> tuple[list[Problem], list[Any]]:
    """The declared search space's problems (module docstring), each naming `search_space` and
    the parameter; and its parsed specs (none when it does not parse)."""

    def problem(message: str) -> Problem:
        return Problem(("search_space",), message)

    allowed = ", ".join(tuning.TUNABLE_FLAGS)
    try:
        specs = tuning.parse_search_space(v["search_space"])
    except ValueError as err:
        return [
            problem(
                f"{str(err).rstrip('.')}. Each parameter is a StudySpec.ParameterSpec: parameter_id, "
                "one of double_value_spec or integer_value_spec {min_value, max_value}, "
                "discrete_value_spec or categorical_value_spec {values}, and scale_type "
                "(UNIT_LINEAR_SCALE, UNIT_LOG_SCALE or UNIT_REVERSE_LOG_SCALE)"
            )
        ], []
    if not specs:
        return [problem(f"declares no parameter: give at least one of {allowed}")], []
    problems: list[Problem] = []
    clean = []  # the specs with no problem of their own, whose values go to the trainer's parser
    seen: set[str] = set()
    for n, s in enumerate(specs, 1):
        found = _parameter_spec_problems(n, s, seen)
        problems += [problem(message) for message in found]
        if not found:
            clean.append(s)
        seen.add(s.parameter_id)
    return problems + _trial_value_problems(v, clean), specs


def _parameter_spec_problems(n: int, s: Any, seen: set[str]) -> list[str]:
    """One parameter spec's own problems (module docstring), each starting with its id."""
    allowed = ", ".join(tuning.TUNABLE_FLAGS)
    pid, kind = s.parameter_id, tuning.value_spec_kind(s)
    if not pid:
        return [f"parameter {n} has no parameter_id: give one of {allowed}"]
    out = []
    if pid not in tuning.TUNABLE_FLAGS:
        out.append(f"{pid} is not a trainer flag a tuning job may set; allowed: {allowed}")
    if pid in seen:
        out.append(f"{pid} is declared twice: parameter ids must be unique")
    if not kind:
        given = "give double_value_spec or integer_value_spec {min_value, max_value}, or "
        return [
            *out,
            f"{pid} has no value spec: {given}discrete_value_spec or categorical_value_spec {{values}}",
        ]
    name = f"{pid} ({kind})"
    if s.conditional_parameter_specs:
        out.append(
            f"{name}: conditional_parameter_specs are not supported: declare every flag at the top level"
        )
    scale = type(s).ScaleType
    log = s.scale_type in (scale.UNIT_LOG_SCALE, scale.UNIT_REVERSE_LOG_SCALE)
    scale_name = scale(s.scale_type).name
    if kind in ("double_value_spec", "integer_value_spec"):
        spec = getattr(s, kind)
        low, high = spec.min_value, spec.max_value
        if not low < high:
            out.append(f"{name}: min_value must be below max_value, got {low:g} and {high:g}")
        if log and low <= 0:
            out.append(f"{name}: {scale_name} needs min_value > 0 (the whole range positive), got {low:g}")
    elif kind == "discrete_value_spec":
        values = [float(x) for x in s.discrete_value_spec.values]
        if not values:
            out.append(f"{name}: values is empty: give at least one value")
        elif any(b - a < tuning.DISCRETE_MIN_GAP for a, b in itertools.pairwise(values)):
            out.append(f"{name}: values must be in increasing order and at least 1e-10 apart, got {values}")
        if len(values) > tuning.DISCRETE_MAX_VALUES:
            out.append(f"{name}: at most {tuning.DISCRETE_MAX_VALUES} values, got {len(values)}")
        if log and values and min(values) <= 0:
            out.append(f"{name}: {scale_name} needs every value > 0, got {min(values):g}")
    else:
        values = list(s.categorical_value_spec.values)
        if not values or len(set(values)) != len(values):
            out.append(f"{name}: values must be distinct and at least one, got {values}")
        if s.scale_type:
            out.append(f"{name}: leave scale_type unset for a categorical parameter")
    return out


def _trial_value_problems(v: Mapping[str, Any], specs: list[Any]) -> list[Problem]:
    """The trainer's own parser on every value a trial may be handed (`tuning.trial_values`:
    both ends of a range, a fractional value inside a DOUBLE range, every listed value), as
    Vertex formats them (`--dropout=0.5`, `--dense_units=32.0`). One `trainer_flag_problems`
    call per round, each round putting one candidate of every parameter into the run's values."""
    if not specs:
        return []
    candidates = {s.parameter_id: tuning.trial_values(s) for s in specs}
    kinds = {s.parameter_id: tuning.value_spec_kind(s) for s in specs}
    found: dict[tuple[str, str], str] = {}
    for k in range(max(len(c) for c in candidates.values())):
        trial = {pid: c[min(k, len(c) - 1)] for pid, c in candidates.items()}
        for p in trainer_flag_problems({**v, **trial}):
            for pid in (n for n in p.parameters if n in trial):
                found.setdefault((pid, str(trial[pid])), p.message)
    out = []
    for (pid, value), message in found.items():
        hint = ""
        if kinds[pid] == "double_value_spec" and "whole number" in message:
            hint = " (a double_value_spec hands trials fractional values: use integer_value_spec or discrete_value_spec)"
        out.append(
            Problem(
                ("search_space",),
                f"{pid} ({kinds[pid]}): a trial may get --{pid}={value}, which the trainer refuses: {message}{hint}",
            )
        )
    return out


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _job_settings_problems(v: Mapping[str, Any], region: str) -> list[Problem]:
    problems = []
    build = v.get("build_location", "")
    if build and build not in image.CLOUD_BUILD_REGIONS:
        problems.append(
            Problem(
                ("build_location",),
                f"{build!r} is not a Cloud Build location (https://cloud.google.com/build/docs/locations): "
                f"'' (the job's region), global, or one of {', '.join(image.CLOUD_BUILD_REGIONS[1:])}",
            )
        )
    names = ("build_machine_type", "build_service_account", "build_worker_pool")
    try:  # the Vertex target's alone
        if names[0] in v:
            image.build_settings(v["project"], region, build, *(v[n] for n in names))
    except ValueError as err:  # it names the parameters it is about
        problems.append(Problem(tuple(n for n in (*names, "build_location") if n in str(err)), str(err)))
    strategy = v["scheduling_strategy"]
    if strategy not in SCHEDULING_STRATEGIES:
        close = [s for s in SCHEDULING_STRATEGIES if s == str(strategy).upper()]
        problems.append(
            Problem(
                ("scheduling_strategy",),
                f"must be one of {', '.join(SCHEDULING_STRATEGIES)} (aiplatform_v1 Scheduling.Strategy, "
                f"upper case), got {strategy!r}" + (f"; did you mean {close[0]}?" if close else ""),
            )
        )
    seconds = duration_seconds(v["timeout"])
    if seconds is None or seconds <= 0:
        problems.append(
            Problem(
                ("timeout",),
                f"must be a duration in seconds like '86400s' (protobuf Duration), got {v['timeout']!r}",
            )
        )
    elif seconds < MIN_TIMEOUT_SECONDS:
        problems.append(
            Problem(
                ("timeout",),
                f"{v['timeout']} is shorter than any job can run (replicas start, import TensorFlow and "
                f"read the data first): give at least '{MIN_TIMEOUT_SECONDS}s'",
            )
        )
    account = v["service_account"]
    if account and not SERVICE_ACCOUNT.match(account):
        problems.append(
            Problem(
                ("service_account",),
                f"{account!r} is not a service account e-mail (<name>@<project>.iam.gserviceaccount.com)",
            )
        )
    if v["network"] and not NETWORK.match(v["network"]):
        problems.append(
            Problem(
                ("network",),
                f"must be projects/<project number>/global/networks/<name>, got {v['network']!r}",
            )
        )
    key = v["encryption_spec_key_name"]
    if key and (problem := kms_key_problem(key, region)):
        problems.append(Problem(("encryption_spec_key_name",), problem))
    board = v["tensorboard"]
    if board:
        match = TENSORBOARD.match(board)
        if not match:
            problems.append(
                Problem(
                    ("tensorboard",),
                    f"must be projects/<p>/locations/<region>/tensorboards/<id>, got {board!r}",
                )
            )
        elif region and match.group(1) != region:
            problems.append(
                Problem(
                    ("tensorboard",),
                    f"the TensorBoard is in {match.group(1)}; it must be in the job's region {region}",
                )
            )
        if not account:
            problems.append(
                Problem(
                    ("tensorboard", "service_account"),
                    'a TensorBoard needs a service account (aiplatform: "service_account is required '
                    'with provided tensorboard"): set service_account (or SERVICE_ACCOUNT), with '
                    "roles/storage.admin and roles/aiplatform.user (docs/iam.md)",
                )
            )
    for message in label_problems(v["labels"]):
        problems.append(Problem(("labels",), message))
    return problems


def _registry_problems(v: Mapping[str, Any], region: str, warnings: list[str]) -> list[Problem]:
    problems = []
    try:
        registry.check_model_display_name(v["model_display_name"])
    except ValueError as err:
        problems.append(Problem(("model_display_name",), str(err).removeprefix("model_display_name ")))
    try:
        # As the upload step will judge it today: a prebuilt image past its end of availability
        # is refused, one within 90 days of it warned about (make run and make schedule).
        warnings += registry.check_serving_parameters(
            str(v["serving_image"]), str(v["serving_tf_version"]), str(v["serving_accelerator"]), region
        )
    except ValueError as err:
        text = str(err)
        name = next(
            (
                n
                for n in ("serving_tf_version", "serving_accelerator")
                if text.startswith((n, n.replace("_", " ")))
            ),
            "serving_image",
        )
        problems.append(Problem((name,), text))
    if v["gate_metric"] not in evaluation.GATE_METRICS:
        problems.append(
            Problem(
                ("gate_metric",),
                f"must be one of {', '.join(evaluation.GATE_METRICS)}, got {v['gate_metric']!r}",
            )
        )
    if not isinstance(v["min_score"], int | float) or not 0 <= v["min_score"] <= 1:
        problems.append(Problem(("min_score",), f"must be from 0 to 1, got {v['min_score']!r}"))
    if v["gate_rule"] not in evaluation.GATE_RULES:
        problems.append(
            Problem(
                ("gate_rule",), f"must be one of {', '.join(evaluation.GATE_RULES)}, got {v['gate_rule']!r}"
            )
        )
    if not isinstance(v["gate_margin"], int | float) or not 0 <= v["gate_margin"] <= 1:
        problems.append(Problem(("gate_margin",), f"must be from 0 to 1, got {v['gate_margin']!r}"))
    root = v.get("model_root", "")
    if root and not MODEL_ROOT.match(str(root)):
        problems.append(
            Problem(
                ("model_root",),
                f"must be empty (gs://<the pipeline root's bucket>/models) or a gs://<bucket>/<path> folder, "
                f"got {root!r}",
            )
        )
    return problems


# A Dataflow job's subnetwork, as GCPC's DataflowFlexTemplateJobOp documents it
# (v1/dataflow/flex_template/component.py, `subnetwork`): an abbreviated path, or the complete URL
# a Shared VPC's subnetwork needs.
_SUBNETWORK = re.compile(
    r"(?:https://www\.googleapis\.com/compute/v1/projects/[a-z][-a-z0-9:.]{4,61}[a-z0-9]/)?"
    r"regions/(?P<region>[a-z]+-[a-z]+[0-9]+)/subnetworks/[a-z]([-a-z0-9]{0,61}[a-z0-9])?"
)


def _dataflow_problems(v: Mapping[str, Any], region: str, warnings: list[str]) -> list[Problem]:
    """prepare_engine=beam on Vertex: the Dataflow workers' subnetwork. Dataflow takes a network
    given alone as an auto-mode network of the job's project ("Specify a network and subnetwork",
    https://cloud.google.com/dataflow/docs/guides/specifying-networks); a custom-mode network, or a
    Shared VPC's, needs the subnetwork, in the job's region."""
    subnetwork = str(v.get("dataflow_subnetwork") or "")
    if not subnetwork:
        if v.get("prepare_engine") == "beam" and v.get("network"):
            warnings.append(
                "prepare_engine=beam with a network and no dataflow_subnetwork: Dataflow takes the network "
                "by name as an auto-mode network of the job's project; for a custom-mode or Shared VPC "
                "network give dataflow_subnetwork (regions/<region>/subnetworks/<name>)"
            )
        return []
    match = _SUBNETWORK.fullmatch(subnetwork)
    if not match:
        return [
            Problem(
                ("dataflow_subnetwork",),
                f"{subnetwork!r} is not regions/REGION/subnetworks/NAME nor "
                "https://www.googleapis.com/compute/v1/projects/PROJECT/regions/REGION/subnetworks/NAME",
            )
        ]
    if region and match.group("region") != region:
        return [
            Problem(
                ("dataflow_subnetwork",),
                f"{subnetwork!r} is in {match.group('region')}; the Dataflow job runs in {region}, "
                "its workers in a subnetwork of that region",
            )
        ]
    return []


def _data_problems(v: Mapping[str, Any], target: str) -> list[Problem]:
    problems = []
    source = str(v["dataset_source"])
    if source.startswith("folder:"):
        path = source.removeprefix("folder:")
        if target == "vertex" and not path.startswith(("gs://", "/gcs/")):
            problems.append(
                Problem(
                    ("dataset_source",),
                    f"{source}: the preparation job runs on Vertex, where only Cloud Storage is "
                    "reachable: give folder:gs://<bucket>/<path> (or folder:/gcs/<bucket>/<path>)",
                )
            )
        elif target == "local" and not Path(path).is_dir():
            problems.append(Problem(("dataset_source",), f"{source}: no such folder"))
    if target == "vertex" and v.get("prepare_engine") == "beam" and not source.startswith("folder:"):
        # The Flex Template's launcher lists the source and plans the shards before Dataflow
        # starts a worker, and Dataflow bounds the launcher's time ("Timeout in polling result
        # file", docs/beam.md). A TFDS source would be built there whole: TFDS runs a builder on
        # Beam only when its _generate_examples returns a Beam transform (tensorflow_datasets/
        # core/split_builder.py), and cassava's is a generator. The synthetic source is made in a
        # temporary folder of that launcher, which the workers cannot read.
        why = (
            "the synthetic source is made in a temporary folder of the Flex Template's launcher, which "
            "Dataflow's workers cannot read"
            if source == "synthetic"
            else "TFDS builds it in one process before Beam starts (its generator is no Beam transform), "
            "and on Dataflow that process is the Flex Template's launcher, whose time Dataflow bounds"
        )
        problems.append(
            Problem(
                ("dataset_source", "prepare_engine"),
                f"{source}: prepare_engine=beam on Vertex prepares a folder of images on Cloud Storage "
                f"(folder:gs://<bucket>/<path>): {why}; use prepare_engine=job for this source",
            )
        )
    workers = v.get("dataflow_max_workers")
    if target == "vertex" and isinstance(workers, int) and _whole(workers) and not 1 <= workers <= 1000:
        # dataflow_v1beta3 FlexTemplateRuntimeEnvironment.max_workers: "from 1 to 1000". GCPC's
        # launcher drops a 0 from the request (json_util.recursive_remove_empty), so Dataflow
        # would choose the count.
        problems.append(Problem(("dataflow_max_workers",), f"must be from 1 to 1000, got {workers}"))
    problems += _weights_problems(str(v["weights"]), target)
    fraction = v["fine_tune_fraction"]
    if isinstance(fraction, int | float) and fraction < 0 and fraction != -1:
        problems.append(
            Problem(
                ("fine_tune_fraction",), f"must be -1 (the trainer's default) or from 0 to 1, got {fraction}"
            )
        )
    replicas = 1 + (v["worker_count"] if _whole(v["worker_count"]) else 0)
    shards = v["dataset_shards"]
    if _whole(shards) and shards < replicas:
        problems.append(
            Problem(
                ("dataset_shards", "worker_count"),
                f"{shards} shards per split for {replicas} training replicas: each replica reads whole "
                f"files (FILE auto-sharding), so give at least {replicas}",
            )
        )
    return problems


def _weights_problems(weights: str, target: str) -> list[Problem]:
    """`weights` names a weights file the training job can read: on Vertex a Cloud Storage path
    (nothing else on this machine is reachable from there), locally a regular HDF5 file."""
    if weights.lower() in ("imagenet", "none") or not weights.strip():
        return []  # the trainer's own parser names an empty value (trainer_flag_problems)
    if weights.startswith(("gs://", "/gcs/")):
        return (
            []
            if target == "vertex" or os.path.isdir("/gcs")
            else [
                Problem(
                    ("weights",),
                    f"{weights}: Cloud Storage is not reachable from a local run; give a local file",
                )
            ]
        )
    if target == "vertex":
        return [
            Problem(
                ("weights",),
                f"{weights}: the training job runs on Vertex, where only Cloud Storage is reachable: "
                "give gs://<bucket>/<file>.h5 (or /gcs/<bucket>/<file>.h5)",
            )
        ]
    path = Path(weights)
    if not path.exists():
        return [Problem(("weights",), f"{weights}: no such file (imagenet, none, or an HDF5 weights file)")]
    if not path.is_file():
        return [
            Problem(("weights",), f"{weights}: not a regular file (imagenet, none, or an HDF5 weights file)")
        ]
    try:
        with path.open("rb") as handle:
            head = handle.read(len(HDF5_SIGNATURE))
    except OSError as err:
        return [Problem(("weights",), f"{weights}: cannot be read ({err.strerror or err})")]
    if head != HDF5_SIGNATURE:
        return [
            Problem(
                ("weights",),
                f"{weights}: not an HDF5 weights file (saved by Keras `model.save_weights('x.h5')`); "
                "a .keras archive or a TF checkpoint is not loaded by --weights",
            )
        ]
    return []


# --- the local target's own rules ------------------------------------------------------------

# The most trainer processes a local run starts at once: one job's chief and 8 workers, or the
# replicas of all the tuning trials running at the same time.
MAX_LOCAL_WORKERS = 8
MAX_LOCAL_REPLICAS = 1 + MAX_LOCAL_WORKERS


def _local_problems(args: Mapping[str, Any]) -> list[Problem]:
    """The local target's own rules: no more GPUs than this machine has, at most 8 workers (and
    parallel trials within the same bound), a local serving environment for the serving image's
    TensorFlow, a TFDS source this machine can prepare, a registry folder this run can write."""
    from local import jobs, servingenv

    problems: list[Problem] = []
    # GPUs asked of a machine without them: refused before any step, in the line the local job
    # runner and every replica would give (local.jobs.gpu_shortfall, trainer.distribute's rule).
    gpus = jobs.local_gpus()
    pools = [("chief", "chief", 0)] + ([("worker", "worker", 1)] if args["worker_count"] else [])
    for role, prefix, pool in pools:
        same = prefix == "worker" and not args["worker_machine_type"]  # copies the chief's
        source = "chief" if same else prefix
        asked = args[f"{source}_accelerator_count"]
        if isinstance(asked, int) and asked > 0:
            problem = jobs.gpu_shortfall(
                f"workerpool{pool}",
                role,
                str(args[f"{source}_machine_type"]),
                str(args[f"{source}_accelerator_type"]),
                asked,
                gpus,
                f"this machine ({jobs.GPU_DRIVER_DIR})",
            )
            if problem:
                problems.append(
                    Problem(
                        (f"{prefix}_accelerator_count",),
                        f"{problem}; set it to 0 (and {prefix}_accelerator_type to '') to train on CPU",
                    )
                )
    if isinstance(args["worker_count"], int) and args["worker_count"] > MAX_LOCAL_WORKERS:
        problems.append(
            Problem(
                ("worker_count",),
                f"{args['worker_count']} is more processes than a local run should start (max {MAX_LOCAL_WORKERS})",
            )
        )
    elif (
        args["tune"]
        and isinstance(args["worker_count"], int)
        and isinstance(args["parallel_trial_count"], int)
    ):
        # Each trial is a job of its own with the same pools: parallel trials multiply the
        # replicas (6 trials of 2 replicas: 14 trainer processes, 5.8 GB on this machine).
        per_trial = 1 + args["worker_count"]
        if args["parallel_trial_count"] * per_trial > MAX_LOCAL_REPLICAS:
            problems.append(
                Problem(
                    ("parallel_trial_count", "worker_count"),
                    f"{args['parallel_trial_count']} trials at once of {per_trial} replicas each is "
                    f"{args['parallel_trial_count'] * per_trial} trainer processes; a local run starts at most "
                    f"{MAX_LOCAL_REPLICAS} at once: give parallel_trial_count at most "
                    f"{max(1, MAX_LOCAL_REPLICAS // per_trial)}",
                )
            )
    try:  # the serving image this run would register with (auto: decided on today's date)
        prebuilt = (
            registry.resolve_serving_image(args["serving_image"], args["serving_tf_version"]) == "prebuilt"
        )
    except ValueError:
        prebuilt = False  # an unknown version: named by _registry_problems
    if prebuilt and args["serving_tf_version"] not in servingenv.PINS:
        # The local registry serves each version under its serving image's TensorFlow.
        problems.append(
            Problem(
                ("serving_tf_version",),
                f"{args['serving_tf_version']} has no local serving environment; the local target "
                f"checks models under: {', '.join(sorted(servingenv.PINS))}",
            )
        )
    if problem := tfds_source_problem(str(args["dataset_source"]), os.environ):
        problems.append(Problem(("dataset_source",), problem))
    if not str(args["registry_dir"]).strip():
        problems.append(
            Problem(
                ("registry_dir",),
                "is empty: give the folder of the local registry (default local_runs/registry)",
            )
        )
    elif problem := _registry_dir_problem(Path(args["registry_dir"])):
        problems.append(Problem(("registry_dir",), problem))
    return problems


# Where TFDS downloads from: its own mirror of prepared datasets in Cloud Storage (gs://tfds-data,
# tried first) and the sources' sites; a machine that cannot reach this host has no internet.
INTERNET_PROBE = ("storage.googleapis.com", 443)


def internet_reachable(timeout: float = 3.0) -> bool:
    import socket

    try:
        with socket.create_connection(INTERNET_PROBE, timeout=timeout):
            return True
    except OSError:
        return False


def tfds_source_problem(source: str, environ: Mapping[str, str]) -> str:
    """A `tfds:NAME` source that preparation would have to download on a machine without the
    internet: refused now, in seconds, instead of after TFDS's retries (221 s for tfds:mnist).
    TFDS keeps a prepared dataset in `$TFDS_DATA_DIR/<name>/[<config>/]<version>/dataset_info.json`
    (default data dir ~/tensorflow_datasets: tfds.core.constants.DATA_DIR)."""
    if not source.startswith("tfds:"):
        return ""
    name = source.removeprefix("tfds:").split(":")[0].split("/")[0]
    data_dir = Path(environ.get("TFDS_DATA_DIR") or Path.home() / "tensorflow_datasets")
    folder = data_dir / name
    if folder.is_dir() and any(
        p.name == "dataset_info.json"
        for depth in ("*", "*/*")
        for p in folder.glob(f"{depth}/dataset_info.json")
    ):
        return ""
    if internet_reachable():
        return ""
    return (
        f"{source}: not prepared in {data_dir} (TFDS_DATA_DIR) and this machine cannot reach the internet "
        f"({INTERNET_PROBE[0]}:{INTERNET_PROBE[1]}), so preparation could not download it: prepare it where "
        f"there is a network and copy {folder} here, or use folder:PATH or synthetic"
    )


def _registry_dir_problem(registry_dir: Path) -> str:
    """The registry folder is written only by the last step (upload-model): check now that it is
    a folder this run can write (or create), not after the whole run."""
    import tempfile

    if registry_dir.exists() and not registry_dir.is_dir():
        return f"{registry_dir} exists and is not a folder"
    existing = registry_dir
    while not existing.exists():  # a folder to create: its nearest existing parent must be writable
        existing = existing.absolute().parent
    if not existing.is_dir():
        return f"{registry_dir} cannot be created: {existing} is not a folder"
    try:
        handle, probe = tempfile.mkstemp(prefix=".write-check-", dir=existing)
        os.close(handle)
        os.remove(probe)
    except OSError as err:
        what = "is not writable" if existing == registry_dir else f"cannot be created in {existing}"
        return f"{registry_dir} {what} ({err.strerror or err}): give --registry_dir a folder you can write"
    return ""


# --- Vertex only -------------------------------------------------------------------------------

EMAIL = re.compile(r"^[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+$")


def check_notification_emails(emails: Any) -> list[str]:
    """`notification_emails` as VertexNotificationEmailOp may receive it: one to three addresses
    (GCPC's `vertex_notification_email` docstring and Google's "Configure email notifications"
    page: "up to 3 emails"). [] or None: no notification (the template without the handler)."""
    if emails in (None, []):
        return []
    if not isinstance(emails, list) or not all(isinstance(e, str) for e in emails):
        raise ValueError(f"notification_emails must be a JSON list of addresses, got {emails!r}")
    bad = [e for e in emails if not EMAIL.match(e)]
    if bad:
        raise ValueError(f"notification_emails: not e-mail addresses: {', '.join(map(repr, bad))}")
    if not 1 <= len(emails) <= 3:
        raise ValueError(
            f"notification_emails takes one to three addresses (Vertex's limit), got {len(emails)}"
        )
    return list(emails)


# --- every rule, one entry --------------------------------------------------------------------


def _number_problems(values: Mapping[str, Any]) -> list[Problem]:
    """NaN or infinity in any number: every rule below compares numbers, and NaN passes them all
    (`nan < 0` and `nan > 1` are both false), so it would reach the trainer and poison training."""
    return [
        Problem((name,), f"must be a finite number, got {value!r}")
        for name, value in values.items()
        if isinstance(value, float) and not math.isfinite(value)
    ]


def check(values: Mapping[str, Any], target: str, region: str = "") -> list[str]:
    """Applies every rule to a run's parameter values (the target's defaults with the user's
    values over them); `region` is the Vertex region (the local target has none). The local
    target adds its own rules (`_local_problems`). Raises OptionsError naming every bad
    parameter; returns warnings. The one entry of `make run` (both targets) and `make schedule`."""
    if target not in ("vertex", "local"):
        raise ValueError(f"target must be vertex or local, got {target!r}")
    warnings: list[str] = []
    problems = _number_problems(values)  # before rules that would compare them
    if not problems:
        problems = _parameter_problems(values, target, region, warnings)
    elif target == "vertex":
        raise OptionsError(problems)
    if target == "local":
        problems += _local_problems(values)
    if problems:
        raise OptionsError(problems)
    if values["tune"] and (values["scheduling_strategy"] != "STANDARD" or values["tensorboard"]):
        # GCPC 2.22's HyperparameterTuningJobRunOp has no scheduling, timeout, labels or
        # TensorBoard inputs (v1/hyperparameter_tuning_job/component.py); the pipeline's
        # `tuning.hyperparameter_tuning_job` adds the timeout alone.
        warnings.append(
            "tune=true: the tuning job's trials run with standard (on-demand) scheduling and without "
            "the TensorBoard: GCPC's HyperparameterTuningJobRunOp takes neither; scheduling_strategy "
            f"{values['scheduling_strategy']} and the TensorBoard apply to the final training job only"
        )
    return warnings


def _parameter_problems(
    values: Mapping[str, Any], target: str, region: str, warnings: list[str]
) -> list[Problem]:
    """The rules of both targets (every number finite already)."""
    problems = _hardware_problems(values, region, warnings)
    problems += _job_settings_problems(values, region)
    problems += _persistent_resource_problems(values, warnings)
    if values["scheduling_strategy"] == "FLEX_START":
        problems += _flex_start_problems(values)
    problems += _tuning_problems(values)
    problems += _registry_problems(values, region, warnings)
    problems += _data_problems(values, target)
    if target == "vertex":
        problems += _dataflow_problems(values, region, warnings)
    problems += trainer_flag_problems(values)
    if not any("dataset_source" in p.parameters for p in problems):
        problems += source_problems(values)
    return problems
