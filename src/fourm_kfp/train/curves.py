"""Training curves as a PNG (Pillow only): one panel per metric family, one line per series, dashed references.

Used by the pretrain report: the train loss, and the validation loss per modality against the loss of predicting
the marginal token distribution (a horizontal dashed line in the same colour); and by the evaluation's scores
against training steps (the trivial baseline dashed).
"""

from __future__ import annotations

import io
import math
from typing import Mapping, Sequence

from PIL import Image, ImageDraw

from fourm_kfp.data.modality_visuals import get_font

PALETTE = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75),
           (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207)]
WIDTH, HEIGHT, MARGIN = 640, 300, 48

Series = Mapping[str, Sequence[tuple[float, float]]]  # name -> [(step, value)]


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    if high <= low:
        return [low]
    return [low + (high - low) * i / (count - 1) for i in range(count)]


def _dashed(draw: ImageDraw.ImageDraw, y: float, x0: float, x1: float, color: tuple[int, int, int]) -> None:
    x = x0
    while x < x1:
        draw.line([(x, y), (min(x + 6, x1), y)], fill=color, width=1)
        x += 10


def line_chart(title: str, series: Series, references: Mapping[str, float] | None = None,
               ylabel: str = "", reference_label: str = "dashed: marginal", markers: bool = False) -> Image.Image:
    """One panel: ``series`` as lines (``markers``: with a dot at each point); ``references`` (same names) as
    dashed horizontal lines, which the legend calls ``reference_label``."""
    references = references or {}
    image = Image.new("RGB", (WIDTH, HEIGHT), "white")
    draw = ImageDraw.Draw(image)
    font = get_font(11)
    points = [p for values in series.values() for p in values if math.isfinite(p[1])]
    ys = [p[1] for p in points] + [v for v in references.values() if math.isfinite(v)]
    draw.text((MARGIN, 6), title, fill="black", font=get_font(13))
    if not points:
        draw.text((MARGIN, HEIGHT // 2), "no data", fill="gray", font=font)
        return image
    x_lo, x_hi = min(p[0] for p in points), max(p[0] for p in points)
    y_lo, y_hi = min(ys), max(ys)
    pad = (y_hi - y_lo) * 0.05 or 1.0
    y_lo, y_hi = y_lo - pad, y_hi + pad
    left, right, top, bottom = MARGIN, WIDTH - 150, 28, HEIGHT - 30

    def xy(x: float, y: float) -> tuple[float, float]:
        fx = (x - x_lo) / (x_hi - x_lo) if x_hi > x_lo else 0.5
        return left + fx * (right - left), bottom - (y - y_lo) / (y_hi - y_lo) * (bottom - top)

    draw.rectangle([left, top, right, bottom], outline=(200, 200, 200))
    for y in _ticks(y_lo, y_hi):
        _, py = xy(x_lo, y)
        draw.line([(left - 3, py), (left, py)], fill="black")
        draw.text((4, py - 6), f"{y:.3g}", fill="black", font=font)
    for x in _ticks(x_lo, x_hi):
        px, _ = xy(x, y_lo)
        draw.text((px - 10, bottom + 4), f"{x:.0f}", fill="black", font=font)
    if ylabel:
        draw.text((left, bottom + 16), f"step   ({ylabel})", fill="gray", font=font)
    for i, (name, values) in enumerate(series.items()):
        color = PALETTE[i % len(PALETTE)]
        line = [xy(x, y) for x, y in values if math.isfinite(y)]
        if len(line) > 1:
            draw.line(line, fill=color, width=2)
        for px, py in line if markers or len(line) == 1 else []:
            draw.ellipse([px - 3, py - 3, px + 3, py + 3], fill=color)
        if name in references and math.isfinite(references[name]):
            _dashed(draw, xy(x_lo, references[name])[1], left, right, color)
        draw.text((right + 8, top + 14 * i), name, fill=color, font=font)
    if references:
        draw.text((right + 8, top + 14 * len(series) + 6), reference_label, fill="gray", font=font)
    return image


def stack_png(panels: Sequence[Image.Image]) -> bytes:
    """Panels one under another, as PNG bytes."""
    sheet = Image.new("RGB", (WIDTH, HEIGHT * len(panels)), "white")
    for i, panel in enumerate(panels):
        sheet.paste(panel, (0, i * HEIGHT))
    buf = io.BytesIO()
    sheet.save(buf, format="PNG")
    return buf.getvalue()
