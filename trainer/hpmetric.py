"""Can this process write the tuning metric file? Found out at start, before TensorFlow loads.

cloudml-hypertune's `HyperTune` rewrites the file named by `CLOUD_ML_HP_METRIC_FILE` at every
report, and the tuning service reads the trial's measurements from it (docs/facts.md, fact 34);
unwritable, it fails only after the first epoch, or the trial ends INFEASIBLE. So the chief checks
at start: in a trial (`CLOUD_ML_TRIAL_ID` set) an unwritable file is fatal (`MetricFileError`);
outside one, a warning, and the metric is not reported. No TensorFlow here.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

METRIC_FILE_ENV = "CLOUD_ML_HP_METRIC_FILE"
TRIAL_ID_ENV = "CLOUD_ML_TRIAL_ID"
# HyperTune's default when the variable is unset (hypertune/hypertune.py, _DEFAULT_METRIC_PATH;
# tests/trainer/test_hpmetric.py holds it to the installed library).
DEFAULT_METRIC_FILE = "/tmp/hypertune/output.metrics"

_warned: set[str] = set()


class MetricFileError(RuntimeError):
    """The tuning metric file cannot be written by this process."""


def reporting_file(environ: Mapping[str, str]) -> str | None:
    """The metric file `HyperTune` chooses, checked writable (its folder created, an existing file
    kept); None when it is not and this is no trial (one warning on stderr per path). In a trial
    an unwritable file raises `MetricFileError` naming the path, this process's uid and the fix."""
    path = environ.get(METRIC_FILE_ENV, DEFAULT_METRIC_FILE)
    try:
        if not os.path.dirname(path):  # HyperTune() would fail making the folder of "" (os.makedirs)
            raise OSError(f"{METRIC_FILE_ENV} names no folder (HyperTune needs one): {path!r}")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a"):
            pass
        return path
    except OSError as e:
        error = MetricFileError(
            f"cannot write the hyperparameter tuning metric file {path!r} as uid {os.geteuid()} "
            f"({e.strerror or e}): run the image as root or make the folder writable in the "
            f"Dockerfile; outside Vertex AI, set {METRIC_FILE_ENV} to a writable path"
        )
    if environ.get(TRIAL_ID_ENV):
        raise error
    if path not in _warned:
        _warned.add(path)
        sys.stderr.write(f"warning: {error}; not a tuning trial, so training goes on unreported\n")
    return None
