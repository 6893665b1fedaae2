"""The input pipeline's memory bound: the cache budget (cgroup limit, physical memory, override),
the cache-or-stream decision made from metadata.json, and what a streamed split yields."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from trainer import contract, data, datasetinfo
from trainer._tf import tf

GIB, MIB = 1 << 30, 1 << 20
V1_UNLIMITED = "9223372036854771712"


# --- the budget -----------------------------------------------------------------------------


@pytest.fixture
def physical(monkeypatch: pytest.MonkeyPatch) -> int:
    """The machine's memory, pinned so the figures do not depend on the test machine."""
    memory = 64 * GIB
    monkeypatch.setattr(data, "physical_memory", lambda: memory)
    return memory


def fake_cgroup(tmp_path: Path, proc_line: str, files: dict[str, str]) -> dict[str, str]:
    """A cgroup mount under tmp_path with `files` (relative path: content), and a
    /proc/self/cgroup with `proc_line`: the keyword arguments for `data.cache_budget`."""
    root = tmp_path / "cgroup"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text + "\n")
    root.mkdir(parents=True, exist_ok=True)
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(proc_line + "\n")
    return {"cgroup_root": str(root), "proc_cgroup": str(proc)}


def expected(memory: int) -> int:
    return int(data.CACHE_FRACTION * memory) - data.MODEL_RESERVE_BYTES


def test_the_budget_is_a_share_of_the_cgroup_v2_limit_less_the_model(tmp_path: Path, physical: int) -> None:
    where = fake_cgroup(tmp_path, "0::/", {"memory.max": str(8 * GIB)})
    budget = data.cache_budget({}, **where)
    assert budget.bytes == expected(8 * GIB) == int(2.5 * GIB)
    assert "container's memory limit 8.0 GiB" in budget.source and "memory.max" in budget.source


def test_a_limit_on_an_ancestor_cgroup_counts(tmp_path: Path, physical: int) -> None:
    where = fake_cgroup(
        tmp_path,
        "0::/kubepods/pod1/trainer",
        {"kubepods/memory.max": str(6 * GIB), "kubepods/pod1/trainer/memory.max": "max"},
    )
    assert data.cgroup_memory_limit(**where) == (
        6 * GIB,
        str(Path(where["cgroup_root"]) / "kubepods/memory.max"),
    )
    assert data.cache_budget({}, **where).bytes == expected(6 * GIB)


def test_the_budget_reads_cgroup_v1_and_ignores_its_no_limit_value(tmp_path: Path, physical: int) -> None:
    where = fake_cgroup(
        tmp_path,
        "4:memory:/docker/abc\n0::/",
        {
            "memory/memory.limit_in_bytes": V1_UNLIMITED,
            "memory/docker/abc/memory.limit_in_bytes": str(12 * GIB),
        },
    )
    assert data.cache_budget({}, **where).bytes == expected(12 * GIB)


def test_without_a_limit_the_budget_is_a_share_of_physical_memory(tmp_path: Path, physical: int) -> None:
    for i, files in enumerate(({"memory.max": "max"}, {"memory/memory.limit_in_bytes": V1_UNLIMITED}, {})):
        where = fake_cgroup(tmp_path / str(i), "0::/", files)
        budget = data.cache_budget({}, **where)
        assert budget.bytes == expected(physical) == 30 * GIB + GIB // 2
        assert "machine's memory 64.0 GiB" in budget.source
    # A limit above the machine's memory limits nothing.
    where = fake_cgroup(tmp_path / "above", "0::/", {"memory.max": str(128 * GIB)})
    assert data.cache_budget({}, **where).bytes == expected(physical)


def test_a_small_container_gets_no_cache(tmp_path: Path, physical: int) -> None:
    where = fake_cgroup(tmp_path, "0::/", {"memory.max": str(2 * GIB)})
    assert data.cache_budget({}, **where).bytes == 0


def test_the_environment_overrides_the_budget(tmp_path: Path, physical: int) -> None:
    where = fake_cgroup(tmp_path, "0::/", {"memory.max": str(8 * GIB)})
    budget = data.cache_budget({data.CACHE_BUDGET_ENV: "64"}, **where)
    assert budget == data.CacheBudget(64 * MIB, "$TRAINER_CACHE_BUDGET_MB=64")
    assert data.cache_budget({data.CACHE_BUDGET_ENV: "0"}, **where).bytes == 0
    assert data.cache_budget({data.CACHE_BUDGET_ENV: " "}, **where).bytes == expected(8 * GIB)
    for bad in ("-1", "1.5", "64MB"):
        with pytest.raises(ValueError, match=r"\$TRAINER_CACHE_BUDGET_MB=.*whole number of MiB"):
            data.cache_budget({data.CACHE_BUDGET_ENV: bad}, **where)


