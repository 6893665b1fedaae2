"""Opening `--source`: `tfds:NAME` (trainer/preparation/tfdssource.py), `folder:PATH` (trainer/preparation/folders.py)
or `synthetic`, defined here: the synthetic leaf archive (trainer/synthetic.py) prepared offline
through the real TFDS `cassava` builder (trainer/preparation/localarchive.py). Every source imports
TensorFlow lazily: flag errors come back before it loads."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator

from trainer.preparation.folders import open_folder
from trainer.preparation.localarchive import local_archive
from trainer.preparation.prepareconfig import PrepareConfig
from trainer.preparation.progress import Progress
from trainer.preparation.source import Source
from trainer.preparation.tfdssource import (
    download_and_prepare,
    image_classification_keys,
    open_tfds,
    tfds_source,
)


@contextlib.contextmanager
def open_synthetic(config: PrepareConfig, progress: Progress) -> Iterator[Source]:
    """Generates the synthetic archive, then prepares it through the real TFDS cassava builder,
    offline, in a private TFDS data folder (never the user's, where it would pass for cassava)."""
    import tensorflow_datasets as tfds

    from trainer import synthetic

    with tempfile.TemporaryDirectory(prefix="synthetic-cassava-") as tmp:
        counts = synthetic.split_counts(config.synthetic_per_class)
        total = sum(counts.values()) * len(synthetic.CASSAVA_CLASSES)
        with progress.count("synthetic", total, desc="synthetic images") as update:
            archive = synthetic.write_archive(
                os.path.join(tmp, "download"),
                per_class=config.synthetic_per_class,
                image_size=config.synthetic_source_size,
                seed=config.seed,
                progress=update,
            )
        builder = tfds.builder("cassava", data_dir=os.path.join(tmp, "tfds"))
        image_key, label_key = image_classification_keys(builder.info, "cassava")
        with local_archive(builder, archive, scratch_dir=os.path.join(tmp, "tfds-downloads")):
            download_and_prepare(
                builder, progress, download_config=tfds.download.DownloadConfig(try_download_gcs=False)
            )
        source = tfds_source(builder, image_key, label_key)
        source.info.update(
            generator="synthetic", synthetic_per_class=config.synthetic_per_class, seed=config.seed
        )
        yield source


def open_source(config: PrepareConfig, progress: Progress) -> contextlib.AbstractContextManager[Source]:
    kind, _, rest = config.source.partition(":")
    if config.source == "synthetic":
        return open_synthetic(config, progress)
    if kind == "tfds":
        return contextlib.nullcontext(open_tfds(rest, config.tfds_data_dir, progress=progress))
    return contextlib.nullcontext(open_folder(rest, progress))
