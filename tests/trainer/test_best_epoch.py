"""Which epoch is exported (`trainer.callbacks.BestEpoch`): the best by --hp_metric, early
stopping, and both across a restart (docs/training.md, "Which epoch is exported").

The decisions are checked on the callback alone, with a stand-in model and backups laid out as
tf-keras's BackupAndRestore lays them out (fast); then real runs of the trainer, in this process,
for what only a real run shows (slow)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FAST_TRAIN_FLAGS
from tests.trainer.sabotaged_task import Sabotage
from trainer import callbacks as cb
from trainer import storage
from trainer._tf import tf
from trainer.config import parse_args

STEPS = 5


@pytest.fixture
def checkpoint_dir(tmp_path: Path) -> str:
    return str(tmp_path / "checkpoints")


class FakeModel:
    stop_training = False


class Backups:
    """Saves checkpoints as tf-keras's BackupAndRestore does: `<backup>/chief/ckpt-N`, the model
    with the (epoch, step) counters, one kept. `weight` tells the epochs' weights apart."""

    def __init__(self, checkpoint_dir: str) -> None:
        self.dir = storage.join(checkpoint_dir, "backup")
        self.weight = tf.Variable(0.0)
        self.epoch = tf.Variable(tf.constant(-1, tf.int64))
        self.step = tf.Variable(tf.constant(-1, tf.int64))
        checkpoint = tf.train.Checkpoint(
            model=tf.train.Checkpoint(weight=self.weight),
            ckpt_saved_epoch=self.epoch,
            ckpt_saved_batch=self.step,
        )
        self.manager = tf.train.CheckpointManager(checkpoint, storage.join(self.dir, "chief"), max_to_keep=1)

    def save(self, epoch: int, step: int = STEPS - 1) -> None:
        """Epoch `epoch` (1-based) backed up after `step` (0-based; the last by default)."""
        self.weight.assign(float(epoch))
        self.epoch.assign(epoch - 1)
        self.step.assign(step)
        self.manager.save()


def best_epoch(
    checkpoint_dir: str,
    *,
    metric: str = "val_loss",
    patience: int = 0,
    keep_weights: bool = True,
    epochs: int = 10,
    is_chief: bool = True,
) -> cb.BestEpoch:
    flags = [f"--checkpoint_dir={checkpoint_dir}", f"--hp_metric={metric}", f"--epochs={epochs}"]
    flags += [f"--early_stopping_patience={patience}", f"--export_epoch={'best' if keep_weights else 'last'}"]
    config = parse_args(["--data_dir=/data", "--model_dir=/model", *flags], environ={})
    backup_dir = storage.join(checkpoint_dir, "backup")
    callback = cb.BestEpoch(config, backup_dir, STEPS, is_chief=is_chief, prefix="chief-0")
    callback.set_model(FakeModel())
    return callback


def train(
    callback: cb.BestEpoch, backups: Backups, values: list[float], history: dict[str, Any], first: int = 1
) -> int | None:
    """Epochs `first`, ... ending with `values` of the callback's metric, each backed up then seen
    by the callback, as in `trainer.task`; returns the epoch after which it stopped training."""
    for epoch, value in enumerate(values, start=first):
        history[str(epoch)] = {callback.metric: value}
        backups.save(epoch)
        callback.on_epoch_end(epoch - 1, {callback.metric: value, "loss": 1.0})
        if callback.model.stop_training:
            return epoch
    return None


def files(checkpoint_dir: str) -> list[str]:
    folder = storage.join(checkpoint_dir, "best")
    return sorted(tf.io.gfile.listdir(folder)) if tf.io.gfile.isdir(folder) else []


def record(checkpoint_dir: str) -> dict[str, Any]:
    loaded: dict[str, Any] = storage.read_json(storage.join(checkpoint_dir, "best.json"))
    return loaded


def restored_weight(path: str) -> float:
    weight = tf.Variable(-1.0)
    tf.train.Checkpoint(model=tf.train.Checkpoint(weight=weight)).restore(path).expect_partial()
    return float(weight.numpy())


def checkpoint_weights(prefix: Path) -> list[bytes]:
    """A backup's model variables (not the optimizer's or the counters), as sorted raw bytes."""
    reader = tf.train.load_checkpoint(str(prefix))
    names = [
        n for n in reader.get_variable_to_shape_map() if n.startswith("model/") and "/optimizer/" not in n
    ]
    return sorted(reader.get_tensor(n).tobytes() for n in names)


def published_weights(model_dir: Path) -> list[bytes]:
    """The SavedModel's variables, but the compiled metrics' and the augmentation's random state."""
    reader = tf.train.load_checkpoint(str(model_dir / "variables" / "variables"))
    names = [
        n
        for n in reader.get_variable_to_shape_map()
        if not n.startswith(("keras_api/", "_CHECKPOINTABLE")) and "_random_generator" not in n
    ]
    return sorted(reader.get_tensor(n).tobytes() for n in names)