def test_the_budget_reads_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(data.CACHE_BUDGET_ENV, "5")
    assert data.cache_budget().bytes == 5 * MIB


# --- the decision, from metadata.json alone ----------------------------------------------------


def metadata(image_size: int, counts: dict[str, int], shards: int = 32) -> datasetinfo.DatasetMetadata:
    splits = {}
    for split, count in counts.items():
        n = max(1, min(shards, count))
        names = tuple(f"{split}-{i:05d}-of-{n:05d}.tfrecord" for i in range(n))
        splits[split] = datasetinfo.SplitInfo(count, names, {})
    return datasetinfo.DatasetMetadata(("a", "b"), image_size, "raw", splits, "sha256:0", "test")


IMAGE_300 = 300 * 300 * 3 + data.EXAMPLE_OVERHEAD_BYTES


def test_a_folder_of_200000_images_streams_training_and_caches_what_fits() -> None:
    """The user's job: 200,000 images at 300 px need 54 GB decoded; a 16 GiB machine's budget is 6.5 GiB."""
    meta = metadata(300, {"train": 200_000, "validation": 5_000, "test": 5_000})
    budget = data.CacheBudget(int(6.5 * GIB), "test")
    plans = data.plan_cache(meta, budget, shuffle_buffer=2048)
    train, validation, test = plans["train"], plans["validation"], plans["test"]
    assert not train.cache and train.decoded_bytes == 200_000 * IMAGE_300
    assert train.shuffle_buffer == 2048  # the budget affords the requested buffer
    assert validation.cache and test.cache
    charged = 2048 * IMAGE_300 * data.STREAM_BUFFER_FACTOR
    assert validation.available_bytes == budget.bytes - charged
    assert test.available_bytes == budget.bytes - charged - 5_000 * IMAGE_300


def test_small_data_is_cached_as_before(synthetic_dir: Path, tmp_path: Path, physical: int) -> None:
    """On a modest machine (8 GiB, no container limit) with the defaults."""
    meta = datasetinfo.load_metadata(str(synthetic_dir))
    where = fake_cgroup(tmp_path, "0::/", {"memory.max": str(8 * GIB)})
    plans = data.plan_cache(meta, data.cache_budget({}, **where), shuffle_buffer=2048)
    assert all(p.cache for p in plans.values())
    assert plans["train"].shuffle_buffer == 300  # min(shuffle_buffer, split), as before


def test_a_split_is_cached_exactly_when_it_fits_what_the_splits_before_it_left() -> None:
    meta = metadata(64, {"train": 300, "validation": 100, "test": 100}, shards=8)
    per = data.example_bytes(meta)
    fits = data.plan_cache(meta, data.CacheBudget(300 * per, "t"))
    assert fits["train"].cache and not fits["validation"].cache and not fits["test"].cache
    assert fits["validation"].available_bytes == 0
    short = data.plan_cache(meta, data.CacheBudget(300 * per - 1, "t"))
    assert not short["train"].cache
    # The streamed training split's buffer is charged first: what is left caches validation.
    room = data.plan_cache(
        meta, data.CacheBudget((10 * data.STREAM_BUFFER_FACTOR + 100) * per, "t"), shuffle_buffer=10
    )
    assert not room["train"].cache and room["train"].shuffle_buffer == 10
    assert room["validation"].cache and not room["test"].cache


def test_a_streamed_shuffle_buffer_shrinks_to_the_budget_but_never_to_nothing() -> None:
    meta = metadata(64, {"train": 300, "validation": 100, "test": 100}, shards=8)
    per = data.example_bytes(meta) * data.STREAM_BUFFER_FACTOR
    assert data.plan_cache(meta, data.CacheBudget(40 * per + per - 1, "t"))["train"].shuffle_buffer == 40
    assert data.plan_cache(meta, data.CacheBudget(0, "t"))["train"].shuffle_buffer == 1
    line = data.plan_cache(meta, data.CacheBudget(40 * per, "t"))["train"].describe(8)
    assert "streamed from 8 shard(s)" in line and "shuffle buffer 40 examples" in line
    assert "cut from --shuffle_buffer 2,048 to fit the budget" in line


