"""Metrics that tell the truth on imbalanced data, from the test confusion matrix.

`matrix[true][predicted]` counts (metrics.json's `confusion_matrix`). Per class: precision,
recall, F1 and support; `macro_f1` is the unweighted mean F1 over the classes with support: on
cassava, mostly one class, a model that always answers it has a high accuracy and a low macro F1.
A zero denominator gives 0 (scikit-learn's `zero_division=0`). No TensorFlow.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def per_class(matrix: Sequence[Sequence[int]], class_names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """{class name: {precision, recall, f1, support}} from `matrix[true][predicted]`."""
    k = len(class_names)
    if len(matrix) != k or any(len(row) != k for row in matrix):
        raise ValueError(f"the confusion matrix must be {k} x {k} for {k} classes")
    out: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(class_names):
        true_positive = int(matrix[i][i])
        support = sum(int(c) for c in matrix[i])
        predicted = sum(int(matrix[r][i]) for r in range(k))
        precision = true_positive / predicted if predicted else 0.0
        recall = true_positive / support if support else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        out[str(name)] = {"precision": precision, "recall": recall, "f1": f1, "support": support}
    return out


def macro_f1(classes: dict[str, dict[str, Any]]) -> float:
    """The mean F1 over the classes that have test images (a class absent from the test split
    would otherwise count as a 0 no model could avoid)."""
    present = [c["f1"] for c in classes.values() if c["support"]]
    return sum(present) / len(present) if present else 0.0
