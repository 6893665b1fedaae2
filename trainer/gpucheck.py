"""`python -m trainer.gpucheck`: what this container sees of its GPUs, and one NCCL all-reduce.

The in-image half of `make gpu-check` (`launch/gpucheck.py` submits it as a one-replica Vertex
CustomJob on the trainer image; docs/vertex.md#make-gpu-check says what it reports). It applies
the trainer's own rule (`trainer.distribute.gpu_shortfall`) to the worker pool's request, and
writes its summary as JSON (`RESULT_FILE`) into `--output_dir` (default `$AIP_MODEL_DIR`; nothing
without either), where the launcher reads it back. Exit status: 0 done; 2 bad flags or a bad
`TRAINER_POOL_*`/`TF_CONFIG`; 3 fewer GPUs than asked; 1 the all-reduce failed or gave a wrong sum.
TensorFlow is imported only after the flags are checked.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trainer.config import GpuRequest, float_in, gpu_request, int_in
from trainer.distribute import (
    GPUS_MISSING_EXIT_CODE,
    cluster_from_tf_config,
    describe_build,
    driver_versions,
    gpu_shortfall,
    pool_and_role,
    visible_devices,
)

RESULT_FILE = "gpu_check.json"
"""The summary's file name in `--output_dir` (`launch.gpucheck.RESULT_FILE`; its test keeps them equal)."""
RESULT_KEYS = (
    "ok",
    "error",
    "pool",
    "role",
    "asked",
    "tensorflow",
    "build",
    "devices",
    "gpus",
    "nvidia_smi",
    "driver",
    "xla",
    "all_reduce",
    "wall_seconds",
)
"""The summary's keys (`launch.gpucheck.RESULT_READ` lists those it reads)."""
PROG = "python -m trainer.gpucheck"


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="List the GPUs this container sees and run one NCCL all-reduce over them.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--output_dir",
        default=environ.get("AIP_MODEL_DIR", "").rstrip("/"),
        help=f"Where {RESULT_FILE} goes (local, gs:// or /gcs/); empty: print only. Default: $AIP_MODEL_DIR.",
    )
    p.add_argument(
        "--all_reduce_mb",
        type=float_in(0.001, 4096),
        default=64.0,
        help="Megabytes (MiB) of float32 each GPU contributes to the all-reduce.",
    )
    p.add_argument(
        "--iterations", type=int_in(1, 1000), default=10, help="Timed all-reduces after the first."
    )
    return p


