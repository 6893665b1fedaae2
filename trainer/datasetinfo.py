"""What a prepared dataset's metadata.json says (`load_metadata`, `DatasetMetadata`), and its
shards checked against it."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from trainer import storage
from trainer._tf import tf
from trainer.config import SPLITS
from trainer.contract import METADATA_FILE, METADATA_SHARD_KEYS
from trainer.contract import METADATA_FORMAT_VERSION as FORMAT_VERSION


class DataError(ValueError):
    """The prepared files do not match metadata.json, or it is not one this trainer reads.
    `faults`: (the shard, split or file, a FAULT_KINDS kind) for each fault, in order."""

    def __init__(self, message: str, faults: Iterable[Fault] = ()) -> None:
        super().__init__(message)
        self.faults = [(f.where, f.kind) for f in faults]


FAULT_KINDS = (
    "missing",  # a shard metadata.json lists is not in the folder
    "extra",  # a .tfrecord in the folder that metadata.json does not list
    "misnamed",  # an entry whose name is not the one trainer.prepare gives its place
    "record_count",  # an entry's records, or a split's class counts, that do not add up
    "entry_edited",  # a shard with its recorded SHA-256 whose entry says otherwise
    "swapped",  # a shard holding another shard's content
    "corrupted",  # a shard whose records stop reading intact
    "truncated",  # a shard whose records read intact, fewer than recorded
    "replaced",  # a shard whose records read intact, as many, but not the ones prepared
    "fingerprint",  # metadata.json's entries no longer give its fingerprint
)


class Fault(NamedTuple):
    where: str
    kind: str
    text: str


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """One shard as metadata.json records it (trainer.contract.METADATA_SHARD_KEYS)."""

    name: str
    bytes: int
    records: int
    sha256: str


@dataclasses.dataclass(frozen=True)
class SplitInfo:
    count: int
    shards: tuple[str, ...]
    class_counts: Mapping[str, int]
    files: tuple[ShardInfo, ...] = ()
    """metadata.json's manifest entry of each shard, in the order of `shards`."""


@dataclasses.dataclass(frozen=True)
class DatasetMetadata:
    """What `metadata.json` says about a prepared dataset."""

    class_names: tuple[str, ...]
    image_size: int
    encoding: str
    splits: Mapping[str, SplitInfo]
    fingerprint: str
    source: str
    manifest_fingerprint: str = ""
    """`manifest_fingerprint` of metadata.json's entries: not `fingerprint` if edited ("": not computed)."""

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @classmethod
    def from_json(cls, data: Mapping[str, Any], data_dir: str) -> DatasetMetadata:
        """Raises DataError, naming `data_dir`'s metadata.json and what to do, when it is of
        another format_version or malformed."""
        where = storage.join(data_dir, METADATA_FILE)
        if not isinstance(data, Mapping):
            raise DataError(f"{where} is not a JSON object: {reprepare('SOURCE', data_dir)}")
        version, again = data.get("format_version"), reprepare(str(data.get("source", "SOURCE")), data_dir)
        if version != FORMAT_VERSION:
            newer = isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION
            raise DataError(
                f"{where} has format_version {version!r}, written by {'a newer' if newer else 'an older'} "
                f"trainer.prepare; this trainer reads format_version {FORMAT_VERSION}: "
                f"{'use the trainer that prepared it, or ' if newer else ''}{again}"
            )
        try:
            splits = {name: _split_info(name, s) for name, s in data["splits"].items()}
            meta = cls(
                class_names=tuple(str(c) for c in data["class_names"]),
                image_size=int(data["image_size"]),
                encoding=str(data["encoding"]),
                splits=splits,
                fingerprint=str(data["fingerprint"]),
                source=str(data["source"]),
                manifest_fingerprint=manifest_fingerprint(data),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            what = f"lacks {e}" if isinstance(e, KeyError) else str(e)
            raise DataError(f"{where} is malformed ({what}): {again}") from None
        missing = [s for s in SPLITS if s not in splits]
        if missing:
            raise DataError(f"{where} lacks the split(s) {missing}: {again}")
        return meta


SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def _split_info(split: str, s: Mapping[str, Any]) -> SplitInfo:
    files = []
    for i, entry in enumerate(s["shards"]):
        keyed = isinstance(entry, Mapping) and sorted(entry) == sorted(METADATA_SHARD_KEYS)
        fields: Any = [entry[k] for k in METADATA_SHARD_KEYS] if keyed else [None] * 4
        name, size, records, sha = fields
        whole = all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (size, records))
        if not (isinstance(name, str) and whole and isinstance(sha, str) and SHA256_HEX.fullmatch(sha)):
            raise ValueError(
                f"shard {i} of split {split!r}: expected an object of exactly {list(METADATA_SHARD_KEYS)}: "
                f"a file name, whole non-negative bytes and records, and a SHA-256 of 64 hex digits, "
                f"found {json.dumps(entry)[:200]}"
            )
        files.append(ShardInfo(name, size, records, sha))
    return SplitInfo(
        count=int(s["count"]),
        shards=tuple(f.name for f in files),
        class_counts={str(k): int(v) for k, v in s["class_counts"].items()},
        files=tuple(files),
    )


