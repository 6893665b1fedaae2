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


def test_a_success_replaces_the_previous_output(tmp_path: Path) -> None:
    final = tmp_path / "out"
    final.mkdir()
    (final / "old.txt").write_text("old")
    with storage.staged_output(str(final)) as staging:
        (Path(staging) / "new.txt").write_text("new")
    assert sorted(p.name for p in final.iterdir()) == ["new.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_refuses_to_replace_when_asked_not_to(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("x")
    with pytest.raises(FileExistsError), storage.staged_output(str(tmp_path / "out"), overwrite=False):
        pass


def test_json_is_written_atomically_with_stable_bytes(tmp_path: Path) -> None:
    path = str(tmp_path / "m.json")
    storage.write_json(path, {"b": 1, "a": [1, 2]})
    first = Path(path).read_bytes()
    storage.write_json(path, {"a": [1, 2], "b": 1})
    assert Path(path).read_bytes() == first
    assert storage.read_json(path) == {"a": [1, 2], "b": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]
