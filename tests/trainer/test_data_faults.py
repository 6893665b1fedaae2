"""Fault injection on a prepared dataset: each fault is made on a private copy of the session's
synthetic dataset (8 shards per split: train 300 records, 38 in shards 0-3 and 37 in 4-7;
validation and test 100, 13 in shards 0-3 and 12 in 4-7; raw 64 px images, so shards of equal
record counts have equal sizes), and the check that catches it is asserted on what it names:
each faulty shard (or split, or metadata.json) and the kind of fault (`DataError.faults`), and,
in the first test, on its words: the shard's file and split, what metadata.json expected, what was
found, and what to do (every message ends saying to prepare again: `refused`).

Caught before training (`verify="size"`, the default, on every load: one listing and a stat per
shard): missing, extra and resized shards (truncated, swapped or copied across splits), a
manifest edited against itself. Caught by the full check (`TRAINER_VERIFY_DATA=full`: the SHA-256
of every shard): what keeps a shard's size (a flipped byte, two shards of equal size exchanged,
one copied over another). A manifest edited to match a tampered shard is caught on every load by
the fingerprint, computed again from its entries.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from trainer import contract, datasetinfo
from trainer._tf import tf

AGAIN = "prepare the dataset again (`python -m trainer.prepare --source synthetic --output_dir "


@pytest.fixture
def copied(synthetic_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(synthetic_dir, tmp_path / "data"))


def manifest(folder: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((folder / contract.METADATA_FILE).read_text())
    return loaded


def entry(folder: Path, name: str) -> dict[str, Any]:
    split = name.split("-")[0]
    found: dict[str, Any] = next(s for s in manifest(folder)["splits"][split]["shards"] if s["name"] == name)
    return found


def edit_manifest(
    folder: Path, change: Callable[[dict[str, Any]], None], *, refingerprint: bool = False
) -> None:
    meta = manifest(folder)
    change(meta)
    if refingerprint:
        meta["fingerprint"] = datasetinfo.manifest_fingerprint(meta)
    (folder / contract.METADATA_FILE).write_text(json.dumps(meta))


def refused(folder: Path, verify: str = "size") -> datasetinfo.DataError:
    with pytest.raises(datasetinfo.DataError) as caught:
        datasetinfo.load_metadata(str(folder), verify=verify)
    message = str(caught.value)
    assert "\n" not in message, message  # one line
    assert message.endswith(f"{AGAIN}{folder} --overwrite`, with the other flags it was prepared with)"), (
        message
    )
    assert {kind for _, kind in caught.value.faults} <= set(datasetinfo.FAULT_KINDS)
    return caught.value


def expected(folder: Path, name: str) -> str:
    """How a message states the shard's entry: its exact size, records and SHA-256."""
    e = entry(folder, name)
    return f"expected {e['bytes']:,} bytes, {e['records']} records, SHA-256 {e['sha256'][:16]}"


def flip_byte(path: Path, at: float = 0.5) -> None:
    raw = bytearray(path.read_bytes())
    raw[int(len(raw) * at)] ^= 0xFF
    path.write_bytes(bytes(raw))


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- caught before training: every load, no shard read --------------------------------------


def test_a_shard_truncated_to_whole_records_is_refused_naming_it(copied: Path) -> None:
    shard = copied / "train-00003-of-00008.tfrecord"
    first = next(iter(tf.data.TFRecordDataset(str(shard)))).numpy()
    want = expected(copied, shard.name)
    with tf.io.TFRecordWriter(str(shard)) as w:  # 1 of its 38 records left: a valid TFRecord file
        w.write(first)
    error = refused(copied)
    assert error.faults == [(shard.name, "truncated")]
    # The family's words, once: the shard and split, what was expected and found, what it holds.
    message = str(error)
    assert f"shard train-00003-of-00008.tfrecord of split 'train': {want}; " in message
    assert f"found {shard.stat().st_size:,} bytes, SHA-256 {sha(shard)[:16]}" in message
    assert "it holds 1 record, all intact: truncated or replaced by other records" in message


