"""The local model registry's guards: a `--registry_dir` that cannot be written is refused before
the first step (not at upload, after the whole run), and the champion alias is decided again
under the registry's lock, so two concurrent runs never hand it to the worse model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kfp import dsl

import pipeline
from local import steps
from pipeline import options

CLASSES = ["cbb", "cbsd", "cgm", "cmd", "healthy"]
NAME = "cassava-classifier"


def local_args(**overrides: Any) -> dict[str, Any]:
    return {**{q.name: q.default_for("local") for q in pipeline.parameters_for("local")}, **overrides}


# --- registry_dir, checked before any step ---------------------------------------------------


def test_a_registry_dir_to_be_made_or_already_there_passes_and_nothing_is_left(tmp_path: Path) -> None:
    options.check(local_args(registry_dir=str(tmp_path / "new" / "registry")), "local")
    assert list(tmp_path.iterdir()) == []  # checked, not created: upload-model makes it
    (tmp_path / "registry").mkdir()
    options.check(local_args(registry_dir=str(tmp_path / "registry")), "local")
    assert list((tmp_path / "registry").iterdir()) == []  # the probe file is removed


def test_a_registry_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "registry").write_text("not a folder")
    with pytest.raises(ValueError, match=f"registry_dir: {tmp_path / 'registry'} exists and is not a folder"):
        options.check(local_args(registry_dir=str(tmp_path / "registry")), "local")
    with pytest.raises(ValueError, match=rf"cannot be created: {tmp_path / 'registry'} is not a folder"):
        options.check(local_args(registry_dir=str(tmp_path / "registry" / "models")), "local")


@pytest.mark.parametrize("target", ["real", "nowhere"])
def test_a_registry_dir_that_is_a_link_is_refused_before_any_step(target: str, tmp_path: Path) -> None:
    """The first step opens it without following a link (local.registry): refused here, not there."""
    (tmp_path / "real").mkdir()
    (tmp_path / "registry").symlink_to(tmp_path / target)
    with pytest.raises(options.OptionsError) as err:
        options.check(local_args(registry_dir=str(tmp_path / "registry")), "local")
    assert err.value.parameters == {"registry_dir"}


def test_a_model_folder_another_user_made_in_a_shared_registry_is_refused_before_any_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The registry is writable, the model's folder in it is not (simulated: root writes anywhere)."""
    import tempfile

    (tmp_path / "registry" / NAME).mkdir(parents=True)
    real = tempfile.mkstemp

    def mkstemp(prefix: str, dir: str) -> tuple[int, str]:
        if Path(dir) == tmp_path / "registry" / NAME:
            raise PermissionError(13, "Permission denied")
        return real(prefix=prefix, dir=dir)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    with pytest.raises(options.OptionsError) as err:
        options.check(local_args(registry_dir=str(tmp_path / "registry"), model_display_name=NAME), "local")
    assert err.value.parameters == {"registry_dir"} and NAME in str(err.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_registry_dir_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "registry"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(ValueError, match=f"registry_dir: {folder} is not writable"):
            options.check(local_args(registry_dir=str(folder)), "local")
        with pytest.raises(ValueError, match=f"cannot be created in {folder}"):
            options.check(local_args(registry_dir=str(folder / "models")), "local")
    finally:
        folder.chmod(0o755)


def test_a_registry_dir_on_a_read_only_filesystem_is_refused() -> None:
    """Also as root: /sys is mounted read-only in containers (skipped where it is writable)."""
    probe = Path("/sys")
    if not probe.is_dir() or _writable(probe):
        pytest.skip("no read-only folder on this machine")
    with pytest.raises(ValueError, match="registry_dir: /sys is not writable"):
        options.check(local_args(registry_dir="/sys"), "local")
    with pytest.raises(ValueError, match="registry_dir: /sys/no/registry cannot be created in /sys "):
        options.check(local_args(registry_dir="/sys/no/registry"), "local")


def _writable(folder: Path) -> bool:
    try:
        (folder / ".probe").touch()
    except OSError:
        return False
    (folder / ".probe").unlink()
    return True


# --- the champion alias, decided under the registry's lock ------------------------------------


def fake_model(folder: Path, accuracy: float, classes: list[str] = CLASSES) -> Path:
    folder.mkdir(parents=True)
    (folder / "saved_model.pb").write_bytes(b"pb")
    (folder / "metrics.json").write_text(json.dumps({"test_accuracy": accuracy, "class_names": classes}))
    return folder


def register(
    registry: Path, model: Path, promote: bool = True, reason: str = "gate passed", evaluated: str = ""
) -> tuple:
    return steps.register_version(
        str(model), str(registry), NAME, promote, reason, {"source_uri": str(model)}, evaluated
    )


def aliases(registry: Path) -> dict[str, str]:
    return json.loads((registry / NAME / "aliases.json").read_text())


def version_record(registry: Path, version: str) -> dict[str, Any]:
    return json.loads((registry / NAME / version / "version.json").read_text())


def test_a_stale_gate_does_not_take_the_alias(tmp_path: Path) -> None:
    """Runs A and B both passed the gate against champion v1, evaluated at their start. A
    registers first and becomes the champion; B was never compared with A on like-for-like data,
    so its promote=True is stale, whatever its own figures (B is even more accurate here)."""
    registry = tmp_path / "registry"
    assert register(registry, fake_model(tmp_path / "v1", 0.90))[2] is True
    a = register(registry, fake_model(tmp_path / "a", 0.95), reason="0.95 >= 0.90", evaluated="1")
    b = register(registry, fake_model(tmp_path / "b", 0.97), reason="0.97 >= 0.90", evaluated="1")
    assert a[:3] == ("2", str(registry / NAME / "2"), True)
    assert b[:3] == ("3", str(registry / NAME / "3"), False)
    assert "champion is now on version 2, but was on version 1 when this run's gate compared" in b[3]
    assert aliases(registry) == {"default": "2", "champion": "2"}  # default moves with champion
    record = version_record(registry, "3")  # the decision and its reason, beside the version
    assert record["gate"] == {"promote": True, "reason": "0.97 >= 0.90"}
    assert record["alias"]["moved"] is False and record["alias"]["reason"] == b[3]
    before = record["alias"]["before"]
    assert (before["version"], before["test_accuracy"], before["class_names"]) == ("2", 0.95, CLASSES)
    assert version_record(registry, "2")["alias"]["moved"] is True


def test_the_first_two_models_race_for_an_empty_registry(tmp_path: Path) -> None:
    registry = tmp_path / "registry"
    register(registry, fake_model(tmp_path / "a", 0.95), reason="no champion yet")
    held = register(registry, fake_model(tmp_path / "b", 0.97), reason="no champion yet")
    assert held[2] is False and "was on no version" in held[3] and aliases(registry)["champion"] == "1"


def test_a_passed_gate_against_the_current_champion_takes_the_alias_and_a_held_gate_never_does(
    tmp_path: Path,
) -> None:
    registry = tmp_path / "registry"
    register(registry, fake_model(tmp_path / "v1", 0.90))
    passed = register(
        registry, fake_model(tmp_path / "v2", 0.80), reason="macro F1 0.91 >= 0.90", evaluated="1"
    )
    assert passed[2] is True and "the gate passed it against champion version 1" in passed[3]
    held = register(
        registry, fake_model(tmp_path / "v3", 0.99), promote=False, reason="below min_score", evaluated="2"
    )
    assert held[2] is False and held[3] == "the gate held it: below min_score"
    assert aliases(registry) == {"default": "2", "champion": "2"}  # default moves with champion


def test_a_model_of_another_task_never_takes_the_alias_under_the_lock(tmp_path: Path) -> None:
    registry = tmp_path / "registry"
    register(registry, fake_model(tmp_path / "v1", 0.80))
    other = register(registry, fake_model(tmp_path / "one-class", 1.0, ["healthy"]), evaluated="1")
    assert other[2] is False and "is of another task" in other[3] and "['healthy']" in other[3]
    assert aliases(registry)["champion"] == "1"


def test_concurrent_registrations_get_distinct_versions_and_one_alias_move(tmp_path: Path) -> None:
    """Every gate passed against an empty registry: whatever order the lock lets them in, each
    gets its own version, the first registered takes the alias, and every other one is held as
    stale (it was compared with no champion, and there is one by then)."""
    registry = tmp_path / "registry"
    models = [fake_model(tmp_path / f"m{i}", 0.9 + i / 100) for i in range(6)]
    with ThreadPoolExecutor(len(models)) as pool:
        results = list(pool.map(lambda m: register(registry, m, reason="no champion yet"), models))
    assert sorted(int(r[0]) for r in results) == list(range(1, len(models) + 1))
    assert [r[0] for r in results if r[2]] == ["1"] and aliases(registry)["champion"] == "1"
    assert all("was on no version" in r[3] for r in results if not r[2])


# --- the component: serving check (stubbed), then the same guarded registration ----------------


@pytest.fixture
def serving_check_passes(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Stands in for `python -m trainer.serve` (which runs under the serving image's TensorFlow)."""
    calls: list[list[str]] = []
    real_run = subprocess.run

    def run(cmd: Any, *args: Any, **kwargs: Any) -> Any:
        if list(cmd[1:3]) != ["-m", "trainer.serve"]:
            return real_run(cmd, *args, **kwargs)
        calls.append(list(cmd))
        line = json.dumps({"image": "test-0.jpg", "class_name": "cbb", "class_index": 0})
        return subprocess.CompletedProcess(cmd, 0, stdout=line + "\n", stderr="")

    monkeypatch.setattr(subprocess, "run", run)
    return calls


def upload(registry: Path, model: Path, promote: bool, **serving: str) -> Any:
    return steps.local_upload_model.python_func(
        model=dsl.Model(uri=str(model)),
        registry_dir=str(registry),
        model_display_name=NAME,
        **{
            # A user's image: checked under this interpreter (stubbed here), no serving env.
            "serving_image": "us-docker.pkg.dev/p/r/my-server@sha256:" + "0" * 64,
            "artifact_uri": str(model),
            "predict_route": "",
            **serving,
        },
        labels={"team": "ml"},
        promote=promote,
        gate_reason="passed against the champion read at the start of the run",
        description="Promoted on accuracy over this run's test split",
        evaluated_champion="",
        evaluation_dir=str(evaluation_dir(model.parent)),
    )


def evaluation_dir(folder: Path) -> Path:
    """An evaluation job's output, as trainer.evaluate writes it (challenger alone)."""
    base = folder / "evaluation"
    (base / "model").mkdir(parents=True, exist_ok=True)
    figures = {"examples": 10, "accuracy": 0.9, "macro_f1": 0.88, "loss": 0.3, "recorded": {}}
    document = {"split": "test", "dataset_fingerprint": "sha256:ab", "models": {"challenger": figures}}
    (base / "model" / "evaluation.json").write_text(json.dumps(document))
    return base


def test_the_upload_step_does_not_take_the_alias_on_a_stale_gate(
    tmp_path: Path, serving_check_passes: list[list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    registry = tmp_path / "registry"
    better = upload(registry, fake_model(tmp_path / "a", 0.95), promote=True)
    stale = upload(registry, fake_model(tmp_path / "b", 0.92), promote=True)
    assert (better.version, better.champion) == ("1", True)
    assert (stale.version, stale.champion) == ("2", False)
    assert aliases(registry) == {"default": "1", "champion": "1"}
    out = capsys.readouterr().out
    assert "registered cassava-classifier version 2 at " in out and "champion NOT moved: " in out
    record = version_record(registry, "2")
    assert record["labels"] == {"team": "ml"} and record["serving_check"][0]["class_name"] == "cbb"
    assert record["evaluation"]["models"]["challenger"]["macro_f1"] == 0.88
    assert record["description"].startswith("Promoted on accuracy")
    assert [c[0] for c in serving_check_passes] == [sys.executable, sys.executable]


def test_tensorflow_serving_must_be_given_the_folder_whose_newest_version_is_the_model(
    tmp_path: Path, serving_check_passes: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The custom image serves the highest numbered folder of its artifact (`registered_artifact`):
    the model is checked under TensorFlow Serving's TensorFlow, and registered only when that
    folder is the model."""
    from components import servingimage
    from local import servingenv

    asked: list[str] = []

    def python_for(version: str) -> str:
        asked.append(version)
        return sys.executable

    monkeypatch.setattr(servingenv, "python_for", python_for)
    custom = {"serving_image": "r/trainer-serving:t", **servingimage.tf_serving_routes()}
    del custom["health_route"]
    registry = tmp_path / "registry"
    model = fake_model(tmp_path / "run" / "1", 0.9)
    (tmp_path / "run" / "0").mkdir()  # an older version below it is not served
    assert upload(registry, model, promote=True, artifact_uri=str(tmp_path / "run"), **custom).version == "1"
    assert asked == [servingimage.CUSTOM_SERVING_TF_VERSION]
    assert version_record(registry, "1")["artifact_uri"] == str(tmp_path / "run")
    (tmp_path / "run" / "2").mkdir()  # TensorFlow Serving would serve this one instead
    for artifact in (tmp_path / "run", model, tmp_path / "elsewhere"):
        with pytest.raises(RuntimeError, match="TensorFlow Serving"):
            upload(registry, model, promote=True, artifact_uri=str(artifact), **custom)
    assert aliases(registry) == {"default": "1", "champion": "1"}  # nothing more was registered


def test_a_champion_nobody_can_deploy_counts_as_none_and_loses_the_alias(tmp_path: Path) -> None:
    """As on Vertex (`components.registry.find_champion`): a champion registered with a prebuilt
    serving image past its end of availability is no usable champion; a model that passes the gate
    takes the alias (and `default`), and the old version stays in the registry."""
    registry = tmp_path / "registry"
    ended = "us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-13:latest"  # ended 2025-11-28
    steps.register_version(
        str(fake_model(tmp_path / "v1", 0.99)), str(registry), NAME, True, "first", {"serving_image": ended}
    )
    found = steps.local_find_champion.python_func(registry_dir=str(registry), model_display_name=NAME)
    assert (found.champion_version, found.class_names) == ("", [])
    version, _, champion, _ = register(registry, fake_model(tmp_path / "v2", 0.50), reason="floor alone")
    assert (version, champion) == ("2", True) and aliases(registry) == {"default": "2", "champion": "2"}
