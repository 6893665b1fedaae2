"""`python -m trainer.prepare --engine beam`: the same bytes as the one-replica job, resumable
after a kill, a bad image named by its path (trainer/preparation/beamprep.py). Runs Beam's real DirectRunner
in multi-process mode, as `make run` does with prepare_engine=beam."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.processes import ROOT, trainer_env
from tests.trainer.test_prepare import write_images
from trainer import data
from trainer.preparation import beamprep, beamrun, prepareconfig

pytestmark = pytest.mark.serial


def run_prepare(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainer.prepare", *args],
        cwd=ROOT,
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def record_hashes(folder: Path) -> dict[str, list[str]]:
    """Each split's records, as SHA-256 of their bytes, in the order the shards hold them."""
    from trainer._tf import tf

    meta = json.loads((folder / data.METADATA_FILE).read_text())
    out: dict[str, list[str]] = {}
    for split, info in meta["splits"].items():
        out[split] = [
            hashlib.sha256(record.numpy()).hexdigest()
            for shard in info["shards"]
            for record in tf.data.TFRecordDataset(str(folder / shard["name"]))
        ]
    return out


def same_dataset(a: Path, b: Path) -> None:
    """Same metadata.json bytes (class names, counts, manifest, fingerprint), same shard files,
    same records per split."""
    assert (a / data.METADATA_FILE).read_bytes() == (b / data.METADATA_FILE).read_bytes()
    assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())
    assert record_hashes(a) == record_hashes(b)
    for shard in a.glob("*.tfrecord"):
        assert shard.read_bytes() == (b / shard.name).read_bytes(), shard.name


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """train (3 classes) and test; validation is carved from train."""
    root = tmp_path_factory.mktemp("beam") / "images"
    for i, name in enumerate(("daisy", "rose", "tulip")):
        write_images(root / "train" / name, 14, seed=i)
        write_images(root / "test" / name, 4, seed=10 + i, fmt="png")
    return root


FLAGS = ("--image_size", "32", "--shards", "5", "--encoding", "png", "--seed", "7")


