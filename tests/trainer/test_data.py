from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trainer import contract, data, datasetinfo
from trainer._tf import tf


@pytest.fixture(scope="module")
def meta(synthetic_dir: Path) -> datasetinfo.DatasetMetadata:
    return datasetinfo.load_metadata(str(synthetic_dir))


def test_training_batches_are_uint8_global_batches_that_repeat(
    synthetic_dir: Path, meta: datasetinfo.DatasetMetadata
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
    assert options.autotune.enabled is False  # docs/facts.md, fact 37


def test_a_strategy_feeds_its_replicas_through_iterators_without_the_autotuning_model() -> None:
    # The per-device iterators a strategy builds over any dataset (Keras' `fit` too) run with
    # TensorFlow's default options, autotuning on (None), unless the trainer turns it off.
    from tensorflow.python.data.ops import multi_device_iterator_ops

    data.untune_device_iterators()
    wrapped = multi_device_iterator_ops._create_device_dataset
    data.untune_device_iterators()
    assert multi_device_iterator_ops._create_device_dataset is wrapped  # wrapped once
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])  # MultiWorkerMirrored's input path
    batches = iter(strategy.experimental_distribute_dataset(tf.data.Dataset.range(8).batch(2)))
    device_iterators = batches._iterators[0]._iterator._device_iterators
    assert [it._dataset.options().autotune.enabled for it in device_iterators] == [False]
    assert [int(x) for x in next(batches)] == [0, 1]


@pytest.mark.skipif(
    Path("/proc/driver/nvidia/version").exists(),
    reason="with a GPU the trainer keeps TF's default host allocator",
)
def test_host_memory_goes_through_tensorflows_bfc_allocator() -> None:
    # Only the BFC allocator keeps statistics: malloc's raises ValueError (docs/facts.md, fact 39).
    assert float(tf.reduce_sum(tf.ones([512, 512]))) == 512 * 512
    assert tf.config.experimental.get_memory_info("CPU:0")["peak"] >= 512 * 512 * 4


def test_evaluation_sees_every_example_once_in_a_fixed_order(
    synthetic_dir: Path, meta: datasetinfo.DatasetMetadata
) -> None:
    def labels() -> list[int]:
        ds = data.make_dataset(str(synthetic_dir), meta, "validation", batch_size=7, training=False)
        return np.concatenate([y.numpy() for _, y in ds]).tolist()

    first = labels()
    assert len(first) == meta.splits["validation"].count == 100
    assert np.bincount(first).tolist() == list(meta.splits["validation"].class_counts.values())
    assert labels() == first


def test_shards_by_file_only_when_every_worker_gets_a_file(
    synthetic_dir: Path, meta: datasetinfo.DatasetMetadata
) -> None:
    policy = tf.data.experimental.AutoShardPolicy
    shards = len(meta.splits["test"].shards)
    for workers, expected in ((2, policy.FILE), (shards, policy.FILE), (shards + 1, policy.DATA)):
        ds = data.make_dataset(
            str(synthetic_dir), meta, "test", batch_size=8, training=False, num_workers=workers
        )
        assert ds.options().experimental_distribute.auto_shard_policy == expected


def test_file_sharding_gives_workers_disjoint_examples(
    synthetic_dir: Path, meta: datasetinfo.DatasetMetadata
) -> None:
    """What FILE auto-sharding does for 2 workers: each reads half of the files."""
    files = meta.splits["test"].shards
    seen = []
    for worker in range(2):
        sub = datasetinfo.DatasetMetadata(
            **{
                **meta.__dict__,
                "splits": {**meta.splits, "test": datasetinfo.SplitInfo(0, files[worker::2], {})},
            }
        )
        ds = data.make_dataset(str(synthetic_dir), sub, "test", batch_size=100, training=False)
        seen.append({bytes(x.numpy().tobytes()) for batch, _ in ds for x in batch})
    assert seen[0] and seen[1] and not seen[0] & seen[1]
    assert len(seen[0]) + len(seen[1]) == 100


def test_missing_metadata_names_the_folder_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"must be a folder written by `python -m trainer\.prepare`"):
        datasetinfo.load_metadata(str(tmp_path))


def test_prepared_metadata_has_exactly_the_declared_keys(synthetic_dir: Path) -> None:
    """What trainer.prepare writes is what trainer.contract declares (and tests/test_contracts.py
    checks every reader against)."""
    written = json.loads((synthetic_dir / contract.METADATA_FILE).read_text())
    assert sorted(written) == sorted(contract.METADATA_KEYS)
    assert written["format_version"] == contract.METADATA_FORMAT_VERSION == datasetinfo.FORMAT_VERSION
    for split in ("train", "validation", "test"):
        assert sorted(set(written["splits"][split]) - {"carved_from"}) == sorted(contract.METADATA_SPLIT_KEYS)
        for shard in written["splits"][split]["shards"]:
            assert sorted(shard) == sorted(contract.METADATA_SHARD_KEYS)
    assert sorted(written["source_info"]) == sorted(contract.METADATA_SOURCE_INFO_KEYS["synthetic"])
    assert written["fingerprint"] == datasetinfo.manifest_fingerprint(written)


