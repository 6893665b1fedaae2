"""No silent CPU training: the worker pool's request (`TRAINER_POOL_*`), the one rule that compares
it with the GPUs TensorFlow sees (`trainer.distribute.gpu_shortfall`) and the trainer stopping at
start with one line and status 3. In process, with the devices faked, except one real trainer
process asked for a GPU on this machine. The GPU check (`python -m trainer.gpucheck`, an extra)
applies the same rule: tests/trainer/test_gpu_check.py."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.processes import ROOT, trainer_env
from trainer import config, distribute, task
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


def test_no_driver_is_said_not_guessed(monkeypatch: pytest.MonkeyPatch) -> None:
    import ctypes

    from trainer import distribute

    def no_libcuda(name: str, *args: Any, **kwargs: Any) -> Any:
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", no_libcuda)  # as on a machine without the NVIDIA driver
    assert distribute.driver_versions() == ""
