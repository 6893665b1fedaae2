"""Who am I in the cluster, and which distribution strategy to build.

`TF_CONFIG` as Vertex AI writes it: pool 0 is the `chief`, pool 1 the `worker`s, pool 2 `ps`
("The format of TF_CONFIG": pool 2 is "Parameter servers, Reduction Server";
https://cloud.google.com/vertex-ai/docs/training/distributed-training); without it, one machine.

The strategy spans the chief and workers only: with `ps` in its cluster, TensorFlow 2.21's
MultiWorkerMirroredStrategy makes `ps` task 0 its coordination service's leader
(`multi_worker_util.coordination_leader`), and a Reduction Server replica is no TensorFlow server,
so every replica would wait forever (docs/architecture.md#reduction-server).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from trainer.config import GpuRequest

if TYPE_CHECKING:
    import tensorflow as tf

TRAINING_TASK_TYPES = ("chief", "worker")
GPUS_MISSING_EXIT_CODE = 3
"""Exit status of a replica that sees fewer GPUs than its worker pool asked for (`check_gpus`),
before any training: not 1 (a failure with a traceback), 2 (bad flags) or 143 (SIGTERM)."""


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    """This process's place in the cluster (`task_type` None: a single machine)."""

    task_type: str | None = None
    task_index: int = 0
    training_cluster: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict, hash=False)
    other_task_types: tuple[str, ...] = ()

    @property
    def is_chief(self) -> bool:
        """Who writes final artifacts: the chief, else worker 0, or a single machine."""
        if self.task_type is None or self.task_type == "chief":
            return True
        return self.task_type == "worker" and self.task_index == 0 and "chief" not in self.training_cluster

    @property
    def num_workers(self) -> int:
        """The machines that train together (a cluster of one is a single machine)."""
        return max(1, sum(len(addresses) for addresses in self.training_cluster.values()))

    @property
    def is_multi_worker(self) -> bool:
        return self.num_workers > 1

    @property
    def name(self) -> str:
        return "single" if self.task_type is None else f"{self.task_type}-{self.task_index}"


def cluster_from_tf_config(tf_config: str | Mapping[str, Any] | None) -> ClusterInfo:
    """Parses `TF_CONFIG` (its JSON text or the decoded mapping; empty/None: one machine)."""
    if tf_config is None or (isinstance(tf_config, str) and not tf_config.strip()):
        return ClusterInfo()
    try:
        conf = json.loads(tf_config) if isinstance(tf_config, str) else dict(tf_config)
    except json.JSONDecodeError as e:
        raise ValueError(f"TF_CONFIG is not valid JSON: {e}") from None
    cluster = conf.get("cluster") or {}
    task = conf.get("task") or {}
    if not cluster:
        return ClusterInfo()
    unknown = sorted(set(cluster) - {*TRAINING_TASK_TYPES, "ps", "evaluator"})
    if unknown:
        raise ValueError(f"TF_CONFIG cluster has unknown task types {unknown}")
    task_type = task.get("type")
    if task_type not in TRAINING_TASK_TYPES:
        raise ValueError(
            f"TF_CONFIG task type {task_type!r} cannot run this trainer; allowed: "
            f"{', '.join(TRAINING_TASK_TYPES)} (parameter servers and evaluators are not used "
            "with MultiWorkerMirroredStrategy)"
        )
    try:
        index = int(task.get("index", 0))
    except (TypeError, ValueError):
        raise ValueError(f"TF_CONFIG task index must be an integer, got {task.get('index')!r}") from None
    members = cluster.get(task_type) or []
    if not 0 <= index < len(members):
        raise ValueError(
            f"TF_CONFIG task {task_type}:{index} is not in the cluster's {len(members)} "
            f"{task_type} address(es)"
        )
    return ClusterInfo(
        task_type=task_type,
        task_index=index,
        training_cluster={t: tuple(cluster[t]) for t in TRAINING_TASK_TYPES if cluster.get(t)},
        other_task_types=tuple(sorted(t for t in cluster if t not in TRAINING_TASK_TYPES and cluster[t])),
    )


def create_strategy(cluster: ClusterInfo) -> tf.distribute.Strategy:
    """MultiWorkerMirroredStrategy over `cluster.training_cluster` for several machines, else
    MirroredStrategy; before any other TensorFlow op. All-reduce: NCCL on GPUs (Reduction
    Server's plugin is an NCCL transport), TensorFlow's ring on CPUs."""
    from trainer._tf import tf

    gpus = tf.config.list_physical_devices("GPU")
    if cluster.is_multi_worker:
        implementations = tf.distribute.experimental.CommunicationImplementation
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=implementations.NCCL if gpus else implementations.RING
        )
        if cluster.other_task_types:
            from trainer.callbacks import log

            log(
                cluster.name,
                f"TF_CONFIG also lists {', '.join(cluster.other_task_types)}, not training tasks "
                "(on Vertex, worker pool 2 is `ps`: Reduction Server replicas or parameter "
                "servers); the strategy spans the chief and the workers only",
            )
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec({t: list(a) for t, a in cluster.training_cluster.items()}),
            task_type=cluster.task_type,
            task_id=cluster.task_index,
            # What TFConfigClusterResolver would find: this machine's GPUs (physical: listing
            # logical devices would start TensorFlow's runtime before the collectives are set).
            num_accelerators={"GPU": len(gpus)} if gpus else None,
            rpc_layer="grpc",
        )
        return tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=resolver, communication_options=options
        )
    # Also for one device: BackupAndRestore supports MirroredStrategy, not OneDeviceStrategy.
    return tf.distribute.MirroredStrategy()


