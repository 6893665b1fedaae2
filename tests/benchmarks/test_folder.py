"""The folder benchmark: its rendered folders and its bookkeeping (no pipeline runs)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from benchmarks import charfolder, folder
from benchmarks.common import validate_result

MACHINE = {"cpu_count": 2, "cpu_model": "Test CPU", "python": "3.11", "tensorflow": "2.21.0", "gpu": None}


def digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.png")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def hard(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return charfolder.render(tmp_path_factory.mktemp("chars") / "hard", "hard", seed=3, per_class=(6, 2))


def test_a_rendered_folder_has_the_layout_a_folder_source_takes(hard: Path) -> None:
    for split, count in (("train", 6), ("test", 2)):
        assert sorted(p.name for p in (hard / split).iterdir()) == sorted(charfolder.CLASSES)
        for name in charfolder.CLASSES:
            images = sorted((hard / split / name).glob("*.png"))
            assert len(images) == count
    image = Image.open(next((hard / "train" / "b").glob("*.png")))
    assert image.size == (charfolder.SIDE, charfolder.SIDE) and image.mode == "RGB"


def test_the_same_seed_renders_the_same_folder_and_another_seed_another(hard: Path, tmp_path: Path) -> None:
    assert digest(charfolder.render(tmp_path / "again", "hard", seed=3, per_class=(6, 2))) == digest(hard)
    assert digest(charfolder.render(tmp_path / "other", "hard", seed=4, per_class=(6, 2))) != digest(hard)


def test_b_and_d_are_mirror_images_so_a_flip_changes_the_class(tmp_path: Path) -> None:
    """What the variants are for: the mean `b` of the clean folder mirrored left-right is much
    closer to the mean `d` than to the mean `b` (and `p` to `q`)."""
    root = charfolder.render(tmp_path / "clean", "clean", seed=1, per_class=(30, 0))

    def mean(name: str) -> np.ndarray:
        # Each character's ink, cropped to its bounding box and scaled to 32x32, averaged.
        shapes = []
        for path in (root / "train" / name).glob("*.png"):
            ink = Image.eval(Image.open(path).convert("L"), lambda v: 255 - v)
            shapes.append(np.asarray(ink.crop(ink.getbbox()).resize((32, 32)), float) / 255.0)
        return np.mean(shapes, axis=0)

    for left, right in (("b", "d"), ("p", "q")):
        flipped = mean(left)[:, ::-1]
        assert np.abs(flipped - mean(right)).sum() < 0.5 * np.abs(flipped - mean(left)).sum(), (left, right)


def test_render_refuses_an_unknown_variant_and_a_folder_with_files(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown variant 'blurry'; known: clean, hard"):
        charfolder.render(tmp_path / "x", "blurry")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="is not empty"):
        charfolder.render(tmp_path / "used", "clean")
    assert (tmp_path / "used" / "keep.txt").read_text() == "mine"


def summary(
    accuracy: float, *, epochs: int = 30, completed: int = 12, status: str = "SUCCEEDED"
) -> dict[str, Any]:
    return {
        "status": status,
        "error": "" if status == "SUCCEEDED" else "step train-model failed",
        "metrics": {
            "test_accuracy": accuracy,
            "macro_f1": accuracy,
            "epochs_completed": completed,
            "best_epoch": completed - 5,
            "stopped_early": completed < epochs,
        },
        "gate": {"promote": accuracy >= 0.9},
        "parameters": {"epochs": epochs, "early_stopping_patience": 5},
    }


def variants(defaults: float, reference: float) -> dict[str, Any]:
    return {
        "clean": {
            "defaults": folder.run_figures(summary(1.0), 60.0),
            "reference": folder.run_figures(summary(1.0, epochs=60, completed=60), 120.0),
        },
        "hard": {
            "defaults": folder.run_figures(summary(defaults), 61.0),
            "reference": folder.run_figures(summary(reference, epochs=60, completed=60), 121.0),
        },
    }


def test_the_goal_is_met_within_the_tolerance_and_missed_beyond_it() -> None:
    met = folder.build_result(variants(0.99, 1.0), inputs={}, wall_seconds=360.0, machine=MACHINE)
    assert validate_result(met) == [] and met["goal_met"] is True
    assert met["figures"]["gaps"] == {"clean": 0.0, "hard": 0.01}
    assert met["ratio"] == pytest.approx((1.0 + 0.99) / 2 / 1.0, abs=1e-3)
    assert "hard: defaults 0.990 in 12 epochs" in met["summary"]
    missed = folder.build_result(variants(0.9, 1.0), inputs={}, wall_seconds=360.0, machine=MACHINE)
    assert missed["goal_met"] is False and missed["figures"]["gaps"]["hard"] == 0.1


def test_a_failed_run_or_one_without_metrics_is_an_error_not_a_figure() -> None:
    with pytest.raises(folder.FolderBenchmarkError, match="ended FAILED: step train-model failed"):
        folder.run_figures(summary(0.5, status="FAILED"), 1.0)
    with pytest.raises(folder.FolderBenchmarkError, match="no test_accuracy"):
        folder.run_figures({"status": "SUCCEEDED", "metrics": {}}, 1.0)
