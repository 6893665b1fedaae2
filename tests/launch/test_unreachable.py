"""Google Cloud out of reach is one line, within seconds: `make run`, `make schedule` and
`make schedules` name each service before they first contact it, try it once (`cloud.reach`:
one HEAD request, 5 s to connect and 5 s to answer), and a service that gives no answer, or a
network failure of the client libraries afterwards (`cloud.reaching`: api_core's RetryError,
ServiceUnavailable, google-auth's TransportError, requests' ConnectionError), ends the command
with one line naming what could not be reached, where, why and the likely causes: exit 1, no
traceback (README "Exit codes"). Before this, storage's client retried a failed connection for
120 s in silence, then printed a RetryError traceback.

Nothing leaves the machine: the services are loopback addresses (a closed port; a socket that
accepts and never answers; a proxy that is not there), the credentials an authorized-user ADC
file whose token is never fetched, the metadata server a closed port.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.auth.credentials import AnonymousCredentials

from launch import cloud, schedules, settings, submit
from tests.conftest import TEST_BUCKET
from tests.fakes import RestFake

# Deadlines on processes of its own: in the serial tier, beside one other serial test at most (make test).
pytestmark = pytest.mark.serial

ROOT = Path(__file__).resolve().parents[2]
BUCKET = TEST_BUCKET
VALID = {
    "PROJECT_ID": "p-proj",
    "REGION": "us-central1",
    "PIPELINE_ROOT": f"gs://{BUCKET}/root",
    "ARTIFACT_REPOSITORY": "us-central1-docker.pkg.dev/p-proj/training",
    "TEMPLATE_REPOSITORY": "https://us-central1-kfp.pkg.dev/p-proj/pipelines",
}
BOUND_SECONDS = 20.0  # a behaviour check (seconds, not minutes), not a benchmark
CAUSES = ("no network", "HTTPS_PROXY", "VPC Service Controls")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def black_hole() -> Iterator[str]:
    """host:port of a socket that accepts connections (the kernel's backlog does) and never
    answers: a network that drops the replies, or a proxy that hangs."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield f"127.0.0.1:{s.getsockname()[1]}"


def adc_file(tmp_path: Path) -> Path:
    """Application Default Credentials of a user (`gcloud auth application-default login`'s
    file): found at once, offline; its token would be fetched only with the first request."""
    path = tmp_path / "adc.json"
    path.write_text(
        json.dumps(
            {
                "type": "authorized_user",
                "client_id": "test.apps.googleusercontent.com",
                "client_secret": "secret",
                "refresh_token": "refresh",
            }
        )
    )
    return path


def cloud_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This environment with credentials, no other Google or proxy setting, and valid settings."""
    proxies = {"http_proxy", "https_proxy", "all_proxy", "no_proxy", "grpc_proxy", "no_grpc_proxy"}
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GOOGLE_", "CLOUDSDK_", "GCE_", "MAKE", "STORAGE_EMULATOR"))
        and k.lower() not in proxies
        and k not in settings.SETTINGS
    }
    (tmp_path / "home").mkdir(exist_ok=True)
    env.update(
        HOME=str(tmp_path / "home"),
        CLOUDSDK_CONFIG=str(tmp_path / "home"),
        GOOGLE_APPLICATION_CREDENTIALS=str(adc_file(tmp_path)),
        GCE_METADATA_HOST=f"127.0.0.1:{closed_port()}",
        GCE_METADATA_IP=f"127.0.0.1:{closed_port()}",
        PYTHONPATH=str(ROOT),
        **VALID,
        **extra,
    )
    return env


def make_run(env: dict[str, str], cwd: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    """`make run` on the Vertex target, as the Makefile runs it; (result, seconds from its first
    "contacting" line to its exit: the time spent on the network, not on starting Python)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "launch.cli", "run", "--target", "vertex"],
        env=env,
        cwd=cwd,  # no env.sh there
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stderr is not None
    contacted, out = None, []
    try:
        for line in process.stdout:  # ends when the process closes it, at its exit
            out.append(line)
            if contacted is None and line.startswith("contacting "):
                contacted = time.monotonic()
        err = process.stderr.read()
        code = process.wait(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    ended = time.monotonic()
    result = subprocess.CompletedProcess(process.args, code, "".join(out), err)
    assert contacted is not None, result.stdout + result.stderr
    return result, ended - contacted


def the_line(result: subprocess.CompletedProcess[str], prog: str = "make run") -> str:
    """The one line the failure is, after checking exit 1 and no traceback."""
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    [line] = [line for line in result.stderr.splitlines() if "reach" in line]
    assert line.startswith(f"{prog}: "), line
    for cause in CAUSES:
        assert cause in line, line
    return line


# --- `make run`, end to end, in its own process ---------------------------------------------------


@pytest.mark.process
def test_make_run_behind_a_proxy_that_is_not_there_is_one_line_within_seconds(tmp_path: Path) -> None:
    """The real hosts (storage.googleapis.com first), every request through HTTPS_PROXY, which
    refuses: as a machine with credentials and no way out. Before: 120 s of retries, a RetryError
    traceback."""
    proxy = f"127.0.0.1:{closed_port()}"
    env = cloud_env(tmp_path, HTTPS_PROXY=f"http://{proxy}", https_proxy=f"http://{proxy}")
    result, seconds = make_run(env, tmp_path)
    line = the_line(result)
    assert seconds < BOUND_SECONDS, f"{seconds:.0f} s: {line}"
    assert "contacting Cloud Storage for gs://p-proj-pipelines (storage.googleapis.com) ..." in result.stdout
    assert f"Cloud Storage for gs://{BUCKET} at storage.googleapis.com through the proxy {proxy}" in line
    assert "(the proxy failed: connection refused); nothing was sent to it." in line, line


@pytest.mark.process
def test_make_run_with_a_storage_host_that_never_answers_gives_up_within_seconds(
    tmp_path: Path, black_hole: str
) -> None:
    env = cloud_env(tmp_path, STORAGE_EMULATOR_HOST=f"http://{black_hole}")
    result, seconds = make_run(env, tmp_path)
    line = the_line(result)
    assert seconds < BOUND_SECONDS, f"{seconds:.0f} s: {line}"
    assert f"Cloud Storage for gs://{BUCKET} at {black_hole} (no answer in time)" in line, line


# --- each service, in this process ------------------------------------------------------------------


@pytest.fixture
def no_bucket_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """PipelineJob.submit first looks for the bucket through Resource Manager (no fake here)."""
    from google.cloud.aiplatform.utils import gcs_utils

    monkeypatch.setattr(
        gcs_utils, "create_gcs_bucket_for_pipeline_artifacts_if_it_does_not_exist", lambda *a, **k: None
    )


@pytest.mark.usefixtures("no_bucket_probe")
def test_a_vertex_endpoint_out_of_reach_is_named_after_the_upload(
    gcs: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    endpoint = f"127.0.0.1:{closed_port()}"
    config = settings.load({**VALID, "API_ENDPOINT": f"http://{endpoint}"}, Path("/nonexistent"))
    start = time.monotonic()
    with pytest.raises(submit.GoogleUnreachable) as info:
        submit.submit(config, {}, credentials=AnonymousCredentials(), transport="rest")
    assert time.monotonic() - start < BOUND_SECONDS
    line = str(info.value)
    assert "\n" not in line
    assert f"cannot reach Vertex AI in us-central1 at {endpoint} (connection refused)" in line, line
    assert f"API_ENDPOINT='http://{endpoint}' (env or env.sh) is wrong" in line, line
    out = capsys.readouterr().out
    assert f"contacting Vertex AI in us-central1 ({endpoint}) ..." in out
    assert "uploaded the build context" in out  # the storage half went through


@pytest.fixture
def vertex(no_bucket_probe: None) -> Iterator[RestFake]:
    fake = RestFake()
    yield fake
    fake.stop()


JOBS = r"/v1/projects/p-proj/locations/us-central1/pipelineJobs"


def test_a_503_on_the_runs_creation_is_one_line(vertex: RestFake, gcs: Any) -> None:
    """Vertex reachable but not answering (HTTP 503, api_core's ServiceUnavailable)."""
    vertex.route("POST", JOBS, lambda *_: (503, {"error": {"code": 503, "message": "backend down"}}))
    config = settings.load({**VALID, "API_ENDPOINT": f"http://{vertex.address}"}, Path("/nonexistent"))
    with pytest.raises(submit.GoogleUnreachable) as info:
        submit.submit(config, {}, credentials=AnonymousCredentials(), transport="rest")
    line = str(info.value)
    assert line.startswith(
        f"the pipeline run's submission failed: Vertex AI in us-central1 at {vertex.address} could not be "
        "reached or did not answer (503 backend down); the run was not created."
    ), line
    assert "\n" not in line


def test_losing_vertex_while_following_the_run_says_it_goes_on(
    vertex: RestFake, gcs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make run WAIT=1` losing Vertex mid-run. The SDK retries each read of the run for up to
    120 s (aiplatform.base._DEFAULT_RETRY: a follow rides out a blip); 1 s here."""
    from google.api_core import retry
    from google.cloud.aiplatform import base

    monkeypatch.setattr(base, "_DEFAULT_RETRY", retry.Retry(timeout=1.0))

    def create(_m: Any, query: dict[str, list[str]], body: dict[str, Any]) -> tuple[int, Any]:
        name = f"projects/p-proj/locations/us-central1/pipelineJobs/{query['pipelineJobId'][0]}"
        return 200, {**body, "name": name, "state": "PIPELINE_STATE_PENDING"}

    vertex.route("POST", JOBS, create)
    vertex.route("GET", JOBS + "/.*", lambda *_: (503, {"error": {"code": 503, "message": "unavailable"}}))
    config = settings.load({**VALID, "API_ENDPOINT": f"http://{vertex.address}"}, Path("/nonexistent"))
    with pytest.raises(submit.GoogleUnreachable) as info:
        submit.submit(config, {}, wait=True, credentials=AnonymousCredentials(), transport="rest")
    line = str(info.value)
    assert line.startswith(
        f"following the run failed: Vertex AI in us-central1 at {vertex.address} could not be reached or "
        "did not answer (503 unavailable; retried for 1 s)"
    ), line
    assert "the run was submitted and goes on: https://console.cloud.google.com/vertex-ai/" in line


@pytest.mark.usefixtures("fresh_aiplatform")
def test_make_schedules_with_vertex_out_of_reach_exits_1_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for key in [k for k in os.environ if k.startswith(("GOOGLE_", "CLOUDSDK_"))]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc_file(tmp_path)))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # no env.sh
    endpoint = f"127.0.0.1:{closed_port()}"
    start = time.monotonic()
    code = schedules.schedule_command(["schedules"], {**VALID, "API_ENDPOINT": f"http://{endpoint}"})
    assert time.monotonic() - start < BOUND_SECONDS
    assert code == 1
    captured = capsys.readouterr()
    assert captured.out == ""  # stdout is the listing
    contacting, line = captured.err.strip().splitlines()
    assert contacting == f"contacting Vertex AI in us-central1 ({endpoint}) ..."
    assert line.startswith(f"make schedules: cannot reach Vertex AI in us-central1 at {endpoint}"), line


# --- what counts as out of reach -----------------------------------------------------------------------


def storage_retry_error() -> Exception:
    """What storage's blob.exists() raised after 120 s without a network, with user credentials:
    RetryError from the token fetch's TransportError from requests' ConnectionError."""
    import requests
    from google.api_core import exceptions
    from google.auth import exceptions as auth

    dns = requests.ConnectionError(
        "HTTPSConnectionPool(host='oauth2.googleapis.com', port=443): Max retries exceeded with url: "
        "/token (Caused by NameResolutionError(\"Failed to resolve 'oauth2.googleapis.com' ([Errno -2] "
        'Name or service not known)"))'
    )
    transport = auth.TransportError(dns)
    transport.__cause__ = dns
    return exceptions.RetryError("Timeout of 120.0s exceeded", cause=transport)


def refresh_error() -> Exception:
    from google.auth import exceptions as auth

    transport = auth.TransportError("Failed to retrieve http://metadata.google.internal/: timed out")
    error = auth.RefreshError(transport)
    error.__cause__ = transport
    return error


@pytest.mark.parametrize(
    ("make_error", "reason"),
    [
        (
            storage_retry_error,
            "its name does not resolve (DNS) (at oauth2.googleapis.com:443); retried for 120 s",
        ),
        (refresh_error, "no answer in time"),
        (lambda: ConnectionRefusedError(111, "Connection refused"), "connection refused"),
    ],
    ids=["retry error", "refresh from transport", "refused"],
)
def test_network_failures_become_one_line(make_error: Any, reason: str) -> None:
    service = ("Cloud Storage for gs://b", "https://storage.googleapis.com", "")
    with (
        pytest.raises(submit.GoogleUnreachable) as info,
        cloud.reaching("the build context's upload", service),
    ):
        raise make_error()
    line = str(info.value)
    assert line.startswith(
        "the build context's upload failed: Cloud Storage for gs://b at storage.googleapis.com could not be "
        f"reached or did not answer ({reason})"
    ), line
    assert "\n" not in line
    for cause in CAUSES:
        assert cause in line


@pytest.mark.parametrize("kind", ["forbidden", "http error", "refresh refused", "value error"])
def test_answers_and_other_errors_are_left_alone(kind: str) -> None:
    """A refusal is an answer (refused_as and the credentials line deal with them); a bug is a bug."""
    import urllib.error

    from google.api_core import exceptions
    from google.auth import exceptions as auth

    error: Exception = {
        "forbidden": exceptions.Forbidden("denied"),
        "http error": urllib.error.HTTPError("https://x", 404, "Not Found", None, None),  # type: ignore[arg-type]
        "refresh refused": auth.RefreshError("invalid_grant: Bad Request"),
        "value error": ValueError("bad"),
    }[kind]
    with pytest.raises(type(error)), cloud.reaching("x", ("Vertex AI", "https://v", "")):
        raise error


def test_reach_through_a_proxy_honours_no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe goes the way the client libraries' requests go: through HTTPS_PROXY, except for
    the hosts in NO_PROXY."""
    fake = RestFake()
    try:
        dead = f"127.0.0.1:{closed_port()}"
        monkeypatch.setenv("HTTP_PROXY", f"http://{dead}")
        monkeypatch.setenv("http_proxy", f"http://{dead}")
        for name in ("NO_PROXY", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        service = ("Vertex AI in us-central1", f"http://{fake.address}", "")
        with pytest.raises(submit.GoogleUnreachable, match=f"through the proxy {dead} \\(the proxy failed"):
            cloud.reach(service)
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        monkeypatch.setenv("no_proxy", "127.0.0.1")
        cloud.reach(service)  # straight to the fake: any HTTP answer will do (here 501)
    finally:
        fake.stop()
