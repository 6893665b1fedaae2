"""`make compile`: writes the two Vertex templates, `compiled/pipeline.json` and
`compiled/pipeline-notify.json` (the same DAG with the failure e-mail exit handler), or both into
the folder given as the first argument. Byte-identical on every run. The pipeline is the
`pipeline/` package beside this script (`import pipeline` finds the package, never this file).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pipeline import COMPILED, COMPILED_NOTIFY, compile_pipeline, cost

if __name__ == "__main__":
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else COMPILED.parent
    for notify, name in ((False, COMPILED.name), (True, COMPILED_NOTIFY.name)):
        print(f"wrote {compile_pipeline(folder / name, notify=notify)}")  # noqa: T201
    # What a run of it waits for on Vertex, one machine start after another (pipeline/cost.py).
    spec = json.loads((folder / COMPILED.name).read_text())
    for scenario, (starts, chain) in cost.report(spec).items():
        print(  # noqa: T201
            f"{scenario} run: {starts} machine starts on the critical path "
            f"(target {cost.BUDGET[scenario]}): {' > '.join(chain)}"
        )
