"""Entry point of the trainer image: `python -m trainer.task --data_dir ... [flags]`.

Runs as a single machine (no `TF_CONFIG`) or as one task of a MultiWorkerMirroredStrategy
cluster (Vertex AI writes `TF_CONFIG`), resuming a backup in `--checkpoint_dir`. The chief
publishes to `--model_dir`, atomically, a SavedModel whose `serving_default` takes encoded
images, `metrics.json` and `config.json` (docs/contracts.md, section 4): the best epoch's weights
by `--hp_metric` (docs/training.md, "Which epoch is exported"). Exit statuses (2 and 3 before the
strategy, 143 on SIGTERM, backed up and nothing published): docs/contracts.md, section 1.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from trainer.config import STATE_FIELDS, TrainConfig, gpu_request, parse_args, resolve_augment
from trainer.contract import CONFIG_FILE, HISTORY_FILE, METRICS_FILE, STATE_FILE
from trainer.distribute import (
    GPUS_MISSING_EXIT_CODE,
    ClusterInfo,
    GpusMissing,
    check_gpus,
    cluster_from_tf_config,
)
from trainer.hpmetric import MetricFileError, reporting_file


def run(
    config: TrainConfig,
    *,
    cluster: ClusterInfo | None = None,
    strategy: Any = None,
    callbacks: Sequence[Any] = (),
) -> dict[str, Any] | None:
    """Trains, evaluates and exports. Returns the metrics on the chief, None elsewhere.

    `strategy` and `callbacks` are for tests. Raises `callbacks.Terminated` on SIGTERM, and
    `data.BatchTooLarge` when the global batch exceeds the training split.
    """
    from trainer import callbacks as cb
    from trainer import data, datasetinfo, distribute, export
    from trainer import model as model_lib
    from trainer._tf import tf

    cluster = cluster or ClusterInfo()
    if strategy is None:
        # Before the strategy (a multi-worker one waits for every replica): every replica reads
        # the same file with the same flags, so all stop here together. The replicas it will have:
        # one per GPU (or one for the CPU) per machine; listing physical devices is no TensorFlow op.
        replicas = cluster.num_workers * max(1, len(tf.config.list_physical_devices("GPU")))
        meta = datasetinfo.read_metadata(config.data_dir)
        data.check_global_batch(meta, config.per_replica_batch_size, replicas, config.data_dir)
    strategy = strategy or distribute.create_strategy(cluster)  # before any other TF op
    # After the strategy, whose own SIGTERM handler this one replaces (callbacks.StopRequest).
    stop = cb.StopRequest(strategy, collective=cluster.is_multi_worker)
    with stop.installed():
        started = time.perf_counter()
        cb.log(cluster.name, f"config: {json.dumps(config.to_dict(), sort_keys=True)}")
        plan = _plan(config, cluster, strategy, stop)
        config, meta = plan.config, plan.meta  # `--augment auto` resolved
        common: dict[str, Any] = dict(
            seed=config.seed, shuffle_buffer=config.shuffle_buffer, num_workers=cluster.num_workers
        )
        train_ds = data.make_dataset(
            config.data_dir, meta, "train", batch_size=plan.global_batch, training=True, **common
        )
        val_ds = data.make_dataset(
            config.data_dir, meta, "validation", batch_size=plan.global_batch, training=False, **common
        )
        data.untune_device_iterators()
        cb.log(
            cluster.name,
            f"{cluster.num_workers} worker(s), {plan.replicas} replica(s) in sync ({type(strategy).__name__}), "
            f"global batch {plan.global_batch}, {plan.steps} steps/epoch, precision {plan.policy}, "
            f"{meta.splits['train'].count} training images of {meta.num_classes} classes",
        )
        with strategy.scope():
            model = model_lib.build_model(config, meta.num_classes, meta.image_size)
            model_lib.compile_model(
                model,
                config,
                global_batch=plan.global_batch,
                steps_per_epoch=plan.steps,
                class_counts=[meta.splits["train"].class_counts.get(n, 0) for n in meta.class_names],
            )
        best, exported_epoch = _train(plan, model, train_ds, val_ds, callbacks)
        if not cluster.is_chief:
            # A non-chief replica's export: saved (its collectives match the chief's), then deleted.
            with tempfile.TemporaryDirectory(prefix="worker-model-") as scratch:
                export.save(model, scratch, meta.class_names, meta.image_size)
            stop.check(cluster.name, "the model was saved and discarded (non-chief)")
            cb.log(cluster.name, "done (non-chief: model discarded)")
            return None
        return _publish(plan, model, best, exported_epoch, started)


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What the phases of `run` share, fixed once the data is read and checked."""

    config: TrainConfig  # with `--augment auto` resolved
    cluster: ClusterInfo
    stop: Any  # callbacks.StopRequest
    meta: Any  # datasetinfo.DatasetMetadata of config.data_dir
    replicas: int  # the strategy's replicas in sync
    global_batch: int
    steps: int  # per epoch
    policy: str  # the Keras precision policy
    history_path: str  # history.json in config.checkpoint_dir


