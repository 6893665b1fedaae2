"""Worker pool specs: built at run time, as data, by the planning step (`components.plan`) from
pipeline parameters.

Not a literal: parameters inside one would reach the GCPC launcher as strings, refused for int32
fields (docs/facts.md, fact 11). Pool 0 the chief (one replica), pool 1 `worker_count` workers,
pool 2 optional Reduction Server replicas; the same specs feed `CustomTrainingJobOp`,
`HyperparameterTuningJobRunOp` and `local.jobs`.

Each trainer pool's aiplatform_v1 `ContainerSpec.env` carries its own GPU request (`pool_env`),
checked by every replica at start (docs/vertex.md#no-silent-cpu-training); env is per pool ("you
can use different settings for each worker pool",
https://cloud.google.com/vertex-ai/docs/training/configure-container-settings), and GCPC's
`HyperparameterTuningJobRunOp` copies `worker_pool_specs` into `trial_job_spec`
(v1/hyperparameter_tuning_job/component.py), so trials get them too.
"""

from typing import Any

from components.hardware import validate_machine
from components.reductionserver import reduction_server_pool, reduction_server_problems


def pool_env(
    machine_type: str, accelerator_type: str = "", accelerator_count: int = 0
) -> list[dict[str, str]]:
    """A trainer pool's `container_spec.env`: what the pool asked for, read by the trainer at start
    (`trainer.config.gpu_request`). No GPU is `ACCELERATOR_TYPE_UNSPECIFIED` and `0` (aiplatform_v1
    `EnvVar.value` is required); no name starts with Vertex's own `AIP_` or `CLOUD_ML_`."""
    none = "ACCELERATOR_TYPE_UNSPECIFIED"
    has_gpu = bool(accelerator_type) and accelerator_type != none and bool(accelerator_count)
    return [
        {"name": "TRAINER_POOL_MACHINE_TYPE", "value": machine_type},
        {"name": "TRAINER_POOL_ACCELERATOR_TYPE", "value": accelerator_type if has_gpu else none},
        {"name": "TRAINER_POOL_ACCELERATOR_COUNT", "value": str(accelerator_count if has_gpu else 0)},
    ]


