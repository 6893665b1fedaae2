"""Timing the steady state of one Keras `fit`, without its set-up and without changing it.

`fit` returns only after building iterators, callbacks and (the first time) tracing, and a
callback that reads the loss every step makes Keras wait for the device every step. The clock
reads the loss (waiting for the device) only at the two ends of the timed window, and declares
`_supports_tf_logs` so that it never adds a per-step wait of its own.
"""

from __future__ import annotations

import time
from typing import Any


def _wait_for_device(logs: Any) -> None:
    value: Any = (logs or {}).get("loss")
    if hasattr(value, "numpy"):
        value.numpy()


def make_clock(warmup_steps: int | None) -> Any:
    """A callback timing, within one fit, either the steps after the first `warmup_steps` of a
    one-epoch fit, or (`warmup_steps` None) the whole second epoch of a two-epoch fit.

    After the fit: `steps`, `seconds`, `warmup_seconds` (fit start to the window's start).
    """
    from trainer._tf import keras

    class Clock(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self._supports_tf_logs = True
            self.steps = 0
            self.seconds = self.warmup_seconds = 0.0
            self._fit_start = 0.0
            self._start: float | None = None

        def _open(self) -> None:
            self._start = time.perf_counter()
            self.warmup_seconds = self._start - self._fit_start

        def on_train_begin(self, logs: Any = None) -> None:
            self._fit_start = time.perf_counter()

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            if warmup_steps is None and epoch == 1:
                self._open()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if self._start is not None:
                self.steps += 1
            elif warmup_steps is not None and batch == warmup_steps - 1:
                _wait_for_device(logs)
                self._open()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if self._start is not None:
                _wait_for_device(logs)
                self.seconds = time.perf_counter() - self._start

    return Clock()


def fit_timed(
    model: Any,
    dataset: Any,
    warmup_steps: int | None,
    steps: int = 0,
    *,
    ours_batch_size: int | None = None,
    progress_tf_logs: bool = False,
) -> dict[str, Any]:
    """One `fit` timed by `make_clock`: `warmup_steps` then `steps` timed steps, or (`warmup_steps`
    None) two whole epochs, the second timed.

    Ours (`ours_batch_size` given) fits with `trainer.callbacks.ProgressLogger`, as
    `trainer.task.run` does, the codelab with Keras's progress bar (`verbose=1`). Both wait for the
    device each step (Keras converts batch logs to numpy unless every batch callback sets
    `_supports_tf_logs`); `progress_tf_logs` sets it on ProgressLogger, to measure that wait."""
    clock = make_clock(warmup_steps)
    fit_args: dict[str, Any] = {"verbose": 1, "callbacks": [clock]}
    if ours_batch_size is not None:
        from trainer import callbacks

        logger = callbacks.ProgressLogger("bench", 1, (warmup_steps or 0) + steps, ours_batch_size)
        logger._supports_tf_logs = progress_tf_logs
        fit_args = {"verbose": 0, "callbacks": [logger, clock]}
    epochs = {"epochs": 2} if warmup_steps is None else {"epochs": 1, "steps_per_epoch": warmup_steps + steps}
    model.fit(dataset, **epochs, **fit_args)
    return {
        "timed_steps": clock.steps,
        "timed_seconds": round(clock.seconds, 3),
        "warmup_seconds": round(clock.warmup_seconds, 3),
    }
