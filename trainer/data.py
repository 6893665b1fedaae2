"""The training input pipeline over a prepared dataset (see `trainer.prepare`).

Built for speed: TFRecord shards are read in parallel and sharded across workers by FILE (each
worker reads only its own files), images stay uint8 until they reach the device, are decoded
once and cached in memory, and batches are prefetched. Training order is non-deterministic
(faster); evaluation order is deterministic.
"""

from __future__ import annotations

import dataclasses
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


def load_metadata(data_dir: str) -> DatasetMetadata:
    path = storage.join(data_dir, METADATA_FILE)
    if not tf.io.gfile.exists(storage.resolve(path)):
        raise FileNotFoundError(
            f"{path} not found: --data_dir must be a folder written by `python -m trainer.prepare`"
        )
    return DatasetMetadata.from_json(storage.read_json(path))


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
