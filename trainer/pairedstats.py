"""Paired statistics of two models on the same examples: is the challenger better than the
champion, or only lucky on this test split?

Both models answer every example of one split, so their figures are paired: only the model
differs. `compare` gives, for accuracy and macro F1 (`trainer.metrics`' rule in every resample),
the difference challenger - champion with a 95% paired-bootstrap interval (seeded: the same
predictions give the same interval on every run), and the exact McNemar test of the accuracies.
numpy only, no TensorFlow (evaluation.json's `comparison`, trainer.contract.EVALUATION_COMPARISON_KEYS).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike

BOOTSTRAP_RESAMPLES = 2000
"""Resamples of the paired bootstrap: each end of the interval moves by about 0.05 of the
difference's standard error from one seed to another (sqrt(0.025 x 0.975 / 2000) / phi(1.96)),
small beside the interval, about 4 standard errors wide; a 20,000-image split takes about 3 s."""
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95


def mcnemar_exact(b: int, c: int) -> float:
    """The two-sided exact McNemar p-value: under "both models are as accurate", each of the
    b + c discordant examples (one model right, the other wrong) is the challenger's with
    probability 1/2, so the p-value is twice the binomial tail of min(b, c) among b + c, at most 1.
    No discordant example: 1.0 (2 x 1 / 1, capped). Exact, in integers (no normal approximation)."""
    if b < 0 or c < 0:
        raise ValueError(f"discordant counts must be whole and non-negative, got b={b}, c={c}")
    n, k = b + c, min(b, c)
    term, tail = 1, 1  # comb(n, 0); the sum of comb(n, i) for i <= k
    for i in range(k):
        term = term * (n - i) // (i + 1)
        tail += term
    return min(1.0, 2 * tail / 2**n)


def macro_f1_from_matrix(matrix: np.ndarray) -> float:
    """`trainer.metrics.macro_f1` of a confusion matrix `matrix[true][predicted]`: the mean F1 over
    the classes with support (a precision or recall with a zero denominator is 0)."""
    m = np.asarray(matrix, dtype=np.float64)
    tp = np.diag(m)
    support, predicted = m.sum(axis=1), m.sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        precision = np.where(predicted > 0, tp / predicted, 0.0)
        recall = np.where(support > 0, tp / support, 0.0)
        f1 = np.where(precision + recall > 0, 2 * precision * recall / (precision + recall), 0.0)
    present = support > 0
    return float(f1[present].mean()) if present.any() else 0.0


def _confusion(
    labels: np.ndarray, predicted: np.ndarray, k: int, weights: np.ndarray | None = None
) -> np.ndarray:
    counts = np.bincount(labels * k + predicted, weights=weights, minlength=k * k)
    return counts.reshape(k, k)


def paired_bootstrap(
    y: np.ndarray, a: np.ndarray, b: np.ndarray, k: int, resamples: int, seed: int
) -> dict[str, list[float]]:
    """{"accuracy": [low, high], "macro_f1": [low, high]}: CONFIDENCE percentile intervals of the
    difference challenger `a` - champion `b` over `resamples` paired resamples of the examples
    (each draws len(y) examples with replacement, the same ones for both models)."""
    n = len(y)
    right_a, right_b = a == y, b == y
    rng = np.random.default_rng(seed)
    accuracy, macro = np.empty(resamples), np.empty(resamples)
    for r in range(resamples):
        # How many times each example is drawn: one resample, as weights (the same for both models).
        w = np.bincount(rng.integers(0, n, n), minlength=n).astype(np.float64)
        accuracy[r] = (w @ right_a - w @ right_b) / n
        macro[r] = macro_f1_from_matrix(_confusion(y, a, k, w)) - macro_f1_from_matrix(_confusion(y, b, k, w))
    tail = (1 - CONFIDENCE) / 2 * 100
    return {
        name: [float(v) for v in np.percentile(values, [tail, 100 - tail])]
        for name, values in (("accuracy", accuracy), ("macro_f1", macro))
    }


def compare(
    labels: ArrayLike,
    challenger: ArrayLike,
    champion: ArrayLike,
    num_classes: int,
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> dict[str, Any]:
    """evaluation.json's `comparison` (trainer.contract.EVALUATION_COMPARISON_KEYS) from the true
    labels and each model's predicted class, example by example, in the same order."""
    y, a, b = (np.asarray(v, dtype=np.int64) for v in (labels, challenger, champion))
    if not len(y) == len(a) == len(b):
        raise ValueError(f"expected one prediction of each model per label, got {len(y)}, {len(a)}, {len(b)}")
    if not len(y):
        raise ValueError("no examples to compare the models on")
    if min(y.min(), a.min(), b.min()) < 0 or max(y.max(), a.max(), b.max()) >= num_classes:
        raise ValueError(f"labels and predictions must be class indices below {num_classes}")
    k = num_classes
    right_a, right_b = a == y, b == y
    figures = {
        "accuracy": (float(right_a.mean()), float(right_b.mean())),
        "macro_f1": (
            macro_f1_from_matrix(_confusion(y, a, k)),
            macro_f1_from_matrix(_confusion(y, b, k)),
        ),
    }
    intervals = paired_bootstrap(y, a, b, k, resamples, seed)
    only_challenger, only_champion = int(np.sum(right_a & ~right_b)), int(np.sum(~right_a & right_b))
    out: dict[str, Any] = {"examples": len(y)}
    for name, (new, old) in figures.items():
        out[name] = {"challenger": new, "champion": old, "difference": new - old, "ci95": intervals[name]}
    out["mcnemar"] = {
        "b": only_challenger,
        "c": only_champion,
        "p_value": mcnemar_exact(only_challenger, only_champion),
    }
    out["bootstrap"] = {
        "resamples": resamples,
        "seed": seed,
        "confidence": CONFIDENCE,
        "interval": "percentile",
    }
    return out


def describe(comparison: dict[str, Any]) -> str:
    """One line for the job's log."""

    def figure(name: str, label: str) -> str:
        f = comparison[name]
        low, high = f["ci95"]
        return f"{label} {f['difference']:+.4f} (95% CI {low:+.4f} to {high:+.4f})"

    m = comparison["mcnemar"]
    return (
        f"challenger - champion on {comparison['examples']} examples: {figure('accuracy', 'accuracy')}, "
        f"{figure('macro_f1', 'macro F1')}; exact McNemar p={m['p_value']:.4g} "
        f"(challenger alone right {m['b']}, champion alone right {m['c']})"
    )
