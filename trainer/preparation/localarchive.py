"""A TFDS builder prepared from a local tree instead of its download (`local_archive`): how the
synthetic source goes through the real TFDS `cassava` builder offline. TensorFlow Datasets is
imported lazily."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest import mock

from trainer.adapters import (
    TFDS_CHECKED_VERSION,
    TFDS_DOWNLOAD_MANAGER_HOOK,
    check_tfds_download_manager_hook,
)
from trainer.preparation.source import PrepareError


@contextlib.contextmanager
def local_archive(builder: Any, archive: str, scratch_dir: str) -> Iterator[None]:
    """Inside the block, `builder.download_and_prepare(...)` takes every URL passed to
    `download_and_extract` from the local tree `archive`, and fails rather than download anything
    else; `scratch_dir` holds the download manager's (empty) folders. RuntimeError if TFDS made no
    download manager, so a TFDS that stopped calling the hook never passes off a real download."""
    import tensorflow_datasets as tfds

    check_tfds_download_manager_hook()

    class LocalArchiveDownloadManager(tfds.download.DownloadManager):
        """Its methods that would reach the network raise PrepareError."""

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.archive = tfds.core.Path(archive)
            self.served: list[str] = []

        def _serve(self, url: Any) -> Any:
            self.served.append(str(getattr(url, "url", url)))  # a str or a tfds.download.Resource
            return self.archive

        def download_and_extract(self, url_or_urls: Any) -> Any:  # a URL, or a list, tuple or dict of them
            return tfds.core.utils.map_nested(self._serve, url_or_urls, map_tuple=True)

        def _offline(self, what: Any) -> PrepareError:
            return PrepareError(
                f"offline preparation from {self.archive}: the builder asked to download {what!r}, "
                "but only download_and_extract is served from the local tree"
            )

        def download(self, url_or_urls: Any) -> Any:
            raise self._offline(url_or_urls)

        def download_kaggle_data(self, competition_or_dataset: str) -> Any:
            raise self._offline(competition_or_dataset)

    def make_download_manager(download_dir: Any = None, download_config: Any = None) -> Any:
        return LocalArchiveDownloadManager(
            download_dir=download_dir or scratch_dir, dataset_name=builder.name
        )

    with mock.patch.object(builder, TFDS_DOWNLOAD_MANAGER_HOOK, side_effect=make_download_manager) as hook:
        yield
    if not hook.called:
        raise RuntimeError(
            f"TFDS {builder.name} was not prepared through {TFDS_DOWNLOAD_MANAGER_HOOK} (checked "
            f"against TFDS {TFDS_CHECKED_VERSION}): it did not read the local archive {archive}"
        )
