"""The training input pipeline over a prepared dataset (see `trainer.prepare`).

Built for speed: TFRecord shards are read in parallel and sharded across workers by FILE (each
worker reads only its own files), images stay uint8 until they reach the device, and batches
are prefetched. Evaluation order is deterministic.

Memory is bounded by a cache budget (`cache_budget`: a share of the container's memory limit,
or $TRAINER_CACHE_BUDGET_MB). Each split's decoded size per worker is known from metadata.json
before anything is read (`plan_cache`): a split that fits what is left of the budget is decoded
once and cached in memory (training order then non-deterministic: faster); a split that does not
is streamed from its shards every epoch, decoded per element, through a shuffle buffer sized to
the budget (training order then a function of the seed). One line per split says which and why.

The shards are checked against metadata.json's manifest (each shard's name, exact size, record
count and SHA-256) whenever a dataset is loaded (`verify_shards`): sizes on every load (one
listing and a stat per shard), the SHA-256 of every shard with $TRAINER_VERIFY_DATA=full, and of
the shards that need explaining whenever something does not match. A record found corrupt later,
while training or evaluating, is explained the same way (`explain_read_error`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from trainer import images, storage
from trainer._tf import tf
from trainer.config import SPLITS
from trainer.contract import METADATA_FILE, METADATA_SHARD_KEYS
from trainer.contract import METADATA_FORMAT_VERSION as FORMAT_VERSION

FEATURES = {
    "image": tf.io.FixedLenFeature([], tf.string),
    "label": tf.io.FixedLenFeature([], tf.int64),
}


class DataError(ValueError):
    """A prepared dataset's files do not match its metadata.json, or metadata.json is not one this
    trainer reads: the message names the file, what was expected and found, and what to do."""


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
    """The fingerprint computed again from metadata.json's own entries (`manifest_fingerprint`):
    not `fingerprint` when metadata.json was edited after preparation ("": not computed)."""

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @classmethod
    def from_json(cls, data: Mapping[str, Any], data_dir: str = ".") -> DatasetMetadata:
        """Raises DataError, naming `data_dir`'s metadata.json and what to do, when it is of
        another format_version or malformed."""
        where = storage.join(data_dir, METADATA_FILE)
        if not isinstance(data, Mapping):
            raise DataError(f"{where} is not a JSON object: {_reprepare('SOURCE', data_dir)}")
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise DataError(_version_problem(version, where, str(data.get("source", "SOURCE")), data_dir))
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
            raise DataError(
                f"{where} is malformed ({what}): {_reprepare(str(data.get('source', 'SOURCE')), data_dir)}"
            ) from None
        missing = [s for s in SPLITS if s not in splits]
        if missing:
            raise DataError(f"{where} lacks the split(s) {missing}: {_reprepare(meta.source, data_dir)}")
        return meta


SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def _split_info(split: str, s: Mapping[str, Any]) -> SplitInfo:
    files = []
    for i, entry in enumerate(s["shards"]):
        if not isinstance(entry, Mapping) or sorted(entry) != sorted(METADATA_SHARD_KEYS):
            raise ValueError(
                f"shard {i} of split {split!r} is {json.dumps(entry)[:80]}, expected an object of "
                f"exactly {list(METADATA_SHARD_KEYS)}"
            )
        name, size, records, sha = (entry[k] for k in METADATA_SHARD_KEYS)
        whole = all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (size, records))
        if not (isinstance(name, str) and whole and isinstance(sha, str) and SHA256_HEX.fullmatch(sha)):
            raise ValueError(
                f"shard {i} of split {split!r}: expected a file name, whole non-negative bytes and "
                f"records, and a SHA-256 of 64 hex digits, found {json.dumps(entry)}"
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
    [[name, bytes, records, sha256], ...]}}} taken from metadata.json's own entries. Every shard's
    SHA-256 is in it, so it is a fingerprint of the content; recomputed by every reader, it
    changes when any of those entries is edited without the fingerprint."""
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


def _reprepare(source: str, data_dir: str) -> str:
    return (
        f"prepare the dataset again (`python -m trainer.prepare --source {source} --output_dir "
        f"{data_dir} --overwrite`, with the other flags it was prepared with)"
    )


