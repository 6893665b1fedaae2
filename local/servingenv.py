"""Python environments with the TensorFlow of a serving image, for checks that must run under it.

Vertex AI's prebuilt TensorFlow prediction images stop at TensorFlow 2.15, older than the
trainer's (docs/facts.md, fact 22). `python_for("2.15")` returns the interpreter of a venv with that
TensorFlow (CPU build), made with uv on first use under `<checkout>/.cache/serving-tf-<version>/`:
built aside and renamed into place under a lock; a stamp of the pins makes later calls instant,
and a change of pins rebuilds it.

    python -m local.servingenv 2.15     # makes it if needed; prints the interpreter
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TextIO

from local import ROOT

CACHE_DIR = ROOT / ".cache"

# A serving image's TensorFlow -> what its environment installs: the minor's newest patch that
# installs on Python 3.11 from PyPI, and the numpy TensorFlow resolves to there (2.15 needs
# numpy < 2). CPU builds: the check runs anywhere, and the GPU variant runs the same graph.
PINS: dict[str, tuple[str, ...]] = {
    "2.15": ("tensorflow-cpu==2.15.1", "numpy==1.26.4"),
    "2.20": ("tensorflow-cpu==2.20.0", "numpy==2.4.6"),
}
# The Python of those wheels (TensorFlow 2.15 has none for 3.12 and later), the project's own.
PYTHON = "3.11"
STAMP = ".serving-env.json"


class ServingEnvError(RuntimeError):
    """uv is missing, or the install failed."""


def find_uv() -> Path:
    """uv as the Makefile finds it: on PATH, else ~/.local/bin/uv."""
    if on_path := shutil.which("uv"):
        return Path(on_path)
    user = Path.home() / ".local" / "bin" / "uv"
    if user.is_file() and os.access(user, os.X_OK):
        return user
    raise ServingEnvError(
        f"uv is needed to make the serving environments and was found neither on PATH nor at {user}: "
        "install it with `make setup` (or `python3 -m pip install --user uv`)"
    )


def _ready(folder: Path, stamp: str) -> bool:
    try:
        return (folder / STAMP).read_text() == stamp and (folder / "bin" / "python").exists()
    except OSError:
        return False


def _run(uv: Path, args: list[str], what: str) -> None:
    try:
        proc = subprocess.run([str(uv), *args], capture_output=True, text=True, check=False)
    except OSError as err:
        raise ServingEnvError(f"{what} failed: cannot run {uv}: {err}") from None
    if proc.returncode != 0:
        output = (proc.stderr.strip() or proc.stdout.strip())[-3000:]
        raise ServingEnvError(f"{what} failed (uv exit {proc.returncode}):\n{output}")


def python_for(tf_version: str, out: TextIO = sys.stdout, *, cache_dir: Path | None = None) -> Path:
    """The serving environment's interpreter for TensorFlow `tf_version` (a PINS key), made
    under `cache_dir` the first time."""
    if tf_version not in PINS:
        raise ValueError(
            f"no serving environment is defined for TensorFlow {tf_version!r}; known: {', '.join(sorted(PINS))} "
            "(add it to local.servingenv.PINS)"
        )
    pins = PINS[tf_version]
    cache = Path(cache_dir or CACHE_DIR)
    folder = cache / f"serving-tf-{tf_version}"
    python = folder / "bin" / "python"
    stamp = json.dumps({"python": PYTHON, "requirements": list(pins), "bytecode": True}, indent=1) + "\n"
    if _ready(folder, stamp):
        return python

    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f".serving-tf-{tf_version}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if _ready(folder, stamp):  # another process made it while this one waited
            return python
        uv = find_uv()
        for leftover in cache.glob(f".serving-tf-{tf_version}.tmp-*"):  # from a build that died
            shutil.rmtree(leftover, ignore_errors=True)
        print(
            f"making the TensorFlow {tf_version} serving environment in {folder} ({', '.join(pins)}); once",
            file=out,
            flush=True,
        )
        staging = Path(tempfile.mkdtemp(prefix=f".serving-tf-{tf_version}.tmp-", dir=cache))
        staging.chmod(0o755)  # mkdtemp's 0700 would stay on the final folder
        # This interpreter when it is PYTHON, else uv's pick.
        base = sys.executable if f"{sys.version_info.major}.{sys.version_info.minor}" == PYTHON else PYTHON
        try:
            # --relocatable: the environment works after the rename below.
            _run(
                uv,
                ["venv", "--quiet", "--relocatable", "--python", base, str(staging)],
                f"creating a Python {PYTHON} environment with {uv}",
            )
            # Compiled once here: where PYTHONDONTWRITEBYTECODE=1 each check would compile
            # TensorFlow again (the Makefile says what that costs).
            if pins:
                flags = ["--quiet", "--compile-bytecode", "--python", str(staging / "bin" / "python")]
                _run(uv, ["pip", "install", *flags, *pins], f"installing {' '.join(pins)} with {uv}")
            (staging / STAMP).write_text(stamp)
            old = cache / f".serving-tf-{tf_version}.tmp-old-{os.getpid()}"
            if folder.exists():  # made with other pins: replaced
                folder.rename(old)
            staging.rename(folder)
            shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return python


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print(f"usage: python -m local.servingenv TF_VERSION   (one of: {', '.join(sorted(PINS))})")
        return 2
    try:
        print(python_for(args[0], out=sys.stderr))
    except (ValueError, ServingEnvError) as err:
        print(err, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
