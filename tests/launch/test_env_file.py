"""env.sh, the user's settings file (`launch.settings.read_env_file`), read as documented or refused
in one line: a UTF-8 byte-order mark is skipped (it used to become part of the first key, so a
Vertex user's PROJECT_ID went unseen and `make run` ran locally); text that is not UTF-8 (Latin-1,
UTF-16) is refused naming the file, the byte offset and line, and "save it as UTF-8"; a folder, a
FIFO, a device or a file over 1 MiB is refused naming what it is, and never waited on (a FIFO
used to hang `make run`). Every refusal is a SettingsError: `make run` on the Vertex target prints
it as a settings error (exit 2) before anything is started."""

from __future__ import annotations

import argparse
import os
import threading
from pathlib import Path

import pytest

from launch import cli, settings, submit

pytestmark = pytest.mark.hardening  # make test-hardening

SETTINGS_TEXT = (
    "export PROJECT_ID=p-proj\n"
    "REGION=us-central1\n"
    "PIPELINE_ROOT=gs://p-proj-pipelines/root\n"
    "ARTIFACT_REPOSITORY=us-central1-docker.pkg.dev/p-proj/training\n"
)


def write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "env.sh"
    path.write_bytes(data)
    return path


def refusal(path: Path) -> str:
    """The one line read_env_file refuses `path` with."""
    with pytest.raises(settings.SettingsError) as info:
        settings.read_env_file(path)
    message = str(info.value)
    assert "\n" not in message, message
    assert message.startswith(str(path)), message
    return message


# --- read as documented ------------------------------------------------------------------------------


def test_a_utf8_byte_order_mark_is_not_part_of_the_first_key(tmp_path: Path) -> None:
    path = write(tmp_path, b"\xef\xbb\xbf" + SETTINGS_TEXT.encode())
    assert settings.read_env_file(path)["PROJECT_ID"] == "p-proj"
    assert cli.configured_project({}, path) == "p-proj"  # so `make run` picks Vertex
    assert settings.load({}, path).project == "p-proj"


def test_the_documented_forms_are_unchanged(tmp_path: Path) -> None:
    """`export` or not, quotes stripped (a # inside them kept), comments dropped, a key given
    twice keeps its last value (as `source env.sh` would), CRLF line ends, UTF-8 values."""
    path = write(
        tmp_path,
        (
            "# a comment\r\n"
            "export PROJECT_ID=first-proj\r\n"
            "PROJECT_ID=p-proj  # the one that counts\r\n"
            'LABELS="team=ml,owner=zoé" # quoted\r\n'
            "EXPERIMENT='exp #1'\r\n"
            "  export   REGION = us-central1\r\n"
            "lowercase=ignored\r\n"
            "not a setting\r\n"
        ).encode(),
    )
    assert settings.read_env_file(path) == {
        "PROJECT_ID": "p-proj",
        "LABELS": "team=ml,owner=zoé",
        "EXPERIMENT": "exp #1",
        "REGION": "us-central1",
    }


@pytest.mark.parametrize(
    "line", ['export KMS_KEY="projects/p/locations/l/keyRings/r/cryptoKeys/k', "PROJECT_ID='p-proj", "A = 'x"]
)
def test_an_assignment_that_cannot_be_parsed_is_refused_not_dropped(line: str, tmp_path: Path) -> None:
    """An unclosed quote: `source env.sh` fails on it; dropping the line would run without the
    setting (a Vertex run without its CMEK key, or a local run for want of PROJECT_ID)."""
    path = write(
        tmp_path, (SETTINGS_TEXT + line + "\nSERVICE_ACCOUNT=sa@p-proj.iam.gserviceaccount.com\n").encode()
    )
    assert " line 5: " in refusal(path)
    with pytest.raises(settings.SettingsError):
        cli.configured_project({}, path)


def test_no_env_sh_is_no_settings(tmp_path: Path) -> None:
    assert settings.read_env_file(tmp_path / "env.sh") == {}
    (tmp_path / "file").write_text("x")
    assert settings.read_env_file(tmp_path / "file" / "env.sh") == {}  # a file where the folder is


def test_a_link_to_a_settings_file_is_followed(tmp_path: Path) -> None:
    (tmp_path / "real.sh").write_text(SETTINGS_TEXT)
    (tmp_path / "env.sh").symlink_to("real.sh")
    assert settings.read_env_file(tmp_path / "env.sh")["PROJECT_ID"] == "p-proj"


# --- text that is not UTF-8 ----------------------------------------------------------------------------


def test_latin1_text_names_the_byte_and_the_line(tmp_path: Path) -> None:
    data = (SETTINGS_TEXT + "LABELS=owner=zoé\n").encode("latin-1")
    path = write(tmp_path, data)
    message = refusal(path)
    offset = data.index(b"\xe9")
    assert f"byte 0xE9 at byte offset {offset} (line 5, column 16)" in message, message
    assert "is not UTF-8 text" in message and message.endswith("save it as UTF-8")


def test_offsets_count_a_byte_order_mark(tmp_path: Path) -> None:
    path = write(tmp_path, b"\xef\xbb\xbfPROJECT_ID=caf\xe9\n")
    assert "at byte offset 17 (line 1, column 18)" in refusal(path)


