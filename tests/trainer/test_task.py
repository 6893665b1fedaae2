"""The trainer end to end on one machine, in this process, and its resume after a kill."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import FAST_TRAIN_FLAGS
from tests.processes import ROOT, tail, trainer_env
from trainer import contract, synthetic
from trainer.config import parse_args


@pytest.fixture(scope="module")
def trained(synthetic_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One single-machine run (no TF_CONFIG), with the tuning metric file redirected."""
    from trainer.task import run

    out = tmp_path_factory.mktemp("single")
    metric_file = out / "hypertune" / "metrics.jsonl"
    mp = pytest.MonkeyPatch()
    mp.setenv("CLOUD_ML_HP_METRIC_FILE", str(metric_file))
    config = parse_args(
        # A fourth epoch: with three, test accuracy landed at 0.87 once in a loaded CI run.
        [f"--data_dir={synthetic_dir}", f"--model_dir={out / 'model'}", *FAST_TRAIN_FLAGS, "--epochs=4"],
        {},
    )
    try:
        returned = run(config)
    finally:
        mp.undo()
    return {"config": config, "out": out, "metrics": returned, "metric_file": metric_file}


def test_single_machine_run_publishes_model_metrics_and_config(trained: dict[str, Any]) -> None:
    model_dir = trained["out"] / "model"
    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert metrics == json.loads(json.dumps(trained["metrics"]))
    # The last epoch's figure moves by a few points between runs: the bar is on the best epoch.
    assert max(metrics["history"]["val_accuracy"]) >= 0.9, metrics["history"]
    assert metrics["test_accuracy"] >= 0.8, metrics
    assert metrics["num_workers"] == 1 and metrics["epochs_completed"] == 4
    assert len(metrics["history"]["val_accuracy"]) == 4
    # The best epoch by --hp_metric is exported (the first of equals); its own training figures.
    val = metrics["history"]["val_accuracy"]
    assert metrics["best_epoch"] == 1 + val.index(max(val)), val
    assert (metrics["export_epoch"], metrics["selection_metric"], metrics["stopped_early"]) == (
        "best",
        "val_accuracy",
        False,
    )
    assert metrics["train_loss"] == metrics["history"]["loss"][metrics["best_epoch"] - 1]
    for key in ("train_loss", "train_accuracy", "val_loss", "val_accuracy", "test_loss"):
        assert isinstance(metrics[key], float)
    assert metrics["images_per_second"] > 0
    matrix = np.array(metrics["confusion_matrix"]["matrix"])
    assert matrix.shape == (5, 5) and matrix.sum() == metrics["test_examples"] == 100
    assert np.trace(matrix) / matrix.sum() == pytest.approx(metrics["test_accuracy"])
    assert metrics["class_names"] == list(synthetic.CASSAVA_CLASSES)
    # What trainer.contract declares (and tests/test_contracts.py checks every reader against).
    assert (sorted(metrics), sorted(metrics["confusion_matrix"])) == (
        sorted(contract.METRICS_KEYS),
        sorted(contract.CONFUSION_MATRIX_KEYS),
    )
    # config.json records what trained: `--augment auto` resolved from the data (synthetic: flip)
    recorded = json.loads((model_dir / "config.json").read_text())
    assert recorded == {**trained["config"].to_dict(), "augment": "flip"}
    # The checkpoint and log folders default beside the model, never inside it.
    assert (trained["out"] / "model_checkpoints" / "history.json").exists()
    assert list((trained["out"] / "model_logs").rglob("events.out.tfevents.*"))


def test_serving_default_classifies_encoded_images(trained: dict[str, Any]) -> None:
    from trainer._tf import tf

    serve = tf.saved_model.load(str(trained["out"] / "model")).signatures["serving_default"]
    rng = np.random.default_rng(123)
    classes = list(synthetic.CASSAVA_CLASSES) * 4
    images = [synthetic.make_image(rng, c, 160) for c in classes]
    encoded = [
        (tf.io.encode_jpeg(im) if i % 2 else tf.io.encode_png(im)).numpy() for i, im in enumerate(images)
    ]
    out = serve(image_bytes=tf.constant(encoded))
    assert out["probabilities"].shape == (20, 5)
    np.testing.assert_allclose(out["probabilities"].numpy().sum(-1), 1.0, rtol=1e-5)
    names = [n.decode() for n in out["class_name"].numpy()]
    assert np.mean([n == c for n, c in zip(names, classes, strict=True)]) >= 0.8, names


