"""The evaluation report: tables (model / tokenizer ceiling / trivial baseline per task), example grids, the gate.

Markdown for the KFP UI's Markdown viewer and MLflow, a self-contained HTML page (grids embedded) for the KFP UI's
HTML viewer, and one PNG grid per task (rows: val scenes; columns: input, generated, ceiling, ground truth).
"""

from __future__ import annotations

import base64
import html
import io
from typing import Any, Mapping, Sequence

import numpy as np
from PIL import Image, ImageDraw

from fourm_kfp.data.modality_visuals import get_font, visualize

TILE = 96
HEADER = 22


def _fmt(value: float | None) -> str:
    if value is None or not np.isfinite(value):
        return "–"
    return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"


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


def _rows(results: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """The primary metric of each task first (with its direction and the gain over the baseline), then the rest."""
    rows = []
    for r in results:
        names = [r["primary"]] + [n for n in r["model"] if n != r["primary"]]
        for name in names:
            primary = name == r["primary"]
            arrow = ("↑" if r["higher_is_better"] else "↓") if primary else ""
            gain = r["gain_over_baseline"]
            mark = (f"{'yes' if r['beats_baseline'] else 'no'} ({gain:+.0%})" if np.isfinite(gain)
                    else "yes" if r["beats_baseline"] else "no") if primary else ""
            rows.append([r["task"] if primary else "", f"{name} {arrow}".strip(), _fmt(r["model"][name]),
                         _fmt(r["ceiling"].get(name)), _fmt(r["baseline"].get(name)), mark])
    return rows


HEAD = ["task", "metric", "model", "tokenizer ceiling", "trivial baseline", "beats baseline (gain)"]


def report_markdown(report: Mapping[str, Any]) -> str:
    lines = ["# Evaluation", "",
             f"Model `{report['model_uri']}` (step {report['step']}), {report['num_samples']} val scenes, "
             f"sampling {report['sampling']}.", "",
             "## Masked modeling (val split, training budgets and seed)", "",
             "| modality | loss | token accuracy |", "|---|---|---|"]
    for name, values in report["masked"].items():
        lines.append(f"| {name} | {_fmt(values['loss'])} | {_fmt(values['accuracy'])} |")
    lines += ["", "## Cross-modal tasks", "",
              f"The model beats the trivial baseline on {report['tasks_beating_baseline']} of "
              f"{len(report['tasks'])} tasks (primary metric of each, marked ↑/↓).", "",
              "| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    lines += ["| " + " | ".join(row) + " |" for row in _rows(report["tasks"])]
    lines += ["", "Grids: `reports/grid_<task>.png` (input / generated / ceiling = the ground truth's tokens decoded "
              "/ ground truth).", ""]
    gate = report.get("gate")
    lines += ["## Model gate", ""]
    if gate:
        lines.append(f"Registered `{gate['model_name']}` version {gate['version']} (alias `candidate`): "
                     f"**{'promoted to champion' if gate['promoted'] else 'not promoted'}** — {gate['reason']}.")
    else:
        lines.append(report.get("gate_skipped", "not run"))
    return "\n".join(lines) + "\n"


def report_html(report: Mapping[str, Any], grids: Mapping[str, bytes]) -> str:
    """A self-contained page: the Markdown's tables plus the grids inline."""
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
    parts.append("</table><h2>Cross-modal tasks</h2><table><tr>" + "".join(f"<th>{h}</th>" for h in HEAD) + "</tr>")
    for row in _rows(report["tasks"]):
        parts.append("<tr>" + "".join(f"<td>{esc(v)}</td>" for v in row) + "</tr>")
    parts.append("</table>")
    gate = report.get("gate")
    if gate:
        parts.append(f"<h2>Model gate</h2><p><code>{esc(gate['model_name'])}</code> version {esc(gate['version'])}: "
                     f"<b>{'promoted' if gate['promoted'] else 'not promoted'}</b> — {esc(gate['reason'])}</p>")
    for task, png in grids.items():
        if png:
            data = base64.b64encode(png).decode()
            parts.append(f"<h3>{esc(task)}</h3><img alt='{esc(task)}' src='data:image/png;base64,{data}'>")
    parts.append("</body></html>")
    return "\n".join(parts)
