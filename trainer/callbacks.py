"""Per-epoch reporting (progress on screen, the persistent history, the tuning metric), the
backup, and stopping on SIGTERM."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import hypertune

from trainer import adapters, hpmetric, storage
from trainer._tf import keras, tf
from trainer.config import TrainConfig, metric_goal
from trainer.contract import BEST_DIR, BEST_FILE


def log(prefix: str, message: str) -> None:
    print(f"[{prefix}] {message}", file=sys.stdout, flush=True)


class ProgressLogger(keras.callbacks.Callback):
    """Prints each epoch's start, progress every tenth of it, and its results; puts training
    images per second (validation excluded) into `logs`."""

    def __init__(self, prefix: str, epochs: int, steps_per_epoch: int, global_batch_size: int) -> None:
        super().__init__()
        self.prefix, self.epochs, self.steps = prefix, epochs, steps_per_epoch
        self.global_batch_size = global_batch_size
        self._every = steps_per_epoch // 10 if steps_per_epoch >= 20 else steps_per_epoch
        self._start = self._train_end = 0.0
        self._epoch = self._ran = 0  # the current epoch, and the steps it ran in this process
        adapters.take_tensor_logs(self)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._start = time.perf_counter()
        self._train_end = 0.0
        self._epoch, self._ran = epoch, 0
        log(self.prefix, f"epoch {epoch + 1}/{self.epochs} started ({self.steps} steps)")

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if not self._ran and batch:  # fit starts the epoch past its first step: a mid-epoch backup
            log(
                self.prefix,
                f"epoch {self._epoch + 1}/{self.epochs} resumed from the backup at step {batch + 1}",
            )

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._ran += 1
        step = batch + 1
        if step % self._every == 0 and step < self.steps and logs:
            log(self.prefix, f"  step {step}/{self.steps} loss={float(logs.get('loss', float('nan'))):.4f}")

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self._start and not self._train_end:
            self._train_end = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        end = time.perf_counter()
        logs = {} if logs is None else logs
        # The steps this process ran: fewer than `steps` in an epoch resumed mid-way.
        rate = self._ran * self.global_batch_size / max((self._train_end or end) - self._start, 1e-9)
        logs.update(images_per_second=rate, epoch_seconds=end - self._start)
        shown = " ".join(
            f"{k}={float(logs[k]):.4f}" for k in ("loss", "accuracy", "val_loss", "val_accuracy") if k in logs
        )
        log(
            self.prefix,
            f"epoch {epoch + 1}/{self.epochs} done in {end - self._start:.1f}s: {shown} ({rate:.0f} img/s)",
        )


class EpochRecorder(keras.callbacks.Callback):
    """The chief's record of every completed epoch, in `history.json` in the checkpoint folder
    (kept across restarts, keyed by epoch so a replayed epoch replaces its first attempt), and
    the tuning metric reported with cloudml-hypertune's `HyperTune` at the end of every epoch.
    Runs before `Backup`, so an epoch is recorded before it counts as done."""

    def __init__(self, history_path: str, hp_metric: str) -> None:
        super().__init__()
        self.path, self.hp_metric = history_path, hp_metric
        self.history = load_history(history_path)
        self._hypertune = hypertune.HyperTune() if hpmetric.reporting_file(os.environ) else None

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        logs = {k: float(v) for k, v in (logs or {}).items()}
        self.history[str(epoch + 1)] = logs
        storage.write_json(self.path, self.history)
        if self._hypertune is not None:  # else not a trial, and the file is unwritable: warned at start
            self._hypertune.report_hyperparameter_tuning_metric(
                hyperparameter_metric_tag=self.hp_metric,
                metric_value=logs[self.hp_metric],  # always computed: `--hp_metric`'s choices
                global_step=epoch + 1,
            )


def load_history(path: str) -> dict[str, dict[str, float]]:
    return storage.read_json(path) if tf.io.gfile.exists(storage.resolve(path)) else {}


def history_as_lists(history: dict[str, dict[str, float]], up_to: int) -> dict[str, list[float]]:
    """Per-metric lists over epochs 1..up_to (Keras History's shape)."""
    epochs = [history[str(e)] for e in range(1, up_to + 1) if str(e) in history]
    keys = sorted({k for e in epochs for k in e})
    return {k: [e.get(k, float("nan")) for e in epochs] for k in keys}


# --- stopping on SIGTERM ----------------------------------------------------------------------

# A replica stopped on SIGTERM after saving its backup: 128 + SIGTERM, as TensorFlow's
# PreemptionCheckpointHandler exits on Google Cloud (tensorflow/python/distribute/failure_handling/
# failure_handling_util.py: _RESTARTABLE_EXIT_CODE = 143, `gce_exit_fn`). The local job runner
# reads it as a restart (docs/contracts.md, section 7).
TERMINATED_EXIT_CODE = 128 + signal.SIGTERM


class Terminated(Exception):
    """SIGTERM reached a replica: backup saved, nothing published; it exits TERMINATED_EXIT_CODE."""


class StopRequest:
    """SIGTERM, seen by this replica or by any other.

    SIGTERM stops a container before it is killed (a Spot VM: Compute Engine API,
    `Scheduling.skipGuestOsShutdown`; cloud.google.com/kubernetes-engine/docs/concepts/spot-vms;
    kubernetes.io/docs/concepts/workloads/pods/pod-termination/). The handler only sets a flag: a
    backup is a collective save and SIGTERM may reach one replica alone, so `poll` all-reduces the
    flags and all stop at the same step (as PreemptionCheckpointHandler does through the
    coordination service's key-value store). Install it after the strategy, whose SIGTERM handler
    only records the notice (`SigtermNotifier`, xla/tsl/distributed_runtime/preemption/
    preemption_notifier.cc) and lets a replica train on.
    """

    def __init__(self, strategy: Any = None, *, collective: bool = False) -> None:
        self._strategy, self._collective = strategy, collective
        self._event = threading.Event()
        self._any: Any = None

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._event.set()  # nothing else: this runs between two bytecodes of the main thread

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopRequest]:
        """Catches SIGTERM in the block (main thread only: elsewhere Python cannot install a handler)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = signal.signal(signal.SIGTERM, self._on_signal)
        try:
            yield self
        finally:
            signal.signal(signal.SIGTERM, previous)

    @property
    def received(self) -> bool:
        return self._event.is_set()

    def agreed(self) -> bool:
        """Whether any replica received SIGTERM (collective: every replica calls it at the same point)."""
        return self.poll(1)[0]

    def poll(self, steps_to_next: int) -> tuple[bool, int]:
        """`agreed()`, plus the number of steps to the next poll, the same on every replica:
        each proposes `steps_to_next` and global replica 0's proposal is kept."""
        if not self._collective:
            return self.received, 1  # a look at this process's flag: every step
        if self._any is None:
            sum_ = tf.distribute.ReduceOp.SUM

            def reduce(values: Any) -> Any:
                context = tf.distribute.get_replica_context()
                first = tf.cast(tf.equal(context.replica_id_in_sync_group, 0), tf.float32)
                # tf.identity places the host values on the replica's device; the all-reduce of
                # the bare argument fails ("destinations can not be empty", measured here).
                return context.all_reduce(sum_, tf.identity(values) * tf.stack([1.0, first]))

            self._any = tf.function(reduce)
        values = tf.constant([1.0 if self.received else 0.0, float(steps_to_next)])
        flags, steps = self._strategy.experimental_local_results(
            self._strategy.run(self._any, args=(values,))
        )[0].numpy()
        return bool(flags > 0), max(1, int(steps))

    def stopping(self, prefix: str, what: str) -> Terminated:
        """Logs that SIGTERM reached this replica or another, then `what`; returns the Terminated to raise."""
        who = "this replica" if self.received else "another replica"
        log(
            prefix,
            f"SIGTERM received by {who}: {what}, then exiting with status {TERMINATED_EXIT_CODE} "
            "(a restart resumes from the backup)",
        )
        return Terminated(what)

    def check(self, prefix: str, what: str) -> None:
        """Raises Terminated if this replica received SIGTERM (no collective: for the chief's steps alone)."""
        if self.received:
            raise self.stopping(prefix, what)


