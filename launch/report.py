"""report.html for a run, local (launch.cli) or on Vertex (launch.vertexrun): the step
timeline, training curves, confusion matrix and tuning trials as pictures, with the run's steps
and metrics as tables. Pictures are PNGs embedded in the page (one file to open or attach), drawn
on matplotlib `Figure`s, which save through the Agg backend: no pyplot, no display needed."""

from __future__ import annotations

import base64
import contextlib
import io
import itertools
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

# The keys of the trainer's metrics.json `write_report` reads (tests/test_contracts.py pins them).
METRICS_READ = (
    "test_accuracy",
    "macro_f1",
    "test_loss",
    "val_accuracy",
    "val_loss",
    "images_per_second",
    "history",
    "confusion_matrix",
    "per_class",
    "best_epoch",
    "stopped_early",
)

# The keys of the trainer's metrics.json both targets' summary.json shows under `metrics`.
SUMMARY_METRICS = (
    "test_accuracy",
    "macro_f1",
    "per_class",
    "test_loss",
    "val_accuracy",
    "val_loss",
    "images_per_second",
    "epochs_completed",
    "best_epoch",
    "export_epoch",
    "stopped_early",
    "num_workers",
)


def write_json(path: Path, value: Any) -> None:
    """Written whole or not at all: a reader never sees half a summary."""
    partial = path.with_name(f".{path.name}.partial")
    try:
        partial.write_text(json.dumps(value, indent=1, default=str))
        os.replace(partial, path)
    except OSError:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise


def draw_report(
    run_dir: Path,
    summary: dict[str, Any],
    metrics: Mapping[str, Any] | None,
    trials: Sequence[Mapping[str, Any]] | None,
    guard: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
) -> None:
    """report.html, once summary.json is written; a report not drawn (error, interrupt) is
    `report_error` there, never raised. `guard()`: held around that rewrite of summary.json."""
    try:
        write_report(run_dir / "report.html", summary, metrics, trials)
    except (Exception, KeyboardInterrupt) as err:  # noqa: BLE001 (recorded in summary.json)
        with guard():
            summary["report_error"] = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
            summary["report"] = None
            write_json(run_dir / "summary.json", summary)


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def curves_png(history: Mapping[str, Sequence[float]], exported_epoch: int | None = None) -> str:
    """Loss and accuracy per epoch, training and validation; a line at the exported epoch (1-based)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.6))
    axes = fig.subplots(1, 2)
    for ax, metric in zip(axes, ("loss", "accuracy"), strict=True):
        for key, style in ((metric, "-o"), (f"val_{metric}", "--s")):
            if values := history.get(key):
                ax.plot(range(1, len(values) + 1), values, style, label=key)
        if exported_epoch:
            ax.axvline(
                exported_epoch, color="tab:green", alpha=0.6, label=f"exported (epoch {exported_epoch})"
            )
        ax.set(xlabel="epoch", title=metric)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    return _png(fig)


# The most classes the confusion matrix is drawn for (its cost grows with their square, and past a
# few dozen its labels cannot be read); above it, the largest confusions.
MAX_DRAWN_CLASSES = 40
TOP_CONFUSIONS = 25


def confusion_png(labels: Sequence[str], matrix: Sequence[Sequence[int]]) -> str:
    """The annotated matrix, for at most MAX_DRAWN_CLASSES classes; names as plain text (`a$^$b`)."""
    from matplotlib.figure import Figure

    if len(labels) > MAX_DRAWN_CLASSES:
        raise ValueError(f"{len(labels)} classes: the picture is drawn for at most {MAX_DRAWN_CLASSES}")
    side = max(4.2, 0.32 * len(labels) + 1.5)
    fig = Figure(figsize=(side + 0.6, side))
    ax = fig.subplots()
    ax.imshow(matrix, cmap="Blues")
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right", parse_math=False)
    ax.set_yticks(range(len(labels)), labels, parse_math=False)
    ax.set(xlabel="predicted", ylabel="true", title="test confusion matrix")
    peak = max((max(row) for row in matrix), default=0)
    for i, row in enumerate(matrix):
        for j, count in enumerate(row):
            ax.text(
                j, i, str(count), ha="center", va="center", color="white" if count > peak / 2 else "black"
            )
    return _png(fig)


def _final(trial: Mapping[str, Any], default: Any) -> Any:
    """A trial's final measurement (its first metric's value), else `default`."""
    return (trial.get("finalMeasurement", {}).get("metrics") or [{"value": default}])[0]["value"]


def trials_png(trials: Sequence[Mapping[str, Any]], metric_id: str) -> str:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.2))
    ax = fig.subplots()
    ax.bar(
        [t["id"] for t in trials],
        [_final(t, 0.0) for t in trials],
        color=["tab:green" if t["state"] == "SUCCEEDED" else "tab:red" for t in trials],
    )
    ax.set(xlabel="trial (red: failed)", ylabel=metric_id, title="tuning trials")
    return _png(fig)


# A bar's colour by its state: kfp.local's, Vertex tasks', trials' and jobs' (after JOB_STATE_).
STATE_COLOURS = {
    **dict.fromkeys(("SUCCESS", "SUCCEEDED"), "tab:green"),
    **dict.fromkeys(("FAILURE", "FAILED"), "tab:red"),
    **dict.fromkeys(("RUNNING", "PENDING", "QUEUED"), "tab:blue"),
    **dict.fromkeys(("CANCELLED", "CANCELLING"), "tab:gray"),
    "SKIPPED": "tab:olive",
}


def timeline_rows(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The step timeline's bars, top to bottom, in seconds from the run's start; `queued`: create
    -> start (None when not known); `level` 0 a step, 1 its job, 2 a tuning trial. A Vertex run's
    entries carry their offsets (groups left out); a local run's steps are laid end to end."""
    steps = summary.get("steps") or []
    if not any("offset_seconds" in s for s in steps):
        starts = itertools.accumulate((float(s.get("seconds") or 0.0) for s in steps), initial=0.0)
        steps = [{**s, "offset_seconds": at} for s, at in zip(steps, starts, strict=False)]

    def row(label: str, level: int, entry: Mapping[str, Any]) -> dict[str, Any] | None:
        if entry.get("offset_seconds") is None:
            return None
        status = str(entry.get("status") or entry.get("state") or "").removeprefix("JOB_STATE_")
        return {
            "label": label,
            "level": level,
            "start": float(entry["offset_seconds"]),
            "queued": entry.get("queued_seconds"),
            # A step with an offset and its seconds alone (no start time) runs all its length.
            "run": float((entry["run_seconds"] if "run_seconds" in entry else entry.get("seconds")) or 0.0),
            "status": status,
            "running": bool(entry.get("started")) and not entry.get("ended"),
        }

    rows: list[dict[str, Any] | None] = []
    for s in steps:
        if s.get("group") or (r := row(s["name"], 0, s)) is None:
            continue
        rows.append(r)
        for job in [j for j in summary.get("jobs") or [] if j.get("task_id") == s.get("task_id")]:
            rows.append(row(f"\u21b3 {job['type']} {str(job['name']).rsplit('/', 1)[-1]}", 1, job))
            rows += [row(f"\u21b3 trial {trial['id']}", 2, trial) for trial in job.get("trials") or []]
    return [r for r in rows if r is not None]


