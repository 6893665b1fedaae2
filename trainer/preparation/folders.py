"""The image-folder source, `folder:PATH`: its layout's rules, its listing and its reading.

PATH/<split>/<class>/<image>, local or gs://. `list_folder` holds the layout's rules without
TensorFlow (sourcecheck applies them up front); `open_folder` lists and reads with TensorFlow.
Images (IMAGE_FORMATS) are checked from their header before anything is decoded; every other
entry is skipped and listed (`Skipped`). The source itself is never changed.
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import math
import os
import stat
import sys
import time
from collections.abc import Callable
from typing import Any

from trainer import storage
from trainer.config import MAX_IMAGE_PIXELS, MAX_IMAGE_SIZE, SPLITS
from trainer.preparation.imageheaders import BadImageHeader, ImageHeader, read_image_header
from trainer.preparation.progress import Progress
from trainer.preparation.source import PrepareError, Source, SourceSplit, shown, too_few_classes

# The formats TensorFlow 2.21's `decode_image` decodes ("Unknown image file format. One of JPEG,
# JPEG XL, PNG, GIF, BMP, WebP required.", its error for any other; pinned by
# tests/trainer/test_prepare_inputs.py). It goes by content, not name, as `read_image_header` does.
IMAGE_FORMATS = {
    ".jpg": "JPEG",
    ".jpeg": "JPEG",
    ".png": "PNG",
    ".gif": "GIF",
    ".bmp": "BMP",
    ".webp": "WebP",
    ".jxl": "JPEG XL",
}
IMAGE_EXTENSIONS = tuple(IMAGE_FORMATS)
# Image formats TensorFlow cannot decode: skipped, and named as such (any other as "not an image").
UNDECODABLE_FORMATS = {
    **dict.fromkeys((".tif", ".tiff"), "TIFF"),
    **dict.fromkeys((".heic", ".heif"), "HEIF"),
    ".avif": "AVIF",
    ".jp2": "JPEG 2000",
    ".ico": "ICO",
    ".svg": "SVG",
    ".psd": "Photoshop",
    **dict.fromkeys((".dng", ".cr2", ".cr3", ".nef", ".arw", ".orf", ".rw2", ".raf"), "camera raw"),
}
# Split folder names people use for validation; a folder source with one is told to rename it.
VALIDATION_ALIASES = ("val", "valid", "dev", "eval")


def image_problem(path: str, header: ImageHeader) -> str | None:
    """Why the image at `path` is refused, in one line (None: it is not)."""
    if header.unsupported:
        return f"cannot decode image {path}: {header.unsupported}; convert it to PNG or JPEG, or remove it"
    if header.pixels <= MAX_IMAGE_PIXELS:
        return None
    dims = f"{header.width}x{header.height} pixels"
    size = f"{dims} ({header.pixels:,} pixels)"
    if header.frames > 1:
        size = (
            f"a GIF of {header.frames} frames of {dims}: {header.pixels:,} pixels to decode (TensorFlow "
            "reads every frame of a GIF, even to keep the first)"
        )
    side = math.isqrt(MAX_IMAGE_PIXELS)
    return (
        f"image {path} is {size}, over the limit of {MAX_IMAGE_PIXELS:,} pixels ({side}x{side}), so it "
        f"is not decoded; downscale it (training uses at most {MAX_IMAGE_SIZE}x{MAX_IMAGE_SIZE}) or "
        "remove it"
    )


def check_image_bytes(data: bytes, path: str) -> int:
    """The pixels the image `data` (read from `path`) decodes to; ValueError, the problem in one
    line, for a refused one."""
    try:
        header = read_image_header(data)
    except BadImageHeader as e:
        raise ValueError(f"cannot decode image {path}: {e}") from None
    if problem := image_problem(path, header):
        raise ValueError(problem)
    return header.pixels


def check_image_file(p: str) -> str | None:
    """Why the local image file `p` is refused, in one line, or None: it must be a readable
    regular file (or a symlink to one) whose header (read alone) passes `image_problem`."""
    allowed = f"each {'/'.join(IMAGE_EXTENSIONS)} entry in a class folder must be a readable image file"
    try:
        st = os.stat(p)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return f"{p} is a symlink loop; {allowed}"
        if os.path.islink(p):
            return f"{p} is a broken symlink (to {os.readlink(p)}); {allowed}"
        return f"cannot read {p} ({e.strerror}); {allowed}"
    if stat.S_ISDIR(st.st_mode):
        return f"{p} is a folder, not an image; {allowed}"
    if not stat.S_ISREG(st.st_mode):
        return f"{p} is not a regular file; {allowed}"
    if not os.access(p, os.R_OK):
        return f"cannot read {p} (permission denied); {allowed}"
    try:
        with open(p, "rb") as f:
            header = read_image_header(file=f)
    except OSError as e:
        return f"cannot read {p} ({e.strerror}); {allowed}"
    except BadImageHeader as e:
        return f"cannot decode image {p}: {e}"
    return image_problem(p, header)


# --- a folder source's listing (no TensorFlow) ------------------------------------------------

FOLDER_LAYOUT = "PATH/<split>/<class>/*.jpg (split: train, validation or test)"
HIDDEN = "hidden"
SKIPPED_EXAMPLES = 5  # paths kept per kind of skipped entry (metadata.json)
SUMMARY_EXAMPLES = 4  # paths in the one summary line
# More unknown folders than this at the top of a source are one problem, naming this many.
MAX_UNKNOWN_SPLITS_NAMED = 5


_PLURALS = {
    "nested folder": "nested folders",
    "file at the top": "files at the top",
    "file beside the class folders": "files beside the class folders",
    "file without extension": "files without extension",
}


@dataclasses.dataclass
class Skipped:
    """The entries of a folder source that are not used, by kind: `kinds[kind]` is
    {"kind", "why", "count", "examples"} (paths relative to the source; none for hidden ones)."""

    kinds: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    def add(self, kind: str, why: str, path: str) -> None:
        entry = self.kinds.setdefault(kind, {"kind": kind, "why": why, "count": 0, "examples": []})
        entry["count"] += 1
        if kind != HIDDEN and len(entry["examples"]) < SKIPPED_EXAMPLES:
            entry["examples"].append(path)

    @property
    def count(self) -> int:
        return sum(e["count"] for e in self.kinds.values())

    def ordered(self) -> list[dict[str, Any]]:
        """Most frequent first, hidden entries last."""
        return sorted(self.kinds.values(), key=lambda e: (e["kind"] == HIDDEN, -e["count"], e["kind"]))

    def counts_text(self) -> str:
        """ "2 .tiff (TensorFlow cannot decode TIFF), 1 nested folder (...), 1 hidden"."""
        return ", ".join(
            f"{e['count']} {_PLURALS.get(e['kind'], e['kind']) if e['count'] > 1 else e['kind']}"
            + (f" ({e['why']})" if e["why"] else "")
            for e in self.ordered()
        )

    def summary(self) -> str | None:
        """One line: what was skipped (`counts_text`) and a few examples; None when nothing was."""
        if not self.kinds:
            return None
        examples = [e["examples"][0] for e in self.ordered() if e["examples"]][:SUMMARY_EXAMPLES]
        n = self.count
        line = f"skipped {n} {'entry' if n == 1 else 'entries'} of the source (not used, left as they are): "
        return line + self.counts_text() + (f"; e.g. {', '.join(examples)}" if examples else "")

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "kinds": [dict(e, examples=list(e["examples"])) for e in self.ordered()]}


def _skip_kind(name: str, is_dir: bool) -> tuple[str, str]:
    """(kind, why) of an entry of a class folder that is not an image."""
    if name.startswith("."):
        return HIDDEN, ""
    if is_dir:
        return "nested folder", "class folders are read one level deep"
    ext = os.path.splitext(name)[1].lower()
    if ext in UNDECODABLE_FORMATS:
        return ext, f"TensorFlow cannot decode {UNDECODABLE_FORMATS[ext]}"
    return (ext or "file without extension"), "not an image"


class _OutOfBudget(Exception):
    pass


@dataclasses.dataclass
class ListingBudget:
    """Bounds a listing (sourcecheck must answer in seconds whatever the folder): at most
    `entries` folder entries read, and nothing after `seconds`."""

    entries: int
    seconds: float
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self.used = 0
        self.deadline = self.clock() + self.seconds

    def spend(self) -> None:
        self.used += 1
        if self.used > self.entries or self.clock() > self.deadline:
            raise _OutOfBudget

    def why(self) -> str:
        if self.used > self.entries:
            return f"stopped after {self.entries:,} entries"
        return f"stopped after {self.seconds:g} s"


class _LocalTree:
    """A local folder tree, read with os.scandir (no stat call per file). A tree (this, or
    `_GfileTree`) gives `isdir(path)`, `exists(path)` and `entries(folder, budget)`: the folder's
    sorted (name, is a folder) pairs, each spent from `budget`."""

    isdir, exists = staticmethod(os.path.isdir), staticmethod(os.path.lexists)

    def entries(self, folder: str, budget: ListingBudget) -> list[tuple[str, bool]]:
        found = []
        with os.scandir(folder) as it:
            for entry in it:
                budget.spend()
                try:
                    is_dir = entry.is_dir()  # follows a symlink, as the training reads it
                except OSError:
                    is_dir = False
                found.append((entry.name, is_dir))
        return sorted(found)


@dataclasses.dataclass
class FolderListing:
    """A folder source as `list_folder` found it: `splits`, per split, its image paths and labels
    (indexes into class_names); `problems`, one line each; `complete` False when a budget stopped
    the listing early (`stopped` says where); `files_checked`, images checked (none for gs://)."""

    path: str
    root: str
    class_names: list[str] = dataclasses.field(default_factory=list)
    splits: dict[str, tuple[list[str], list[int]]] = dataclasses.field(default_factory=dict)
    skipped: Skipped = dataclasses.field(default_factory=Skipped)
    problems: list[str] = dataclasses.field(default_factory=list)
    complete: bool = True
    stopped: str | None = None
    files_checked: int = 0

    def class_counts(self) -> dict[str, dict[str, int]]:
        counted = {split: collections.Counter(labels) for split, (_, labels) in self.splits.items()}
        return {
            split: {name: c[i] for i, name in enumerate(self.class_names)} for split, c in counted.items()
        }


def list_folder(path: str, *, budget: ListingBudget | None = None, check_files: bool = True) -> FolderListing:
    """Lists the folder source `folder:PATH` by the layout's rules, without TensorFlow (but for
    gs://, read through tf.io.gfile): split folders among SPLITS (train required), the same class
    folders in every split, each with an image; other entries are skipped by kind. With
    `check_files`, every local image is checked once the layout is right (a gs:// one as it is
    read: a request each). budget: bounds the listing (default: unbounded)."""
    listing = FolderListing(path=path, root=storage.resolve(path.rstrip("/")) or "/")
    remote = storage.is_remote(listing.root)
    budget = budget or ListingBudget(sys.maxsize, math.inf)
    try:
        _list_folder(listing, _GfileTree() if remote else _LocalTree(), budget, check_files and not remote)
    except _OutOfBudget:
        listing.complete, listing.stopped = False, budget.why()
    return listing


def _list_folder(listing: FolderListing, tree: _LocalTree, budget: ListingBudget, check_files: bool) -> None:
    src, root = f"--source folder:{listing.path}", listing.root
    problems, skipped = listing.problems, listing.skipped
    if os.path.abspath(root) == os.path.abspath(os.sep):  # never for gs://
        problems.append(
            f"{src}: {root} is the file system's root, not an image folder; name the folder that "
            f"holds train/ (expected {FOLDER_LAYOUT})"
        )
        return
    if not tree.isdir(root):
        file = f"{root} is a file, not a folder; expected {FOLDER_LAYOUT}"
        problems.append(f"{src}: {file if tree.exists(root) else 'no such folder'}")
        return

    def entries(folder: str) -> list[tuple[str, bool]] | None:
        try:
            return tree.entries(folder, budget)
        except OSError as e:
            problems.append(f"{src}: cannot list {folder} ({e.strerror or e})")
            return None

    def subfolders(folder: str, rel: str, file_kind: str, why: str) -> list[str] | None:
        """The folders in `folder` (`rel` under root), its hidden entries and files skipped."""
        found = entries(folder)
        if found is None:
            return None
        names = []
        for name, is_dir in found:
            if name.startswith("."):
                skipped.add(HIDDEN, "", rel + name)
            elif is_dir:
                names.append(name)
            else:
                skipped.add(file_kind, why, rel + name)
        return names

    top = subfolders(root, "", "file at the top", "only the split folders are read there")
    if top is None:
        return
    unknown = [name for name in top if name not in SPLITS]
    allowed = f"allowed split folders: {', '.join(SPLITS)}"
    if len(unknown) > MAX_UNKNOWN_SPLITS_NAMED:  # not an image folder at all, most likely
        named = ", ".join(unknown[:MAX_UNKNOWN_SPLITS_NAMED])
        problems.append(
            f"{src}: {len(unknown)} unknown split folders in {root} ({named}, ...); {allowed}; is "
            f"{root} the image folder? expected {FOLDER_LAYOUT}"
        )
    else:
        for name in unknown:
            hint = " (rename it to validation/)" if name.lower() in VALIDATION_ALIASES else ""
            problems.append(f"{src}: unknown split folder {storage.join(root, name)}{hint}; {allowed}")
    splits = [s for s in SPLITS if s in top]
    if "train" not in splits:
        problems.append(f"{src} has no train/ folder; expected {FOLDER_LAYOUT}")
        return

    classes_by_split: dict[str, list[str]] = {}
    for split in splits:
        folder = storage.join(root, split)
        classes = subfolders(
            folder, f"{split}/", "file beside the class folders", "images go inside a class folder"
        )
        if classes:
            classes_by_split[split] = classes
        elif classes is not None:
            problems.append(f"{folder} has no class folders; expected {FOLDER_LAYOUT}")
    if "train" not in classes_by_split:
        return
    reference = listing.class_names = classes_by_split["train"]
    for split, classes in classes_by_split.items():
        if classes != reference:
            missing, extra = sorted(set(reference) - set(classes)), sorted(set(classes) - set(reference))
            problems.append(
                f"{src}: split {split!r} has different classes than train (missing {missing}, extra "
                f"{extra}); every split needs the same class folders"
            )
    if problems:
        return  # the layout is wrong: its images are neither listed nor checked

    for split in splits:
        paths: list[str] = []
        labels: list[int] = []
        for label, name in enumerate(reference):
            folder = storage.join(root, split, name)
            found = entries(folder)
            if found is None:
                continue
            images, here = [], Skipped()
            for entry, is_dir in found:
                # Hidden entries first: `._photo.jpg` is macOS's AppleDouble metadata, not an image.
                if not entry.startswith(".") and os.path.splitext(entry)[1].lower() in IMAGE_FORMATS:
                    images.append(storage.join(folder, entry))
                    continue
                kind, why = _skip_kind(entry, is_dir)
                rel = f"{split}/{name}/{entry}" + ("/" if is_dir else "")
                skipped.add(kind, why, rel)
                here.add(kind, why, rel)
            if not images:
                there = f"; skipped there: {here.counts_text()}" if here.kinds else ""
                problems.append(
                    f"class {name!r} has no images in {folder} (allowed: {', '.join(IMAGE_EXTENSIONS)}{there})"
                )
            paths += images
            labels += [label] * len(images)
        listing.splits[split] = (paths, labels)
    if classes_problem := too_few_classes(f"folder:{listing.path}", reference):
        problems.append(classes_problem)
    if problems or not check_files:
        return
    for paths, _ in listing.splits.values():
        for p in paths:
            if budget.clock() > budget.deadline:
                listing.stopped = f"{budget.why()}: {listing.files_checked:,} images checked"
                return
            problem = check_image_file(p)
            listing.files_checked += 1
            if problem:
                problems.append(problem)


# --- reading (TensorFlow imported lazily) --------------------------------------------------------


class _GfileTree(_LocalTree):
    """A gs:// folder tree, read with tf.io.gfile: an entry is a folder when its name ends in "/"
    or, for a name not of an image, when gfile says so (no request per image)."""

    def __init__(self) -> None:
        from trainer._tf import tf

        self.isdir, self.exists, self.listdir = tf.io.gfile.isdir, tf.io.gfile.exists, tf.io.gfile.listdir

    def entries(self, folder: str, budget: ListingBudget) -> list[tuple[str, bool]]:
        found = []
        for n in self.listdir(folder):
            budget.spend()
            name = n.rstrip("/")
            image = os.path.splitext(name)[1].lower() in IMAGE_FORMATS
            is_dir = n.endswith("/") or (not image and self.isdir(storage.join(folder, name)))
            found.append((name, is_dir))
        return sorted(found)


def _checked_pixels(data: bytes, path: bytes) -> Any:
    """`check_image_bytes` for tf.numpy_function: the pixels, or -1 for a refused image (named by
    `find_bad_input`: an exception raised here would have TensorFlow print its traceback)."""
    import numpy as np

    try:
        return np.int64(check_image_bytes(data, path.decode(errors="replace")))
    except ValueError:
        return np.int64(-1)


def load_image(p: Any, y: Any) -> tuple[Any, Any]:
    """The (uint8 [H, W, 3] image, int64 label) of the image file `p`; a header refused by
    `check_image_bytes` raises InvalidArgumentError before decoding."""
    from trainer import images
    from trainer._tf import tf

    data = tf.io.read_file(p)
    pixels = tf.numpy_function(_checked_pixels, [data, p], tf.int64, stateful=False)
    refused = tf.debugging.Assert(pixels >= 0, ["image refused by its header:", p])
    with tf.control_dependencies([refused]):
        image = images.decode(data)
    return image, tf.cast(y, tf.int64)


def image_files_dataset(paths: Any, labels: Any) -> Any:
    """The tf.data dataset of (image, label) of the image files `paths`, in order."""
    from trainer._tf import tf

    ds = tf.data.Dataset.from_tensor_slices((list(paths), [int(y) for y in labels]))
    return ds.map(load_image, num_parallel_calls=tf.data.AUTOTUNE)


def find_bad_image(paths: Any) -> str | None:
    """Why the first refused or undecodable image of `paths` is, in one line naming its path
    (None: every one decodes): run after decoding failed."""
    from trainer import images
    from trainer._tf import tf

    for p in paths:
        try:
            data = tf.io.read_file(p)
            check_image_bytes(data.numpy(), p)
            images.decode(data)
        except ValueError as e:
            return str(e)
        except tf.errors.OpError as e:
            return f"cannot decode image {p}: {e.message.splitlines()[0]}"
    return None


def open_folder(path: str, progress: Progress) -> Source:
    """The folder source `folder:PATH`, listed by `list_folder` (its problems refused before any
    image is decoded), its skipped entries said in one line on `progress`."""
    listing = list_folder(path)
    if listing.problems:
        raise PrepareError("\n".join(shown(listing.problems)))
    if summary := listing.skipped.summary():
        progress.say(summary)

    def make(split: str) -> SourceSplit:
        paths, labels = listing.splits[split]
        return SourceSplit(
            count=len(paths),
            dataset=lambda: image_files_dataset(paths, labels),
            find_bad_input=lambda: find_bad_image(paths),
            spec={"kind": "files", "paths": list(paths), "labels": [int(y) for y in labels]},
        )

    return Source(
        class_names=list(listing.class_names),
        splits={s: make(s) for s in listing.splits},
        info={"folder": path, "skipped": listing.skipped.to_json()},
    )
