"""The local model registry's file access: every read and write of `<registry_dir>/<model>/`
goes through here (plain Python, no kfp: the components of `local.steps` import it in their
bodies). A registry folder may be shared by a team, so whoever can write it must not be able to
turn the next user's run against that user's files (docs/guarantees.md, the registry rows):

- nothing is opened through a symbolic link: everything is opened relative to its parent's
  descriptor with `O_NOFOLLOW`, and a link is refused, named;
- new files and folders are created with `O_CREAT | O_EXCL` (`mkdir`) under unpredictable names
  (`.staging-*`, `.aliases.json.*.tmp`), and only those are renamed into place; the lock is
  opened read-only, never truncated;
- everything read goes through one validator, `load`, naming the damaged file and its repair; an
  alias is accepted only as the registry writes it (a version number: "1", "2"...);
- a damaged champion (`read_version`) is "no usable champion": the caller goes on without it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import math
import os
import re
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator
from typing import Any

# A version as the registry writes it (str(n), n >= 1); an alias name (Vertex's rule, lowercase).
VERSION = re.compile(r"[1-9][0-9]{0,8}")
ALIAS = re.compile(r"[a-z][a-z0-9_-]{0,62}")
# The metrics.json keys checked here: `local.steps.METRICS_READ` (tests/local/test_registry_hardening.py).
METRICS_KEYS = ("test_accuracy", "class_names")
MAX_JSON_BYTES = 16 * 1024 * 1024
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # a FIFO never blocks the read
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class RegistryError(ValueError):
    """The registry cannot be used as it is: the message names the path, what is wrong and the fix."""


class Damaged(RegistryError):
    """A registry file or folder that is not as the registry writes it."""

    def __init__(self, path: str, problem: str, fix: str) -> None:
        self.path, self.problem, self.fix = path, problem, fix
        super().__init__(f"local registry: {path} {problem}; {fix}")


def _what(dir_fd: int | None, name: str, err: OSError | None = None) -> str:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return "is missing"
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(name, dir_fd=dir_fd)
        except OSError:
            target = "?"
        return f"is a symbolic link (to {target}); the registry follows no link"
    if stat.S_ISDIR(st.st_mode):
        return "is a folder"
    if not stat.S_ISREG(st.st_mode):
        return "is not a plain file (a FIFO, socket or device)"
    return f"cannot be opened ({err.strerror or err})" if err else "is a plain file"


def open_folder(dir_fd: int | None, name: str, path: str, fix: str, create: bool = False) -> int | None:
    """The folder `name` in `dir_fd` (`path`: its full path, for messages), opened without
    following a link; created first when `create`; None when it is missing."""
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o777, dir_fd=dir_fd)
    try:
        return os.open(name, _DIR, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as err:
        problem = _what(dir_fd, name, err)  # dir_fd None: `name` is the absolute path
        if err.errno == errno.ENOTDIR and not problem.startswith("is a symbolic link"):
            problem = "is not a folder"
        raise Damaged(path, problem, fix) from None


def open_registry(registry_dir: str, create: bool) -> int | None:
    """The registry folder itself (its parents are the user's path and may be links; the folder
    may not). None when it does not exist and not `create`."""
    path = os.path.abspath(registry_dir)
    if create:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    fix = f"give --registry_dir the folder itself ({os.path.realpath(path)}), not a link to it"
    return open_folder(None, path, path, fix, create=create)


def open_model(registry_fd: int, registry_dir: str, folder: str, create: bool) -> int | None:
    path = os.path.join(os.path.abspath(registry_dir), folder)
    fix = (
        f"the model's folder must be a real folder: move {path} aside (mv {path} {path}.damaged) "
        "and restore the model's folder from a copy, or let the next upload start it anew"
    )
    return open_folder(registry_fd, folder, path, fix, create=create)


def make_model(registry_dir: str, folder: str) -> int:
    """The model's folder, for a registration: both folders created when missing."""
    registry_fd = open_registry(registry_dir, create=True)
    path = os.path.join(os.path.abspath(registry_dir), folder)
    if registry_fd is None:
        raise RegistryError(f"local registry: {os.path.dirname(path)} vanished while it was being created")
    try:
        model_fd = open_model(registry_fd, registry_dir, folder, create=True)
    finally:
        os.close(registry_fd)
    if model_fd is None:
        raise RegistryError(f"local registry: {path} vanished while it was being created")
    return model_fd


