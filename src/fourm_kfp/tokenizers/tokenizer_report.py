"""The tokenizer report as Markdown: per modality, the reconstruction error beside the trivial baseline's.

Targets (the demo preset's bar): codebook usage >= 10% (no collapsed codebook), primary error at most a quarter of
the baseline's (``error_ratio <= 0.25``), segmentation mIoU >= 0.8, unknown-token rate on val captions < 1%.

Usage is not a quality bar beyond that: a patch-local tokenizer gives a label map's patch one code per distinct
label pattern, and the demo's semseg and edge maps have few (they use about a quarter of 512 codes with 0 nats of
code entropy given the exact label patch; before the encoder was patch-local they used more codes for the same
patterns, which is what the model could not learn).
"""

from __future__ import annotations

from typing import Any

from fourm_kfp.tokenizers.metrics import METRICS

USAGE_TARGET, RATIO_TARGET, MIOU_TARGET, UNK_TARGET = 0.1, 0.25, 0.8, 0.01


def target_checks(report: dict[str, Any]) -> dict[str, bool]:
    """``{check name: met}`` for every target that applies to the report's modalities."""
    checks = {}
    for modality, m in report.get("image", {}).items():
        checks[f"{modality} codebook usage >= 10%"] = m["codebook_usage"] >= USAGE_TARGET
        checks[f"{modality} error <= 1/4 of baseline"] = m["error_ratio"] <= RATIO_TARGET
        if modality == "semseg":
            checks["semseg mIoU >= 0.8"] = m["miou"] >= MIOU_TARGET
    if "unknown_token_rate" in report.get("text", {}):
        checks["text unknown-token rate < 1%"] = report["text"]["unknown_token_rate"] < UNK_TARGET
    return checks


def _fmt(value: float) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def report_markdown(report: dict[str, Any]) -> str:
    lines = ["# Tokenizer report", ""]
    image = report.get("image", {})
    if image:
        lines += ["| modality | metric | tokenizer | baseline | ratio | usage | perplexity |",
                  "|---|---|---|---|---|---|---|"]
        for modality, m in image.items():
            primary = METRICS[modality].primary
            shown = [primary] + [k for k in m if f"baseline_{k}" in m and k != primary]
            for i, key in enumerate(shown):
                head = (modality, _fmt(m["error_ratio"]), f"{100 * m['codebook_usage']:.0f}%",
                        _fmt(m["perplexity"])) if i == 0 else ("", "", "", "")
                lines.append(f"| {head[0]} | {key} | {_fmt(m[key])} | {_fmt(m[f'baseline_{key}'])} | {head[1]} "
                             f"| {head[2]} | {head[3]} |")
        lines.append("")
    text = report.get("text", {})
    if text:
        lines += [f"Text tokenizer: vocabulary {int(text['vocab_size'])}, unknown-token rate on val captions "
                  f"{100 * text['unknown_token_rate']:.2f}%, {text['mean_tokens_per_text']:.1f} tokens per caption.",
                  ""]
    for modality, source in report.get("ml4m", {}).items():
        lines += [f"{modality}: apple/ml-4m's tokenizer ({source['family']}) from `{source['source']}`, folder digest "
                  f"`{source['digest'][:16]}`, not trained here.", ""]
    if report.get("skipped_modalities"):
        lines += [f"No tokenizer for {', '.join(report['skipped_modalities'])}: the dataset lacks them.", ""]
    checks = target_checks(report)
    if checks:
        lines += ["## Targets", ""] + [f"- {'met' if ok else 'NOT met'}: {name}" for name, ok in checks.items()]
    return "\n".join(lines) + "\n"
