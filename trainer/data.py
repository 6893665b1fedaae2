"""The training input pipeline over a prepared dataset (see `trainer.prepare`).

Built for speed: TFRecord shards are read in parallel and sharded across workers by FILE (each
worker reads only its own files), images stay uint8 until they reach the device, are decoded
once and cached in memory, and batches are prefetched. Training order is non-deterministic
(faster); evaluation order is deterministic.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import statistics
from collections.abc import Mapping
from typing import Any

from trainer import images, storage
from trainer._tf import tf
from trainer.config import SPLITS
from trainer.contract import METADATA_FILE
from trainer.contract import METADATA_FORMAT_VERSION as FORMAT_VERSION

FEATURES = {
    "image": tf.io.FixedLenFeature([], tf.string),
    "label": tf.io.FixedLenFeature([], tf.int64),
}


@dataclasses.dataclass(frozen=True)
class SplitInfo:
    count: int
    shards: tuple[str, ...]
    class_counts: Mapping[str, int]


@dataclasses.dataclass(frozen=True)
class DatasetMetadata:
    """What `metadata.json` says about a prepared dataset."""

    class_names: tuple[str, ...]
    image_size: int
    encoding: str
    splits: Mapping[str, SplitInfo]
    fingerprint: str
    source: str

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DatasetMetadata:
        if data.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"prepared dataset has format_version {data.get('format_version')!r}; this "
                f"trainer reads format_version {FORMAT_VERSION}: prepare the dataset again"
            )
        splits = {
            name: SplitInfo(
                count=int(s["count"]),
                shards=tuple(s["shards"]),
                class_counts=dict(s["class_counts"]),
            )
            for name, s in data["splits"].items()
        }
        missing = [s for s in SPLITS if s not in splits]
        if missing:
            raise ValueError(f"prepared dataset lacks the split(s) {missing}")
        return cls(
            class_names=tuple(data["class_names"]),
            image_size=int(data["image_size"]),
            encoding=str(data["encoding"]),
            splits=splits,
            fingerprint=str(data["fingerprint"]),
            source=str(data["source"]),
        )


VERIFY_ENV = "TRAINER_VERIFY_DATA"
VERIFY_MODES = ("size", "full")
SIZE_TOLERANCE = 2.0
"""A shard whose bytes per expected record differ from the dataset's median by more than this
factor (either way) is refused: truncated, or swapped with a shard of another split."""
MIN_RECORDS_TO_COMPARE = 4
"""Shards expected to hold fewer records are left out of that size comparison (compressed images
vary in size; a few of them are no fair sample)."""

_REPREPARE = "prepare the dataset again (`python -m trainer.prepare ... --overwrite`)"


class DataError(ValueError):
    """A prepared dataset's files do not match its metadata.json."""


def load_metadata(data_dir: str, verify: str | None = None) -> DatasetMetadata:
    """Reads `metadata.json` and checks the shards it lists (see `verify_shards`).

    `verify`: "size" (cheap: every shard exists, is named for its split and position, and its
    size fits its expected record count) or "full" (also reads every record: exact record counts,
    CRCs, and the dataset fingerprint); None takes $TRAINER_VERIFY_DATA, else "size"."""
    path = storage.join(data_dir, METADATA_FILE)
    if not tf.io.gfile.exists(storage.resolve(path)):
        raise FileNotFoundError(
            f"{path} not found: --data_dir must be a folder written by `python -m trainer.prepare`"
        )
    meta = DatasetMetadata.from_json(storage.read_json(path))
    verify_shards(data_dir, meta, verify)
    return meta


def expected_records(count: int, shards: int, index: int) -> int:
    """Records in shard `index` of a split: `trainer.prepare` writes round-robin."""
    return count // shards + (1 if index < count % shards else 0)


def verify_shards(data_dir: str, meta: DatasetMetadata, verify: str | None = None) -> None:
    """Raises DataError naming the shard, its split, what was expected and what was found."""
    mode = verify or os.environ.get(VERIFY_ENV) or "size"
    if mode not in VERIFY_MODES:
        raise ValueError(f"verify={mode!r} (or ${VERIFY_ENV}): expected one of {VERIFY_MODES}")
    per_record: dict[tuple[str, str], float] = {}
    for split, info in meta.splits.items():
        n = len(info.shards)
        for i, shard in enumerate(info.shards):
            where = f"shard {shard} of split {split!r} in {data_dir}"
            expected_name = f"{split}-{i:05d}-of-{n:05d}.tfrecord"
            if shard != expected_name:
                raise DataError(
                    f"{where}: metadata.json lists it as shard {i} of {n} of split {split!r}, "
                    f"which trainer.prepare names {expected_name}; found {shard}: {_REPREPARE}"
                )
            path = storage.resolve(storage.join(data_dir, shard))
            if not tf.io.gfile.exists(path):
                raise DataError(f"{where}: expected the file, found none: {_REPREPARE}")
            size = tf.io.gfile.stat(path).length
            records = expected_records(info.count, n, i)
            if records and size == 0:
                raise DataError(f"{where}: expected {records} records, found an empty file: {_REPREPARE}")
            if records >= MIN_RECORDS_TO_COMPARE:
                per_record[(split, shard)] = size / records
    if len(per_record) >= 2:
        # metadata.json records no per-shard sizes; every record is one image of the same size
        # and encoding, so bytes per expected record should agree across all shards.
        median = statistics.median(per_record.values())
        for (split, shard), value in per_record.items():
            if not median / SIZE_TOLERANCE <= value <= median * SIZE_TOLERANCE:
                info = meta.splits[split]
                records = expected_records(info.count, len(info.shards), info.shards.index(shard))
                raise DataError(
                    f"shard {shard} of split {split!r} in {data_dir}: expected {records} records "
                    f"of about {median:.0f} bytes each (about {records * median:.0f} bytes), found "
                    f"{records * value:.0f} bytes, as if truncated or swapped with a shard of "
                    f"another split: {_REPREPARE}"
                )
    if mode == "full":
        _verify_full(data_dir, meta)


