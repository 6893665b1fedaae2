"""A shared local registry cannot be turned against its users, and a damaged one never ends a run
in a traceback: whoever can write `<registry_dir>` cannot make the next run truncate, overwrite or
publish outside it (no link is followed, nothing existing is opened for writing), every file is
read through one validator that names the damaged file and the fix, and a damaged champion is
"no usable champion" (one line, the path, the fix) instead of blocking the registry."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from local import registry, steps
from tests.local.test_registry_guard import NAME, aliases, fake_model, register

VICTIM = "the user's own file\n"


def victim(tmp_path: Path) -> Path:
    path = tmp_path / "home" / "notes.txt"
    path.parent.mkdir(exist_ok=True)
    path.write_text(VICTIM)
    return path


def find(registry_dir: Path) -> Any:
    return steps.local_find_champion.python_func(registry_dir=str(registry_dir), model_display_name=NAME)


def started(tmp_path: Path) -> Path:
    """A registry with version 1 as its champion."""
    reg = tmp_path / "registry"
    assert register(reg, fake_model(tmp_path / "v1", 0.90))[2] is True
    return reg


# --- nothing through a link, nothing existing opened for writing ------------------------------


def test_a_lock_linked_to_a_users_file_is_refused_and_the_file_is_not_truncated(tmp_path: Path) -> None:
    reg, target = started(tmp_path), victim(tmp_path)
    (reg / NAME / ".lock").unlink()
    (reg / NAME / ".lock").symlink_to(target)
    with pytest.raises(registry.Damaged, match=rf"{reg / NAME / '.lock'} is a symbolic link \(to {target}\)"):
        register(reg, fake_model(tmp_path / "v2", 0.95), evaluated="1")
    assert target.read_text() == VICTIM
    assert sorted(p.name for p in (reg / NAME).iterdir()) == [
        ".lock",
        "1",
        "aliases.json",
    ]  # nothing published


def test_the_lock_is_never_written_a_hard_link_to_it_keeps_its_content(tmp_path: Path) -> None:
    reg, target = started(tmp_path), victim(tmp_path)
    (reg / NAME / ".lock").unlink()
    os.link(target, reg / NAME / ".lock")
    register(reg, fake_model(tmp_path / "v2", 0.95), evaluated="1")
    assert target.read_text() == VICTIM


def test_a_planted_temporary_aliases_file_is_never_written_through(tmp_path: Path) -> None:
    reg, target = started(tmp_path), victim(tmp_path)
    (reg / NAME / "aliases.json.tmp").symlink_to(target)
    version, _, champion, _ = register(reg, fake_model(tmp_path / "v2", 0.95), evaluated="1")
    assert (version, champion) == ("2", True) and target.read_text() == VICTIM
    assert aliases(reg) == {"default": "2", "champion": "2"}  # default moves with champion
    assert not (reg / NAME / "aliases.json").is_symlink()
    left = sorted(p.name for p in (reg / NAME).iterdir())
    assert left == [".lock", "1", "2", "aliases.json", "aliases.json.tmp"]  # no temporary file left


def test_a_planted_staging_link_publishes_nothing_outside_the_registry(tmp_path: Path) -> None:
    reg = started(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for name in (".2.partial", ".staging"):
        (reg / NAME / name).symlink_to(elsewhere)
    version, where, _, _ = register(reg, fake_model(tmp_path / "v2", 0.95), evaluated="1")
    assert list(elsewhere.iterdir()) == []
    assert (
        version == "2"
        and not Path(where).is_symlink()
        and (Path(where) / "model" / "saved_model.pb").is_file()
    )
    record = json.loads((Path(where) / "version.json").read_text())
    assert record["version"] == "2" and set(record["files"]) == {"saved_model.pb", "metrics.json"}


def test_an_aliases_file_linked_elsewhere_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    reg, target = started(tmp_path), victim(tmp_path)
    (reg / NAME / "aliases.json").unlink()
    (reg / NAME / "aliases.json").symlink_to(target)
    with pytest.raises(registry.Damaged, match=rf"aliases.json is a symbolic link \(to {target}\).*mv "):
        find(reg)
    with pytest.raises(registry.Damaged, match=r"aliases.json is a symbolic link"):
        register(reg, fake_model(tmp_path / "v2", 0.95), evaluated="1")
    assert target.read_text() == VICTIM and not (reg / NAME / "2").exists()


def test_a_model_or_registry_folder_that_is_a_link_is_refused_naming_it(tmp_path: Path) -> None:
    reg = started(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    (reg / NAME).rename(elsewhere)
    (reg / NAME).symlink_to(elsewhere)
    for call in (lambda: find(reg), lambda: register(reg, fake_model(tmp_path / "v2", 0.95), evaluated="1")):
        with pytest.raises(registry.Damaged, match=rf"{reg / NAME} is a symbolic link \(to {elsewhere}\)"):
            call()
    assert sorted(p.name for p in elsewhere.iterdir()) == [".lock", "1", "aliases.json"]
    link = tmp_path / "registry-link"
    link.symlink_to(elsewhere.parent)
    with pytest.raises(
        registry.Damaged, match=rf"{link} is a symbolic link .*give --registry_dir the folder itself"
    ):
        find(link)


def test_an_alias_that_is_a_path_is_refused_and_nothing_outside_is_read(tmp_path: Path) -> None:
    reg = started(tmp_path)
    outside = tmp_path / "x" / "model"
    outside.mkdir(parents=True)
    (outside / "metrics.json").write_text(json.dumps({"test_accuracy": 1.0, "class_names": ["a", "b"]}))
    (reg / NAME / "aliases.json").write_text(json.dumps({"default": "1", "champion": "../../x"}))
    expected = r"aliases.json puts alias 'champion' on '../../x', which is not a version number"
    with pytest.raises(registry.Damaged, match=expected):
        find(reg)
    with pytest.raises(registry.Damaged, match=expected):
        register(reg, fake_model(tmp_path / "v2", 0.95), evaluated="1")
    assert not (reg / NAME / "2").exists()


@pytest.mark.parametrize("value", ["01", "0", "1.0", "-1", " 1", 1])
def test_only_versions_as_the_registry_writes_them_are_aliases(tmp_path: Path, value: Any) -> None:
    reg = started(tmp_path)
    (reg / NAME / "aliases.json").write_text(json.dumps({"default": "1", "champion": value}))
    with pytest.raises(registry.Damaged, match="not a version number as the registry writes it"):
        find(reg)


# --- a damaged registry: named, with its fix, or "no usable champion" -------------------------


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda a: a.write_text("[1, 2]"), "aliases.json holds a list, not an object"),
        (lambda a: a.write_text("{"), "aliases.json is not JSON"),
        (lambda a: (a.unlink(), a.mkdir()), "aliases.json is a folder"),
        (lambda a: a.write_text('{"Champion!": "1"}'), "aliases.json names an alias 'Champion!'"),
    ],
)
def test_a_damaged_aliases_file_is_named_with_its_fix(tmp_path: Path, damage: Any, problem: str) -> None:
    reg = started(tmp_path)
    damage(reg / NAME / "aliases.json")
    fix = 'the registry writes {"default": "1", "champion": "<a version folder>"}'
    for call in (lambda: find(reg), lambda: register(reg, fake_model(tmp_path / "v2", 0.95), evaluated="1")):
        with pytest.raises(registry.Damaged) as raised:
            call()
        message = str(raised.value)
        assert problem in message and fix in message and "\n" not in message
    assert not (reg / NAME / "2").exists()


def test_a_lock_that_is_a_folder_is_refused_with_its_fix(tmp_path: Path) -> None:
    reg = started(tmp_path)
    (reg / NAME / ".lock").unlink()
    (reg / NAME / ".lock").mkdir()
    lock = reg / NAME / ".lock"
    with pytest.raises(registry.Damaged, match=rf"{lock} is a folder; .*remove {lock} and run again"):
        register(reg, fake_model(tmp_path / "v2", 0.95), evaluated="1")


def _truncate_saved_model(version: Path) -> None:
    pb = version / "model" / "saved_model.pb"
    pb.write_bytes(pb.read_bytes()[:1])


DAMAGES = {
    "version missing": (lambda v: _rmtree(v), "/1 is missing"),
    "version a file": (lambda v: (_rmtree(v), v.write_text("x")), "/1 is not a folder"),
    "version a link": (lambda v: (_rmtree(v), v.symlink_to(v.parent / "2")), "/1 is a symbolic link"),
    "metrics missing": (lambda v: (v / "model" / "metrics.json").unlink(), "metrics.json is missing"),
    "metrics a string": (
        lambda v: (v / "model" / "metrics.json").write_text('"0.9"'),
        "holds a str, not an object",
    ),
    "accuracy a string": (
        lambda v: (v / "model" / "metrics.json").write_text('{"test_accuracy": "x", "class_names": ["a"]}'),
        "has test_accuracy 'x', not a number",
    ),
    "SavedModel truncated": (_truncate_saved_model, "saved_model.pb has 1 bytes, 2 when registered"),
    "SavedModel missing": (lambda v: (v / "model" / "saved_model.pb").unlink(), "saved_model.pb is missing"),
    "version.json a list": (lambda v: (v / "version.json").write_text("[]"), "version.json holds a list"),
}


def _rmtree(path: Path) -> bool:
    import shutil

    shutil.rmtree(path)
    return True


@pytest.mark.parametrize("case", sorted(DAMAGES))
def test_a_damaged_champion_is_no_usable_champion_and_the_next_model_takes_the_alias(
    tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    tmp_path = tmp_path / "a {braced} folder"  # a path in a fix is never read as a format string
    tmp_path.mkdir()
    reg = started(tmp_path)
    damage, problem = DAMAGES[case]
    damage(reg / NAME / "1")
    out = find(reg)
    assert (out.exists, out.champion_version, out.champion_uri, out.class_names) == (True, "", "", [])
    line = capsys.readouterr().out.strip()
    assert "\n" not in line and problem in line
    assert "champion version 1 is damaged, so this run has no usable champion and compares with none" in line
    assert f"to keep it as champion instead, restore {reg / NAME / '1'} from a copy" in line
    # The run goes on without a comparison; under the lock the champion is still unusable, so the
    # model that passed the gate takes the alias, and version 1 stays as it is.
    version, _, champion, reason = register(
        reg, fake_model(tmp_path / "v2", 0.95), reason="0.95 >= min_score"
    )
    assert (version, champion) == ("2", True) and aliases(reg) == {
        "default": "2",
        "champion": "2",
    }  # never "1" again
    assert "and there is no usable champion (champion version 1 is damaged: " in reason and problem in reason
    before = json.loads((reg / NAME / "2" / "version.json").read_text())["alias"]["before"]
    assert before["version"] == "1" and problem in before["unusable"]
    assert find(reg).champion_version == "2"


def test_a_champion_repaired_after_the_gate_compared_with_none_keeps_the_alias(tmp_path: Path) -> None:
    reg = started(tmp_path)
    metrics = reg / NAME / "1" / "model" / "metrics.json"
    sound = metrics.read_text()
    metrics.unlink()
    assert find(reg).champion_version == ""
    metrics.write_text(sound)  # repaired while the run trained
    held = register(reg, fake_model(tmp_path / "v2", 0.95), reason="0.95 >= min_score")
    assert held[2] is False and "champion is now on version 1, but was on no version" in held[3]
    assert aliases(reg)["champion"] == "1"


# --- publishing: whole or not at all ----------------------------------------------------------


def test_an_interrupted_registration_leaves_no_staging_and_no_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reg = started(tmp_path)

    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(registry, "_copy_tree", interrupted)
    with pytest.raises(KeyboardInterrupt):
        register(reg, fake_model(tmp_path / "v2", 0.95), evaluated="1")
    assert sorted(p.name for p in (reg / NAME).iterdir()) == [".lock", "1", "aliases.json"]
    assert aliases(reg) == {"default": "1", "champion": "1"}


def test_a_link_inside_the_model_to_register_is_refused(tmp_path: Path) -> None:
    reg = started(tmp_path)
    model = fake_model(tmp_path / "v2", 0.95)
    (model / "variables").symlink_to(victim(tmp_path).parent)
    with pytest.raises(registry.RegistryError, match=rf"{model / 'variables'} is a symbolic link"):
        register(reg, model, evaluated="1")
    assert sorted(p.name for p in (reg / NAME).iterdir()) == [".lock", "1", "aliases.json"]


def test_the_validator_checks_the_keys_the_trainer_contract_names() -> None:
    assert registry.METRICS_KEYS == steps.METRICS_READ


def test_a_killed_registrations_staging_folder_is_removed_by_the_next(tmp_path: Path) -> None:
    """A registration killed mid-copy left `.staging-<hex>` (405 MB in the report), which no later
    run removed and `make models` does not show: the next registration, holding the lock, removes
    it; a link or a file of that name is not the registry's and stays, as does what it points to."""
    reg, target = started(tmp_path), victim(tmp_path)
    model = reg / NAME
    stale = model / ".staging-0123456789abcdef"
    (stale / "model").mkdir(parents=True)
    (stale / "model" / "saved_model.pb").write_bytes(b"x" * 1000)
    (model / ".staging-fedcba9876543210").symlink_to(target.parent)
    register(reg, fake_model(tmp_path / "v2", 0.95), evaluated="1")
    assert not stale.exists()
    assert (model / ".staging-fedcba9876543210").is_symlink() and target.read_text() == VICTIM


