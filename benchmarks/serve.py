"""`serve`: the serving image's server (`python -m trainer.server`) against the SavedModel called
in-process, requests per second and latency on the same images.

- The model: what `make run` trains locally, as the chief exports it (`trainer.export.save`):
  the `tiny` backbone at the local image size (64 px, a 64-unit head, 5 classes), untrained
  (serving cost does not depend on the weights' values). Exported in its own process.
- The images: 32 of the project's synthetic leaves (`trainer.synthetic`), 224x224 JPEGs
  (`tf.io.encode_jpeg`, quality 95, about 22 KB each); a request of 32 images is about 0.94 MB of
  JSON, under the 1.5 MB a shared public Vertex endpoint accepts.
- In-process: a process loads the SavedModel with `trainer.serve.load` and calls
  `trainer.serve.answer` (what the server calls) from CLIENTS threads at once, each on the
  request's images: the ceiling a server on this TensorFlow could reach.
- Server: `python -m trainer.server` started as Vertex starts it (AIP_HTTP_PORT,
  AIP_STORAGE_URI, AIP_*_ROUTE), on 127.0.0.1, ready when its health route answers 200; CLIENTS
  threads of this process each keep one HTTP/1.1 connection open and POST the request's
  instances as `{"instances": [{"image_bytes": {"b64": ...}}, ...]}` bodies made beforehand.
  The clients share the machine's cores with the server, as they share nothing in-process.

Each side, for 1 and for 32 images per request: a few requests per client to warm up, then
WINDOW_SECONDS of requests back to back; requests/s (completed requests over the time from the
start to the last answer), images/s, p50/p99 latency (one request, sent to answered), and the
CPU time per request of the process answering (the server; the in-process one) and of the
clients: unlike requests/s, hardly moved by what other processes take of the machine. Each
side runs REPETITIONS times, alternately (in-process, server, in-process, ...), each run in
fresh processes; per batch size the run with the most requests/s counts (`figures.*.runs` has
them all, each with `other_cpu_share`, what other processes took of the CPUs meanwhile). Ratio:
server / in-process requests/s, the lower of the two batch sizes (the table's figure); both are
in `figures`, with server / in-process CPU per request (each side's least over its runs). In the last run, the server alone then takes BURST_CLIENTS clients
(`figures.server.burst`): what its admission budget does to throughput, tails and memory when
many requests arrive at once. Meanwhile a probe GETs the health route every 0.25 s on its own
connection (`health_ms`: how long a health check took while the server was busy). Also
recorded: the server's start (process start to healthy), its threads under load and its peak
RSS, each side's peak RSS. No goal: the machines here are noisy, the ratio is what carries over.
About 2 minutes on 2 cores.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import (
    ROOT,
    _cpu_busy_seconds,
    _other_share,
    busy_note,
    child_env,
    make_result,
    run_child,
    say,
    tail,
)

NAME = "serve"
IMAGE_SIZE = 64
"""The model's input: the local default image size (`make run`)."""
DENSE_UNITS = 64
SOURCE_SIZE = 224
"""The side of the JPEGs the clients send."""
NUM_IMAGES = 32
BATCHES = (1, 32)
"""Images per request."""
CLIENTS = 4
"""Concurrent clients, each with one request in flight at a time."""
BURST_CLIENTS = 32
WINDOW_SECONDS = 4.0
REPETITIONS = 3
"""In-process then server, alternately; the best of each side's runs is compared."""
WARMUP_REQUESTS = 3
"""Per client, before the window."""
HEALTH_ROUTE = "/v1/endpoints/bench/deployedModels/serve/health"
PREDICT_ROUTE = "/v1/endpoints/bench/deployedModels/serve:predict"
READY_TIMEOUT = 180.0
GOAL = {"description": "none set; reported for tracking (noisy machines: the ratio is what carries over)"}


