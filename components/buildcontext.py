"""The trainer image's build context and its content tag (no KFP here: local components import
this module inside the KFP runtime, where `kfp.dsl` has no decorators)."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from collections.abc import Iterable, Iterator
from pathlib import Path

# The build context: what the Dockerfiles may COPY. Keep in step with .dockerignore.
# Dockerfile.serving (the custom serving image) is built from the same context.
CONTEXT_FILES = ("Dockerfile", "pyproject.toml", "uv.lock", "Dockerfile.serving")
CONTEXT_DIRS = ("trainer",)
_SKIP_PARTS = ("__pycache__",)
_SKIP_SUFFIXES = (".pyc", ".pyo")


def context_tag(members: Iterable[tuple[str, bytes]]) -> str:
    """The image tag for a build context: `src-` and 20 hex digits of a hash over the sorted
    (relative path, content) pairs. File order, timestamps and owners do not count."""

    import hashlib  # inside: shipped alone to the Vertex component (additional_funcs)

    outer = hashlib.sha256()
    for name, data in sorted(members):
        outer.update(name.encode() + b"\0" + hashlib.sha256(data).hexdigest().encode() + b"\n")
    return "src-" + outer.hexdigest()[:20]


def tarball_members(data: bytes) -> list[tuple[str, bytes]]:
    """The regular files of a (gzipped) context tarball as (relative path, content)."""
    import io
    import tarfile

    out = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        for info in tar.getmembers():
            if info.isfile():
                f = tar.extractfile(info)
                name = info.name[2:] if info.name.startswith("./") else info.name
                out.append((name, f.read() if f else b""))
    return out


def context_members(root: str | os.PathLike[str]) -> Iterator[tuple[str, bytes]]:
    """The build context of a checkout, as (relative path, content), caches left out."""
    base = Path(root)
    missing = [name for name in (*CONTEXT_FILES, *CONTEXT_DIRS) if not (base / name).exists()]
    if missing:
        raise ValueError(
            f"build context {base} lacks {', '.join(missing)}; it needs {', '.join(CONTEXT_FILES)} "
            f"and the folders {', '.join(CONTEXT_DIRS)}/"
        )
    for name in CONTEXT_FILES:
        yield name, (base / name).read_bytes()
    for folder in CONTEXT_DIRS:
        for path in sorted((base / folder).rglob("*")):
            rel = path.relative_to(base)
            if path.is_file() and not set(rel.parts) & set(_SKIP_PARTS) and path.suffix not in _SKIP_SUFFIXES:
                yield rel.as_posix(), path.read_bytes()


def write_context_tarball(root: str | os.PathLike[str], out: io.BufferedIOBase | str) -> str:
    """Packs the build context into a reproducible .tar.gz; returns its `context_tag`."""
    members = list(context_members(root))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))

    payload = gzip.compress(buf.getvalue(), mtime=0)
    if isinstance(out, str):
        Path(out).write_bytes(payload)
    else:
        out.write(payload)
    return context_tag(members)