def test_improving_means_strictly_better_in_the_metrics_direction() -> None:
    assert cb.improves("max", 0.9, None) and cb.improves("min", 2.0, None)
    assert cb.improves("max", 0.91, 0.9) and not cb.improves("max", 0.9, 0.9)  # the earliest of equals
    assert cb.improves("min", 0.3, 0.4) and not cb.improves("min", 0.5, 0.4)
    assert not cb.improves("max", math.nan, None) and not cb.improves("min", math.inf, 0.4)


def test_the_best_epochs_backup_is_kept_and_early_stopping_stops_after_patience(
    checkpoint_dir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    callback, backups = best_epoch(checkpoint_dir, patience=2), Backups(checkpoint_dir)
    history: dict[str, Any] = {}
    # val_loss is minimised: epoch 2 is the best; epochs 3 and 4 do not beat it.
    stopped = train(callback, backups, [1.0, 0.8, 0.8, 0.9, 0.1], history)
    assert stopped == 4
    assert (callback.best_epoch, callback.stopped_early, callback.trained) == (2, True, 4)
    assert record(checkpoint_dir) == {
        "metric": "val_loss",
        "goal": "min",
        "epoch": 2,
        "value": 0.8,
        "checkpoint": "best/epoch-0002",
        "stopped_early_after": 4,
    }
    assert files(checkpoint_dir) == ["epoch-0002.data-00000-of-00001", "epoch-0002.index"]  # older deleted
    out = capsys.readouterr().out
    assert "[chief-0] epoch 2 is the best so far (val_loss=0.8000); kept as the export candidate" in out
    assert "[chief-0] early stopping: no improvement of val_loss for 2 epochs since epoch 2" in out
    epoch, path, what = callback.export_plan("best", model_is_last=True)
    assert (epoch, what) == (2, "exporting epoch 2 (best val_loss=0.8000)")
    assert path is not None and restored_weight(path) == 2.0  # epoch 2's weights, not the last's


def test_replicas_that_do_not_write_take_the_same_decisions(tmp_path: Path) -> None:
    chief_dir, worker_dir = str(tmp_path / "chief"), str(tmp_path / "worker")
    values = [0.5, 0.7, 0.6, 0.65, 0.7, 0.9]
    chief = best_epoch(chief_dir, metric="val_accuracy", patience=3)
    worker = best_epoch(worker_dir, metric="val_accuracy", patience=3, is_chief=False)
    assert train(chief, Backups(chief_dir), values, {}) == train(worker, Backups(worker_dir), values, {}) == 5
    assert (chief.best_epoch, chief.export_plan("best", model_is_last=True)[0]) == (2, 2)
    assert (worker.best_epoch, worker.export_plan("best", model_is_last=True)[0]) == (2, 2)
    assert not (tmp_path / "worker" / "best.json").exists() and not (tmp_path / "worker" / "best").exists()


def test_a_restart_keeps_the_best_and_an_early_stop(checkpoint_dir: str) -> None:
    backups = Backups(checkpoint_dir)
    history: dict[str, Any] = {}
    assert train(best_epoch(checkpoint_dir, patience=2), backups, [1.0, 0.5, 0.7], history) is None
    # Restarted after epoch 3: epoch 2 is still the best, and must still be beaten.
    again = best_epoch(checkpoint_dir, patience=2)
    again.resume(history)
    assert (again.best_epoch, again.trained, again.stopped_early) == (2, 3, False)
    assert train(again, backups, [0.6], history, first=4) == 4
    # Restarted after the early stop: training is over.
    final = best_epoch(checkpoint_dir, patience=2)
    final.resume(history)
    assert (final.best_epoch, final.trained, final.stopped_early) == (2, 4, True)
    epoch, path, _ = final.export_plan("best", model_is_last=False)
    assert epoch == 2 and path is not None and restored_weight(path) == 2.0
    # --export_epoch last after a stop before the restart: the model is restored from the backup.
    epoch, path, what = final.export_plan("last", model_is_last=False)
    assert epoch == 4 and path is not None and restored_weight(path) == 4.0
    assert what == "exporting epoch 4, the last trained (--export_epoch last)"


@pytest.mark.parametrize("improved", [True, False], ids=["improving", "stopping"])
def test_a_decision_lost_between_the_backup_and_the_record_is_taken_at_the_restart(
    checkpoint_dir: str, improved: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """A crash (or SIGTERM, which `Backup` acts on before this callback runs) after epoch 3's
    backup: its decision is taken again from history.json and the backup."""
    backups = Backups(checkpoint_dir)
    history: dict[str, Any] = {}
    train(best_epoch(checkpoint_dir, patience=2), backups, [1.0, 0.5], history)
    history["3"] = {"val_loss": 0.4 if improved else 0.9}
    backups.save(3)  # ... and the process ended here
    assert record(checkpoint_dir)["epoch"] == 2
    again = best_epoch(checkpoint_dir, patience=1)
    again.resume(history)
    assert again.trained == 3
    if improved:
        assert (again.best_epoch, again.stopped_early, record(checkpoint_dir)["epoch"]) == (3, False, 3)
        assert files(checkpoint_dir) == ["epoch-0003.data-00000-of-00001", "epoch-0003.index"]
        assert "[chief-0] epoch 3 is the best so far (val_loss=0.4000)" in capsys.readouterr().out
    else:  # patience 1: the stop after epoch 3 that the crash kept from being recorded
        assert (again.best_epoch, again.stopped_early, record(checkpoint_dir)["stopped_early_after"]) == (
            2,
            True,
            3,
        )
        assert "[chief-0] training ended after epoch 3, stopped early" in capsys.readouterr().out


def test_a_backup_saved_mid_epoch_counts_the_epochs_before_it(checkpoint_dir: str) -> None:
    backups = Backups(checkpoint_dir)
    history: dict[str, Any] = {}
    train(best_epoch(checkpoint_dir), backups, [1.0, 0.5], history)
    backups.save(3, step=2)  # SIGTERM in epoch 3
    again = best_epoch(checkpoint_dir)
    again.resume(history)
    assert (again.trained, again.best_epoch) == (2, 2)


def test_copies_a_crash_left_without_a_record_are_deleted_at_the_next_record(checkpoint_dir: str) -> None:
    backups = Backups(checkpoint_dir)
    history: dict[str, Any] = {}
    callback = best_epoch(checkpoint_dir)
    train(callback, backups, [1.0], history)
    orphan = storage.join(checkpoint_dir, "best", "epoch-0002.index")
    tf.io.gfile.copy(storage.join(checkpoint_dir, "best", "epoch-0001.index"), orphan)  # a crash mid-copy
    assert callback.export_plan("best", model_is_last=True)[0] == 1  # the record is what counts
    train(callback, backups, [0.5, 0.4], history, first=2)
    assert files(checkpoint_dir) == ["epoch-0003.data-00000-of-00001", "epoch-0003.index"]


def test_export_epoch_last_keeps_no_copies_but_still_stops_early(checkpoint_dir: str) -> None:
    callback = best_epoch(checkpoint_dir, metric="accuracy", patience=1, keep_weights=False)
    assert train(callback, Backups(checkpoint_dir), [0.5, 0.6, 0.6], {}) == 3
    assert record(checkpoint_dir)["checkpoint"] is None and files(checkpoint_dir) == []
    assert callback.export_plan("last", model_is_last=True) == (
        3,
        None,
        "exporting epoch 3, the last trained (--export_epoch last)",
    )


def test_without_a_finite_metric_the_last_epoch_is_exported(checkpoint_dir: str) -> None:
    callback = best_epoch(checkpoint_dir, metric="val_accuracy", patience=2)
    assert train(callback, Backups(checkpoint_dir), [math.nan, math.nan], {}) == 2  # since training began
    assert callback.export_plan("best", model_is_last=True) == (
        2,
        None,
        "no epoch had a finite val_accuracy: exporting the last, epoch 2",
    )


def test_a_record_chosen_by_another_metric_is_refused(checkpoint_dir: str) -> None:
    train(best_epoch(checkpoint_dir), Backups(checkpoint_dir), [1.0], {})
    with pytest.raises(ValueError, match=r"best epoch was chosen by --hp_metric val_loss .*not val_accuracy"):
        best_epoch(checkpoint_dir, metric="val_accuracy")


def test_a_record_ahead_of_the_backup_is_refused(checkpoint_dir: str) -> None:
    train(best_epoch(checkpoint_dir), Backups(checkpoint_dir), [1.0, 0.5], {})
    tf.io.gfile.rmtree(storage.join(checkpoint_dir, "backup"))
    with pytest.raises(ValueError, match=r"names epoch 2 as the best, but the backup holds only 0 epoch"):
        best_epoch(checkpoint_dir).resume({})


def test_the_copy_refuses_a_backup_of_another_epoch(checkpoint_dir: str) -> None:
    """tf-keras's layout is checked, not assumed: the newest backup must be the epoch's end."""
    backups, callback = Backups(checkpoint_dir), best_epoch(checkpoint_dir)
    backups.save(1, step=1)
    with pytest.raises(RuntimeError, match=r"does not hold the end of epoch 1"):
        callback.on_epoch_end(0, {"val_loss": 1.0})


# --- real runs, in this process -------------------------------------------------------------


def run_trainer(data_dir: Path, out: Path, flags: list[str], callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    from trainer.task import run

    config = parse_args(
        [f"--data_dir={data_dir}", f"--model_dir={out / 'model'}", *FAST_TRAIN_FLAGS, *flags], {}
    )
    metrics = run(config, callbacks=callbacks)
    assert metrics is not None
    return metrics


def started(out: str) -> list[str]:
    return [line.split("] ", 1)[1] for line in out.splitlines() if " started (" in line]


@pytest.mark.serial
def test_early_stopping_then_a_restart_trains_no_more(
    synthetic_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ["--epochs=4", "--early_stopping_patience=1"]
    # Epoch 2 ruined: no improvement for 1 epoch, so training stops after it.
    metrics = run_trainer(synthetic_dir, tmp_path, flags, [Sabotage({2})])
    history = metrics["history"]
    assert (metrics["epochs_completed"], metrics["stopped_early"], metrics["best_epoch"]) == (2, True, 1), (
        history
    )
    assert len(history["val_accuracy"]) == 2
    assert metrics["val_accuracy"] == pytest.approx(history["val_accuracy"][0], abs=0.011)
    checkpoints = tmp_path / "model_checkpoints"
    assert published_weights(tmp_path / "model") == checkpoint_weights(checkpoints / "best" / "epoch-0001")
    assert metrics["train_loss"] == history["loss"][0]
    out = capsys.readouterr().out
    assert started(out) == ["epoch 1/4 started (18 steps)", "epoch 2/4 started (18 steps)"]
    assert "[single] early stopping: no improvement of val_accuracy for 1 epoch since epoch 1" in out
    # The job restarted after the stop (say, killed while publishing): nothing more is trained.
    again = run_trainer(synthetic_dir, tmp_path, flags)
    out = capsys.readouterr().out
    assert started(out) == [], out
    assert "training ended after epoch 2, stopped early" in out
    assert {k: again[k] for k in ("epochs_completed", "stopped_early", "best_epoch", "val_accuracy")} == {
        k: metrics[k] for k in ("epochs_completed", "stopped_early", "best_epoch", "val_accuracy")
    }


@pytest.mark.serial
def test_the_best_epoch_survives_a_crash_and_a_restart(
    synthetic_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed right after epoch 2's backup, before its decision (where SIGTERM ends a replica, and
    a SIGKILL may): the restart takes that decision, and exports the best of epochs 1 and 2 though
    the epoch it trains, the last, is the worst."""
    decide = cb.BestEpoch.on_epoch_end

    def killed_after_epoch_2(self: cb.BestEpoch, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if epoch == 1:
            raise RuntimeError("killed after epoch 2's backup")
        decide(self, epoch, logs)

    monkeypatch.setattr(cb.BestEpoch, "on_epoch_end", killed_after_epoch_2)
    with pytest.raises(RuntimeError, match="killed after epoch 2's backup"):
        run_trainer(synthetic_dir, tmp_path, ["--epochs=3"])
    monkeypatch.undo()
    assert json.loads((tmp_path / "model_checkpoints" / "best.json").read_text())["epoch"] == 1
    capsys.readouterr()

    metrics = run_trainer(synthetic_dir, tmp_path, ["--epochs=3"], [Sabotage({3})])
    history = metrics["history"]["val_accuracy"]
    best = 1 + max(range(2), key=lambda i: history[i])  # the first of equals
    assert (metrics["best_epoch"], metrics["epochs_completed"]) == (best, 3), history
    assert history[2] == pytest.approx(0.2)
    assert metrics["val_accuracy"] == pytest.approx(history[best - 1], abs=0.011), metrics
    checkpoints = tmp_path / "model_checkpoints"
    assert published_weights(tmp_path / "model") == checkpoint_weights(
        checkpoints / "best" / f"epoch-{best:04d}"
    )
    out = capsys.readouterr().out
    assert started(out) == ["epoch 3/3 started (18 steps)"]
    if best == 2:  # taken before training resumed
        assert out.index("[single] epoch 2 is the best so far") < out.index("epoch 3/3 started")


@pytest.mark.serial
def test_export_epoch_last_exports_the_last_epoch(synthetic_dir: Path, tmp_path: Path) -> None:
    metrics = run_trainer(synthetic_dir, tmp_path, ["--epochs=2", "--export_epoch=last"], [Sabotage({2})])
    assert (metrics["best_epoch"], metrics["export_epoch"], metrics["stopped_early"]) == (2, "last", False)
    assert metrics["val_accuracy"] == pytest.approx(0.2)  # the ruined epoch, as asked
    assert metrics["history"]["val_accuracy"][1] == pytest.approx(0.2)
    assert not (tmp_path / "model_checkpoints" / "best").exists()  # no copies kept
    backup = tf.train.latest_checkpoint(str(tmp_path / "model_checkpoints" / "backup" / "chief"))
    assert published_weights(tmp_path / "model") == checkpoint_weights(Path(backup))