def test_workers_are_planned_for_the_shards_they_read() -> None:
    meta = metadata(300, {"train": 200_000, "validation": 5_000, "test": 3}, shards=32)
    plans = data.plan_cache(meta, data.CacheBudget(20 * GIB, "t"), num_workers=4)
    assert plans["train"].examples == 50_000  # FILE: 8 of the 32 shards each
    assert plans["train"].cache  # 13.5 GB of 20 GiB
    assert plans["test"].examples == 3  # DATA (3 shards < 4 workers): every worker reads all
    uneven = metadata(64, {"train": 301, "validation": 10, "test": 10}, shards=8)
    assert data.plan_cache(uneven, data.CacheBudget(0, "t"), num_workers=3)["train"].examples == 38 + 38 + 37


# --- what a streamed split yields (TensorFlow in this process) ----------------------------------

TINY = data.CacheBudget(MIB, "test: forced tiny")
"""Streams every split of the 64 px synthetic dataset (300 training images: 3.6 MiB)."""


@pytest.fixture(scope="module")
def meta(synthetic_dir: Path) -> datasetinfo.DatasetMetadata:
    return datasetinfo.load_metadata(str(synthetic_dir))


def image_ids(ds: tf.data.Dataset, n: int | None = None) -> list[str]:
    examples = ds.unbatch() if n is None else ds.unbatch().take(n)
    return [hashlib.sha1(x.numpy().tobytes()).hexdigest() for x, _ in examples]


def training(
    synthetic_dir: Path, meta: datasetinfo.DatasetMetadata, seed: int, num_workers: int = 1
) -> tf.data.Dataset:
    """The streamed training split, batches of 20 (15 to an epoch)."""
    return data.make_dataset(
        str(synthetic_dir),
        meta,
        "train",
        batch_size=20,
        training=True,
        seed=seed,
        num_workers=num_workers,
        budget=TINY,
        log=None,
    )


def test_the_log_says_which_way_a_split_went_and_why(
    synthetic_dir: Path, meta: datasetinfo.DatasetMetadata, capsys: pytest.CaptureFixture[str]
) -> None:
    data.make_dataset(str(synthetic_dir), meta, "validation", batch_size=8, training=False, budget=TINY)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1
    assert out[0].startswith("[data] split 'validation': streamed from 8 shard(s) every epoch: 100 examples")
    assert "exceeds" in out[0] and "(budget 1.0 MiB: test: forced tiny)" in out[0]
    lines: list[str] = []
    data.make_dataset(
        str(synthetic_dir),
        meta,
        "validation",
        batch_size=8,
        training=False,
        budget=data.CacheBudget(GIB, "big"),
        log=lines.append,
    )
    assert len(lines) == 1 and lines[0].startswith("split 'validation': cached in memory: 100 examples")
    assert capsys.readouterr().out == ""


def test_a_streamed_training_split_yields_every_example_once_per_epoch(
    synthetic_dir: Path, meta: datasetinfo.DatasetMetadata
) -> None:
    ds = training(synthetic_dir, meta, seed=1)
    assert ds.element_spec[0].shape.as_list() == [20, 64, 64, 3]  # drop_remainder: static batches
    options = ds.options()
    assert options.experimental_distribute.auto_shard_policy == tf.data.experimental.AutoShardPolicy.FILE
    assert options.deterministic is True
    seen = image_ids(ds, 3 * 300)
    epochs = [seen[i * 300 : (i + 1) * 300] for i in range(3)]
    for epoch in epochs:
        assert len(set(epoch)) == 300
    assert set(epochs[0]) == set(epochs[1]) == set(epochs[2])
    assert epochs[0] != epochs[1]  # reshuffled every epoch


def test_a_streamed_training_order_is_a_function_of_the_seed(
    synthetic_dir: Path, meta: datasetinfo.DatasetMetadata
) -> None:
    first = image_ids(training(synthetic_dir, meta, seed=1), 600)
    assert image_ids(training(synthetic_dir, meta, seed=1), 600) == first
    other = image_ids(training(synthetic_dir, meta, seed=2), 600)
    assert other != first and sorted(other[:300]) == sorted(first[:300])
    in_files = image_ids(
        data.make_dataset(
            str(synthetic_dir), meta, "train", batch_size=20, training=False, budget=TINY, log=None
        )
    )
    assert first[:300] != in_files  # shuffled, not the shards' order


