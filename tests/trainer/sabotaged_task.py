"""`python -m tests.trainer.sabotaged_task [trainer flags]`: `python -m trainer.task` with an
epoch deliberately ruined, the last or those listed in `SABOTAGE_EPOCHS` (`4` or `2,3`): every
replica zeroes the trainable weights after that epoch's last training step, before its
validation (so the model outputs uniform probabilities: validation accuracy falls to the share
of the first class). Used to check that the best epoch, not the last, is exported."""

from __future__ import annotations

import os
import sys
from collections.abc import Collection
from typing import Any

from trainer._tf import keras, tf
from trainer.config import parse_args
from trainer.task import main


class Sabotage(keras.callbacks.Callback):
    """Zeroes every trainable weight at the end of the last training step of `epochs` (1-based)."""

    def __init__(self, epochs: Collection[int]) -> None:
        super().__init__()
        self.epochs = set(epochs)
        self._epoch = 0

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch + 1

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._epoch in self.epochs and batch == self.params["steps"] - 1:
            for variable in self.model.trainable_variables:
                variable.assign(tf.zeros_like(variable))


class Reveal(keras.callbacks.Callback):
    """Prints every epoch's metrics exactly (`repr`), as this replica sees them in `logs`."""

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        shown = {k: repr(float(v)) for k, v in sorted((logs or {}).items()) if k in EXACT}
        print(f"exact epoch {epoch + 1}: {shown}", flush=True)


EXACT = ("loss", "accuracy", "val_loss", "val_accuracy")

if __name__ == "__main__":
    listed = os.environ.get("SABOTAGE_EPOCHS")
    ruined = {int(e) for e in listed.split(",")} if listed else {parse_args(sys.argv[1:]).epochs}
    sys.exit(main(sys.argv[1:], callbacks=[Sabotage(ruined), Reveal()]))