def timeline_png(rows: Sequence[Mapping[str, Any]]) -> str:
    """One bar per row, as TIMELINE_VERTEX says; labels drawn as plain text (`parse_math=False`)."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    fig = Figure(figsize=(10, 0.3 * len(rows) + 1.4))
    ax = fig.subplots()
    for i, r in enumerate(rows):
        colour = STATE_COLOURS.get(str(r["status"]), "tab:purple")
        queued = float(r["queued"] or 0.0)
        if queued > 0:
            ax.barh(i, queued, left=r["start"], color=colour, alpha=0.3, edgecolor=colour, linewidth=0.5)
        ax.barh(
            i,
            max(float(r["run"]), 0.0),
            left=r["start"] + queued,
            color=colour,
            hatch="//" if r["running"] else None,
            edgecolor="white" if r["running"] else colour,
            linewidth=0.5,
        )
    ax.set_yticks(range(len(rows)), [str(r["label"]) for r in rows], parse_math=False)
    for label, r in zip(ax.get_yticklabels(), rows, strict=True):
        if r.get("level"):  # a job under its step, a trial under its job
            label.set(color="dimgray", fontsize="small")
    ax.set(ylim=(len(rows) - 0.5, -0.5), xlim=(0, None), xlabel="seconds since the run began")
    ax.set_title("step timeline")
    ax.grid(axis="x", alpha=0.3)
    seen = {str(r["status"]) for r in rows}
    handles = [Patch(color=c, label=s) for s, c in STATE_COLOURS.items() if s in seen]
    if any(r["queued"] for r in rows):
        handles += [
            Patch(facecolor="tab:gray", alpha=0.3, label="created, not started (queue, start-up)"),
            Patch(facecolor="tab:gray", label="started, to its end"),
        ]
    if any(r["running"] for r in rows):
        handles.append(Patch(facecolor="tab:blue", hatch="//", edgecolor="white", label="still running"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    return _png(fig)


TIMELINE_LOCAL = (
    "Each step from its start to its end. kfp.local runs one step at a time and summary.json records "
    "each step's seconds, so the steps are laid end to end in the order they ran."
)
TIMELINE_VERTEX = (
    "Each step from its creation to its end: the light part is the wait before Vertex started it "
    "(create to start: scheduling, start-up), the full part its run (start to end); hatched: still "
    "running. Under a step, the jobs it launched (create to start: the job queued and its machines "
    "provisioned until it first ran) and a tuning job's trials (start to end)."
)


def _times(entry: Mapping[str, Any]) -> tuple[str, ...]:
    """An entry's (waited, ran) seconds, "" when not known."""
    return tuple("" if entry.get(k) is None else f"{entry[k]:.1f}" for k in ("queued_seconds", "run_seconds"))