def run(work: Path, results_dir: Path) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    logs = work / "logs"
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-serve-", dir=work) as tmp:
        model_dir, images_dir = Path(tmp) / "model", Path(tmp) / "images"
        say(f"serve: exporting the tiny model at {IMAGE_SIZE} px and {NUM_IMAGES} {SOURCE_SIZE}px JPEGs")
        run_child(
            "benchmarks.serve:export",
            {"model_dir": str(model_dir), "images_dir": str(images_dir)},
            log=logs / "serve-export.log",
        )
        images = read_images(images_dir)
        in_runs: list[dict[str, Any]] = []
        server_runs: list[dict[str, Any]] = []
        for repetition in range(1, REPETITIONS + 1):
            say(
                f"serve: run {repetition}/{REPETITIONS}, in-process: {CLIENTS} threads calling trainer.serve.answer"
            )
            child = run_child(
                "benchmarks.serve:measure_in_process",
                {"model_dir": str(model_dir), "images_dir": str(images_dir)},
                log=logs / f"serve-in-process-{repetition}.log",
            )
            in_runs.append(child.merged())
            for batch in BATCHES:
                say(
                    f"serve: in-process, {batch} image(s)/request: {describe(in_runs[-1]['batches'][str(batch)])}"
                )
            say(f"serve: run {repetition}/{REPETITIONS}, server: python -m trainer.server and HTTP clients")
            server_runs.append(
                measure_server(
                    model_dir,
                    images,
                    log=logs / f"serve-server-{repetition}.log",
                    burst=repetition == REPETITIONS,
                )
            )
    return build_result(
        combine(in_runs),
        combine(server_runs),
        inputs=inputs(),
        wall_seconds=time.perf_counter() - started,
    )


def combine(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One side's runs: per batch size the run with the most requests/s (the least disturbed
    by a noisy machine) and the least CPU per request of each process measured, the burst of the
    run that had one, and every run."""
    batches = {
        str(batch): max((r["batches"][str(batch)] for r in runs), key=lambda f: f["requests_per_second"])
        for batch in BATCHES
    }
    cpu: dict[str, dict[str, float]] = {}
    for batch in BATCHES:
        for run in runs:
            for key, value in run["batches"][str(batch)].items():
                if key.endswith("_cpu_ms_per_request"):
                    name = key.removesuffix("_cpu_ms_per_request")
                    mine = cpu.setdefault(str(batch), {})
                    mine[name] = min(mine.get(name, value), value)
    out: dict[str, Any] = {"batches": batches, "runs": list(runs), "cpu_ms_per_request": cpu}
    for run in runs:
        for key in ("burst", "peak_rss_mib", "max_threads", "health_ms"):
            if run.get(key):
                out[key] = run[key]
    return out


def inputs() -> dict[str, Any]:
    return {
        "model": f"tiny backbone, {IMAGE_SIZE} px, dense_units {DENSE_UNITS}, 5 classes, untrained",
        "images": f"{NUM_IMAGES} synthetic leaves, {SOURCE_SIZE}x{SOURCE_SIZE} JPEG",
        "images_per_request": list(BATCHES),
        "clients": CLIENTS,
        "burst_clients": BURST_CLIENTS,
        "window_seconds": WINDOW_SECONDS,
        "repetitions": REPETITIONS,
        "warmup_requests_per_client": WARMUP_REQUESTS,
    }


def describe(figures: Mapping[str, Any]) -> str:
    return (
        f"{figures['requests_per_second']:,.1f} req/s, {figures['images_per_second']:,.0f} img/s, "
        f"p50 {figures['p50_ms']:,.1f} ms, p99 {figures['p99_ms']:,.1f} ms"
    )


def build_result(
    in_process: Mapping[str, Any],
    server: Mapping[str, Any],
    *,
    inputs: Mapping[str, Any],
    wall_seconds: float,
    machine: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The result file from both sides' figures (`batches` keyed by images per request)."""
    ratios = {}
    for batch in BATCHES:
        ours, ceiling = server["batches"][str(batch)], in_process["batches"][str(batch)]
        ratios[str(batch)] = round(ours["requests_per_second"] / ceiling["requests_per_second"], 3)
    headline = min(ratios.values())
    cpu_ratios = {}
    for batch in BATCHES:
        ours = server.get("cpu_ms_per_request", {}).get(str(batch), {}).get("server")
        ceiling = in_process.get("cpu_ms_per_request", {}).get(str(batch), {}).get("process")
        if ours and ceiling:
            cpu_ratios[str(batch)] = round(ours / ceiling, 3)
    parts = []
    for batch in BATCHES:
        s, p = server["batches"][str(batch)], in_process["batches"][str(batch)]
        parts.append(
            f"{batch} img/request: server {s['requests_per_second']:,.1f} req/s "
            f"(p50 {s['p50_ms']:,.1f} ms, p99 {s['p99_ms']:,.1f} ms) vs in-process "
            f"{p['requests_per_second']:,.1f} req/s (p50 {p['p50_ms']:,.1f} ms), {ratios[str(batch)]:.2f}x"
        )
    if cpu_ratios:
        parts.append(
            "server CPU per request vs in-process: "
            + ", ".join(f"{cpu_ratios[str(b)]:.2f}x at {b} img" for b in BATCHES if str(b) in cpu_ratios)
        )
    burst = server.get("burst", {})
    if burst:
        parts.append(
            f"server with {BURST_CLIENTS} clients: "
            + ", ".join(
                f"{b} img {burst[str(b)]['requests_per_second']:,.1f} req/s (p99 {burst[str(b)]['p99_ms']:,.0f} ms)"
                for b in BATCHES
                if str(b) in burst
            )
            + f", peak RSS {server.get('peak_rss_mib')} MiB, health checks answered in at most "
            f"{server.get('health_ms', {}).get('max', float('nan')):,.0f} ms"
        )
    return make_result(
        NAME,
        inputs=inputs,
        figures={
            "ratio_by_images_per_request": ratios,
            "cpu_ratio_by_images_per_request": cpu_ratios,
            "server": dict(server),
            "in_process": dict(in_process),
            "wall_seconds": round(wall_seconds, 1),
        },
        ratio=headline,
        goal=GOAL,
        goal_met=None,
        machine=machine,
        notes=busy_note([*server.get("runs", []), *in_process.get("runs", [])]),
        summary=f"{CLIENTS} clients; " + "; ".join(parts),
    )


