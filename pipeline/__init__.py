"""The pipeline: its parameters, their rules, the per-target table and the DAG.

Its modules: docs/architecture.md#layout. `import pipeline` is this package (a package wins over
the top-level `pipeline.py` beside it, which is only the `make compile` script); what callers use
is re-exported here.
"""

from pipeline.backends import BACKENDS, Backend
from pipeline.dag import (
    COMPILED,
    COMPILED_NOTIFY,
    PIPELINE_NAME,
    ROOT,
    compile_pipeline,
    create_pipeline,
    template_for,
)
from pipeline.options import PARAMETERS, parameters_for
from pipeline.step import NEVER_CACHED

__all__ = [
    "BACKENDS",
    "COMPILED",
    "COMPILED_NOTIFY",
    "NEVER_CACHED",
    "PARAMETERS",
    "PIPELINE_NAME",
    "ROOT",
    "Backend",
    "compile_pipeline",
    "create_pipeline",
    "parameters_for",
    "template_for",
]
