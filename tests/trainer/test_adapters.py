"""trainer.adapters: every third-party private name the trainer uses, checked against the
installed library; each check fails naming what changed."""

from __future__ import annotations

import inspect
import re
from typing import Any

import numpy as np
import pytest

from trainer import adapters
from trainer._tf import keras, tf


def test_the_installed_libraries_are_the_ones_the_adapters_were_written_for() -> None:
    adapters.check_backup_and_restore()


# --- tf-keras BackupAndRestore._backup ---------------------------------------------------------------


def test_back_up_calls_the_parents_save_with_the_epoch_and_step(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(
        keras.callbacks.BackupAndRestore, "_backup", lambda self, epoch, batch=0: calls.append((epoch, batch))
    )
    callback = keras.callbacks.BackupAndRestore("/nowhere", save_freq=3)
    adapters.back_up(callback, epoch=2, batch=1)
    adapters.back_up(callback, epoch=4)
    assert calls == [(2, 1), (4, 0)]


def test_back_up_saves_the_position_a_restart_resumes_from(tmp_path: Any) -> None:
    from trainer.callbacks import backup_position, latest_backup

    model = keras.Sequential([keras.layers.Dense(1, input_shape=(2,))])
    model.compile(optimizer="sgd", loss="mse")

    class SaveAtStep(keras.callbacks.BackupAndRestore):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if batch == 1:
                adapters.back_up(self, epoch=0, batch=batch)

    model.fit(
        np.zeros((8, 2)),
        np.zeros((8, 1)),
        batch_size=2,
        epochs=1,
        verbose=0,
        callbacks=[SaveAtStep(str(tmp_path), save_freq=1000, delete_checkpoint=False)],
    )
    latest = latest_backup(str(tmp_path))
    assert latest is not None and backup_position(latest) == (0, 1)


@pytest.mark.parametrize(
    ("replacement", "named"),
    [
        (lambda self, epoch: None, "parameters ('self', 'epoch')"),
        (lambda self, epoch, step=0: None, "parameters ('self', 'epoch', 'step')"),
        (lambda self, epoch, batch=None: None, "batch default None"),
        (None, "no such method"),
    ],
)
def test_a_changed_backup_method_is_named(
    monkeypatch: pytest.MonkeyPatch, replacement: Any, named: str
) -> None:
    if replacement is None:
        monkeypatch.delattr(keras.callbacks.BackupAndRestore, "_backup")
    else:
        monkeypatch.setattr(keras.callbacks.BackupAndRestore, "_backup", replacement)
    with pytest.raises(RuntimeError, match=r"BackupAndRestore\._backup has") as info:
        adapters.check_backup_and_restore()
    assert named in str(info.value) and "trainer.adapters.back_up" in str(info.value)


def test_a_backup_callback_is_not_built_on_a_changed_tf_keras(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from trainer.callbacks import Backup, StopRequest

    Backup(str(tmp_path), 10, StopRequest(), "t")  # as installed
    monkeypatch.setattr(keras.callbacks.BackupAndRestore, "_backup", lambda self, epoch: None)
    with pytest.raises(RuntimeError, match=r"BackupAndRestore\._backup"):
        Backup(str(tmp_path), 10, StopRequest(), "t")


def test_the_backup_callback_uses_no_private_name_of_tf_keras() -> None:
    from trainer import callbacks

    used = re.findall(
        r"\.(_backup|_current_epoch|_training_state|_supports_tf_logs)\b", inspect.getsource(callbacks)
    )
    assert used == []


# --- tf-keras Callback._supports_tf_logs ---------------------------------------------------------


def test_take_tensor_logs_hands_the_callback_tensors() -> None:
    seen: list[Any] = []

    class Watch(keras.callbacks.Callback):
        def __init__(self, tensors: bool) -> None:
            super().__init__()
            if tensors:
                adapters.take_tensor_logs(self)

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            seen.append(type(logs["loss"]))

    model = keras.Sequential([keras.layers.Dense(1, input_shape=(2,))])
    model.compile(optimizer="sgd", loss="mse")
    for tensors in (True, False):
        model.fit(
            np.zeros((4, 2)), np.zeros((4, 1)), batch_size=2, epochs=1, verbose=0, callbacks=[Watch(tensors)]
        )
    assert all(tf.is_tensor(t) or issubclass(t, tf.Tensor) for t in seen[:2]), seen
    assert not any(issubclass(t, tf.Tensor) for t in seen[2:]), seen