@contextlib.contextmanager
def locked(model_fd: int, model_path: str) -> Iterator[None]:
    """The model's lock (`fcntl.flock` on `.lock`, a plain empty file), never written."""
    path = os.path.join(model_path, ".lock")
    fix = f"the lock must be a plain file, which the registry creates: remove {path} and run again"
    fd = _open_plain(model_fd, ".lock", path, fix, os.O_CREAT)
    if fd is None:  # the model's folder went away
        raise Damaged(path, "is missing", fix)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released when the descriptor closes
        yield
    finally:
        os.close(fd)


# --- the one validator ------------------------------------------------------------------------


def _check_aliases(doc: dict[str, Any]) -> str:
    for key, value in doc.items():
        if not ALIAS.fullmatch(key):
            return f"names an alias {key!r} the registry never writes"
        if not isinstance(value, str) or not VERSION.fullmatch(value):
            return f"puts alias {key!r} on {value!r}, which is not a version number as the registry writes it"
    return ""


def _check_metrics(doc: dict[str, Any]) -> str:
    missing = [k for k in METRICS_KEYS if k not in doc]
    if missing:
        return f"has no {', '.join(missing)}"
    accuracy, classes = doc[METRICS_KEYS[0]], doc[METRICS_KEYS[1]]
    if isinstance(accuracy, bool) or not isinstance(accuracy, int | float) or not math.isfinite(accuracy):
        return f"has {METRICS_KEYS[0]} {accuracy!r}, not a number"
    if not isinstance(classes, list) or not classes or not all(isinstance(c, str) for c in classes):
        return f"has {METRICS_KEYS[1]} {classes!r}, not a list of class names"
    return ""


def _check_version(doc: dict[str, Any]) -> str:
    files = doc.get("files", {})
    if not isinstance(files, dict) or not all(
        isinstance(k, str)
        and isinstance(v, dict)
        and isinstance(v.get("size"), int)
        and isinstance(v.get("sha256"), str)
        for k, v in files.items()
    ):
        return "has a files list that is not the registry's ({path: {size, sha256}})"
    return ""


ALIASES_FIX = (
    'the registry writes {"default": "1", "champion": "<a version folder>"}: repair it to that '
    "form, or move it aside (mv {path} {path}.damaged) and the next upload starts a new one"
)
CHECKS = {"aliases": _check_aliases, "metrics": _check_metrics, "version": _check_version}


def _not_writable(folder: str, err: OSError) -> RegistryError:
    return RegistryError(
        f"local registry: {folder} cannot be written by this user ({err.strerror}); a shared registry "
        "needs its model folders writable by each user who registers: ask its owner, or give "
        "--registry_dir a registry of your own"
    )


def _open_plain(dir_fd: int, name: str, path: str, fix: str, flags: int = 0) -> int | None:
    """The plain file `name` of `dir_fd` (at `path`), opened without following a link (`flags`
    added: os.O_CREAT creates it); None when it is missing."""
    try:
        fd = os.open(name, _READ | flags, 0o666, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except PermissionError as err:  # a registry shared with a user who made this folder
        raise _not_writable(os.path.dirname(path), err) from None
    except OSError as err:
        raise Damaged(path, _what(dir_fd, name, err), fix) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Damaged(path, _what(dir_fd, name), fix)
    return fd


def load(dir_fd: int, name: str, where: str, kind: str, fix: str, missing_ok: bool = False) -> Any:
    """The JSON document `name` of `dir_fd` (at `where`), checked as `kind` (`CHECKS`): a plain
    file, at most MAX_JSON_BYTES, of the form the registry writes. Raises `Damaged` naming the
    file, what is wrong and `fix` (its `{path}` filled in); None if missing and `missing_ok`."""
    path = os.path.join(where, name)
    fix = fix.replace("{path}", path)  # not format: a path may hold braces
    fd = _open_plain(dir_fd, name, path, fix)
    if fd is None:
        if missing_ok:
            return None
        raise Damaged(path, "is missing", fix)
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_JSON_BYTES + 1)
    if len(data) > MAX_JSON_BYTES:
        raise Damaged(path, f"is larger than {MAX_JSON_BYTES} bytes", fix)
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as err:
        raise Damaged(path, f"is not JSON ({err})", fix) from None
    problem = CHECKS[kind](doc) if isinstance(doc, dict) else f"holds a {type(doc).__name__}, not an object"
    if problem:
        raise Damaged(path, problem, fix)
    return doc


