"""What one dataset preparation is asked to do: `PrepareConfig`, the values of
`python -m trainer.prepare`'s flags (trainer/prepare.py parses them) and their defaults."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class PrepareConfig:
    """Attributes:
    source: "tfds:NAME", "folder:PATH" or "synthetic".
    output_dir: where the prepared dataset is published.
    image_size: side of the square uint8 images written.
    encoding: how images are stored (raw pixels, jpeg or png).
    shards: TFRecord files per split (fewer when a split has fewer images).
    validation_fraction, test_fraction: of train, carved when the source lacks the split.
    seed: decides carving and synthetic images.
    tfds_data_dir: TFDS's own data folder (download cache and prepared TFDS records).
    synthetic_per_class: synthetic training images per class (a third of that for
      validation and for test).
    synthetic_source_size: side of the synthetic JPEGs, before resizing to image_size.
    overwrite: replace an existing prepared dataset in output_dir.
    champion_class_names: the registered champion's class names, in order (empty: none): a
      source with other classes, or the same in another order, is refused as soon as it is
      listed, before any conversion (a model trained on it could not be compared with the
      champion, nor replace it).
    engine: "job" (this process converts every image) or "beam" (an Apache Beam pipeline,
      trainer/beamprep.py); both write the same bytes.
    beam_workers: the DirectRunner's worker processes (0: one per CPU).
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
