from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trainer import contract, data
from trainer._tf import tf


@pytest.fixture(scope="module")
def meta(synthetic_dir: Path) -> data.DatasetMetadata:
    return data.load_metadata(str(synthetic_dir))


def test_training_batches_are_uint8_global_batches_that_repeat(
    synthetic_dir: Path, meta: data.DatasetMetadata
) -> None:
    ds = data.make_dataset(str(synthetic_dir), meta, "train", batch_size=32, training=True)
    steps = data.steps_per_epoch(meta, 32)
    assert steps == 300 // 32
    batches = list(ds.take(steps * 2 + 1))  # more than an epoch: it repeats
    assert len(batches) == steps * 2 + 1
    for images, labels in batches:
        assert images.dtype == tf.uint8 and images.shape == (32, 64, 64, 3)
        assert labels.dtype == tf.int32 and labels.shape == (32,)
    options = ds.options()
    assert options.deterministic is False
    assert options.experimental_distribute.auto_shard_policy == tf.data.experimental.AutoShardPolicy.FILE


def test_evaluation_sees_every_example_once_in_a_fixed_order(
    synthetic_dir: Path, meta: data.DatasetMetadata
) -> None:
    def labels() -> list[int]:
        ds = data.make_dataset(str(synthetic_dir), meta, "validation", batch_size=7, training=False)
        return np.concatenate([y.numpy() for _, y in ds]).tolist()

    first = labels()
    assert len(first) == meta.splits["validation"].count == 100
    assert np.bincount(first).tolist() == list(meta.splits["validation"].class_counts.values())
    assert labels() == first


def test_shards_by_file_only_when_every_worker_gets_a_file(
    synthetic_dir: Path, meta: data.DatasetMetadata
) -> None:
    policy = tf.data.experimental.AutoShardPolicy
    shards = len(meta.splits["test"].shards)
    for workers, expected in ((2, policy.FILE), (shards, policy.FILE), (shards + 1, policy.DATA)):
        ds = data.make_dataset(
            str(synthetic_dir), meta, "test", batch_size=8, training=False, num_workers=workers
        )
        assert ds.options().experimental_distribute.auto_shard_policy == expected


def test_file_sharding_gives_workers_disjoint_examples(
    synthetic_dir: Path, meta: data.DatasetMetadata
) -> None:
    """What FILE auto-sharding does for 2 workers: each reads half of the files."""
    files = meta.splits["test"].shards
    seen = []
    for worker in range(2):
        sub = data.DatasetMetadata(
            **{**meta.__dict__, "splits": {**meta.splits, "test": data.SplitInfo(0, files[worker::2], {})}}
        )
        ds = data.make_dataset(str(synthetic_dir), sub, "test", batch_size=100, training=False)
        seen.append({bytes(x.numpy().tobytes()) for batch, _ in ds for x in batch})
    assert seen[0] and seen[1] and not seen[0] & seen[1]
    assert len(seen[0]) + len(seen[1]) == 100


def test_missing_metadata_names_the_folder_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"must be a folder written by `python -m trainer\.prepare`"):
        data.load_metadata(str(tmp_path))


def test_prepared_metadata_has_exactly_the_declared_keys(synthetic_dir: Path) -> None:
    """What trainer.prepare writes is what trainer.contract declares (and tests/test_contracts.py
    checks every reader against)."""
    written = json.loads((synthetic_dir / contract.METADATA_FILE).read_text())
    assert sorted(written) == sorted(contract.METADATA_KEYS)
    assert written["format_version"] == contract.METADATA_FORMAT_VERSION == data.FORMAT_VERSION
    for split in ("train", "validation", "test"):
        assert sorted(set(written["splits"][split]) - {"carved_from"}) == sorted(contract.METADATA_SPLIT_KEYS)


# --- the shards are checked against metadata.json when it is loaded ---------------------------