def read_aliases(model_fd: int, model_path: str) -> dict[str, str] | None:
    """aliases.json, checked; None when there is none yet."""
    return load(model_fd, "aliases.json", model_path, "aliases", ALIASES_FIX, missing_ok=True)


def read_version(model_fd: int, model_path: str, version: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(SavedModel folder, metrics.json, version.json) of `version`, every file checked: the
    SavedModel's files against the sizes and sha256 recorded (a non-empty saved_model.pb where
    none were), metrics.json's keys. Raises `Damaged` naming what is damaged."""
    root = os.path.join(model_path, version)
    fix = (
        f"restore {root} from a copy, or put champion on a sound version (edit "
        f"{os.path.join(model_path, 'aliases.json')}, or remove its 'champion' entry)"
    )

    vfd = mfd = None
    try:
        vfd = open_folder(model_fd, version, root, fix)
        if vfd is None:
            raise Damaged(root, "is missing", fix)
        record = load(vfd, "version.json", root, "version", fix)
        model = os.path.join(root, "model")
        mfd = open_folder(vfd, "model", model, fix)
        if mfd is None:
            raise Damaged(model, "is missing", fix)
        metrics = load(mfd, "metrics.json", model, "metrics", fix)
        files = record.get("files") or {"saved_model.pb": None}
        for relative, expected in sorted(files.items()):
            _check_file(mfd, model, relative, expected, fix)
        return model, metrics, record
    finally:
        for fd in (mfd, vfd):
            if fd is not None:
                os.close(fd)


def _check_file(model_fd: int, model: str, relative: str, expected: dict[str, Any] | None, fix: str) -> None:
    parts = relative.split("/")
    path = os.path.join(model, *parts)
    if any(p in ("", ".", "..") for p in parts):
        raise Damaged(os.path.join(os.path.dirname(model), "version.json"), f"lists a file {relative!r}", fix)
    fds: list[int] = []
    try:
        parent = model_fd
        for i, part in enumerate(parts[:-1]):
            sub = open_folder(parent, part, os.path.join(model, *parts[: i + 1]), fix)
            if sub is None:
                raise Damaged(os.path.join(model, *parts[: i + 1]), "is missing", fix)
            fds.append(sub)
            parent = sub
        fd = _open_plain(parent, parts[-1], path, fix)
        if fd is None:
            raise Damaged(path, "is missing: the SavedModel is incomplete", fix)
        with os.fdopen(fd, "rb") as f:
            size = os.fstat(fd).st_size
            if expected is None:
                if size == 0:
                    raise Damaged(path, "is empty: the SavedModel is truncated", fix)
                return
            if size != expected["size"]:
                raise Damaged(
                    path,
                    f"has {size} bytes, {expected['size']} when registered: the SavedModel is damaged",
                    fix,
                )
            if hashlib.file_digest(f, "sha256").hexdigest() != expected["sha256"]:
                raise Damaged(
                    path, "differs from the file registered (sha256): the SavedModel is damaged", fix
                )
    finally:
        for sub in fds:
            os.close(sub)


# --- writing ----------------------------------------------------------------------------------


def _copy_tree(source: str, dst_fd: int, prefix: str, files: dict[str, dict[str, Any]]) -> None:
    for entry in sorted(os.scandir(source), key=lambda e: e.name):
        if entry.is_symlink():
            raise RegistryError(
                f"local registry: {entry.path} is a symbolic link: a SavedModel to register holds "
                "plain files and folders only"
            )
        if entry.is_dir(follow_symlinks=False):
            os.mkdir(entry.name, 0o777, dir_fd=dst_fd)
            sub = os.open(entry.name, _DIR, dir_fd=dst_fd)
            try:
                _copy_tree(entry.path, sub, f"{prefix}{entry.name}/", files)
            finally:
                os.close(sub)
        elif entry.is_file(follow_symlinks=False):
            digest, size = hashlib.sha256(), 0
            with (
                open(entry.path, "rb") as src,
                os.fdopen(os.open(entry.name, _CREATE, 0o666, dir_fd=dst_fd), "wb") as dst,
            ):
                for block in iter(lambda: src.read(1 << 20), b""):
                    dst.write(block)
                    digest.update(block)
                    size += len(block)
            files[prefix + entry.name] = {"size": size, "sha256": digest.hexdigest()}
        else:
            raise RegistryError(
                f"local registry: {entry.path} is not a plain file or folder: it cannot be registered"
            )