def _version_problem(version: Any, where: str, source: str, data_dir: str) -> str:
    if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
        return (
            f"{where} has format_version {version}, written by a newer trainer.prepare; this trainer "
            f"reads format_version {FORMAT_VERSION}: use the trainer that prepared it, or "
            f"{_reprepare(source, data_dir)}"
        )
    return (
        f"{where} has format_version {version!r}, written by an older trainer.prepare, whose "
        "metadata.json records no size, record count or SHA-256 per shard to check the shards "
        f"against; this trainer reads format_version {FORMAT_VERSION}: {_reprepare(source, data_dir)}"
    )


VERIFY_ENV = "TRAINER_VERIFY_DATA"
VERIFY_MODES = ("size", "full")
HASH_THREADS = 8
"""Shards hashed at once (reading is the cost: a gs:// shard is a request of its own)."""
HASH_BLOCK = 8 << 20
AUDIT_MAX_BYTES = 16 << 30
"""A read error met while training or evaluating hashes the shards of the splits being read, to
name the one that changed, when they hold at most this many bytes (16 GiB: a minute or two);
above it the error lists the shards and says how to check them."""
SHOWN_PROBLEMS = 5


def load_metadata(data_dir: str, verify: str | None = None) -> DatasetMetadata:
    """Reads `metadata.json` and checks the shards it lists (see `verify_shards`).

    `verify`: "size" (cheap: every shard listed is there under its name with its exact size, and
    no other shard is) or "full" (also the SHA-256 of every shard); None takes
    $TRAINER_VERIFY_DATA, else "size"."""
    meta = read_metadata(data_dir)
    verify_shards(data_dir, meta, verify)
    return meta


def expected_records(count: int, shards: int, index: int) -> int:
    """Records in shard `index` of a split: `trainer.prepare` writes round-robin."""
    return count // shards + (1 if index < count % shards else 0)


def verify_shards(data_dir: str, meta: DatasetMetadata, verify: str | None = None) -> None:
    """Checks the prepared files against metadata.json's manifest; raises DataError naming each
    shard that differs, its split, what was expected and what was found, and what to do.

    Always (no shard read): the manifest is self-consistent (names, record counts as written
    round-robin, class counts adding up, the fingerprint computed again from the entries); the
    folder lists every shard and no other `.tfrecord`; each shard has its exact size. "full":
    also the SHA-256 of every shard. A shard of the wrong size, and every shard when the
    fingerprint shows metadata.json was edited, is hashed to say what it holds (another shard's
    content: swapped or copied; or how many of its records read intact)."""
    mode = verify or os.environ.get(VERIFY_ENV) or "size"
    if mode not in VERIFY_MODES:
        raise ValueError(f"verify={mode!r} (or ${VERIFY_ENV}): expected one of {VERIFY_MODES}")
    _check_manifest(data_dir, meta)
    problems = _check_files(data_dir, meta)
    if problems:
        raise _mismatch(data_dir, meta, problems)
    edited = bool(meta.manifest_fingerprint) and meta.manifest_fingerprint != meta.fingerprint
    if not edited and mode != "full":
        return
    problems = _audit(data_dir, meta, SPLITS)
    if edited and not problems:
        problems = _read_all(data_dir, meta)
    if edited:
        problems.insert(
            0,
            f"metadata.json's entries no longer give its fingerprint (it records {meta.fingerprint}; "
            f"its classes, counts and shard entries give {meta.manifest_fingerprint}): it was edited "
            "after preparation"
            + (
                ", and every shard matches the edited entries and reads intact, so which files "
                "were prepared is unknown"
                if not problems
                else ""
            ),
        )
    if problems:
        raise _mismatch(data_dir, meta, problems)


def _mismatch(data_dir: str, meta: DatasetMetadata, problems: list[str]) -> DataError:
    shown = problems[:SHOWN_PROBLEMS]
    more = len(problems) - len(shown)
    return DataError(
        f"prepared dataset {data_dir} does not match its {METADATA_FILE}: {'; '.join(shown)}"
        + (f"; and {more} more" if more else "")
        + f": {_reprepare(meta.source, data_dir)}"
    )


def _where(split: str, shard: str) -> str:
    return f"shard {shard} of split {split!r}"


