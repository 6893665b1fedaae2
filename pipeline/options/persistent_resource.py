"""The persistent resource (an extra): `persistent_resource_id`'s offline rules, and whether the
resource itself can run the run's jobs (`persistent_resource_fit`, called by `launch.submit` once
it has read the resource)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import pipeline.step as step
from components import worker_pools
from pipeline.options.common import Parameter as _p
from pipeline.options.common import Problem

PARAMETERS: tuple[_p, ...] = (
    _p(
        "persistent_resource_id",
        str,
        "",
        "ID of a Vertex persistent resource, in the run's project and region, that the preparation, "
        "training and evaluation jobs run on instead of machines started for each ('': on demand; "
        "the PERSISTENT_RESOURCE_ID setting). It needs a pool for each job's machines, the run's "
        "network, CMEK key and service account; tuning trials and the pipeline's own steps still "
        "start machines (docs/architecture.md#a-warm-pool-the-jobs-on-a-vertex-persistent-resource).",
        targets=("vertex",),
    ),
)

# This capability's rows of docs/options.md#the-rules (`make docs`): parameters | rule | source.
RULES = """
| `persistent_resource_id` (Vertex; the `PERSISTENT_RESOURCE_ID` setting) | `''` (every job starts its own machines) or a persistent resource's ID, 1-63 lowercase letters, digits and `-`, starting with a letter; only with `scheduling_strategy=STANDARD`; `tune=true` warns that the trials still start machines. When the run is submitted, the resource is read: it must exist in the run's project and region, be `RUNNING`, have the run's `network`, CMEK key and service account, and a pool for each job's machines (machine type, GPU type and count, boot disk type) with its replicas: `prepare_machine_type` for the preparation and evaluation jobs, the chief's, the workers' and the Reduction Server's for the training job | aiplatform_v1 `CreatePersistentResourceRequest.persistent_resource_id`, `CustomJobSpec.persistent_resource_id`; "Run training jobs on a persistent resource"; docs/architecture.md#a-warm-pool-the-jobs-on-a-vertex-persistent-resource |
"""


# A persistent resource's ID: "The maximum length is 63 characters, and valid characters are
# /^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$/" (aiplatform_v1 `CreatePersistentResourceRequest
# .persistent_resource_id`, types/persistent_resource_service.py). A job names the resource by
# this ID alone, "in the same Project and Location" (`CustomJobSpec.persistent_resource_id`).
PERSISTENT_RESOURCE_ID = re.compile(r"^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$")


# The jobs that run on it: every CustomTrainingJobOp of the DAG (`pipeline.backends._vertex_custom_job`).
# Not the tuning trials: GCPC 2.22's HyperparameterTuningJobRunOp has no persistent_resource_id
# input (v1/hyperparameter_tuning_job/component.py), so they run on machines started for them.
PERSISTENT_RESOURCE_JOBS = (step.PREPARE, step.TRAIN, step.EVALUATE)


PERSISTENT_RESOURCE_DOC = "docs/architecture.md#a-warm-pool-the-jobs-on-a-vertex-persistent-resource"


def persistent_resource_id_problem(resource_id: str) -> str:
    """What is wrong with `resource_id` as a persistent resource's ID ("" when nothing is): the
    one rule of `persistent_resource_id` and of the PERSISTENT_RESOURCE_ID setting."""
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


def persistent_resource_problems(v: Mapping[str, Any], warnings: list[str]) -> list[Problem]:
    """The offline rules of `persistent_resource_id`: its form, and STANDARD scheduling (ours)."""
    resource_id = v.get("persistent_resource_id", "")
    if not resource_id:
        return []
    problems = []
    if problem := persistent_resource_id_problem(str(resource_id)):
        problems.append(Problem(("persistent_resource_id",), problem))
    strategy = v["scheduling_strategy"]
    if strategy != "STANDARD":  # this pipeline's rule: Google documents no combination
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


def _machine_key(machine_type: str, accelerator: str, count: int, disk: str) -> tuple[str, str, int, str]:
    """What a job's worker pool and a resource pool must share: machine type, GPU type and count,
    boot disk type. An unset disk type is the default: aiplatform_v1 `DiskSpec.boot_disk_type`: "For
    non-A3U machines, the default value is "pd-ssd", for A3U machines, the default value is
    "hyperdisk-balanced"" (a3-ultragpu-*)."""
    gpu = accelerator if accelerator not in ("", "ACCELERATOR_TYPE_UNSPECIFIED") and count else ""
    default_disk = "hyperdisk-balanced" if machine_type.startswith("a3-ultragpu") else "pd-ssd"
    return (machine_type, gpu, int(count) if gpu else 0, disk or default_disk)


def _machines(key: tuple[str, str, int, str]) -> str:
    machine, gpu, count, disk = key
    return f"{machine}{f' + {count} x {gpu}' if gpu else ''} ({disk} boot disk)"


def persistent_resource_fit(resource: Any, v: Mapping[str, Any], region: str) -> tuple[list[str], list[str]]:
    """(problems, warnings): why the aiplatform_v1 `PersistentResource` `resource` cannot run the
    jobs of the run with parameter values `v` (every offline rule passed).

    - `state` RUNNING ("the persistent resource is healthy and fully usable": `PersistentResource.State`).
    - `network` and `encryption_spec.kms_key_name` the run's (`consistent` below quotes why).
    - A `service_account` exactly when the resource enforces one: with `resource_runtime_spec
      .service_account_spec.enable_custom_service_account`, "custom user-managed service account is
      enforced to run any workloads (for example, Vertex Jobs) on the resource. Otherwise, uses the
      Vertex AI Custom Code Service Agent" (`ServiceAccountSpec`), which
      docs/vertex.md#the-iam-roles-a-first-run-needs grants no roles to.
    - Each job's worker pools: a resource pool of the same `_machine_key` holding its replicas:
      "values for machine-type and disk-type matches exactly with a corresponding resource pool", "a
      replica-count less than or equal to the replica-count or max-replica-count of the corresponding
      resource pool" (https://cloud.google.com/vertex-ai/docs/training/persistent-resource-train).
      One job's pools of the same machines count together; the jobs run one after another, so they
      share a pool. Replicas held now (`used_replica_count`) are a warning."""
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
            f"{run_key or 'none'}: they must be the same {consistent}"
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
    # Each job's worker pools as the planning step builds them (`components.plan.plan_jobs`), less
    # the image and flags, which a resource pool does not constrain.
    cpu = {k: v[k] for k in ("boot_disk_type", "boot_disk_size_gb")}
    cpu["chief_machine_type"] = v["prepare_machine_type"]
    training = {k: v[k] for k in worker_pools.HARDWARE_PARAMETERS if k in v}
    needs: dict[tuple[str, str, int, str], tuple[int, list[str]]] = {}
    for job, hw in zip(PERSISTENT_RESOURCE_JOBS, (cpu, training, cpu), strict=True):
        specs = worker_pools.build_worker_pool_specs(
            image_uri="check", command=["python"], args=[], region=region, **hw
        )
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
