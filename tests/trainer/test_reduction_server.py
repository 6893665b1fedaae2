"""A Vertex job with a Reduction Server pool, as the trainer sees it: TF_CONFIG lists pool 2 too.

Vertex's "Distributed training" page (https://cloud.google.com/vertex-ai/docs/training/distributed-training)
puts Reduction Server in worker pool 2 ("Parameter servers, Reduction Server"), and its TF_CONFIG
example lists pool 2's replicas under `ps`. The reducers run Google's image, not TensorFlow, so
nothing answers TensorFlow at that address. Here a chief and a worker on loopback ports get such a
TF_CONFIG (and CLUSTER_SPEC), pool 2 played by a stand-in at its address:

- real `python -m trainer.task` replicas, with a TCP listener at pool 2's address that accepts
  every connection and holds it, saying nothing (a port open, no TensorFlow server behind it):
  the two-replica training of tests/trainer/test_multiworker.py runs so, with this module's
  `vertex_env` and `HoldingListener`;
- here, the trainer's strategy alone (and one all-reduce), with nothing listening at pool 2's
  address.

Measured with TensorFlow 2.21 (docs/architecture.md#reduction-server): built over the whole
TF_CONFIG, the strategy makes `ps` task 0 its coordination service's leader, and both replicas block in the
strategy's constructor (enabling collective ops), with no error: still waiting after 15 minutes
with nothing listening, and after 90 s with the listener (which they kept reconnecting to). Both
tests fail so, by their timeout, on that code. The trainer now builds its strategy over the
chief and the workers only (trainer/distribute.py), and trains.

What this cannot show: that Google's reducers then carry the all-reduce. That needs GPUs, NCCL,
Google's plugin and Vertex (docs/architecture.md#what-is-verified-here-and-what-only-on-vertex).
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.processes import ROOT, free_port, tail, trainer_env, wait_all

pytestmark = pytest.mark.serial

# Long enough for two replicas of a one-epoch run on a loaded 2-core machine (about 25 s alone);
# far shorter than the wait without the fix, which does not end.
TIMEOUT_S = 150


class HoldingListener:
    """Pool 2's stand-in: accepts connections and holds them open, reading and saying nothing."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = int(self.sock.getsockname()[1])
        self.accepted: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            self.accepted.append(conn)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() on Linux
        self.sock.close()
        self._thread.join(timeout=5)
        for conn in self.accepted:
            conn.close()


def vertex_env(cluster: dict[str, list[str]], kind: str, index: int) -> dict[str, str]:
    """TF_CONFIG and CLUSTER_SPEC in the shapes of Vertex's examples (the page above)."""
    tf_config = {
        "cluster": cluster,
        "environment": "cloud",
        "task": {"type": kind, "index": index},
        "job": {"worker_pool_specs": []},
    }
    pools = {"chief": "workerpool0", "worker": "workerpool1", "ps": "workerpool2"}
    cluster_spec = {
        "cluster": {pools[t]: addresses for t, addresses in cluster.items()},
        "environment": "cloud",
        "task": {"type": pools[kind], "index": index},
        "job": {"worker_pool_specs": []},
    }
    return {"TF_CONFIG": json.dumps(tf_config), "CLUSTER_SPEC": json.dumps(cluster_spec)}


def vertex_cluster_with_pool_2(pool_2_address: str) -> dict[str, list[str]]:
    return {
        "chief": [f"127.0.0.1:{free_port()}"],
        "worker": [f"127.0.0.1:{free_port()}"],
        "ps": [pool_2_address],  # worker pool 2: the Reduction Server replica
    }


def wait_or_show(procs: dict[str, subprocess.Popen[bytes]], logs: Path) -> None:
    try:
        # Killed (SIGKILL) on timeout: TensorFlow's coordination service catches SIGTERM.
        wait_all(procs, timeout=TIMEOUT_S, logs=logs)
    except subprocess.TimeoutExpired:
        shown = "\n".join(f"--- {name}:\n{tail(logs / f'{name}.log')}" for name in procs)
        pytest.fail(f"the replicas did not finish in {TIMEOUT_S} s (waiting for pool 2?):\n{shown}")


# The strategy alone, as the trainer builds it, then one all-reduce across the two processes.
STRATEGY_ONLY = """
import json, os
from trainer._tf import tf
from trainer.distribute import cluster_from_tf_config, create_strategy

strategy = create_strategy(cluster_from_tf_config(os.environ["TF_CONFIG"]))
total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
print("RESULT", json.dumps({"replicas": strategy.num_replicas_in_sync, "sum": float(total)}))
"""


def test_the_strategy_forms_when_nothing_listens_at_pool_2(tmp_path: Path) -> None:
    """Pool 2's other stand-in, lighter: an address nothing listens on, the strategy alone."""
    cluster = vertex_cluster_with_pool_2(f"127.0.0.1:{free_port()}")  # bound once, then freed
    logs = tmp_path / "replicas"
    logs.mkdir()
    procs = {}
    for kind, index in (("chief", 0), ("worker", 0)):
        with open(logs / f"{kind}-{index}.log", "wb") as out:
            procs[f"{kind}-{index}"] = subprocess.Popen(
                [sys.executable, "-c", STRATEGY_ONLY],
                cwd=ROOT,
                env=trainer_env(vertex_env(cluster, kind, index)),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
    wait_or_show(procs, logs)
    for name in procs:
        line = next(x for x in (logs / f"{name}.log").read_text().splitlines() if x.startswith("RESULT "))
        assert json.loads(line.removeprefix("RESULT ")) == {"replicas": 2, "sum": 2.0}, name