def _check_manifest(data_dir: str, meta: DatasetMetadata) -> None:
    """metadata.json against itself and trainer.prepare's rules: no file is read."""
    problems = []
    for split in SPLITS:
        info = meta.splits[split]
        n = len(info.files)
        if sum(info.class_counts.values()) != info.count:
            problems.append(
                f"split {split!r}: its class_counts add up to {sum(info.class_counts.values())}, its "
                f"count is {info.count}"
            )
        for i, entry in enumerate(info.files):
            expected_name = f"{split}-{i:05d}-of-{n:05d}.tfrecord"
            if entry.name != expected_name:
                problems.append(
                    f"{_where(split, entry.name)}: metadata.json lists it as shard {i} of {n} of split "
                    f"{split!r}, which trainer.prepare names {expected_name}; found {entry.name}"
                )
                continue
            records = expected_records(info.count, n, i)
            if entry.records != records:
                problems.append(
                    f"{_where(split, entry.name)}: metadata.json says it holds {entry.records} records; "
                    f"{info.count} records written round-robin into {n} shards put {records} there"
                )
    if problems:
        raise _mismatch(data_dir, meta, problems)


def _listed(meta: DatasetMetadata, splits: Iterable[str] = SPLITS) -> list[tuple[str, ShardInfo]]:
    return [(split, entry) for split in splits for entry in meta.splits[split].files]


def _path(data_dir: str, name: str) -> str:
    return storage.resolve(storage.join(data_dir, name))


def _check_files(data_dir: str, meta: DatasetMetadata) -> list[str]:
    """One listing of the folder and a stat per shard: missing, extra and resized shards (a
    resized one hashed, to say what it holds)."""
    folder = storage.resolve(data_dir)
    present = {name.rstrip("/") for name in tf.io.gfile.listdir(folder)}
    listed = _listed(meta)
    names = {entry.name for _, entry in listed}
    problems, resized = [], []
    for split, entry in listed:
        if entry.name not in present:
            problems.append(
                f"{_where(split, entry.name)}: expected the file ({entry.bytes:,} bytes, "
                f"{entry.records} records), found none"
            )
            continue
        size = tf.io.gfile.stat(_path(data_dir, entry.name)).length
        if size != entry.bytes:
            resized.append((split, entry))
    for name in sorted(present - names):
        if name.endswith(".tfrecord"):
            problems.append(
                f"{name} is in the folder but not in metadata.json, which lists "
                f"{len(names)} shards (a shard of another preparation, or a copy); remove it"
            )
    if resized:
        found = _hash_all(data_dir, resized)
        problems[:0] = [
            _content_problem(meta, split, entry, *found[entry.name], data_dir) for split, entry in resized
        ]
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


def _hash_all(data_dir: str, listed: list[tuple[str, ShardInfo]]) -> dict[str, tuple[str | None, int]]:
    """{shard name: (SHA-256 hex, bytes)} of each listed shard, HASH_THREADS at once; (None, 0)
    for one that is gone."""

    def one(entry: ShardInfo) -> tuple[str | None, int]:
        try:
            return shard_digest(_path(data_dir, entry.name))
        except (FileNotFoundError, tf.errors.NotFoundError):
            return None, 0

    with concurrent.futures.ThreadPoolExecutor(HASH_THREADS) as pool:
        digests = list(pool.map(one, [entry for _, entry in listed]))
    return {entry.name: digest for (_, entry), digest in zip(listed, digests, strict=True)}


def _audit(data_dir: str, meta: DatasetMetadata, splits: Iterable[str]) -> list[str]:
    """The shards of `splits` whose bytes are not those metadata.json records, each hashed."""
    listed = _listed(meta, splits)
    found = _hash_all(data_dir, listed)
    return [
        _content_problem(meta, split, entry, *found[entry.name], data_dir)
        for split, entry in listed
        if found[entry.name][0] != entry.sha256
    ]


