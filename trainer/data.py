"""The training input pipeline over a prepared dataset (see `trainer.prepare`).

Shards are read in parallel and sharded across workers by FILE, images stay uint8 until the
device, evaluation order is deterministic. A split that fits what is left of the cache budget is
cached decoded, a larger one streamed through a shuffle buffer (`plan_cache`; docs/running.md#memory).
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath

from trainer import images, storage
from trainer._tf import tf
from trainer.config import SPLITS
from trainer.contract import METADATA_FILE
from trainer.datasetinfo import DatasetMetadata, SplitInfo, expected_records

FEATURES = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}


# --- the cache budget: which splits are cached decoded, which are streamed ------------------

CACHE_BUDGET_ENV = "TRAINER_CACHE_BUDGET_MB"
"""Overrides the cache budget: a whole number of MiB (1 MiB = 2**20 bytes) per worker process;
0 streams every split (with a 1-example training shuffle buffer)."""
CACHE_FRACTION = 0.5
"""The share of the process's memory limit the cache budget may take; the other half is for what
metadata.json cannot tell (a step's activations, tf.data's in-flight elements, fragmentation), as
tf.data's default `AutotuneOptions.ram_budget`. Overshooting gets the container OOM-killed."""
MODEL_RESERVE_BYTES = 3 << 29
"""1.5 GiB off the budget for what the model needs whatever the batch: the TensorFlow runtime
(558 MiB resident after import, the `input` benchmark) plus the largest backbone's weights,
gradients and two Adam slots (ResNet101: 44.5 M parameters x 16 bytes = 0.7 GiB)."""
EXAMPLE_OVERHEAD_BYTES = 256
"""Bytes a cached example costs beyond its pixels: the label and two tensors' bookkeeping."""
STREAM_BUFFER_FACTOR = 3
"""A streamed shuffle buffer's charge per example, in multiples of its decoded size: glibc's
per-thread arenas keep what tf.data's threads free (the `memory` benchmark: 1.8-3.0x); a cache,
filled once, costs 1x."""
UNLIMITED = 1 << 60
"""cgroup v1 writes "no limit" as a huge number (9223372036854771712); anything above this is one."""
MIB = 1 << 20


@dataclasses.dataclass(frozen=True)
class CacheBudget:
    """Bytes of decoded examples one worker process may hold in memory, and where that came from."""

    bytes: int
    source: str


def _ancestors(base: Path, cgroup_path: str) -> list[Path]:
    """`base/a/b/c`, `base/a/b`, `base/a`, `base`: a limit set on any ancestor cgroup applies."""
    parts = [part for part in PurePosixPath(cgroup_path).parts if part != "/"]
    return [base.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]


def cgroup_memory_limit(
    cgroup_root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup"
) -> tuple[int, str] | None:
    """The lowest memory limit set on this process's cgroup or its ancestors, and the file that
    sets it: cgroup v2 `memory.max` (at the root, or `unified/` on hybrid hosts) or v1
    `memory/memory.limit_in_bytes`; None when none is set or readable."""
    v2_path, v1_path = "/", "/"
    try:
        with open(proc_cgroup, encoding="utf-8") as f:
            for line in f:
                hierarchy, _, rest = line.strip().partition(":")
                controllers, _, path = rest.partition(":")
                if hierarchy == "0" and not controllers:
                    v2_path = path or "/"
                elif "memory" in controllers.split(","):
                    v1_path = path or "/"
    except OSError:
        pass  # no /proc: the roots are still worth reading (a container sees its own cgroup there)
    root = Path(cgroup_root)
    files = [d / "memory.max" for base in (root, root / "unified") for d in _ancestors(base, v2_path)]
    files += [d / "memory.limit_in_bytes" for d in _ancestors(root / "memory", v1_path)]
    limits = []
    for file in files:
        try:
            text = file.read_text(encoding="utf-8").strip()
        except OSError:
            continue
        if re.fullmatch(r"[0-9]+", text) and int(text) < UNLIMITED:  # else "max": no limit here
            limits.append((int(text), str(file)))
    return min(limits, key=lambda limit: limit[0], default=None)


def physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def cache_budget(
    environ: Mapping[str, str] | None = None,
    *,
    cgroup_root: str = "/sys/fs/cgroup",
    proc_cgroup: str = "/proc/self/cgroup",
) -> CacheBudget:
    """$TRAINER_CACHE_BUDGET_MB when set; else CACHE_FRACTION of the memory limit (the
    container's cgroup limit, else the machine's physical memory) less MODEL_RESERVE_BYTES, per
    process: workers sharing one machine (a local multi-worker run) each take it whole."""
    env = os.environ if environ is None else environ
    override = env.get(CACHE_BUDGET_ENV, "").strip()
    if override:
        if not re.fullmatch(r"[0-9]+", override):
            raise ValueError(
                f"${CACHE_BUDGET_ENV}={override!r}: expected a whole number of MiB (0 streams every split)"
            )
        return CacheBudget(int(override) * MIB, f"${CACHE_BUDGET_ENV}={override}")
    physical = physical_memory()
    limit = cgroup_memory_limit(cgroup_root, proc_cgroup)
    if limit is not None and limit[0] < physical:
        memory, where = limit[0], f"the container's memory limit {_size(limit[0])} ({limit[1]})"
    else:
        memory, where = physical, f"the machine's memory {_size(physical)}"
    budget = max(0, int(CACHE_FRACTION * memory) - MODEL_RESERVE_BYTES)
    return CacheBudget(
        budget,
        f"{CACHE_FRACTION:.0%} of {where} less {_size(MODEL_RESERVE_BYTES)} for the model "
        f"(${CACHE_BUDGET_ENV} overrides)",
    )


