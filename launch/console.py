"""What `make run` shows on screen by default: the lines a person reads.

Every line of every step goes to the step's log; the screen gets one line per step and under it
only its progress and results (docs/running.md#what-a-local-run-shows). `--verbose` shows every
line as it comes; a failing step's log tail is always shown.
"""

from __future__ import annotations

import re

# A replica's line, as the local job runner prefixes it: "[<job> <replica>] <text>"; the trainer
# prefixes its own lines "[<replica>] ".
_REPLICA = re.compile(r"^\[(?P<job>[\w.-]+) (?P<replica>[a-z]+-\d+)\] (?:\[[a-z]+-\d+\] )?(?P<text>.*)$")
_REPLICA_SHOWN = re.compile(
    r"^(epoch \d+/\d+ done|early stopping: |exporting epoch |published |prepare: |prepared |evaluated )"
)
# The job runner's and the tuner's own lines: "[<job>] ..." and "[tune] ...".
_RUNNER = re.compile(r"^\[(?P<job>[\w.-]+)\] (?P<text>.*)$")
_RUNNER_SHOWN = re.compile(r"(restarting the whole job|^trial \d+ (started|failed|val_|[a-z_]+=))")
# A component's own messages.
_STEP_SHOWN = re.compile(
    r"^(PROMOTE: |HOLD: |registered |serving image |best trial |making the TensorFlow |WARNING: )"
)


def headline(line: str) -> str | None:
    """The line as shown under its step, or None when it only goes to the log. `line` is a
    step's output line with kfp.local's bookkeeping already removed."""
    if match := _REPLICA.match(line):
        if match["replica"] != "chief-0" or not _REPLICA_SHOWN.match(match["text"]):
            return None
        job = match["job"]
        return f"    {job + ': ' if job.startswith('trial-') else ''}{match['text']}"
    if match := _RUNNER.match(line):
        if not _RUNNER_SHOWN.search(match["text"]):
            return None
        return f"    {match['text']}" if match["job"] == "tune" else f"    {match['job']}: {match['text']}"
    text = line.strip()
    return f"    {text}" if _STEP_SHOWN.match(text) else None
