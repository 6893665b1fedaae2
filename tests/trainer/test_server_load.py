"""`trainer.server` under concurrent load and its accelerator contract, in-process with a
stand-in model (no TensorFlow): one write per response with Nagle's algorithm off, a burst of
new connections, the request budget (in order, bounded, never in the way of health checks), bodies that stop midway, the
drain on SIGTERM, and SERVING_ACCELERATOR.

Nothing here measures speed (`make bench BENCH=serve` does): the tests wait on events, with
generous timeouts, for things that must happen or must not have happened yet.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from trainer import server

ROUTES = server.Routes(health="/h", predict="/p")
BODY = json.dumps({"instances": [{"b64": "eA=="}]}).encode()  # one instance, b"x"
WAIT = 30.0


def answers(blobs: list[bytes]) -> list[dict[str, Any]]:
    return [{"probabilities": [1.0], "class_index": 0, "class_name": blob.decode()} for blob in blobs]


class Gate:
    """A stand-in model that holds every call until released, counting the calls under way."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.calls = 0
        self.entered = threading.Semaphore(0)

    def __call__(self, blobs: list[bytes]) -> list[dict[str, Any]]:
        with self.lock:
            self.running += 1
            self.calls += 1
            self.most = max(self.most, self.running)
        self.entered.release()
        try:
            assert self.release.wait(WAIT), "the test never released the model"
            return answers(blobs)
        finally:
            with self.lock:
                self.running -= 1

    def wait_entered(self, count: int = 1) -> None:
        for _ in range(count):
            assert self.entered.acquire(timeout=WAIT), "no call reached the model"


@pytest.fixture
def start() -> Iterator[Callable[..., server.PredictionServer]]:
    servers: list[server.PredictionServer] = []

    def make(predictor: server.Predictor | None = answers, **kwargs: Any) -> server.PredictionServer:
        srv = server.PredictionServer(("127.0.0.1", 0), ROUTES, **kwargs)
        srv.predictor = predictor
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def post(port: int, body: bytes = BODY) -> tuple[int, dict[str, Any], str | None]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
    try:
        conn.request("POST", "/p", body=body)
        response = conn.getresponse()
        return response.status, json.loads(response.read()), response.getheader("Connection")
    finally:
        conn.close()