def _size(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} bytes"


def example_bytes(meta: DatasetMetadata) -> int:
    """Memory one decoded example takes: uint8 pixels plus EXAMPLE_OVERHEAD_BYTES."""
    return meta.image_size * meta.image_size * 3 + EXAMPLE_OVERHEAD_BYTES


def shards_by_file(info: SplitInfo, num_workers: int) -> bool:
    """FILE sharding needs a file for every worker; with fewer, every worker reads every file."""
    return len(info.shards) >= num_workers


def worker_examples(info: SplitInfo, num_workers: int) -> int:
    """The most examples of a split any one worker reads: FILE auto-sharding gives worker `w`
    shards `w, w + N, ...` (worker 0 the most); under DATA sharding every worker reads (and
    caches) every file."""
    n = len(info.shards)
    if num_workers <= 1 or not shards_by_file(info, num_workers):
        return info.count
    return sum(expected_records(info.count, n, i) for i in range(0, n, num_workers))


@dataclasses.dataclass(frozen=True)
class SplitPlan:
    """How one split is read (`plan_cache`): `examples` is the most any worker reads,
    `available_bytes` what the splits planned before left of the budget."""

    split: str
    cache: bool
    examples: int
    decoded_bytes: int
    available_bytes: int
    budget: CacheBudget
    shuffle_buffer: int
    requested_shuffle_buffer: int

    def describe(self, shards: int) -> str:
        per = self.decoded_bytes // max(self.examples, 1)
        size = f"{self.examples:,} examples x {_size(per)} = {_size(self.decoded_bytes)} decoded per worker"
        budget = f"{_size(self.available_bytes)} of the cache budget left (budget {_size(self.budget.bytes)}: {self.budget.source})"
        if self.cache:
            return f"split {self.split!r}: cached in memory: {size} fits {budget}"
        line = f"split {self.split!r}: streamed from {shards} shard(s) every epoch: {size} exceeds {budget}"
        if self.split == "train":
            line += (
                f"; training shuffle buffer {self.shuffle_buffer:,} examples ({_size(self.shuffle_buffer * per)}"
                f" decoded, charged {STREAM_BUFFER_FACTOR}x)"
            )
            if self.shuffle_buffer < min(self.requested_shuffle_buffer, self.examples):
                line += f", cut from --shuffle_buffer {self.requested_shuffle_buffer:,} to fit the budget"
        return line


