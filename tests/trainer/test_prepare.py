from __future__ import annotations

import inspect
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.processes import ROOT, trainer_env
from trainer import data, datasetinfo
from trainer.preparation.folders import IMAGE_EXTENSIONS
from trainer.preparation.prepareconfig import PrepareConfig
from trainer.preparation.progress import Progress
from trainer.preparation.source import PrepareError
from trainer.prepare import prepare
from trainer.synthetic import CASSAVA_CLASSES


def write_images(folder: Path, count: int, *, seed: int, fmt: str = "jpg") -> None:
    from trainer._tf import tf

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(count):
        image = rng.integers(0, 255, (40 + i, 50, 3), dtype=np.uint8)
        encoded = tf.io.encode_png(image) if fmt == "png" else tf.io.encode_jpeg(image)
        (folder / f"img{i}.{fmt}").write_bytes(encoded.numpy())


ALLOWED = f"each {'/'.join(IMAGE_EXTENSIONS)} entry in a class folder must be a readable image file"
ALLOWED_SPLITS = "allowed split folders: train, validation, test"


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    """train (3 classes, jpg and png) and test; no validation split, so it is carved."""
    root = tmp_path / "images"
    for i, name in enumerate(("daisy", "rose", "tulip")):
        write_images(root / "train" / name, 8, seed=i)
        write_images(root / "test" / name, 2, seed=10 + i, fmt="png")
    (root / "train" / "rose" / "notes.txt").write_text("not an image: ignored")
    return root


