"""`python -m trainer.preparation.sourcecheck`: the preparation's own folder rules, up front, in seconds, with
no TensorFlow; its counts are what the preparation then writes."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from tests.processes import ROOT, trainer_env
from trainer import prepare
from trainer.preparation import folders, sourcecheck
from trainer.preparation.prepareconfig import PrepareConfig
from trainer.preparation.source import PrepareError


def png(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (10, 12, 3), dtype=np.uint8)).save(
        buf, "PNG"
    )
    return buf.getvalue()


def folder(root: Path, counts: dict[str, dict[str, int]]) -> Path:
    for split, classes in counts.items():
        for name, n in classes.items():
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(n):
                (root / split / name / f"{i}.png").write_bytes(png(hash((split, name, i)) % 1000))
    return root


def run(request: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainer.preparation.sourcecheck", *args],
        input=request if isinstance(request, str) else json.dumps(request),
        cwd=ROOT,
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_importing_and_running_it_loads_no_tensorflow(tmp_path: Path) -> None:
    root = folder(tmp_path / "src", {"train": {"a": 2, "b": 2}})
    probe = (
        "import io, sys, json\n"
        "from trainer.preparation import sourcecheck\n"
        f"sys.stdin = io.StringIO(json.dumps({{'source': 'folder:{root}'}}))\n"
        "out = io.StringIO(); sys.stdout, real = out, sys.stdout\n"
        "code = sourcecheck.main([])\n"
        "sys.stdout = real\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'tf_keras', 'keras', 'tensorflow_datasets'))\n"
        "print(json.dumps({'code': code, 'heavy': heavy, 'answer': json.loads(out.getvalue())}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=trainer_env(), capture_output=True, text=True
    )
    result = json.loads(done.stdout)
    assert result["heavy"] == [], result["heavy"]
    assert result["code"] == 0 and result["answer"]["checked"] and result["answer"]["problems"] == []


@pytest.mark.process
def test_the_counts_are_what_preparation_writes(tmp_path: Path) -> None:
    """Validation is carved from train (with the fractions asked), test is the folder's own."""
    root = folder(tmp_path / "src", {"train": {"a": 9, "b": 6, "c": 5}, "test": {"a": 2, "b": 3, "c": 1}})
    (root / "train" / "a" / "scan.tiff").write_bytes(b"II*\0")
    (root / "notes.txt").write_text("x")
    done = run({"source": f"folder:{root}", "validation_fraction": 0.25})
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["problems"] == [] and answer["checked"] is True
    counts = answer["counts"]
    meta = prepare.prepare(
        PrepareConfig(
            source=f"folder:{root}", output_dir=str(tmp_path / "out"), image_size=32, validation_fraction=0.25
        )
    )
    assert counts["prepared"] == {split: v["count"] for split, v in meta["splits"].items()}
    assert counts["carved"] == ["validation"]
    assert counts["classes"] == meta["class_names"]
    assert counts["images"]["test"] == meta["splits"]["test"]["class_counts"]
    assert counts["split_images"] == {"train": 20, "test": 6}
    assert counts["images_checked"] == 26 and counts["complete"] is True and counts["stopped"] is None
    assert counts["skipped"] == meta["source_info"]["skipped"]
    assert counts["skipped_summary"] == folders.list_folder(str(root)).skipped.summary()
    assert "1 .tiff (TensorFlow cannot decode TIFF)" in counts["skipped_summary"]


