"""The barrage: bad inputs at every entry point a person types into, each refused with a clear
error that names the input, before any work, with no traceback and nothing written.

Entry points: `make run` on the local target and on Vertex (a made-up project: every request
would fail loudly, see `no_requests`), `make schedule` and the schedule commands, `--training_config`,
`python -m trainer.task`, `python -m trainer.prepare` and `python -m trainer.serve`. The Makefile
variables themselves (injection attempts, bad values through `make`) are the table of
tests/ci/test_makefile.py. docs/guarantees.md lists what these tables pin.

Each row: the command line (and settings), the exit code, and the words the error must contain
(the input's name, and what was wrong with it).
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from launch import cli, schedules, submit
from pipeline.options import local as local_rules

pytestmark = pytest.mark.hardening  # make test-hardening

SETTINGS = {
    "PROJECT_ID": "p-proj",
    "REGION": "us-central1",
    "PIPELINE_ROOT": "gs://p-proj-pipelines/root",
    "ARTIFACT_REPOSITORY": "us-central1-docker.pkg.dev/p-proj/training",
    "TEMPLATE_REPOSITORY": "https://us-central1-kfp.pkg.dev/p-proj/pipelines",
    "SERVICE_ACCOUNT": "pipelines@p-proj.iam.gserviceaccount.com",
    "API_ENDPOINT": "http://127.0.0.1:1",
}


@pytest.fixture
def no_requests(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """A folder with no env.sh to run in, and every way out to Google Cloud replaced by a failure:
    a refused input must never get as far as any of them."""

    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("a request was about to be sent for a bad input")

    for name in ("upload_context", "init_aiplatform", "build_pipeline_job"):
        monkeypatch.setattr(submit, name, refuse)
    monkeypatch.setattr(schedules, "upload_template", refuse)
    monkeypatch.chdir(tmp_path)
    yield tmp_path


def run_cli(argv: list[str], environ: dict[str, str]) -> tuple[int, str]:
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = cli.main(argv, environ)
        except SystemExit as exit_:
            code = int(exit_.code or 0)
    return code, out.getvalue() + err.getvalue()


def assert_refused(code: int, text: str, words: tuple[str, ...], expected_code: int = 2) -> None:
    assert code == expected_code, text[-2000:]
    assert "Traceback" not in text, text[-3000:]
    for word in words:
        assert word in text, f"{word!r} not in:\n{text[-2000:]}"


# --- make run: the local target ---------------------------------------------------------------

LOCAL: list[tuple[list[str], tuple[str, ...]]] = [
    # types: argparse names the flag and the value
    (["--epochs", "two"], ("--epochs", "'two'")),
    (["--epochs", "1.5"], ("--epochs", "'1.5'")),
    (["--learning_rate", "fast"], ("--learning_rate", "'fast'")),
    (["--tune", "maybe"], ("--tune", "expected true or false")),
    (["--xla", "2"], ("--xla", "expected true or false")),
    (["--labels", "team=ml"], ("--labels", "expected a JSON dict")),
    (["--labels", "[1]"], ("--labels", "expected a JSON dict")),
    (["--worker_count", ""], ("--worker_count",)),
    (["--target", "cloud"], ("--target", "invalid choice")),
    (["--no_such_flag", "1"], ("unrecognized arguments: --no_such_flag",)),
    # values: the rules name the parameter
    (["--epochs", "0"], ("epochs", "between 1 and 10000")),
    (["--epochs", "100000"], ("epochs", "between 1 and 10000")),
    (["--learning_rate", "0"], ("learning_rate", "(0, 1]")),
    (["--learning_rate=-1e-3"], ("learning_rate", "(0, 1]")),
    (["--learning_rate", "nan"], ("learning_rate",)),
    (["--per_replica_batch_size", "0"], ("per_replica_batch_size", "between 1 and 65536")),
    (["--dense_units", "-1"], ("dense_units",)),
    (["--dropout", "1"], ("dropout", "[0, 1)")),
    (["--dropout", "-0.1"], ("dropout",)),
    (["--image_size", "8"], ("image_size", "between 32 and 1024")),
    (["--image_size", "4096"], ("image_size", "between 32 and 1024")),
    (["--seed", "-1"], ("seed",)),
    (["--backbone", "vgg16"], ("backbone", "invalid choice: 'vgg16'")),
    (
        ["--backbone", "tiny", "--weights", "imagenet"],
        ("--weights imagenet is not available for --backbone tiny",),
    ),
    (["--weights", " "], ("weights",)),
    (["--fine_tune_fraction", "2"], ("fine_tune_fraction", "[0, 1]")),
    (["--fine_tune_fraction", "-0.5"], ("fine_tune_fraction", "-1 (the trainer's default)")),
    (["--dataset_shards", "0"], ("dataset_shards",)),
    (["--dataset_shards", "1", "--worker_count", "3"], ("dataset_shards", "give at least 4")),
    (["--synthetic_per_class", "1"], ("synthetic_per_class", "between 3 and 100000")),
    (["--dataset_source", "imagenet"], ("dataset_source", "tfds:NAME")),
    (["--dataset_source", "folder:/no/such/folder"], ("dataset_source", "no such folder")),
    (["--dataset_source", "folder:gs://bucket/images"], ("dataset_source", "no such folder")),
    (["--dataset_source", "tfds:"], ("dataset_source",)),
    (["--worker_count", "-1"], ("worker_count", "from 0 to 512")),
    (["--worker_count", "9"], ("worker_count", "max 8")),
    (["--chief_machine_type", "big machine"], ("chief_machine_type", "not a Compute Engine machine type")),
    (["--worker_machine_type", "n1_standard_8"], ("worker_machine_type",)),
    (
        ["--chief_accelerator_type", "NVIDIA_TESLA_T4", "--chief_accelerator_count", "1"],
        (
            "chief_accelerator_count",
            "asked for 1 x NVIDIA_TESLA_T4",
            "sees 0 GPUs",
            "refusing to train on CPU",
        ),
    ),
    (["--chief_accelerator_count", "2"], ("chief_accelerator_count", "without an accelerator type")),
    (
        ["--chief_accelerator_type", "NVIDIA_TESLA_K80", "--chief_accelerator_count", "1"],
        ("NVIDIA_TESLA_K80 cannot be used",),
    ),
    (["--boot_disk_type", "ssd"], ("boot_disk_type", "pd-ssd")),
    (["--boot_disk_size_gb", "10"], ("boot_disk_size_gb", "from 100 to 64000")),
    (["--reduction_server_count", "-2"], ("reduction_server_count",)),
    (["--reduction_server_count", "1"], ("reduction_server_count", "needs GPU workers")),
    (["--prepare_machine_type", "Big"], ("prepare_machine_type",)),
    (["--timeout", "30m"], ("timeout", "like '86400s'")),
    (["--timeout", "0s"], ("timeout",)),
    (["--scheduling_strategy", "spot"], ("scheduling_strategy", "did you mean SPOT?")),
    (["--scheduling_strategy", "CHEAP"], ("scheduling_strategy", "STANDARD, SPOT, FLEX_START")),
    (["--scheduling_strategy", "FLEX_START"], ("scheduling_strategy", "FLEX_START needs")),
    (["--service_account", "me@gmail.com"], ("service_account", "not a service account")),
    (["--network", "default"], ("network", "projects/<project number>/global/networks")),
    (["--encryption_spec_key_name", "my-key"], ("encryption_spec_key_name", "keyRings")),
    (
        ["--tensorboard", "projects/1/locations/us-central1/tensorboards/2"],
        ("tensorboard", "service_account"),
    ),
    (["--labels", '{"Team": "ml"}'], ("labels", "label key 'Team'")),
    (["--labels", '{"team": "ML Ops"}'], ("labels", "team='ML Ops'")),
    (["--labels", '{"team": 3}'], ("labels", "keys and values must be strings")),
    (["--search_algorithm", "BAYES"], ("search_algorithm", "must be one of")),
    (["--tune", "true", "--search_algorithm", "GRID_SEARCH"], ("search_algorithm", "GRID_SEARCH needs")),
    (["--max_trial_count", "0"], ("max_trial_count", "1 or more")),
    (["--parallel_trial_count", "3"], ("parallel_trial_count", "from 1 to max_trial_count")),
    (["--max_failed_trial_count", "-1"], ("max_failed_trial_count", "0 or more")),
    (["--min_score", "90"], ("min_score", "from 0 to 1")),
    (["--gate_metric", "f1"], ("gate_metric", "accuracy, macro_f1")),
    (["--export_epoch", "first"], ("export_epoch", "best")),
    (["--early_stopping_patience", "-1"], ("early_stopping_patience", ">= 0")),
    (["--model_display_name", ""], ("model_display_name", "required")),
    (["--model_display_name", "x" * 129], ("model_display_name", "at most 128")),
    (["--serving_image", "latest"], ("serving_image", "prebuilt, custom or an image URI")),
    (["--serving_tf_version", "2.21"], ("serving_tf_version", "no prebuilt")),
    (["--serving_tf_version", "2.14"], ("serving_tf_version", "no local serving environment")),
    (["--serving_accelerator", "tpu"], ("serving_accelerator", "cpu or gpu")),
    (["--check_gpu_region", "perhaps"], ("--check_gpu_region",)),
    # numbers every comparison lets through, and values that cannot work
    (["--fine_tune_fraction", "nan"], ("fine_tune_fraction", "must be a finite number")),
    (["--learning_rate", "inf"], ("learning_rate", "must be a finite number")),
    (["--timeout", "0.001s"], ("timeout", "give at least '60s'")),
    (["--weights", "missing.h5"], ("weights", "missing.h5: no such file")),
    (["--weights", "/"], ("weights", "not a regular file")),
    (["--weights", "gs://b/w.h5"], ("weights", "Cloud Storage is not reachable from a local run")),
    (["--registry_dir", ""], ("registry_dir", "is empty")),
    (
        ["--tune", "true", "--max_trial_count", "6", "--parallel_trial_count", "6", "--worker_count", "1"],
        ("parallel_trial_count", "12 trainer processes", "give parallel_trial_count at most 4"),
    ),
]


@pytest.mark.parametrize(("flags", "words"), LOCAL, ids=[" ".join(f)[:60] for f, _ in LOCAL])
def test_make_run_local_refuses(flags: list[str], words: tuple[str, ...], no_requests: Path) -> None:
    runs = no_requests / "runs"
    code, text = run_cli(["run", "--target", "local", "--runs_dir", str(runs), *flags], {})
    assert_refused(code, text, words)
    assert not runs.exists(), "a refused local run wrote its run folder"


def test_every_bad_local_flag_is_named_in_one_error(no_requests: Path) -> None:
    code, text = run_cli(
        [
            "run",
            "--target",
            "local",
            "--epochs",
            "0",
            "--dropout",
            "2",
            "--timeout",
            "1h",
            "--labels",
            '{"A": "b"}',
        ],
        {},
    )
    assert_refused(code, text, ("epochs", "dropout", "timeout", "labels"))


def test_a_registry_dir_that_is_a_file_is_refused_before_any_step(no_requests: Path) -> None:
    (no_requests / "registry").write_text("not a folder")
    code, text = run_cli(["run", "--target", "local", "--registry_dir", str(no_requests / "registry")], {})
    assert_refused(code, text, ("registry_dir", "is not a folder"))


def test_weights_that_are_not_an_hdf5_file_are_refused_before_any_step(no_requests: Path) -> None:
    (no_requests / "model.keras").write_bytes(b"PK\x03\x04 a zip, not HDF5")
    code, text = run_cli(["run", "--target", "local", "--weights", str(no_requests / "model.keras")], {})
    assert_refused(code, text, ("weights", "not an HDF5 weights file"))


def test_a_runs_folder_that_is_a_file_or_a_latest_that_is_not_a_link_is_refused(no_requests: Path) -> None:
    (no_requests / "runs").write_text("mine")
    code, text = run_cli(["run", "--target", "local", "--runs_dir", str(no_requests / "runs")], {})
    assert_refused(code, text, ("--runs_dir", "is not a folder"))
    assert (no_requests / "runs").read_text() == "mine"
    runs = no_requests / "runs2"
    (runs / "latest").mkdir(parents=True)
    (runs / "latest" / "notes.txt").write_text("keep me")
    code, text = run_cli(["run", "--target", "local", "--runs_dir", str(runs)], {})
    assert_refused(code, text, ("latest is a folder", "never deleted"))
    (runs / "latest" / "notes.txt").unlink()
    (runs / "latest").rmdir()
    (runs / "latest").write_text("my file called latest")
    code, text = run_cli(["run", "--target", "local", "--runs_dir", str(runs)], {})
    assert_refused(code, text, ("latest is a file",))
    assert (runs / "latest").read_text() == "my file called latest"
    assert sorted(p.name for p in runs.iterdir()) == ["latest"]


def test_a_runs_folder_on_a_nearly_full_file_system_is_refused(
    no_requests: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    usage = shutil.disk_usage(no_requests)
    monkeypatch.setattr(cli.shutil, "disk_usage", lambda path: usage._replace(free=100 * 2**20))
    code, text = run_cli(["run", "--target", "local", "--runs_dir", str(no_requests / "runs")], {})
    assert_refused(code, text, ("--runs_dir", "100 MiB free", "at least 1 GiB"))


def test_a_python_whose_path_has_a_space_is_refused_before_anything_starts(
    no_requests: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kfp.local writes sys.executable unquoted into each step's shell script."""
    monkeypatch.setattr(cli.sys, "executable", "/home/me/my projects/.venv/bin/python")
    code, text = run_cli(["run", "--target", "local", "--runs_dir", str(no_requests / "runs")], {})
    assert_refused(code, text, ("my projects",))
    assert not (no_requests / "runs").exists()


