"""The pretokenize report: tokens per sample, codebook usage per modality (with histograms), throughput.

Statistics come from a bounded sample of the train split (:data:`STAT_SAMPLES` samples, all crops), so the
report costs the same at any dataset size.
"""

from __future__ import annotations

import io
from typing import Any, Mapping

import numpy as np
from PIL import Image, ImageDraw

from fourm_kfp.data.modality_visuals import get_font
from fourm_kfp.data.pretokenized import decode_member, token_name
from fourm_kfp.data.shard_stream import iter_split
from fourm_kfp.storage import Store

STAT_SAMPLES = 2000


def token_statistics(store: Store, plan: Mapping[str, Any], n_crops: int) -> dict[str, Any]:
    """Histograms of token ids per image modality over a bounded sample, usage, dtypes, tokens per sample."""
    names = [token_name(m) for m in plan["image"]]
    sizes = {m: plan["index"]["image"][m]["codebook_size"] for m in plan["image"]}
    histograms = {m: np.zeros(sizes[m], np.int64) for m in plan["image"]}
    dtypes: dict[str, str] = {}
    tokens_per_sample = {m: 0.0 for m in plan["image"]}
    seen = 0
    if names:
        for _, sample in iter_split(store, "train", names, decode=decode_member, limit=STAT_SAMPLES):
            seen += 1
            for m in plan["image"]:
                grid = sample.get(token_name(m))
                if grid is not None:
                    dtypes[m] = str(grid.dtype)
                    histograms[m] += np.bincount(grid.reshape(-1).astype(np.int64), minlength=sizes[m])
                    tokens_per_sample[m] += grid[0].size
    usage = {m: float((h > 0).mean()) for m, h in histograms.items()}
    per_sample = {m: v / max(seen, 1) for m, v in tokens_per_sample.items()}
    return {"histograms": histograms if seen else {}, "usage": usage, "dtypes": dtypes,
            "tokens_per_sample": per_sample, "stat_samples": seen, "crops": n_crops}


def codebook_usage_png(histograms: Mapping[str, np.ndarray], width: int = 640, row: int = 90) -> bytes:
    """One strip per modality: how often each code is used (sorted by frequency, log scale)."""
    image = Image.new("RGB", (width, row * len(histograms)), "white")
    draw = ImageDraw.Draw(image)
    font = get_font(12)
    for i, (modality, counts) in enumerate(histograms.items()):
        top = i * row
        ordered = np.sort(counts)[::-1].astype(np.float64)
        used = int((counts > 0).sum())
        draw.text((6, top + 4), f"{modality}: {used}/{len(counts)} codes used (sorted by frequency, log)",
                  fill="black", font=font)
        peak = np.log1p(ordered.max()) if ordered.max() > 0 else 1.0
        bar_w = (width - 12) / len(ordered)
        for j, value in enumerate(ordered):
            h = (row - 26) * np.log1p(value) / peak
            x = 6 + j * bar_w
            draw.rectangle([x, top + row - 4 - h, x + max(bar_w, 1), top + row - 4], fill=(60, 110, 180))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def report_markdown(report: Mapping[str, Any]) -> str:
    lines = ["# pretokenize", "",
             f"Samples: {report['samples']} · crops per sample: {report['crops']} (throughput and fan-out: the stage's "
             "MLflow run and manifest metrics)", "",
             "| modality | tokens per crop | codebook usage | check (decoded vs report) |", "|---|---:|---:|---|"]
    for m, usage in report["codebook_usage"].items():
        check = [f"{k.split('.')[-1]} {v:.4g}" for k, v in report["check"].items() if k.startswith(f"check.{m}.")]
        lines.append(f"| {m} | {report['tokens_per_sample'][m]:.0f} | {usage:.1%} | {', '.join(check) or '-'} |")
    return "\n".join(lines) + "\n"
