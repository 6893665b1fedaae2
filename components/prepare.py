"""Step 3, dataset preparation: a one-replica CustomJob on a CPU machine running
`python -m trainer.prepare` from the trainer image.

Its flags: `build_prepare_args` (docs/contracts.md#5-the-preparation-job-python--m-trainerprepare);
`--output_dir` keeps its default, `$AIP_MODEL_DIR` (`<base_output_directory>/model`): the
dataset's URI, known when the job is planned.
"""


def prepare_command() -> list:
    """The preparation job's command."""
    return ["python", "-m", "trainer.prepare"]


PREPARE_COMMAND = prepare_command()
# The keys of metadata.json `dataset_record` reads (and each split's `count`), checked as
# evaluation.METRICS_READ is.
METADATA_READ = ("class_names", "image_size", "fingerprint", "splits")


def build_prepare_args(
    source: str,
    image_size: int,
    shards: int = 32,
    seed: int = 42,
    validation_fraction: float = 0.15,
    test_fraction: float = 0.15,
    synthetic_per_class: int = 60,
    champion_class_names: list | None = None,
    engine: str = "job",
) -> list:
    """The `trainer.prepare` flags for the preparation job (the output folder is AIP_MODEL_DIR)."""
    import json

    if not (source.startswith(("tfds:", "folder:")) or source == "synthetic"):
        raise ValueError(f"source must be tfds:NAME, folder:PATH or synthetic, got {source!r}")
    args = [f"--source={source}", f"--image_size={int(image_size)}", f"--shards={int(shards)}"]
    args += [f"--seed={int(seed)}", f"--validation_fraction={validation_fraction}"]
    args.append(f"--test_fraction={test_fraction}")
    if source == "synthetic":
        args.append(f"--synthetic_per_class={int(synthetic_per_class)}")
    if champion_class_names:
        args.append(f"--champion_class_names={json.dumps([str(c) for c in champion_class_names])}")
    if engine != "job":
        args.append(f"--engine={engine}")
    return [*args, "--overwrite"]


def dataset_record(uri: str, folder: str) -> dict:
    """The Dataset artifact's metadata, from the metadata.json in `folder` (`uri` as a path this
    step can read). Fails naming the folder when there is none."""
    import json
    import os

    try:
        with open(os.path.join(folder, "metadata.json")) as f:
            meta = json.load(f)
    except (OSError, ValueError) as err:
        raise RuntimeError(f"the preparation job left no readable dataset in {uri}: {err}") from err
    return {
        "class_names": meta["class_names"],
        "image_size": meta["image_size"],
        "fingerprint": meta["fingerprint"],
        **{f"{name}_examples": split["count"] for name, split in meta["splits"].items()},
    }


def dataflow_template_spec(image_uri: str, parameters: dict) -> dict:
    """The Flex Template spec file of a Beam preparation on Dataflow: a dataflow_v1beta3
    `ContainerSpec` as JSON (what `gcloud dataflow flex-template build` writes), the dataflow
    image being both the launcher and the workers' SDK container, each parameter declared."""
    return {
        "image": image_uri,
        "sdkInfo": {"language": "PYTHON"},
        "metadata": {
            "name": "prepare-dataset",
            "description": "python -m trainer.prepare --engine beam: the dataset's TFRecord shards and metadata.json",
            "parameters": [
                {"name": name, "label": name, "helpText": f"trainer.prepare --{name}", "isOptional": True}
                for name in sorted(parameters)
            ],
        },
    }


def dataflow_parameters(prepare_args: list, output_dir: str) -> dict:
    """The Flex Template's parameters: the preparation's flags as {name: value}, with
    `--output_dir` (Dataflow sets no AIP_MODEL_DIR) and `--engine=beam`; a flag without a value
    (`--overwrite`) becomes "true", which `trainer.prepare` accepts."""
    out = {}
    for arg in [*prepare_args, f"--output_dir={output_dir}", "--engine=beam"]:
        name, sep, value = arg[2:].partition("=")
        out[name] = value if sep else "true"
    return out