def test_a_model_folder_this_user_cannot_write_is_named_as_such_not_as_damaged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shared registry whose model folder another user made: creating the lock or the staging
    folder is refused by the system (simulated: this test may run as root). The message says so,
    not "the lock is missing", and no bare PermissionError escapes."""
    import errno

    folder = tmp_path / NAME
    folder.mkdir()
    (tmp_path / "source").mkdir()
    model_fd = os.open(folder, os.O_RDONLY)

    def denied(real: Any, names: tuple[str, ...]) -> Any:
        def call(name: Any, *args: Any, **kwargs: Any) -> Any:
            if str(name).startswith(names):
                raise PermissionError(errno.EACCES, "Permission denied")
            return real(name, *args, **kwargs)

        return call

    monkeypatch.setattr(registry.os, "open", denied(os.open, (".lock",)))
    monkeypatch.setattr(registry.os, "mkdir", denied(os.mkdir, (".staging-",)))
    try:
        for attempt in (
            lambda: registry.locked(model_fd, str(folder)).__enter__(),
            lambda: registry.publish(model_fd, str(folder), str(tmp_path / "source"), {}, {}),
        ):
            with pytest.raises(registry.RegistryError) as err:
                attempt()
            assert not isinstance(err.value, registry.Damaged) and str(folder) in str(err.value)
    finally:
        os.close(model_fd)
