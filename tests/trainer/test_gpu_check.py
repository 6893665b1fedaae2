"""No silent CPU training: the worker pool's request (`TRAINER_POOL_*`), the one rule that compares
it with the GPUs TensorFlow sees (`trainer.distribute.gpu_shortfall`), the trainer stopping at
start with one line and status 3, and `python -m trainer.gpucheck` applying the same rule. In
process, with the devices faked, except the last test: one real trainer process asked for a GPU
on this machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.processes import ROOT, trainer_env
from trainer import config, distribute, gpucheck, task
from trainer.config import GpuRequest, gpu_request
from trainer.distribute import cluster_from_tf_config, gpu_shortfall

V100 = "NVIDIA_TESLA_V100"
ASKS_ONE = {
    "TRAINER_POOL_MACHINE_TYPE": "n1-standard-8",
    "TRAINER_POOL_ACCELERATOR_TYPE": V100,
    "TRAINER_POOL_ACCELERATOR_COUNT": "1",
}
ASKS_NONE = {
    "TRAINER_POOL_MACHINE_TYPE": "n1-standard-8",
    "TRAINER_POOL_ACCELERATOR_TYPE": "ACCELERATOR_TYPE_UNSPECIFIED",
    "TRAINER_POOL_ACCELERATOR_COUNT": "0",
}
CPU_BUILD = "TensorFlow 2.21.0 built with CUDA 12.5.1, cuDNN 9"
WORKER = json.dumps(
    {"cluster": {"chief": ["c:1"], "worker": ["w:1"]}, "task": {"type": "worker", "index": 0}}
)


# --- the request ------------------------------------------------------------------------------------


def test_the_request_is_read_from_the_pools_environment() -> None:
    assert gpu_request({}) is None  # not started from the pipeline's specs: nothing to check
    assert gpu_request(ASKS_ONE) == GpuRequest("n1-standard-8", V100, 1)
    assert gpu_request(ASKS_NONE) == GpuRequest("n1-standard-8", "", 0)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TRAINER_POOL_ACCELERATOR_COUNT": "1"}, "TRAINER_POOL_MACHINE_TYPE is not set"),
        (
            {**ASKS_ONE, "TRAINER_POOL_ACCELERATOR_COUNT": "one"},
            "TRAINER_POOL_ACCELERATOR_COUNT='one' is not valid",
        ),
        ({**ASKS_ONE, "TRAINER_POOL_ACCELERATOR_COUNT": "-1"}, "expected a whole number >= 0"),
        (
            {**ASKS_ONE, "TRAINER_POOL_ACCELERATOR_TYPE": "v100"},
            "TRAINER_POOL_ACCELERATOR_TYPE='v100' is not an",
        ),
        ({**ASKS_ONE, "TRAINER_POOL_ACCELERATOR_TYPE": ""}, "or ACCELERATOR_TYPE_UNSPECIFIED for none"),
        ({**ASKS_ONE, "TRAINER_POOL_MACHINE_TYPE": "N1 standard"}, "is not a Compute Engine machine type"),
        ({**ASKS_NONE, "TRAINER_POOL_ACCELERATOR_COUNT": "2"}, "a GPU count needs a GPU type"),
        ({**ASKS_ONE, "TRAINER_POOL_ACCELERATOR_COUNT": "0"}, "a GPU type needs a count >= 1"),
    ],
)
def test_a_bad_request_names_the_variable_and_what_it_takes(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=None) as err:
        gpu_request(env)
    assert message in str(err.value)


# --- the rule ---------------------------------------------------------------------------------------


def test_fewer_gpus_than_asked_is_one_line_naming_pool_machine_gpus_and_devices() -> None:
    request = GpuRequest("n1-standard-8", V100, 2)
    line = gpu_shortfall("workerpool1", "worker", request, 1, ["CPU:0", "GPU:0"], "TensorFlow", CPU_BUILD)
    assert line == (
        "GPU check failed: workerpool1 (worker) asked for 2 x NVIDIA_TESLA_V100 on n1-standard-8, but "
        "TensorFlow sees 1 GPU (devices: CPU:0, GPU:0; TensorFlow 2.21.0 built with CUDA 12.5.1, cuDNN 9); "
        "refusing to train on CPU (docs/vertex.md#no-silent-cpu-training)"
    )
    assert "\n" not in line


@pytest.mark.parametrize(("asked", "seen"), [(0, 0), (1, 1), (1, 2), (8, 8), (0, 4)])
def test_enough_gpus_pass(asked: int, seen: int) -> None:
    request = GpuRequest("n1-standard-8", V100 if asked else "", asked)
    assert gpu_shortfall("workerpool0", "chief", request, seen, [], "TensorFlow") is None


@pytest.mark.parametrize(
    ("tf_config", "expected"),
    [(None, ("workerpool0", "chief")), (WORKER, ("workerpool1", "worker"))],
)
def test_the_pool_is_named_as_vertex_names_it(tf_config: str | None, expected: tuple[str, str]) -> None:
    assert distribute.pool_and_role(cluster_from_tf_config(tf_config)) == expected


def fake_devices(monkeypatch: pytest.MonkeyPatch, gpus: int) -> None:
    names = ["CPU:0", *(f"GPU:{i}" for i in range(gpus))]
    monkeypatch.setattr(distribute, "visible_devices", lambda: (gpus, names, CPU_BUILD))


def test_check_gpus_raises_with_the_rules_line(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_devices(monkeypatch, 0)
    cluster = cluster_from_tf_config(WORKER)
    with pytest.raises(distribute.GpusMissing) as err:
        distribute.check_gpus(GpuRequest("n1-standard-8", V100, 1), cluster)
    request = GpuRequest("n1-standard-8", V100, 1)
    assert str(err.value) == gpu_shortfall(
        "workerpool1", "worker", request, 0, ["CPU:0"], "TensorFlow", CPU_BUILD
    )
    fake_devices(monkeypatch, 1)
    note = distribute.check_gpus(GpuRequest("n1-standard-8", V100, 1), cluster)
    assert note.startswith(
        "workerpool1 (worker) asked for 1 x NVIDIA_TESLA_V100 on n1-standard-8; TensorFlow sees 1 GPU"
    )


# --- the trainer's entry point ----------------------------------------------------------------------


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """`task.run` replaced: records that training (the strategy) would have started."""
    calls: list[Any] = []
    monkeypatch.setattr(task, "run", lambda *a, **k: calls.append((a, k)))
    monkeypatch.delenv("TF_CONFIG", raising=False)
    for name in config.POOL_ENV:
        monkeypatch.delenv(name, raising=False)
    return calls


FLAGS = ["--data_dir=/data", "--model_dir=/tmp/m"]


def test_the_trainer_stops_before_the_strategy_with_one_line_and_status_3(
    no_training: list[Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_devices(monkeypatch, 0)
    for name, value in ASKS_ONE.items():
        monkeypatch.setenv(name, value)
    assert task.main(FLAGS) == distribute.GPUS_MISSING_EXIT_CODE == 3
    assert no_training == []
    err = capsys.readouterr().err
    line = gpu_shortfall(
        "workerpool0", "chief", GpuRequest("n1-standard-8", V100, 1), 0, ["CPU:0"], "TensorFlow", CPU_BUILD
    )
    assert err == f"python -m trainer.task: error: {line}\n"


def test_the_trainer_trains_when_it_sees_what_was_asked(
    no_training: list[Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_devices(monkeypatch, 0)
    for name, value in ASKS_NONE.items():
        monkeypatch.setenv(name, value)
    assert task.main(FLAGS) == 0
    assert len(no_training) == 1
    assert "[single] workerpool0 (chief) asked for no GPU on n1-standard-8; TensorFlow sees 0 GPUs" in (
        capsys.readouterr().out
    )


def test_without_a_request_nothing_is_checked(
    no_training: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        distribute, "visible_devices", lambda: pytest.fail("devices listed without a request")
    )
    assert task.main(FLAGS) == 0 and len(no_training) == 1


def test_a_bad_request_is_a_usage_error(
    no_training: list[Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRAINER_POOL_ACCELERATOR_COUNT", "many")
    assert task.main(FLAGS) == 2 and no_training == []
    assert "python -m trainer.task: error: TRAINER_POOL_MACHINE_TYPE is not set" in capsys.readouterr().err


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


# --- one real trainer process -----------------------------------------------------------------------


@pytest.mark.serial
def test_a_trainer_asked_for_a_gpu_on_this_machine_exits_3_before_the_runtime_starts() -> None:
    """`python -m trainer.task`'s main, with the pool's request in its environment, on this
    machine (no GPU): status 3, one line, no traceback; TensorFlow's runtime never started
    (threading options can still be set, which fails once it has)."""
    from local import gpus

    if gpus.local_gpus():
        pytest.skip("needs a machine without GPUs")
    code = (
        "import sys\n"
        "from trainer import task\n"
        "status = task.main(['--data_dir=/nonexistent', '--model_dir=/nonexistent/model'])\n"
        "import tensorflow as tf\n"
        "tf.config.threading.set_inter_op_parallelism_threads(3)  # RuntimeError once started\n"
        "sys.exit(status)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=trainer_env({**ASKS_ONE, "TF_CPP_MIN_LOG_LEVEL": "3"}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 3, done.stdout + done.stderr
    ours = [line for line in done.stderr.splitlines() if line.startswith("python -m trainer.task")]
    assert len(ours) == 1, done.stderr
    assert ours[0].startswith(
        "python -m trainer.task: error: GPU check failed: workerpool0 (chief) asked for 1 x "
        "NVIDIA_TESLA_V100 on n1-standard-8, but TensorFlow sees 0 GPUs (devices: CPU:0; TensorFlow "
    )
    assert "Traceback" not in done.stderr
    assert "replica(s) in sync" not in done.stdout  # no strategy was built


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


def test_no_driver_is_said_not_guessed(monkeypatch: pytest.MonkeyPatch) -> None:
    import ctypes

    from trainer import distribute

    def no_libcuda(name: str, *args: Any, **kwargs: Any) -> Any:
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", no_libcuda)  # as on a machine without the NVIDIA driver
    assert distribute.driver_versions() == ""
