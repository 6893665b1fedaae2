"""What every option module shares: a parameter's row (`Parameter`), a problem (`Problem`, naming
its parameters), the error that lists them all (`OptionsError`), and two readings of values."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

TARGETS = ("vertex", "local")
# The compiled default of a parameter the submitter must give (no default in the template).
REQUIRED = object()


@dataclasses.dataclass(frozen=True)
class Parameter:
    """One pipeline parameter. `default` is the compiled (Vertex) default (`REQUIRED`: none);
    `choices` the only values allowed (case matters), `bounds` the (lowest, highest) number
    allowed (`math.inf`: no highest; a whole number for an `int` row): `check` applies them."""

    name: str
    type: type
    default: Any
    help: str
    local: Any = None
    targets: tuple[str, ...] = TARGETS
    choices: tuple[str, ...] = ()
    bounds: tuple[float, float] | None = None

    def default_for(self, target: str) -> Any:
        return self.local if target == "local" and self.local is not None else self.default


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


def duration_seconds(text: Any) -> float | None:
    """A Vertex duration ("3600s", "1.5s": protobuf Duration's JSON form) in seconds, or None."""
    match = DURATION.match(str(text).strip()) if isinstance(text, str) else None
    return float(match.group(1) + (match.group(2) or "")) if match else None


def dot_folders(uri: str) -> bool:
    """Whether a gs:// folder's path holds an empty, . or .. folder: the trainer writes such object
    names as given (tf.io.gfile), the steps read them through the /gcs/ mount, where the kernel
    resolves them to another place (model_root, PIPELINE_ROOT)."""
    return any(s in ("", ".", "..") for s in uri.removeprefix("gs://").rstrip("/").split("/")[1:])


def whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def replicas(values: Mapping[str, Any]) -> int:
    """Training replicas: the chief and `worker_count` workers (a bad count is another rule's problem)."""
    workers = values.get("worker_count", 0)
    return 1 + (workers if whole(workers) else 0)


DURATION = re.compile(r"^([0-9]{1,12})(\.[0-9]{1,9})?s$")
