"""The serve benchmark's plumbing, without TensorFlow: its statistics, its load driver, its
result, and its server side end to end against a process running `trainer.server`'s HTTP side
with a stand-in model (the real one is only started by `make bench BENCH=serve`)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks import registry, serve, table
from benchmarks.common import validate_result
from trainer import server

MACHINE = {"cpu_count": 2, "cpu_model": "Test CPU", "python": "3.11", "tensorflow": "2.21.0", "gpu": None}

# trainer.server's HTTP side with a stand-in model, as Vertex starts the real one (AIP_*), until SIGTERM.
FAKE_SERVER = """
import os, signal, threading
from trainer import server
srv = server.PredictionServer(
    ("127.0.0.1", int(os.environ["AIP_HTTP_PORT"])),
    server.routes_from_env(os.environ),
)
srv.predictor = lambda blobs: [
    {"probabilities": [1.0], "class_index": 0, "class_name": str(len(b))} for b in blobs
]
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
threading.Thread(target=srv.serve_forever, daemon=True).start()
stop.wait()
srv.drain()
"""


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert serve.percentile(values, 50) == 50.0
    assert serve.percentile(values, 99) == 99.0
    assert serve.percentile(values, 100) == 100.0
    assert serve.percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert serve.percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError, match="no values"):
        serve.percentile([], 50)


def test_drive_counts_every_clients_answers_after_its_warm_up() -> None:
    calls = [0, 0, 0]

    def make_call(i: int) -> Callable[[], int]:
        def call() -> int:
            calls[i] += 1
            return 2

        return call

    clock = iter([10.0, 10.5])  # CPU seconds before and after the timed calls
    result = serve.drive(make_call, clients=3, seconds=0.2, warmup=4, cpu_clocks={"x": lambda: next(clock)})
    assert result["requests"] == sum(calls) - 3 * 4  # the warm-up calls are not counted
    assert result["x_cpu_ms_per_request"] == round(500 / result["requests"], 3)
    assert result["images"] == 2 * result["requests"]
    assert all(c > 4 for c in calls)
    assert result["requests_per_second"] > 0 and result["p50_ms"] <= result["p99_ms"] <= result["max_ms"]


def test_a_failing_client_fails_the_measurement_with_its_error() -> None:
    def make_call(i: int) -> Callable[[], int]:
        def call() -> int:
            if i == 1:
                raise RuntimeError("HTTP 500: boom")
            return 1

        return call

    with pytest.raises(RuntimeError, match="a client failed: RuntimeError\\('HTTP 500: boom'\\)"):
        serve.drive(make_call, clients=2, seconds=5, warmup=0)
    with pytest.raises(RuntimeError, match="HTTP 500: boom"):
        serve.drive(make_call, clients=2, seconds=5, warmup=2)  # failing in its warm-up


@pytest.fixture
def fake_server() -> Iterator[int]:
    srv = server.PredictionServer(("127.0.0.1", 0), server.Routes(serve.HEALTH_ROUTE, serve.PREDICT_ROUTE))
    srv.predictor = lambda blobs: [
        {"probabilities": [1.0], "class_index": 0, "class_name": b.decode()} for b in blobs
    ]
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def test_clients_post_the_prebuilt_containers_body_and_check_the_answer(fake_server: int) -> None:
    body = serve.request_body([b"a", b"b", b"c"])
    assert serve.post_call(fake_server, body, 3)() == 3
    with pytest.raises(RuntimeError, match="3 predictions for 2 images"):
        serve.post_call(fake_server, body, 2)()
    with pytest.raises(RuntimeError, match="HTTP 404"):
        serve.post_call(fake_server, body, 3, route="/elsewhere")()
    result = serve.drive(lambda _i: serve.post_call(fake_server, body, 3), clients=2, seconds=0.2)
    assert result["images"] == 3 * result["requests"] > 0


def figures(rps: float, p50: float, cpu: float | None = None, name: str = "server") -> dict[str, Any]:
    return {
        **({f"{name}_cpu_ms_per_request": cpu} if cpu is not None else {}),
        "requests": 10,
        "images": 10,
        "seconds": 1.0,
        "requests_per_second": rps,
        "images_per_second": rps,
        "p50_ms": p50,
        "p99_ms": 2 * p50,
        "max_ms": 3 * p50,
    }


def test_each_side_counts_its_best_run_per_batch_size() -> None:
    best_1, best_32 = figures(350.0, 6.0, cpu=3.0), figures(25.0, 140.0, cpu=60.0)
    first: dict[str, Any] = {
        "batches": {"1": figures(300.0, 7.0, cpu=2.5), "32": best_32},
        "other_cpu_share": 0.1,
    }
    second: dict[str, Any] = {
        "batches": {"1": best_1, "32": figures(21.0, 150.0, cpu=70.0)},
        "burst": {"1": figures(1.0, 1.0), "32": figures(1.0, 1.0)},
        "peak_rss_mib": 690.0,
        "other_cpu_share": 0.0,
    }
    side = serve.combine([first, second])
    assert side["batches"] == {"1": best_1, "32": best_32}
    assert side["burst"] == second["burst"] and side["peak_rss_mib"] == 690.0
    assert side["runs"] == [first, second]
    # The least CPU per request of each process, whichever run it came from.
    assert side["cpu_ms_per_request"] == {"1": {"server": 2.5}, "32": {"server": 60.0}}


def test_the_result_takes_the_lower_ratio_and_says_both(tmp_path: Path) -> None:
    in_process = serve.combine(
        [
            {
                "batches": {
                    "1": figures(400.0, 5.0, cpu=4.0, name="process"),
                    "32": figures(20.0, 150.0, cpu=100.0, name="process"),
                },
                "other_cpu_share": 0.0,
            }
        ]
    )
    server_side = serve.combine(
        [
            {
                "batches": {"1": figures(300.0, 7.0, cpu=5.0), "32": figures(21.0, 140.0, cpu=110.0)},
                "burst": {"1": figures(350.0, 60.0), "32": figures(19.0, 1500.0)},
                "peak_rss_mib": 690.0,
                "health_ms": {"checks": 40, "p50": 0.5, "max": 12.0},
                "other_cpu_share": 0.01,
            }
        ]
    )
    result = serve.build_result(
        in_process, server_side, inputs=serve.inputs(), wall_seconds=80.0, machine=MACHINE
    )
    assert validate_result(result) == []
    assert result["ratio"] == 0.75
    assert result["figures"]["ratio_by_images_per_request"] == {"1": 0.75, "32": 1.05}
    assert result["goal_met"] is None and "notes" not in result
    summary = result["summary"]
    assert "1 img/request: server 300.0 req/s (p50 7.0 ms, p99 14.0 ms) vs in-process 400.0 req/s" in summary
    assert "32 img/request: server 21.0 req/s" in summary and "1.05x" in summary
    assert result["figures"]["cpu_ratio_by_images_per_request"] == {"1": 1.25, "32": 1.1}
    assert "server CPU per request vs in-process: 1.25x at 1 img, 1.10x at 32 img" in summary
    assert (
        "server with 32 clients: 1 img 350.0 req/s (p99 120 ms), 32 img 19.0 req/s (p99 3,000 ms)" in summary
    )
    assert "peak RSS 690.0 MiB, health checks answered in at most 12 ms" in summary
    server_side["runs"][0]["other_cpu_share"] = 0.4
    busy = serve.build_result(in_process, server_side, inputs={}, wall_seconds=1.0, machine=MACHINE)
    assert "up to 40% of the CPUs" in busy["notes"]


def test_it_is_registered_and_has_a_row() -> None:
    assert registry.BENCHMARKS["serve"] == "benchmarks.serve" and registry.module("serve") is serve
    rendered = table.render_table({}, registry.TITLES)
    row = next(line for line in rendered.splitlines() if "`serve`" in line)
    assert "no result yet: run `make bench BENCH=serve`" in row


def test_the_server_side_end_to_end_with_a_stand_in_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Started as Vertex starts it, healthy, driven at each batch size and by the burst of
    clients, watched (threads, health checks under load), stopped with SIGTERM (exit 0)."""
    monkeypatch.setattr(serve, "WINDOW_SECONDS", 0.3)
    monkeypatch.setattr(serve, "BURST_CLIENTS", 6)
    images = [bytes([i]) * (i + 1) for i in range(serve.NUM_IMAGES)]
    result = serve.measure_server(
        tmp_path / "model",
        images,
        log=tmp_path / "server.log",
        command=[sys.executable, "-c", FAKE_SERVER],
    )
    assert result["exit_code"] == 0 and result["ready_seconds"] > 0
    for key in ("batches", "burst"):
        assert sorted(result[key], key=int) == [str(b) for b in serve.BATCHES]
        for batch in serve.BATCHES:
            figures = result[key][str(batch)]
            assert figures["images"] == batch * figures["requests"] > 0
            assert figures["body_bytes"] == len(serve.request_body(images[:batch]))
            assert figures["server_cpu_ms_per_request"] >= 0 and figures["clients_cpu_ms_per_request"] > 0
    assert result["max_threads"] >= 1 and result["peak_rss_mib"] > 0
    assert result["health_ms"]["checks"] >= 1
    assert 0 <= result["other_cpu_share"] <= 1
    without = serve.measure_server(
        tmp_path / "model",
        images,
        log=tmp_path / "server.log",
        command=[sys.executable, "-c", FAKE_SERVER],
        burst=False,
    )
    assert "burst" not in without and sorted(without["batches"], key=int) == [str(b) for b in serve.BATCHES]


def test_a_server_that_exits_at_start_is_reported_with_its_output(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"exited with 3 before it was ready(.|\n)*no GPU here"):
        serve.measure_server(
            tmp_path / "model",
            [b"x"] * serve.NUM_IMAGES,
            log=tmp_path / "server.log",
            command=[sys.executable, "-c", "import sys; print('no GPU here'); sys.exit(3)"],
        )
