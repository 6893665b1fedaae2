"""What a dataset source gives preparation (`Source`: class names and, per split, a dataset of
(uint8 image, label) pairs), and the refusals every kind of source shares (`PrepareError`).
TensorFlow-free, for the folder listing `python -m trainer.preparation.sourcecheck` runs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

MIN_CLASSES = 2
# Problems shown in a refusal; the rest are counted.
MAX_PROBLEMS_SHOWN = 20


class PrepareError(ValueError):
    """Bad input found while preparing: the message names what is wrong and what is allowed."""


@dataclasses.dataclass
class SourceSplit:
    """One split of a source: its size and a function giving (uint8 image, label) pairs."""

    count: int
    dataset: Callable[[], Any]  # () -> tf.data.Dataset of (uint8 [H, W, 3], int64)
    find_bad_input: Callable[[], str | None] = lambda: None
    # How a Beam worker opens the split (`trainer.preparation.beamprep.split_subset`): {"kind":
    # "files", "paths", "labels"} or {"kind": "tfds", "dir", "split", "image_key", "label_key"}.
    spec: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Source:
    class_names: list[str]
    splits: dict[str, SourceSplit]
    info: dict[str, Any]


def shown(problems: Sequence[str], limit: int = MAX_PROBLEMS_SHOWN) -> list[str]:
    """The first `limit` of `problems`, then a line counting the rest."""
    more = len(problems) - limit
    return [*problems[:limit], *([f"... and {more} more like these"] if more > 0 else [])]


def too_few_classes(source: str, found: Sequence[str]) -> str | None:
    """The refusal of a source with fewer than MIN_CLASSES classes (None: it has enough)."""
    if len(found) >= MIN_CLASSES:
        return None
    layout = " (one folder per class under train/)" if source.startswith("folder:") else ""
    return (
        f"--source {source} has {len(found)} class(es) {list(found)}: a classifier needs at least "
        f"{MIN_CLASSES}{layout}; with one, every prediction is right and its test accuracy (1.0) "
        "means nothing"
    )