def _content_problem(
    meta: DatasetMetadata, split: str, entry: ShardInfo, sha: str | None, size: int, data_dir: str
) -> str:
    """What a shard whose bytes differ from its entry holds instead, in one clause."""
    where = _where(split, entry.name)
    if sha is None:
        return f"{where}: expected the file ({entry.bytes:,} bytes, {entry.records} records), found none"
    expected = f"expected {entry.bytes:,} bytes, {entry.records} records, SHA-256 {entry.sha256[:16]}"
    found = f"found {size:,} bytes{' (the same size)' if size == entry.bytes else ''}, SHA-256 {sha[:16]}"
    if sha == entry.sha256:
        return f"{where}: {expected}; {found}: the SHA-256 recorded, so the shard is intact and its entry in metadata.json was edited"
    twin = next(((s, e) for s, e in _listed(meta) if e.sha256 == sha and e.name != entry.name), None)
    if twin is not None:
        what = f"it holds the content of {_where(twin[0], twin[1].name)}: swapped or copied over"
    else:
        intact, error = _read_records(_path(data_dir, entry.name))
        if error:
            what = f"{_records(intact)} read intact, then {error}"
        elif intact != entry.records:
            what = f"it holds {_records(intact)}, all intact: truncated or replaced by other records"
        else:
            what = f"its {_records(intact)} read intact, but are not the records prepared"
    return f"{where}: {expected}; {found}: {what}"


def _records(n: int) -> str:
    return f"{n:,} record{'' if n == 1 else 's'}"


def _read_all(data_dir: str, meta: DatasetMetadata) -> list[str]:
    """Every shard's records read (their CRCs) and counted against metadata.json: what names a
    shard whose entry was edited to its new size and SHA-256 (only the fingerprint tells)."""
    listed = _listed(meta)
    with concurrent.futures.ThreadPoolExecutor(HASH_THREADS) as pool:
        found = list(pool.map(lambda item: _read_records(_path(data_dir, item[1].name)), listed))
    problems = []
    for (split, entry), (intact, error) in zip(listed, found, strict=True):
        if error or intact != entry.records:
            what = (
                f"{_records(intact)} read intact, then {error}" if error else f"it holds {_records(intact)}"
            )
            problems.append(
                f"{_where(split, entry.name)}: its size and SHA-256 match its entry in metadata.json, "
                f"which says it holds {_records(entry.records)}; {what}"
            )
    return problems


def _read_records(path: str) -> tuple[int, str | None]:
    """Records of a TFRecord file that read intact (their CRCs pass), and the error that stopped
    the reading (None: the file read to its end)."""
    intact = 0
    try:
        for _ in tf.data.TFRecordDataset(path).as_numpy_iterator():
            intact += 1
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
        return intact, _first_cause(e)
    return intact, None


def _first_cause(error: tf.errors.OpError) -> str:
    """The line of a TensorFlow error that says what is wrong (from inside a graph the message
    starts "Graph execution error:" and buries the cause among the op trace), without the op's
    name around it (`{{function_node ...}} corrupted record at 74166 [Op:IteratorGetNext]`)."""
    lines = [line.strip() for line in (error.message or "").splitlines() if line.strip()]
    keep = ("corrupt", "truncat")
    line = next((line for line in lines if any(k in line.lower() for k in keep)), lines[0] if lines else "")
    line = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", line)
    return re.sub(r"\s*\[Op:[^\]]*\].*$", "", line).strip()


def explain_read_error(
    error: tf.errors.OpError, data_dir: str, meta: DatasetMetadata, split: str | tuple[str, ...]
) -> DataError:
    """A DataError for a read error raised while iterating `split` (or each split read at once,
    as `fit` reads train and validation): TensorFlow's `corrupted record at N` names no file, so
    the shards of those splits are hashed against metadata.json (up to AUDIT_MAX_BYTES) to name
    the one that changed; with none changed, the read itself failed."""
    splits = (split,) if isinstance(split, str) else split
    which = f"split {splits[0]!r}" if len(splits) == 1 else "splits " + " and ".join(repr(s) for s in splits)
    head = f"reading {which} in {data_dir} failed ({_first_cause(error)})"
    listed = _listed(meta, splits)
    total = sum(entry.bytes for _, entry in listed)
    if listed and total <= AUDIT_MAX_BYTES:
        problems = _audit(data_dir, meta, splits)
        if problems:
            return DataError(
                f"{head}: {'; '.join(problems[:SHOWN_PROBLEMS])}"
                + (f"; and {len(problems) - SHOWN_PROBLEMS} more" if len(problems) > SHOWN_PROBLEMS else "")
                + f": {_reprepare(meta.source, data_dir)}"
            )
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
        f"{_reprepare(meta.source, data_dir)}"
    )


# --- the cache budget: which splits are cached decoded, which are streamed ------------------

