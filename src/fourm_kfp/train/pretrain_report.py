"""What the pretrain stage reports: ``pretrain_report.json`` and ``.md`` (per modality the validation loss at the
first and last validation against the marginal baseline, :mod:`.marginal_baseline`; in the ``.md``, for a run
started with ``train.init_from``, what it took from where: :mod:`.initial_weights`), ``training_curves.png``, and
the run's mean throughput (a wall-clock measure: manifest and MLflow metrics only, never the report files).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from fourm_kfp.train import curves
from fourm_kfp.train.metrics import MetricWriter
from fourm_kfp.train.trainer import Trainer

if TYPE_CHECKING:
    from fourm_kfp.train.initial_weights import InitReport

#: Entries of each ``train.init_from`` list shown in the markdown (all of them: ``init_report.json``).
INIT_LINES = 5


def pretrain_report(trainer: Trainer, marginal: dict[str, float], card: dict, state: Any,
                    steps: int) -> dict[str, Any]:
    """The report's document: the run's counts, per modality its validation loss and accuracy against the
    ``marginal`` loss, and the validation history."""
    first, last = trainer.val_history[0], trainer.val_history[-1]
    per_modality = {}
    for name in card["modalities"]:
        key = f"val/loss/{name}"
        if key in last:
            per_modality[name] = {"val_loss_start": first.get(key), "val_loss_end": last[key],
                                  "val_accuracy_end": last.get(f"val/accuracy/{name}"),
                                  "marginal_loss": marginal.get(name)}
    return {"steps": state.step, "planned_steps": steps, "tokens": state.tokens, "samples": state.samples,
            "skipped_steps": state.skipped, "parameters": card["parameters"],
            "first_val_step": int(first["step"]), "last_val_step": int(last["step"]),
            "modalities": per_modality, "val_history": trainer.val_history}


def throughput(writer: MetricWriter) -> dict[str, float]:
    """Mean tokens/s and MFU of the logged intervals after the first (which includes start-up): wall-clock
    measures, so they go to the manifest and MLflow, never into the report files; absent when there was no such
    interval (a run shorter than two log intervals)."""
    lines = [h for h in writer.history if "tokens_per_s" in h][1:]
    means = {key: float(np.mean([h[key] for h in lines if key in h] or [math.nan])) for key in ("tokens_per_s", "mfu")}
    return {key: value for key, value in means.items() if math.isfinite(value)}


def report_markdown(report: dict[str, Any], init: InitReport | None = None) -> str:
    """``pretrain_report.md`` from :func:`pretrain_report`'s document (and ``train.init_from``'s report)."""
    first, last = report["first_val_step"], report["last_val_step"]
    lines = ["# pretrain", "",
             f"{report['steps']} steps, {report['tokens']:,} tokens, {report['parameters']:,} parameters, "
             f"skipped steps {report['skipped_steps']} (throughput: the stage's MLflow run and manifest metrics)", ""]
    if first > 0:
        lines += [f"This run started from a checkpoint: its first validation is at step {first} (the validation "
                  "history before a checkpoint is not saved with it).", ""]
    lines += [f"| modality | val loss at step {first} | val loss at step {last} | marginal (predict the token "
              "distribution) | end below marginal | val token accuracy |", "|---|---:|---:|---:|---|---:|"]
    for name, m in report["modalities"].items():
        below = "yes" if m["marginal_loss"] is not None and m["val_loss_end"] < m["marginal_loss"] else "no"
        lines.append(f"| {name} | {m['val_loss_start']:.3f} | {m['val_loss_end']:.3f} | "
                     f"{(m['marginal_loss'] or math.nan):.3f} | {below} | {m['val_accuracy_end']:.1%} |")
    if init is not None:
        lines += ["", "## Initialised from", "",
                  f"`{init.source}` ({init.kind}): {init.imported_parameters:,} parameters imported, "
                  f"{init.new_parameters:,} freshly initialised, {init.dropped_parameters:,} of the source dropped "
                  "(every entry: `reports/init_report.json`).", ""]
        for title, entries in (("imported", init.imported), ("new", init.new), ("dropped", init.dropped)):
            more = f" and {len(entries) - INIT_LINES} more" if len(entries) > INIT_LINES else ""
            shown = "; ".join(f"`{entry}`" for entry in entries[:INIT_LINES]) or "none"
            lines.append(f"- {title} ({len(entries)}): {shown}{more}")
        if init.token_tables:  # whether the imported token rows mean anything with this run's tokenizers
            by = {}
            for name, entry in init.token_tables.items():
                state = ("meaningful" if entry["meaningful"] else "unknown" if entry["meaningful"] is None
                         else "not meaningful") if entry["imported"] else "not imported"
                by.setdefault(state, []).append(name if state == "meaningful" else
                                                f"{name} ({entry.get('reason', '')})")
            lines.append("- token tables: " + "; ".join(f"{state}: {', '.join(names)}" for state, names in by.items()))
    return "\n".join(lines) + "\n"


def training_curves_png(history: list[dict[str, float]], val_history: list[dict[str, float]],
                        marginal: dict[str, float]) -> bytes:
    """``training_curves.png``: the train loss, and the validation loss per modality against its marginal loss."""
    train = [(h["step"], h["loss"]) for h in history if "loss" in h]  # the train log lines (val lines: val/loss)
    names = sorted({k.split("/", 2)[2] for h in val_history for k in h if k.startswith("val/loss/")})
    val = {n: [(h["step"], h[f"val/loss/{n}"]) for h in val_history if f"val/loss/{n}" in h] for n in names}
    return curves.stack_png([curves.line_chart("train loss (mean over modalities)", {"loss": train}),
                             curves.line_chart("validation loss per modality", val, marginal, "nats")])