def manifest_fingerprint(metadata: Mapping[str, Any]) -> str:
    """The dataset's fingerprint, "sha256:<hex>": SHA-256 of the canonical JSON (sorted keys, no
    spaces) of {class_names, image_size, encoding, splits: {split: {count, class_counts, shards:
    [[name, bytes, records, sha256], ...]}}}, recomputed by every reader to catch an edited entry."""
    doc = {
        "class_names": list(metadata["class_names"]),
        "image_size": metadata["image_size"],
        "encoding": metadata["encoding"],
        "splits": {
            split: {
                "count": s["count"],
                "class_counts": s["class_counts"],
                "shards": [[entry[k] for k in METADATA_SHARD_KEYS] for entry in s["shards"]],
            }
            for split, s in metadata["splits"].items()
        },
    }
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return f"sha256:{hashlib.sha256(text.encode()).hexdigest()}"


def reprepare(source: str, data_dir: str) -> str:
    return (
        f"prepare the dataset again (`python -m trainer.prepare --source {source} --output_dir "
        f"{data_dir} --overwrite`, with the other flags it was prepared with)"
    )


VERIFY_ENV = "TRAINER_VERIFY_DATA"
VERIFY_MODES = ("size", "full")
HASH_THREADS = 8
"""Shards hashed at once (reading is the cost: a gs:// shard is a request of its own)."""
HASH_BLOCK = 8 << 20
AUDIT_MAX_BYTES = 16 << 30
"""A read error met while training or evaluating hashes the shards of the splits being read, to
name the one that changed, up to this many bytes (a minute or two); above, it lists them."""
SHOWN_PROBLEMS = 5


def read_metadata(data_dir: str) -> DatasetMetadata:
    """`metadata.json` alone, no shard checked (`load_metadata` checks them): cheap, so it may run
    before the distribution strategy is built."""
    path = storage.join(data_dir, METADATA_FILE)
    if not tf.io.gfile.exists(storage.resolve(path)):
        raise FileNotFoundError(
            f"{path} not found: --data_dir must be a folder written by `python -m trainer.prepare`"
        )
    try:
        content = storage.read_json(path)
    except ValueError as e:  # json.JSONDecodeError, UnicodeDecodeError
        raise DataError(f"{path} is not JSON ({e}): {reprepare('SOURCE', data_dir)}") from None
    return DatasetMetadata.from_json(content, data_dir)


def load_metadata(data_dir: str, verify: str | None = None) -> DatasetMetadata:
    """Reads `metadata.json` and checks the shards it lists (`verify_shards`; `verify` None takes
    $TRAINER_VERIFY_DATA, else "size")."""
    meta = read_metadata(data_dir)
    verify_shards(data_dir, meta, verify)
    return meta


