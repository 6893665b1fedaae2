"""The local custom job runner and the local tuner, with small Python programs as replicas
(the real trainer runs in tests/test_local_run.py)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from components import tuning
from local import jobs, tuner

# Deadlines on processes of its own: in the serial tier, beside one other serial test at most (make test).
pytestmark = pytest.mark.serial

# A replica that records what Vertex would give it, then behaves as its flags say.
REPLICA = r"""
import json, os, signal, sys, tempfile, time
out = sys.argv[1]
env = {k: os.environ.get(k) for k in ("TF_CONFIG", "CLUSTER_SPEC", "AIP_MODEL_DIR", "AIP_CHECKPOINT_DIR",
       "AIP_TENSORBOARD_LOG_DIR", "CLOUD_ML_PROJECT_ID", "CLOUD_ML_JOB_ID", "TMPDIR")}
task = json.loads(env["TF_CONFIG"])["task"]
name = f"{task['type']}-{task['index']}"
with open(os.path.join(out, name + ".json"), "w") as f:
    json.dump({"env": env, "argv": sys.argv[2:], "pid": os.getpid(), "tmp": os.listdir(env["TMPDIR"])}, f)
# A temporary file left behind, as a process killed by SIGKILL leaves its own.
tempfile.NamedTemporaryFile(prefix=f"left-by-{name}-", delete=False).close()
print(f"hello from {name}", flush=True)
mode = sys.argv[2] if len(sys.argv) > 2 else "ok"
once = os.path.join(out, "once")
if mode == "fail" and name == "worker-0":
    print("something broke", flush=True)
    sys.exit(3)
if mode == "die-once" and name == "worker-0" and not os.path.exists(once):
    open(once, "w").close()
    os.kill(os.getpid(), signal.SIGKILL)
if mode == "die-always" and name == "worker-0":
    os.kill(os.getpid(), signal.SIGKILL)
if mode == "term-once" and name == "worker-0" and not os.path.exists(once):
    open(once, "w").close()
    print("SIGTERM: backed up, exiting with status 143", flush=True)
    sys.exit(143)
if mode == "save-on-term":
    def saved(signum, frame):
        open(os.path.join(out, name + ".saved"), "w").close()
        sys.exit(143)
    signal.signal(signal.SIGTERM, saved)
    print(f"{name} training", flush=True)
    time.sleep(600)
if mode == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(f"{name} training", flush=True)
    time.sleep(600)
if mode == "hang":
    time.sleep(600)
if mode == "latin1-then-fail" and name == "worker-0":
    sys.stdout.buffer.write(b"reading /data/caf\xe9.jpg\n" + b"x" * 100_000 + b"\n")
    print("REAL ERROR: bad image", flush=True)
    sys.exit(1)
if mode == "leave-a-child" and name == "worker-0":
    import subprocess
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    open(os.path.join(out, "child.pid"), "w").write(str(child.pid))
    sys.exit(1)
