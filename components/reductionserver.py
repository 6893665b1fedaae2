"""Reduction Server (an extra): worker pool 2 of a training job, its rules and Google's reducer image.

`components.worker_pools` adds the pool when `reduction_server_count` > 0; the chief and workers
then run the trainer image's `reduction-server` stage (Dockerfile; built by `components.image`),
which adds Google's NCCL plugin (docs/architecture.md#reduction-server).
"""

from typing import Any

from components.hardware import validate_machine
from components.stepimage import multi_region


def reduction_server_problems(
    machine_type: str, chief_gpu: bool, worker_count: int, worker_gpu: bool
) -> list[str]:
    """What is wrong with a Reduction Server pool of `machine_type` beside these trainer pools,
    one line each, starting with the parameter's name. Vertex AI's "Distributed training"
    (Reduction Server): for "distributed training with GPU workers" using "NCCL all-reduce"; the
    trainer picks NCCL from each machine's own GPUs, so a CPU chief beside GPU workers would run
    mismatched all-reduces."""
    problems = []
    if not worker_count or not worker_gpu:
        problems.append(
            "reduction_server_count: a Reduction Server pool needs GPU workers (worker_count > 0 "
            "with accelerators)"
        )
    if not chief_gpu:
        problems.append(
            "reduction_server_count: a Reduction Server pool needs a GPU chief too (NCCL all-reduce)"
        )
    try:
        validate_machine(machine_type, "", 0, None)
    except ValueError as err:
        problems.append(f"reduction_server_machine_type: {err}")
    return problems


def reduction_server_pool(count: int, machine_type: str, region: str) -> dict[str, Any]:
    """Worker pool 2: `count` reducers of `machine_type`, Google's image, no GPU and no env.

    Google publishes the reducer in the us, europe and asia multi-regions: "choosing the
    multi-region closest to where you are performing training might reduce latency"."""
    image = (
        f"{multi_region(region or 'us')}-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest"
    )
    return {
        "machine_spec": {"machine_type": machine_type},
        "replica_count": count,
        "container_spec": {"image_uri": image},
    }
