"""The trainer image's build context and its content tag (no KFP here: local components import
this module inside the KFP runtime, where `kfp.dsl` has no decorators)."""

from __future__ import annotations

import gzip
import io
import os
import stat
import subprocess
import sys
import tarfile
from collections.abc import Iterable
from pathlib import Path

from components.contextsecrets import PUBLIC_NAMES, SECRET_NAMES, why_secret

# The build context: what the Dockerfiles may COPY. Keep in step with .dockerignore.
CONTEXT_FILES = ("Dockerfile", "pyproject.toml", "uv.lock", "Dockerfile.serving")
CONTEXT_DIRS = ("trainer",)
_SKIP_PARTS = ("__pycache__",)
_SKIP_SUFFIXES = (".pyc", ".pyo")


def context_tag(members: Iterable[tuple[str, bytes]]) -> str:
    """The image tag for a build context: `src-` and 20 hex digits of a hash over the sorted
    (relative path, content) pairs. File order, timestamps and owners do not count."""
    import hashlib

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


# Git's variables that would point it at another repository than the checkout's own.
_GIT_ENV = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_COMMON_DIR")


def context_members(root: str | os.PathLike[str]) -> list[tuple[str, bytes]]:
    """The build context of a checkout, as (relative path, content), in path order: in a git
    checkout the tracked files among CONTEXT_FILES and below CONTEXT_DIRS (untracked, unignored
    ones named on stderr, Python ones refused); without git or .git (Cloud Build's source), every
    file there. Caches are left out, as .dockerignore does. A symlink to a member is taken with its
    content; any other symlink, a path through a symlinked folder, a non-regular file or a file
    that looks like a secret (`why_secret`) is refused: a ValueError naming every offending file and
    what to do, before anything is packed or uploaded."""
    base = Path(root)
    missing = [name for name in (*CONTEXT_FILES, *CONTEXT_DIRS) if not os.path.lexists(base / name)]
    if missing:
        raise ValueError(
            f"build context {base} lacks {', '.join(missing)}; it needs {', '.join(CONTEXT_FILES)} "
            f"and the folders {', '.join(CONTEXT_DIRS)}/"
        )
    problems = [
        f"{folder}: must be a folder in the checkout (not a file, not a symlink)"
        for folder in CONTEXT_DIRS
        if os.path.islink(base / folder) or not (base / folder).is_dir()
    ]
    if problems:
        raise _refusal(base, problems)

    tracked = _git_files(base, "--cached")
    names = _walk(base) if tracked is None else tracked
    if tracked is not None:
        untracked_files = [n for n in CONTEXT_FILES if n not in tracked]
        if untracked_files:
            raise ValueError(
                f"build context {base}: {', '.join(untracked_files)} not tracked by git; the context "
                f"is what git tracks, so `git add` {'it' if len(untracked_files) == 1 else 'them'}"
            )
        untracked = sorted(n for n in _git_files(base, "--others", "--exclude-standard") or () if _kept(n))
        code = [n for n in untracked if n.endswith(".py")]
        if code:  # the local target imports it from the checkout; the image would lack it
            raise ValueError(
                f"build context {base}: {', '.join(code)} not tracked by git; the image holds what git "
                "tracks, so the jobs on Vertex would not find the code a local run imports: `git add` "
                "it, or move it out of the folder"
            )
        if untracked:
            more = f" and {len(untracked) - 10} more" if len(untracked) > 10 else ""
            print(
                f"build context {base}: left out {len(untracked)} file(s) git does not track: "
                f"{', '.join(untracked[:10])}{more} (`git add` what the image needs)",
                file=sys.stderr,
            )

    real_base = os.path.realpath(base)
    files: dict[str, bytes] = {}
    links: dict[str, str] = {}  # symlink -> its target, relative to the checkout
    for name in sorted(n for n in names if _kept(n)):
        path = base / name
        try:  # a name's bytes that are not UTF-8 were decoded to surrogates: no tar or tag takes them
            name.encode("utf-8")
        except UnicodeEncodeError:
            problems.append(f"{name!r}: its name is not UTF-8; rename it")
            continue
        try:
            mode = path.lstat().st_mode
        except FileNotFoundError:
            continue  # tracked, but deleted in the working tree: not in the context
        real = os.path.realpath(path)
        inside = real == real_base or real.startswith(real_base.rstrip(os.sep) + os.sep)
        if stat.S_ISLNK(mode):
            if not inside:
                problems.append(
                    f"{name}: a symlink to {real}, outside the checkout; symlinks are never followed "
                    "out of it: put the file itself in the checkout or remove the link"
                )
            else:
                links[name] = Path(os.path.relpath(real, real_base)).as_posix()
        elif os.path.normcase(real) != os.path.normcase(os.path.join(real_base, name)):
            problems.append(
                f"{name}: its path goes through a symlinked folder (to {real}); "
                "put the folder itself in the checkout or remove the link"
            )
        elif not stat.S_ISREG(mode):
            problems.append(
                f"{name}: not a regular file ({_kind(mode)}); the context holds files only: remove "
                "it or move it out of the context"
            )
        else:
            files[name] = path.read_bytes()
    for name, target in links.items():
        if target in files:
            files[name] = files[target]
        else:
            problems.append(
                f"{name}: a symlink to {target}, which is not itself a file of the build context; "
                "put the file itself there or remove the link"
            )

    for name, data in sorted(files.items()):
        problem = why_secret(name, data)
        if problem:
            target = f" (the symlink's target {links[name]})" if name in links else ""
            problems.append(
                f"{name}{target}: {problem}; secrets must never reach the image: remove it, or move it "
                "out of the context (and out of git: `git rm --cached`), and pass it at run time instead"
            )
    if problems:
        raise _refusal(base, problems)
    return sorted(files.items())


