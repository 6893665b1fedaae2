"""What one dataset preparation is asked to do: `PrepareConfig`, the values of
`python -m trainer.prepare`'s flags (trainer/prepare.py parses them) and their defaults."""

from __future__ import annotations

import dataclasses

from trainer import storage

# `--engine beam`'s work folder, beside the output: here, so trainer.prepare names it without TensorFlow.
WORK_SUFFIX = ".beam-work"


def work_dir(output_dir: str) -> str:
    return storage.resolve(output_dir).rstrip("/") + WORK_SUFFIX


@dataclasses.dataclass(frozen=True)
class PrepareConfig:
    """The flags' values (their help: `trainer.prepare.build_parser`). Those it does not describe:
    image_size: side of the square uint8 images written.
    encoding: how images are stored (raw pixels, jpeg or png).
    shards: TFRecord files per split (fewer when a split has fewer images).
    seed: decides carving and synthetic images.
    synthetic_per_class: synthetic training images per class (a third for validation, and test).
    synthetic_source_size: side of the synthetic JPEGs, before resizing to image_size.
    beam_args: Beam's own options, as given (e.g. --runner DataflowRunner --project ...).
    """

    source: str
    output_dir: str
    image_size: int = 224
    encoding: str = "raw"
    shards: int = 32
    validation_fraction: float = 0.1
    test_fraction: float = 0.1
    seed: int = 42
    tfds_data_dir: str | None = None
    synthetic_per_class: int = 60
    synthetic_source_size: int = 160
    overwrite: bool = False
    champion_class_names: tuple[str, ...] = ()
    engine: str = "job"
    beam_workers: int = 0
    beam_args: tuple[str, ...] = ()
