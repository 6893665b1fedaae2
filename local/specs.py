"""What Vertex accepts of a job's worker pool specs, checked before the local job runner starts
anything: each pool parses into the real `aiplatform_v1.WorkerPoolSpec` (`check_worker_pool_specs`).

Each pool's `container_spec.env` (aiplatform_v1 `EnvVar{name, value}`; the trainer pools carry
their GPU request there, `TRAINER_POOL_*`) reaches its replicas as Vertex passes it to the
container, less what `container_env` refuses before anything starts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any


def check_worker_pool_specs(specs: Sequence[Mapping[str, Any]]) -> None:
    """Each pool must parse into the real `aiplatform_v1.WorkerPoolSpec`, unknown fields refused,
    as the GCPC launcher's `CustomJob` would have to (a misspelt field, an unknown accelerator, a
    fractional count). An empty pool is allowed (Vertex: "{}" keeps a pool's place)."""
    from google.cloud import aiplatform_v1
    from google.protobuf import json_format

    problems = []
    for index, spec in enumerate(specs):
        if not spec:
            continue
        try:
            json_format.ParseDict(dict(spec), aiplatform_v1.WorkerPoolSpec.pb(aiplatform_v1.WorkerPoolSpec()))
        except json_format.ParseError as err:
            problems.append(f"pool {index}: {err}")
    if problems:
        raise ValueError("worker_pool_specs would be refused by Vertex AI: " + "; ".join(problems))


# Variables Vertex sets in every container (docs/contracts.md, section 2): a pool's env may not
# name them (what would the replica see? Vertex does not say), here refused.
RESERVED_ENV = ("TF_CONFIG", "CLUSTER_SPEC")
RESERVED_ENV_PREFIXES = ("AIP_", "CLOUD_ML_")


def container_env(pool: int, container: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """A pool's `container_spec.env` as (name, value) pairs; raises ValueError naming what Vertex
    would set itself or what this runner cannot reproduce. Vertex's `EnvVar.name` "must be a valid C
    identifier", and a value's `$(VAR_NAME)` references are expanded (aiplatform_v1 `EnvVar`)."""
    pairs: list[tuple[str, str]] = []
    problems: list[str] = []
    for item in container.get("env", []) or []:
        name, value = str(item.get("name", "")), str(item.get("value", ""))
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            problems.append(f"{name!r} is not a C identifier (aiplatform_v1 EnvVar.name)")
        elif name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIXES):
            problems.append(
                f"{name} is set by Vertex AI itself (names {', '.join(RESERVED_ENV)} and "
                f"{', '.join(p + '*' for p in RESERVED_ENV_PREFIXES)} are reserved)"
            )
        elif "$(" in value.replace("$$(", ""):
            problems.append(
                f"{name}={value!r}: Vertex AI expands $(VAR_NAME) references, the local runner does not"
            )
        pairs.append((name, value))
    if problems:
        raise ValueError(f"pool {pool} container_spec.env: " + "; ".join(problems))
    return tuple(pairs)