def top_confusions(
    labels: Sequence[str], matrix: Sequence[Sequence[int]], n: int = TOP_CONFUSIONS
) -> list[tuple[str, str, int]]:
    """The `n` largest off-diagonal cells, largest first: (true class, predicted class, count)."""
    cells = [
        (count, i, j) for i, row in enumerate(matrix) for j, count in enumerate(row) if i != j and count > 0
    ]
    cells.sort(key=lambda c: (-c[0], c[1], c[2]))
    return [(labels[i], labels[j], count) for count, i, j in cells[:n]]


def comparison_blocks(comparison: Mapping[str, Any], rule: str) -> list[Block]:
    """The paired comparison on the same test images (evaluation.json's `comparison`): each
    metric's difference with its 95% bootstrap interval, and the exact McNemar test."""
    rows = []
    for name in ("accuracy", "macro_f1"):
        figure = comparison.get(name)
        if isinstance(figure, Mapping):
            low, high = figure["ci95"]
            scores = [f"{figure[model]:.4f}" for model in ("challenger", "champion")]
            rows.append((name, *scores, f"{figure['difference']:+.4f}", f"{low:+.4f} to {high:+.4f}"))
    mcnemar = comparison.get("mcnemar") or {}
    note = (
        f"On {comparison.get('examples')} test images, gate_rule={rule}. Exact McNemar test: "
        f"{mcnemar.get('b')} images only this model got right, {mcnemar.get('c')} only the champion, "
        f"p={mcnemar.get('p_value', float('nan')):.3g} (below 0.05: the accuracies differ beyond chance). "
        "An interval that contains 0 means the test split cannot tell the two models apart."
    )
    header = ("metric", "this model", "champion", "difference", "95% interval (paired bootstrap)")
    return [{"h3": "Paired comparison"}, _table(rows, header), {"p": note}]


# The page's content is data: sections of blocks, each one of {"p": text}, {"h3": text},
# {"link": url, "text": ..., "after": ...}, {"table": {"header": [...], "rows": [[...]]}} or
# {"img": base64 PNG, "alt": ...}. report.html (beside this file) is the markup: restyle it there.
Block = dict[str, Any]
TEMPLATE = Path(__file__).with_name("report.html")


def _table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> Block:
    return {"table": {"header": list(header), "rows": [list(row) for row in rows]}}


