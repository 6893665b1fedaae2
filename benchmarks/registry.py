"""The benchmarks, in the order `make bench` runs them and the table lists them."""

from __future__ import annotations

import importlib
from types import ModuleType

BENCHMARKS: dict[str, tuple[str, str]] = {  # name: (module, the table's title)
    "input": ("benchmarks.input_pipeline", "input pipeline img/s, ours vs codelab"),
    "train": ("benchmarks.train", "CPU training img/s, ours vs codelab"),
    "gpu": ("benchmarks.gpu", "GPU training img/s, ours vs codelab"),
    "prepare": ("benchmarks.prepare", "dataset preparation img/s"),
    "e2e": ("benchmarks.e2e", "local `make run` wall time, step by step"),
    "memory": ("benchmarks.memory", "input pipeline peak memory, streamed past the cache budget vs cached"),
    "tuning": ("benchmarks.tuning", "tuned `make run` vs untuned, accuracy on the same test split"),
    "folder": (
        "benchmarks.folder",
        "local `make run` on image folders: the defaults vs 60 epochs, test accuracy",
    ),
}
TITLES = {name: title for name, (_, title) in BENCHMARKS.items()}


def module(name: str) -> ModuleType:
    return importlib.import_module(BENCHMARKS[name][0])
