"""Starting trainer processes the way Vertex AI starts replicas: one per task, with TF_CONFIG."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def vertex_cluster(num_workers: int) -> dict[str, list[str]]:
    """Vertex's layout: pool 0 is one `chief`, pool 1 the `worker`s."""
    return {
        "chief": [f"127.0.0.1:{free_port()}"],
        "worker": [f"127.0.0.1:{free_port()}" for _ in range(num_workers)],
    }


def trainer_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIP_", "TF_CONFIG", "CLOUD_ML"))}
    env["PYTHONPATH"] = str(ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def start(
    module: str,
    args: Sequence[str],
    *,
    log: Path,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", module, *args],
            cwd=ROOT,
            env=trainer_env(env),
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def wait_all(procs: Mapping[str, subprocess.Popen[bytes]], timeout: float, logs: Path) -> None:
    """Waits for every process; on a failure or timeout kills the rest and shows the logs."""
    try:
        for name, proc in procs.items():
            rc = proc.wait(timeout=timeout)
            if rc != 0:
                raise AssertionError(f"{name} exited with {rc}:\n{tail(logs / f'{name}.log')}")
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def tail(path: Path, lines: int = 40) -> str:
    text = path.read_text(errors="replace").splitlines()
    return "\n".join(line for line in text if not line.startswith(("I0000", "W0000", "WARNING: All log")))[
        -6000:
    ]
