"""Carving: a split the source lacks (validation, test) is taken from train, deterministically
(`carve_plan`: a permutation seeded with --seed). `carve_sizes` is TensorFlow-free:
`python -m trainer.preparation.sourcecheck` applies it up front."""

from __future__ import annotations

from collections.abc import Container
from typing import Any

from trainer.config import SPLITS
from trainer.preparation.prepareconfig import PrepareConfig
from trainer.preparation.source import PrepareError, Source, too_few_classes


def carve_sizes(
    train_count: int, present: Container[str], validation_fraction: float, test_fraction: float
) -> dict[str, int]:
    """How many training images each split the source lacks is carved from (validation, then test);
    PrepareError when that would leave train no image."""
    fractions = {"validation": validation_fraction, "test": test_fraction}
    sizes = {s: max(1, round(train_count * f)) for s, f in fractions.items() if s not in present}
    if sizes and sum(sizes.values()) >= train_count:
        raise PrepareError(
            f"the source's train split has {train_count} images: too few to carve {' and '.join(sizes)} from it"
        )
    return sizes


def carve_plan(source: Source, config: PrepareConfig) -> tuple[dict[str, int], Any, dict[str, str]]:
    """Output split sizes, per train example the output split it goes to, and the carved splits.
    Refuses a source of too few classes or training images, or with an empty split."""
    import numpy as np

    if problem := too_few_classes(config.source, source.class_names):
        raise PrepareError(problem)
    n_train = source.splits["train"].count
    sizes = carve_sizes(n_train, source.splits, config.validation_fraction, config.test_fraction)
    assignment = np.zeros(n_train, dtype=np.int8)  # index into SPLITS
    order = np.random.default_rng(config.seed).permutation(n_train)
    start = 0
    for split, take in sizes.items():
        assignment[order[start : start + take]] = SPLITS.index(split)
        start += take
    counts = {s: int(n) for s, n in zip(SPLITS, np.bincount(assignment, minlength=len(SPLITS)), strict=True)}
    counts.update({s: source.splits[s].count for s in source.splits if s != "train"})
    for split, n in counts.items():
        if n == 0:
            raise PrepareError(f"split {split!r} of --source {config.source} has no images")
    return counts, assignment, dict.fromkeys(sizes, "train")
