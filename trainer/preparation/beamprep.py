"""Preparation on Apache Beam: `python -m trainer.prepare --engine beam`, the same conversion as
the one-replica job (trainer/preparation/shards.py) run as a Beam pipeline, on the DirectRunner here (worker
processes on this machine) or on Dataflow (`--runner DataflowRunner` and Dataflow's options).

Everything that decides the output (carving, placement, shard names, the image transform, the
record, metadata.json) is shared with `write_dataset`: both engines write the same bytes.

    Create(shard names) | Reshuffle | ParDo(WriteShard) | CombineGlobally(ToList) | ParDo(Finalize)

The driver writes the plan into `<output_dir>.beam-work/` (`plan.json`, a `tasks/<shard>.json`
per shard); only shard names enter the pipeline, so its graph stays small (Dataflow refuses one
over 10 MB). docs/training.md#preparing-on-apache-beam describes the workers' records,
publishing and resuming.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from trainer import data, datasetinfo, storage
from trainer._tf import tf
from trainer.config import SPLITS
from trainer.preparation.carving import carve_plan
from trainer.preparation.folders import find_bad_image, image_files_dataset
from trainer.preparation.prepareconfig import PrepareConfig
from trainer.preparation.shards import (
    dataset_metadata,
    example_record,
    record_encoder,
    shard_names,
    target_split,
    write_metadata,
)
from trainer.preparation.source import PrepareError, Source

PLAN_FILE = "plan.json"
PLAN_VERSION = 1
TASKS, DONE, ERRORS = "tasks", "done", "errors"
# The PrepareConfig fields that decide what is written (not where, nor by which engine).
OUTPUT_FIELDS = ("source", "image_size", "encoding", "shards", "validation_fraction", "test_fraction", "seed")
# Written first into a work folder this engine makes: only a folder holding it is its to resume or remove.
OWNER_FILE = ".beam-work"


def placement(source: Source, assignment: Any) -> dict[str, list[tuple[str, int]]]:
    """Every output split's images, as (source split, index), in the order they are written; the
    one at position p of a split of n shards goes to shard p % n (`ShardWriter.write`)."""
    placed: dict[str, list[tuple[str, int]]] = {split: [] for split in SPLITS}
    for split_name, source_split in source.splits.items():
        for i in range(source_split.count):
            placed[target_split(split_name, i, assignment)].append((split_name, i))
    return placed


def split_subset(spec: dict[str, Any], indices: Sequence[int]) -> Any:
    """The tf.data dataset of (uint8 image, label) of images `indices` (ascending) of the source
    split `spec` describes (`SourceSplit.spec`), for a Beam worker. A TFDS split is read through,
    the others dropped before decoding (TFDS's record files give no random access)."""
    if spec["kind"] == "files":
        paths, labels = spec["paths"], spec["labels"]
        return image_files_dataset([paths[i] for i in indices], [labels[i] for i in indices])
    if spec["kind"] == "tfds":
        import numpy as np
        import tensorflow_datasets as tfds

        builder = tfds.builder_from_directory(spec["dir"])
        count = builder.info.splits[spec["split"]].num_examples
        mask = tf.constant(np.isin(np.arange(count), indices))
        image_key, label_key = spec["image_key"], spec["label_key"]
        ds = builder.as_dataset(
            split=spec["split"],
            shuffle_files=False,
            decoders={image_key: tfds.decode.SkipDecoding()},
        )
        ds = ds.enumerate().filter(lambda i, ex: mask[i])
        return ds.map(
            lambda i, ex: (builder.info.features[image_key].decode_example(ex[image_key]), ex[label_key]),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
    raise ValueError(f"unknown source split kind {spec['kind']!r}; allowed: files, tfds")


def check_work_dir(work: str) -> None:
    """Refuses a `work_dir` holding anything this engine did not make: a link (removing through it
    would delete what it points to), a file, or a folder without OWNER_FILE."""
    what, remote = "", storage.is_remote(work)
    if not remote and os.path.islink(work):
        what = f"a symbolic link (to {os.readlink(work)})"
    elif tf.io.gfile.exists(work.rstrip("/")) and not tf.io.gfile.isdir(work):
        what = f"{'an object' if remote else 'a file'}, not a folder"
    elif tf.io.gfile.isdir(work) and not tf.io.gfile.exists(storage.join(work, OWNER_FILE)):
        what = f"a folder this engine did not make (no {OWNER_FILE} in it)"
    if what:
        raise PrepareError(
            f"{work} is {what}: --engine beam keeps its work there and may remove it; move it aside, "
            "or give another --output_dir"
        )


# --- the plan ----------------------------------------------------------------------------------


def _task_spec(spec: dict[str, Any], indices: list[int]) -> dict[str, Any]:
    """A shard's task: the source split's spec narrowed to the shard's images (a folder's: only
    their paths and labels)."""
    if spec["kind"] == "files":
        return {
            "kind": "files",
            "paths": [spec["paths"][i] for i in indices],
            "labels": [spec["labels"][i] for i in indices],
            "indices": list(range(len(indices))),
        }
    return {**spec, "indices": indices}


def make_plan(source: Source, config: PrepareConfig, source_info: dict[str, Any]) -> tuple[dict, dict]:
    """(plan, tasks): the plan.json of a Beam preparation of `source`, and each shard's task."""
    counts, assignment, carved = carve_plan(source, config)
    placed = placement(source, assignment)
    shards: list[dict[str, Any]] = []
    tasks: dict[str, dict[str, Any]] = {}
    for split in SPLITS:
        names = shard_names(split, counts[split], config.shards)
        for k, name in enumerate(names):
            items = placed[split][k :: len(names)]  # round robin, as ShardWriter.write
            (source_split,) = {s for s, _ in items}  # one source split per output split (carving)
            tasks[name] = _task_spec(source.splits[source_split].spec, [i for _, i in items])
            shards.append({"split": split, "name": name})
    # Tasks without the "dir" a TFDS split was built in: the synthetic source is built in a new
    # temporary folder every run, and source_info already names the TFDS dataset.
    hashed = {n: {k: v for k, v in t.items() if k != "dir"} for n, t in tasks.items()}
    identity = {
        "plan_version": PLAN_VERSION,
        **{f: getattr(config, f) for f in OUTPUT_FIELDS},
        "class_names": list(source.class_names),
        "source_info": source_info,
        "tasks": hashlib.sha256(json.dumps(hashed, sort_keys=True).encode()).hexdigest(),
    }
    plan = {
        "identity": identity,
        "fingerprint": "sha256:" + hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest(),
        "config": {f: getattr(config, f) for f in OUTPUT_FIELDS},
        "class_names": list(source.class_names),
        "source_info": source_info,
        "carved": carved,
        "shards": shards,
    }
    return plan, tasks


def plan_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The inputs of two plans' identities that differ, by name (what makes a resume impossible)."""
    a, b = old.get("identity", {}), new["identity"]
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


# --- the workers' steps ----------------------------------------------------------------------


DISK_FULL = "no space left on the disk of"


def shard_done(work: str, name: str) -> dict[str, Any] | None:
    """The done record of shard `name`, if it is there and its file matches it (size, SHA-256)."""
    record_path, path = storage.join(work, DONE, f"{name}.json"), storage.join(work, name)
    if not (tf.io.gfile.exists(record_path) and tf.io.gfile.exists(path)):
        return None
    record = storage.read_json(record_path)
    sha, size = datasetinfo.shard_digest(path)
    return dict(record) if (size, sha) == (record.get("bytes"), record.get("sha256")) else None


def write_shard(work: str, name: str, config: PrepareConfig) -> dict[str, Any] | str:
    """Writes shard `name` of the plan in `work` from its task; returns its done record, or the
    problem (one line naming the image) when an image of it cannot be converted."""
    task = storage.read_json(storage.join(work, TASKS, f"{name}.json"))
    counts = [0] * len(storage.read_json(storage.join(work, PLAN_FILE))["class_names"])
    partial = storage.join(work, f"{name}.partial-{uuid.uuid4().hex[:8]}")
    ds = split_subset(task, task["indices"]).map(record_encoder(config), num_parallel_calls=tf.data.AUTOTUNE)
    try:
        with tf.io.TFRecordWriter(partial) as writer:
            for encoded, label in ds.prefetch(16).as_numpy_iterator():
                writer.write(example_record(encoded, int(label)))
                counts[int(label)] += 1
    except BaseException as e:
        with contextlib.suppress(tf.errors.OpError):
            tf.io.gfile.remove(partial)
        if isinstance(e, tf.errors.InvalidArgumentError):
            problem = find_bad_image(task["paths"]) if task["kind"] == "files" else None
            return problem or f"bad input in shard {name}: {e.message.splitlines()[0]}"
        if isinstance(e, tf.errors.ResourceExhaustedError):  # a full disk: ENOSPC is RESOURCE_EXHAUSTED
            return disk_full(work)
        raise
    final = storage.join(work, name)
    tf.io.gfile.rename(partial, final, overwrite=True)
    sha, size = datasetinfo.shard_digest(final)
    record = {"name": name, "bytes": size, "records": sum(counts), "sha256": sha, "class_counts": counts}
    storage.write_json(storage.join(work, DONE, f"{name}.json"), record)
    return record


def published(output_dir: str, records: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The metadata.json in `output_dir` when it lists exactly these shards (names and SHA-256):
    the dataset an earlier attempt of the publishing step published. Else None."""
    path = storage.join(storage.resolve(output_dir), data.METADATA_FILE)
    if not tf.io.gfile.exists(path):
        return None
    try:
        meta = storage.read_json(path)
        listed = {s["name"]: s["sha256"] for split in meta["splits"].values() for s in split["shards"]}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return dict(meta) if listed == {r["name"]: r["sha256"] for r in records} else None


def finalize(work: str, output_dir: str, records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Once every shard is written: the dataset published to `output_dir` (metadata.json last)
    and the work folder removed; PrepareError with the problems workers recorded. It may run more
    than once (Dataflow reruns a step whose result was not committed, even after its side
    effects): a dataset published whole (`published`) is kept; a half-published one is redone."""
    if problems := read_problems(work):
        raise PrepareError("\n".join(problems))
    if not tf.io.gfile.exists(storage.join(work, PLAN_FILE)):
        if (done := published(output_dir, records)) is not None:
            return done
        raise PrepareError(
            f"the work folder {work} has no {PLAN_FILE} and {output_dir} holds no dataset of these "
            "shards: it was removed while the preparation ran; prepare again"
        )
    plan = storage.read_json(storage.join(work, PLAN_FILE))
    by_name = {r["name"]: r for r in records}
    if missing := [s["name"] for s in plan["shards"] if s["name"] not in by_name]:
        raise PrepareError(f"{len(missing)} shards were not written: {', '.join(missing[:5])}")
    config = PrepareConfig(output_dir=output_dir, **plan["config"])
    splits: dict[str, tuple[list[dict[str, Any]], list[int]]] = {}
    for split in SPLITS:  # every split has a shard (shard_names)
        written = [by_name[s["name"]] for s in plan["shards"] if s["split"] == split]
        manifest = [{k: r[k] for k in ("name", "bytes", "records", "sha256")} for r in written]
        splits[split] = (manifest, [sum(n) for n in zip(*(r["class_counts"] for r in written), strict=True)])
    metadata = dataset_metadata(config, plan["source_info"], plan["class_names"], splits, plan["carved"])
    names = [s["name"] for s in plan["shards"]]
    if published(output_dir, records) == metadata:
        pass  # published whole by an earlier attempt; only the work folder may be left
    elif storage.is_remote(output_dir):  # stale metadata.json first, the shards copied in, it last
        final = storage.resolve(output_dir)
        if tf.io.gfile.exists(storage.join(final, data.METADATA_FILE)):
            tf.io.gfile.remove(storage.join(final, data.METADATA_FILE))
        tf.io.gfile.makedirs(final)
        for name in names:
            tf.io.gfile.copy(storage.join(work, name), storage.join(final, name), overwrite=True)
        write_metadata(final, metadata)
    else:
        with storage.staged_output(output_dir) as staging:  # beside it, renamed into place
            for name in names:
                os.rename(os.path.join(work, name), os.path.join(staging, name))
            write_metadata(staging, metadata)
    with contextlib.suppress(tf.errors.OpError):
        tf.io.gfile.rmtree(work)
    return metadata


def read_problems(work: str) -> list[str]:
    """The problems workers recorded in `work` (errors/*.json), one line each, in shard order."""
    folder = storage.join(work, ERRORS)
    if not tf.io.gfile.exists(folder):
        return []
    names = sorted(f for f in tf.io.gfile.listdir(folder) if f.endswith(".json"))
    problems = [storage.read_json(storage.join(folder, f))["problem"] for f in names]
    if any(p.startswith(DISK_FULL) for p in problems):  # one line for a full disk, however many met it
        problems = [p for p in problems if not p.startswith(DISK_FULL)] + [disk_full(work)]  # counted now
    return problems


def done_records(work: str) -> list[str]:
    """The paths of the shards' done records in `work`: listed, not globbed (`work` may hold [, *
    or ?, which tf.io.gfile.glob reads as a pattern)."""
    folder = storage.join(work, DONE)
    names = tf.io.gfile.listdir(folder) if tf.io.gfile.isdir(folder) else []
    return [storage.join(folder, n) for n in names if n.endswith(".json")]


def disk_full(work: str) -> str:
    """The one line for a disk that filled while shards were written into `work`."""
    done = [storage.read_json(p) for p in done_records(work)]
    left = len(storage.read_json(storage.join(work, PLAN_FILE))["shards"]) - len(done)
    need = sum(r["bytes"] for r in done) / len(done) * left / 2**20 if done else None
    about = f"the {left} shards left need about {need:.1f} MiB" if need is not None else f"{left} shards left"
    return (
        f"{DISK_FULL} {work}: {about}; the {len(done)} shards written so far are kept there: free "
        "space, then run the same command again to resume"
    )


def build_pipeline(
    pipeline: Any, work: str, output_dir: str, names: Sequence[str], *, local: bool = True
) -> Any:
    """Adds the preparation's steps to the Beam `pipeline` (`local`: the DirectRunner). The DoFns
    are defined here so that importing this module needs no Beam."""
    import apache_beam as beam

    class WriteShard(beam.DoFn):
        def __init__(self, work: str) -> None:
            self.work = work
            self.config: PrepareConfig | None = None

        def setup(self) -> None:
            plan = storage.read_json(storage.join(self.work, PLAN_FILE))
            self.config = PrepareConfig(output_dir="", **plan["config"])

        def process(self, name: str) -> Iterator[dict[str, Any]]:
            if (done := shard_done(self.work, name)) is not None:
                beam.metrics.Metrics.counter("prepare", "shards_kept").inc()
                yield done
                return
            assert self.config is not None
            result = write_shard(self.work, name, self.config)
            if isinstance(result, str):
                storage.write_json(
                    storage.join(self.work, ERRORS, f"{name}.json"), {"shard": name, "problem": result}
                )
                return
            beam.metrics.Metrics.counter("prepare", "shards_written").inc()
            yield result

    class Finalize(beam.DoFn):
        """Publishes once every shard is written. With problems recorded, the DirectRunner's
        driver reports them; on a remote runner (`fail_on_problems`) the job fails with them."""

        def __init__(self, work: str, output_dir: str, fail_on_problems: bool) -> None:
            self.work, self.output_dir, self.fail_on_problems = work, output_dir, fail_on_problems

        def process(self, records: list[dict[str, Any]]) -> Iterator[str]:
            if read_problems(self.work) and not self.fail_on_problems:
                return
            metadata = finalize(self.work, self.output_dir, records)
            yield metadata["fingerprint"]

    return (
        pipeline
        | "Shards" >> beam.Create(list(names))
        | "Spread" >> beam.Reshuffle()
        | "WriteShard" >> beam.ParDo(WriteShard(work))
        | "AllShards" >> beam.combiners.ToList()
        | "Finalize" >> beam.ParDo(Finalize(work, output_dir, fail_on_problems=not local))
    )