@pytest.fixture
def copied(synthetic_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the prepared dataset, to corrupt."""
    import shutil

    return Path(shutil.copytree(synthetic_dir, tmp_path / "data"))


def test_an_intact_dataset_passes_both_checks(copied: Path) -> None:
    for verify in ("size", "full"):
        meta = data.load_metadata(str(copied), verify=verify)
        assert meta.splits["train"].count == 300


def test_a_truncated_shard_is_refused_naming_it(copied: Path) -> None:
    shard = copied / "train-00003-of-00008.tfrecord"
    first = next(iter(tf.data.TFRecordDataset(str(shard)))).numpy()
    with tf.io.TFRecordWriter(str(shard)) as w:  # 1 of its records left, a valid TFRecord file
        w.write(first)
    with pytest.raises(
        data.DataError,
        match=r"train-00003-of-00008\.tfrecord of split 'train'.*expected 38 records.*prepare the dataset again",
    ):
        data.load_metadata(str(copied))


def test_a_shard_swapped_with_one_of_another_split_is_refused(copied: Path) -> None:
    (copied / "train-00001-of-00008.tfrecord").write_bytes(
        (copied / "test-00001-of-00008.tfrecord").read_bytes()
    )
    with pytest.raises(data.DataError, match=r"train-00001-of-00008\.tfrecord of split 'train'.*swapped"):
        data.load_metadata(str(copied))


def test_metadata_listing_a_shard_of_another_split_is_refused(copied: Path) -> None:
    meta = json.loads((copied / contract.METADATA_FILE).read_text())
    meta["splits"]["train"]["shards"][2] = "test-00002-of-00008.tfrecord"
    (copied / contract.METADATA_FILE).write_text(json.dumps(meta))
    with pytest.raises(
        data.DataError, match=r"split 'train'.*names train-00002-of-00008\.tfrecord; found test-00002"
    ):
        data.load_metadata(str(copied))


def test_a_missing_shard_is_refused_naming_it(copied: Path) -> None:
    (copied / "validation-00005-of-00008.tfrecord").unlink()
    with pytest.raises(
        data.DataError,
        match=r"validation-00005-of-00008\.tfrecord of split 'validation'.*found none.*prepare the dataset again",
    ):
        data.load_metadata(str(copied))


def test_full_verification_catches_a_same_size_byte_flip(
    copied: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shard = copied / "test-00006-of-00008.tfrecord"
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    shard.write_bytes(bytes(raw))
    data.load_metadata(str(copied))  # the cheap check cannot see it
    monkeypatch.setenv(data.VERIFY_ENV, "full")
    with pytest.raises(data.DataError, match=r"test-00006-of-00008\.tfrecord of split 'test'.*corrupted"):
        data.load_metadata(str(copied))


def test_full_verification_catches_swapped_content_of_equal_count(copied: Path) -> None:
    """validation and test shards hold the same number of records: only the hashes differ."""
    (copied / "validation-00000-of-00008.tfrecord").write_bytes(
        (copied / "test-00000-of-00008.tfrecord").read_bytes()
    )
    data.load_metadata(str(copied))
    with pytest.raises(data.DataError, match=r"expected the fingerprint sha256:.*found sha256:"):
        data.load_metadata(str(copied), verify="full")


def test_an_unknown_verify_mode_is_refused(synthetic_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"verify='quick'.*\('size', 'full'\)"):
        data.load_metadata(str(synthetic_dir), verify="quick")


def test_read_errors_can_be_explained_with_the_split_files(copied: Path, meta: data.DatasetMetadata) -> None:
    error = tf.errors.DataLossError(None, None, "corrupted record at 234859")
    message = str(data.explain_read_error(error, str(copied), meta, "train"))
    assert "corrupted record at 234859" in message and "train-00007-of-00008.tfrecord" in message
    assert "TRAINER_VERIFY_DATA=full" in message


def test_a_corrupt_record_met_while_training_or_evaluating_names_the_shards(
    copied: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Same size, one flipped byte: the start-up check passes, the record's CRC fails when read.
    TensorFlow's error names no file; the trainer's names the splits being read and their shards."""
    from tests.conftest import FAST_TRAIN_FLAGS
    from trainer import evaluate, task

    meta = data.load_metadata(str(copied))
    for split in ("train", "test"):
        shard = copied / meta.splits[split].shards[0]
        raw = bytearray(shard.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        shard.write_bytes(bytes(raw))
    with pytest.raises(
        data.DataError, match=r"reading split 'test' in .*corrupted.*test-00000-of-00008\.tfrecord"
    ):
        evaluate.predict_split(lambda x: x, str(copied), meta, "test")
    argv = [f"--data_dir={copied}", f"--model_dir={copied.parent / 'model'}", *FAST_TRAIN_FLAGS, "--epochs=1"]
    assert task.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]  # one line, no traceback
    assert err.startswith("python -m trainer.task: error: reading splits 'train' and 'validation' in ")
    assert "corrupted record" in err
    assert "train-00000-of-00008.tfrecord" in err and "TRAINER_VERIFY_DATA=full" in err
    assert not (copied.parent / "model").exists()  # nothing published
