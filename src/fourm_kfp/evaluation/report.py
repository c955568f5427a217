"""The evaluation report: tables (model / tokenizer ceiling / trivial baseline per task, the difference to the
baseline with its bootstrap interval, and the scores against training steps when there is a curve), example grids;
and the model gate's page.

Markdown for the KFP UI's Markdown viewer and MLflow, a self-contained HTML page (grids embedded) for the KFP UI's
HTML viewer, and one PNG grid per task (rows: val scenes; columns: input, generated, ceiling, ground truth). The
evaluation report is a function of ``evaluation.json`` alone (fixed number formats, the report's own order), so it
is reproducible byte for byte; the gate's decision, which depends on the registry, has its own page
(:func:`gate_markdown`, ``reports/model_gate.md``).
"""

from __future__ import annotations

import base64
import html
import io
from typing import Any, Mapping, Sequence

import numpy as np
from PIL import Image, ImageDraw

from fourm_kfp.data.modality_visuals import get_font, visualize
from fourm_kfp.evaluation.paired_bootstrap import BOOTSTRAP_RESAMPLES, CONFIDENCE

TILE = 96
HEADER = 22


def _fmt(value: float | None) -> str:
    if value is None or not np.isfinite(value):
        return "–"
    return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"


def _signed(value: float | None) -> str:
    """A difference, with its sign (3 decimals; tiny values in scientific notation so they do not read as 0)."""
    if value is None or not np.isfinite(value):
        return "–"
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:+.1f}"
    return f"{value:+.3f}" if abs(value) >= 0.001 else f"{value:+.1e}"


def _gain(value: float) -> str:
    if np.isnan(value):
        return "–"
    return f"{value:+.0%}" if np.isfinite(value) else "∞ (baseline 0)"