def test_a_tfds_source_that_would_need_a_download_without_the_internet_is_refused_in_seconds(
    no_requests: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_dir = no_requests / "tfds"
    monkeypatch.setenv("TFDS_DATA_DIR", str(data_dir))
    probes: list[bool] = []

    def unreachable() -> bool:
        probes.append(True)
        return False

    monkeypatch.setattr(local_rules, "internet_reachable", unreachable)
    runs = no_requests / "runs"
    argv = ["run", "--target", "local", "--runs_dir", str(runs), "--dataset_source", "tfds:mnist"]
    code, text = run_cli(argv, {})
    assert_refused(code, text, ("tfds:mnist", "not prepared in", "cannot reach the internet"))
    assert probes and not runs.exists()
    # Prepared already (TFDS's layout): no download, no probe, not refused for it.
    (data_dir / "mnist" / "3.0.1").mkdir(parents=True)
    (data_dir / "mnist" / "3.0.1" / "dataset_info.json").write_text("{}")
    probes.clear()
    assert local_rules.tfds_source_problem("tfds:mnist", {"TFDS_DATA_DIR": str(data_dir)}) == ""
    assert not probes


def _tiny_folder(root: Path, per_class: int) -> Path:
    from PIL import Image

    for name in ("cat", "dog"):
        (root / "train" / name).mkdir(parents=True)
        for i in range(per_class):
            Image.new("RGB", (8, 8), (i * 20, 0, 0)).save(root / "train" / name / f"{i}.png")
    return root


def test_a_folder_source_is_judged_by_the_preparations_rules_before_any_step(no_requests: Path) -> None:
    runs = no_requests / "runs"
    code, text = run_cli(
        ["run", "--target", "local", "--runs_dir", str(runs), "--dataset_source", "folder:/"], {}
    )
    assert_refused(code, text, ("dataset_source", "trainer.prepare says"))
    folder = _tiny_folder(no_requests / "images", per_class=10)
    (folder / "train" / "cat" / "huge.png").write_bytes(
        b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + (20000).to_bytes(4, "big") * 2 + b"\x08\x02\x00\x00\x00"
    )
    code, text = run_cli(
        ["run", "--target", "local", "--runs_dir", str(runs), "--dataset_source", f"folder:{folder}"], {}
    )
    assert_refused(code, text, ("dataset_source", "huge.png", "20000x20000"))
    (folder / "train" / "cat" / "huge.png").unlink()
    # 20 images: 14 to train once validation and test are carved out; 16 x 2 replicas is too many.
    code, text = run_cli(
        ["run", "--target", "local", "--runs_dir", str(runs), "--dataset_source", f"folder:{folder}"], {}
    )
    assert_refused(code, text, ("per_replica_batch_size", "a global batch of 32", "at most"))
    assert not runs.exists()


def test_a_runs_folder_that_cannot_be_written_is_refused(no_requests: Path) -> None:
    locked = no_requests / "locked"
    locked.mkdir(mode=0o500)
    if os.access(locked, os.W_OK):
        pytest.skip("running as a user who can write anywhere (root): no read-only folder to test")
    code, text = run_cli(["run", "--target", "local", "--runs_dir", str(locked / "runs")], {})
    assert_refused(code, text, ("--runs_dir", "cannot be created in"))


# --- make run: Vertex, with a made-up project -------------------------------------------------

VERTEX: list[tuple[list[str], dict[str, str], tuple[str, ...]]] = [
    (["--scheduling_strategy", "spot"], {}, ("scheduling_strategy", "did you mean SPOT?")),
    (["--scheduling_strategy", "FLEX_START"], {}, ("scheduling_strategy", "L4, A100, H100, H200 or B200")),
    (
        [
            *("--scheduling_strategy", "FLEX_START", "--chief_machine_type", "a3-highgpu-8g"),
            *("--chief_accelerator_type", "NVIDIA_H100_80GB", "--chief_accelerator_count", "8"),
            *("--worker_count", "0", "--timeout", "700000s"),
        ],
        {},
        ("timeout", "at most 7 days"),
    ),
    (["--tune", "true", "--search_algorithm", "GRID_SEARCH"], {}, ("search_algorithm", "DOUBLE")),
    (["--weights", "/home/me/w.h5"], {}, ("weights", "only Cloud Storage is reachable")),
    (["--timeout", "5s"], {}, ("timeout", "give at least '60s'")),
    (["--dropout", "nan"], {}, ("dropout", "must be a finite number")),
    (
        ["--tensorboard", "projects/1/locations/us-central1/tensorboards/2"],
        {"SERVICE_ACCOUNT": ""},
        ("tensorboard", "service_account is required"),
    ),
    (
        ["--tensorboard", "projects/1/locations/europe-west4/tensorboards/2"],
        {},
        ("tensorboard", "europe-west4"),
    ),
    (
        ["--encryption_spec_key_name", "projects/p/locations/europe-west4/keyRings/r/cryptoKeys/k"],
        {},
        ("encryption_spec_key_name", "europe-west4"),
    ),
    (["--chief_accelerator_type", "NVIDIA_TESLA_K80"], {}, ("chief_accelerator_type", "end of support")),
    (["--worker_accelerator_type", "NVIDIA_GB200"], {}, ("worker_accelerator_type", "Arm")),
    (["--chief_accelerator_type", "NVIDIA_TESLA_X1"], {}, ("unknown accelerator type 'NVIDIA_TESLA_X1'",)),
    (["--chief_accelerator_count", "3"], {}, ("chief_accelerator_count", "takes 1 or 2 or 4 or 8")),
    (
        ["--worker_machine_type", "a2-highgpu-1g"],
        {},
        ("worker_accelerator_type", "comes with 1 x NVIDIA_TESLA_A100"),
    ),
    (
        [],
        {
            "REGION": "southamerica-east1",
            "ARTIFACT_REPOSITORY": "southamerica-east1-docker.pkg.dev/p-proj/t",
            "TEMPLATE_REPOSITORY": "",
        },
        ("NVIDIA_TESLA_V100 is not offered in southamerica-east1", "check_gpu_region=false"),
    ),
    (["--dataset_source", "folder:/home/me/leaves"], {}, ("dataset_source", "folder:gs://")),
    (["--labels", '{"env": "Prod"}'], {}, ("labels", "env='Prod'")),
    (["--notification_emails", '["not-an-address"]'], {}, ("notification_emails", "not e-mail addresses")),
    (
        ["--notification_emails", '["a@x.io", "b@x.io", "c@x.io", "d@x.io"]'],
        {},
        ("notification_emails", "one to three"),
    ),
    (["--notification_emails", '"a@x.io"'], {}, ("--notification_emails", "expected a JSON list")),
    (["--build_location", "mars-1"], {}, ("build_location", "not a Cloud Build location")),
    (["--persistent_resource_id", "Warm_Pool"], {}, ("persistent_resource_id", "persistent resource's ID")),
    (
        ["--persistent_resource_id", "warm-pool", "--scheduling_strategy", "SPOT"],
        {},
        ("persistent_resource_id, scheduling_strategy", "STANDARD"),
    ),
    (["--serving_tf_version", "2.16"], {}, ("serving_tf_version", "no prebuilt")),
    (
        ["--epochs", "0", "--labels", '{"A": "b"}', "--scheduling_strategy", "x"],
        {},
        ("epochs", "labels", "scheduling_strategy"),
    ),
    (["--registry_dir", "x"], {}, ("unrecognized arguments: --registry_dir",)),
    # settings: each names the setting
    ([], {"REGION": "mars-central1"}, ("REGION='mars-central1' is not a Vertex AI region",)),
    ([], {"REGION": "us-centrall1"}, ("closest: us-central1",)),
    ([], {"PIPELINE_ROOT": "my-bucket"}, ("PIPELINE_ROOT='my-bucket' is not valid",)),
    ([], {"PIPELINE_ROOT": ""}, ("PIPELINE_ROOT is not set",)),
    (
        [],
        {"ARTIFACT_REPOSITORY": "docker.io/me/trainer"},
        ("ARTIFACT_REPOSITORY='docker.io/me/trainer' is not valid",),
    ),
    (
        [],
        {"ARTIFACT_REPOSITORY": "europe-west4-docker.pkg.dev/p-proj/t"},
        ("ARTIFACT_REPOSITORY", "not in REGION us-central1"),
    ),
    ([], {"SERVICE_ACCOUNT": "me@gmail.com"}, ("SERVICE_ACCOUNT='me@gmail.com' is not valid",)),
    ([], {"NETWORK": "default"}, ("NETWORK='default' is not valid",)),
    ([], {"KMS_KEY": "key"}, ("KMS_KEY='key' is not valid",)),
    ([], {"PERSISTENT_RESOURCE_ID": "Warm_Pool"}, ("PERSISTENT_RESOURCE_ID='Warm_Pool' is not valid",)),
    ([], {"LABELS": "Team=ml"}, ("LABELS item 'Team=ml' is not valid",)),
    ([], {"ENABLE_CACHING": "true"}, ("ENABLE_CACHING='true' is not allowed",)),
    ([], {"ENABLE_CACHING": "sometimes"}, ("ENABLE_CACHING='sometimes' is not valid",)),
    ([], {"BUILD_REGION": "moon"}, ("BUILD_REGION='moon' is not a Cloud Build location",)),
    ([], {"API_ENDPOINT": "evil.example.com"}, ("API_ENDPOINT='evil.example.com' is not valid",)),
    ([], {"PROJECT_ID": "P"}, ("PROJECT_ID='P' is not valid",)),
    ([], {"WAIT": "please"}, ("WAIT='please' is not valid",)),
]


@pytest.mark.parametrize(
    ("flags", "settings", "words"), VERTEX, ids=[(" ".join(f) + str(s))[:60] for f, s, _ in VERTEX]
)
def test_make_run_vertex_refuses(
    flags: list[str], settings: dict[str, str], words: tuple[str, ...], no_requests: Path
) -> None:
    environ = {**SETTINGS, **settings}
    environ = {k: v for k, v in environ.items() if v}
    code, text = run_cli(["run", "--target", "vertex", *flags], environ)
    assert_refused(code, text, words)


# --- make schedule and the schedule commands --------------------------------------------------

SCHEDULE: list[tuple[list[str], dict[str, str], tuple[str, ...]]] = [
    ([], {}, ("CRON is not set",)),
    ([], {"CRON": "every monday"}, ("CRON must have five fields",)),
    ([], {"CRON": "0 25 * * *"}, ("hour '25' (expected 0-23)",)),
    ([], {"CRON": "60 6 * * *"}, ("minute '60'",)),
    ([], {"CRON": "0 6 32 * *"}, ("day of month '32'",)),
    ([], {"CRON": "0 6 * 13 *"}, ("month '13'",)),
    ([], {"CRON": "0 6 * * 8"}, ("day of week '8'",)),
    ([], {"CRON": "0 6 * * MOON"}, ("day of week 'MOON'",)),
    ([], {"CRON": "*/0 6 * * *"}, ("minute '*/0'",)),
    ([], {"CRON": "0 6-2 * * *"}, ("hour '6-2'",)),
    ([], {"CRON": "TZ=Europe/Paris 0 6 * * 1"}, ("TIMEZONE=<IANA time zone>",)),
    ([], {"CRON": "0 6 * * 1", "TIMEZONE": "Paris"}, ("TIMEZONE='Paris' is not an IANA time zone",)),
    ([], {"CRON": "0 6 * * 1", "TIMEZONE": 'x"; touch /tmp/p; echo "'}, ("TIMEZONE=",)),
    ([], {"CRON": "0 6 * * 1", "START": "tomorrow"}, ("START='tomorrow' is not an ISO-8601 timestamp",)),
    ([], {"CRON": "0 6 * * 1", "START": "2026-12-01T06:00:00"}, ("has no UTC offset",)),
    (
        [],
        {"CRON": "0 6 * * 1", "START": "2027-01-01T00:00:00Z", "END": "2026-01-01T00:00:00Z"},
        ("is not after START",),
    ),
    ([], {"CRON": "0 6 * * 1", "MAX_CONCURRENT": "0"}, ("MAX_CONCURRENT='0' is not valid",)),
    ([], {"CRON": "0 6 * * 1", "MAX_CONCURRENT": "many"}, ("MAX_CONCURRENT='many' is not valid",)),
    (["--scheduling_strategy", "spot"], {"CRON": "0 6 * * 1"}, ("scheduling_strategy", "did you mean SPOT?")),
    (
        ["--chief_accelerator_type", "NVIDIA_TESLA_K80"],
        {"CRON": "0 6 * * 1"},
        ("chief_accelerator_type", "end of support"),
    ),
    (["--epochs", "-3"], {"CRON": "0 6 * * 1"}, ("epochs",)),
    ([], {"CRON": "0 6 * * 1", "REGION": "mars-central1"}, ("REGION='mars-central1'",)),
]


@pytest.mark.parametrize(
    ("flags", "settings", "words"), SCHEDULE, ids=[(" ".join(f) + str(s))[:60] for f, s, _ in SCHEDULE]
)
def test_make_schedule_refuses(
    flags: list[str], settings: dict[str, str], words: tuple[str, ...], no_requests: Path
) -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
        try:
            code = schedules.schedule_command(["schedule", *flags], {**SETTINGS, **settings})
        except SystemExit as exit_:
            code = int(exit_.code or 0)
    assert_refused(code, err.getvalue(), words)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["pause"], ("NAME is not set",)),
        (["resume", "my-schedule"], ("NAME='my-schedule' is not a schedule's resource name",)),
        (
            ["delete", "projects/p/locations/us-central1/pipelineJobs/1"],
            ("is not a schedule's resource name",),
        ),
        (["pause", "a", "b"], ("unknown schedule command",)),
        (["destroy"], ("unknown schedule command",)),
    ],
)
def test_schedule_commands_refuse(argv: list[str], words: tuple[str, ...], no_requests: Path) -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = schedules.schedule_command(argv, {**SETTINGS})
    assert_refused(code, err.getvalue(), words)


