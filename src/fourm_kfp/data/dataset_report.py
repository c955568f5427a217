"""What a prepared dataset holds: streaming statistics, a JSON/Markdown report, a preview grid and histograms.

:class:`DatasetStats` is fed every sample as the ``prepare-data`` stage streams them (cheap per sample: counters and
one ``bincount`` over the semseg map) and turns into a JSON-serialisable report with :meth:`DatasetStats.to_dict`:

.. code-block:: text

    {"splits": {split: {"samples": n, "modalities": {modality: n}}},   # 0 where a modality is absent in a split
     "skipped": {reason: n},
     "classes": {"semseg_pixel_fraction": {class: fraction}, "det_objects": {class: n}},
     "caption_length": {"histogram": {words: n}, "count": n, "mean": x, "min": a, "max": b},
     "det_boxes_per_sample": {"histogram": {boxes: n}, "count": n, "mean": x, "min": a, "max": b}}

Histogram keys are strings (JSON object keys); ``mean``/``min``/``max`` are ``null`` when there is no data.
Statistics gathered in pieces (one per shard, in separate workers) merge exactly: :meth:`DatasetStats.state` and
:meth:`DatasetStats.merge`.
:func:`report_markdown` summarises a report for the KFP UI, :func:`render_preview_grid` shows samples × modalities
(tiles from :mod:`fourm_kfp.data.modality_visuals`) and :func:`render_histograms` draws the histograms.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any, Mapping, Sequence

import numpy as np
from PIL import Image, ImageDraw

from fourm_kfp.data.modalities import MODALITIES, parse_det
from fourm_kfp.data.modality_visuals import absent_tile, class_color, draw_centered, get_font, visualize
from fourm_kfp.data.vocabularies import DEFAULT_VOCABULARIES

#: Preview grid layout: a header row of modality names ``GRID_HEADER`` pixels high, then one row per sample;
#: tiles are ``GRID_GAP`` pixels apart and from the left, right and bottom edges (see :func:`grid_cell`).
GRID_GAP = 4
GRID_HEADER = 22
ROW_LABEL_WIDTH = 110
GRID_BACKGROUND = (236, 236, 240)
_INK = (30, 30, 36)


def _class_name(class_id: int, classes: Sequence[str]) -> str:
    return classes[class_id] if class_id < len(classes) else f"class_{class_id}"


def _summary(counts: Counter[int]) -> dict[str, Any]:
    """Integer-valued observations counted by value → histogram, count, mean, min, max."""
    total = sum(counts.values())
    return {
        "histogram": {str(k): counts[k] for k in sorted(counts)},
        "count": total,
        "mean": round(sum(k * n for k, n in counts.items()) / total, 4) if total else None,
        "min": min(counts) if total else None,
        "max": max(counts) if total else None,
    }


class DatasetStats:
    """Accumulates counts over the samples of every split; :meth:`to_dict` gives the report (see module doc)."""

    def __init__(self, semseg_classes: Sequence[str] = DEFAULT_VOCABULARIES["semseg"]) -> None:
        self.semseg_classes = tuple(semseg_classes)  # the names of the ids (the dataset's vocabulary)
        self._samples: Counter[str] = Counter()
        self._modalities: defaultdict[str, Counter[str]] = defaultdict(Counter)
        self._skipped: Counter[str] = Counter()
        self._semseg_pixels = np.zeros(256, np.int64)
        self._det_objects: Counter[str] = Counter()
        self._det_boxes: Counter[int] = Counter()
        self._caption_words: Counter[int] = Counter()

    def add(self, split: str, sample: Mapping[str, Any]) -> None:
        self._samples[split] += 1
        self._modalities[split].update(m for m, v in sample.items() if v is not None)
        if sample.get("semseg") is not None:
            self._count_semseg(np.bincount(np.asarray(sample["semseg"], np.int64).ravel(), minlength=256))
        if sample.get("det") is not None:
            boxes = parse_det(sample["det"])
            self._det_boxes[len(boxes)] += 1
            self._det_objects.update(name for _, name in boxes)
        if sample.get("caption") is not None:
            self._caption_words[len(sample["caption"].split())] += 1

    def _count_semseg(self, pixels: np.ndarray) -> None:
        """Add pixel counts by class id (ids past 255 too: a vocabulary's semseg is stored in 16 bits)."""
        if len(pixels) > len(self._semseg_pixels):
            self._semseg_pixels = np.pad(self._semseg_pixels, (0, len(pixels) - len(self._semseg_pixels)))
        self._semseg_pixels[: len(pixels)] += pixels

    def add_skipped(self, reasons: Mapping[str, int]) -> None:
        """Merge counts of skipped source items by reason."""
        self._skipped.update(reasons)

    def state(self) -> dict[str, Any]:
        """Every count, as JSON (integers only): :meth:`merge` adds it to another :class:`DatasetStats`, so the
        statistics of a dataset written in pieces are those of one pass over it (splits in the order merged)."""
        return {
            "samples": dict(self._samples),
            "modalities": {split: dict(counts) for split, counts in self._modalities.items() if counts},
            "skipped": dict(self._skipped),
            "semseg_pixels": {str(i): int(n) for i, n in enumerate(self._semseg_pixels) if n},
            "det_objects": dict(self._det_objects),
            "det_boxes": {str(k): n for k, n in self._det_boxes.items()},
            "caption_words": {str(k): n for k, n in self._caption_words.items()},
        }

    def merge(self, state: Mapping[str, Any]) -> None:
        """Add the counts of another :class:`DatasetStats` (its :meth:`state`)."""
        self._samples.update({split: n for split, n in state["samples"].items() if n})
        for split, counts in state["modalities"].items():
            self._modalities[split].update(counts)
        self._skipped.update({reason: n for reason, n in state["skipped"].items() if n})
        counts = {int(i): n for i, n in state["semseg_pixels"].items()}
        pixels = np.zeros(max(counts, default=0) + 1, np.int64)
        pixels[list(counts)] = list(counts.values())
        self._count_semseg(pixels)
        self._det_objects.update(state["det_objects"])
        self._det_boxes.update({int(k): n for k, n in state["det_boxes"].items()})
        self._caption_words.update({int(k): n for k, n in state["caption_words"].items()})

    def to_dict(self) -> dict[str, Any]:
        seen = set().union(*self._modalities.values())
        modalities = [m for m in MODALITIES if m in seen] + sorted(seen - set(MODALITIES))
        total_pixels = int(self._semseg_pixels.sum())
        semseg = {
            _class_name(i, self.semseg_classes): round(int(px) / total_pixels, 6)
            for i, px in enumerate(self._semseg_pixels)
            if total_pixels and (i < len(self.semseg_classes) or px)
        }
        return {
            "splits": {
                split: {"samples": n, "modalities": {m: self._modalities[split][m] for m in modalities}}
                for split, n in self._samples.items()
            },
            "skipped": dict(sorted(self._skipped.items())),
            "classes": {"semseg_pixel_fraction": semseg, "det_objects": dict(sorted(self._det_objects.items()))},
            "caption_length": _summary(self._caption_words),
            "det_boxes_per_sample": _summary(self._det_boxes),
        }


def grid_cell(row: int, col: int, tile: int) -> tuple[int, int]:
    """Top-left pixel of the tile of sample ``row`` and modality ``col`` in a preview grid."""
    return GRID_GAP + col * (tile + GRID_GAP), GRID_HEADER + row * (tile + GRID_GAP)


def render_preview_grid(samples: list[Mapping[str, Any]], modalities: list[str], tile: int = 96,
                        row_labels: list[str] | None = None) -> Image.Image:
    """Rows = samples, columns = modalities under a header of names; a modality a sample lacks gets a hatched
    "absent" tile. The image is ``GRID_GAP + cols * (tile + GRID_GAP)`` wide (plus ``ROW_LABEL_WIDTH`` with
    ``row_labels``, drawn left of each row) and ``GRID_HEADER + rows * (tile + GRID_GAP)`` high."""
    offset = ROW_LABEL_WIDTH if row_labels else 0
    width, height = grid_cell(len(samples), len(modalities), tile)
    grid = Image.new("RGB", (width + offset, height), GRID_BACKGROUND)
    draw = ImageDraw.Draw(grid)
    font = get_font(13)
    for row, label in enumerate(row_labels or ()):
        _, y = grid_cell(row, 0, tile)
        draw_centered(draw, (offset / 2, y + tile / 2), label, font, _INK)
    for col, modality in enumerate(modalities):
        x, _ = grid_cell(0, col, tile)
        draw_centered(draw, (offset + x + tile / 2, GRID_HEADER / 2), modality, font, _INK)
        for row, sample in enumerate(samples):
            value = sample.get(modality)
            cell = absent_tile(tile) if value is None else visualize(modality, value, tile, sample)
            x, y = grid_cell(row, col, tile)
            grid.paste(Image.fromarray(cell), (offset + x, y))
    return grid


def _bar_chart(title: str, labels: list[str], values: list[float], colors: list[tuple[int, int, int]],
               fmt: str = "{:g}", size: tuple[int, int] = (460, 210)) -> Image.Image:
    """A titled bar chart; value labels above the bars when there is room, x labels thinned to fit."""
    width, height = size
    panel = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(panel)
    title_font, label_font = get_font(14), get_font(11)
    draw.text((10, 6), title, fill=_INK, font=title_font)
    top, bottom = 44, height - 24
    slot = min((width - 20) / len(values), 80.0)
    left = (width - slot * len(values)) / 2
    peak = max(max(values), 1e-12)
    widest = max(label_font.getlength(label) for label in labels) + 6
    every = max(1, math.ceil(widest / slot))
    for i, (label, value, color) in enumerate(zip(labels, values, colors)):
        x0 = left + i * slot + slot * 0.12
        x1 = left + (i + 1) * slot - slot * 0.12
        y0 = bottom - value / peak * (bottom - top)
        draw.rectangle((x0, y0, x1, bottom), fill=color)
        centre = (x0 + x1) / 2
        if every == 1 and label_font.getlength(fmt.format(value)) < slot:
            draw_centered(draw, (centre, y0 - 8), fmt.format(value), label_font, _INK)
        if i % every == 0:
            draw_centered(draw, (centre, bottom + 11), label, label_font, _INK)
    draw.line((10, bottom, width - 10, bottom), fill=(120, 120, 120))
    return panel


def _integer_bars(histogram: Mapping[str, int], max_bars: int = 40) -> tuple[list[str], list[float]]:
    """A ``{value: count}`` histogram → contiguous bars from min to max, binned to at most ``max_bars``."""
    counts = {int(k): n for k, n in histogram.items()}
    low, high = min(counts), max(counts)
    step = math.ceil((high - low + 1) / max_bars)
    starts = range(low, high + 1, step)
    return [str(s) for s in starts], [sum(counts.get(v, 0) for v in range(s, s + step)) for s in starts]


def render_histograms(report: Mapping[str, Any]) -> Image.Image | None:
    """Bar charts of the class and length histograms of a report, stacked; ``None`` when there is nothing to plot."""
    panels = []
    classes = report.get("classes", {})
    for key, title, fmt in (("semseg_pixel_fraction", "semseg: fraction of pixels per class", "{:.0%}"),
                            ("det_objects", "det: objects per class", "{:g}")):
        if classes.get(key):
            names = list(classes[key])
            panels.append(_bar_chart(title, names, list(classes[key].values()), [class_color(n) for n in names], fmt))
    for key, title in (("caption_length", "caption: words per caption"),
                       ("det_boxes_per_sample", "det: boxes per sample")):
        histogram = report.get(key, {}).get("histogram")
        if histogram:
            labels, values = _integer_bars(histogram)
            panels.append(_bar_chart(title, labels, values, [(90, 110, 160)] * len(values)))
    if not panels:
        return None
    sheet = Image.new("RGB", (panels[0].width, sum(p.height for p in panels) + GRID_GAP * (len(panels) - 1)),
                      GRID_BACKGROUND)
    for i, panel in enumerate(panels):
        sheet.paste(panel, (0, i * (panel.height + GRID_GAP)))
    return sheet


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    align = ["---"] + ["---:"] * (len(header) - 1)
    return ["| " + " | ".join(map(str, r)) + " |" for r in (header, align, *rows)]


def report_markdown(report: Mapping[str, Any]) -> str:
    """A short Markdown summary of a report: samples per split and modality, skips, classes, captions, boxes."""
    lines = ["# Dataset report", ""]
    if "source" in report:
        where = f" (`{report['source_uri']}`)" if report.get("source_uri") else ""
        size = f", {report['image_size']} px images" if "image_size" in report else ""
        lines += [f"Source: `{report['source']}`{where}{size}.", ""]

    splits = report.get("splits", {})
    modalities = list(next(iter(splits.values()))["modalities"]) if splits else []
    shards = report.get("shards", {})
    extra = ["shards"] if shards else []
    rows = [[split, s["samples"], *(shards[split]["shards"] for _ in extra), *(s["modalities"][m] for m in modalities)]
            for split, s in splits.items()]
    rows.append(["**total**", *(sum(r[i] for r in rows) for i in range(1, len(extra) + len(modalities) + 2))])
    lines += ["## Samples", "", *_table(["split", "samples", *extra, *modalities], rows), ""]
    skipped = report.get("skipped", {})
    detail = ", ".join(f"{reason}: {n}" for reason, n in skipped.items())
    lines += [f"Skipped: {sum(skipped.values())} ({detail})." if skipped else "Skipped: none.", ""]

    semseg = report.get("classes", {}).get("semseg_pixel_fraction", {})
    det = report.get("classes", {}).get("det_objects", {})
    if semseg or det:
        names = list(semseg) + sorted(set(det) - set(semseg))
        rows = [[n, f"{semseg[n]:.1%}" if n in semseg else "–", det.get(n, 0)] for n in names]
        lines += ["## Classes", "", *_table(["class", "semseg pixels", "det objects"], rows), ""]

    for key, heading, unit in (("caption_length", "Captions", "words"), ("det_boxes_per_sample", "Detection", "boxes")):
        s = report.get(key, {})
        if s.get("count"):
            lines += [f"## {heading}", "",
                      f"{s['count']} samples, {s['mean']:.1f} {unit} on average (min {s['min']}, max {s['max']}).", ""]
    return "\n".join(lines)