def plan_cache(
    meta: DatasetMetadata, budget: CacheBudget, *, num_workers: int = 1, shuffle_buffer: int = 2048
) -> dict[str, SplitPlan]:
    """Cache or stream each split, in the order train, validation, test, sharing one budget: a
    split is cached when its decoded size fits what the splits before it left; a streamed training
    split's shuffle buffer is charged instead (STREAM_BUFFER_FACTOR times its decoded size)."""
    per = example_bytes(meta)
    left = budget.bytes
    plans = {}
    for split in SPLITS:
        info = meta.splits[split]
        examples = worker_examples(info, num_workers)
        need = examples * per
        cache = need <= left
        buffer = min(shuffle_buffer, max(examples, 1))
        if not cache and split == "train":
            buffer = min(buffer, max(1, left // (per * STREAM_BUFFER_FACTOR)))
        plans[split] = SplitPlan(split, cache, examples, need, left, budget, buffer, shuffle_buffer)
        if cache:
            left -= need
        elif split == "train":
            left = max(0, left - buffer * per * STREAM_BUFFER_FACTOR)
    return plans


def _say(message: str) -> None:
    print(f"[data] {message}", file=sys.stdout, flush=True)  # noqa: T201 - the job's log, as callbacks.log


def make_dataset(
    data_dir: str,
    meta: DatasetMetadata,
    split: str,
    *,
    batch_size: int,
    training: bool,
    seed: int = 0,
    shuffle_buffer: int = 2048,
    num_workers: int = 1,
    budget: CacheBudget | None = None,
    log: Callable[[str], None] | None = _say,
) -> tf.data.Dataset:
    """Batches of (uint8 images [B, S, S, 3], int32 labels [B]) from one split; `batch_size` is
    the global batch. Training datasets repeat forever (callers give `steps_per_epoch`), so every
    worker runs the same steps whatever its shards hold. `budget` (default `cache_budget()`)
    decides cached or streamed (`plan_cache`); `log` gets the line saying which (None: silent)."""
    info = meta.splits[split]
    files = [storage.resolve(storage.join(data_dir, shard)) for shard in info.shards]
    plans = plan_cache(meta, budget or cache_budget(), num_workers=num_workers, shuffle_buffer=shuffle_buffer)
    plan = plans[split]
    if log is not None:
        log(plan.describe(len(files)))

    def parse(record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        example = tf.io.parse_single_example(record, FEATURES)
        image = images.decode_stored(example["image"], meta.encoding, meta.image_size)
        return image, tf.cast(example["label"], tf.int32)

    # Streamed training shuffles the shard order every epoch and reads each shard from a seeded
    # offset (a folder's records are written class by class: shards read from their starts in
    # lockstep would fill the shuffle buffer with one class at a time).
    deterministic = not training or not plan.cache
    ds = tf.data.Dataset.from_tensor_slices(files)
    read: Callable[[tf.Tensor], tf.data.Dataset] = tf.data.TFRecordDataset
    if training and not plan.cache:
        ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
        read = _from_offset(info.count // len(files), seed)
    ds = ds.interleave(
        read,
        cycle_length=min(len(files), 16),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=deterministic,
    )
    if plan.cache:
        ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic).cache()
    if training:
        # Streamed: before `repeat`, so every epoch holds each example once and the buffer empties.
        ds = ds.shuffle(plan.shuffle_buffer, seed=seed, reshuffle_each_iteration=True).repeat()
    if not plan.cache:
        ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.batch(batch_size, drop_remainder=training).prefetch(tf.data.AUTOTUNE)

    options = tf.data.Options()
    policy = tf.data.experimental.AutoShardPolicy
    options.experimental_distribute.auto_shard_policy = (
        policy.FILE if shards_by_file(info, num_workers) else policy.DATA
    )
    options.deterministic = deterministic
    # No autotuning model (parallel steps run at min(16, cores), AutotuneOptions'
    # initial_parallelism; prefetch keeps its own tuner): its thread delayed a worker's `model.fit`
    # by up to 97 s after its last epoch, the chief waiting on it (docs/facts.md, fact 37).
    options.autotune.enabled = False
    return ds.with_options(options)


def untune_device_iterators() -> None:
    """Turns the autotuning model off in the per-device iterators of every MultiDeviceIterator
    this process builds (what a strategy and Keras' `fit` feed each replica from): TensorFlow
    builds them with default options (`tensorflow/python/data/ops/multi_device_iterator_ops.py`,
    `_create_device_dataset`), which no public option reaches, and their model thread made
    `model.fit` return late while the other replicas waited (docs/facts.md, fact 37). Idempotent."""
    from tensorflow.python.data.ops import multi_device_iterator_ops as mdi

    build = mdi._create_device_dataset
    if getattr(build, "untuned", False):
        return

    def untuned(*args: object, **kwargs: object) -> tf.data.Dataset:
        options = tf.data.Options()
        options.autotune.enabled = False
        return build(*args, **kwargs).with_options(options)

    untuned.untuned = True  # type: ignore[attr-defined]
    mdi._create_device_dataset = untuned


def _from_offset(fewest: int, seed: int) -> Callable[[tf.Tensor], tf.data.Dataset]:
    """Reads a shard from an offset below `fewest` (the records of the smallest shard; at least 1)
    that its name and `seed` give, then from its start."""
    salt, buckets = f":{seed}", max(1, fewest)

    def read(path: tf.Tensor) -> tf.data.Dataset:
        name = tf.strings.regex_replace(path, r"^.*/", "")
        offset = tf.strings.to_hash_bucket_fast(name + salt, buckets)
        return (
            tf.data.TFRecordDataset(path).skip(offset).concatenate(tf.data.TFRecordDataset(path).take(offset))
        )

    return read


def steps_per_epoch(meta: DatasetMetadata, global_batch_size: int) -> int:
    """Full global batches in one pass over the training split (at least 1: a global batch larger
    than the split is refused first, `check_global_batch`)."""
    return max(1, meta.splits["train"].count // global_batch_size)


class BatchTooLarge(ValueError):
    """The global batch is larger than the training split; the message is one line."""


def check_global_batch(
    meta: DatasetMetadata, per_replica_batch_size: int, replicas: int, data_dir: str
) -> None:
    """Raises BatchTooLarge when `per_replica_batch_size x replicas` exceeds the training split:
    no error would come otherwise (batches follow `repeat()`, so one would hold images twice, and
    `steps_per_epoch`'s max(1, ...) would call one step an epoch)."""
    count = meta.splits["train"].count
    global_batch = per_replica_batch_size * replicas
    if global_batch <= count:
        return
    largest = count // max(1, replicas)  # the largest per-replica batch that fits (0: none)
    fix = (
        f"the largest --per_replica_batch_size that fits is {largest}"
        if largest
        else f"no --per_replica_batch_size fits {replicas} replicas: use fewer replicas or more data"
    )
    raise BatchTooLarge(
        f"--per_replica_batch_size {per_replica_batch_size} x {replicas} replica{'' if replicas == 1 else 's'} "
        f"= a global batch of {global_batch}, more than the {count} images of the training split "
        f"({storage.join(data_dir, METADATA_FILE)}): not one step fits in an epoch; {fix}"
    )