# --- --training_config ------------------------------------------------------------------------

CONFIGS: list[tuple[str, tuple[str, ...]]] = [
    ("trainingInput: [1, 2]\n", ("--training_config", "trainingInput")),
    (
        "trainingInput:\n  scaleTier: CUSTOM\n  masterType: n1-standard-8\n  workerCount: nine\n",
        ("workerCount",),
    ),
    (
        "trainingInput:\n  scaleTier: CUSTOM\n  masterType: n1-standard-8\n  wokerCount: 2\n",
        ("wokerCount", "workerCount"),
    ),
    ("trainingInput:\n  scaleTier: BASIC_GPU\n", ("BASIC_GPU",)),
    ("trainingInput:\n  scaleTier: CUSTOM\n  masterType: standard_gpu\n", ("standard_gpu", "K80")),
    (
        "trainingInput:\n  scaleTier: CUSTOM\n  masterType: n1-standard-8\n  evaluatorCount: 1\n",
        ("evaluatorCount",),
    ),
    ("trainingInput: {scaleTier: CUSTOM, masterType: n1-standard-8\n", ("--training_config",)),
]


@pytest.mark.parametrize(("text", "words"), CONFIGS, ids=[t[:50] for t, _ in CONFIGS])
def test_training_config_refuses(text: str, words: tuple[str, ...], no_requests: Path) -> None:
    path = no_requests / "config.yaml"
    path.write_text(text)
    code, out = run_cli(
        ["run", "--target", "local", "--runs_dir", "runs", "--training_config", str(path)], {}
    )
    assert_refused(code, out, words)
    assert not (no_requests / "runs").exists()


