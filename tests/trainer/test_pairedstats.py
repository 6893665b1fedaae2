"""Paired statistics of the gate (trainer.pairedstats), against values known by hand: the exact
McNemar p-value is a binomial tail, a paired bootstrap of identical models is exactly 0, and
its interval's width follows the paired difference's standard error."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from trainer import contract, metrics, pairedstats


@pytest.mark.parametrize(
    ("b", "c", "p"),
    [
        (1, 0, 1.0),  # one discordant example: nothing can be said
        (0, 0, 1.0),  # no discordant example
        (10, 0, 2 * 0.5**10),
        (0, 10, 2 * 0.5**10),  # two-sided: symmetric
        (9, 2, 2 * (1 + 11 + 55) / 2**11),
        (2, 8, 2 * (1 + 10 + 45) / 2**10),
        (5, 5, 1.0),  # twice the tail is over 1: capped
    ],
)
def test_mcnemar_exact_by_hand(b: int, c: int, p: float) -> None:
    assert pairedstats.mcnemar_exact(b, c) == pytest.approx(p, rel=1e-12)


def test_mcnemar_exact_on_many_discordant_pairs_is_the_exact_binomial_tail() -> None:
    b, c = 300, 360
    tail = sum(Fraction(math.comb(b + c, i), 2 ** (b + c)) for i in range(min(b, c) + 1))
    assert pairedstats.mcnemar_exact(b, c) == pytest.approx(float(2 * tail), rel=1e-12)
    assert 0.01 < pairedstats.mcnemar_exact(b, c) < 0.05
    assert pairedstats.mcnemar_exact(20_000, 20_000) == 1.0  # fast and exact on a large split
    assert pairedstats.mcnemar_exact(0, 5_000) == 0.0  # below the smallest float: 0


def test_mcnemar_refuses_negative_counts() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        pairedstats.mcnemar_exact(-1, 3)


def test_identical_predictions_differ_by_exactly_zero() -> None:
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 4, 500)
    predicted = np.where(rng.random(500) < 0.7, labels, rng.integers(0, 4, 500))
    out = pairedstats.compare(labels, predicted, predicted, 4)
    for name in ("accuracy", "macro_f1"):
        assert out[name]["difference"] == 0.0 and out[name]["ci95"] == [0.0, 0.0]
        assert out[name]["challenger"] == out[name]["champion"]
    assert out["mcnemar"] == {"b": 0, "c": 0, "p_value": 1.0}


def test_a_challenger_right_where_the_champion_is_wrong_everywhere() -> None:
    labels = np.array([0, 1, 2, 0, 1, 2] * 10)
    out = pairedstats.compare(labels, labels, (labels + 1) % 3, 3)
    assert out["accuracy"] == {"challenger": 1.0, "champion": 0.0, "difference": 1.0, "ci95": [1.0, 1.0]}
    assert out["macro_f1"]["difference"] == 1.0 and out["macro_f1"]["ci95"] == [1.0, 1.0]
    assert out["mcnemar"] == {"b": 60, "c": 0, "p_value": 2 * 0.5**60}


def test_the_figures_are_the_models_own_and_the_counts_are_the_discordant_pairs() -> None:
    labels = np.array([0, 0, 0, 1, 1, 2, 2, 2])
    new = np.array([0, 0, 1, 1, 1, 2, 0, 2])  # 6 right
    old = np.array([0, 1, 1, 1, 0, 2, 2, 0])  # 4 right
    out = pairedstats.compare(labels, new, old, 3)
    assert out["examples"] == 8
    assert out["accuracy"]["challenger"] == 6 / 8 and out["accuracy"]["champion"] == 4 / 8
    assert out["accuracy"]["difference"] == pytest.approx(2 / 8)
    # only the challenger right: examples 1, 4, 7; only the champion: example 6
    assert out["mcnemar"]["b"] == 3 and out["mcnemar"]["c"] == 1
    assert out["mcnemar"]["p_value"] == pytest.approx(2 * (1 + 4) / 2**4)
    for model, predicted in (("challenger", new), ("champion", old)):
        matrix = np.zeros((3, 3), int)
        np.add.at(matrix, (labels, predicted), 1)
        by_metrics = metrics.macro_f1(metrics.per_class(matrix.tolist(), ["a", "b", "c"]))
        assert out["macro_f1"][model] == pytest.approx(by_metrics)
    low, high = out["accuracy"]["ci95"]
    assert low <= out["accuracy"]["difference"] <= high


def test_the_macro_f1_of_a_matrix_is_trainer_metrics_rule() -> None:
    matrix = [[50, 5, 0], [10, 8, 2], [0, 0, 0]]  # tests/trainer/test_metrics.py's, a class absent
    expected = metrics.macro_f1(metrics.per_class(matrix, ["healthy", "mosaic", "blight"]))
    assert pairedstats.macro_f1_from_matrix(np.array(matrix)) == pytest.approx(expected)


def test_the_interval_width_follows_the_paired_standard_error() -> None:
    """2,000 examples, b = 200 only the challenger right, c = 150 only the champion: the paired
    difference's standard error is sqrt((b + c) / n**2 - (b - c)**2 / n**3); a 95% interval is
    about 2 x 1.96 of it wide, around (b - c) / n."""
    n, b, c = 2000, 200, 150
    labels = np.zeros(n, int)
    new, old = np.zeros(n, int), np.zeros(n, int)
    new[:150], old[:150] = 1, 1  # both wrong
    new[150 : 150 + c] = 1  # only the champion right
    old[150 + c : 150 + c + b] = 1  # only the challenger right
    out = pairedstats.compare(labels, new, old, 2)
    assert (out["mcnemar"]["b"], out["mcnemar"]["c"]) == (b, c)
    se = math.sqrt((b + c) / n**2 - (b - c) ** 2 / n**3)
    low, high = out["accuracy"]["ci95"]
    assert (high - low) == pytest.approx(2 * 1.96 * se, rel=0.1)
    assert (low + high) / 2 == pytest.approx((b - c) / n, abs=0.2 * se)


def test_a_fixed_seed_gives_the_same_interval_and_the_documented_resamples() -> None:
    rng = np.random.default_rng(7)
    labels = rng.integers(0, 3, 300)
    new = np.where(rng.random(300) < 0.8, labels, 0)
    old = np.where(rng.random(300) < 0.7, labels, 1)
    first, again = pairedstats.compare(labels, new, old, 3), pairedstats.compare(labels, new, old, 3)
    assert first == again
    assert first["bootstrap"] == {"resamples": 2000, "seed": 0, "confidence": 0.95, "interval": "percentile"}
    other = pairedstats.compare(labels, new, old, 3, seed=1)
    assert other["accuracy"]["ci95"] != first["accuracy"]["ci95"]  # the seed is what fixes it


def test_the_comparison_has_exactly_the_declared_keys() -> None:
    out = pairedstats.compare([0, 1, 1], [0, 1, 0], [1, 1, 0], 2, resamples=50)
    assert sorted(out) == sorted(contract.EVALUATION_COMPARISON_KEYS)
    for name in ("accuracy", "macro_f1"):
        assert sorted(out[name]) == sorted(contract.EVALUATION_DIFFERENCE_KEYS)
    assert sorted(out["mcnemar"]) == sorted(contract.EVALUATION_MCNEMAR_KEYS)
    assert sorted(out["bootstrap"]) == sorted(contract.EVALUATION_BOOTSTRAP_KEYS)
    line = pairedstats.describe(out)
    assert line.startswith("challenger - champion on 3 examples: accuracy +0.3333 (95% CI ")
    assert "exact McNemar p=1 (challenger alone right 1, champion alone right 0)" in line


@pytest.mark.parametrize(
    ("labels", "new", "old", "message"),
    [
        ([0, 1], [0], [0, 1], "one prediction of each model per label"),
        ([0, 2], [0, 1], [0, 1], "class indices below 2"),
        ([0, 1], [0, -1], [0, 1], "class indices below 2"),
        ([], [], [], "no examples"),
    ],
)
def test_bad_inputs_are_refused(labels: list, new: list, old: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        pairedstats.compare(labels, new, old, 2)