def _write_new(dir_fd: int, name: str, data: bytes) -> None:
    """A new file (`O_EXCL`: FileExistsError if anything, a link included, is there), removed
    again if it cannot be written whole."""
    fd = os.open(name, _CREATE, 0o666, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dir_fd)
        raise


def _fresh(template: str, create: Callable[[str], object]) -> str:
    """`template` with an unpredictable token, made by `create` (`O_EXCL`: another on a clash)."""
    while True:
        name = template.format(secrets.token_hex(8))
        with contextlib.suppress(FileExistsError):
            create(name)
            return name


def publish(
    model_fd: int, model_path: str, source: str, record: dict[str, Any], aliases: dict[str, str]
) -> tuple[str, str]:
    """Copies the SavedModel folder `source` as the next version, with `record` (and its files'
    sizes and sha256) as version.json, through a staging folder renamed into place once
    complete. Call it under the lock. Returns (version, its folder)."""
    # One more than every version folder and aliased version: never given twice, even when lost.
    numbers = [int(v) for v in [*os.listdir(model_fd), *aliases.values()] if VERSION.fullmatch(v)]
    version = str(max(numbers, default=0) + 1)
    # A staging folder still here was left by a registration killed mid-copy (the lock says none
    # runs). Real folders only; the fd-based rmtree follows no link inside.
    for name in os.listdir(model_fd):
        if re.fullmatch(r"\.staging-[0-9a-f]{16}", name) and stat.S_ISDIR(
            os.lstat(name, dir_fd=model_fd).st_mode
        ):
            shutil.rmtree(name, dir_fd=model_fd)
    try:
        staging = _fresh(".staging-{}", lambda name: os.mkdir(name, 0o777, dir_fd=model_fd))
    except PermissionError as err:
        raise _not_writable(model_path, err) from None
    try:
        sfd = os.open(staging, _DIR, dir_fd=model_fd)
        try:
            os.mkdir("model", 0o777, dir_fd=sfd)
            mfd = os.open("model", _DIR, dir_fd=sfd)
            files: dict[str, dict[str, Any]] = {}
            try:
                _copy_tree(source, mfd, "", files)
            finally:
                os.close(mfd)
            document = {**record, "version": version, "files": files}
            _write_new(sfd, "version.json", json.dumps(document, indent=1).encode())
        finally:
            os.close(sfd)
        try:
            os.rename(staging, version, src_dir_fd=model_fd, dst_dir_fd=model_fd)
        except OSError as err:
            where = os.path.join(model_path, version)
            raise RegistryError(
                f"local registry: cannot publish version {version}: {where} {_what(model_fd, version, err)}; "
                "only the registry creates version folders: move it aside and run again"
            ) from None
    except BaseException:
        with contextlib.suppress(OSError):
            shutil.rmtree(staging, dir_fd=model_fd)
        raise
    return version, os.path.join(model_path, version)


def write_aliases(model_fd: int, aliases: dict[str, str]) -> None:
    """aliases.json replaced atomically by a new file; the rename replaces the entry, never what
    a link there points to. Refuses what `load` would refuse (a 10-digit version after 999999999)."""
    if problem := _check_aliases(aliases):
        raise RegistryError(f"local registry: refusing to write aliases that {problem}")
    data = json.dumps(aliases, indent=1).encode()
    tmp = _fresh(".aliases.json.{}.tmp", lambda name: _write_new(model_fd, name, data))
    try:
        os.replace(tmp, "aliases.json", src_dir_fd=model_fd, dst_dir_fd=model_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=model_fd)
        raise