def nvidia_smi() -> list[str] | None:
    """`nvidia-smi`'s one line per GPU (index, name, driver, memory, compute capability), or None
    when the image has no `nvidia-smi` (the NVIDIA container runtime usually mounts it)."""
    path = shutil.which("nvidia-smi")
    if not path:
        return None
    query = [path, "--query-gpu=index,name,driver_version,memory.total,compute_cap", "--format=csv,noheader"]
    try:
        done = subprocess.run(query, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return [f"nvidia-smi failed: {err}"]
    lines = [line.strip() for line in (done.stdout or done.stderr).splitlines() if line.strip()]
    return lines if done.returncode == 0 else [f"nvidia-smi exited with status {done.returncode}", *lines]


def inspect_devices() -> dict[str, Any]:
    """What TensorFlow sees, without starting its runtime (`visible_devices`), and its build."""
    from trainer._tf import tf

    gpus, names, _ = visible_devices()
    info = tf.sysconfig.get_build_info()
    return {
        "tensorflow": tf.__version__,
        "build": {
            k: info.get(k)
            for k in ("is_cuda_build", "cuda_version", "cudnn_version", "cuda_compute_capabilities")
        },
        "devices": names,
        "gpus": gpus,
        "nvidia_smi": nvidia_smi(),
        "driver": driver_versions(),
    }


def xla_compile(device: str = "/gpu:0") -> dict[str, Any]:
    """One XLA computation compiled and run on `device` (XLA is on by default for the trainer's
    jit-compiled steps and JIT-compiles PTX the driver must accept): a 64x64 matmul of ones,
    summed, must be 64**3."""
    from trainer._tf import tf

    @tf.function(jit_compile=True)
    def cube(x: Any) -> Any:
        return tf.reduce_sum(tf.matmul(x, x))

    started = time.perf_counter()
    with tf.device(device):
        value = float(cube(tf.ones([64, 64])).numpy())
    return {"device": device, "seconds": time.perf_counter() - started, "correct": value == 64.0**3}


def nccl_all_reduce(
    gpus: int, megabytes: float, iterations: int, devices: Sequence[str] = (), cross_device_ops: Any = None
) -> dict[str, Any]:
    """One SUM all-reduce of a `megabytes` float32 tensor per GPU over `gpus` GPUs (NCCL): replica
    i contributes i + 1, so every element must be gpus * (gpus + 1) / 2, checked after the first
    and last calls, outside the timings; a timed call includes filling the tensor (small beside
    the all-reduce). `devices` and `cross_device_ops` replace the GPUs and NCCL (tests, on CPU)."""
    from trainer._tf import tf

    ops = cross_device_ops or tf.distribute.NcclAllReduce()
    strategy = tf.distribute.MirroredStrategy(
        devices=list(devices) or [f"/gpu:{i}" for i in range(gpus)], cross_device_ops=ops
    )
    replicas = strategy.num_replicas_in_sync
    elements = max(1, int(megabytes * 2**20) // 4)

    def replica_step() -> Any:
        context = tf.distribute.get_replica_context()
        value = tf.fill([elements], tf.cast(context.replica_id_in_sync_group, tf.float32) + 1.0)
        return context.all_reduce(tf.distribute.ReduceOp.SUM, value)

    @tf.function
    def step() -> Any:
        return strategy.run(replica_step)

    expected = replicas * (replicas + 1) / 2

    def timed() -> tuple[float, tuple[Any, ...]]:
        started = time.perf_counter()
        results = strategy.experimental_local_results(step())
        for result in results:
            result[-1].numpy()  # waits for this replica's all-reduce
        return time.perf_counter() - started, results

    def right(results: Sequence[Any]) -> bool:
        return all(bool(tf.reduce_all(tf.equal(r, expected)).numpy()) for r in results)

    first, results = timed()
    correct = right(results)
    times = []
    for _ in range(iterations):
        seconds, results = timed()
        times.append(seconds)
    correct = correct and right(results)
    mean = sum(times) / len(times)
    size = elements * 4
    return {
        "implementation": type(ops).__name__,
        "gpus": replicas,
        "megabytes": size / 2**20,
        "first_seconds": first,
        "seconds": mean,
        "iterations": iterations,
        # NCCL's "bus bandwidth" of an all-reduce: size * 2 (n - 1) / n per second.
        "bus_gb_per_second": (size * 2 * (replicas - 1) / replicas) / mean / 1e9 if replicas > 1 else None,
        "correct": correct,
        "expected_sum": expected,
    }


def check(
    request: GpuRequest | None,
    pool: str,
    role: str,
    seen: Mapping[str, Any],
    all_reduce: Callable[[int], dict[str, Any]],
    xla: Callable[[], dict[str, Any]] | None = None,
) -> tuple[int, dict[str, Any], list[str]]:
    """(exit status, summary, lines to print) for what was seen (`inspect_devices`' form). `xla()`,
    then `all_reduce(gpus)`, run only with GPUs seen and none missing."""
    gpus = int(seen["gpus"])
    # Every key but `wall_seconds` (`main` adds it): what was seen, the rest filled in below.
    summary: dict[str, Any] = {key: seen.get(key) for key in RESULT_KEYS[:-1]}
    asked = dataclasses.asdict(request) if request else None
    summary.update(ok=True, error=None, pool=pool, role=role, asked=asked, driver=seen.get("driver", ""))
    build = describe_build(seen["tensorflow"], seen["build"])
    if request is None:
        wanted = "no GPU request in the environment (TRAINER_POOL_* unset): nothing to check against"
    else:
        n, gpu = request.accelerator_count, request.accelerator_type
        wanted = f"asked for {f'{n} x {gpu}' if n else '0 GPUs'} on {request.machine_type}"
    lines = [
        f"gpu check: {pool} ({role}) {wanted}",
        f"gpu check: {build}; kernels for {', '.join(seen['build'].get('cuda_compute_capabilities') or []) or 'none'}",
        f"gpu check: TensorFlow sees {gpus} GPU{'' if gpus == 1 else 's'} (devices: {', '.join(seen['devices']) or 'none'})",
    ]
    lines += [f"gpu check: nvidia-smi: {line}" for line in seen["nvidia_smi"] or ["not in this image"]]
    lines.append(f"gpu check: {summary['driver'] or 'no NVIDIA driver (libcuda.so.1) found'}")
    if request is not None:
        problem = gpu_shortfall(pool, role, request, gpus, seen["devices"], "TensorFlow", build)
        if problem:
            summary.update(ok=False, error=problem)
            return GPUS_MISSING_EXIT_CODE, summary, lines
    if not gpus:
        asked_none = "asked for 0 GPUs and " if request is not None else ""
        lines.append(f"gpu check: {asked_none}no GPU seen: no NCCL all-reduce to run")
        return 0, summary, lines
    if xla is not None:
        try:
            compiled = xla()
        except Exception as err:  # noqa: BLE001 (XLA's or the driver's own failure: one line)
            compiled = {"correct": False, "error": " ".join(f"{type(err).__name__}: {err}".split())[:1000]}
        summary["xla"] = compiled
        if not compiled.get("correct"):
            why = compiled.get("error") or "a wrong result"
            summary.update(ok=False, error=f"an XLA computation on GPU:0 failed ({why}): {summary['driver']}")
            return 1, summary, lines
        lines.append(
            f"gpu check: XLA compiled and ran one computation on GPU:0 in {compiled['seconds']:.2f} s"
        )
    try:
        result = all_reduce(gpus)
    except Exception as err:  # noqa: BLE001 (the all-reduce's own failure, NCCL or CUDA: named in one line)
        message = " ".join(f"{type(err).__name__}: {err}".split())[:1000]
        summary.update(ok=False, error=f"NCCL all-reduce over {gpus} GPU(s) failed: {message}")
        return 1, summary, lines
    summary["all_reduce"] = result
    bandwidth = result.get("bus_gb_per_second")
    lines.append(
        f"gpu check: NCCL all-reduce of {result['megabytes']:g} MiB over {gpus} GPU(s): first call "
        f"{result['first_seconds']:.3f} s (set-up included), then {result['seconds'] * 1000:.2f} ms each "
        f"(mean of {result['iterations']})"
        + (f", bus bandwidth {bandwidth:.1f} GB/s" if bandwidth else " (one GPU: nothing crosses a link)")
        + ("" if result["correct"] else "; WRONG SUM")
    )
    if not result["correct"]:
        summary.update(ok=False, error=f"the NCCL all-reduce over {gpus} GPU(s) gave a wrong sum")
        return 1, summary, lines
    return 0, summary, lines


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ
    ns = build_parser(env).parse_args(argv)  # exits with status 2 on a bad flag
    try:
        request = gpu_request(env)
        cluster = cluster_from_tf_config(env.get("TF_CONFIG"))
    except ValueError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr, flush=True)
        return 2
    pool, role = pool_and_role(cluster)
    started = time.perf_counter()
    all_reduce = functools.partial(nccl_all_reduce, megabytes=ns.all_reduce_mb, iterations=ns.iterations)
    code, summary, lines = check(request, pool, role, inspect_devices(), all_reduce, xla_compile)
    summary["wall_seconds"] = time.perf_counter() - started
    for line in lines:
        print(line, flush=True)
    if ns.output_dir:
        from trainer import storage

        path = storage.join(ns.output_dir, RESULT_FILE)
        try:
            storage.write_json(path, summary)
            print(f"gpu check: wrote {path}", flush=True)
        except Exception as err:  # noqa: BLE001 (the check's verdict matters more than its file)
            print(f"gpu check: warning: could not write {RESULT_FILE} to {ns.output_dir}: {err}", flush=True)
    if summary["error"]:
        print(f"{PROG}: error: {summary['error']}", file=sys.stderr, flush=True)
    else:
        print("gpu check: OK", flush=True)
    print(json.dumps(summary, sort_keys=True), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
