"""Who am I in the cluster, and which distribution strategy to build.

The cluster comes from `TF_CONFIG` as Vertex AI writes it: worker pool 0 is the `chief`
(exactly one replica), pool 1 the `worker`s. Without `TF_CONFIG` this process is a whole
single-machine job. The parsing and the chief rule need no TensorFlow; `create_strategy` does.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import tensorflow as tf

TRAINING_TASK_TYPES = ("chief", "worker")


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    """This process's place in the training cluster.

    Attributes:
      task_type: "chief", "worker", or None for a single machine without TF_CONFIG.
      task_index: index within the task type (0 for a single machine).
      num_workers: machines that train together (chief + workers; 1 for a single machine).
      has_chief_task: whether the cluster has a `chief` entry (Vertex's layout).
    """

    task_type: str | None = None
    task_index: int = 0
    num_workers: int = 1
    has_chief_task: bool = False

    @property
    def is_chief(self) -> bool:
        """The one rule for who writes final artifacts.

        - Vertex's layout: the `chief` task.
        - A cluster without a chief entry: worker 0.
        - A single machine (no TF_CONFIG, or a cluster of one): it is the chief.
        """
        if self.task_type is None or self.task_type == "chief":
            return True
        return self.task_type == "worker" and self.task_index == 0 and not self.has_chief_task

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
    num_workers = sum(len(cluster.get(t) or []) for t in TRAINING_TASK_TYPES)
    return ClusterInfo(
        task_type=task_type,
        task_index=index,
        num_workers=num_workers,  # a cluster of one is a single machine: it waits for no peer
        has_chief_task=bool(cluster.get("chief")),
    )


def create_strategy(cluster: ClusterInfo) -> tf.distribute.Strategy:
    """MultiWorkerMirroredStrategy for a cluster of several machines, else MirroredStrategy
    over all of this machine's GPUs (or its CPU). Must run before any other TensorFlow op."""
    from trainer._tf import tf

    gpus = tf.config.list_physical_devices("GPU")
    if cluster.is_multi_worker:
        implementation = (
            tf.distribute.experimental.CommunicationImplementation.NCCL
            if gpus
            else tf.distribute.experimental.CommunicationImplementation.RING
        )
        return tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(
                implementation=implementation
            )
        )
    # Also for one device: BackupAndRestore supports MirroredStrategy, not OneDeviceStrategy.
    return tf.distribute.MirroredStrategy()