"""


def specs(
    tmp_path: Path, mode: str = "ok", workers: int = 2, extra_pool: bool = False
) -> list[dict[str, Any]]:
    script = tmp_path / "replica.py"
    script.write_text(REPLICA)
    container = {"image_uri": "img", "command": ["python", str(script)], "args": [str(tmp_path), mode]}
    pools: list[dict[str, Any]] = [
        {
            "machine_spec": {"machine_type": "n1-standard-4"},
            "replica_count": 1.0,
            "container_spec": container,
        },
        {
            "machine_spec": {"machine_type": "n1-standard-4"},
            "replica_count": float(workers),
            "container_spec": container,
        },
    ]
    if extra_pool:
        pools.append(
            {
                "machine_spec": {"machine_type": "n1-highcpu-16"},
                "replica_count": 2,
                "container_spec": {"image_uri": "rs"},
            }
        )
    return pools


def run(tmp_path: Path, mode: str = "ok", **kwargs: Any) -> tuple[jobs.JobResult, str]:
    out = io.StringIO()
    args: dict[str, Any] = {
        "display_name": "job",
        "project": "proj",
        "log_dir": tmp_path / "logs",
        "out": out,
    }
    result = jobs.run_job(
        specs(tmp_path, mode, extra_pool=kwargs.pop("extra_pool", False)),
        str(tmp_path / "base") + "/",
        **{**args, **kwargs},
    )
    return result, out.getvalue()


def test_every_replica_gets_vertex_s_environment(tmp_path: Path) -> None:
    result, screen = run(tmp_path, extra_pool=True, job_id="job-7")
    assert result.attempts == 1 and result.replicas == ["chief-0", "worker-0", "worker-1"]
    seen = {name: json.loads((tmp_path / f"{name}.json").read_text()) for name in result.replicas}
    configs = {name: json.loads(s["env"]["TF_CONFIG"]) for name, s in seen.items()}
    cluster = configs["chief-0"]["cluster"]
    assert set(cluster) == {"chief", "worker"} and len(cluster["chief"]) == 1 and len(cluster["worker"]) == 2
    addresses = cluster["chief"] + cluster["worker"]
    assert len(set(addresses)) == 3 and all(a.startswith("127.0.0.1:") for a in addresses)
    for name, config in configs.items():
        assert config["cluster"] == cluster
        assert f"{config['task']['type']}-{config['task']['index']}" == name
        env = seen[name]["env"]
        assert env["AIP_MODEL_DIR"] == f"{tmp_path}/base/model/"
        assert env["AIP_CHECKPOINT_DIR"] == f"{tmp_path}/base/checkpoints/"
        assert env["AIP_TENSORBOARD_LOG_DIR"] == f"{tmp_path}/base/logs/"
        assert (env["CLOUD_ML_PROJECT_ID"], env["CLOUD_ML_JOB_ID"]) == ("proj", "job-7")
        spec = json.loads(env["CLUSTER_SPEC"])
        assert spec["cluster"] == {"workerpool0": cluster["chief"], "workerpool1": cluster["worker"]}
    assert json.loads(seen["worker-1"]["env"]["CLUSTER_SPEC"])["task"] == {"type": "workerpool1", "index": 1}
    # Output is prefixed on screen and kept per replica.
    assert "[job worker-1] hello from worker-1" in screen
    assert "pool 2 (2 replica(s), rs) is not run locally" in screen
    assert "hello from chief-0" in (tmp_path / "logs" / "chief-0.log").read_text()


def test_a_failing_replica_fails_the_job_with_its_log_tail(tmp_path: Path) -> None:
    with pytest.raises(
        jobs.JobFailed, match=r"replica worker-0 exited with status 3 .*\n(.*\n)* +something broke"
    ):
        run(tmp_path, "fail", restart_job_on_worker_restart=True)


def test_a_killed_replica_restarts_the_whole_job(tmp_path: Path) -> None:
    result, screen = run(tmp_path, "die-once", restart_job_on_worker_restart=True)
    assert result.attempts == 2, screen
    assert "worker-0 was killed by signal 9 (SIGKILL): restarting the whole job (1/3 restarts)" in screen


def test_a_replica_that_stopped_on_sigterm_restarts_the_whole_job(tmp_path: Path) -> None:
    """Status 143 is the trainer's exit after saving its backup on SIGTERM: a restart, not a failure."""
    result, screen = run(tmp_path, "term-once", restart_job_on_worker_restart=True)
    assert result.attempts == 2, screen
    assert "worker-0 exited with status 143 (it stopped on SIGTERM): restarting the whole job" in screen


def test_a_killed_replica_restarts_alone_without_restart_job_on_worker_restart(tmp_path: Path) -> None:
    """As Vertex restarts a replica's VM whatever restart_job_on_worker_restart says."""
    result, screen = run(tmp_path, "die-once", restart_job_on_worker_restart=False)
    assert result.attempts == 1, screen
    assert "worker-0 was killed by signal 9 (SIGKILL): restarting it" in screen
    assert screen.count("hello from worker-0") == 2 and screen.count("hello from chief-0") == 1
    assert (tmp_path / "logs" / "worker-0.log").read_text().count("--- attempt 1") == 2
    # A new VM: nothing the killed process left in its temporary folder is there for the restart.
    assert json.loads((tmp_path / "worker-0.json").read_text())["tmp"] == []