def test_a_training_config_that_is_not_a_regular_small_file_is_refused_at_once(no_requests: Path) -> None:
    """/dev/zero was read until memory ran out (MemoryError); a FIFO was waited on forever."""
    fifo = no_requests / "config.fifo"
    os.mkfifo(fifo)
    for path, words in (
        ("/dev/zero", ("--training_config: /dev/zero is a character device",)),
        (str(fifo), ("config.fifo", "FIFO")),
        (str(no_requests), ("a folder",)),
    ):
        code, out = run_cli(["run", "--target", "local", "--training_config", path], {})
        assert_refused(code, out, words)
    big = no_requests / "big.yaml"
    big.write_text("# padding\n" * 200_000)
    code, out = run_cli(["run", "--target", "local", "--training_config", str(big)], {})
    assert_refused(code, out, ("big.yaml", "larger than 1 MiB"))
    latin = no_requests / "latin.yaml"
    latin.write_bytes("trainingInput:\n  masterType: caf\u00e9\n".encode("latin-1"))
    code, out = run_cli(["run", "--target", "local", "--training_config", str(latin)], {})
    assert_refused(code, out, ("latin.yaml", "not UTF-8"))


def test_a_missing_training_config_is_named(no_requests: Path) -> None:
    code, out = run_cli(["run", "--target", "local", "--training_config", "nope.yaml"], {})
    assert_refused(code, out, ("nope.yaml",))


