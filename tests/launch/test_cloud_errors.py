"""Cloud errors a person can act on: no credentials is one line saying how to provide them (exit 2,
no traceback) at every Vertex entry point, and REGION is checked against the regions
google-cloud-aiplatform lists, before any request.

No request leaves the machine: credentials are looked for in empty places (a temporary HOME and
CLOUDSDK_CONFIG, GOOGLE_APPLICATION_CREDENTIALS naming a missing file) and the metadata server
address is a closed local port, probed once with a one-second timeout (google-auth's
compute_engine/_metadata.py reads GCE_METADATA_HOST, GCE_METADATA_IP, GCE_METADATA_TIMEOUT and
GCE_METADATA_DETECT_RETRIES when it is imported: hence a fresh process for that case).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from launch import schedules, settings, submit

ROOT = Path(__file__).resolve().parents[2]
VALID = {
    "PROJECT_ID": "p-proj",
    "REGION": "us-central1",
    "PIPELINE_ROOT": "gs://p-proj-pipelines/root",
    "ARTIFACT_REPOSITORY": "us-central1-docker.pkg.dev/p-proj/training",
    "TEMPLATE_REPOSITORY": "https://us-central1-kfp.pkg.dev/p-proj/pipelines",
}
# A region VALID's repositories are not in: each is named after REGION.
REGION_AND_REPOSITORIES = ["REGION", "ARTIFACT_REPOSITORY", "TEMPLATE_REPOSITORY"]
GUIDANCE = (
    "gcloud auth application-default login",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "service account is attached",
)


def no_adc_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This environment with nowhere to find Google credentials and a metadata server that
    refuses at once; the settings of a valid-looking project."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GOOGLE_", "CLOUDSDK_", "GCE_", "MAKE")) and k not in settings.SETTINGS
    }
    (tmp_path / "home").mkdir(exist_ok=True)
    (tmp_path / "gcloud").mkdir(exist_ok=True)
    env.update(
        HOME=str(tmp_path / "home"),
        CLOUDSDK_CONFIG=str(tmp_path / "gcloud"),
        GCE_METADATA_HOST="127.0.0.1:1",
        GCE_METADATA_IP="127.0.0.1:1",
        GCE_METADATA_TIMEOUT="1",
        GCE_METADATA_DETECT_RETRIES="1",
        PYTHONPATH=str(ROOT),
        **VALID,
        **extra,
    )
    return env


def assert_one_line_about_credentials(result: subprocess.CompletedProcess[str], prog: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    [line] = [line for line in result.stderr.splitlines() if "credentials" in line]
    assert line.startswith(f"{prog}: ") and "Google Cloud credentials" in line, line
    for hint in GUIDANCE:
        assert hint in line, line


def run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    # cwd: a folder with no env.sh, so only these settings count.
    return subprocess.run(
        [sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.mark.process
def test_make_run_with_no_credentials_anywhere_says_how_to_provide_them(tmp_path: Path) -> None:
    result = run(["-m", "launch.cli", "run", "--target", "vertex"], no_adc_env(tmp_path), tmp_path)
    assert_one_line_about_credentials(result, "make run")


@pytest.mark.process
def test_make_schedules_with_a_missing_key_file_names_it(tmp_path: Path) -> None:
    key = tmp_path / "no-such-key.json"
    result = run(
        ["-m", "launch.schedules", "schedules"],
        no_adc_env(tmp_path, GOOGLE_APPLICATION_CREDENTIALS=str(key)),
        tmp_path,
    )
    assert_one_line_about_credentials(result, "make schedules")
    assert f"File {key} was not found" in result.stderr


@pytest.mark.usefixtures("fresh_aiplatform")
@pytest.mark.parametrize(
    "argv",
    [
        ["schedule"],
        ["pause", "projects/p-proj/locations/us-central1/schedules/77"],
        ["delete"],  # NAME from the environment
    ],
)
def test_schedule_commands_with_no_credentials_say_how_to_provide_them(
    argv: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for key in [k for k in os.environ if k.startswith(("GOOGLE_", "CLOUDSDK_"))]:
        monkeypatch.delenv(key)
    # google.auth.default() stops at a GOOGLE_APPLICATION_CREDENTIALS naming a missing file.
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-such-key.json"))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # no env.sh
    monkeypatch.setattr(submit, "source_commit", lambda root=ROOT: "a" * 40)  # a clean checkout
    environ = {**VALID, "CRON": "0 6 * * 1", "NAME": "projects/p-proj/locations/us-central1/schedules/78"}
    assert schedules.schedule_command(argv, environ) == 2
    err = capsys.readouterr().err
    prog = {"schedule": "make schedule", "pause": "make schedule-pause", "delete": "make schedule-delete"}[
        argv[0]
    ]
    [line] = err.strip().splitlines()
    assert line.startswith(f"{prog}: no Google Cloud credentials (File ") and "was not found" in line
    for hint in GUIDANCE:
        assert hint in line


def test_credentials_pointing_at_a_folder_are_a_settings_problem(tmp_path: Path) -> None:
    """google-auth opens the path as it is: a folder was an IsADirectoryError traceback."""
    with pytest.raises(settings.SettingsError) as info:
        settings.load({**VALID, "GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path)}, Path("/nonexistent"))
    assert info.value.settings == ["GOOGLE_APPLICATION_CREDENTIALS"] and str(tmp_path) in str(info.value)


# --- REGION ---------------------------------------------------------------------------------------


def test_a_region_vertex_does_not_serve_is_refused_naming_the_closest() -> None:
    with pytest.raises(settings.SettingsError) as info:
        settings.load({**VALID, "REGION": "mars-central1"}, Path("/nonexistent"))
    message = str(info.value)
    assert info.value.settings == REGION_AND_REPOSITORIES
    assert "google.cloud.aiplatform.constants.base.SUPPORTED_REGIONS" in message  # where the list is from
    closest = re.search(r"closest: (.*)$", message, re.M)
    assert closest and "us-central1" in closest.group(1).split(", ")


def test_a_region_far_from_any_lists_them_all() -> None:
    from google.cloud.aiplatform.constants import base

    with pytest.raises(settings.SettingsError) as info:
        settings.load({**VALID, "REGION": "zz-qq1"}, Path("/nonexistent"))
    assert info.value.settings == REGION_AND_REPOSITORIES
    listed = set(str(info.value).splitlines()[0].split("one of: ", 1)[1].split(", "))
    assert listed == set(base.SUPPORTED_REGIONS) - {"global"}


def test_global_is_not_a_training_region() -> None:
    """aiplatform lists `global` (generative AI endpoints); Vertex trains in a region."""
    assert "global" not in settings.vertex_regions()
    with pytest.raises(settings.SettingsError) as info:
        settings.load({**VALID, "REGION": "global"}, Path("/nonexistent"))
    assert info.value.settings == REGION_AND_REPOSITORIES


@pytest.mark.parametrize("region", ["us-central1", "europe-west4", "asia-northeast1"])
def test_a_vertex_region_passes(region: str) -> None:
    config = settings.load(
        {
            **VALID,
            "REGION": region,
            "ARTIFACT_REPOSITORY": f"{region}-docker.pkg.dev/p-proj/training",
            "TEMPLATE_REPOSITORY": f"https://{region}-kfp.pkg.dev/p-proj/pipelines",
        },
        Path("/nonexistent"),
    )
    assert config.region == region


def test_the_region_list_is_aiplatforms() -> None:
    from google.cloud.aiplatform.constants import base

    assert settings.vertex_regions() == frozenset(base.SUPPORTED_REGIONS) - {"global"}
    assert "us-central1" in settings.vertex_regions()
