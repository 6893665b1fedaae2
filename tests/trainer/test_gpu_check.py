"""`python -m trainer.gpucheck`, the in-image half of `make gpu-check` (an extra): the trainer's own
rule (tests/trainer/test_no_cpu_training.py) applied to the pool's request, XLA compiled, one NCCL
all-reduce, its summary. In process, with the devices and the all-reduce faked, and on this
machine's CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.processes import ROOT, trainer_env
from tests.trainer.test_no_cpu_training import ASKS_NONE, ASKS_ONE, CPU_BUILD, V100
from trainer import distribute, gpucheck
from trainer.config import GpuRequest
from trainer.distribute import gpu_shortfall

# --- python -m trainer.gpucheck ---------------------------------------------------------------------


def seen(gpus: int) -> dict[str, Any]:
    return {
        "tensorflow": "2.21.0",
        "build": {"is_cuda_build": True, "cuda_version": "12.5.1", "cudnn_version": "9"},
        "devices": ["CPU:0", *(f"GPU:{i}" for i in range(gpus))],
        "gpus": gpus,
        "nvidia_smi": None,
    }


def reduced(gpus: int, correct: bool = True) -> dict[str, Any]:
    return {
        "implementation": "NcclAllReduce",
        "gpus": gpus,
        "megabytes": 64.0,
        "first_seconds": 2.0,
        "seconds": 0.004,
        "iterations": 10,
        "bus_gb_per_second": 33.5 if gpus > 1 else None,
        "correct": correct,
    }


def never(gpus: int) -> dict[str, Any]:
    raise AssertionError("the all-reduce ran")


def test_the_check_fails_with_the_trainers_line_when_gpus_are_missing() -> None:
    request = GpuRequest("n1-standard-8", V100, 1)
    code, summary, _ = gpucheck.check(request, "workerpool0", "chief", seen(0), never)
    assert code == 3 and summary["ok"] is False
    assert summary["error"] == gpu_shortfall(
        "workerpool0", "chief", request, 0, ["CPU:0"], "TensorFlow", CPU_BUILD
    )


def test_asked_no_gpu_it_says_so_and_skips_nccl() -> None:
    code, summary, lines = gpucheck.check(GpuRequest("n1-standard-8"), "workerpool0", "chief", seen(0), never)
    assert code == 0 and summary["ok"] and summary["all_reduce"] is None
    assert lines[-1] == "gpu check: asked for 0 GPUs and no GPU seen: no NCCL all-reduce to run"


def test_with_gpus_it_runs_and_reports_the_all_reduce() -> None:
    ran: list[int] = []

    def all_reduce(gpus: int) -> dict[str, Any]:
        ran.append(gpus)
        return reduced(gpus)

    request = GpuRequest("a2-highgpu-2g", "NVIDIA_TESLA_A100", 2)
    code, summary, lines = gpucheck.check(request, "workerpool0", "chief", seen(2), all_reduce)
    assert (code, ran, summary["all_reduce"]) == (0, [2], reduced(2))
    assert lines[-1] == (
        "gpu check: NCCL all-reduce of 64 MiB over 2 GPU(s): first call 2.000 s (set-up included), "
        "then 4.00 ms each (mean of 10), bus bandwidth 33.5 GB/s"
    )


def test_a_failed_or_wrong_all_reduce_fails_the_check_in_one_line() -> None:
    request = GpuRequest("a2-highgpu-2g", "NVIDIA_TESLA_A100", 2)

    def broken(gpus: int) -> dict[str, Any]:
        raise RuntimeError("NCCL error:\n unhandled system error")

    code, summary, _ = gpucheck.check(request, "workerpool0", "chief", seen(2), broken)
    assert code == 1
    assert (
        summary["error"]
        == "NCCL all-reduce over 2 GPU(s) failed: RuntimeError: NCCL error: unhandled system error"
    )
    code, summary, _ = gpucheck.check(
        request, "workerpool0", "chief", seen(2), lambda g: reduced(g, correct=False)
    )
    assert code == 1 and "wrong sum" in summary["error"]


def test_gpucheck_here_asked_nothing_writes_its_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real device listing of this machine (TensorFlow in this process: no GPU here)."""
    code = gpucheck.main([f"--output_dir={tmp_path}"], ASKS_NONE)
    out = capsys.readouterr().out
    assert code == 0, out
    summary = json.loads((tmp_path / gpucheck.RESULT_FILE).read_text())
    assert sorted(summary) == sorted(gpucheck.RESULT_KEYS)
    assert summary["ok"] and summary["gpus"] == 0 and "CPU:0" in summary["devices"]
    assert summary["asked"] == {
        "machine_type": "n1-standard-8",
        "accelerator_type": "",
        "accelerator_count": 0,
    }
    assert "no NCCL all-reduce to run" in out and "gpu check: OK" in out