def read_split(out: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    meta = datasetinfo.load_metadata(str(out))
    ds = data.make_dataset(str(out), meta, split, batch_size=1000, training=False)
    images, labels = zip(*[(x.numpy(), y.numpy()) for x, y in ds], strict=True)
    return np.concatenate(images), np.concatenate(labels)


def test_synthetic_goes_through_the_tfds_cassava_builder(synthetic_dir: Path) -> None:
    meta = json.loads((synthetic_dir / "metadata.json").read_text())
    assert meta["class_names"] == list(CASSAVA_CLASSES)
    assert meta["source_info"]["tfds_name"] == "cassava"
    assert {s: v["count"] for s, v in meta["splits"].items()} == {
        "train": 300,
        "validation": 100,
        "test": 100,
    }
    assert meta["splits"]["train"]["class_counts"] == {c: 60 for c in CASSAVA_CLASSES}
    assert len(meta["splits"]["train"]["shards"]) == 8
    assert meta["image_size"] == 64 and meta["encoding"] == "raw" and meta["format_version"] == 2
    assert meta["fingerprint"].startswith("sha256:")
    images, labels = read_split(synthetic_dir, "test")
    assert images.shape == (100, 64, 64, 3) and images.dtype == np.uint8
    assert np.bincount(labels).tolist() == [20] * 5


def test_folder_source_carves_the_missing_split_and_is_deterministic(
    image_folder: Path, tmp_path: Path
) -> None:
    outs = [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        prepare(PrepareConfig(source=f"folder:{image_folder}", output_dir=str(out), image_size=32, shards=4))
    meta = json.loads((outs[0] / "metadata.json").read_text())
    assert meta["class_names"] == ["daisy", "rose", "tulip"]
    counts = {s: v["count"] for s, v in meta["splits"].items()}
    assert counts == {"train": 22, "validation": 2, "test": 6}  # 24 train images, 10% carved
    assert meta["splits"]["validation"]["carved_from"] == "train"
    assert meta == json.loads((outs[1] / "metadata.json").read_text())
    images, labels = read_split(outs[0], "test")
    assert images.shape == (6, 32, 32, 3)
    assert sorted(labels.tolist()) == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize("encoding", ["jpeg", "png"])
def test_encodings_round_trip(image_folder: Path, tmp_path: Path, encoding: str) -> None:
    raw, enc = tmp_path / "raw", tmp_path / encoding
    prepare(PrepareConfig(source=f"folder:{image_folder}", output_dir=str(raw), image_size=32))
    prepare(
        PrepareConfig(source=f"folder:{image_folder}", output_dir=str(enc), image_size=32, encoding=encoding)
    )
    a, _ = read_split(raw, "test")
    b, _ = read_split(enc, "test")
    tolerance = 0 if encoding == "png" else 40  # jpeg is lossy on noise images
    assert np.abs(a.astype(int) - b.astype(int)).mean() <= tolerance


def _bad(root: Path, case: str) -> str:
    if case == "missing":
        return f"folder:{root / 'nope'}"
    root.mkdir()
    if case == "empty":
        return f"folder:{root}"
    write_images(root / "train" / "a", 3, seed=0)
    if case == "empty_class":
        (root / "train" / "b").mkdir()
    elif case == "corrupt":
        write_images(root / "train" / "b", 3, seed=1)
        (root / "train" / "b" / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    elif case == "one_class":
        pass  # train/a only: a classifier of one class is right on every image
    elif case == "class_mismatch":
        write_images(root / "train" / "b", 3, seed=1)
        write_images(root / "test" / "a", 2, seed=2)
        write_images(root / "test" / "c", 2, seed=3)
    elif case in ("val", "valid", "dev", "eval", "holdout"):
        write_images(root / "train" / "b", 3, seed=1)
        write_images(root / case / "a", 2, seed=2)
        write_images(root / case / "b", 2, seed=3)
    elif case in ("dangling_symlink", "symlink_loop", "folder_named_jpg", "unreadable"):
        write_images(root / "train" / "b", 3, seed=1)
        bad = root / "train" / "b" / "x.jpg"
        if case == "dangling_symlink":
            bad.symlink_to(root / "train" / "b" / "gone.jpg")
        elif case == "symlink_loop":
            bad.symlink_to(bad)
        elif case == "folder_named_jpg":
            bad.mkdir()
        else:
            (root / "train" / "b" / "img0.jpg").rename(bad)
            bad.chmod(0)
    return f"folder:{root}"


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing", "no such folder"),
        ("empty", "has no train/ folder; expected PATH/<split>/<class>/*.jpg"),
        ("empty_class", "class 'b' has no images in"),
        ("corrupt", "cannot decode image"),
        (
            "one_class",
            "has 1 class(es) ['a']: a classifier needs at least 2 (one folder per class under train/)",
        ),
        ("class_mismatch", "split 'test' has different classes than train (missing ['b'], extra ['c'])"),
        *[
            (split, f"unknown split folder {{src}}/{split} (rename it to validation/); {ALLOWED_SPLITS}")
            for split in ("val", "valid", "dev", "eval")
        ],
        ("holdout", f"unknown split folder {{src}}/holdout; {ALLOWED_SPLITS}"),
        (
            "dangling_symlink",
            f"{{src}}/train/b/x.jpg is a broken symlink (to {{src}}/train/b/gone.jpg); {ALLOWED}",
        ),
        ("symlink_loop", f"{{src}}/train/b/x.jpg is a symlink loop; {ALLOWED}"),
        ("folder_named_jpg", f"{{src}}/train/b/x.jpg is a folder, not an image; {ALLOWED}"),
        pytest.param(
            "unreadable",
            f"cannot read {{src}}/train/b/x.jpg (permission denied); {ALLOWED}",
            marks=pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file"),
        ),
    ],
)
def test_bad_folders_get_a_clear_error_and_no_output(tmp_path: Path, case: str, message: str) -> None:
    source = _bad(tmp_path / "src", case)
    message = message.format(src=tmp_path / "src")
    out = tmp_path / "out"
    with pytest.raises(PrepareError) as err:
        prepare(PrepareConfig(source=source, output_dir=str(out), image_size=32))
    assert message in str(err.value)
    if case == "corrupt":
        assert "broken.jpg" in str(err.value)
    assert not out.exists()
    # Nothing half-written beside it either (the staging folder is gone).
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if case == "missing" else ["src"])