def test_a_shard_cut_mid_record_is_refused_saying_where_its_records_end(copied: Path) -> None:
    shard = copied / "validation-00002-of-00008.tfrecord"
    raw = shard.read_bytes()
    shard.write_bytes(raw[: len(raw) // 2])
    error = refused(copied)
    assert error.faults == [(shard.name, "corrupted")]  # its last record cut
    assert "6 records read intact" in str(error)


def test_shards_swapped_across_splits_are_refused_naming_both_and_what_each_holds(copied: Path) -> None:
    train, test = copied / "train-00001-of-00008.tfrecord", copied / "test-00001-of-00008.tfrecord"
    a, b = train.read_bytes(), test.read_bytes()
    train.write_bytes(b)
    test.write_bytes(a)
    error = refused(copied)
    assert error.faults == [(train.name, "swapped"), (test.name, "swapped")]
    # Each named with the shard whose content it holds.
    at = str(error).index
    assert at(f"shard {train.name}") < at(f"content of shard {test.name}") < at(f"shard {test.name} of")
    assert at(f"shard {test.name} of") < at(f"content of shard {train.name}")


def test_a_missing_shard_is_refused_naming_it_and_what_it_held(copied: Path) -> None:
    e = entry(copied, "validation-00005-of-00008.tfrecord")
    (copied / e["name"]).unlink()
    error = refused(copied)
    assert error.faults == [(e["name"], "missing")]
    assert f"{e['bytes']:,} bytes, 12 records" in str(error)


def test_an_extra_shard_is_refused_naming_it(copied: Path) -> None:
    """A shard of another preparation (9 shards), or a copy left beside the others."""
    shutil.copy(copied / "train-00000-of-00008.tfrecord", copied / "train-00008-of-00009.tfrecord")
    assert refused(copied).faults == [("train-00008-of-00009.tfrecord", "extra")]


def test_a_duplicated_shard_beside_the_others_is_refused_naming_the_copy(copied: Path) -> None:
    shutil.copy(copied / "test-00004-of-00008.tfrecord", copied / "test-00004-of-00008 copy.tfrecord")
    assert refused(copied).faults == [("test-00004-of-00008 copy.tfrecord", "extra")]


def test_several_faults_are_named_together(copied: Path) -> None:
    (copied / "train-00000-of-00008.tfrecord").unlink()
    (copied / "test-00007-of-00008.tfrecord").write_bytes(b"")
    assert refused(copied).faults == [
        ("test-00007-of-00008.tfrecord", "truncated"),  # resized shards first: each was hashed
        ("train-00000-of-00008.tfrecord", "missing"),
    ]


# --- caught by the full check: the same size, other bytes -------------------------------------


def test_a_flipped_byte_passes_the_size_check_and_is_named_by_the_full_check(copied: Path) -> None:
    shard = copied / "test-00006-of-00008.tfrecord"
    flip_byte(shard)
    datasetinfo.load_metadata(str(copied))  # the same size: the cheap check cannot see it
    error = refused(copied, verify="full")
    assert error.faults == [(shard.name, "corrupted")]
    assert "corrupted record" in str(error)  # TensorFlow's own words for the CRC that failed


def test_the_full_check_is_what_trainer_verify_data_full_asks_for(
    copied: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flip_byte(copied / "train-00002-of-00008.tfrecord", at=0.9)
    datasetinfo.load_metadata(str(copied))
    monkeypatch.setenv(datasetinfo.VERIFY_ENV, "full")
    with pytest.raises(datasetinfo.DataError) as caught:
        datasetinfo.load_metadata(str(copied))
    assert caught.value.faults == [("train-00002-of-00008.tfrecord", "corrupted")]


def test_shards_of_equal_size_exchanged_are_named_by_the_full_check(copied: Path) -> None:
    """validation and test shards 0-3 hold 13 records of one size each: only their hashes differ."""
    validation, test = copied / "validation-00000-of-00008.tfrecord", copied / "test-00003-of-00008.tfrecord"
    a, b = validation.read_bytes(), test.read_bytes()
    assert len(a) == len(b)
    validation.write_bytes(b)
    test.write_bytes(a)
    datasetinfo.load_metadata(str(copied))
    error = refused(copied, verify="full")
    # In the order of the splits: validation, then test.
    assert error.faults == [(validation.name, "swapped"), (test.name, "swapped")]
    assert str(error).count("(the same size)") == 2


def test_a_shard_copied_over_another_of_its_split_is_named_by_the_full_check(copied: Path) -> None:
    """train shards 4-7 hold 37 records each: a copy of shard 4 over shard 5 keeps the size."""
    shutil.copy(copied / "train-00004-of-00008.tfrecord", copied / "train-00005-of-00008.tfrecord")
    datasetinfo.load_metadata(str(copied))
    error = refused(copied, verify="full")
    assert error.faults == [("train-00005-of-00008.tfrecord", "swapped")]  # shard 4 is intact
    assert "the content of shard train-00004-of-00008.tfrecord" in str(error)


# --- metadata.json edited --------------------------------------------------------------------


def test_a_size_edited_to_match_a_truncated_shard_is_caught_by_the_fingerprint(copied: Path) -> None:
    """The entry's bytes follow the shard, its SHA-256 is left: the fingerprint, computed again
    from the entries on every load, no longer matches, so every shard is hashed: this one is named."""
    shard = copied / "train-00006-of-00008.tfrecord"
    old_sha = entry(copied, shard.name)["sha256"]
    raw = shard.read_bytes()
    shard.write_bytes(raw[: len(raw) // 3])

    def resize(meta: dict[str, Any]) -> None:
        meta["splits"]["train"]["shards"][6]["bytes"] = len(raw) // 3

    edit_manifest(copied, resize)
    error = refused(copied)  # the default, cheap check
    assert error.faults == [("metadata.json", "fingerprint"), (shard.name, "corrupted")]
    assert f"SHA-256 {old_sha[:16]}; found {len(raw) // 3:,} bytes (the same size)" in str(error)


def test_size_and_sha_edited_to_match_a_flipped_shard_are_caught_by_the_fingerprint(copied: Path) -> None:
    """Both of the entry's bytes and SHA-256 follow the tampered shard, the fingerprint is left:
    every shard matches its entry, so every record is read, and the shard's CRC names it."""
    shard = copied / "test-00002-of-00008.tfrecord"
    flip_byte(shard)

    def follow(meta: dict[str, Any]) -> None:
        meta["splits"]["test"]["shards"][2].update(bytes=shard.stat().st_size, sha256=sha(shard))

    edit_manifest(copied, follow)
    assert refused(copied).faults == [("metadata.json", "fingerprint"), (shard.name, "corrupted")]


def test_entries_edited_to_match_a_truncated_shard_are_caught_by_its_record_count(copied: Path) -> None:
    shard = copied / "validation-00006-of-00008.tfrecord"
    records = list(tf.data.TFRecordDataset(str(shard)).as_numpy_iterator())
    with tf.io.TFRecordWriter(str(shard)) as w:
        for record in records[:5]:
            w.write(record)

    def follow(meta: dict[str, Any]) -> None:
        meta["splits"]["validation"]["shards"][6].update(bytes=shard.stat().st_size, sha256=sha(shard))

    edit_manifest(copied, follow)
    error = refused(copied)
    assert error.faults == [("metadata.json", "fingerprint"), (shard.name, "truncated")]
    assert "it holds 5 records" in str(error)  # of the 12 its entry says


def test_a_fingerprint_edited_alone_is_refused(copied: Path) -> None:
    edit_manifest(copied, lambda meta: meta.update(fingerprint="sha256:" + "0" * 64))
    error = refused(copied)
    assert error.faults == [("metadata.json", "fingerprint")]  # every shard matches its entry
    assert f"sha256:{'0' * 64}" in str(error)


@pytest.mark.parametrize("refingerprint", [False, True])
def test_a_size_edited_alone_is_named_as_an_edited_entry(copied: Path, refingerprint: bool) -> None:
    """The shard is intact (its SHA-256 is the one recorded) but its entry's size is not its size."""
    name = "train-00001-of-00008.tfrecord"
    edit_manifest(
        copied,
        lambda meta: meta["splits"]["train"]["shards"][1].update(bytes=entry(copied, name)["bytes"] + 1),
        refingerprint=refingerprint,
    )
    assert refused(copied).faults == [(name, "entry_edited")]


def test_record_counts_edited_against_the_round_robin_are_refused(copied: Path) -> None:
    edit_manifest(
        copied, lambda meta: meta["splits"]["train"]["shards"][1].update(records=1), refingerprint=True
    )
    error = refused(copied)
    assert error.faults == [("train-00001-of-00008.tfrecord", "record_count")]
    assert "put 38 there" in str(error)  # 300 records round-robin into 8 shards


def test_class_counts_that_do_not_add_up_are_refused(copied: Path) -> None:
    def change(meta: dict[str, Any]) -> None:
        first = meta["class_names"][0]
        meta["splits"]["test"]["class_counts"][first] += 5

    edit_manifest(copied, change, refingerprint=True)
    error = refused(copied)
    assert error.faults == [("test", "record_count")] and "105" in str(error)


def test_metadata_listing_a_shard_of_another_split_is_refused(copied: Path) -> None:
    def rename(meta: dict[str, Any]) -> None:
        meta["splits"]["train"]["shards"][2]["name"] = "test-00002-of-00008.tfrecord"

    edit_manifest(copied, rename)
    error = refused(copied)
    assert error.faults == [("test-00002-of-00008.tfrecord", "misnamed")]
    assert "train-00002-of-00008.tfrecord" in str(error)  # the name trainer.prepare gives that place


def test_a_malformed_shard_entry_is_refused_naming_it(copied: Path) -> None:
    edit_manifest(copied, lambda meta: meta["splits"]["validation"]["shards"][3].update(sha256="abc"))
    with pytest.raises(datasetinfo.DataError) as caught:
        datasetinfo.load_metadata(str(copied))
    message = str(caught.value)
    assert message.startswith(
        f"{copied}/metadata.json is malformed (shard 3 of split 'validation': expected "
    )
    assert '"sha256": "abc"' in message and AGAIN in message


def test_a_fully_forged_manifest_is_the_limit_of_what_metadata_json_can_tell(copied: Path) -> None:
    """metadata.json is not signed: entries and fingerprint all rewritten for a tampered shard
    pass every check. What is left is the fingerprint itself, which differs from the one the
    dataset was prepared with (metrics.json's and a backup's `dataset_fingerprint`)."""
    before = manifest(copied)["fingerprint"]
    shard = copied / "test-00005-of-00008.tfrecord"
    shutil.copy(copied / "test-00004-of-00008.tfrecord", shard)

    def forge(meta: dict[str, Any]) -> None:
        meta["splits"]["test"]["shards"][5].update(bytes=shard.stat().st_size, sha256=sha(shard))

    edit_manifest(copied, forge, refingerprint=True)
    assert datasetinfo.load_metadata(str(copied), verify="full").fingerprint != before


# --- metadata.json of another format ----------------------------------------------------------


def test_metadata_of_the_previous_format_says_to_prepare_again(copied: Path) -> None:
    """Format 1 listed shard names alone: nothing to check sizes and hashes against."""

    def downgrade(meta: dict[str, Any]) -> None:
        meta["format_version"] = 1
        for info in meta["splits"].values():
            info["shards"] = [s["name"] for s in info["shards"]]

    edit_manifest(copied, downgrade)
    with pytest.raises(datasetinfo.DataError) as caught:
        datasetinfo.load_metadata(str(copied))
    assert str(caught.value) == (
        f"{copied}/metadata.json has format_version 1, written by an older trainer.prepare; this "
        f"trainer reads format_version {contract.METADATA_FORMAT_VERSION}: {AGAIN}{copied} "
        "--overwrite`, with the other flags it was prepared with)"
    )


def test_metadata_of_a_newer_format_says_which_trainer_reads_it(copied: Path) -> None:
    edit_manifest(copied, lambda meta: meta.update(format_version=contract.METADATA_FORMAT_VERSION + 1))
    with pytest.raises(
        datasetinfo.DataError,
        match=r"written by a newer trainer\.prepare; .*use the trainer that prepared it",
    ):
        datasetinfo.load_metadata(str(copied))


def test_metadata_that_is_not_json_is_refused_naming_it(copied: Path) -> None:
    (copied / contract.METADATA_FILE).write_text('{"format_version": 2, ')
    with pytest.raises(datasetinfo.DataError, match=rf"^{copied}/metadata\.json is not JSON \("):
        datasetinfo.load_metadata(str(copied))


def test_the_trainer_exits_1_with_one_line_on_a_damaged_dataset(
    copied: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before any strategy or model: a resized shard ends `python -m trainer.task` with one line."""
    from tests.conftest import FAST_TRAIN_FLAGS
    from trainer import task

    (copied / "validation-00001-of-00008.tfrecord").write_bytes(b"x" * 10)
    argv = [f"--data_dir={copied}", f"--model_dir={copied.parent / 'model'}", *FAST_TRAIN_FLAGS, "--epochs=1"]
    assert task.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(
        f"python -m trainer.task: error: prepared dataset {copied} does not match its metadata.json: "
    )
    assert "shard validation-00001-of-00008.tfrecord of split 'validation': expected " in err[0]
    assert not (copied.parent / "model").exists()


def test_the_evaluation_exits_1_with_one_line_on_a_damaged_dataset(
    copied: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainer import evaluate

    (copied / "test-00000-of-00008.tfrecord").unlink()
    argv = [f"--data_dir={copied}", f"--model_dir={tmp_path / 'none'}", f"--output_dir={tmp_path / 'out'}"]
    assert evaluate.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "shard test-00000-of-00008.tfrecord of split 'test': expected the file" in err[0]
    assert not (tmp_path / "out").exists()
