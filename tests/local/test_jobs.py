"""The local custom job runner and the local tuner, with small Python programs as replicas
(the real trainer runs in tests/test_local_run.py)."""

from __future__ import annotations

import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from components import tuning
from local import jobs, tuner

# A replica that records what Vertex would give it, then behaves as its flags say.
REPLICA = r"""
import json, os, signal, sys, time
out = sys.argv[1]
env = {k: os.environ.get(k) for k in ("TF_CONFIG", "CLUSTER_SPEC", "AIP_MODEL_DIR", "AIP_CHECKPOINT_DIR",
       "AIP_TENSORBOARD_LOG_DIR", "CLOUD_ML_PROJECT_ID", "CLOUD_ML_JOB_ID")}
task = json.loads(env["TF_CONFIG"])["task"]
name = f"{task['type']}-{task['index']}"
with open(os.path.join(out, name + ".json"), "w") as f:
    json.dump({"env": env, "argv": sys.argv[2:], "pid": os.getpid()}, f)
print(f"hello from {name}", flush=True)
mode = sys.argv[2] if len(sys.argv) > 2 else "ok"
if mode == "fail" and name == "worker-0":
    print("something broke", flush=True)
    sys.exit(3)
if mode == "die-once" and name == "worker-0" and not os.path.exists(os.path.join(out, "died")):
    open(os.path.join(out, "died"), "w").close()
    os.kill(os.getpid(), signal.SIGKILL)
if mode == "hang":
    time.sleep(600)
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
        jobs.JobFailed, match=r"replica worker-0 exited with status 3 .*\n(.*\n)*something broke"
    ):
        run(tmp_path, "fail", restart_job_on_worker_restart=True)


def test_a_killed_replica_restarts_the_whole_job(tmp_path: Path) -> None:
    result, screen = run(tmp_path, "die-once", restart_job_on_worker_restart=True)
    assert result.attempts == 2, screen
    assert "worker-0 was killed (signal 9): restarting the whole job" in screen


def test_a_killed_replica_fails_the_job_without_restarts(tmp_path: Path) -> None:
    with pytest.raises(jobs.JobFailed, match="replica worker-0 was killed by signal 9"):
        run(tmp_path, "die-once", restart_job_on_worker_restart=False)


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
        pools, str(tmp_path / "tune"), tuning.study_metrics(), tuning.study_parameters(), **{**args, **kwargs}
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

    spec = tuner.parse_study(tuning.study_metrics(), tuning.study_parameters())
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    rates = [tuner.suggest(study.ask(), spec)["learning_rate"] for _ in range(400)]
    below = sum(r < 1e-3 for r in rates) / len(rates)  # log scale: half of [1e-4, 1e-2] is below 1e-3
    assert 0.4 < below < 0.6


def test_grid_search_rejects_double_parameters() -> None:
    spec = tuner.parse_study(tuning.study_metrics(), tuning.study_parameters())
    with pytest.raises(ValueError, match="GRID_SEARCH needs integer, discrete or categorical parameters"):
        tuner.make_sampler("GRID_SEARCH", spec, 0)
    with pytest.raises(ValueError, match="search algorithm must be"):
        tuner.make_sampler("BAYES", spec, 0)


def test_too_many_failed_trials_fail_the_job(tmp_path: Path) -> None:
    params = [p for p in tuning.study_parameters() if p["parameter_id"] != "dropout"]
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

    spec = tuner.parse_study(tuning.study_metrics(), tuning.study_parameters())
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