# --- python -m trainer.task -------------------------------------------------------------------

TASK: list[tuple[list[str], tuple[str, ...]]] = [
    ([], ("--data_dir",)),
    (["--data_dir", ""], ("--data_dir", "non-empty path")),
    (["--data_dir", "d"], ("--model_dir is required when AIP_MODEL_DIR is not set",)),
    (["--data_dir", "d", "--model_dir", "m", "--epochs", "0"], ("--epochs",)),
    (["--data_dir", "d", "--model_dir", "m", "--epochs", "2.5"], ("--epochs", "whole number")),
    (
        ["--data_dir", "d", "--model_dir", "m", "--per_replica_batch_size", "32.5"],
        ("--per_replica_batch_size",),
    ),
    (["--data_dir", "d", "--model_dir", "m", "--learning_rate", "2"], ("--learning_rate",)),
    (["--data_dir", "d", "--model_dir", "m", "--dropout", "1.0"], ("--dropout",)),
    (["--data_dir", "d", "--model_dir", "m", "--backbone", "vgg"], ("--backbone",)),
    (["--data_dir", "d", "--model_dir", "m", "--backbone", "tiny"], ("--weights imagenet is not available",)),
    (["--data_dir", "d", "--model_dir", "m", "--mixed_precision", "fp16"], ("--mixed_precision",)),
    (["--data_dir", "d", "--model_dir", "m", "--hp_metric", "f1"], ("--hp_metric",)),
    (["--data_dir", "d", "--model_dir", "m", "--image_size", "31"], ("--image_size",)),
    (
        ["--data_dir", "d", "--model_dir", "m", "--checkpoint_dir", "m"],
        ("--checkpoint_dir must not be --model_dir",),
    ),
    (
        ["--data_dir", "d", "--model_dir", "m", "--tensorboard_dir", "m/logs"],
        ("--tensorboard_dir must not be",),
    ),
    (["--data_dir", "d", "--model_dir", "m", "--shuffle_buffer", "0"], ("--shuffle_buffer",)),
    (["--data_dir", "d", "--model_dir", "m", "--seed", "x"], ("--seed",)),
    (["--data_dir", "d", "--model_dir", "m", "--fine_tune_fraction", "1.01"], ("--fine_tune_fraction",)),
    (["--data_dir", "d", "--model_dir", "m", "--export_epoch", "first"], ("--export_epoch",)),
    (
        ["--data_dir", "d", "--model_dir", "m", "--early_stopping_patience", "2.5"],
        ("--early_stopping_patience",),
    ),
]


