"""The benchmarks, in the order `make bench` runs them and the table lists them."""

from __future__ import annotations

import importlib
from types import ModuleType

BENCHMARKS: dict[str, str] = {
    "input": "benchmarks.input_pipeline",
    "train": "benchmarks.train",
    "gpu": "benchmarks.gpu",
    "prepare": "benchmarks.prepare",
    "e2e": "benchmarks.e2e",
    "memory": "benchmarks.memory",
    "tuning": "benchmarks.tuning",
    "folder": "benchmarks.folder",
}
TITLES: dict[str, str] = {
    "input": "input pipeline img/s, ours vs codelab",
    "train": "CPU training img/s, ours vs codelab",
    "gpu": "GPU training img/s, ours vs codelab",
    "prepare": "dataset preparation img/s",
    "e2e": "local `make run` wall time, step by step",
    "memory": "input pipeline peak memory, streamed past the cache budget vs cached",
    "tuning": "tuned `make run` vs untuned, accuracy on the same test split",
    "folder": "local `make run` on image folders: the defaults vs 60 epochs, test accuracy",
}


def module(name: str) -> ModuleType:
    if name not in BENCHMARKS:
        raise KeyError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
    return importlib.import_module(BENCHMARKS[name])


def not_implemented() -> dict[str, str]:
    """Benchmarks that exist only as a placeholder, with the reason the table shows."""
    out = {}
    for name in BENCHMARKS:
        mod = module(name)
        if not getattr(mod, "IMPLEMENTED", True):
            out[name] = str(getattr(mod, "NOT_IMPLEMENTED", "not yet implemented"))
    return out