def get_health(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
    try:
        conn.request("GET", "/h")
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


class Background:
    """`post` in a thread; `result()` waits for it."""

    def __init__(self, port: int, body: bytes = BODY) -> None:
        self.value: tuple[int, dict[str, Any], str | None] | None = None
        self.thread = threading.Thread(target=self._run, args=(port, body), daemon=True)
        self.thread.start()

    def _run(self, port: int, body: bytes) -> None:
        self.value = post(port, body)

    def result(self) -> tuple[int, dict[str, Any], str | None]:
        self.thread.join(WAIT)
        assert self.value is not None, "the request never got an answer"
        return self.value


# --- one write per response, Nagle's algorithm off ----------------------------------------------


def test_each_kept_alive_response_leaves_in_one_write_with_nagle_off(
    start: Callable[..., server.PredictionServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With Nagle's algorithm on and a response written in two pieces (headers, then body), the
    second piece of every kept-alive response waited for the client's delayed ACK (~40 ms)."""
    writes: list[int] = []
    nodelay: list[int] = []
    real_write, real_setup = socket.SocketIO.write, server.Handler.setup

    def counting_write(self: socket.SocketIO, data: Any) -> int | None:
        writes.append(len(data))
        return real_write(self, data)

    def recording_setup(self: server.Handler) -> None:
        real_setup(self)
        nodelay.append(self.connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    monkeypatch.setattr(socket.SocketIO, "write", counting_write)
    monkeypatch.setattr(server.Handler, "setup", recording_setup)
    port = start().server_address[1]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
    try:
        for i in range(5):
            conn.request("POST" if i % 2 else "GET", "/p" if i % 2 else "/h", body=BODY if i % 2 else None)
            response = conn.getresponse()
            assert response.status == 200 and response.read()
    finally:
        conn.close()
    assert nodelay == [1]  # one connection, kept alive, with TCP_NODELAY
    assert len(writes) == 5, writes  # one write (headers and body) per response


def test_a_burst_of_new_connections_is_answered_not_reset(
    start: Callable[..., server.PredictionServer],
) -> None:
    """socketserver's listen backlog of 5 reset most of 200 connections opened at once."""
    port = start().server_address[1]
    ready = threading.Barrier(100)
    failures: list[str] = []
    statuses: list[int] = []

    def client() -> None:
        ready.wait(WAIT)
        try:
            statuses.append(post(port)[0])
        except OSError as err:
            failures.append(repr(err))

    threads = [threading.Thread(target=client, daemon=True) for _ in range(100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert failures == [] and statuses == [200] * 100, (len(failures), failures[:3])


# --- the request budget -----------------------------------------------------------------------------


def test_the_budget_grants_in_order_and_never_beyond_its_limit() -> None:
    budget = server.Budget(10)
    order: list[str] = []
    inside = threading.Semaphore(0)
    hold = {name: threading.Event() for name in ("a", "big", "small")}

    def claim(name: str, units: int) -> None:
        with budget.claim(units):
            order.append(name)
            assert budget.used <= budget.limit
            inside.release()
            assert hold[name].wait(WAIT)

    threads = {"a": threading.Thread(target=claim, args=("a", 6), daemon=True)}
    threads["a"].start()
    assert inside.acquire(timeout=WAIT)
    # `big` (over the limit: it takes it all) queues before `small`, which would fit now.
    threads["big"] = threading.Thread(target=claim, args=("big", 50), daemon=True)
    threads["big"].start()
    for _ in range(1000):  # until big is in line
        if budget._queue:
            break
        threading.Event().wait(0.01)
    threads["small"] = threading.Thread(target=claim, args=("small", 1), daemon=True)
    threads["small"].start()
    assert not inside.acquire(timeout=0.3), "a later claim went ahead of one in line"
    hold["a"].set()
    assert inside.acquire(timeout=WAIT)
    assert order == ["a", "big"] and budget.used == 10
    hold["big"].set()
    assert inside.acquire(timeout=WAIT)
    hold["small"].set()
    for t in threads.values():
        t.join(WAIT)
    assert order == ["a", "big", "small"] and budget.used == 0
    with pytest.raises(ValueError, match="at least 1"):
        server.Budget(0)


@pytest.mark.parametrize(("inflight_bytes", "parallel"), [(1, 1), (len(BODY) * 3, 3)])
def test_requests_beyond_the_budget_wait_while_health_checks_do_not(
    start: Callable[..., server.PredictionServer], inflight_bytes: int, parallel: int
) -> None:
    gate = Gate()
    srv = start(gate, inflight_bytes=inflight_bytes)
    port = srv.server_address[1]
    requests = [Background(port) for _ in range(parallel + 1)]
    gate.wait_entered(parallel)
    # One more request than the budget holds: it waits, unread; health checks are answered.
    assert get_health(port) == 200
    assert not gate.entered.acquire(timeout=0.3), "a request went beyond the budget"
    assert gate.most == parallel and srv.budget.used == parallel * min(len(BODY), inflight_bytes)
    gate.release.set()
    for request in requests:
        status, payload, _ = request.result()
        assert status == 200 and payload["predictions"][0]["class_name"] == "x"
    assert gate.most == parallel and gate.calls == parallel + 1 and srv.budget.used == 0


def test_default_budget_follows_the_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "usable_cpus", lambda: 8)
    assert server.default_inflight_bytes() == 8 * server.MB * server.INFLIGHT_MB_PER_CPU


# --- bodies that do not arrive ------------------------------------------------------------------


def raw_request(port: int, head: bytes, body_part: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
    sock.sendall(head + body_part)
    return sock


def head(length: int) -> bytes:
    return f"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n".encode()


def test_a_body_cut_short_is_not_predicted_and_a_slow_one_is_answered_408(
    start: Callable[..., server.PredictionServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[bytes]] = []

    def predictor(blobs: list[bytes]) -> list[dict[str, Any]]:
        calls.append(blobs)
        return answers(blobs)

    srv = start(predictor)
    port = srv.server_address[1]
    # The client goes away after 10 of 100 bytes: nothing to answer, nothing predicted.
    sock = raw_request(port, head(100), BODY[:10])
    sock.shutdown(socket.SHUT_WR)
    assert sock.recv(100) == b""
    sock.close()
    assert calls == [] and srv.budget.used == 0
    # A client that stops sending: 408 once the connection's timeout passes, and it is closed.
    monkeypatch.setattr(server.Handler, "timeout", 0.5)
    sock = raw_request(port, head(100), BODY[:10])
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    sock.close()
    status_line, _, rest = data.partition(b"\r\n")
    assert status_line == b"HTTP/1.1 408 Request Timeout", data
    assert b"Connection: close" in rest
    assert json.loads(rest.split(b"\r\n\r\n", 1)[1]) == {
        "error": "the request body did not arrive within 0.5 s"
    }
    assert calls == [] and srv.budget.used == 0
    monkeypatch.undo()
    assert post(port)[0] == 200 and len(calls) == 1


# --- SIGTERM: drain --------------------------------------------------------------------------------


def test_drain_finishes_the_predictions_under_way_then_returns(
    start: Callable[..., server.PredictionServer],
) -> None:
    gate = Gate()
    srv = start(gate)
    request = Background(srv.server_address[1])
    gate.wait_entered()
    left: list[int] = []
    drainer = threading.Thread(target=lambda: left.append(srv.drain(timeout=WAIT)), daemon=True)
    drainer.start()
    drainer.join(0.3)
    assert drainer.is_alive(), "drain returned while a prediction was under way"
    gate.release.set()
    status, payload, connection = request.result()
    assert status == 200 and payload["predictions"][0]["class_name"] == "x"
    assert connection == "close"  # kept-alive connections are not reused while draining
    drainer.join(WAIT)
    assert left == [0]


def test_drain_gives_up_after_its_timeout(start: Callable[..., server.PredictionServer]) -> None:
    gate = Gate()
    srv = start(gate)
    request = Background(srv.server_address[1])
    gate.wait_entered()
    assert srv.drain(timeout=0.2) == 1
    gate.release.set()
    assert request.result()[0] == 200


# --- SERVING_ACCELERATOR -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "cpu"),
        ({"SERVING_ACCELERATOR": ""}, "cpu"),
        ({"SERVING_ACCELERATOR": "cpu"}, "cpu"),
        ({"SERVING_ACCELERATOR": "gpu"}, "gpu"),
    ],
)
def test_the_accelerator_comes_from_the_models_container_variable(env: dict[str, str], expected: str) -> None:
    assert server.accelerator_from_env(env) == expected


@pytest.mark.parametrize("value", ["tpu", "GPU", " gpu", "cuda"])
def test_other_accelerators_are_refused_naming_the_allowed_ones(value: str) -> None:
    with pytest.raises(server.AcceleratorError) as info:
        server.accelerator_from_env({"SERVING_ACCELERATOR": value})
    assert (
        str(info.value)
        == f"SERVING_ACCELERATOR={value!r} is not allowed: it must be cpu or gpu (absent: cpu)"
    )


CPU = "/physical_device:CPU:0"
GPU = "/physical_device:GPU:0"


def test_a_gpu_deployment_without_a_visible_gpu_is_refused() -> None:
    with pytest.raises(server.AcceleratorError) as info:
        server.check_devices("gpu", [CPU])
    message = str(info.value)
    assert message.startswith(f"SERVING_ACCELERATOR=gpu but TensorFlow sees no GPU (it sees: {CPU})")
    assert "refusing to serve a GPU deployment on the CPU" in message
    assert server.check_devices("gpu", [CPU, GPU]) is None
    assert server.check_devices("cpu", [CPU]) is None
    warning = server.check_devices("cpu", [CPU, GPU])
    assert warning is not None and "the model will run on the GPU" in warning


def test_main_refuses_an_unknown_accelerator_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_server(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the server must not start")

    monkeypatch.setattr(server, "PredictionServer", no_server)
    monkeypatch.setenv("SERVING_ACCELERATOR", "tpu")
    monkeypatch.setenv("AIP_STORAGE_URI", "/nowhere")
    assert server.main(["--host", "127.0.0.1"]) == 2
    assert "SERVING_ACCELERATOR='tpu' is not allowed: it must be cpu or gpu (absent: cpu)" in caplog.text
    monkeypatch.delenv("SERVING_ACCELERATOR")
    assert server.main(["--host", "127.0.0.1", "--inflight_mb", "0"]) == 2
    assert "--inflight_mb must be a positive number of megabytes, got 0.0" in caplog.text


def test_gpus_handed_over_but_unseen_are_refused_whatever_is_configured(tmp_path: Path) -> None:
    """The pipeline sets no SERVING_ACCELERATOR: a GPU deployment is recognised by the GPU device
    nodes the container was handed, and refused when TensorFlow cannot use them."""
    for name in ("nvidia1", "nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-modeset", "null"):
        (tmp_path / name).touch()
    attached = server.attached_gpus(str(tmp_path))
    assert attached == ["nvidia0", "nvidia1"]
    for accelerator in ("cpu", "gpu"):
        with pytest.raises(server.AcceleratorError) as info:
            server.check_devices(accelerator, [CPU], attached)
        assert str(info.value).startswith(
            "this container was handed 2 NVIDIA GPU(s) (/dev/nvidia0, /dev/nvidia1) but TensorFlow sees none"
        )
    assert server.check_devices("cpu", [CPU, GPU], attached) is not None  # seen: served on it
    assert server.check_devices("gpu", [CPU, GPU], attached) is None
    assert server.attached_gpus(str(tmp_path / "absent")) == []
