"""The local backend: stand-ins for the Vertex services that take the same specs and are as
strict as Vertex (a custom job as processes, a tuning job of real trials, a model registry in a
folder, the serving check under the serving image's TensorFlow). `local.steps` holds their KFP
components; `pipeline` wires them in for the local target. Never imports `launch` or `pipeline`."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
"""The checkout everything runs from: compiled/, the build context, the local caches."""