CACHE_BUDGET_ENV = "TRAINER_CACHE_BUDGET_MB"
"""Overrides the cache budget: a whole number of MiB (1 MiB = 2**20 bytes) per worker process;
0 streams every split (with a 1-example training shuffle buffer)."""
CACHE_FRACTION = 0.5
"""The share of the process's memory limit that the cache budget may take. The other half is
for what the budget does not count and cannot know from metadata.json: activations of a training
step held in host memory (several GiB for ResNet50 at batch 64 on a CPU), tf.data's in-flight
elements (interleave, parallel map, prefetch), the allocator's fragmentation, and anything else
in the container. Half is also tf.data's own default RAM budget for autotuned buffers
(`tf.data.experimental.AutotuneOptions.ram_budget`). Overshooting kills the job (the container is
OOM-killed) while undershooting only costs reading speed, so the split leans to safety."""
MODEL_RESERVE_BYTES = 3 << 29
"""1.5 GiB taken off the budget for what the model needs whatever the batch: the TensorFlow
runtime (558 MiB resident after import, measured by the `input` benchmark) plus the largest
backbone's weights, gradients and two Adam slots (ResNet101: 44.5 M parameters x 16 bytes =
0.7 GiB)."""
EXAMPLE_OVERHEAD_BYTES = 256
"""Bytes a cached example costs beyond its pixels: the label and two tensors' bookkeeping."""
STREAM_BUFFER_FACTOR = 3
"""What a streamed shuffle buffer is charged, per example, in multiples of its decoded size. Its
records are allocated and freed by many tf.data threads, and glibc's per-thread arenas keep
freed memory: on the `memory` benchmark's 300 px data (2 cores) buffers of 124 to 1,000 examples
added 1.8-3.0x their bytes to peak resident memory (1x with `MALLOC_MMAP_THRESHOLD_` fixed, at
half the speed). A cache, filled once, costs 1x."""
UNLIMITED = 1 << 60
"""cgroup v1 writes "no limit" as a huge number (9223372036854771712); anything above this is one."""
MIB = 1 << 20


@dataclasses.dataclass(frozen=True)
class CacheBudget:
    """Bytes of decoded examples one worker process may hold in memory, and where that came from."""

    bytes: int
    source: str
    """How it was set, for the log: the memory limit and the rule, or the override."""


def _ancestors(base: Path, cgroup_path: str) -> list[Path]:
    """`base/a/b/c`, `base/a/b`, `base/a`, `base`: a limit set on any ancestor cgroup applies."""
    parts = [part for part in PurePosixPath(cgroup_path).parts if part != "/"]
    return [base.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]


def cgroup_memory_limit(
    cgroup_root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup"
) -> tuple[int, str] | None:
    """The lowest memory limit set on this process's cgroup or its ancestors, and the file that
    sets it: cgroup v2 `memory.max` (mounted at the root, or at `unified/` on hybrid hosts) or v1
    `memory/memory.limit_in_bytes`. None when no limit is set ("max", or v1's huge number) or no
    cgroup file can be read."""
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
    lowest: tuple[int, str] | None = None
    for file in files:
        try:
            text = file.read_text(encoding="utf-8").strip()
        except OSError:
            continue
        if not re.fullmatch(r"[0-9]+", text) or int(text) >= UNLIMITED:
            continue  # "max": no limit here
        if lowest is None or int(text) < lowest[0]:
            lowest = (int(text), str(file))
    return lowest


def physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def cache_budget(
    environ: Mapping[str, str] | None = None,
    *,
    cgroup_root: str = "/sys/fs/cgroup",
    proc_cgroup: str = "/proc/self/cgroup",
) -> CacheBudget:
    """$TRAINER_CACHE_BUDGET_MB when set; else CACHE_FRACTION of the memory limit (the
    container's cgroup limit, else the machine's physical memory) less MODEL_RESERVE_BYTES.

    Per process: workers sharing one machine (a local multi-worker run) each take it whole."""
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
    shards `w, w + N, ...` (worker 0 the most); DATA sharding has every worker read every file
    (and cache all of it: the cache comes before the per-element shard)."""
    n = len(info.shards)
    if num_workers <= 1 or not shards_by_file(info, num_workers):
        return info.count
    return sum(expected_records(info.count, n, i) for i in range(0, n, num_workers))


@dataclasses.dataclass(frozen=True)
class SplitPlan:
    """How one split is read, decided from metadata.json and the budget before reading it."""

    split: str
    cache: bool
    examples: int
    """Examples one worker reads (the most any worker reads)."""
    decoded_bytes: int
    """What caching those examples decoded would take."""
    available_bytes: int
    """The budget left for this split, after the splits planned before it."""
    budget: CacheBudget
    shuffle_buffer: int
    """Training shuffle buffer, in examples: `shuffle_buffer` (at most the split) when cached (the
    buffer holds references into the cache); when streamed, also at most what the budget has left
    at STREAM_BUFFER_FACTOR times an example's decoded size (at least 1)."""
    requested_shuffle_buffer: int

    def describe(self, shards: int) -> str:
        size = (
            f"{self.examples:,} examples x {_size(self.decoded_bytes / max(self.examples, 1))} = "
            f"{_size(self.decoded_bytes)} decoded per worker"
        )
        budget = f"{_size(self.available_bytes)} of the cache budget left (budget {_size(self.budget.bytes)}: {self.budget.source})"
        if self.cache:
            return f"split {self.split!r}: cached in memory: {size} fits {budget}"
        line = f"split {self.split!r}: streamed from {shards} shard(s) every epoch: {size} exceeds {budget}"
        if self.split == "train":
            per = self.decoded_bytes // max(self.examples, 1)
            line += (
                f"; training shuffle buffer {self.shuffle_buffer:,} examples ({_size(self.shuffle_buffer * per)}"
                f" decoded, charged {STREAM_BUFFER_FACTOR}x)"
            )
            if self.shuffle_buffer < min(self.requested_shuffle_buffer, self.examples):
                line += f", cut from --shuffle_buffer {self.requested_shuffle_buffer:,} to fit the budget"
        return line