def _verify_full(data_dir: str, meta: DatasetMetadata) -> None:
    """Reads every record: CRCs, exact counts per shard, and the fingerprint, as prepare hashes."""
    digests = hashlib.sha256()
    for split in SPLITS:
        info = meta.splits[split]
        hashes = {}
        for i, shard in enumerate(info.shards):
            path = storage.resolve(storage.join(data_dir, shard))
            h, found = hashlib.sha256(), 0
            try:
                for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
                    h.update(len(record).to_bytes(8, "little") + record)
                    found += 1
            except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
                raise DataError(
                    f"shard {shard} of split {split!r} in {data_dir}: expected intact records, "
                    f"found a corrupted one after {found} records ({e.message}): {_REPREPARE}"
                ) from None
            records = expected_records(info.count, len(info.shards), i)
            if found != records:
                raise DataError(
                    f"shard {shard} of split {split!r} in {data_dir}: expected {records} records, "
                    f"found {found}: {_REPREPARE}"
                )
            hashes[shard] = h.hexdigest()
        for name in sorted(hashes):
            digests.update(f"{name}:{hashes[name]}\n".encode())
    found_fp = f"sha256:{digests.hexdigest()}"
    if found_fp != meta.fingerprint:
        raise DataError(
            f"shards in {data_dir}: expected the fingerprint {meta.fingerprint} recorded in "
            f"metadata.json, found {found_fp}: some shard's content was replaced (metadata.json "
            f"records no per-shard hashes, so which one is unknown): {_REPREPARE}"
        )


def explain_read_error(
    error: tf.errors.OpError, data_dir: str, meta: DatasetMetadata, split: str
) -> DataError:
    """A DataError naming the files of `split` for a read error raised while iterating it
    (TensorFlow's `corrupted record at N` names no file)."""
    files = ", ".join(meta.splits[split].shards)
    return DataError(
        f"reading split {split!r} in {data_dir} failed ({error.message}); its shards: {files}. "
        f'Find the bad one with `{VERIFY_ENV}=full` (or load_metadata(..., verify="full")), '
        f"then {_REPREPARE}"
    )


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
) -> tf.data.Dataset:
    """Batches of (uint8 images [B, S, S, 3], int32 labels [B]) from one split.

    `batch_size` is the global batch: under a distribution strategy each replica receives its
    share. Training datasets repeat forever (callers give `steps_per_epoch`), so every worker
    runs the same number of steps whatever its shards hold; evaluation datasets end.
    With fewer shards than `num_workers` (tiny datasets) FILE sharding is impossible and
    every worker reads all files, keeping its share of the examples (DATA sharding).
    """
    info = meta.splits[split]
    files = [storage.resolve(storage.join(data_dir, shard)) for shard in info.shards]
    size, encoding = meta.image_size, meta.encoding

    def parse(record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        example = tf.io.parse_single_example(record, FEATURES)
        image = images.decode_stored(example["image"], encoding, size)
        return image, tf.cast(example["label"], tf.int32)

    ds = tf.data.Dataset.from_tensor_slices(files)
    ds = ds.interleave(
        tf.data.TFRecordDataset,
        cycle_length=min(len(files), 16),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=not training,
    )
    ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=not training)
    ds = ds.cache()
    if training:
        ds = ds.shuffle(min(shuffle_buffer, max(info.count, 1)), seed=seed, reshuffle_each_iteration=True)
        ds = ds.repeat()
    ds = ds.batch(batch_size, drop_remainder=training).prefetch(tf.data.AUTOTUNE)

    options = tf.data.Options()
    policy = tf.data.experimental.AutoShardPolicy
    by_file = len(files) >= num_workers
    options.experimental_distribute.auto_shard_policy = policy.FILE if by_file else policy.DATA
    options.deterministic = not training
    return ds.with_options(options)


def steps_per_epoch(meta: DatasetMetadata, global_batch_size: int) -> int:
    return max(1, meta.splits["train"].count // global_batch_size)