def write_report(
    path: Path,
    summary: Mapping[str, Any],
    metrics: Mapping[str, Any] | None,
    trials: Sequence[Mapping[str, Any]] | None,
) -> Path:
    """Writes the page; returns its path. `metrics` (metrics.json) and `trials` may be None."""
    import jinja2

    intro: list[Block] = [
        {"p": f"Run {summary['run_id']}, target {summary['target']}, {summary['wall_seconds']:.1f} s."}
    ]
    if summary.get("error"):
        intro.append({"p": str(summary["error"])})
    if summary.get("console"):  # a Vertex run (launch.vertexrun); one still running: as of when
        running = f" Read at {summary['as_of']}." if not summary.get("ended") else ""
        intro.append(
            {"link": str(summary["console"]), "text": "The run in the Cloud console", "after": running}
        )
    sections: list[tuple[str, list[Block]]] = [("Steps", [_steps_table(summary["steps"])])]
    bars = timeline_rows(summary)
    if len(bars) >= 2:  # one bar is the run's own length
        caption = TIMELINE_VERTEX if summary.get("target") == "vertex" else TIMELINE_LOCAL
        sections.append(("Timeline", [{"p": caption}, {"img": timeline_png(bars), "alt": "step timeline"}]))
    if summary.get("jobs"):
        jobs = [
            (j["task"], j["type"], j["name"], j["state"], *_times(j), j.get("error", ""))
            for j in summary["jobs"]
        ]
        sections.append(
            ("Jobs", [_table(jobs, ("step", "type", "job", "state", "queued (s)", "ran (s)", "error"))])
        )
    if summary.get("model"):
        m = summary["model"]
        row = (m["name"], m["version"], m["path"], "unknown" if m["champion"] is None else m["champion"])
        sections.append(("Model", [_table([row], ("model", "version", "path", "champion"))]))
    if summary.get("gate"):
        sections.append(("Gate (both models on this run's test split)", _gate_blocks(summary["gate"])))
    if metrics:
        sections += _metrics_sections(metrics)
    if trials:
        image = trials_png(trials, summary.get("tuning", {}).get("metric_id", "val_accuracy"))
        hps = [", ".join(f"{p['parameterId']}={p['value']}" for p in t.get("parameters", [])) for t in trials]
        trial_rows = [(t["id"], t["state"], hp, _final(t, "")) for t, hp in zip(trials, hps, strict=True)]
        table = _table(trial_rows, ("trial", "state", "parameters", "final measurement"))
        sections.append(("Tuning", [{"img": image, "alt": "tuning trials"}, table]))
    template = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined).from_string(
        TEMPLATE.read_text()
    )
    page = template.render(
        run_id=summary["run_id"],
        title=f"{summary['pipeline']}: {summary['status']}",
        intro=intro,
        sections=sections,
    )
    path.write_text(page)
    return path


def _steps_table(steps: Sequence[Mapping[str, Any]]) -> Block:
    if not any("queued_seconds" in s for s in steps):  # a local run
        return _table(
            [(s["name"], s["status"], f"{s['seconds']:.1f}") for s in steps], ("step", "status", "seconds")
        )
    rows = [
        (
            s["name"] + (" (group)" if s.get("group") else ""),
            s["status"],
            s.get("created") or "",
            *_times(s),
            s.get("error", ""),
        )
        for s in steps
    ]
    return _table(rows, ("step", "status", "created", "waited (s)", "ran (s)", "error"))


def _gate_blocks(gate: Mapping[str, Any]) -> list[Block]:
    champion, score = gate.get("champion_score"), gate.get("score")
    row = (
        gate["metric"],
        "" if score is None else f"{score:.4f}",
        "" if champion is None else "none" if champion < 0 else f"{champion:.4f}",
        "promote" if gate["promote"] else "hold",
        gate["reason"],
    )
    blocks = [_table([row], ("metric", "this model", "champion", "decision", "reason"))]
    if gate.get("description"):
        blocks.append({"p": str(gate["description"])})
    if gate.get("comparison"):
        blocks += comparison_blocks(gate["comparison"], gate.get("rule", "not_worse"))
    return blocks


def _metrics_sections(metrics: Mapping[str, Any]) -> list[tuple[str, list[Block]]]:
    """The trainer's metrics.json: its figures, per class, the curves and the confusion matrix."""
    rows = [(k, metrics[k]) for k in METRICS_READ if k in metrics and not isinstance(metrics[k], Mapping)]
    sections = [("Metrics", [_table(rows, ("metric", "value"))])]
    if per_class := metrics.get("per_class"):
        class_rows = [
            (name, f"{c['precision']:.3f}", f"{c['recall']:.3f}", f"{c['f1']:.3f}", c["support"])
            for name, c in per_class.items()
        ]
        header = ("class", "precision", "recall", "F1", "support")
        sections.append(("Per class (test split)", [_table(class_rows, header)]))
    if history := metrics.get("history"):
        image = curves_png(history, metrics.get("best_epoch"))
        sections.append(("Training curves", [{"img": image, "alt": "training curves"}]))
    cm = metrics.get("confusion_matrix")
    if cm and len(cm["labels"]) <= MAX_DRAWN_CLASSES:
        image = confusion_png(cm["labels"], cm["matrix"])
        sections.append(("Confusion matrix", [{"img": image, "alt": "confusion matrix"}]))
    elif cm:
        note = (
            f"{len(cm['labels'])} classes: the picture is drawn for at most {MAX_DRAWN_CLASSES}. "
            f"The {TOP_CONFUSIONS} largest confusions are below; the whole matrix is "
            "confusion_matrix in the model's metrics.json."
        )
        top = _table(top_confusions(cm["labels"], cm["matrix"]), ("true", "predicted", "images"))
        sections.append(("Confusion matrix", [{"p": note}, top]))
    return sections