# How often, in seconds of training, the replicas check for a SIGTERM received by any of them:
# the longest a stop waits before its backup starts (on top of the step under way).
POLL_SECONDS = 1.0


class Backup(keras.callbacks.BackupAndRestore):
    """tf-keras `BackupAndRestore` in `backup_dir`, saved at the end of every epoch and, on SIGTERM
    (`StopRequest`), after the current step, then Terminated. A restart resumes at the step after
    the last one saved, mid-epoch included.

    Not tf-keras's `save_before_preemption=True` (PreemptionCheckpointHandler): it is on only where
    the GCE metadata server answers (`distributed_file_utils.support_on_demand_checkpoint_callback`);
    on a Google Cloud CPU VM it "does not support usage with TPU or CPU device on GCP" and fails; on
    a GPU VM it watches `instance/maintenance-event`, not SIGTERM
    (`failure_handling_util.termination_watcher_function_gce`).

    The integer `save_freq` makes a restart resume mid-epoch
    (`WorkerTrainingState.maybe_load_initial_counters_from_ckpt` uses the saved step only then);
    its periodic save is replaced here. Keep it after the other callbacks (an epoch counts as done
    once backed up) and before `BestEpoch`, which copies the backup just saved.
    """

    def __init__(self, backup_dir: str, steps_per_epoch: int, stop: StopRequest, prefix: str) -> None:
        adapters.check_backup_and_restore()  # the parent's save this callback calls, before training
        super().__init__(backup_dir, save_freq=steps_per_epoch, delete_checkpoint=False)
        self.steps, self.stop, self.prefix = steps_per_epoch, stop, prefix
        self.epoch = 0  # the epoch under way, 0-based
        # First poll (it traces its all-reduce) after the batches tf-keras times callbacks on
        # (CallbackList: `_num_batches_for_timing_check = 5`).
        self._to_next_poll, self._since, self._since_time = 7, 0, 0.0

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        super().on_epoch_begin(epoch, logs)
        self.epoch = epoch
        self._since, self._since_time = 0, time.perf_counter()  # validation is not step time

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._since += 1
        self._to_next_poll -= 1
        if batch >= self.steps - 1 or self._to_next_poll > 0:
            return  # the epoch's last step: its end backs it up, after validation and the record
        # A poll is an all-reduce that waits for the step (every step: 40% slower epochs), so
        # replicas poll about every POLL_SECONDS, agreeing when.
        now = time.perf_counter()
        per_step = (now - self._since_time) / max(self._since, 1)
        stop, self._to_next_poll = self.stop.poll(max(1, int(POLL_SECONDS / max(per_step, 1e-6))))
        self._since, self._since_time = 0, now
        if stop:
            error = self.stop.stopping(
                self.prefix, f"backing up epoch {self.epoch + 1} at step {batch + 1}/{self.steps}"
            )
            adapters.back_up(self, epoch=self.epoch, batch=batch)
            raise error

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        adapters.back_up(self, epoch=epoch)  # the saved step is the epoch's last: a restart starts the next
        if self.stop.agreed():
            raise self.stop.stopping(self.prefix, f"epoch {epoch + 1} is backed up")