def plan_cache(
    meta: DatasetMetadata,
    budget: CacheBudget,
    *,
    num_workers: int = 1,
    shuffle_buffer: int = 2048,
) -> dict[str, SplitPlan]:
    """Cache or stream, for every split, in the order train, validation, test, sharing one budget
    (a worker holds its training and validation caches at once): a split is cached when its
    decoded size fits what the splits before it left; a streamed training split's shuffle buffer
    is charged to the budget instead (STREAM_BUFFER_FACTOR times its decoded size)."""
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
    """Batches of (uint8 images [B, S, S, 3], int32 labels [B]) from one split.

    `batch_size` is the global batch: under a distribution strategy each replica receives its
    share. Training datasets repeat forever (callers give `steps_per_epoch`), so every worker
    runs the same number of steps whatever its shards hold; evaluation datasets end.
    With fewer shards than `num_workers` (tiny datasets) FILE sharding is impossible and
    every worker reads all files, keeping its share of the examples (DATA sharding).
    `budget` (default: `cache_budget()`) decides whether the split is cached or streamed
    (`plan_cache`); `log` receives the one line saying which (None: silent).
    """
    info = meta.splits[split]
    files = [storage.resolve(storage.join(data_dir, shard)) for shard in info.shards]
    size, encoding = meta.image_size, meta.encoding
    plans = plan_cache(meta, budget or cache_budget(), num_workers=num_workers, shuffle_buffer=shuffle_buffer)
    plan = plans[split]
    if log is not None:
        log(plan.describe(len(files)))

    def parse(record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        example = tf.io.parse_single_example(record, FEATURES)
        image = images.decode_stored(example["image"], encoding, size)
        return image, tf.cast(example["label"], tf.int32)

    if plan.cache:
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
            ds = ds.shuffle(plan.shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
            ds = ds.repeat()
    else:
        ds = _streamed(files, info, parse, training=training, seed=seed, shuffle_buffer=plan.shuffle_buffer)
    ds = ds.batch(batch_size, drop_remainder=training).prefetch(tf.data.AUTOTUNE)

    options = tf.data.Options()
    policy = tf.data.experimental.AutoShardPolicy
    options.experimental_distribute.auto_shard_policy = (
        policy.FILE if shards_by_file(info, num_workers) else policy.DATA
    )
    options.deterministic = not training or not plan.cache
    # No autotuning model: the parallel steps run at min(16, cores) (AutotuneOptions'
    # initial_parallelism), the most a decode pipeline can use, and the prefetch buffers keep
    # their own tuner. The model's thread made deleting a training iterator wait for its next
    # optimisation period: measured here, a worker's `model.fit` returned 38-97 s after its last
    # epoch under MultiWorkerMirroredStrategy, the chief waiting on it (docs/facts.md, fact 37).
    options.autotune.enabled = False
    return ds.with_options(options)


def _streamed(
    files: list[str],
    info: SplitInfo,
    parse: Callable[[tf.Tensor], tuple[tf.Tensor, tf.Tensor]],
    *,
    training: bool,
    seed: int,
    shuffle_buffer: int,
) -> tf.data.Dataset:
    """Every epoch reads the shards again, in parallel, and decodes each example.

    Training: the shard order is shuffled every epoch, each shard is read from a seeded offset
    onwards and then from its start (every record once), and serialized records pass through a
    `shuffle_buffer` before they are decoded (smaller than decoded for JPEG/PNG). Reads and
    decoding keep their order (`deterministic=True`), so the order is a function of the seed.
    The offsets matter: `trainer.prepare` writes records round-robin in source order, and a folder
    source lists class by class, so shards read from their starts in lockstep would fill the
    buffer with one class at a time."""
    ds = tf.data.Dataset.from_tensor_slices(files)
    read: Callable[[tf.Tensor], tf.data.Dataset] = tf.data.TFRecordDataset
    if training:
        ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
        fewest = max(1, info.count // len(files))  # records in the smallest shard
        salt = f":{seed}"

        def read(path: tf.Tensor) -> tf.data.Dataset:
            name = tf.strings.regex_replace(path, r"^.*/", "")
            offset = tf.strings.to_hash_bucket_fast(name + salt, fewest)
            return (
                tf.data.TFRecordDataset(path)
                .skip(offset)
                .concatenate(tf.data.TFRecordDataset(path).take(offset))
            )

    ds = ds.interleave(
        read, cycle_length=min(len(files), 16), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
    )
    if training:
        # Before `repeat`: every epoch holds each example once; the buffer empties at its end.
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True).repeat()
    return ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def steps_per_epoch(meta: DatasetMetadata, global_batch_size: int) -> int:
    """Full global batches in one pass over the training split (at least 1: a global batch larger
    than the split is refused first, `check_global_batch`)."""
    return max(1, meta.splits["train"].count // global_batch_size)


class BatchTooLarge(ValueError):
    """The global batch is larger than the training split; the message is one line."""


def read_metadata(data_dir: str) -> DatasetMetadata:
    """`metadata.json` alone, no shard checked (`load_metadata` checks them): cheap, and reads no
    record, so it may run before the distribution strategy is built."""
    path = storage.join(data_dir, METADATA_FILE)
    if not tf.io.gfile.exists(storage.resolve(path)):
        raise FileNotFoundError(
            f"{path} not found: --data_dir must be a folder written by `python -m trainer.prepare`"
        )
    try:
        content = storage.read_json(path)
    except ValueError as e:  # json.JSONDecodeError, UnicodeDecodeError
        raise DataError(f"{path} is not JSON ({e}): {_reprepare('SOURCE', data_dir)}") from None
    return DatasetMetadata.from_json(content, data_dir)


def largest_per_replica_batch(train_examples: int, replicas: int) -> int:
    """The largest per-replica batch whose global batch fits the training split (0: none does)."""
    return train_examples // max(1, replicas)


def check_global_batch(
    meta: DatasetMetadata, per_replica_batch_size: int, replicas: int, data_dir: str
) -> None:
    """Raises BatchTooLarge when `per_replica_batch_size x replicas` exceeds the training split.

    The rule is the condition under which one training step cannot be filled from one pass over
    the split. Training batches are `batch(global_batch, drop_remainder=True)` after `repeat()`
    (`make_dataset`), so the pipeline never runs dry and no error would come: a global batch
    larger than the split would fill every step by drawing images again (the same image twice in
    one step, whatever the order), and `count // global_batch`, the steps in an epoch, would be 0,
    which `steps_per_epoch`'s max(1, ...) would hide, calling one such step an epoch (the learning
    rate schedule, the best epoch and early stopping all count epochs). A global batch equal to
    the split is one step per epoch holding every image once."""
    count = meta.splits["train"].count
    global_batch = per_replica_batch_size * replicas
    if global_batch <= count:
        return
    largest = largest_per_replica_batch(count, replicas)
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