@pytest.fixture(scope="module")
def job_output(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("job") / "dataset"
    done = run_prepare("--source", f"folder:{folder}", "--output_dir", str(out), *FLAGS)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_both_engines_write_the_same_dataset_from_the_tfds_builder(tmp_path: Path) -> None:
    """The synthetic source goes through the real TFDS cassava builder: the Beam workers reopen
    its prepared split with `tfds.builder_from_directory` and pick their images by index."""
    args = ("--source", "synthetic", "--synthetic_per_class", "3", "--image_size", "32", "--shards", "3")
    outs, warned = [], []
    for engine in ("job", "beam"):
        out = tmp_path / engine
        done = run_prepare(*args, "--output_dir", str(out), "--engine", engine, "--beam_workers", "2")
        assert done.returncode == 0, done.stderr[-3000:]
        outs.append(out)
        warned.append([line for line in (done.stdout + done.stderr).splitlines() if "fewer than 5" in line])
    same_dataset(*outs)
    assert warned[0] and warned[0] == warned[1]  # 3 images a class: both engines warn alike


def test_a_killed_beam_preparation_resumes_with_the_shards_it_wrote(
    folder: Path, job_output: Path, tmp_path: Path
) -> None:
    out = tmp_path / "dataset"
    work = Path(prepareconfig.work_dir(str(out)))
    args = ("--source", f"folder:{folder}", "--output_dir", str(out), *FLAGS, "--engine", "beam")
    # One worker, so shards are written one after another and the stop lands between them.
    err = tmp_path / "stderr"
    with err.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainer.prepare", *args, "--beam_workers", "1"],
            cwd=ROOT,
            env=trainer_env(),
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 240
        while len(list((work / beamprep.DONE).glob("*.json"))) < 2:
            assert proc.poll() is None, "the preparation ended before it could be stopped"
            assert time.monotonic() < deadline, "no shard was written in 240 s"
            time.sleep(0.02)
        # As the local job runner stops a replica: SIGTERM to the group, the driver and its Beam
        # workers. A driver of 64 workers once slept 14 minutes here, its threads waiting on them.
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 143
    finally:
        with contextlib.suppress(ProcessLookupError):  # a Beam worker left behind, or all on a failure
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert "Traceback" not in err.read_text(), err.read_text()[-3000:]
    assert "stopped on SIGTERM" in err.read_text()
    assert not out.exists(), "a killed preparation publishes nothing"
    # The shards the done records vouch for, with their modification times: kept, not rewritten.
    kept = {p.stem: (work / p.stem).stat().st_mtime_ns for p in (work / beamprep.DONE).glob("*.json")}
    assert 2 <= len(kept) < 14

    done = run_prepare(*args, "--beam_workers", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resuming the Beam preparation in {work}: {len(kept)} of 14 shards" in done.stdout
    assert f"({14 - len(kept)} to write)" in done.stdout
    assert {name: (out / name).stat().st_mtime_ns for name in kept} == kept
    same_dataset(job_output, out)


@pytest.fixture
def small_disk(tmp_path: Path, job_output: Path) -> Iterator[Path]:
    """A file system that holds the plan and about half the dataset's shards (a tmpfs: needs root
    with CAP_SYS_ADMIN, as on this project's CI machines; skipped elsewhere)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    shards = sum(p.stat().st_size for p in job_output.glob("*.tfrecord"))
    size = 64 * 1024 + shards // 2  # the plan and tasks take a few KiB
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)], check=False
    ).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root with CAP_SYS_ADMIN)")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_full_disk_is_one_line_and_keeps_the_shards_written(folder: Path, small_disk: Path) -> None:
    out = small_disk / "dataset"
    args = ("--source", f"folder:{folder}", "--output_dir", str(out), *FLAGS, "--engine", "beam")
    done = run_prepare(*args, "--beam_workers", "1")
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    work = prepareconfig.work_dir(str(out))
    assert len(errors) == 1 and errors[0].endswith("run the same command again to resume"), done.stderr[
        -3000:
    ]
    assert f"{beamprep.DISK_FULL} {work}: the " in errors[0] and " MiB; " in errors[0], errors
    kept = len(list((Path(work) / beamprep.DONE).glob("*.json")))
    assert 1 <= kept < 5 and f"the {kept} shards written so far are kept" in errors[0], errors
    assert not out.exists()


def test_a_changed_plan_is_not_resumed_and_the_fresh_run_writes_the_jobs_dataset(
    folder: Path, job_output: Path, tmp_path: Path
) -> None:
    """An earlier run's work folder with another plan is discarded, and the run starts afresh:
    every shard written by two Beam workers, the same bytes as the one-replica job's."""
    out = tmp_path / "dataset"
    work = Path(prepareconfig.work_dir(str(out)))
    work.mkdir()
    (work / beamprep.OWNER_FILE).write_text("{}")  # as an earlier run of this engine left it
    (work / beamprep.PLAN_FILE).write_text(
        json.dumps(
            {"identity": {"plan_version": 1, "seed": 8, "image_size": 32}, "fingerprint": "sha256:old"}
        )
    )
    (work / "stale.tfrecord").write_bytes(b"left by the earlier run")
    args = ("--source", f"folder:{folder}", "--output_dir", str(out), *FLAGS)
    done = run_prepare(*args, "--engine", "beam", "--beam_workers", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"cannot resume the earlier Beam preparation in {work}: its " in done.stdout
    line = next(line for line in done.stdout.splitlines() if "cannot resume" in line)
    assert "seed" in line and "image_size" not in line.split("its ")[1].split(" differ")[0].split(", ")
    assert not (out / "stale.tfrecord").exists()
    assert re.search(
        r"Beam DirectRunner: 14 shards \(14 to write\) from 54 images, listed and planned in \d+\.\d s",
        done.stdout,
    ), done.stdout
    same_dataset(job_output, out)
    meta = json.loads((out / data.METADATA_FILE).read_text())
    assert meta["splits"]["validation"]["carved_from"] == "train"
    assert not work.exists(), "the work folder is removed once published"


def test_a_bad_image_is_named_by_its_path_without_a_traceback(folder: Path, tmp_path: Path) -> None:
    """A JPEG whose header passes the listing's check but whose body is cut off: found only by
    decoding, in a Beam worker."""
    import shutil

    src = tmp_path / "images"
    shutil.copytree(folder, src)
    bad = src / "train" / "rose" / "img3.jpg"
    whole = bad.read_bytes()
    bad.write_bytes(whole[: len(whole) // 3])
    out = tmp_path / "dataset"
    done = run_prepare(
        "--source",
        f"folder:{src}",
        "--output_dir",
        str(out),
        *FLAGS,
        "--engine",
        "beam",
        "--beam_workers",
        "2",
    )
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-3000:]
    assert f"python -m trainer.prepare: error: cannot decode image {bad}" in done.stderr
    assert "Traceback" not in done.stderr
    assert not out.exists()


def test_engine_flags_are_checked_before_any_work(folder: Path, tmp_path: Path) -> None:
    done = run_prepare("--source", f"folder:{folder}", "--output_dir", str(tmp_path / "o"), "--runner", "X")
    assert done.returncode == 2
    assert "unrecognized arguments: --runner X (only --engine beam takes Beam's own options)" in done.stderr
    done = run_prepare(
        "--source", f"folder:{folder}", "--output_dir", str(tmp_path / "o"),
        "--engine", "beam", "--runner", "DataflowRunner",
    )  # fmt: skip
    assert done.returncode == 1
    assert f"--output_dir {tmp_path / 'o'} is not on Cloud Storage" in done.stderr
    assert f"--source folder: {folder} is not on Cloud Storage" in done.stderr
    assert not (tmp_path / "o").exists() and not Path(prepareconfig.work_dir(str(tmp_path / "o"))).exists()


@pytest.mark.parametrize("missing", ["network", "credentials"])
def test_dataflow_without_google_cloud_is_one_line_before_any_request(
    missing: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No network, or no credentials: one line within seconds, before the output is looked at
    (on gs:// a request TensorFlow's client retried for 25 s, then a traceback)."""
    import google.auth
    import requests
    from google.auth import exceptions

    from trainer import prepare, storage

    def head(url: str, timeout: Any) -> None:
        if missing == "network" and "storage" in url:
            raise requests.ConnectionError("no route to host")

    def no_credentials() -> None:
        raise exceptions.DefaultCredentialsError("none")

    monkeypatch.setattr(requests, "head", head)
    if missing == "credentials":
        monkeypatch.setattr(google.auth, "default", no_credentials)
    monkeypatch.setattr(storage, "resolve", lambda path: pytest.fail(f"looked at {path}"))
    argv = ["--source", "folder:gs://b/i", "--output_dir", "gs://b/o", "--engine", "beam"]
    assert prepare.main([*argv, "--runner", "DataflowRunner", "--project", "p"]) == 1
    [line] = capsys.readouterr().err.splitlines()
    named = "storage.googleapis.com" if missing == "network" else "GOOGLE_APPLICATION_CREDENTIALS"
    assert named in line and "dataflow.googleapis.com" not in line, line


def test_without_beam_installed_the_engine_is_refused_naming_the_fix(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    from trainer.prepare import main

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "apache_beam" else real(name, *a)
    )
    out = tmp_path / "o"
    assert main(["--source", f"folder:{folder}", "--output_dir", str(out), "--engine", "beam"]) == 1
    assert "--engine beam needs Apache Beam, which this environment lacks" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "runner", "local"),
    [
        # Beam's FnApiRunner, never its DirectRunner, which would first fetch and try Prism.
        ((), "FnApiRunner", True),
        (("--runner", "DirectRunner"), "FnApiRunner", True),
        (("--runner", "DataflowRunner", "--project", "p"), "DataflowRunner", False),
        # A Flex Template's launcher: Beam writes the graph for Dataflow even with no runner named.
        (("--template_location=gs://b/t", "--project=p"), "DataflowRunner", False),
    ],
)
def test_the_runner_is_the_directrunner_unless_dataflow_is_named_or_implied(
    args: tuple[str, ...], runner: str, local: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainer.preparation.prepareconfig import PrepareConfig

    monkeypatch.setattr(beamrun, "local_workers", lambda config: config.beam_workers)  # any machine
    config = PrepareConfig(source="folder:gs://b/i", output_dir="gs://b/o", beam_args=args, beam_workers=3)
    options = beamrun.pipeline_options(config).get_all_options()
    assert options["runner"] == runner and beamrun.is_local_runner(config) is local
    assert (options.get("direct_num_workers") == 3) is local


def test_the_plan_does_not_depend_on_where_a_tfds_split_was_built() -> None:
    """The synthetic source is built by TFDS in a new temporary folder by every run: a run killed
    and started again has the same plan, and resumes; other images make another plan."""
    from trainer.preparation.prepareconfig import PrepareConfig
    from trainer.preparation.source import Source, SourceSplit

    def source(folder: str, train: int = 30) -> Source:
        def split(name: str, count: int) -> SourceSplit:
            spec = {"kind": "tfds", "dir": folder, "split": name, "image_key": "image", "label_key": "label"}
            return SourceSplit(count=count, dataset=lambda: None, spec=spec)

        return Source(["a", "b", "c"], {"train": split("train", train), "test": split("test", 6)}, {})

    config = PrepareConfig(source="synthetic", output_dir="/o", shards=2, seed=3)
    first, _ = beamprep.make_plan(source("/tmp/tmpaaaa/synthetic/1.0.0"), config, {"synthetic": 1})
    again, moved = beamprep.make_plan(source("/tmp/tmpbbbb/synthetic/1.0.0"), config, {"synthetic": 1})
    assert first["fingerprint"] == again["fingerprint"]
    assert {t["dir"] for t in moved.values()} == {"/tmp/tmpbbbb/synthetic/1.0.0"}  # the tasks read this run's
    other, _ = beamprep.make_plan(source("/tmp/tmpaaaa/synthetic/1.0.0", train=31), config, {"synthetic": 1})
    assert other["fingerprint"] != first["fingerprint"]


def test_the_shards_written_are_counted_in_a_folder_whose_name_is_a_glob_pattern(tmp_path: Path) -> None:
    work = tmp_path / "out [1] *?.work"
    (work / beamprep.DONE).mkdir(parents=True)
    (work / beamprep.PLAN_FILE).write_text(json.dumps({"shards": [{"name": f"s{i}"} for i in range(5)]}))
    for i, size in enumerate((2**20, 3 * 2**20)):
        (work / beamprep.DONE / f"s{i}.json").write_text(json.dumps({"name": f"s{i}", "bytes": size}))
    assert len(beamprep.done_records(str(work))) == 2
    line = beamprep.disk_full(str(work))
    assert "the 3 shards left need about 6.0 MiB" in line and "the 2 shards written" in line


def test_publishing_again_keeps_what_an_earlier_attempt_published(job_output: Path, tmp_path: Path) -> None:
    """Dataflow may run the publishing step again after its side effects (a lost worker, a result
    not committed): a dataset published whole by the earlier attempt is kept and its metadata
    returned, even when that attempt also removed the work folder; a folder of other shards is
    not taken for it."""
    import shutil

    meta = json.loads((job_output / data.METADATA_FILE).read_text())
    records = [shard for split in meta["splits"].values() for shard in split["shards"]]
    out = tmp_path / "dataset"
    shutil.copytree(job_output, out)
    work = Path(prepareconfig.work_dir(str(out)))
    assert not work.exists()
    assert beamprep.finalize(str(work), str(out), records) == meta
    assert (out / data.METADATA_FILE).read_text() == (job_output / data.METADATA_FILE).read_text()
    other = [{**records[0], "sha256": "0" * 64}, *records[1:]]
    assert beamprep.published(str(out), other) is None
    with pytest.raises(
        beamprep.PrepareError, match=r"has no plan\.json and .* holds no dataset of these shards"
    ):
        beamprep.finalize(str(work), str(out), other)