# --- the load ------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile `q` (0-100) of `values`."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n * q / 100), at least 1
    return ordered[int(rank) - 1]


def drive(
    make_call: Callable[[int], Callable[[], int]],
    *,
    clients: int,
    seconds: float,
    warmup: int = WARMUP_REQUESTS,
    cpu_clocks: Mapping[str, Callable[[], float]] | None = None,
) -> dict[str, Any]:
    """`clients` threads, each calling its own `make_call(i)()` (which returns the number of
    images answered) back to back: `warmup` calls each, then `seconds` of calls, all clients
    starting together. A failed call fails the measurement with the first client's error.
    `cpu_clocks`: CPU seconds of processes (by name) read before and after the timed calls,
    reported as `<name>_cpu_ms_per_request` (less sensitive to other processes than req/s)."""
    clocks = dict(cpu_clocks or {})
    barrier = threading.Barrier(clients + 1)
    stop = threading.Event()
    latencies: list[list[float]] = [[] for _ in range(clients)]
    answered = [0] * clients
    finished = [0.0] * clients
    errors: list[BaseException] = []

    def client(i: int) -> None:
        try:
            call = make_call(i)
            for _ in range(warmup):
                call()
        except BaseException as err:  # noqa: BLE001 - reported by the main thread
            errors.append(err)
            barrier.abort()
            return
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            return
        try:
            while not stop.is_set():
                sent = time.perf_counter()
                answered[i] += call()
                finished[i] = time.perf_counter()
                latencies[i].append(finished[i] - sent)
        except BaseException as err:  # noqa: BLE001 - reported by the main thread
            errors.append(err)
            stop.set()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    with contextlib.suppress(threading.BrokenBarrierError):  # a client failed to warm up
        barrier.wait()
    start = time.perf_counter()
    cpu_before = {name: clock() for name, clock in clocks.items()}
    if not errors:
        stop.wait(seconds)
    stop.set()
    for t in threads:
        t.join()
    cpu = {name: clock() - cpu_before[name] for name, clock in clocks.items()}
    if errors:
        raise RuntimeError(f"a client failed: {errors[0]!r}") from errors[0]
    every = [v for per_client in latencies for v in per_client]
    if not every:
        raise RuntimeError(f"no request completed in {seconds} s")
    elapsed = max(finished) - start
    return {
        "requests": len(every),
        "images": sum(answered),
        "seconds": round(elapsed, 3),
        "requests_per_second": round(len(every) / elapsed, 2),
        "images_per_second": round(sum(answered) / elapsed, 1),
        "p50_ms": round(percentile(every, 50) * 1000, 2),
        "p99_ms": round(percentile(every, 99) * 1000, 2),
        "max_ms": round(max(every) * 1000, 2),
        **{
            f"{name}_cpu_ms_per_request": round(seconds * 1000 / len(every), 3)
            for name, seconds in cpu.items()
        },
    }