def _kept(name: str) -> bool:
    """Whether a context path survives the cache rules .dockerignore also has."""
    parts = name.split("/")
    return not set(parts) & set(_SKIP_PARTS) and not parts[-1].endswith(_SKIP_SUFFIXES)


def _git_files(base: Path, *which: str) -> set[str] | None:
    """`git ls-files -z` for the context's paths; None without git or a checkout."""
    env = {k: v for k, v in os.environ.items() if k not in _GIT_ENV}
    env["LC_ALL"] = "C"  # git's messages untranslated: "not a git repository" is looked for
    specs = [*CONTEXT_FILES, *(f"{d}/" for d in CONTEXT_DIRS)]
    cmd = ["git", "--literal-pathspecs", "-C", str(base), "ls-files", "-z", *which, "--", *specs]
    try:
        proc = subprocess.run(cmd, capture_output=True, env=env, check=False)
    except OSError:  # no git here: the source is all there is
        return None
    if proc.returncode != 0:
        error = proc.stderr.decode(errors="replace").strip()
        if "not a git repository" in error:
            return None
        raise ValueError(f"build context {base}: `git ls-files` failed: {error}")
    listed = {os.fsdecode(n) for n in proc.stdout.split(b"\0") if n}
    # A pathspec `Dockerfile` also matches `Dockerfile/x`: keep exactly the context's paths.
    return {n for n in listed if n in CONTEXT_FILES or n.startswith(tuple(f"{d}/" for d in CONTEXT_DIRS))}


def _walk(base: Path) -> list[str]:
    """Every non-folder path below CONTEXT_DIRS (symlinked folders included, not followed)."""
    names = list(CONTEXT_FILES)
    for folder in CONTEXT_DIRS:
        for top, dirs, filenames in os.walk(base / folder, followlinks=False):
            rel = Path(top).relative_to(base).as_posix()
            names += [f"{rel}/{d}" for d in dirs if os.path.islink(os.path.join(top, d))]
            dirs[:] = sorted(
                d for d in dirs if d not in _SKIP_PARTS and not os.path.islink(os.path.join(top, d))
            )
            names += [f"{rel}/{f}" for f in filenames]
    return names


def _kind(mode: int) -> str:
    kinds = dict(d="a folder", p="a FIFO", s="a socket", c="a character device", b="a block device")
    return kinds.get(stat.filemode(mode)[0], "not a file")


def dockerignore_secret_rules() -> list[str]:
    """.dockerignore's secret rules from SECRET_NAMES and PUBLIC_NAMES, in either case (Docker
    matches case-sensitively; the context does not)."""

    def either_case(pattern: str) -> str:
        return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c for c in pattern)

    return [
        *(f"**/{either_case(p)}" for p in SECRET_NAMES),
        *(f"!{d}/**/{either_case(p)}" for d in CONTEXT_DIRS for p in PUBLIC_NAMES),
    ]


def _refusal(base: Path, problems: list[str]) -> ValueError:
    lines = "\n".join(f"  - {p}" for p in problems)
    return ValueError(f"build context {base}: refusing to pack it, nothing was uploaded:\n{lines}")


def write_context_tarball(root: str | os.PathLike[str], out: io.BufferedIOBase) -> str:
    """Packs the build context into a reproducible .tar.gz; returns its `context_tag`."""
    members = context_members(root)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))

    out.write(gzip.compress(buf.getvalue(), mtime=0))
    return context_tag(members)


if __name__ == "__main__":
    if sys.argv[1:] != ["--dockerignore"]:
        sys.exit("usage: python -m components.buildcontext --dockerignore")
    print("\n".join(dockerignore_secret_rules()))
