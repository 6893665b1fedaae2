"""The TFDS source, `tfds:NAME`: an image-classification dataset through its real TFDS builder
(downloaded and prepared by TFDS unless already in its data folder). TensorFlow Datasets is
imported lazily."""

from __future__ import annotations

from typing import Any

from trainer.config import SPLITS
from trainer.preparation.progress import Progress
from trainer.preparation.source import PrepareError, Source, SourceSplit


def open_tfds(name: str, data_dir: str | None, *, progress: Progress) -> Source:
    import tensorflow_datasets as tfds

    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError:
        raise PrepareError(
            f"unknown TFDS dataset {name!r} in --source tfds:{name}; use an image-classification "
            "dataset from the TFDS catalogue (e.g. cassava, tf_flowers, beans)"
        ) from None
    image_key, label_key = image_classification_keys(builder.info, name)
    download_and_prepare(builder, progress)
    return tfds_source(builder, image_key, label_key)


def download_and_prepare(builder: Any, progress: Progress, **kwargs: Any) -> None:
    """`builder.download_and_prepare(**kwargs)` between two lines, with TFDS's progress bars
    switched off unless `progress` shows bars."""
    import tensorflow_datasets as tfds

    if not progress.bars:
        tfds.disable_progress_bar()
    started = progress.clock()
    quiet = "" if progress.bars else " (TFDS progress bars off: output is not a terminal)"
    progress.say(
        f"TFDS {builder.name} {builder.version}: download_and_prepare into {builder.data_dir}{quiet}"
    )
    builder.download_and_prepare(**kwargs)
    counts = ", ".join(f"{split} {info.num_examples}" for split, info in builder.info.splits.items())
    progress.say(f"TFDS {builder.name} ready in {progress.clock() - started:.1f}s: {counts}")


def image_classification_keys(info: Any, name: str) -> tuple[str, str]:
    import tensorflow_datasets as tfds

    features = info.features
    image_key, label_key = (info.supervised_keys or ("image", "label"))[:2]
    kinds = ((image_key, tfds.features.Image), (label_key, tfds.features.ClassLabel))
    if not all(isinstance(k, str) and k in features and isinstance(features[k], t) for k, t in kinds):
        raise PrepareError(
            f"TFDS dataset {name!r} is not an image-classification dataset (it needs an Image "
            "feature and a ClassLabel feature as its supervised keys)"
        )
    if (channels := features[image_key].shape[-1]) not in (1, 2, 3, 4):  # trainer.images.rgb: RGB
        raise PrepareError(
            f"TFDS dataset {name!r} has images of {channels} channels; allowed: 1 to 4 (grey, grey "
            "and alpha, RGB, RGBA)"
        )
    return image_key, label_key


def tfds_source(builder: Any, image_key: str, label_key: str) -> Source:
    splits: dict[str, SourceSplit] = {}
    for split in [s for s in SPLITS if s in builder.info.splits]:

        def dataset(split: str = split) -> Any:
            ds = builder.as_dataset(split=split, shuffle_files=False)
            return ds.map(lambda ex: (ex[image_key], ex[label_key]))

        spec = {
            "kind": "tfds",
            # <data_dir>/<name>[/<config>]/<version>: `tfds.builder_from_directory` reopens it anywhere.
            "dir": str(builder.data_dir),
            "split": split,
            "image_key": image_key,
            "label_key": label_key,
        }
        splits[split] = SourceSplit(count=builder.info.splits[split].num_examples, dataset=dataset, spec=spec)
    if "train" not in splits:
        raise PrepareError(
            f"TFDS dataset {builder.name!r} has no train split (it has {list(builder.info.splits)})"
        )
    return Source(
        class_names=list(builder.info.features[label_key].names),
        splits=splits,
        info={"tfds_name": builder.name, "tfds_version": str(builder.info.version)},
    )
