"""The source's identity in metadata.json's `source_info` (trainer.contract
METADATA_SOURCE_INFO_KEYS): a TFDS dataset's registered download checksums, a folder's listing
fingerprint (names, sizes, modification times), computed by hand here."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from trainer import contract
from trainer.preparation import shards


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """Two classes in train and test; the files' content is never read for the listing."""
    root = tmp_path / "images"
    for split, n in (("train", 3), ("test", 1)):
        for name in ("cat", "dog"):
            (root / split / name).mkdir(parents=True)
            for i in range(n):
                path = root / split / name / f"{i}.jpg"
                path.write_bytes(b"x" * (10 + i))
                os.utime(path, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000 + i))
    (root / "train" / "cat" / "notes.txt").write_text("skipped, not in the listing")
    return root


def by_hand(root: Path) -> str:
    lines = []
    for path in sorted(root.rglob("*.jpg")):
        st = path.stat()
        lines.append(f"{path.relative_to(root).as_posix()}\t{st.st_size}\t{st.st_mtime_ns}\n")
    return "sha256:" + hashlib.sha256("".join(sorted(lines)).encode()).hexdigest()


def test_a_folder_listing_is_names_sizes_and_mtimes(folder: Path) -> None:
    listing = shards.folder_listing(str(folder))
    assert listing == {"images": 8, "bytes": 4 * 10 + 2 * 11 + 2 * 12, "fingerprint": by_hand(folder)}


@pytest.mark.parametrize("change", ["touched", "resized", "renamed", "added", "skipped entry added"])
def test_the_listing_fingerprint_follows_every_image_and_nothing_else(folder: Path, change: str) -> None:
    before = shards.folder_listing(str(folder))["fingerprint"]
    image = folder / "train" / "dog" / "1.jpg"
    if change == "touched":
        os.utime(image, ns=(1, 2))
    elif change == "resized":
        image.write_bytes(b"y" * 15)
        os.utime(image, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_001))
    elif change == "renamed":
        image.rename(image.with_name("one.jpg"))
    elif change == "added":
        (folder / "test" / "cat" / "9.png").write_bytes(b"z")
    else:
        (folder / "test" / "cat" / "readme.md").write_text("not an image")
    after = shards.folder_listing(str(folder))["fingerprint"]
    assert (after == before) == (change == "skipped entry added")
    assert after == by_hand(folder) or change == "added"  # by_hand lists .jpg files only


def test_tfds_downloads_are_the_checksums_tfds_registers() -> None:
    """cassava's one archive, as TFDS's checksums file records it (no download, no request)."""
    downloads = shards.tfds_downloads("cassava")
    assert downloads == [
        {
            "url": "https://storage.googleapis.com/emcassavadata/cassavaleafdata.zip",
            "bytes": downloads[0]["bytes"] if downloads else None,
            "sha256": "8ae63d2ef7dee0899d252a748523e603f97e2ae7022f103f92fc42a9fce74d95",
        }
    ]
    assert downloads[0]["bytes"] > 1 << 30
    assert shards.tfds_downloads("no_such_dataset_here") is None


def test_a_prepared_folder_records_its_identity(folder: Path, tmp_path: Path) -> None:
    from trainer._tf import tf
    from trainer.preparation.prepareconfig import PrepareConfig
    from trainer.prepare import prepare

    for path in folder.rglob("*.jpg"):  # real images now; the listing is taken after this
        path.write_bytes(tf.io.encode_jpeg(tf.zeros((8, 8, 3), tf.uint8)).numpy())
    out = tmp_path / "out"
    prepare(PrepareConfig(source=f"folder:{folder}", output_dir=str(out), image_size=8, shards=1))
    info = json.loads((out / contract.METADATA_FILE).read_text())["source_info"]
    assert sorted(info) == sorted(contract.METADATA_SOURCE_INFO_KEYS["folder"])
    assert info["listing"]["fingerprint"] == by_hand(folder) and info["listing"]["images"] == 8
