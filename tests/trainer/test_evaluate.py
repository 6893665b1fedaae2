"""`python -m trainer.evaluate`: the gate's like-for-like evaluation of the new model and the
champion on this run's test split, each through its serving signature.

The models are stand-ins whose answers are known without training: a SavedModel exported by
`trainer.export` around a network that always answers one class. Its figures on a split follow
from the split's class counts alone (accuracy = the share of that class, one column of the
confusion matrix), so every number below is computed by hand from metadata.json.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import ROOT, trainer_env
from trainer import evaluate, metrics, pairedstats
from trainer.contract import EVALUATION_COMPARISON_KEYS, EVALUATION_KEYS, EVALUATION_MODEL_KEYS


def constant_model(folder: Path, answer: int, classes: list[str], size: int, recorded: dict) -> Path:
    """A SavedModel (trainer.export's serving signature) that answers class `answer` for every
    image of `size` pixels, with a metrics.json recording `recorded` (its own figures)."""
    from trainer import export
    from trainer._tf import keras

    inputs = keras.Input((size, size, 3), dtype="uint8")
    x = keras.layers.GlobalAveragePooling2D()(keras.layers.Rescaling(1 / 255)(inputs))
    bias = [10.0 if i == answer else 0.0 for i in range(len(classes))]
    out = keras.layers.Dense(
        len(classes),
        "softmax",
        kernel_initializer="zeros",
        bias_initializer=keras.initializers.Constant(bias),
    )(x)
    export.save(keras.Model(inputs, out), str(folder), classes, size)
    (folder / "metrics.json").write_text(json.dumps({"class_names": classes, **recorded}))
    return folder


@pytest.fixture(scope="module")
def dataset(synthetic_dir: Path) -> dict:
    return json.loads((synthetic_dir / "metadata.json").read_text())


def test_both_models_are_evaluated_as_served_on_this_splits_images(
    synthetic_dir: Path, dataset: dict, tmp_path: Path
) -> None:
    """The champion recorded 0.99 on its own test split; on this run's split it answers one
    class, and its figures are that class's share: what the gate must compare, not 0.99. The
    champion was exported at another image size (32): its signature resizes as when served."""
    classes = dataset["class_names"]
    counts = dataset["splits"]["test"]["class_counts"]
    total = sum(counts.values())
    challenger = constant_model(tmp_path / "new", 1, classes, 64, {"test_accuracy": 0.5})
    champion = constant_model(tmp_path / "old", 3, classes, 32, {"test_accuracy": 0.99, "macro_f1": 0.98})
    lines: list[str] = []
    out = evaluate.evaluate(
        str(synthetic_dir), {"challenger": str(challenger), "champion": str(champion)}, log=lines.append
    )
    assert tuple(sorted(out)) == tuple(sorted(EVALUATION_KEYS))
    assert out["dataset_fingerprint"] == dataset["fingerprint"] and out["class_names"] == classes
    for role, answer in (("challenger", 1), ("champion", 3)):
        got = out["models"][role]
        assert tuple(sorted(got)) == tuple(sorted(EVALUATION_MODEL_KEYS))
        name = classes[answer]
        assert got["examples"] == total
        assert got["accuracy"] == pytest.approx(counts[name] / total)
        matrix = [[counts[c] if j == answer else 0 for j in range(len(classes))] for c in classes]
        assert got["confusion_matrix"]["matrix"] == matrix
        # Only the answered class has predictions: its precision is its share, its recall 1.
        share = counts[name] / total
        f1 = 2 * share / (share + 1)
        assert got["per_class"][name] == {"precision": pytest.approx(share), "recall": 1.0, "f1": pytest.approx(f1), "support": counts[name]}  # fmt: skip
        assert got["macro_f1"] == pytest.approx(f1 / len(classes))
        assert got["macro_f1"] == pytest.approx(metrics.macro_f1(got["per_class"]))
    assert out["models"]["champion"]["recorded"]["accuracy"] == 0.99  # kept beside, not compared
    # Paired, example by example: the challenger alone is right on the images of its class, the
    # champion alone on those of its own; equal shares, so no difference and McNemar's p is 1.
    comparison = out["comparison"]
    assert tuple(sorted(comparison)) == tuple(sorted(EVALUATION_COMPARISON_KEYS))
    assert comparison["examples"] == total
    b, c = counts[classes[1]], counts[classes[3]]
    assert (comparison["mcnemar"]["b"], comparison["mcnemar"]["c"]) == (b, c)
    assert comparison["mcnemar"]["p_value"] == pytest.approx(pairedstats.mcnemar_exact(b, c))
    for name in ("accuracy", "macro_f1"):
        new, old = out["models"]["challenger"][name], out["models"]["champion"][name]
        assert comparison[name]["challenger"] == pytest.approx(new)
        assert comparison[name]["champion"] == pytest.approx(old)
        assert comparison[name]["difference"] == pytest.approx(new - old)
        low, high = comparison[name]["ci95"]
        assert low <= new - old <= high
    assert any(line.startswith("compared: challenger - champion on ") for line in lines)
    assert out["models"]["challenger"]["recorded"]["macro_f1"] is None  # it recorded none
    assert any("evaluated champion: accuracy" in line and "recorded on its own: accuracy 0.9900" in line for line in lines)  # fmt: skip


@pytest.mark.process
def test_the_command_writes_evaluation_json_into_aip_model_dir(
    synthetic_dir: Path, dataset: dict, tmp_path: Path
) -> None:
    classes = dataset["class_names"]
    challenger = constant_model(tmp_path / "new", 0, classes, 64, {"test_accuracy": 0.2})
    command = [
        sys.executable,
        "-m",
        "trainer.evaluate",
        f"--data_dir={synthetic_dir}",
        f"--model_dir={challenger}",
    ]
    env = trainer_env({"AIP_MODEL_DIR": str(tmp_path / "job" / "model")})
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    written = json.loads((tmp_path / "job" / "model" / "evaluation.json").read_text())
    assert list(written["models"]) == ["challenger"]  # no champion given: the new model alone
    assert tuple(sorted(written)) == tuple(sorted(EVALUATION_KEYS))
    assert written["comparison"] is None  # nothing to compare with


def test_a_champion_of_other_classes_is_refused_before_any_image_is_read(
    synthetic_dir: Path, dataset: dict, tmp_path: Path
) -> None:
    classes = dataset["class_names"]
    challenger = constant_model(tmp_path / "new", 0, classes, 64, {"test_accuracy": 0.2})
    other = constant_model(tmp_path / "other", 0, list(reversed(classes)), 64, {"test_accuracy": 0.9})
    lines: list[str] = []
    with pytest.raises(evaluate.EvaluationError, match="same class names in the same order") as raised:
        evaluate.evaluate(
            str(synthetic_dir), {"challenger": str(challenger), "champion": str(other)}, log=lines.append
        )
    assert str(raised.value).startswith(f"the champion in {other} was trained on the classes")
    assert not lines  # refused before any image was read


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model_dir=/m"], "--data_dir"),
        (["--data_dir=/d", "--model_dir=/m", "--split=train"], "--split"),
        (["--data_dir=/d", "--model_dir=/m"], "--output_dir is required"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as raised:
        evaluate.main(args)
    assert raised.value.code == 2 and message in capsys.readouterr().err


def test_a_model_without_metrics_is_refused(synthetic_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(evaluate.EvaluationError, match=r"has no metrics\.json"):
        evaluate.evaluate(str(synthetic_dir), {"challenger": str(tmp_path / "empty")})


def test_summarize_against_a_hand_computed_matrix() -> None:
    # 3 images of class a (2 right), 1 of b (wrong, answered a), 2 of c (right).
    probs = [
        [0.8, 0.1, 0.1],
        [0.6, 0.3, 0.1],
        [0.2, 0.7, 0.1],
        [0.9, 0.05, 0.05],
        [0.1, 0.1, 0.8],
        [0.2, 0.2, 0.6],
    ]
    got = evaluate.summarize([0, 0, 0, 1, 2, 2], probs, ["a", "b", "c"])
    assert got["confusion_matrix"]["matrix"] == [[2, 1, 0], [1, 0, 0], [0, 0, 2]]
    assert got["accuracy"] == pytest.approx(4 / 6)
    # a: precision 2/3, recall 2/3; b: 0, 0; c: 1, 1 -> macro F1 (2/3 + 0 + 1) / 3
    assert got["macro_f1"] == pytest.approx((2 / 3 + 0 + 1) / 3)
    assert got["per_class"]["b"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}


def test_an_output_dir_that_is_a_file_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It ended in a traceback after the whole evaluation; now exit 2, naming the flag, at once."""
    taken = tmp_path / "taken"
    taken.write_text("mine")
    with pytest.raises(SystemExit) as raised:
        evaluate.main(["--data_dir=/nonexistent", "--model_dir=/m", f"--output_dir={taken}"])
    assert raised.value.code == 2 and "--output_dir" in capsys.readouterr().err
    assert taken.read_text() == "mine"