def test_output_that_is_not_utf8_neither_stops_the_log_nor_hides_the_error(tmp_path: Path) -> None:
    with pytest.raises(jobs.JobFailed) as failed:
        run(tmp_path, "latin1-then-fail", timeout="60s")
    assert "REAL ERROR: bad image" in str(failed.value)
    assert "REAL ERROR: bad image" in (tmp_path / "logs" / "worker-0.log").read_text()


def test_what_a_failed_replica_started_does_not_outlive_the_job(tmp_path: Path) -> None:
    with pytest.raises(jobs.JobFailed):
        run(tmp_path, "leave-a-child")
    import psutil

    child = int((tmp_path / "child.pid").read_text())
    deadline = time.monotonic() + 10
    while True:  # SIGTERMed with its group: gone at once, or a zombie until init reaps it
        try:
            if psutil.Process(child).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        assert time.monotonic() < deadline, "the replica's child is still running"
        time.sleep(0.1)


def test_restarts_are_bounded_and_the_error_names_the_signal(tmp_path: Path) -> None:
    for restart_job in (False, True):
        with pytest.raises(jobs.JobFailed) as failed:
            run(tmp_path, "die-always", restart_job_on_worker_restart=restart_job, max_restarts=2)
        first_line = str(failed.value).splitlines()[0]
        assert first_line.startswith(
            "job: replica worker-0 was killed by signal 9 (SIGKILL) after 2 restart(s) (log: "
        ), first_line


def test_the_exit_descriptions() -> None:
    assert jobs.describe_exit(-9) == "was killed by signal 9 (SIGKILL)"
    assert jobs.describe_exit(-15) == "was killed by signal 15 (SIGTERM)"
    assert jobs.describe_exit(143) == "exited with status 143 (it stopped on SIGTERM)"
    assert jobs.describe_exit(1) == "exited with status 1"
    assert jobs.TERMINATED == 128 + signal.SIGTERM


def test_replicas_temporary_files_stay_in_the_job_and_are_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each replica's TMPDIR is a folder of the job's, deleted after each attempt: what a replica
    killed by SIGKILL left there goes too, and the machine's temporary folder stays as it was."""
    machine_tmp = tmp_path / "machine-tmp"
    machine_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(machine_tmp))
    result, screen = run(tmp_path, "die-once", restart_job_on_worker_restart=True)
    assert result.attempts == 2, screen
    seen = json.loads((tmp_path / "worker-0.json").read_text())["env"]["TMPDIR"]
    assert seen == str(tmp_path / "logs" / ".tmp" / "worker-0")
    assert not (tmp_path / "logs" / ".tmp").exists()
    assert list(machine_tmp.iterdir()) == []


def test_cancel_sends_sigterm_waits_for_the_replicas_and_restarts_nothing(tmp_path: Path) -> None:
    cancel = threading.Event()
    screen = WhenSeen(
        "worker-1 training", cancel.set, count=3, also=("chief-0 training", "worker-0 training")
    )
    start = time.monotonic()
    with pytest.raises(jobs.JobCancelled, match="job was cancelled; every replica was stopped"):
        jobs.run_job(
            specs(tmp_path, "save-on-term"),
            str(tmp_path / "base"),
            display_name="job",
            project="proj",
            log_dir=tmp_path / "logs",
            restart_job_on_worker_restart=True,
            cancel=cancel,
            out=screen,
        )
    assert time.monotonic() - start < 20
    # Every replica got SIGTERM and had the time to save (its handler ran), none was restarted.
    assert sorted(p.name for p in tmp_path.glob("*.saved")) == [
        "chief-0.saved",
        "worker-0.saved",
        "worker-1.saved",
    ]
    assert "restarting" not in screen.getvalue()
    pids = [json.loads(p.read_text())["pid"] for p in tmp_path.glob("*-*.json")]
    assert not [pid for pid in pids if alive(pid)]