def shard_names(split: str, count: int, shards: int) -> list[str]:
    """The shard files of a split of `count` images: `shards` of them, fewer when the split has
    fewer images (every shard holds at least one)."""
    n = max(1, min(shards, count))
    return [f"{split}-{i:05d}-of-{n:05d}.tfrecord" for i in range(n)]


def expected_records(count: int, shards: int, index: int) -> int:
    """Records in shard `index` of a split: `trainer.prepare` writes round-robin."""
    return count // shards + (1 if index < count % shards else 0)


def verify_shards(data_dir: str, meta: DatasetMetadata, verify: str | None = None) -> None:
    """Raises DataError naming each shard that differs from metadata.json's manifest (its split,
    what was expected and found, what to do). Always (a listing, a stat per shard): the manifest's
    names, round-robin record counts, class counts and fingerprint; every shard present at its exact
    size, no other `.tfrecord`. "full": also every SHA-256. A resized shard, and every shard after
    an edit of metadata.json, is hashed to say what it holds."""
    mode = verify or os.environ.get(VERIFY_ENV) or "size"
    if mode not in VERIFY_MODES:
        raise ValueError(f"verify={mode!r} (or ${VERIFY_ENV}): expected one of {VERIFY_MODES}")
    problems = _check_manifest(meta) or _check_files(data_dir, meta)
    if problems:
        raise _mismatch(data_dir, meta, problems)
    edited = bool(meta.manifest_fingerprint) and meta.manifest_fingerprint != meta.fingerprint
    if not edited and mode != "full":
        return
    problems = _audit(data_dir, meta, _listed(meta))
    if edited:
        problems = problems or _read_all(data_dir, meta)
        unknown = ", and every shard matches its entry and reads intact: which files were prepared is unknown"
        text = (
            f"metadata.json's entries no longer give its fingerprint (it records {meta.fingerprint}; "
            f"its classes, counts and shard entries give {meta.manifest_fingerprint}): it was edited "
            f"after preparation{'' if problems else unknown}"
        )
        problems.insert(0, Fault(METADATA_FILE, "fingerprint", text))
    if problems:
        raise _mismatch(data_dir, meta, problems)


def _mismatch(
    data_dir: str, meta: DatasetMetadata, problems: list[Fault], head: str | None = None
) -> DataError:
    head = head or f"prepared dataset {data_dir} does not match its {METADATA_FILE}"
    more = len(problems) - SHOWN_PROBLEMS
    return DataError(
        f"{head}: {'; '.join(p.text for p in problems[:SHOWN_PROBLEMS])}"
        + (f"; and {more} more" if more > 0 else "")
        + f": {reprepare(meta.source, data_dir)}",
        problems,
    )


def _where(split: str, shard: str) -> str:
    return f"shard {shard} of split {split!r}"


def _check_manifest(meta: DatasetMetadata) -> list[Fault]:
    """metadata.json against itself and trainer.prepare's rules: no file is read."""
    problems = []
    for split in SPLITS:
        info = meta.splits[split]
        n = len(info.files)
        if sum(info.class_counts.values()) != info.count:
            text = f"its class_counts add up to {sum(info.class_counts.values())}, its count is {info.count}"
            problems.append(Fault(split, "record_count", f"split {split!r}: {text}"))
        for i, (entry, expected_name) in enumerate(zip(info.files, shard_names(split, n, n), strict=False)):
            where = _where(split, entry.name)
            if entry.name != expected_name:
                text = (
                    f"{where}: metadata.json lists it as shard {i} of {n} of split {split!r}, which "
                    f"trainer.prepare names {expected_name}; found {entry.name}"
                )
                problems.append(Fault(entry.name, "misnamed", text))
                continue
            records = expected_records(info.count, n, i)
            if entry.records != records:
                text = (
                    f"{where}: metadata.json says it holds {entry.records} records; {info.count} records "
                    f"written round-robin into {n} shards put {records} there"
                )
                problems.append(Fault(entry.name, "record_count", text))
    return problems