def precision_policy(mixed_precision: bool, gpus: bool) -> str:
    """The Keras precision policy: mixed_float16 on a GPU, mixed_bfloat16 on a CPU, else float32."""
    return ("mixed_float16" if gpus else "mixed_bfloat16") if mixed_precision else "float32"


def _plan(config: TrainConfig, cluster: ClusterInfo, strategy: Any, stop: Any) -> _Plan:
    """Reads metadata.json and checks the global batch against it, resolves `--augment auto`,
    seeds, sets the precision policy and checks that a backup being resumed is this run's."""
    from trainer import data, datasetinfo, storage
    from trainer._tf import keras, tf

    meta = datasetinfo.load_metadata(config.data_dir)
    replicas = strategy.num_replicas_in_sync
    # Again with the strategy's own count of replicas, before anything is written.
    data.check_global_batch(meta, config.per_replica_batch_size, replicas, config.data_dir)
    # `--augment auto` follows the data (before the resume check: a backup records the policy used).
    config = dataclasses.replace(config, augment=resolve_augment(config.augment, meta.source))
    keras.utils.set_random_seed(config.seed)
    policy = precision_policy(config.mixed_precision, bool(tf.config.list_physical_devices("GPU")))
    keras.mixed_precision.set_global_policy(policy)
    # A backup can only be resumed by a run that builds the same variables on the same data.
    path = storage.join(config.checkpoint_dir, STATE_FILE)
    state = {**{f: getattr(config, f) for f in STATE_FIELDS}, "dataset_fingerprint": meta.fingerprint}
    if tf.io.gfile.exists(storage.resolve(path)):
        saved = storage.read_json(path)
        differ = sorted(k for k in state if saved.get(k) != state[k])
        if differ:
            raise ValueError(
                f"--checkpoint_dir {config.checkpoint_dir} holds a backup of another run "
                f"(different {', '.join(differ)}: {', '.join(f'{k}={saved.get(k)!r}' for k in differ)}); "
                "use the same flags to resume it, or another --checkpoint_dir to start afresh"
            )
    elif cluster.is_chief:
        storage.write_json(path, state)

    global_batch = config.per_replica_batch_size * replicas
    steps = data.steps_per_epoch(meta, global_batch)
    history = storage.join(config.checkpoint_dir, HISTORY_FILE)
    return _Plan(config, cluster, stop, meta, replicas, global_batch, steps, policy, history)