def task_grid(examples: Sequence[Mapping[str, tuple[str, Any]]], tile: int = TILE) -> bytes:
    """PNG: one row per example, one column per entry (titled), each value drawn by the modality visualiser."""
    if not examples:
        return b""
    titles = list(examples[0])
    canvas = Image.new("RGB", (tile * len(titles), HEADER + tile * len(examples)), "white")
    draw = ImageDraw.Draw(canvas)
    font = get_font(12)
    for c, title in enumerate(titles):
        draw.text((c * tile + 4, 4), title, fill="black", font=font)
    for r, example in enumerate(examples):
        context = {modality: value for modality, value in example.values()}
        for c, title in enumerate(titles):
            modality, value = example[title]
            canvas.paste(Image.fromarray(visualize(modality, value, tile, context)), (c * tile, HEADER + r * tile))
    buffer = io.BytesIO()
    canvas.save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def _task_rows(results: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """Per task: its primary metric (↑/↓) for the model, the ceiling and the baseline, the difference to the
    baseline with its interval, the relative gain, and whether it beats the baseline."""
    rows = []
    for r in results:
        name = r["primary"]
        rows.append([r["task"], f"{name} {'↑' if r['higher_is_better'] else '↓'}", _fmt(r["model"][name]),
                     _fmt(r["ceiling"].get(name)), _fmt(r["baseline"].get(name)),
                     f"{_signed(r['difference'])} [{_signed(r['interval_low'])}, {_signed(r['interval_high'])}]",
                     _gain(r["gain_over_baseline"]), "yes" if r["beats_baseline"] else "no"])
    return rows


def _metric_rows(results: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """Every metric of every task (the primary first) for the model, the ceiling and the baseline."""
    rows = []
    for r in results:
        names = [r["primary"]] + [n for n in r["model"] if n != r["primary"]]
        for i, name in enumerate(names):
            rows.append([r["task"] if i == 0 else "", name, _fmt(r["model"][name]), _fmt(r["ceiling"].get(name)),
                         _fmt(r["baseline"].get(name))])
    return rows


TASK_HEAD = ["task", "primary metric", "model", "tokenizer ceiling", "trivial baseline",
             f"difference [{CONFIDENCE:.0%} interval]", "relative gain", "beats baseline"]
METRIC_HEAD = ["task", "metric", "model", "tokenizer ceiling", "trivial baseline"]


def _explanation(report: Mapping[str, Any]) -> str:
    return (f"The model beats the trivial baseline on {report['tasks_beating_baseline']} of {len(report['tasks'])} "
            f"tasks: a task counts when the {CONFIDENCE:.0%} interval of the difference in its primary metric "
            f"(paired bootstrap over the val scenes, {BOOTSTRAP_RESAMPLES} resamples) lies above zero. The "
            "difference is model − baseline, signed so that positive is better (baseline − model for ↓ metrics); "
            "the relative gain is the difference over |baseline|.")


def _markdown_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]


def report_markdown(report: Mapping[str, Any]) -> str:
    lines = ["# Evaluation", "",
             f"Model `{report['model_uri']}` (step {report['step']}), {report['num_samples']} val scenes, "
             f"caption-to-rgb's image sampled with {report['sampling']}"
             + (f"; maps read off an image (rgb-to-depth/normal/semseg) in {report['map_steps']} step(s)"
                if "map_steps" in report else "")
             + (f"; text with {report['text_sampling']}" if "text_sampling" in report else "") + ".", "",
             "## Masked modeling (val split, training budgets and seed)", "",
             "| modality | loss | token accuracy |", "|---|---|---|"]
    for name, values in report["masked"].items():
        lines.append(f"| {name} | {_fmt(values['loss'])} | {_fmt(values['accuracy'])} |")
    lines += ["", "## Cross-modal tasks", "", _explanation(report), ""]
    if report.get("labelled_by"):
        lines += [_labelled_explanation(report["labelled_by"]), ""]
    lines += _markdown_table(TASK_HEAD, _task_rows(report["tasks"]))
    if report.get("tasks_skipped"):
        lines += ["", f"Skipped: {'; '.join(report['tasks_skipped'])}."]
    lines += ["", "### All metrics", ""] + _markdown_table(METRIC_HEAD, _metric_rows(report["tasks"]))
    lines += ["", "Grids: `reports/grid_<task>.png` (input / generated / ceiling = the ground truth's tokens decoded "
              "/ ground truth)."]
    if report.get("decode_budget"):
        parts = [f"{m}: {b['images']} images x {b['passes_per_image']} pass{'es' * (b['passes_per_image'] != 1)} "
                 f"of its {b['decoder']} decoder" for m, b in report["decode_budget"].items()]
        total = sum(b["decoder_passes"] for b in report["decode_budget"].values())
        lines += ["", f"Decode budget: {'; '.join(parts)} ({total} decoder passes in all)."]
    if report.get("curve"):
        lines += ["", "## Scores against training steps", "", _curve_explanation(report["curve"]), ""]
        lines += _markdown_table(*_curve_table(report["curve"]))
    return "\n".join(lines) + "\n"


def _labelled_explanation(labelled_by: Mapping[str, str]) -> str:
    """Where the ground truth of a labelled modality comes from: a task targeting it scores agreement with a
    teacher, not accuracy."""
    sources = "; ".join(f"{modality}: {labeler}" for modality, labeler in sorted(labelled_by.items()))
    return ("**The ground truth of these modalities is a labeler's output, not a measurement** (the label stage): "
            f"{sources}. A task targeting one of them scores how well the model reproduces that labeler.")


def _curve_explanation(curve: Mapping[str, Any]) -> str:
    return (f"Every weight snapshot of the model and the final model, on the first {curve['scenes']} val scenes "
            "with the same tasks, sampling and seed (figure: `reports/scores_vs_steps.png`).")


def _curve_table(curve: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Head and rows: one row per step (each task's primary metric), then the trivial baseline."""
    tasks = curve["tasks"]
    head = ["step"] + [f"{t} {v['primary']} {'↑' if v['higher_is_better'] else '↓'}" for t, v in tasks.items()]
    rows = [[str(step)] + [_fmt(v["model"][i]) for v in tasks.values()] for i, step in enumerate(curve["steps"])]
    return head, rows + [["trivial baseline"] + [_fmt(v["baseline"]) for v in tasks.values()]]


def gate_markdown(gate: Mapping[str, Any] | None, skipped: str = "") -> str:
    """``reports/model_gate.md``: the gate's decision (``gate.json``), or why it did not run."""
    lines = ["# Model gate", ""]
    if not gate:
        return "\n".join(lines + [skipped or "The gate did not run."]) + "\n"
    lines.append(f"Registered `{gate['model_name']}` version {gate['version']} (alias `candidate`): "
                 f"**{'promoted to champion' if gate['promoted'] else 'not promoted'}** — {gate['reason']}.")
    if gate.get("champion_version") is not None:
        interval = (f" [{_signed(gate['interval_low'])}, {_signed(gate['interval_high'])}]"
                    if gate.get("interval_low") is not None else "")
        champion = f"v{gate['champion_version']}: {_fmt(gate['champion_value'])}"
        lines += ["", *_markdown_table(
            ["metric", "candidate", "champion", f"improvement{' [95% interval]' if interval else ''}",
             "must exceed", "comparison"],
            [[gate["primary_metric"], _fmt(gate["value"]), champion, _signed(gate.get("difference")) + interval,
              _fmt(gate.get("required")), gate.get("comparison", "")]])]
    return "\n".join(lines) + "\n"


def _img(alt: str, png: bytes) -> str:
    return f"<img alt='{html.escape(alt)}' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"


def report_html(report: Mapping[str, Any], grids: Mapping[str, bytes], curve_png: bytes = b"") -> str:
    """A self-contained page: the Markdown's tables plus the grids (and the scores-against-steps figure) inline."""
    esc = html.escape
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>fourm-kfp evaluation</title><style>",
             "body{font-family:sans-serif;margin:24px}table{border-collapse:collapse;margin:8px 0}"
             "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f4f4f4}"
             "td:first-child,td:nth-child(2){text-align:left}</style></head><body>",
             "<h1>Evaluation</h1>",
             f"<p>Model <code>{esc(report['model_uri'])}</code> (step {report['step']}), "
             f"{report['num_samples']} val scenes.</p>",
             "<h2>Masked modeling</h2><table><tr><th>modality</th><th>loss</th><th>token accuracy</th></tr>"]
    for name, values in report["masked"].items():
        parts.append(f"<tr><td>{esc(name)}</td><td>{_fmt(values['loss'])}</td><td>{_fmt(values['accuracy'])}</td></tr>")
    parts.append(f"</table><h2>Cross-modal tasks</h2><p>{esc(_explanation(report))}</p>")
    for head, rows, title in ((TASK_HEAD, _task_rows(report["tasks"]), ""),
                              (METRIC_HEAD, _metric_rows(report["tasks"]), "<h3>All metrics</h3>")):
        parts.append(title + "<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr>")
        parts += ["<tr>" + "".join(f"<td>{esc(v)}</td>" for v in row) + "</tr>" for row in rows]
        parts.append("</table>")
    for task, png in grids.items():
        if png:
            parts.append(f"<h3>{esc(task)}</h3>{_img(task, png)}")
    if report.get("curve"):
        head, rows = _curve_table(report["curve"])
        parts.append(f"<h2>Scores against training steps</h2><p>{esc(_curve_explanation(report['curve']))}</p>")
        parts.append("<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr>")
        parts += ["<tr>" + "".join(f"<td>{esc(v)}</td>" for v in row) + "</tr>" for row in rows]
        parts.append("</table>" + (_img("scores against training steps", curve_png) if curve_png else ""))
    parts.append("</body></html>")
    return "\n".join(parts)