def _listed(meta: DatasetMetadata, splits: Iterable[str] = SPLITS) -> list[tuple[str, ShardInfo]]:
    return [(split, entry) for split in splits for entry in meta.splits[split].files]


def _path(data_dir: str, name: str) -> str:
    return storage.resolve(storage.join(data_dir, name))


def _check_files(data_dir: str, meta: DatasetMetadata) -> list[Fault]:
    """Missing, extra and resized shards (a resized one hashed, to say what it holds)."""
    present = {name.rstrip("/") for name in tf.io.gfile.listdir(storage.resolve(data_dir))}
    listed = _listed(meta)
    names = {entry.name for _, entry in listed}
    problems: list[Fault] = []
    resized = []
    for split, entry in listed:
        if entry.name not in present:
            problems.append(_content_problem(meta, split, entry, None, 0, data_dir))
        elif tf.io.gfile.stat(_path(data_dir, entry.name)).length != entry.bytes:
            resized.append((split, entry))
    for name in sorted(present - names):
        if name.endswith(".tfrecord"):
            text = (
                f"{name} is in the folder but not in metadata.json, which lists {len(names)} shards (a "
                "shard of another preparation, or a copy); remove it"
            )
            problems.append(Fault(name, "extra", text))
    problems[:0] = _audit(data_dir, meta, resized) if resized else []  # another size: another SHA-256
    return problems


def shard_digest(path: str) -> tuple[str, int]:
    """(SHA-256 hex, bytes) of the file at `path` (local, gs:// or /gcs/), read in blocks."""
    h, n = hashlib.sha256(), 0
    path = storage.resolve(path)
    opener: Any = open if not storage.is_remote(path) else tf.io.gfile.GFile
    with opener(path, "rb") as f:
        while block := f.read(HASH_BLOCK):
            h.update(block)
            n += len(block)
    return h.hexdigest(), n


def _audit(data_dir: str, meta: DatasetMetadata, listed: list[tuple[str, ShardInfo]]) -> list[Fault]:
    """Faults of the `listed` shards whose bytes (hashed now) are not those metadata.json records."""

    def digest(item: tuple[str, ShardInfo]) -> tuple[str | None, int]:
        try:
            return shard_digest(_path(data_dir, item[1].name))
        except (FileNotFoundError, tf.errors.NotFoundError):
            return None, 0

    with concurrent.futures.ThreadPoolExecutor(HASH_THREADS) as pool:
        found = list(pool.map(digest, listed))
    return [
        _content_problem(meta, split, entry, sha, size, data_dir)
        for (split, entry), (sha, size) in zip(listed, found, strict=True)
        if sha != entry.sha256 or size != entry.bytes  # the same SHA-256 at another size: entry edited
    ]


def _content_problem(
    meta: DatasetMetadata, split: str, entry: ShardInfo, sha: str | None, size: int, data_dir: str
) -> Fault:
    """What a shard whose bytes differ from its entry holds instead, in one clause."""
    where = _where(split, entry.name)
    if sha is None:
        what = f"expected the file ({entry.bytes:,} bytes, {entry.records} records), found none"
        return Fault(entry.name, "missing", f"{where}: {what}")
    expected = f"expected {entry.bytes:,} bytes, {entry.records} records, SHA-256 {entry.sha256[:16]}"
    found = f"found {size:,} bytes{' (the same size)' if size == entry.bytes else ''}, SHA-256 {sha[:16]}"
    twins = ((s, e) for s, e in _listed(meta) if e.sha256 == sha and e.name != entry.name)
    if sha == entry.sha256:
        kind = "entry_edited"
        what = "the SHA-256 recorded, so the shard is intact and its entry in metadata.json was edited"
    elif (twin := next(twins, None)) is not None:
        kind = "swapped"
        what = f"it holds the content of {_where(twin[0], twin[1].name)}: swapped or copied over"
    else:
        replaced = f"its {_records(entry.records)} read intact, but are not the records prepared"
        kind, what = _read_fault(data_dir, entry) or ("replaced", replaced)
        if kind == "truncated":
            what += ", all intact: truncated or replaced by other records"
    return Fault(entry.name, kind, f"{where}: {expected}; {found}: {what}")