# --- the GPUs asked for and the GPUs seen --------------------------------------------------


class GpusMissing(RuntimeError):
    """This replica sees fewer GPUs than its worker pool asked for; the message is one line."""


def pool_and_role(cluster: ClusterInfo) -> tuple[str, str]:
    """Vertex's name of this replica's worker pool and its task type (a single machine: the chief's)."""
    return ("workerpool1", "worker") if cluster.task_type == "worker" else ("workerpool0", "chief")


def gpu_shortfall(
    pool: str,
    role: str,
    request: GpuRequest,
    gpus: int,
    devices: Sequence[str],
    seen_by: str,
    detail: str = "",
) -> str | None:
    """None when `gpus` (what `seen_by` sees) covers what the pool asked for, else the one line
    saying so (`local.gpus` words it the same: tests/local/test_jobs_gpus.py)."""
    asked = request.accelerator_count
    if gpus >= asked:
        return None
    seen = ", ".join(devices) or "none"
    return (
        f"GPU check failed: {pool} ({role}) asked for {asked} x {request.accelerator_type} on "
        f"{request.machine_type}, but {seen_by} sees {gpus} GPU{'' if gpus == 1 else 's'} "
        f"(devices: {seen}{'; ' + detail if detail else ''}); refusing to train on CPU "
        "(docs/vertex.md#no-silent-cpu-training)"
    )


def visible_devices() -> tuple[int, list[str], str]:
    """The GPUs TensorFlow sees, every physical device's name (`CPU:0`, `GPU:0`, ...) and its
    build (`describe_build`), without starting TensorFlow's runtime."""
    from trainer._tf import tf

    devices = tf.config.list_physical_devices()
    gpus = sum(1 for d in devices if d.device_type == "GPU")
    names = [d.name.removeprefix("/physical_device:") for d in devices]
    return gpus, names, describe_build(tf.__version__, tf.sysconfig.get_build_info())


def describe_build(version: str, info: Mapping[str, Any]) -> str:
    """`TensorFlow 2.21.0 built with CUDA 12.5.1, cuDNN 9`, from `tf.sysconfig.get_build_info()`."""
    if not info.get("is_cuda_build"):
        return f"TensorFlow {version} built without CUDA"
    return f"TensorFlow {version} built with CUDA {info.get('cuda_version', '?')}, cuDNN {info.get('cudnn_version', '?')}"


def driver_versions() -> str:
    """The NVIDIA driver this machine runs and the newest CUDA it supports (`cuDriverGetVersion`
    of libcuda.so.1), e.g. `NVIDIA driver 550.54.15, CUDA 12.4`; "" without one. PTX (TF 2.21's
    only H100/H200 kernels, and XLA) needs a driver at least as new as the toolkit (CUDA's
    compatibility guide), and Vertex publishes no driver version: the log says it."""
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return ""
    number = ctypes.c_int(0)
    supports = (
        f"CUDA {number.value // 1000}.{number.value % 1000 // 10}"
        if cuda.cuDriverGetVersion(ctypes.byref(number)) == 0
        else "CUDA unknown"
    )
    try:
        with open("/proc/driver/nvidia/version") as f:  # "NVRM version: NVIDIA UNIX ... 550.54.15  ..."
            version = next((w for w in f.readline().split() if w[:1].isdigit() and "." in w), "unknown")
    except OSError:
        version = "unknown"
    return f"NVIDIA driver {version}, {supports}"


def check_gpus(request: GpuRequest, cluster: ClusterInfo) -> str:
    """Before the strategy: raises GpusMissing when TensorFlow sees fewer GPUs than the pool asked
    for; else returns a line saying what was asked and what is seen."""
    pool, role = pool_and_role(cluster)
    gpus, names, build = visible_devices()
    problem = gpu_shortfall(pool, role, request, gpus, names, "TensorFlow", build)
    if problem:
        raise GpusMissing(problem)
    asked = (
        f"{request.accelerator_count} x {request.accelerator_type}" if request.accelerator_count else "no GPU"
    )
    driver = driver_versions() if gpus else ""
    return (
        f"{pool} ({role}) asked for {asked} on {request.machine_type}; TensorFlow sees "
        f"{gpus} GPU{'' if gpus == 1 else 's'} (devices: {', '.join(names) or 'none'}; {build}"
        + (f"; {driver})" if driver else ")")
    )