def _bad(root: Path, case: str) -> tuple[str, str]:
    """A bad source, and a problem the answer must hold."""
    if case == "missing":
        return f"folder:{root}", f"--source folder:{root}: no such folder"
    if case == "file":
        root.write_text("x")
        return f"folder:{root}", f"{root} is a file, not a folder"
    if case == "root":
        return "folder:/", "/ is the file system's root, not an image folder"
    if case == "no train":
        folder(root, {"test": {"a": 1, "b": 1}})
        return f"folder:{root}", f"--source folder:{root} has no train/ folder"
    if case == "val":
        folder(root, {"train": {"a": 2, "b": 2}, "val": {"a": 1, "b": 1}})
        return f"folder:{root}", f"unknown split folder {root}/val (rename it to validation/)"
    if case == "one class":
        folder(root, {"train": {"a": 3}})
        return f"folder:{root}", "has 1 class(es) ['a']: a classifier needs at least 2"
    if case == "class mismatch":
        folder(root, {"train": {"a": 2, "b": 2}, "test": {"a": 1, "c": 1}})
        return f"folder:{root}", "split 'test' has different classes than train (missing ['b'], extra ['c'])"
    if case == "empty class":
        folder(root, {"train": {"a": 2}})
        (root / "train" / "b").mkdir()
        return f"folder:{root}", f"class 'b' has no images in {root}/train/b (allowed: .jpg, .jpeg, .png"
    if case == "pixel bomb":
        folder(root, {"train": {"a": 2, "b": 2}})
        bomb = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR" + (20000).to_bytes(4, "big") * 2 + b"\x08\x02\0\0\0"
        (root / "train" / "b" / "huge.png").write_bytes(bomb)
        return f"folder:{root}", f"image {root}/train/b/huge.png is 20000x20000 pixels (400,000,000 pixels)"
    if case == "too few to carve":
        folder(root, {"train": {"a": 1, "b": 1}})
        return f"folder:{root}", "train split has 2 images: too few to carve validation and test from it"
    raise AssertionError(case)


BAD = [
    "missing",
    "file",
    "root",
    "no train",
    "val",
    "one class",
    "class mismatch",
    "empty class",
    "pixel bomb",
    "too few to carve",
]


@pytest.mark.parametrize("case", BAD)
def test_a_bad_folder_is_named_with_what_is_allowed(tmp_path: Path, case: str) -> None:
    source, problem = _bad(tmp_path / "src", case)
    answer = sourcecheck.check(source)
    assert answer["checked"] is True
    assert any(problem in line for line in answer["problems"]), answer["problems"]


@pytest.mark.parametrize("case", ["val", "class mismatch", "empty class", "pixel bomb", "missing"])
def test_its_problems_are_the_ones_preparation_refuses_with(tmp_path: Path, case: str) -> None:
    """One set of rules: the job's refusal is, line for line, the check's answer."""
    source, _ = _bad(tmp_path / "src", case)
    with pytest.raises(PrepareError) as err:
        prepare.prepare(PrepareConfig(source=source, output_dir=str(tmp_path / "out"), image_size=32))
    assert str(err.value).splitlines() == sourcecheck.check(source)["problems"]


@pytest.mark.serial  # timed: beside one other serial test at most (make test)
def test_the_file_system_root_and_a_big_tree_answer_in_seconds(tmp_path: Path) -> None:
    start = time.monotonic()
    done = run({"source": "folder:/"})
    assert json.loads(done.stdout)["problems"][0].startswith("--source folder:/: / is the file system's root")
    assert time.monotonic() - start < 5
    root = folder(tmp_path / "src", {"train": {"a": 1, "b": 1}})
    for i in range(3000):
        (root / "train" / "a" / f"x{i}.png").write_bytes(b"")
    answer = sourcecheck.check(f"folder:{root}", budget=folders.ListingBudget(entries=500, seconds=5))
    counts = answer["counts"]
    assert (counts["complete"], counts["stopped"], counts["prepared"]) == (
        False,
        "stopped after 500 entries",
        None,
    )
    assert answer["problems"] == []  # what was not reached is not called a problem


def test_sources_that_are_not_local_folders_are_left_to_the_job() -> None:
    for source in ("synthetic", "tfds:cassava", "folder:gs://bucket/images"):
        answer = sourcecheck.check(source)
        assert (answer["checked"], answer["problems"], answer["counts"]) == (False, [], None)
        assert answer["why"]


@pytest.mark.process
@pytest.mark.parametrize(
    ("request_text", "words"),
    [
        ("not json", "the request is not JSON"),
        ("[]", "must be a JSON object, got list"),
        ('{"source": ""}', "source must be a non-empty string such as folder:PATH"),
        (
            '{"source": "folder:/x", "depth": 3}',
            "unknown keys ['depth']; allowed: source, validation_fraction",
        ),
        ('{"source": "folder:/x", "test_fraction": 0.7}', "test_fraction must be in (0, 0.5)"),
        ('{"source": "folder:/x", "validation_fraction": "a"}', "validation_fraction must be a number"),
    ],
)
def test_a_bad_request_exits_2_naming_what_is_wrong(request_text: str, words: str) -> None:
    done = run(request_text)
    assert done.returncode == 2 and done.stdout == ""
    assert words in done.stderr, done.stderr