@pytest.mark.parametrize(
    ("encoding", "named"),
    [
        ("utf-16", "UTF-16 little-endian text (byte-order mark FF FE at byte offset 0)"),
        ("utf-16-be", "NUL byte at byte offset 0 (line 1, column 1)"),  # no mark: its NULs
        ("utf-16-le", "NUL byte at byte offset 1 (line 1, column 2)"),
        ("utf-32", "UTF-32 little-endian text (byte-order mark FF FE 00 00 at byte offset 0)"),
    ],
)
def test_utf16_and_utf32_are_named(encoding: str, named: str, tmp_path: Path) -> None:
    data = SETTINGS_TEXT.encode(encoding)
    if encoding == "utf-16":  # Python writes the machine's order; make it the usual Windows one
        data = b"\xff\xfe" + SETTINGS_TEXT.encode("utf-16-le")
    message = refusal(write(tmp_path, data))
    assert named in message, message
    assert "save it as UTF-8" in message


def test_a_big_endian_mark_is_named(tmp_path: Path) -> None:
    message = refusal(write(tmp_path, b"\xfe\xff" + SETTINGS_TEXT.encode("utf-16-be")))
    assert "UTF-16 big-endian text (byte-order mark FE FF at byte offset 0), not UTF-8" in message


# --- not a regular file of sane size -------------------------------------------------------------------


def test_a_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "env.sh").mkdir()
    (tmp_path / "env.sh" / "keep.txt").write_text("the user's")
    message = refusal(tmp_path / "env.sh")
    assert "is a folder, not a file" in message and "move it away" in message
    assert (tmp_path / "env.sh" / "keep.txt").read_text() == "the user's"  # nothing of theirs touched


def test_a_fifo_is_refused_at_once_and_never_waited_on(tmp_path: Path) -> None:
    """No writer will ever open it: reading it would block for good (it used to hang `make run`)."""
    path = tmp_path / "env.sh"
    os.mkfifo(path)
    outcome: list[BaseException | dict[str, str]] = []

    def read() -> None:
        try:
            outcome.append(settings.read_env_file(path))
        except BaseException as err:  # noqa: BLE001 (handed to the test's thread)
            outcome.append(err)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive(), "read_env_file is blocked on the FIFO"
    [err] = outcome
    assert isinstance(err, settings.SettingsError), err
    assert str(err).startswith(f"{path} is a FIFO (named pipe), not a file"), err


def test_a_device_is_refused(tmp_path: Path) -> None:
    (tmp_path / "env.sh").symlink_to("/dev/null")  # read, it would say: no settings at all
    assert "is a character device, not a file" in refusal(tmp_path / "env.sh")


def test_a_file_over_1_mib_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, SETTINGS_TEXT.encode() + b"#" * settings.ENV_FILE_MAX_BYTES)
    message = refusal(path)
    assert f"is larger than 1 MiB ({path.stat().st_size} bytes)" in message, message


def test_a_file_of_1_mib_is_read(tmp_path: Path) -> None:
    text = SETTINGS_TEXT.encode()
    path = write(tmp_path, text + b"#" * (settings.ENV_FILE_MAX_BYTES - len(text)))
    assert settings.read_env_file(path)["PROJECT_ID"] == "p-proj"


def test_a_dangling_link_is_refused_not_taken_for_no_settings(tmp_path: Path) -> None:
    """A link whose file was moved: no settings would run the pipeline locally in silence."""
    (tmp_path / "env.sh").symlink_to(tmp_path / "moved.sh")
    message = refusal(tmp_path / "env.sh")
    assert f"is a symbolic link to '{tmp_path / 'moved.sh'}', which does not exist" in message


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_file_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, SETTINGS_TEXT.encode())
    path.chmod(0)
    try:
        assert "cannot be read (Permission denied)" in refusal(path)
    finally:
        path.chmod(0o600)


# --- what `make run` does with it ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ((SETTINGS_TEXT + "LABELS=owner=zoé\n").encode("latin-1"), "env.sh is not UTF-8 text: byte 0xE9"),
        (b"\xff\xfe" + SETTINGS_TEXT.encode("utf-16-le"), "env.sh is UTF-16 little-endian text"),
        (None, "env.sh is a folder, not a file"),
    ],
    ids=["latin-1", "utf-16", "folder"],
)
def test_make_run_on_vertex_prints_it_as_a_settings_error(
    data: bytes | None,
    said: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """PROJECT_ID in the environment: `make run` goes to launch.submit.main, which loads the
    settings (env.sh included) and stops with exit 2 and the line, before anything is sent."""
    monkeypatch.chdir(tmp_path)
    if data is None:
        Path("env.sh").mkdir()
    else:
        Path("env.sh").write_bytes(data)
    code = submit.main(argparse.Namespace(), {"PROJECT_ID": "p-proj"}, "p-proj")
    assert code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    first, line = err.strip().splitlines()
    assert first.startswith("make run: cannot submit to Vertex AI; fix these settings")
    assert line.startswith(said), line


def test_make_run_reading_env_sh_for_the_target_prints_it_as_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No PROJECT_ID in the environment: launch.cli reads env.sh itself to pick the target."""
    monkeypatch.chdir(tmp_path)
    Path("env.sh").write_bytes((SETTINGS_TEXT + "LABELS=owner=zoé\n").encode("latin-1"))
    assert cli.main(["run"], {}) == 2
    err = capsys.readouterr().err
    assert "env.sh is not UTF-8 text: byte 0xE9" in err and "Traceback" not in err
