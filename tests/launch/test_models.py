"""`make models` lists the local registry as `local.steps.register_version` writes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launch import models
from local import steps


def saved_model(folder: Path, accuracy: float) -> str:
    folder.mkdir(parents=True)
    (folder / "saved_model.pb").write_bytes(b"pb")
    (folder / "metrics.json").write_text(json.dumps({"test_accuracy": accuracy, "class_names": ["a", "b"]}))
    return str(folder)


def details(accuracy: float, comparison: dict | None) -> dict:
    return {
        "evaluation": {
            "split": "test",
            "dataset_fingerprint": "sha256:" + "cd" * 32,
            "models": {"challenger": {"examples": 100, "accuracy": accuracy, "macro_f1": accuracy - 0.01}},
            "comparison": comparison,
        }
    }


def test_each_version_is_listed_with_its_figures_dataset_gate_and_the_champion(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    registry_dir = str(tmp_path / "registry")
    steps.register_version(
        saved_model(tmp_path / "m1", 0.9), registry_dir, "leaves", True, "ok", details(0.9, None)
    )
    comparison = {"accuracy": {"difference": -0.01, "ci95": [-0.04, 0.02]}}
    steps.register_version(
        saved_model(tmp_path / "m2", 0.89),
        registry_dir,
        "leaves",
        False,
        "below",
        details(0.89, comparison),
        "1",
    )
    assert models.main(["--registry_dir", registry_dir]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("leaves  (* = champion")
    first, second = lines[2].split(), lines[3].split()
    assert first[:2] == ["1", "*"] and "0.9000" in first and "promoted" in first
    assert second[0] == "2" and "held" in second and "0.8900" in second and "0.8800" in second
    assert "sha256:cdcdcdcdcdcd" in lines[3] and "-0.0100 [-0.0400, +0.0200]" in lines[3]


def test_a_damaged_version_is_named_and_no_registry_is_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    registry_dir = tmp_path / "registry"
    assert models.main(["--registry_dir", str(registry_dir)]) == 0
    assert capsys.readouterr().out.strip() == "no models yet"
    steps.register_version(
        saved_model(tmp_path / "m1", 0.9), str(registry_dir), "leaves", True, "ok", details(0.9, None)
    )
    (version_json,) = registry_dir.glob("*/1/version.json")
    version_json.chmod(0o644)
    version_json.write_text("{not json")
    assert models.main(["--registry_dir", str(registry_dir)]) == 0
    row = capsys.readouterr().out.splitlines()[2]
    assert row.split()[0] == "1" and "damaged:" in row and "version.json is not JSON" in row


def test_a_stray_file_or_one_damaged_model_leaves_the_others_listed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    registry_dir = tmp_path / "registry"
    for name in ("good", "bad"):
        steps.register_version(
            saved_model(tmp_path / name, 0.9), str(registry_dir), name, True, "ok", details(0.9, None)
        )
    (registry_dir / "README").write_text("our team's registry\n")
    (aliases_json,) = registry_dir.glob("bad/aliases.json")
    aliases_json.chmod(0o644)
    aliases_json.write_text('{"champion": "../x"}')
    assert models.main(["--registry_dir", str(registry_dir)]) == 0
    out = capsys.readouterr().out
    assert "good" in out and "damaged:" in out and "README" not in out


def test_a_hand_edited_version_is_one_row_and_drives_no_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A shared registry: one version.json edited by hand (a figure that is no number, a name
    carrying escape sequences) is named in its row; the table still lists the others, and no
    byte of a file reaches the terminal as a control character."""
    registry_dir = tmp_path / "registry"
    for n in (1, 2):
        steps.register_version(
            saved_model(tmp_path / f"m{n}", 0.9),
            str(registry_dir),
            "leaves",
            n == 1,
            "ok",
            details(0.9, None),
        )
    two, one = sorted(registry_dir.glob("*/*/version.json"))  # `one` is version 2: the name shown
    record = json.loads(one.read_text())
    record["model"] = "leaves\x1b[2J\x1b]0;pwned\x07"
    one.chmod(0o644)
    one.write_text(json.dumps(record))
    record = json.loads(two.read_text())
    record["evaluation"]["models"] = "not a mapping"
    two.chmod(0o644)
    two.write_text(json.dumps(record))
    assert models.main(["--registry_dir", str(registry_dir)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out, repr(out)
    assert "\\x1b[2J" in out, repr(out)
    rows = out.splitlines()[2:]
    assert rows[0].split()[0] == "1" and "damaged:" in rows[0] and rows[1].split()[0] == "2"