def build_worker_pool_specs(
    image_uri: str,
    command: list[str],
    args: list[str],
    chief_machine_type: str,
    chief_accelerator_type: str = "",
    chief_accelerator_count: int = 0,
    worker_count: int = 0,
    worker_machine_type: str = "",
    worker_accelerator_type: str = "",
    worker_accelerator_count: int = 0,
    boot_disk_type: str = "pd-ssd",
    boot_disk_size_gb: int = 100,
    reduction_server_count: int = 0,
    reduction_server_machine_type: str = "n1-highcpu-16",
    region: str = "",
    check_gpu_region: bool = True,
    warnings: list | None = None,
) -> list[dict[str, Any]]:
    """A Vertex CustomJob's `worker_pool_specs`, validated: ValueError names every bad setting and
    what is allowed, a line each starting with the parameter's name. Empty worker settings copy
    the chief's; `validate_machine`'s warnings are appended to `warnings`."""
    import re

    def whole(value: Any, low: int, high: float) -> bool:  # an int, not a bool, within [low, high]
        return type(value) is int and low <= value <= high

    problems: list[str] = []
    if not image_uri or not isinstance(image_uri, str):
        problems.append("image_uri: required (the trainer image, ideally pinned by digest)")
    if not command or not all(isinstance(c, str) and c for c in command):
        problems.append(f"command: must be a non-empty list of strings, got {command!r}")
    if not all(isinstance(a, str) for a in args):
        problems.append(f"args: must be a list of strings, got {args!r}")
    if not whole(worker_count, 0, 512):
        problems.append(f"worker_count: must be a whole number from 0 to 512, got {worker_count!r}")
        worker_count = 0
    # aiplatform_v1 DiskSpec.boot_disk_type's "Valid values" (pd-balanced is PersistentDiskSpec's).
    disks = ("pd-ssd", "pd-standard", "hyperdisk-balanced")
    if boot_disk_type not in disks:
        problems.append(f"boot_disk_type: {boot_disk_type!r} is not one of {', '.join(disks)}")
    if not whole(boot_disk_size_gb, 100, 64_000):
        problems.append(
            f"boot_disk_size_gb: must be from 100 to 64000 (Vertex's range), got {boot_disk_size_gb!r}"
        )
    if not whole(reduction_server_count, 0, float("inf")):
        problems.append(
            f"reduction_server_count: must be a whole number >= 0, got {reduction_server_count!r}"
        )
        reduction_server_count = 0
    pools = trainer_pools(
        chief_machine_type,
        chief_accelerator_type,
        chief_accelerator_count,
        worker_count,
        worker_machine_type,
        worker_accelerator_type,
        worker_accelerator_count,
    )
    notes: list[str] = []
    for role, machine, gpu, count, _ in pools:
        try:
            notes += validate_machine(machine, gpu, count, region or None, region_strict=check_gpu_region)
        except ValueError as err:
            # The parameter most likely wrong: the machine when its name is malformed, else the GPU.
            text = str(err)
            count_error = r"^accelerator count|needs an accelerator count| takes .* x \S+, not \d+$"
            name = "accelerator_count" if re.search(count_error, text) else "accelerator_type"
            if text.startswith("machine type"):
                name = "machine_type"
            problems.append(f"{role}_{name}: {role} pool: {text}")
    if reduction_server_count:  # the GPUs of the pools as built (workers may copy the chief's)
        gpus = {role: bool(gpu and count) for role, _, gpu, count, _ in pools}
        problems += reduction_server_problems(
            reduction_server_machine_type, gpus["chief"], worker_count, gpus.get("worker", False)
        )
    if problems:
        raise ValueError("\n".join(problems))
    if warnings is not None:
        warnings.extend(dict.fromkeys(notes))  # chief and workers on one GPU: warn once

    def pool(machine: str, gpu: str, count: int, replicas: int) -> dict[str, Any]:
        return {
            "machine_spec": machine_spec(machine, gpu, count),
            "replica_count": replicas,
            "disk_spec": {"boot_disk_type": boot_disk_type, "boot_disk_size_gb": boot_disk_size_gb},
            "container_spec": {
                "image_uri": image_uri,
                "command": list(command),
                "args": list(args),
                "env": pool_env(machine, gpu, count),
            },
        }

    specs = [pool(machine, gpu, count, n) for _, machine, gpu, count, n in pools]
    if reduction_server_count:
        specs.append(reduction_server_pool(reduction_server_count, reduction_server_machine_type, region))
    return specs


def trainer_pools(
    chief_machine_type: str,
    chief_accelerator_type: str,
    chief_accelerator_count: int,
    worker_count: int,
    worker_machine_type: str,
    worker_accelerator_type: str,
    worker_accelerator_count: int,
) -> list[tuple[str, str, str, int, int]]:
    """(role, machine, GPU type, GPU count, replicas) of pool 0 and, with workers, pool 1, as given:
    empty worker settings copy the chief's (not its GPU when the workers name their own machine)."""
    if not worker_machine_type:
        worker_machine_type = chief_machine_type
        worker_accelerator_type = worker_accelerator_type or chief_accelerator_type
        worker_accelerator_count = worker_accelerator_count or chief_accelerator_count
    pools = [("chief", chief_machine_type, chief_accelerator_type, chief_accelerator_count, 1)]
    if worker_count:
        pools.append(
            ("worker", worker_machine_type, worker_accelerator_type, worker_accelerator_count, worker_count)
        )
    return pools


def machine_spec(machine: str, gpu: str, count: int) -> dict[str, Any]:
    """A pool's `machine_spec`: GPUs only with a type (not ACCELERATOR_TYPE_UNSPECIFIED) and a count."""
    spec: dict[str, Any] = {"machine_type": machine}
    if gpu and gpu != "ACCELERATOR_TYPE_UNSPECIFIED" and count:
        spec.update(accelerator_type=gpu, accelerator_count=count)
    return spec


def hardware_parameters() -> tuple:
    """The pipeline parameters that shape the worker pools: the arguments of
    `build_worker_pool_specs` but the job's own (image, command, args), its region and `warnings`."""
    import inspect

    own = ("image_uri", "command", "args", "region", "warnings")
    return tuple(name for name in inspect.signature(build_worker_pool_specs).parameters if name not in own)


HARDWARE_PARAMETERS = hardware_parameters()