def _records(n: int) -> str:
    return f"{n:,} record{'' if n == 1 else 's'}"


def _read_all(data_dir: str, meta: DatasetMetadata) -> list[Fault]:
    """Every shard's records read (their CRCs) and counted against metadata.json: what names a
    shard whose entry was edited to its new size and SHA-256."""
    listed = _listed(meta)
    with concurrent.futures.ThreadPoolExecutor(HASH_THREADS) as pool:
        found = list(pool.map(lambda item: _read_fault(data_dir, item[1]), listed))
    problems = []
    for (split, entry), fault in zip(listed, found, strict=True):
        if fault is not None:
            text = (
                f"{_where(split, entry.name)}: its size and SHA-256 match its entry in metadata.json, "
                f"which says it holds {_records(entry.records)}; {fault[1]}"
            )
            problems.append(Fault(entry.name, fault[0], text))
    return problems


def _read_fault(data_dir: str, entry: ShardInfo) -> tuple[str, str] | None:
    """("corrupted" or "truncated", what was found) when the shard's records stop reading intact or
    are not `entry.records`; None when they all read intact."""
    intact = 0
    try:
        for _ in tf.data.TFRecordDataset(_path(data_dir, entry.name)).as_numpy_iterator():
            intact += 1
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
        return "corrupted", f"{_records(intact)} read intact, then {_first_cause(e)}"
    return None if intact == entry.records else ("truncated", f"it holds {_records(intact)}")


def _first_cause(error: tf.errors.OpError) -> str:
    """The line of a TensorFlow error that says what is wrong (a graph's buries it in the op
    trace), without the op's name around it (`{{function_node ...}} ... [Op:IteratorGetNext]`)."""
    lines = [line.strip() for line in (error.message or "").splitlines() if line.strip()]
    keep = ("corrupt", "truncat")
    line = next((line for line in lines if any(k in line.lower() for k in keep)), lines[0] if lines else "")
    line = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", line)
    return re.sub(r"\s*\[Op:[^\]]*\].*$", "", line).strip()


def explain_read_error(
    error: tf.errors.OpError, data_dir: str, meta: DatasetMetadata, split: str | tuple[str, ...]
) -> DataError:
    """A DataError for a read error raised while iterating `split` (or splits read at once, as
    `fit` reads train and validation): TensorFlow's `corrupted record at N` names no file, so the
    shards are hashed against metadata.json (up to AUDIT_MAX_BYTES) to name the one that changed."""
    splits = (split,) if isinstance(split, str) else split
    which = f"split {splits[0]!r}" if len(splits) == 1 else "splits " + " and ".join(repr(s) for s in splits)
    head = f"reading {which} in {data_dir} failed ({_first_cause(error)})"
    listed = _listed(meta, splits)
    total = sum(entry.bytes for _, entry in listed)
    if listed and total <= AUDIT_MAX_BYTES:
        problems = _audit(data_dir, meta, listed)
        if problems:
            return _mismatch(data_dir, meta, problems, head)
        return DataError(
            f"{head}, yet every shard of {'it' if len(splits) == 1 else 'them'} still has the size "
            "and SHA-256 metadata.json records (hashed just now): the files are intact and the read "
            "itself failed; run again, and if it recurs check the storage the data is read from"
        )
    files = ", ".join(shard for s in splits for shard in meta.splits[s].shards)
    why = f"{total:,} bytes, too many to hash now" if listed else "no manifest to check them against"
    return DataError(
        f"{head}; {'its' if len(splits) == 1 else 'their'} shards ({why}): {files}. Find the bad one "
        f'with `{VERIFY_ENV}=full` (or load_metadata(..., verify="full")), then '
        f"{reprepare(meta.source, data_dir)}"
    )
