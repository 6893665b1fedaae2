from __future__ import annotations

from pathlib import Path

import pytest

from trainer import storage


def test_gcs_fuse_paths_become_gs_uris_where_the_mount_is_missing() -> None:
    assert storage.resolve("/gcs/bucket/data") == "gs://bucket/data"
    assert storage.resolve("gs://bucket/data") == "gs://bucket/data"
    assert storage.resolve("/tmp/x") == "/tmp/x"
    assert storage.is_remote("/gcs/bucket/x") and not storage.is_remote("/tmp/x")


def test_staged_output_publishes_only_a_complete_folder(tmp_path: Path) -> None:
    final = tmp_path / "out"
    with storage.staged_output(str(final)) as staging:
        (Path(staging) / "a.txt").write_text("1")
        assert not final.exists()  # nothing visible while it is written
    assert (final / "a.txt").read_text() == "1"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_failure_leaves_the_previous_output_untouched(tmp_path: Path) -> None:
    final = tmp_path / "out"
    final.mkdir()
    (final / "old.txt").write_text("keep")
    with pytest.raises(RuntimeError), storage.staged_output(str(final)) as staging:
        (Path(staging) / "half.txt").write_text("half")
        raise RuntimeError("crash mid-write")
    assert sorted(p.name for p in final.iterdir()) == ["old.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no staging folder left


class Stopped(BaseException):
    """What a signal handler raises (trainer.prepare's Terminated is one)."""


def test_a_signal_the_moment_the_staging_folder_exists_leaves_no_staging_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handler runs between any two bytecodes: here right after the staging folder is made,
    before anything is written in it (a loaded `make test` sent SIGTERM just then)."""
    made = storage.os.makedirs

    def makedirs_then_stopped(path: str, *args: object, **kwargs: object) -> None:
        made(path, *args, **kwargs)  # type: ignore[arg-type]
        if ".staging-" in str(path):
            raise Stopped

    monkeypatch.setattr(storage.os, "makedirs", makedirs_then_stopped)
    with pytest.raises(Stopped), storage.staged_output(str(tmp_path / "out")):
        pytest.fail("the block must not run")
    assert list(tmp_path.iterdir()) == []


def test_a_success_replaces_the_previous_output(tmp_path: Path) -> None:
    final = tmp_path / "out"
    final.mkdir()
    (final / "old.txt").write_text("old")
    with storage.staged_output(str(final)) as staging:
        (Path(staging) / "new.txt").write_text("new")
    assert sorted(p.name for p in final.iterdir()) == ["new.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_remote_publish_leaves_nothing_of_the_previous_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gs:// has no rename: the new files are copied over the old folder, and what the old
    output had and the new one has not (shards of another count) is deleted."""
    final = tmp_path / "final"
    for rel in ("metadata.json", "train-00000-of-00004.tfrecord", "sub/stale", "same"):
        (final / rel).parent.mkdir(parents=True, exist_ok=True)
        (final / rel).write_text("old")
    monkeypatch.setattr(storage, "is_remote", lambda path: True)  # the remote branch, through tf.io.gfile
    with storage.staged_output(str(final)) as staging:
        for rel in ("metadata.json", "train-00000-of-00002.tfrecord", "same"):
            Path(staging, rel).write_text("new")
    published = {str(p.relative_to(final)): p.read_text() for p in final.rglob("*") if p.is_file()}
    assert published == {"metadata.json": "new", "train-00000-of-00002.tfrecord": "new", "same": "new"}


def test_json_is_written_atomically_with_stable_bytes(tmp_path: Path) -> None:
    path = str(tmp_path / "m.json")
    storage.write_json(path, {"b": 1, "a": [1, 2]})
    first = Path(path).read_bytes()
    storage.write_json(path, {"a": [1, 2], "b": 1})
    assert Path(path).read_bytes() == first
    assert storage.read_json(path) == {"a": [1, 2], "b": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]


def test_publishing_over_a_plain_file_or_a_link_leaves_nothing_beside_it(tmp_path: Path) -> None:
    """`--overwrite` of an output that is a file: the replaced file went to `<out>.old-*`, and
    rmtree could not delete a file, so it stayed."""
    final = tmp_path / "out"
    final.write_text("a file where the folder goes")
    with storage.staged_output(str(final)) as staging:
        (Path(staging) / "a.txt").write_text("1")
    assert (final / "a.txt").read_text() == "1"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]

    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep.txt").write_text("keep")
    final2 = tmp_path / "out2"
    final2.symlink_to(target)
    with storage.staged_output(str(final2)) as staging:
        (Path(staging) / "b.txt").write_text("2")
    assert final2.is_dir() and not final2.is_symlink() and (final2 / "b.txt").read_text() == "2"
    assert (target / "keep.txt").read_text() == "keep"  # the link went, not what it pointed to
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "out", "out2"]


def test_what_a_killed_publish_left_is_deleted_by_the_next_publish(tmp_path: Path) -> None:
    """SIGKILL runs no `finally`: a staging folder (and a replaced output not yet deleted) stay
    beside the output until the restarted job publishes it again."""
    final = tmp_path / "model"
    (tmp_path / ".model.staging-0123abcd").mkdir()
    (tmp_path / ".model.staging-0123abcd" / "saved_model.pb").write_text("half")
    (tmp_path / "model.old-89abcdef").mkdir()
    (tmp_path / ".other.staging-0123abcd").mkdir()  # another output's: not touched
    (tmp_path / "model.old-notours").mkdir()  # not a name publish makes: not touched
    assert [Path(p).name for p in storage.leftovers(str(final))] == [
        ".model.staging-0123abcd",
        "model.old-89abcdef",
    ]
    with storage.staged_output(str(final)) as staging:
        (Path(staging) / "a.txt").write_text("1")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".other.staging-0123abcd",
        "model",
        "model.old-notours",
    ]
    assert storage.leftovers(str(final)) == []