def read_images(folder: Path) -> list[bytes]:
    paths = sorted(folder.glob("*.jpg"))
    if len(paths) != NUM_IMAGES:
        raise RuntimeError(f"{folder} has {len(paths)} JPEGs, expected {NUM_IMAGES}")
    return [p.read_bytes() for p in paths]


def request_body(blobs: Sequence[bytes]) -> bytes:
    instances = [{"image_bytes": {"b64": base64.b64encode(b).decode()}} for b in blobs]
    return json.dumps({"instances": instances}).encode()


def post_call(port: int, body: bytes, expected: int, route: str = PREDICT_ROUTE) -> Callable[[], int]:
    """One client: a kept-alive connection POSTing `body`; each call returns the predictions'
    count, which must be `expected`, or raises with the server's answer."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    headers = {"Content-Type": "application/json"}

    def call() -> int:
        conn.request("POST", route, body=body, headers=headers)
        response = conn.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {data[:300]!r}")
        count = len(json.loads(data)["predictions"])
        if count != expected:
            raise RuntimeError(f"{count} predictions for {expected} images")
        return count

    return call


# --- the server side -------------------------------------------------------------------------------


def _self_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def proc_cpu_seconds(pid: int) -> float:
    """A running process's user + system CPU seconds, from /proc (0.0 where there is none)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(port: int, proc: subprocess.Popen[bytes], timeout: float, route: str = HEALTH_ROUTE) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before it was ready")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            try:
                conn.request("GET", route)
                status = conn.getresponse().status
            finally:
                conn.close()
            if status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"the server was not healthy after {timeout:.0f} s")


def proc_status(pid: int) -> dict[str, float]:
    """VmHWM (peak RSS, MiB) and Threads of a running process, from /proc."""
    out: dict[str, float] = {}
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key == "VmHWM":
                    out["peak_rss_mib"] = round(int(value.split()[0]) / 1024, 1)
                elif key == "Threads":
                    out["threads"] = int(value)
    except OSError:
        pass
    return out