def test_the_manifest_records_each_shard_exactly(synthetic_dir: Path) -> None:
    """Each shard's entry is its file as it is on disk: size, SHA-256 of its bytes, records."""
    import hashlib

    written = json.loads((synthetic_dir / contract.METADATA_FILE).read_text())
    for split, info in written["splits"].items():
        assert [s["name"] for s in info["shards"]] == [f"{split}-{i:05d}-of-00008.tfrecord" for i in range(8)]
        assert sum(s["records"] for s in info["shards"]) == info["count"]
        for shard in info["shards"]:
            raw = (synthetic_dir / shard["name"]).read_bytes()
            assert shard["bytes"] == len(raw) and shard["sha256"] == hashlib.sha256(raw).hexdigest()
            assert shard["records"] == sum(
                1 for _ in tf.data.TFRecordDataset(str(synthetic_dir / shard["name"]))
            )


# --- the shards are checked against metadata.json when it is loaded ---------------------------


@pytest.fixture
def copied(synthetic_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the prepared dataset, to corrupt."""
    import shutil

    return Path(shutil.copytree(synthetic_dir, tmp_path / "data"))


def test_an_intact_dataset_passes_both_checks(copied: Path) -> None:
    for verify in ("size", "full"):
        meta = datasetinfo.load_metadata(str(copied), verify=verify)
        assert meta.splits["train"].count == 300


def test_an_unknown_verify_mode_is_refused(synthetic_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"verify='quick'.*\('size', 'full'\)"):
        datasetinfo.load_metadata(str(synthetic_dir), verify="quick")


def test_a_read_error_on_intact_files_says_the_read_failed_not_the_data(
    copied: Path, meta: datasetinfo.DatasetMetadata
) -> None:
    """Every shard still hashes to its entry: the read itself failed (storage), run again."""
    error = tf.errors.DataLossError(None, None, "corrupted record at 234859")
    message = str(datasetinfo.explain_read_error(error, str(copied), meta, "train"))
    assert message.startswith(f"reading split 'train' in {copied} failed (corrupted record at 234859)")
    assert "still has the size and SHA-256 metadata.json records" in message
    assert "the files are intact and the read itself failed; run again" in message


def test_a_read_error_beyond_the_audit_budget_lists_the_shards(
    copied: Path, meta: datasetinfo.DatasetMetadata, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(datasetinfo, "AUDIT_MAX_BYTES", 1000)
    error = tf.errors.DataLossError(None, None, "corrupted record at 234859")
    message = str(datasetinfo.explain_read_error(error, str(copied), meta, "train"))
    assert "too many to hash now" in message and "train-00007-of-00008.tfrecord" in message
    assert "TRAINER_VERIFY_DATA=full" in message and "prepare the dataset again" in message


def test_a_corrupt_record_met_while_training_or_evaluating_names_the_shard(
    copied: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Same size, one flipped byte: the start-up check passes, the record's CRC fails when read.
    TensorFlow's error names no file; the trainer's hashes the splits being read and names the
    shard that changed, in one line (exit 1, nothing published)."""
    from tests.conftest import FAST_TRAIN_FLAGS
    from trainer import evaluate, task

    meta = datasetinfo.load_metadata(str(copied))
    for split in ("train", "test"):
        shard = copied / meta.splits[split].shards[0]
        raw = bytearray(shard.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        shard.write_bytes(bytes(raw))
    with pytest.raises(datasetinfo.DataError) as caught:
        evaluate.predict_split(lambda x: x, str(copied), meta, "test")
    message = str(caught.value)
    assert message.startswith(f"reading split 'test' in {copied} failed (")
    assert "shard test-00000-of-00008.tfrecord of split 'test': expected " in message
    assert "(the same size)" in message and "read intact, then " in message
    assert "test-00001" not in message and "prepare the dataset again" in message
    argv = [f"--data_dir={copied}", f"--model_dir={copied.parent / 'model'}", *FAST_TRAIN_FLAGS, "--epochs=1"]
    assert task.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]  # one line, no traceback
    assert err.startswith("python -m trainer.task: error: reading splits 'train' and 'validation' in ")
    assert "corrupted record" in err
    assert "shard train-00000-of-00008.tfrecord of split 'train': expected " in err
    assert "train-00001" not in err and "validation-0" not in err
    assert not (copied.parent / "model").exists()  # nothing published