def _train(plan: _Plan, model: Any, train_ds: Any, val_ds: Any, callbacks: Sequence[Any]) -> tuple[Any, int]:
    """Trains from where a backup being resumed stands, backing up every epoch, then loads the
    `--export_epoch` weights into `model`; returns the best epoch's tracker (`callbacks.BestEpoch`)
    and the exported epoch (1-based). Raises `callbacks.Terminated` when another replica received
    SIGTERM."""
    from trainer import callbacks as cb
    from trainer import datasetinfo, storage
    from trainer._tf import keras, tf

    config, cluster, stop, steps = plan.config, plan.cluster, plan.stop, plan.steps
    prefix = cluster.name
    backup_dir = storage.join(config.checkpoint_dir, "backup")
    best = cb.BestEpoch(config, backup_dir, steps, is_chief=cluster.is_chief, prefix=prefix)
    best.resume(cb.load_history(plan.history_path))
    fit_callbacks: list[Any] = [cb.ProgressLogger(prefix, config.epochs, steps, plan.global_batch)]
    if cluster.is_chief:
        fit_callbacks += [
            cb.EpochRecorder(plan.history_path, config.hp_metric),
            keras.callbacks.TensorBoard(storage.resolve(config.tensorboard_dir), profile_batch=0),
        ]
    fit_callbacks += [
        *callbacks,
        # In this order: callbacks.Backup's docstring says why.
        cb.Backup(storage.resolve(backup_dir), steps, stop, prefix),
        best,
    ]
    trains = not best.stopped_early  # else stopped early before a restart: nothing more to train
    if trains:
        try:
            model.fit(
                train_ds,
                epochs=config.epochs,
                steps_per_epoch=steps,
                validation_data=val_ds,
                callbacks=fit_callbacks,
                verbose=0,
            )
        except tf.errors.DataLossError as err:  # a corrupt record (its CRC): name the shards
            raise datasetinfo.explain_read_error(
                err, config.data_dir, plan.meta, ("train", "validation")
            ) from None
    # SIGTERM after the last epoch's check: the export (collective) never starts. Every epoch is
    # backed up, so a restart goes straight to the export.
    if stop.agreed():
        raise stop.stopping(prefix, "training is backed up; the model is not exported")
    # Every replica loads the exported epoch's weights: the export reads the BatchNorm statistics
    # with collectives. The chief finished copying them before `stop.agreed()` above.
    exported_epoch, weights, what = best.export_plan(config.export_epoch, model_is_last=trains)
    cb.log(prefix, what)
    if weights is not None:
        tf.train.Checkpoint(model=model).restore(weights).expect_partial().assert_existing_objects_matched()
    return best, exported_epoch


def _publish(plan: _Plan, model: Any, best: Any, exported_epoch: int, started: float) -> dict[str, Any]:
    """The chief's export: the SavedModel, evaluated as published, with metrics.json and
    config.json, published to --model_dir atomically; returns the metrics."""
    from trainer import callbacks as cb
    from trainer import export, storage
    from trainer._tf import keras

    config, prefix, stop = plan.config, plan.cluster.name, plan.stop
    with storage.staged_output(config.model_dir) as staging:
        export.save(model, staging, plan.meta.class_names, plan.meta.image_size)
        # From here the chief works alone: a SIGTERM leaves the block by an exception, so the
        # staging folder is removed and nothing is published.
        stop.check(prefix, "the export is discarded, nothing is published")
        # Evaluate the artifact being published, loaded outside the strategy: the chief alone
        # can then run it (the trained model's BatchNorm statistics are read by collectives).
        published = keras.models.load_model(staging, compile=False)
        metrics = _metrics(published, plan, best, exported_epoch, started)
        storage.write_json(os.path.join(staging, METRICS_FILE), metrics)
        storage.write_json(os.path.join(staging, CONFIG_FILE), config.to_dict())
        stop.check(prefix, "the export is discarded, nothing is published")
    cb.log(
        prefix,
        f"published {config.model_dir}: test_accuracy={metrics['test_accuracy']:.4f} "
        f"val_accuracy={metrics['val_accuracy']:.4f}",
    )
    return metrics