def test_a_sigterm_whose_exception_python_dropped_still_stops_the_job(tmp_path: Path) -> None:
    """The runner's SIGTERM handler raises KeyboardInterrupt, which Python drops when the handler
    runs inside a `__del__`, a weakref callback or C code that clears errors
    (trainer.prepare.sigterm_unwinds): the signal is recorded too, and the supervising loop
    raises it, stopping every replica (each saves on its SIGTERM). Here the record is made as the
    handler leaves it when its exception was dropped (tests/trainer/test_prepare_inputs.py drops
    one for real, in a `__del__`)."""
    screen = WhenSeen(
        "worker-1 training", jobs._SIGTERM.set, count=3, also=("chief-0 training", "worker-0 training")
    )
    with pytest.raises(KeyboardInterrupt):
        jobs.run_job(
            specs(tmp_path, "save-on-term"),
            str(tmp_path / "base"),
            display_name="job",
            project="proj",
            log_dir=tmp_path / "logs",
            out=screen,
        )
    assert len(list(tmp_path.glob("*.saved"))) == 3
    pids = [json.loads(p.read_text())["pid"] for p in tmp_path.glob("*-*.json")]
    assert not [pid for pid in pids if alive(pid)]


def test_a_replica_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    cancel = threading.Event()
    screen = WhenSeen("training", cancel.set, count=3)
    start = time.monotonic()
    with pytest.raises(jobs.JobCancelled):
        jobs.run_job(
            specs(tmp_path, "ignore-term"),
            str(tmp_path / "base"),
            display_name="job",
            project="proj",
            log_dir=tmp_path / "logs",
            grace_seconds=1.5,
            cancel=cancel,
            out=screen,
        )
    assert 1.5 <= time.monotonic() - start < 15
    pids = [json.loads(p.read_text())["pid"] for p in tmp_path.glob("*-*.json")]
    assert len(pids) == 3 and not [pid for pid in pids if alive(pid)]


# The runner as `make run` has it: the main thread of its own process, stopped by Ctrl-C.
RUNNER = r"""
import json, sys
from local import jobs
specs = json.loads(sys.argv[1])
jobs.run_job(specs, sys.argv[2] + "/base", display_name="job", project="proj", log_dir=sys.argv[2] + "/logs",
             restart_job_on_worker_restart=True)
"""