# --- the exported epoch: the best by --hp_metric, and early stopping ---------------------------


def improves(goal: str, value: float, best: float | None) -> bool:
    """Whether `value` beats `best` (None: no epoch yet) strictly in the direction `goal` (the first
    of equals stays, as Vertex's BEST_MEASUREMENT and `local.tuner` keep it); NaN or inf never does."""
    return math.isfinite(value) and (best is None or (value > best if goal == "max" else value < best))


def latest_backup(backup_dir: str) -> str | None:
    """The newest checkpoint of the chief's backup (`adapters.BACKUP_CHIEF_FOLDER`), or None."""
    return tf.train.latest_checkpoint(storage.resolve(storage.join(backup_dir, adapters.BACKUP_CHIEF_FOLDER)))


def backup_position(checkpoint: str) -> tuple[int, int]:
    """(epoch, step), both 0-based, at which a backup checkpoint was saved (an epoch's end: its last step)."""
    reader = tf.compat.v1.train.NewCheckpointReader(checkpoint)  # the prefix, never a folder
    return int(reader.get_tensor(adapters.SAVED_EPOCH_KEY)), int(reader.get_tensor(adapters.SAVED_BATCH_KEY))


class BestEpoch(keras.callbacks.Callback):
    """Keeps the epoch with the best `config.hp_metric` as the export candidate, and stops training
    once it has not improved for `config.early_stopping_patience` epochs (0: never).

    Every replica takes the same decisions (`logs` metrics are all-reduced; the best so far is
    read from `best.json`), so all stop at the same epoch and restore the same checkpoint before
    the export (`export_plan`). Only the chief writes: with `keep_weights` (`--export_epoch best`)
    it copies an improving epoch's backup into `<checkpoint_dir>/best/epoch-<NNNN>.*`, records it
    in `best.json`, then deletes older copies (docs/training.md, "Which epoch is exported").
    """

    def __init__(
        self, config: TrainConfig, backup_dir: str, steps_per_epoch: int, *, is_chief: bool, prefix: str
    ) -> None:
        super().__init__()
        self.checkpoint_dir = checkpoint_dir = config.checkpoint_dir
        self.backup_dir, self.steps, self.epochs = backup_dir, steps_per_epoch, config.epochs
        self.metric = metric = config.hp_metric
        self.goal, self.patience = metric_goal(metric), config.early_stopping_patience
        self.keep_weights, self.is_chief, self.prefix = config.export_epoch == "best", is_chief, prefix
        self.path = storage.join(checkpoint_dir, BEST_FILE)
        # best.json's content, written or not: epoch None until an epoch has a finite metric.
        self.record: dict[str, Any] = {"metric": metric, "goal": self.goal, "epoch": None, "value": None}
        self.record.update(checkpoint=None, stopped_early_after=None)
        if tf.io.gfile.exists(storage.resolve(self.path)):
            self.record = storage.read_json(self.path)
            if self.record.get("metric") != metric:
                raise ValueError(
                    f"--checkpoint_dir {checkpoint_dir} holds a backup whose best epoch was chosen by "
                    f"--hp_metric {self.record.get('metric')} ({BEST_FILE}), not {metric}; use "
                    f"--hp_metric {self.record.get('metric')} to resume it, or another --checkpoint_dir "
                    "to start afresh"
                )
        self.trained = 0  # the last epoch trained (1-based), in this run or before the restart

    # --- the state, the same on every replica

    @property
    def best_epoch(self) -> int:
        """The best epoch so far (1-based), 0 when none had a finite metric."""
        return int(self.record.get("epoch") or 0)

    @property
    def best_value(self) -> float | None:
        return float(self.record["value"]) if self.record.get("epoch") else None

    @property
    def stopped_early(self) -> bool:
        return self.record.get("stopped_early_after") is not None

    def resume(self, history: dict[str, dict[str, float]]) -> None:
        """Before training, on every replica: where the backup stands, and the decision a crash
        lost on the last epoch it holds (from `history.json`, written before the backup). Raises
        ValueError when `best.json` names an epoch the backup has not reached."""
        latest = latest_backup(self.backup_dir)
        # Nothing backed up: as if at the end of an epoch before the first (0-based -1).
        epoch, step = backup_position(latest) if latest is not None else (-1, self.steps - 1)
        at_epoch_end = step == self.steps - 1
        self.trained = completed = epoch + 1 if at_epoch_end else epoch
        if self.best_epoch > completed:
            raise ValueError(
                f"--checkpoint_dir {self.checkpoint_dir}: {self.path} names epoch {self.best_epoch} as "
                f"the best, but the backup holds only {completed} epoch(s); use another --checkpoint_dir "
                "to start afresh"
            )
        if completed > self.best_epoch and not self.stopped_early:
            value = history.get(str(completed), {}).get(self.metric)
            if value is None:
                log(self.prefix, f"history.json has no {self.metric} for epoch {completed}: not a candidate")
            elif improves(self.goal, value, self.best_value) and self.keep_weights and not at_epoch_end:
                log(self.prefix, f"the backup no longer holds epoch {completed}'s end: not a candidate")
            else:
                self._consider(completed, float(value), latest)
        if self.stopped_early:
            log(
                self.prefix,
                f"training ended after epoch {self.record['stopped_early_after']}, stopped early (no "
                f"improvement of {self.metric} for {_epochs(self.patience)}); not training again",
            )

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        logs = logs or {}
        if self.metric not in logs:
            raise KeyError(f"--hp_metric {self.metric} was not computed; computed: {sorted(logs)}")
        self.trained = epoch + 1
        latest = latest_backup(self.backup_dir) if self.is_chief else None
        self._consider(epoch + 1, float(logs[self.metric]), latest)
        if self.stopped_early:
            self.model.stop_training = True

    def _consider(self, epoch: int, value: float, latest: str | None) -> None:
        """Epoch `epoch` (1-based) ended with `value`, and `latest` (the chief's) holds it."""
        if improves(self.goal, value, self.best_value):
            kept = "; kept as the export candidate" if self.keep_weights else ""
            log(self.prefix, f"epoch {epoch} is the best so far ({self.metric}={value:.4f}){kept}")
            if self.is_chief and self.keep_weights:
                self._copy_backup(epoch, latest)
            checkpoint = f"{BEST_DIR}/epoch-{epoch:04d}" if self.keep_weights else None
            self._update(epoch=epoch, value=value, checkpoint=checkpoint)
        elif self.patience and epoch < self.epochs and epoch - self.best_epoch >= self.patience:
            since = f"since epoch {self.best_epoch}" if self.best_epoch else "since training began"
            log(
                self.prefix,
                f"early stopping: no improvement of {self.metric} for {_epochs(epoch - self.best_epoch)} {since}",
            )
            self._update(stopped_early_after=epoch)

    # --- the chief's files

    def _copy_backup(self, epoch: int, latest: str | None) -> None:
        if latest is None or backup_position(latest) != (epoch - 1, self.steps - 1):
            raise RuntimeError(
                f"the backup in {self.backup_dir} does not hold the end of epoch {epoch} "
                f"(newest checkpoint: {latest}, at (epoch, step) "
                f"{backup_position(latest) if latest else None}, 0-based): has tf-keras's "
                "BackupAndRestore changed?"
            )
        target = storage.resolve(storage.join(self.checkpoint_dir, BEST_DIR, f"epoch-{epoch:04d}"))
        tf.io.gfile.makedirs(os.path.dirname(target))
        files = tf.io.gfile.glob(latest + ".*")
        # The index last: TensorFlow finds a checkpoint's data through its index.
        for path in sorted(files, key=lambda p: p.endswith(".index")):
            tf.io.gfile.copy(path, target + path[len(latest) :], overwrite=True)

    def _update(self, **changes: Any) -> None:
        """Changes the record on every replica, once the chief has written it to best.json."""
        record = {**self.record, **changes}
        if self.is_chief:
            storage.write_json(self.path, record)
            # Then the copies the record no longer names (and any a crash left before its record).
            folder = storage.resolve(storage.join(self.checkpoint_dir, BEST_DIR))
            keep = os.path.basename(record["checkpoint"]) + "." if record.get("checkpoint") else None
            if tf.io.gfile.isdir(folder):
                for name in tf.io.gfile.listdir(folder):
                    if keep is None or not name.startswith(keep):
                        tf.io.gfile.remove(storage.join(folder, name))
        self.record = record

    # --- the export

    def export_plan(self, export_epoch: str, *, model_is_last: bool) -> tuple[int, str | None, str]:
        """(the epoch to export, the checkpoint to restore into the model first or None, what to
        say), the same on every replica. `model_is_last`: the model holds the last epoch trained
        (not after an early stop before a restart). `best` without a best epoch exports the last."""
        if export_epoch == "best" and self.record.get("checkpoint"):
            path = storage.resolve(storage.join(self.checkpoint_dir, self.record["checkpoint"]))
            what = f"exporting epoch {self.best_epoch} (best {self.metric}={self.best_value:.4f})"
            return self.best_epoch, path, what
        if export_epoch == "best":
            what = f"no epoch had a finite {self.metric}: exporting the last, epoch {self.trained}"
        else:
            what = f"exporting epoch {self.trained}, the last trained (--export_epoch last)"
        return self.trained, None if model_is_last else latest_backup(self.backup_dir), what


def _epochs(n: int) -> str:
    return f"{n} epoch" if n == 1 else f"{n} epochs"