def test_gpucheck_here_asked_one_gpu_fails_with_the_trainers_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gpus, names, build = distribute.visible_devices()
    if gpus:
        pytest.skip("asks for one GPU more than this machine has: needs a machine without GPUs")
    assert gpucheck.main([f"--output_dir={tmp_path}"], ASKS_ONE) == 3
    line = gpu_shortfall(
        "workerpool0", "chief", GpuRequest("n1-standard-8", V100, 1), 0, names, "TensorFlow", build
    )
    assert f"python -m trainer.gpucheck: error: {line}\n" in capsys.readouterr().err
    assert json.loads((tmp_path / gpucheck.RESULT_FILE).read_text())["error"] == line


def test_gpucheck_bad_input_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpucheck.main([], {"TRAINER_POOL_ACCELERATOR_COUNT": "1"}) == 2
    assert "TRAINER_POOL_MACHINE_TYPE is not set" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        gpucheck.main(["--iterations=0"], {})
    assert exit_info.value.code == 2


def test_importing_the_check_loads_no_tensorflow() -> None:
    probe = "import sys, trainer.gpucheck\nsys.exit(1 if 'tensorflow' in sys.modules else 0)\n"
    assert (
        subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=trainer_env(), timeout=60).returncode == 0
    )


def test_the_all_reduce_code_on_this_machines_cpu() -> None:
    """`nccl_all_reduce` with NCCL replaced by ReductionToOneDevice on the CPU (NCCL needs GPUs):
    the strategy, the replica's fill, the sum check and the timings it reports."""
    from trainer._tf import tf

    result = gpucheck.nccl_all_reduce(
        1, 0.5, 3, devices=["/cpu:0"], cross_device_ops=tf.distribute.ReductionToOneDevice()
    )
    assert result["implementation"] == "ReductionToOneDevice"
    assert (result["gpus"], result["megabytes"], result["iterations"]) == (1, 0.5, 3)
    assert result["correct"] is True and result["expected_sum"] == 1
    assert result["first_seconds"] > 0 and result["seconds"] > 0 and result["bus_gb_per_second"] is None


def test_xla_runs_before_the_all_reduce_and_its_failure_fails_the_check_with_the_driver() -> None:
    """H100/H200 run TF 2.21's kernels and XLA only through PTX, which the driver must accept: the
    check compiles one XLA computation on GPU:0 and names the driver when it fails."""
    request = GpuRequest("a3-highgpu-1g", "NVIDIA_H100_80GB", 1)
    with_driver = {**seen(1), "driver": "NVIDIA driver 535.104.05, CUDA 12.2"}
    ok = {"device": "/gpu:0", "seconds": 1.5, "correct": True}
    code, summary, lines = gpucheck.check(request, "workerpool0", "chief", with_driver, reduced, lambda: ok)
    assert code == 0 and summary["xla"] == ok and summary["driver"] == with_driver["driver"]
    assert any("XLA compiled" in line for line in lines) and any("535.104.05" in line for line in lines)

    def ptx_refused() -> dict[str, Any]:
        raise RuntimeError("CUDA_ERROR_UNSUPPORTED_PTX_VERSION")

    code, summary, _ = gpucheck.check(request, "workerpool0", "chief", with_driver, never, ptx_refused)
    assert code == 1 and "UNSUPPORTED_PTX" in summary["error"] and "535.104.05" in summary["error"]
    code, _, _ = gpucheck.check(
        request, "workerpool0", "chief", with_driver, never, lambda: {**ok, "correct": False}
    )
    assert code == 1


def test_the_xla_computation_on_this_machines_cpu() -> None:
    result = gpucheck.xla_compile("/cpu:0")
    assert result["correct"] is True and result["device"] == "/cpu:0"