def _metrics(published: Any, plan: _Plan, best: Any, exported_epoch: int, started: float) -> dict[str, Any]:
    """metrics.json: the published model's exact figures over the whole validation and test splits
    (`trainer.evaluate.summarize`, as the gate's evaluation job computes them), the training
    history, the exported epoch's (1-based) training loss and accuracy, and how it was trained."""
    import numpy as np

    from trainer import callbacks as cb
    from trainer import evaluate
    from trainer._tf import tf

    config, meta = plan.config, plan.meta
    predict = tf.function(lambda x: published(x, training=False))
    out: dict[str, Any] = {}
    for split, key in (("validation", "val"), ("test", "test")):
        labels, probs = evaluate.predict_split(lambda x: predict(x).numpy(), config.data_dir, meta, split)
        figures = evaluate.summarize(labels, probs, meta.class_names)
        out.update({f"{key}_{name}": figures[name] for name in ("loss", "accuracy", "examples")})
        if split == "test":
            out.update({name: figures[name] for name in ("confusion_matrix", "per_class", "macro_f1")})
    hist = cb.history_as_lists(cb.load_history(plan.history_path), config.epochs)
    rates = hist.get("images_per_second", [])
    steady = rates[1:] or rates  # the first epoch also fills the cache
    return {
        **out,
        "train_loss": _at_epoch(hist, "loss", exported_epoch),
        "train_accuracy": _at_epoch(hist, "accuracy", exported_epoch),
        "epochs_completed": len(hist.get("loss", [])),
        "history": hist,
        "class_names": list(meta.class_names),
        "images_per_second": float(np.mean(steady)) if steady else None,
        "hp_metric": config.hp_metric,
        "best_epoch": exported_epoch,
        "export_epoch": config.export_epoch,
        "selection_metric": config.hp_metric,
        "stopped_early": best.stopped_early,
        "num_workers": plan.cluster.num_workers,
        "replicas": plan.replicas,
        "global_batch_size": plan.global_batch,
        "precision_policy": plan.policy,
        "dataset_fingerprint": meta.fingerprint,
        "wall_seconds": time.perf_counter() - started,
    }


def _at_epoch(hist: dict[str, list[float]], key: str, epoch: int) -> float | None:
    values = hist.get(key, [])
    return values[epoch - 1] if 0 < epoch <= len(values) else None


def _error(error: Exception, status: int) -> int:
    print(f"python -m trainer.task: error: {error}", file=sys.stderr, flush=True)
    return status


def main(argv: Sequence[str] | None = None, callbacks: Sequence[Any] = ()) -> int:
    """The command line (`callbacks`: extra Keras callbacks, for tests that run replicas)."""
    config = parse_args(argv)  # exits with status 2 on a bad flag, before TensorFlow loads
    try:
        cluster = cluster_from_tf_config(os.environ.get("TF_CONFIG"))
        # The chief alone reports the tuning metric: in a tuning trial, fail now if it cannot
        # write the metric file, not after an epoch (outside a trial this only warns).
        if cluster.is_chief:
            reporting_file(os.environ)
        # Before the strategy: no training on CPU while GPUs are billed.
        request = gpu_request(os.environ)
    except (ValueError, MetricFileError) as e:
        return _error(e, 2)
    if request is not None:
        try:
            print(f"[{cluster.name}] {check_gpus(request, cluster)}", flush=True)
        except GpusMissing as e:
            return _error(e, GPUS_MISSING_EXIT_CODE)
    from trainer import callbacks as cb
    from trainer import data, datasetinfo

    try:
        run(config, cluster=cluster, callbacks=callbacks)
    except cb.Terminated:
        return cb.TERMINATED_EXIT_CODE  # the backup is saved; already said on screen
    except data.BatchTooLarge as e:  # a bad flag for this data: one line, the status of a bad flag
        return _error(e, 2)
    except datasetinfo.DataError as e:  # the prepared data is damaged: named, without a traceback
        return _error(e, 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
