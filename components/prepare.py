"""Step 3, dataset preparation: a one-replica CustomJob on a CPU machine running
`python -m trainer.prepare` from the trainer image.

Command-line contract handed to the trainer image (see `prepare_args`):
    python -m trainer.prepare --source SOURCE --image_size N --shards N --seed N
        [--validation_fraction F --test_fraction F --synthetic_per_class N] --overwrite
`--output_dir` is left to its default, `$AIP_MODEL_DIR`, which Vertex (and the local runner)
sets to `<base_output_directory>/model`. `register_dataset` then turns that folder into the
Dataset artifact the rest of the pipeline consumes, after checking its metadata.json.
"""

from typing import NamedTuple

from kfp import dsl

from components import runtime
from components.runtime import fuse_path

PREPARE_COMMAND = ["python", "-m", "trainer.prepare"]
# The keys of a prepared dataset's metadata.json `register_dataset` reads (and, of each split,
# `count`). trainer/contract.py declares what `trainer.prepare` writes; components cannot import
# it, so tests/test_contracts.py checks this list against it and against the code below.
METADATA_READ = ("class_names", "image_size", "fingerprint", "splits")


@dsl.component(base_image=runtime.BASE_IMAGE, install_kfp_package=False)
def prepare_args(
    source: str,
    image_size: int,
    shards: int = 32,
    seed: int = 42,
    validation_fraction: float = 0.15,
    test_fraction: float = 0.15,
    synthetic_per_class: int = 60,
) -> list:
    """The `trainer.prepare` flags for the preparation job (the output folder is AIP_MODEL_DIR)."""
    if not (source.startswith(("tfds:", "folder:")) or source == "synthetic"):
        raise ValueError(f"source must be tfds:NAME, folder:PATH or synthetic, got {source!r}")
    args = [f"--source={source}", f"--image_size={image_size}", f"--shards={shards}", f"--seed={seed}"]
    args += [f"--validation_fraction={validation_fraction}", f"--test_fraction={test_fraction}"]
    if source == "synthetic":
        args.append(f"--synthetic_per_class={synthetic_per_class}")
    return [*args, "--overwrite"]


@dsl.component(base_image=runtime.BASE_IMAGE, install_kfp_package=False, additional_funcs=[fuse_path])
def register_dataset(base_output_directory: str, dataset: dsl.Output[dsl.Dataset]) -> NamedTuple(
    "Outputs", num_classes=int, train_examples=int
):
    """Makes the preparation job's output (`<base>/model`) the pipeline's Dataset artifact.

    Fails naming the folder when the job left no readable metadata.json there."""
    import collections
    import json
    import os

    uri = base_output_directory.rstrip("/") + "/model"
    meta_path = os.path.join(fuse_path(uri), "metadata.json")
    try:
        with open(meta_path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as err:
        raise RuntimeError(f"the preparation job left no readable dataset in {uri}: {err}") from err
    dataset.uri = uri
    splits = meta["splits"]
    dataset.metadata.update(
        {
            "class_names": meta["class_names"],
            "image_size": meta["image_size"],
            "fingerprint": meta["fingerprint"],
            **{f"{name}_examples": split["count"] for name, split in splits.items()},
        }
    )
    print(f"dataset {uri}: " + ", ".join(f"{n} {s['count']}" for n, s in splits.items()))
    Outputs = collections.namedtuple("Outputs", ["num_classes", "train_examples"])
    return Outputs(len(meta["class_names"]), splits["train"]["count"])
