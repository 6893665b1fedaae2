"""Paths on local disk, `gs://` and the Cloud Storage FUSE mount `/gcs/`, and atomic publishing.

Every read and write goes through `tf.io.gfile`, which speaks `gs://` natively; `/gcs/<bucket>`
paths are used as they are where the FUSE mount exists (on Vertex AI) and become
`gs://<bucket>` where it does not. Only reading and writing import TensorFlow: the path rules
serve TensorFlow-free modules too (`trainer.serve`, `trainer.preparation.sourcecheck`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

from trainer.contract import METADATA_FILE, SAVED_MODEL_FILE

GCS_FUSE_ROOT = "/gcs/"

# Written last when publishing, so their presence means the folder is complete.
COMPLETION_FILES = (SAVED_MODEL_FILE, METADATA_FILE)


def resolve(path: str) -> str:
    """The form of `path` that works here: `/gcs/b/x` becomes `gs://b/x` without the mount."""
    if path.startswith(GCS_FUSE_ROOT) and not os.path.isdir(GCS_FUSE_ROOT):
        return "gs://" + path[len(GCS_FUSE_ROOT) :]
    return path


def is_remote(path: str) -> bool:
    return "://" in resolve(path)


def holds(folder: str, path: str) -> bool:
    """`path` is `folder` or inside it, however either is spelt: `/gcs/` or `gs://`, `.`, `..`,
    `//`, a relative path or (local) a symbolic link on the way."""

    def canonical(p: str) -> str:
        p = "gs://" + p[len(GCS_FUSE_ROOT) :] if p.startswith(GCS_FUSE_ROOT) else p
        scheme, sep, rest = p.partition("://")
        return f"{scheme}://{os.path.normpath('/' + rest)}" if sep else os.path.realpath(p)

    folder, path = canonical(folder), canonical(path)
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])


def read_json(path: str) -> Any:
    from trainer._tf import tf

    with tf.io.gfile.GFile(resolve(path), "r") as f:
        return json.load(f)


def write_json(path: str, data: Any) -> None:
    """Writes JSON (sorted keys, so equal data gives equal bytes) through a temporary name, its
    folder made first."""
    from trainer._tf import tf

    path = resolve(path)
    tf.io.gfile.makedirs(os.path.dirname(path))
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        with tf.io.gfile.GFile(tmp, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
        tf.io.gfile.rename(tmp, path, overwrite=True)
    except BaseException:  # a full disk: no partial file left beside the ones readers list
        with contextlib.suppress(tf.errors.OpError):
            tf.io.gfile.remove(tmp)
        raise


@contextlib.contextmanager
def staged_output(final: str) -> Iterator[str]:
    """Yields a fresh folder to write into; publishes it as `final` only if the block succeeds.
    A failed block leaves `final` as it was and removes the staging folder. Local folders are
    staged beside `final` and renamed into place (atomic); remote ones staged on local disk and
    copied, the COMPLETION_FILES last, so a crash mid-copy never looks finished. A staging folder
    a SIGKILL left is removed by the next publish of `final` (`remove_leftovers`)."""
    final = resolve(final)
    staging = ""
    try:
        # Made inside the `try`: a signal handler's exception (trainer.prepare's SIGTERM) right
        # after making it must not leave it behind.
        if is_remote(final):
            staging = tempfile.mkdtemp(prefix="staging-")
        else:
            parent = os.path.dirname(os.path.abspath(final))
            os.makedirs(parent, exist_ok=True)
            remove_leftovers(final)
            staging = os.path.join(parent, f".{os.path.basename(final)}.staging-{uuid.uuid4().hex[:8]}")
            os.makedirs(staging)
        yield staging
        publish(staging, final)
    finally:
        if staging and os.path.isdir(staging):
            shutil.rmtree(staging, ignore_errors=True)


def publish(staging: str, final: str) -> None:
    """Moves the complete local folder `staging` to `final`, replacing what was there (a folder,
    a plain file or a link: whatever it was, nothing of it is left beside `final`)."""
    from trainer._tf import tf

    if not is_remote(final):
        old = None
        if os.path.lexists(final):
            old = f"{final}.old-{uuid.uuid4().hex[:8]}"
            os.rename(final, old)
        os.rename(staging, final)
        if old:
            _remove(old)
        return
    for name in COMPLETION_FILES:  # stale ones first: until the copy ends, `final` is unfinished
        with contextlib.suppress(tf.errors.NotFoundError):
            tf.io.gfile.remove(join(final, name))
    files = [os.path.relpath(os.path.join(d, n), staging) for d, _, names in os.walk(staging) for n in names]
    staged = {join(final, rel) for rel in files}
    # Then whatever else an earlier output left there (its shards, with another shard count):
    # nothing of it may stay beside the new one, as a local publish leaves nothing of it.
    for d, _, names in tf.io.gfile.walk(final) if tf.io.gfile.isdir(final) else ():
        for stale in {join(d, n) for n in names} - staged:
            tf.io.gfile.remove(stale)
    for rel in sorted(files, key=lambda rel: os.path.basename(rel) in COMPLETION_FILES):
        target = join(final, rel)
        tf.io.gfile.makedirs(os.path.dirname(target))
        tf.io.gfile.copy(os.path.join(staging, rel), target, overwrite=True)


def _remove(path: str) -> None:
    """Removes a file, a link (not what it points to) or a folder tree."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def leftovers(final: str) -> list[str]:
    """What an interrupted publish of the local `final` left beside it: staging folders
    (`.<name>.staging-<hex>`) and replaced outputs not yet deleted (`<name>.old-<hex>`)."""
    parent, name = os.path.split(os.path.abspath(final))
    pattern = re.compile(rf"(\.{re.escape(name)}\.staging|{re.escape(name)}\.old)-[0-9a-f]{{8}}")
    entries = os.listdir(parent) if os.path.exists(parent) else []
    return sorted(os.path.join(parent, e) for e in entries if pattern.fullmatch(e))


def remove_leftovers(final: str) -> None:
    """Deletes `leftovers(final)`. Called when `final` is published again: the job that left
    them was stopped (one job writes a given output), so nothing else uses them."""
    for path in leftovers(final):
        _remove(path)