@pytest.mark.parametrize(("argv", "words"), TASK, ids=[" ".join(a)[:60] for a, _ in TASK])
def test_trainer_task_refuses(
    argv: list[str], words: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    from trainer import config

    with pytest.raises(SystemExit) as exit_:
        config.parse_args(argv, environ={})
    captured = capsys.readouterr()
    assert_refused(int(exit_.value.code or 0), captured.err, words)


# --- python -m trainer.prepare ----------------------------------------------------------------

PREPARE: list[tuple[list[str], tuple[str, ...]]] = [
    (["--source", "imagenet", "--output_dir", "o"], ("--source", "tfds:NAME")),
    (["--source", "folder:", "--output_dir", "o"], ("--source",)),
    (["--source", "synthetic"], ("--output_dir is required when AIP_MODEL_DIR is not set",)),
    (["--source", "synthetic", "--output_dir", "o", "--shards", "0"], ("--shards",)),
    (["--source", "synthetic", "--output_dir", "o", "--image_size", "2000"], ("--image_size",)),
    (
        ["--source", "synthetic", "--output_dir", "o", "--validation_fraction", "0.6"],
        ("--validation_fraction",),
    ),
    (["--source", "synthetic", "--output_dir", "o", "--test_fraction", "0"], ("--test_fraction",)),
    (["--source", "synthetic", "--output_dir", "o", "--encoding", "webp"], ("--encoding",)),
    (
        ["--source", "synthetic", "--output_dir", "o", "--synthetic_per_class", "2"],
        ("--synthetic_per_class",),
    ),
    (["--source", "synthetic", "--output_dir", "o", "--seed", "-5"], ("--seed",)),
]


@pytest.mark.parametrize(("argv", "words"), PREPARE, ids=[" ".join(a)[:60] for a, _ in PREPARE])
def test_trainer_prepare_refuses(
    argv: list[str], words: tuple[str, ...], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from trainer import prepare

    with pytest.raises(SystemExit) as exit_:
        prepare.parse_args(argv, environ={})
    assert_refused(int(exit_.value.code or 0), capsys.readouterr().err, words)


def _jpeg() -> bytes:
    """An 8x8 JPEG, the image a class folder holds."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (40, 160, 40)).save(buf, "JPEG")
    return buf.getvalue()


def _folder(tmp_path: Path, layout: str) -> Path:
    """Image folders (PATH/<split>/<class>/*.jpg) a careless user might hand `folder:`."""
    root = tmp_path / "images"
    jpeg = _jpeg()
    for name in ("a", "b"):
        (root / "train" / name).mkdir(parents=True)
        for i in range(3):
            (root / "train" / name / f"{i}.jpg").write_bytes(jpeg)
    if layout == "one class":
        for f in (root / "train" / "b").iterdir():
            f.unlink()
        (root / "train" / "b").rmdir()
    elif layout == "empty class":
        for f in (root / "train" / "b").iterdir():
            f.unlink()
    elif layout == "dangling link":
        (root / "train" / "a" / "x.jpg").symlink_to(tmp_path / "gone.jpg")
    elif layout == "link loop":
        (root / "train" / "a" / "loop.jpg").symlink_to(root / "train" / "a" / "loop.jpg")
    elif layout == "folder named like an image":
        (root / "train" / "a" / "x.jpg").mkdir()
    elif layout == "unknown split folder":
        (root / "val" / "a").mkdir(parents=True)
    elif layout == "classes differ between splits":
        (root / "test" / "a").mkdir(parents=True)
        (root / "test" / "a" / "0.jpg").write_bytes(jpeg)
    return root


@pytest.mark.parametrize(
    ("layout", "words"),
    [
        ("one class", ("at least 2",)),
        ("empty class", ("class 'b' has no images",)),
        ("dangling link", ("x.jpg",)),
        ("link loop", ("loop.jpg",)),
        ("folder named like an image", ("x.jpg", "is a folder, not an image")),
        ("unknown split folder", ("val", "rename it to validation/")),
        ("classes differ between splits", ("'test' has different classes than train",)),
    ],
)
def test_trainer_prepare_refuses_bad_folders_naming_the_path(
    layout: str, words: tuple[str, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainer import prepare

    root = _folder(tmp_path, layout)
    out = tmp_path / "out"
    code = prepare.main(["--source", f"folder:{root}", "--output_dir", str(out), "--image_size", "32"])
    captured = capsys.readouterr()
    assert_refused(code, captured.out + captured.err, words, expected_code=1)
    assert not out.exists() or not any(out.iterdir()), "a refused preparation wrote a dataset"


def test_trainer_prepare_will_not_replace_a_file_or_a_dataset_without_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainer import prepare

    target = tmp_path / "out"
    target.write_text("my notes")
    code = prepare.main(["--source", "synthetic", "--output_dir", str(target), "--image_size", "32"])
    captured = capsys.readouterr()
    assert_refused(code, captured.out + captured.err, (str(target),), expected_code=1)
    assert target.read_text() == "my notes"


# --- python -m trainer.serve ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "words", "expected"),
    [
        ([], ("--model_dir",), 2),
        (["--model_dir"], ("--model_dir", "expected one argument"), 2),
        (["--model_dir", "m", "--verbose"], ("unrecognized arguments: --verbose",), 2),
    ],
)
def test_trainer_serve_refuses(
    argv: list[str], words: tuple[str, ...], expected: int, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainer import serve

    with pytest.raises(SystemExit) as exit_:
        serve.main(argv)
    assert_refused(int(exit_.value.code or 0), capsys.readouterr().err, words, expected_code=expected)


@pytest.mark.serial
def test_trainer_serve_names_a_missing_model_and_a_bad_image(tmp_path: Path) -> None:
    """Through the process, as Vertex and the local registry run it (imports TensorFlow)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    missing = subprocess.run(
        [sys.executable, "-m", "trainer.serve", "--model_dir", str(tmp_path / "nothing")],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=120,
        check=False,
    )
    assert_refused(missing.returncode, missing.stdout + missing.stderr, (str(tmp_path / "nothing"),), 1)