def measure_server(
    model_dir: Path,
    images: Sequence[bytes],
    *,
    log: Path,
    env: Mapping[str, str] | None = None,
    command: Sequence[str] | None = None,
    burst: bool = True,
) -> dict[str, Any]:
    """Starts the server on `model_dir`, drives it at each batch size (and with BURST_CLIENTS
    when `burst`), stops it (SIGTERM). `other_cpu_share`: what other processes than the server
    and this one (its clients) took of the CPUs meanwhile."""
    port = free_port()
    log.parent.mkdir(parents=True, exist_ok=True)
    server_env = child_env(
        {
            "AIP_HTTP_PORT": str(port),
            "AIP_STORAGE_URI": str(model_dir),
            "AIP_HEALTH_ROUTE": HEALTH_ROUTE,
            "AIP_PREDICT_ROUTE": PREDICT_ROUTE,
            **(env or {}),
        }
    )
    started = time.perf_counter()
    busy_before, own_before = _cpu_busy_seconds(), _self_cpu_seconds()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            list(command or [sys.executable, "-m", "trainer.server", "--host", "127.0.0.1"]),
            cwd=ROOT,
            env=server_env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_healthy(port, proc, READY_TIMEOUT)
        ready = time.perf_counter() - started
        say(f"serve: server healthy {ready:.1f} s after its start")
        figures: dict[str, Any] = {"ready_seconds": round(ready, 2), "batches": {}, "burst": {}}
        watcher = Watcher(proc.pid, port)
        try:
            for key, clients in (("batches", CLIENTS), ("burst", BURST_CLIENTS))[: 2 if burst else 1]:
                for batch in BATCHES:
                    body = request_body(images[:batch])

                    def client(_i: int, body: bytes = body, batch: int = batch) -> Callable[[], int]:
                        return post_call(port, body, batch)

                    result = drive(
                        client,
                        clients=clients,
                        seconds=WINDOW_SECONDS,
                        cpu_clocks={
                            "server": lambda: proc_cpu_seconds(proc.pid),
                            "clients": _self_cpu_seconds,
                        },
                    )
                    result["body_bytes"] = len(body)
                    figures[key][str(batch)] = result
                    say(f"serve: server, {clients} clients, {batch} image(s)/request: {describe(result)}")
        finally:
            watcher.stop()
        figures["peak_rss_mib"] = proc_status(proc.pid).get("peak_rss_mib")
        figures["max_threads"] = watcher.threads
        figures["health_ms"] = watcher.health_ms()
        proc.terminate()
        timer = threading.Timer(60, proc.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = figures["exit_code"] = os.waitstatus_to_exitcode(status)
        figures["other_cpu_share"] = _other_share(
            busy_before,
            _cpu_busy_seconds(),
            usage.ru_utime + usage.ru_stime + _self_cpu_seconds() - own_before,
            time.perf_counter() - started,
        )
        if not burst:
            del figures["burst"]
        if figures["exit_code"] != 0:
            raise RuntimeError(f"the server exited with {figures['exit_code']} on SIGTERM")
        return figures
    except Exception as err:
        raise RuntimeError(f"{err}; the server's last output ({log}):\n{tail(log)}") from err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


class Watcher:
    """While the load runs: the server's thread count, and the latency of a health check every
    0.25 s on a connection of its own (a health check that fails is an error)."""

    def __init__(self, pid: int, port: int, route: str = HEALTH_ROUTE) -> None:
        self.pid, self.port, self.route = pid, port, route
        self.threads = 0
        self.health: list[float] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            while not self._stop.wait(0.25):
                self.threads = max(self.threads, int(proc_status(self.pid).get("threads", 0)))
                sent = time.perf_counter()
                conn.request("GET", self.route)
                response = conn.getresponse()
                response.read()
                if response.status != 200:
                    self.error = f"a health check under load answered {response.status}"
                    return
                self.health.append(time.perf_counter() - sent)
        except OSError as err:
            self.error = f"a health check under load failed: {err!r}"
        finally:
            conn.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        if self.error:
            raise RuntimeError(self.error)

    def health_ms(self) -> dict[str, float]:
        if not self.health:
            return {}
        return {
            "checks": len(self.health),
            "p50": round(percentile(self.health, 50) * 1000, 2),
            "max": round(max(self.health) * 1000, 2),
        }


# --- run in child processes ----------------------------------------------------------------------


def export(model_dir: str, images_dir: str) -> dict[str, Any]:
    import numpy as np

    from trainer import export as export_lib
    from trainer import model as model_lib
    from trainer import synthetic
    from trainer._tf import tf
    from trainer.config import TrainConfig

    config = TrainConfig(
        data_dir="unused",
        model_dir=model_dir,
        checkpoint_dir="unused",
        tensorboard_dir="unused",
        backbone="tiny",
        weights="none",
        image_size=IMAGE_SIZE,
        dense_units=DENSE_UNITS,
    )
    classes = list(synthetic.CASSAVA_CLASSES)
    model = model_lib.build_model(config, num_classes=len(classes), input_size=IMAGE_SIZE)
    export_lib.save(model, model_dir, classes, IMAGE_SIZE)
    rng = np.random.default_rng(0)
    os.makedirs(images_dir, exist_ok=True)
    sizes = []
    for i in range(NUM_IMAGES):
        image = synthetic.make_image(rng, classes[i % len(classes)], SOURCE_SIZE)
        data = tf.io.encode_jpeg(np.asarray(image), quality=95).numpy()
        Path(images_dir, f"{i:03d}.jpg").write_bytes(data)
        sizes.append(len(data))
    return {"mean_jpeg_bytes": round(sum(sizes) / len(sizes))}


def measure_in_process(model_dir: str, images_dir: str) -> dict[str, Any]:
    from trainer import serve

    images = read_images(Path(images_dir))
    started = time.perf_counter()
    served = serve.load(model_dir)
    figures: dict[str, Any] = {"load_seconds": round(time.perf_counter() - started, 2), "batches": {}}
    for batch in BATCHES:
        blobs = images[:batch]

        def make_call(_i: int, blobs: Sequence[bytes] = blobs) -> Callable[[], int]:
            return lambda: len(serve.answer(served, blobs))

        figures["batches"][str(batch)] = drive(
            make_call, clients=CLIENTS, seconds=WINDOW_SECONDS, cpu_clocks={"process": _self_cpu_seconds}
        )
    return figures