def test_ctrl_c_to_the_runner_lets_every_replica_save_then_stops_it(tmp_path: Path) -> None:
    machine_tmp = tmp_path / "machine-tmp"
    machine_tmp.mkdir()
    runner = subprocess.Popen(
        [sys.executable, "-c", RUNNER, json.dumps(specs(tmp_path, "save-on-term")), str(tmp_path)],
        cwd=jobs.ROOT,
        env={**os.environ, "TMPDIR": str(machine_tmp)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert runner.stdout is not None
    started: set[str] = set()
    for line in runner.stdout:
        if line.rstrip().endswith(" training"):
            started.add(line.split()[1])
        if len(started) == 3:
            break
    runner.send_signal(signal.SIGINT)
    rest, _ = runner.communicate(timeout=30)
    assert runner.returncode != 0 and "KeyboardInterrupt" in rest, rest
    assert sorted(p.name for p in tmp_path.glob("*.saved")) == [
        "chief-0.saved",
        "worker-0.saved",
        "worker-1.saved",
    ]
    assert "restarting" not in rest
    # Nothing left in the machine's temporary folder, nor in the job's.
    assert list(machine_tmp.iterdir()) == [] and not (tmp_path / "logs" / ".tmp").exists()


class WhenSeen(io.StringIO):
    """The job's screen: calls `action` once `text` has been written `count` times in all
    (each of `also` counting too)."""

    def __init__(self, text: str, action: Any, count: int = 1, also: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.texts, self.action, self.left = (text, *also), action, count
        self.lock = threading.Lock()

    def write(self, text: str) -> int:
        with self.lock:
            if self.left > 0:
                self.left -= sum(text.count(t) for t in self.texts)
                if self.left <= 0:
                    self.action()
            return super().write(text)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "State:\tZ" in status.read_text())


def test_timeout_stops_every_replica(tmp_path: Path) -> None:
    start = time.monotonic()
    with pytest.raises(jobs.JobFailed, match="ran past its timeout of 2s"):
        run(tmp_path, "hang", timeout="2s")
    assert time.monotonic() - start < 20
    pids = [json.loads(p.read_text())["pid"] for p in tmp_path.glob("*-*.json")]
    assert len(pids) == 3
    assert not [pid for pid in pids if alive(pid)], "replicas outlived the job"


@pytest.mark.parametrize(
    ("pools", "match"),
    [
        ([], "needs pool 0"),
        ([{"replica_count": 2, "container_spec": {"command": ["x"]}}], "exactly one replica"),
        ([{"replica_count": 1, "container_spec": {"image_uri": "i"}}], "pool 0 has no command"),
        # What Vertex's CustomJob would refuse, the local runner refuses too.
        (
            [{"replica_count": 1, "container_spec": {"image_uri": "i", "comand": ["x"]}}],
            'would be refused by Vertex AI: pool 0: .*no field named "comand"',
        ),
        (
            [
                {
                    "replica_count": 1,
                    "machine_spec": {"machine_type": "n1-standard-8", "accelerator_type": "V100"},
                    "container_spec": {"image_uri": "i", "command": ["x"]},
                }
            ],
            "pool 0: .*Invalid enum value V100 for enum type google.cloud.aiplatform.v1.AcceleratorType",
        ),
        ([{"replica_count": 1.5, "container_spec": {"image_uri": "i", "command": ["x"]}}], "pool 0: .*1.5"),
    ],
)
def test_bad_specs(pools: list[dict[str, Any]], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        jobs.replicas(pools)


def test_durations() -> None:
    assert jobs.parse_duration("86400s") == 86400 and jobs.parse_duration("1.5s") == 1.5
    with pytest.raises(ValueError, match="timeout must be a duration like '3600s'"):
        jobs.parse_duration("1h")


# --- the cause of a failure, where the user reads it -----------------------------------------

# A kfp.local step running local_custom_job, as kfp.local runs it: the component's exception and
# its traceback end up in the step's log, after everything the replicas printed.
STEP = r"""
import json, sys
from local import jobs
jobs.run_job(json.loads(sys.argv[1]), sys.argv[2] + "/base", display_name="prepare", project="proj",
             log_dir=sys.argv[2] + "/logs", max_restarts=1, out=sys.stdout)
"""


def test_the_step_error_names_the_killed_replica_and_the_signal(tmp_path: Path) -> None:
    from launch import kfp_local

    pools = specs(tmp_path, "die-always")
    log = tmp_path / "prepare-dataset.log"
    with log.open("w") as out:
        code = subprocess.run(
            [sys.executable, "-c", STEP, json.dumps(pools), str(tmp_path)],
            cwd=jobs.ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        ).returncode
    assert code == 1
    error = kfp_local.step_error(str(log))
    assert error.startswith(
        "JobFailed: prepare: replica worker-0 was killed by signal 9 (SIGKILL) after 1 restart(s) (log: "
    ), log.read_text()[-3000:]


def test_a_step_log_without_a_traceback_has_no_error(tmp_path: Path) -> None:
    from launch import kfp_local

    (tmp_path / "a.log").write_text("all good\n")
    assert kfp_local.step_error(str(tmp_path / "a.log")) == ""
    assert kfp_local.step_error(str(tmp_path / "missing.log")) == ""


def test_a_killed_serving_check_is_reported_as_killed_not_as_a_model_that_does_not_serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kfp import dsl

    from local import steps

    real_run = subprocess.run

    def run(cmd: Any, *args: Any, **kwargs: Any) -> Any:
        if list(cmd[1:3]) != ["-m", "trainer.serve"]:
            return real_run(cmd, *args, **kwargs)
        return subprocess.CompletedProcess(cmd, -9, stdout="", stderr="loading the model")

    monkeypatch.setattr(subprocess, "run", run)
    with pytest.raises(RuntimeError) as raised:
        steps.local_upload_model.python_func(
            model=dsl.Model(uri=str(tmp_path / "model")),
            registry_dir=str(tmp_path / "registry"),
            model_display_name="m",
            serving_image="us-docker.pkg.dev/p/r/trainer-serving@sha256:" + "0" * 64,  # this interpreter
            artifact_uri=str(tmp_path / "model"),
            predict_route="",
            labels={},
            promote=True,
            gate_reason="",
            description="",
            evaluated_champion="",
            evaluation_dir=str(tmp_path / "evaluation"),
        )
    message = str(raised.value)
    assert "was killed by signal 9 (SIGKILL) before it finished" in message
    assert "does not serve" not in message
    assert not (tmp_path / "registry").exists()


# --- the local tuner ---------------------------------------------------------------------------

# A trial: val_accuracy peaks at learning_rate 0.003; fails outright when dropout > 0.45.
TRIAL = r"""
import json, math, os, sys
flags = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--"))
if os.environ["TF_CONFIG"] and json.loads(os.environ["TF_CONFIG"])["task"]["type"] != "chief":
    sys.exit(0)
if float(flags["dropout"]) > 0.45:
    sys.exit("diverged")
score = 1 - abs(math.log10(float(flags["learning_rate"])) - math.log10(0.003)) / 3
path = os.environ["CLOUD_ML_HP_METRIC_FILE"]
os.makedirs(os.path.dirname(path), exist_ok=True)
with open(path, "w") as f:
    for step in (1, 2):
        f.write(json.dumps({"val_accuracy": score * step / 2, "global_step": str(step)}) + "\n")
with open(os.path.join(os.environ["AIP_MODEL_DIR"].rstrip("/") + ".flags"), "w") as f:
    json.dump(flags, f)
"""


def tune(tmp_path: Path, **kwargs: Any) -> list[dict[str, Any]]:
    script = tmp_path / "trial.py"
    script.write_text(TRIAL)
    container = {"image_uri": "img", "command": [sys.executable, str(script)], "args": ["--epochs=2"]}
    pools = [
        {"replica_count": 1, "container_spec": container},
        {"replica_count": 1, "container_spec": container},
    ]
    args: dict[str, Any] = {"max_trial_count": 4, "parallel_trial_count": 2, "out": io.StringIO()}
    return tuner.run_tuning(
        pools,
        str(tmp_path / "tune"),
        tuning.study_metrics(),
        tuning.VERTEX_SEARCH_SPACE,
        **{**args, **kwargs},
    )


def test_trials_honour_the_study(tmp_path: Path) -> None:
    table = tune(tmp_path, algorithm="RANDOM_SEARCH", seed=3)
    assert [t["id"] for t in table] == ["1", "2", "3", "4"]
    for t in table:
        params = {p["parameterId"]: p["value"] for p in t["parameters"]}
        assert 1e-4 <= params["learning_rate"] <= 1e-2
        # Numbers are doubles, as in Vertex's Trial.Parameter.value (a protobuf Value).
        assert 32 <= params["dense_units"] <= 1024 and float(params["dense_units"]).is_integer()
        assert all(isinstance(v, float) for v in params.values())
        assert params["per_replica_batch_size"] in (16, 32, 64)
        assert 0 <= params["dropout"] <= 0.5
        if t["state"] == "SUCCEEDED":
            # Each trial ran in its own folder, got its values as flags, and the best
            # measurement (BEST_MEASUREMENT, the GCPC default) is the final one.
            flags = json.loads((tmp_path / "tune" / t["id"] / "model.flags").read_text())
            assert float(flags["learning_rate"]) == params["learning_rate"]
            # INTEGER and DISCRETE values reach the trial formatted as Vertex formats them.
            assert flags["dense_units"] == f"{params['dense_units']:.1f}"
            assert flags["per_replica_batch_size"] in ("16.0", "32.0", "64.0")
            assert flags["epochs"] == "2"
            assert t["finalMeasurement"]["stepCount"] == "2"
        else:
            assert t["state"] == "INFEASIBLE" and "exited with status 1" in t["infeasibleReason"]
            assert params["dropout"] > 0.45
    best = tuning.pick_best_trial(table, "val_accuracy", "MAXIMIZE")
    assert best["value"] == max(
        t["finalMeasurement"]["metrics"][0]["value"] for t in table if t["state"] == "SUCCEEDED"
    )


def test_learning_rate_is_sampled_on_a_log_scale(tmp_path: Path) -> None:
    import optuna

    spec = tuner.parse_study(tuning.study_metrics(), tuning.VERTEX_SEARCH_SPACE)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    rates = [tuner.suggest(study.ask(), spec)["learning_rate"] for _ in range(400)]
    below = sum(r < 1e-3 for r in rates) / len(rates)  # log scale: half of [1e-4, 1e-2] is below 1e-3
    assert 0.4 < below < 0.6


def test_grid_search_rejects_double_parameters() -> None:
    spec = tuner.parse_study(tuning.study_metrics(), tuning.VERTEX_SEARCH_SPACE)
    with pytest.raises(ValueError, match="GRID_SEARCH needs integer, discrete or categorical parameters"):
        tuner.make_sampler("GRID_SEARCH", spec, 0)
    with pytest.raises(ValueError, match="search algorithm must be"):
        tuner.make_sampler("BAYES", spec, 0)


def test_too_many_failed_trials_fail_the_job(tmp_path: Path) -> None:
    params = [p for p in tuning.VERTEX_SEARCH_SPACE if p["parameter_id"] != "dropout"]
    params.append({"parameter_id": "dropout", "double_value_spec": {"min_value": 0.46, "max_value": 0.5}})
    script = tmp_path / "trial.py"
    script.write_text(TRIAL)
    container = {"image_uri": "img", "command": [sys.executable, str(script)], "args": []}
    with pytest.raises(RuntimeError, match="every trial failed"):
        tuner.run_tuning(
            [{"replica_count": 1, "container_spec": container}],
            str(tmp_path / "tune"),
            tuning.study_metrics(),
            params,
            max_trial_count=2,
            parallel_trial_count=1,
            out=io.StringIO(),
        )
    with pytest.raises(RuntimeError, match=r"1 trials failed \(max_failed_trial_count 1\)"):
        tuner.run_tuning(
            [{"replica_count": 1, "container_spec": container}],
            str(tmp_path / "tune2"),
            tuning.study_metrics(),
            params,
            max_trial_count=3,
            parallel_trial_count=1,
            max_failed_trial_count=1,
            out=io.StringIO(),
        )


def test_every_trial_value_the_study_can_produce_is_accepted_by_the_trainer() -> None:
    """The study's extremes and a discrete value, formatted as a Vertex trial gets them, parse
    with the trainer's own flags (a trial that exits 2 on `--dense_units=1024.0` is INFEASIBLE)."""
    from trainer.config import parse_args

    spec = tuner.parse_study(tuning.study_metrics(), tuning.VERTEX_SEARCH_SPACE)
    for p in spec.parameters:
        kind = type(p).pb(p).WhichOneof("parameter_value_spec")
        if kind == "discrete_value_spec":
            values = list(p.discrete_value_spec.values)
        elif kind == "integer_value_spec":
            values = [p.integer_value_spec.min_value, p.integer_value_spec.max_value]
        else:
            values = [p.double_value_spec.min_value, p.double_value_spec.max_value * 0.999]
        for value in values:
            flag = tuner.trial_flag(p.parameter_id, value)
            config = parse_args(["--data_dir=/d", "--model_dir=/m", flag], {})
            assert float(getattr(config, p.parameter_id)) == float(value), flag
    assert tuner.trial_flag("dense_units", 512) == "--dense_units=512.0"
    assert tuner.trial_flag("optimizer", "adam") == "--optimizer=adam"
