"""Writing a prepared dataset: the source's images, resized once and encoded, in round-robin
TFRecord shards per split (`ShardWriter`), then `metadata.json`: the source's identity
(`source_identity`), the counts per split and class, the manifest of every shard (name, exact
size, records, SHA-256 of its bytes) and the dataset's fingerprint over them
(`trainer.datasetinfo.manifest_fingerprint`)."""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
from collections.abc import Mapping
from typing import Any

from trainer import datasetinfo, images, storage
from trainer._tf import tf
from trainer.config import SPLITS
from trainer.contract import METADATA_FILE, METADATA_FORMAT_VERSION
from trainer.datasetinfo import expected_records, shard_names
from trainer.preparation import folders
from trainer.preparation.carving import carve_plan
from trainer.preparation.prepareconfig import PrepareConfig
from trainer.preparation.progress import Progress
from trainer.preparation.source import PrepareError, Source

# A split with fewer images than this of a class gets a warning: its accuracy is too noisy.
FEW_IMAGES_PER_CLASS = 5


# --- where each image goes: the rules both engines follow (trainer/preparation/beamprep.py, write_dataset) --


def target_split(source_split: str, index: int, assignment: Any) -> str:
    """The output split of image `index` of the source's split `source_split`: a train image
    goes where carving assigned it (`carve_plan`), any other split's stays in its split."""
    return SPLITS[assignment[index]] if source_split == "train" else source_split


def record_encoder(config: PrepareConfig) -> Any:
    """The map from a source's (uint8 image, label) to (stored image bytes, label), both engines'."""

    def encode(image: Any, label: Any) -> tuple[Any, Any]:
        return images.encode(images.resize(images.rgb(image), config.image_size), config.encoding), label

    return encode


class ShardWriter:
    """Round-robin TFRecord shards for one split; `close` gives their manifest."""

    def __init__(self, folder: str, split: str, count: int, shards: int) -> None:
        self.folder = folder
        self.names = shard_names(split, count, shards)
        self._writers = [tf.io.TFRecordWriter(os.path.join(folder, name)) for name in self.names]
        self.written = 0
        self.manifest: list[dict[str, Any]] = []

    def write(self, record: bytes) -> None:
        self._writers[self.written % len(self.names)].write(record)
        self.written += 1

    def close(self) -> None:
        """Closes and hashes the shards into `manifest` (trainer.contract.METADATA_SHARD_KEYS)."""
        for w in self._writers:
            w.close()
        paths, n = [os.path.join(self.folder, name) for name in self.names], len(self.names)
        with concurrent.futures.ThreadPoolExecutor(datasetinfo.HASH_THREADS) as pool:
            digests = list(pool.map(datasetinfo.shard_digest, paths))
        self.manifest = [
            {"name": name, "bytes": size, "records": expected_records(self.written, n, i), "sha256": sha}
            for i, (name, (sha, size)) in enumerate(zip(self.names, digests, strict=True))
        ]


def few_images_warnings(class_counts: Mapping[str, Mapping[str, int]]) -> list[str]:
    """One warning per split that has fewer than FEW_IMAGES_PER_CLASS images of some class."""
    warnings = []
    for split, counts in class_counts.items():
        if few := {name: n for name, n in counts.items() if n < FEW_IMAGES_PER_CLASS}:
            listed = ", ".join(f"{name} {n}" for name, n in few.items())
            warnings.append(
                f"warning: split {split!r} has fewer than {FEW_IMAGES_PER_CLASS} images of "
                f"{len(few)} of its {len(counts)} classes ({listed}): its accuracy is too noisy to "
                "compare models by; add images (or raise the split's fraction)"
            )
    return warnings


def write_dataset(source: Source, config: PrepareConfig, staging: str, progress: Progress) -> dict[str, Any]:
    """Writes `source` into `staging`: its images resized and encoded, in TFRecord shards per
    split (a split the source lacks carved from train), then metadata.json; returns the metadata."""
    counts, assignment, carved = carve_plan(source, config)
    writers = {split: ShardWriter(staging, split, counts[split], config.shards) for split in SPLITS}
    class_counts = {split: [0] * len(source.class_names) for split in SPLITS}
    encode = record_encoder(config)

    total = sum(s.count for s in source.splits.values())
    # A bar for the whole source on a terminal; lines per source split otherwise.
    with progress.count(f"prepare {config.source}", total, lines=False) as overall:
        for split_name, source_split in source.splits.items():
            ds = source_split.dataset().map(encode, num_parallel_calls=tf.data.AUTOTUNE).prefetch(64)
            try:
                with progress.count(split_name, source_split.count, bar=False) as update:
                    for i, (encoded, label) in enumerate(ds.as_numpy_iterator()):
                        target = target_split(split_name, i, assignment)
                        label = int(label)
                        writers[target].write(example_record(encoded, label))
                        class_counts[target][label] += 1
                        overall(1)
                        update(1)
            except tf.errors.InvalidArgumentError as e:
                raise PrepareError(
                    source_split.find_bad_input() or f"bad input in split {split_name!r}: {e.message}"
                ) from None

    for writer in writers.values():
        writer.close()
    metadata = dataset_metadata(
        config,
        {**source.info, **source_identity(source, config)},
        source.class_names,
        {split: (writers[split].manifest, class_counts[split]) for split in SPLITS},
        carved,
    )
    for warning in few_images_warnings({s: v["class_counts"] for s, v in metadata["splits"].items()}):
        progress.say(warning)
    write_metadata(staging, metadata)
    return metadata