def test_an_unreadable_image_is_named_while_listing_even_as_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Root reads a chmod 0 file, so here the file reads as unreadable through os.access."""
    import os as os_module

    source = _bad(tmp_path / "src", "unreadable")
    bad = str(tmp_path / "src" / "train" / "b" / "x.jpg")
    access = os_module.access
    monkeypatch.setattr(os_module, "access", lambda p, mode, **kw: p != bad and access(p, mode, **kw))
    out = tmp_path / "out"
    with pytest.raises(PrepareError) as err:
        prepare(PrepareConfig(source=source, output_dir=str(out), image_size=32))
    assert f"cannot read {bad} (permission denied); {ALLOWED}" in str(err.value)
    assert not out.exists()


def test_the_command_refuses_a_val_folder_naming_it_with_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainer.prepare import main

    source = _bad(tmp_path / "src", "val")
    code = main([f"--source={source}", f"--output_dir={tmp_path / 'out'}", "--image_size=32"])
    err = capsys.readouterr().err
    assert code == 1
    assert f"error: --source {source}: unknown split folder {tmp_path / 'src' / 'val'}" in err
    assert "rename it to validation/" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_one_class_is_refused_by_the_command_naming_the_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A one-class folder would score 1.0 and look better than any real champion."""
    from trainer.prepare import main

    source = _bad(tmp_path / "src", "one_class")
    code = main([f"--source={source}", f"--output_dir={tmp_path / 'out'}", "--image_size=32"])
    err = capsys.readouterr().err
    assert code == 1  # bad input, as every PrepareError (2 is for bad flags)
    assert f"error: --source {source} has 1 class(es) ['a']" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("champion", "how"),
    [
        (["daisy", "rose"], "other class names"),
        (["tulip", "rose", "daisy"], "the same class names in another order"),
    ],
)
def test_a_source_of_another_task_than_the_champions_is_refused_before_any_conversion(
    image_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], champion: list[str], how: str
) -> None:
    """The plan hands the champion's class names: a model trained on this source could neither be
    compared with the champion nor replace it, so the job stops once it has listed the classes,
    writes nothing, and says what to do (the gate's rule, `components.registry.task_mismatch`)."""
    import json

    from trainer.prepare import main

    out = tmp_path / "out"
    flags = [f"--source=folder:{image_folder}", f"--output_dir={out}", "--image_size=32"]
    code = main([*flags, f"--champion_class_names={json.dumps(champion)}"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert "['daisy', 'rose', 'tulip']" in err and str(champion) in err and how in err
    assert "use another model_display_name" in err
    assert not out.exists()
    # The champion's own classes, in its order, prepare as before.
    assert main([*flags, '--champion_class_names=["daisy", "rose", "tulip"]']) == 0
    assert out.joinpath("metadata.json").exists()


def test_tiny_splits_are_warned_about(image_folder: Path, tmp_path: Path) -> None:
    """image_folder: 8 training images a class, of which 10% carved into validation (under one
    image a class), and a test split of 2 images a class: both too few to compare models by."""
    out = io.StringIO()
    prepare(
        PrepareConfig(source=f"folder:{image_folder}", output_dir=str(tmp_path / "out"), image_size=32),
        Progress(bars=False, out=out),
    )
    warnings = [line for line in out.getvalue().splitlines() if line.startswith("prepare: warning: ")]
    assert [w.split("'")[1] for w in warnings] == ["validation", "test"], out.getvalue()
    assert "fewer than 5 images of 3 of its 3 classes (daisy 2, rose 2, tulip 2)" in warnings[1]


def test_few_images_warnings_name_the_split_and_its_small_classes() -> None:
    from trainer.preparation.shards import few_images_warnings

    counts = {"train": {"a": 50, "b": 60}, "test": {"a": 4, "b": 30}}
    [warning] = few_images_warnings(counts)
    assert "split 'test' has fewer than 5 images of 1 of its 2 classes (a 4)" in warning
    assert few_images_warnings({"train": {"a": 5, "b": 5}}) == []


def test_unknown_tfds_dataset_is_rejected_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(PrepareError, match="unknown TFDS dataset 'no_such_dataset'"):
        prepare(PrepareConfig(source="tfds:no_such_dataset", output_dir=str(tmp_path / "out")))
    assert not (tmp_path / "out").exists()


def test_an_output_dir_that_is_a_file_is_kept_unless_overwrite(image_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.write_text("keep me")
    config = PrepareConfig(source=f"folder:{image_folder}", output_dir=str(out), image_size=32)
    with pytest.raises(
        PrepareError, match=f"--output_dir {out} is an existing file, not a folder; pass --overwrite"
    ):
        prepare(config)
    assert out.read_text() == "keep me"


def test_an_existing_dataset_is_kept_unless_overwrite(image_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    config = PrepareConfig(source=f"folder:{image_folder}", output_dir=str(out), image_size=32)
    with pytest.raises(PrepareError, match="already exists and is not empty; pass --overwrite"):
        prepare(config)
    assert (out / "precious.txt").read_text() == "keep me"
    prepare(PrepareConfig(**{**config.__dict__, "overwrite": True}))
    assert (out / "metadata.json").exists() and not (out / "precious.txt").exists()


@pytest.mark.parametrize("output", ["{images}", "{images}/", "{images}/..", "{images}/../."])
def test_overwrite_never_replaces_the_source_folder_or_one_above_it(
    output: str, image_folder: Path, tmp_path: Path
) -> None:
    before = sorted(p.relative_to(image_folder) for p in image_folder.rglob("*"))
    config = PrepareConfig(
        source=f"folder:{image_folder}",
        output_dir=output.format(images=image_folder),
        image_size=32,
        overwrite=True,
    )
    with pytest.raises(PrepareError, match="--source"):
        prepare(config)
    assert sorted(p.relative_to(image_folder) for p in image_folder.rglob("*")) == before


def test_overwrite_never_replaces_the_tfds_data_dir(tmp_path: Path) -> None:
    (tmp_path / "tfds" / "keep").mkdir(parents=True)
    config = PrepareConfig(
        source="synthetic", output_dir=str(tmp_path), tfds_data_dir=str(tmp_path / "tfds"), overwrite=True
    )
    with pytest.raises(PrepareError, match="--tfds_data_dir"):
        prepare(config)
    assert (tmp_path / "tfds" / "keep").is_dir()


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (
            ["--source=s3://bucket"],
            "--source: must be tfds:NAME (e.g. tfds:cassava), folder:PATH or synthetic",
        ),
        (["--image_size=8"], "--image_size: must be an integer between 32 and 1024"),
        (["--encoding=webp"], "--encoding: invalid choice: 'webp'"),
        (["--validation_fraction=0.7"], "--validation_fraction: must be a number in (0, 0.5)"),
    ],
)
def test_bad_flags_exit_2(flags: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    from trainer.prepare import parse_args

    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--output_dir=/tmp/x", *flags])
    assert exit_info.value.code == 2
    assert expected in capsys.readouterr().err


def test_output_dir_defaults_to_aip_model_dir_and_is_required_without_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from trainer.prepare import parse_args

    config = parse_args(
        ["--source", "synthetic", "--image_size", "64"], {"AIP_MODEL_DIR": "gs://b/job/model/"}
    )
    assert config.output_dir == "gs://b/job/model"
    assert (
        parse_args(["--source", "synthetic", "--output_dir", "/x"], {"AIP_MODEL_DIR": "/y"}).output_dir
        == "/x"
    )
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--source", "synthetic"], {})
    assert exit_info.value.code == 2
    assert "--output_dir is required when AIP_MODEL_DIR is not set" in capsys.readouterr().err


# --- progress output ------------------------------------------------------------------------


@pytest.mark.process
def test_piped_cli_prints_plain_progress_lines_and_no_terminal_codes(tmp_path: Path) -> None:
    """As in CI or a pipeline step's log: stdout and stderr are pipes, so no tqdm bars (no
    carriage returns, no cursor-up escapes), but a line per phase and per split, and few lines."""
    env = trainer_env({"TF_CPP_MIN_LOG_LEVEL": "2"})
    for name in ("FORCE_COLOR", "CLICOLOR_FORCE"):  # a user asking for colour gets TFDS's bold
        env.pop(name, None)
    out = tmp_path / "out"
    flags = ["--source=synthetic", f"--output_dir={out}", "--image_size=32", "--shards=2"]
    flags += ["--synthetic_per_class=6", "--synthetic_source_size=32"]
    result = subprocess.run(
        [sys.executable, "-m", "trainer.prepare", *flags],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for stream in (result.stdout, result.stderr):
        assert "\x1b" not in stream and "\r" not in stream, stream
    lines = result.stdout.splitlines()
    for expected in (
        "prepare: synthetic 50/50 images (100%) in ",
        "prepare: TFDS cassava 0.1.0: download_and_prepare into ",
        "prepare: TFDS cassava ready in ",
        "prepare: train 30/30 images (100%) in ",
        "prepare: validation 10/10 images (100%) in ",
        "prepare: test 10/10 images (100%) in ",
        f"prepared synthetic into {out}: train 30, validation 10, test 10 (sha256:",
    ):
        assert any(line.startswith(expected) for line in lines), (expected, result.stdout)
    assert len(lines) <= 15, result.stdout
    # TensorFlow's own start-up lines; tqdm used to add hundreds here.
    assert len(result.stderr.splitlines()) <= 30, result.stderr
    # The same images give the same fingerprint in another process (this one): records are
    # serialized deterministically (protobuf's map order otherwise changes between processes).
    again = tmp_path / "again"
    prepare(
        PrepareConfig(
            source="synthetic", output_dir=str(again), image_size=32, shards=2, synthetic_per_class=6,
            synthetic_source_size=32,
        )
    )  # fmt: skip
    fingerprint = json.loads((out / "metadata.json").read_text())["fingerprint"]
    assert fingerprint == json.loads((again / "metadata.json").read_text())["fingerprint"]


class FakeClock:
    def __init__(self, tick: float) -> None:
        self.now, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def _count_lines(total: int, seconds_per_image: float) -> list[str]:
    out = io.StringIO()
    progress = Progress(bars=False, out=out, clock=FakeClock(seconds_per_image))
    with progress.count("train", total) as update:
        for _ in range(total):
            update(1)
    return out.getvalue().splitlines()


def test_progress_lines_every_tenth_then_a_final_line() -> None:
    lines = _count_lines(5656, seconds_per_image=0.01)  # a tenth takes 5.7 s
    assert lines[:2] == ["prepare: train 566/5656 images (10%)", "prepare: train 1132/5656 images (20%)"]
    assert lines[8] == "prepare: train 5094/5656 images (90%)"
    assert len(lines) == 10
    assert lines[-1].startswith("prepare: train 5656/5656 images (100%) in 56.")


def test_progress_lines_are_bounded_when_fast_and_alive_when_slow() -> None:
    assert [line.split(" in ")[0] for line in _count_lines(5656, seconds_per_image=1e-4)] == [
        "prepare: train 5656/5656 images (100%)"
    ]  # done in half a second: just the final line
    slow = _count_lines(100, seconds_per_image=7.0)  # a tenth takes 70 s
    assert slow[0] == "prepare: train 9/100 images (9%)"  # a minute without a line
    assert 11 <= len(slow) <= 20


def test_progress_bars_mode_prints_no_lines(capsys: pytest.CaptureFixture[str]) -> None:
    out = io.StringIO()
    with Progress(bars=True, out=out).count("train", 10, bar=False) as update:
        update(10)
    assert out.getvalue() == "" and capsys.readouterr() == ("", "")


class Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize(
    ("stdout_tty", "stderr_tty", "term", "bars"),
    [
        (True, True, "xterm", True),
        (False, True, "xterm", False),  # stdout to a log file or a pipe
        (True, False, "xterm", False),  # stderr (where tqdm draws) to a file
        (True, True, "dumb", False),
    ],
)
def test_progress_bars_only_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch, stdout_tty: bool, stderr_tty: bool, term: str, bars: bool
) -> None:
    monkeypatch.setattr(sys, "stdout", Stream(stdout_tty))
    monkeypatch.setattr(sys, "stderr", Stream(stderr_tty))
    monkeypatch.setenv("TERM", term)
    assert Progress.auto().bars is bars


# --- preparing a TFDS builder from a local tree ---------------------------------------------


def test_tfds_still_makes_its_download_manager_through_the_hook_local_archive_overrides() -> None:
    """Fails when a TFDS upgrade changes the internals `local_archive` relies on (checked
    against TFDS 4.9.10): then the synthetic source would no longer go through the local tree."""
    import tensorflow_datasets as tfds

    from trainer import adapters as module

    module.check_tfds_download_manager_hook()
    assert "self._make_download_manager(" in inspect.getsource(tfds.core.DatasetBuilder.download_and_prepare)
    assert tuple(inspect.signature(tfds.download.DownloadManager.download_and_extract).parameters) == (
        "self",
        "url_or_urls",
    )


def test_the_hook_check_fails_loudly_when_tfds_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    import tensorflow_datasets as tfds

    from trainer import adapters as module

    monkeypatch.setattr(tfds.core.DatasetBuilder, "_make_download_manager", lambda self, config: None)
    with pytest.raises(RuntimeError, match=r"expected \('self', 'download_dir', 'download_config'\)"):
        module.check_tfds_download_manager_hook()


def test_local_archive_changes_one_builder_only_and_only_inside_the_block(tmp_path: Path) -> None:
    import tensorflow_datasets as tfds

    from trainer.preparation.localarchive import local_archive

    builder = tfds.builder("cassava", data_dir=str(tmp_path / "tfds"))
    other = tfds.builder("cassava", data_dir=str(tmp_path / "tfds"))
    with local_archive(builder, str(tmp_path / "tree"), scratch_dir=str(tmp_path / "dl")):
        manager = builder._make_download_manager(download_dir=None, download_config=None)
        assert "_make_download_manager" not in vars(other)
    assert "_make_download_manager" not in vars(builder)

    urls = {"a": "https://x/a.zip", "b": ["https://x/b.zip", tfds.download.Resource(url="https://x/c.zip")]}
    tree = tmp_path / "tree"
    assert manager.download_and_extract(urls) == {"a": tree, "b": [tree, tree]}
    assert manager.served == ["https://x/a.zip", "https://x/b.zip", "https://x/c.zip"]
    assert isinstance(manager, tfds.download.DownloadManager)
    with pytest.raises(PrepareError, match=r"asked to download 'https://x/d\.csv'"):
        manager.download("https://x/d.csv")


def test_local_archive_fails_if_the_builder_was_not_prepared_through_it(tmp_path: Path) -> None:
    import tensorflow_datasets as tfds

    from trainer.preparation.localarchive import local_archive

    builder = tfds.builder("cassava", data_dir=str(tmp_path / "tfds"))
    with pytest.raises(RuntimeError, match="was not prepared through _make_download_manager"):
        with local_archive(builder, str(tmp_path / "tree"), scratch_dir=str(tmp_path / "dl")):
            pass
    assert "_make_download_manager" not in vars(builder)
