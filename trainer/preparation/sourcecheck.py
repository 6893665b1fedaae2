"""`python -m trainer.preparation.sourcecheck`: a local folder source checked before any job starts.

The front door applies the preparation's own layout rules (`folders.list_folder`) to
`--dataset_source folder:PATH` in seconds, before the pipeline starts. No TensorFlow.

    stdin:  {"source": "folder:/data/leaves", "validation_fraction": 0.15, "test_fraction": 0.15}
            (the fractions are optional: trainer.prepare's defaults)
    stdout: {"source", "checked": true, "why": null, "problems": [one line each], "counts":
             {"complete", "stopped", "classes", "images": {split: {class: n}}, "split_images":
              {split: n}, "prepared": {split: n} or null, "carved": ["validation"],
              "images_checked", "skipped": metadata.json's source_info.skipped, "skipped_summary"}}

`counts`: null when the folder could not be listed. `prepared`: what the preparation would
write per split, carved ones included (null while the layout has problems). Bounded (MAX_ENTRIES,
SECONDS): a listing stopped early has `complete` false, `stopped` saying where, and the listed
part's counts. Images are checked while time is left. A source that is not a local folder is not
checked (`checked` false, `why` says so). Exit status: 0 answered (whatever the problems), 2 a
bad request.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from typing import Any

from trainer import storage
from trainer.config import SPLITS
from trainer.preparation import carving, folders
from trainer.preparation.prepareconfig import PrepareConfig
from trainer.preparation.source import PrepareError, shown

# The listing's bounds: a million local entries list in about a second; SECONDS caps a slow disk.
MAX_ENTRIES = 2_000_000
SECONDS = 5.0
MAX_PROBLEMS = 50  # returned; the rest are counted in a last line


class RequestError(ValueError):
    """A malformed request on stdin."""


def check(
    source: str,
    validation_fraction: float = PrepareConfig.validation_fraction,
    test_fraction: float = PrepareConfig.test_fraction,
    budget: folders.ListingBudget | None = None,
) -> dict[str, Any]:
    """The answer for `source` (the JSON printed; see the module's docstring)."""
    answer: dict[str, Any] = {"source": source, "checked": False, "why": None, "problems": [], "counts": None}
    kind, _, path = source.partition(":")
    if kind != "folder" or not path.strip():
        return {**answer, "why": "not a folder: source; the preparation job checks it"}
    if storage.is_remote(path):
        return {**answer, "why": f"{path} is in Cloud Storage; the preparation job lists and checks it there"}
    listing = folders.list_folder(path, budget=budget or folders.ListingBudget(MAX_ENTRIES, SECONDS))
    problems = list(listing.problems)
    answer["checked"] = True
    counts: dict[str, Any] = {"complete": listing.complete, "stopped": listing.stopped}
    listed = bool(listing.splits or listing.class_names)
    if listed:
        split_images = {split: len(paths) for split, (paths, _) in listing.splits.items()}
        prepared, carved, train = None, [], split_images.get("train")
        if not problems and listing.complete and train is not None:
            try:
                sizes = carving.carve_sizes(train, split_images, validation_fraction, test_fraction)
            except PrepareError as e:
                problems.append(f"--source {source}: {e}")
            else:
                carved = list(sizes)
                prepared = {split: split_images.get(split, sizes.get(split, 0)) for split in SPLITS}
                prepared["train"] = train - sum(sizes.values())
        counts.update(
            classes=listing.class_names,
            images=listing.class_counts(),
            split_images=split_images,
            prepared=prepared,
            carved=carved,
            images_checked=listing.files_checked,
        )
    if listed or listing.skipped.count or not listing.complete:
        counts.update(skipped=listing.skipped.to_json(), skipped_summary=listing.skipped.summary())
        answer["counts"] = counts
    answer["problems"] = shown(problems, MAX_PROBLEMS)
    return answer


def _fraction(request: Mapping[str, Any], name: str) -> float:
    value = request.get(name)
    if value is None:
        return float(getattr(PrepareConfig, name))
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RequestError(f"{name} must be a number, got {value!r}")
    if not 0 < value < 0.5:
        raise RequestError(f"{name} must be in (0, 0.5), as trainer.prepare's --{name}, got {value}")
    return float(value)


def parse_request(text: str) -> tuple[str, float, float]:
    """(source, validation_fraction, test_fraction) from the JSON request (absent fractions:
    trainer.prepare's defaults); RequestError naming what is wrong."""
    try:
        request = json.loads(text)
    except json.JSONDecodeError as e:
        raise RequestError(f"the request is not JSON ({e})") from None
    if not isinstance(request, dict):
        raise RequestError(f"the request must be a JSON object, got {type(request).__name__}")
    if unknown := sorted(set(request) - {"source", "validation_fraction", "test_fraction"}):
        raise RequestError(f"unknown keys {unknown}; allowed: source, validation_fraction, test_fraction")
    source = request.get("source")
    if not isinstance(source, str) or not source:
        raise RequestError(f"source must be a non-empty string such as folder:PATH, got {source!r}")
    return source, _fraction(request, "validation_fraction"), _fraction(request, "test_fraction")


def main(argv: list[str] | None = None) -> int:
    """Reads the request from stdin, or takes `folder:PATH` as its one argument (by hand)."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        if len(argv) > 1:
            raise RequestError("give one source, folder:PATH, as the argument, or a JSON request on stdin")
        request = parse_request(sys.stdin.read()) if not argv else (argv[0],)
    except RequestError as e:
        sys.stderr.write(f"python -m trainer.preparation.sourcecheck: {e}\n")
        return 2
    json.dump(check(*request), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