def dataset_metadata(
    config: PrepareConfig,
    source_info: Mapping[str, Any],
    class_names: list[str],
    splits: Mapping[str, tuple[list[dict[str, Any]], list[int]]],
    carved: Mapping[str, str],
) -> dict[str, Any]:
    """metadata.json of a prepared dataset: `splits` maps each output split to (its shards'
    manifest, its image count per class)."""
    out = {}
    for split in SPLITS:
        manifest, per_class = splits[split]
        out[split] = {
            "count": sum(entry["records"] for entry in manifest),
            "class_counts": dict(zip(class_names, per_class, strict=True)),
            "shards": list(manifest),
            **({"carved_from": carved[split]} if split in carved else {}),
        }
    metadata = {
        "format_version": METADATA_FORMAT_VERSION,
        "source": config.source,
        "source_info": dict(source_info),
        "class_names": list(class_names),
        "num_classes": len(class_names),
        "image_size": config.image_size,
        "channels": 3,
        "encoding": config.encoding,
        "seed": config.seed,
        "splits": out,
    }
    metadata["fingerprint"] = datasetinfo.manifest_fingerprint(metadata)
    return metadata


def write_metadata(folder: str, metadata: Mapping[str, Any]) -> None:
    """Writes metadata.json into `folder`: the last file of a prepared dataset."""
    storage.write_json(os.path.join(folder, METADATA_FILE), metadata)


def example_record(encoded: bytes, label: int) -> bytes:
    feature = {
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[encoded])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
    }
    # deterministic: protobuf map order is otherwise free, and equal images must give equal bytes.
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString(deterministic=True)


# --- the source's identity, in source_info (trainer.contract.METADATA_SOURCE_INFO_KEYS) -------

LISTING_STAT_THREADS = 16  # gs:// images stat'ed at once (a request each)


def source_identity(source: Source, config: PrepareConfig) -> dict[str, Any]:
    """What identifies the source beyond its own `info`: a TFDS dataset's registered download
    checksums, a folder's listing fingerprint (the synthetic set's `info` names it already)."""
    kind = config.source.partition(":")[0]
    if kind == "tfds":
        return {"tfds_downloads": tfds_downloads(str(source.info["tfds_name"]))}
    if kind == "folder":
        return {"listing": folder_listing(str(source.info["folder"]))}
    return {}


def tfds_downloads(name: str) -> list[dict[str, Any]] | None:
    """The files TFDS downloads for dataset `name`, with the size and SHA-256 it checks each
    against (its registered checksums, the builder class's `url_infos`; no download, no
    request): [{url, bytes, sha256}] sorted by URL, or None when TFDS records none."""
    import tensorflow_datasets as tfds

    try:
        infos = tfds.builder_cls(name).url_infos
    except (tfds.core.registered.DatasetNotFoundError, AttributeError, KeyError, OSError, ValueError):
        return None
    if not infos:
        return None
    return [
        {"url": url, "bytes": None if info.size is None else int(info.size), "sha256": info.checksum}
        for url, info in sorted(infos.items())
    ]


def folder_listing(path: str) -> dict[str, Any]:
    """{images, bytes, fingerprint} of a folder source's listing: a file added, removed, renamed,
    resized or rewritten changes the fingerprint."""
    listing = folders.list_folder(path, check_files=False)
    root, remote = listing.root, storage.is_remote(listing.root)
    files = sorted(p for paths, _ in listing.splits.values() for p in paths)

    def stat(p: str) -> tuple[int, int]:
        if remote:
            found = tf.io.gfile.stat(p)
            return int(found.length), int(found.mtime_nsec)
        st = os.stat(p)
        return st.st_size, st.st_mtime_ns

    with concurrent.futures.ThreadPoolExecutor(LISTING_STAT_THREADS if remote else 1) as pool:
        stats = list(pool.map(stat, files))
    digest, prefix = hashlib.sha256(), len(root.rstrip("/")) + 1
    for p, (size, mtime) in zip(files, stats, strict=True):
        digest.update(f"{p[prefix:]}\t{size}\t{mtime}\n".encode())
    return {
        "images": len(files),
        "bytes": sum(size for size, _ in stats),
        "fingerprint": f"sha256:{digest.hexdigest()}",
    }