def test_a_streamed_epoch_is_shuffled_within_a_shard(
    synthetic_dir: Path, meta: datasetinfo.DatasetMetadata
) -> None:
    """One shard: no shard order to shuffle, so only the shuffle buffer can reorder its records
    beyond the rotation every shard is read with."""
    one = datasetinfo.SplitInfo(38, meta.splits["train"].shards[:1], {})
    sub = datasetinfo.DatasetMetadata(**{**meta.__dict__, "splits": {**meta.splits, "train": one}})
    budget = data.CacheBudget(12 * data.STREAM_BUFFER_FACTOR * data.example_bytes(meta), "t")
    plan = data.plan_cache(sub, budget)["train"]
    assert not plan.cache and plan.shuffle_buffer == 12
    in_file = image_ids(
        data.make_dataset(
            str(synthetic_dir), sub, "train", batch_size=2, training=False, budget=budget, log=None
        )
    )
    assert len(in_file) == 38
    ds = data.make_dataset(
        str(synthetic_dir), sub, "train", batch_size=2, training=True, seed=1, budget=budget, log=None
    )
    epoch = image_ids(ds, 38)
    assert sorted(epoch) == sorted(in_file)
    assert epoch not in [in_file[k:] + in_file[:k] for k in range(38)]


def test_streamed_evaluation_is_what_cached_evaluation_is(
    synthetic_dir: Path, meta: datasetinfo.DatasetMetadata
) -> None:
    def batches(budget: data.CacheBudget) -> list[tuple[bytes, list[int]]]:
        ds = data.make_dataset(
            str(synthetic_dir), meta, "test", batch_size=7, training=False, budget=budget, log=None
        )
        assert ds.options().deterministic is True
        return [(x.numpy().tobytes(), y.numpy().tolist()) for x, y in ds]

    streamed = batches(TINY)
    assert len(streamed) == 15 and len(streamed[-1][1]) == 100 - 14 * 7  # the last batch is kept
    assert streamed == batches(data.CacheBudget(GIB, "big"))


def test_file_sharding_splits_a_streamed_epoch_between_workers(
    synthetic_dir: Path, meta: datasetinfo.DatasetMetadata
) -> None:
    """tf.distribute's FILE auto-sharding, applied as MultiWorkerMirroredStrategy applies it."""
    from tensorflow.python.data.experimental.ops.distribute import _AutoShardDataset

    seen = []
    for worker in range(2):
        ds = training(synthetic_dir, meta, seed=3, num_workers=2)
        ids = image_ids(_AutoShardDataset(ds, 2, worker), 2 * 150)
        assert len(set(ids[:150])) == 150 and set(ids[:150]) == set(ids[150:])
        seen.append(set(ids))
    assert not seen[0] & seen[1] and len(seen[0] | seen[1]) == 300


@pytest.fixture(scope="module")
def class_sorted_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared dataset written as `trainer.prepare` writes a folder source: round-robin
    shards in source order, and the source listed class by class (5 classes x 200, 32 px)."""
    from trainer import images
    from trainer.preparation.shards import ShardWriter, example_record

    out = tmp_path_factory.mktemp("sorted")
    rng = np.random.default_rng(0)
    splits = {}
    for split, per_class in (("train", 200), ("validation", 4), ("test", 4)):
        writer = ShardWriter(str(out), split, 5 * per_class, 16)
        for label in range(5):
            for _ in range(per_class):
                pixels = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
                writer.write(example_record(images.encode(tf.constant(pixels), "raw").numpy(), label))
        writer.close()
        splits[split] = {
            "count": 5 * per_class,
            "class_counts": {str(c): per_class for c in range(5)},
            "shards": writer.manifest,
        }
    meta = {
        "format_version": contract.METADATA_FORMAT_VERSION,
        "source": "folder:sorted",
        "source_info": {},
        "class_names": [str(c) for c in range(5)],
        "num_classes": 5,
        "image_size": 32,
        "channels": 3,
        "encoding": "raw",
        "seed": 0,
        "splits": splits,
    }
    meta["fingerprint"] = datasetinfo.manifest_fingerprint(meta)
    (out / contract.METADATA_FILE).write_text(json.dumps(meta))
    return out


def test_streaming_class_sorted_shards_still_mixes_classes(class_sorted_dir: Path) -> None:
    """Shards read from their starts in lockstep would give batches of one class (0.97 of a batch
    measured); reading each from its own offset mixes them, even through a 16-example buffer."""
    meta = datasetinfo.load_metadata(str(class_sorted_dir))
    budget = data.CacheBudget(16 * data.example_bytes(meta) * data.STREAM_BUFFER_FACTOR, "t")
    ds = data.make_dataset(
        str(class_sorted_dir), meta, "train", batch_size=32, training=True, seed=1, budget=budget, log=None
    )
    assert data.plan_cache(meta, budget)["train"].shuffle_buffer == 16
    labels = [y.numpy() for _, y in ds.take(1000 // 32)]
    largest_share = np.mean([np.bincount(y, minlength=5).max() / len(y) for y in labels])
    assert largest_share < 0.6, largest_share
