"""Per-epoch reporting: progress on screen, the persistent history, the tuning metric."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from typing import Any

from trainer import hpmetric, storage
from trainer._tf import keras, tf


def log(prefix: str, message: str) -> None:
    print(f"[{prefix}] {message}", file=sys.stdout, flush=True)


class ProgressLogger(keras.callbacks.Callback):
    """Prints each epoch's start, progress every tenth of it, and its results; measures
    training throughput (images per second, validation excluded) into `logs`."""

    def __init__(self, prefix: str, epochs: int, steps_per_epoch: int, global_batch_size: int) -> None:
        super().__init__()
        self.prefix, self.epochs, self.steps = prefix, epochs, steps_per_epoch
        self.global_batch_size = global_batch_size
        self._every = steps_per_epoch // 10 if steps_per_epoch >= 20 else steps_per_epoch
        self._start = self._train_end = 0.0
        # Take the batch logs as tensors: otherwise Keras converts them to numbers after every
        # step, which makes each step wait for the GPU. They are read only when printed.
        self._supports_tf_logs = True

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._start = time.perf_counter()
        self._train_end = 0.0
        log(self.prefix, f"epoch {epoch + 1}/{self.epochs} started ({self.steps} steps)")

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        step = batch + 1
        if step % self._every == 0 and step < self.steps and logs:
            log(self.prefix, f"  step {step}/{self.steps} loss={float(logs.get('loss', float('nan'))):.4f}")

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self._start and not self._train_end:
            self._train_end = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        end = time.perf_counter()
        train_seconds = (self._train_end or end) - self._start
        if logs is not None:
            logs["images_per_second"] = self.steps * self.global_batch_size / max(train_seconds, 1e-9)
            logs["epoch_seconds"] = end - self._start
        shown = " ".join(f"{k}={float(v):.4f}" for k, v in (logs or {}).items() if k in _SHOWN)
        rate = (logs or {}).get("images_per_second", 0.0)
        log(
            self.prefix,
            f"epoch {epoch + 1}/{self.epochs} done in {end - self._start:.1f}s: {shown} ({rate:.0f} img/s)",
        )


_SHOWN = ("loss", "accuracy", "val_loss", "val_accuracy")


class EpochRecorder(keras.callbacks.Callback):
    """The chief's record of every completed epoch, in `history.json` in the checkpoint folder
    (kept across restarts, keyed by epoch so a replayed epoch replaces its first attempt), and
    the tuning metric reported with cloudml-hypertune at the end of every epoch.

    The metric file is checked when the callback is built, by `hpmetric.open_reporter` (the
    check `trainer.task` also runs at start): in a tuning trial a file that cannot be written
    raises `hpmetric.MetricFileError` here, before training; outside a trial it was warned about
    and the metric is not reported.

    Runs before BackupAndRestore saves the epoch, so an epoch is recorded before it counts as
    done.
    """

    def __init__(self, history_path: str, hp_metric: str, environ: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self.path, self.hp_metric = history_path, hp_metric
        self.history = load_history(history_path)
        self._hypertune = hpmetric.open_reporter(os.environ if environ is None else environ)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        logs = {k: float(v) for k, v in (logs or {}).items()}
        self.history[str(epoch + 1)] = logs
        storage.write_json(self.path, self.history)
        if self.hp_metric not in logs:
            raise KeyError(f"--hp_metric {self.hp_metric} was not computed; computed: {sorted(logs)}")
        if self._hypertune is None:
            return  # not a tuning trial, and the metric file cannot be written: warned at start
        self._hypertune.report_hyperparameter_tuning_metric(
            hyperparameter_metric_tag=self.hp_metric,
            metric_value=logs[self.hp_metric],
            global_step=epoch + 1,
        )


def load_history(path: str) -> dict[str, dict[str, float]]:
    if not tf.io.gfile.exists(storage.resolve(path)):
        return {}
    history: dict[str, dict[str, float]] = storage.read_json(path)
    return history


def history_as_lists(history: dict[str, dict[str, float]], up_to: int) -> dict[str, list[float]]:
    """Per-metric lists over epochs 1..up_to (Keras History's shape)."""
    epochs = [history[str(e)] for e in range(1, up_to + 1) if str(e) in history]
    keys = sorted({k for e in epochs for k in e})
    return {k: [e.get(k, float("nan")) for e in epochs] for k in keys}