def test_tuning_metric_is_reported_every_epoch(trained: dict[str, Any]) -> None:
    lines = [json.loads(line) for line in trained["metric_file"].read_text().splitlines()]
    assert [line["global_step"] for line in lines] == ["1", "2", "3", "4"]
    history = trained["metrics"]["history"]["val_accuracy"]
    assert [float(line["val_accuracy"]) for line in lines] == pytest.approx(history)


@pytest.mark.parametrize(
    "flag",
    # dense_units changes the variables; the others only how they are trained, which a resume
    # would silently mix (a tuning trial resuming another trial's backup: issue "retries reuse
    # another run's job folder").
    [
        "--dense_units=32",
        "--learning_rate=0.0123",
        "--dropout=0.35",
        "--per_replica_batch_size=8",
        "--seed=7",
        # Which epoch is kept and how long training lasts: --export_epoch best keeps copies
        # from the first epoch on, which a run begun with `last` never made.
        "--export_epoch=last",
        "--early_stopping_patience=3",
    ],
)
def test_a_backup_of_another_configuration_is_refused(trained: dict[str, Any], flag: str) -> None:
    from trainer.task import run

    name = flag.removeprefix("--").split("=")[0]
    config = parse_args(
        [
            f"--data_dir={trained['config'].data_dir}",
            f"--model_dir={trained['out'] / 'other_model'}",
            f"--checkpoint_dir={trained['config'].checkpoint_dir}",
            *FAST_TRAIN_FLAGS,
            "--epochs=4",
            flag,
        ],
        {},
    )
    with pytest.raises(ValueError, match=rf"holds a backup of another run \(different {name}"):
        run(config)
    assert not (trained["out"] / "other_model").exists()


def test_a_backup_whose_best_epoch_was_chosen_by_another_metric_is_refused(trained: dict[str, Any]) -> None:
    """--hp_metric is not a STATE_FIELD (it names what is reported), but it chooses the exported
    epoch: the best epoch so far, recorded in best.json, was chosen by it."""
    from trainer.task import run

    config = dataclasses.replace(
        trained["config"], hp_metric="val_loss", model_dir=str(trained["out"] / "other_model")
    )
    with pytest.raises(
        ValueError, match=r"best epoch was chosen by --hp_metric val_accuracy \(best.json\), not val_loss"
    ):
        run(config)
    assert not (trained["out"] / "other_model").exists()


@pytest.mark.serial
def test_a_run_killed_in_its_second_epoch_resumes_there(synthetic_dir: Path, tmp_path: Path) -> None:
    flags = [
        f"--data_dir={synthetic_dir}",
        f"--model_dir={tmp_path / 'model'}",
        *FAST_TRAIN_FLAGS,
        "--per_replica_batch_size=4",  # long epochs: the kill lands inside epoch 2
        "--epochs=2",  # the resumed run trains that epoch alone
    ]
    command = [sys.executable, "-m", "trainer.task", *flags]
    log = tmp_path / "first.log"
    with open(log, "w") as sink:
        first = subprocess.Popen(
            command, cwd=ROOT, env=trainer_env(), stdout=subprocess.PIPE, stderr=sink, text=True
        )
        assert first.stdout is not None
        for line in first.stdout:
            sink.write(line)
            if "epoch 2/2 started" in line:
                first.send_signal(signal.SIGKILL)
                break
        first.wait(timeout=120)
    assert first.returncode == -signal.SIGKILL, tail(log)
    history = json.loads((tmp_path / "model_checkpoints" / "history.json").read_text())
    assert sorted(history) == ["1"]  # killed during epoch 2
    assert not (tmp_path / "model").exists()  # nothing that looks like a finished model

    second = subprocess.run(command, cwd=ROOT, env=trainer_env(), capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    started = [line for line in second.stdout.splitlines() if "started (" in line]
    assert started == [started[0]] and started[0].endswith("epoch 2/2 started (75 steps)"), started
    metrics = json.loads((tmp_path / "model" / "metrics.json").read_text())
    assert metrics["epochs_completed"] == 2
    assert len(metrics["history"]["loss"]) == 2
