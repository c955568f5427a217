"""Turn any modality value into a square RGB ``uint8`` tile for humans (preview grids, reconstruction grids).

``visualize(modality, value, size, context)`` looks up the visualiser the modality's record names (``visual``, a key
of :data:`VISUALIZERS`: one small function per kind of value) and returns ``[size, size, 3]`` ``uint8``:

* ``rgb`` as-is, resized bilinearly (antialiased when shrinking); non-square images are stretched;
* ``depth`` through a viridis colour map, normalised between the 2nd and 98th percentile of the valid pixels,
  near = bright yellow, far = dark purple; invalid pixels (0) black;
* ``normal`` as ``(n + 1) / 2`` colours, invalid (zero) vectors black;
* ``semseg`` with a fixed colour per class id, any id (:func:`class_color`, shared with the ``det`` box colours:
  the synthetic classes' six colours, then a golden-ratio walk of hues for the ids of a larger vocabulary);
* ``edge`` and ``canny_edge`` white on black (thickened before shrinking so thin edges stay visible);
* ``det`` boxes with class names over ``context["rgb"]`` (the rest of the sample) when there is one, else grey;
* ``caption`` the text word-wrapped onto a light tile, shrinking the font down to a legible minimum and ending
  with an ellipsis when it still does not fit;
* ``color_palette`` as vertical stripes of its colours; ``metadata`` as ``field value unit`` text (a
  bin as the raw values it holds: ``original width 416 to 447 px``);
* a feature map (``clip``, ``dinov2``) as its first three principal components over the map's cells, each scaled
  between its 2nd and 98th percentile to a colour channel (similar features, similar colours), cells enlarged by
  nearest neighbour.

Label-like images (semseg) and feature maps are resized with nearest neighbour so their colours stay exact.
"""

from __future__ import annotations

import functools
import zlib
from typing import Any, Callable, Mapping

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from fourm_kfp.data.label_formats import metadata_readings, palette_text, parse_palette_text
from fourm_kfp.data.modalities import CLASS_NAMES, COORD_BINS, MODALITIES, parse_det

#: Viridis sampled at 9 evenly spaced points; :func:`colormap` interpolates between them.
_VIRIDIS = np.array(
    [(68, 1, 84), (72, 40, 120), (62, 73, 137), (49, 104, 142), (38, 130, 142),
     (31, 158, 137), (53, 183, 121), (110, 206, 88), (253, 231, 37)], dtype=np.float32)
#: Distinct colours for the known classes, in ``CLASS_NAMES`` order.
_CLASS_COLORS = ((48, 48, 56), (150, 120, 90), (230, 25, 75), (0, 130, 200), (60, 180, 75), (255, 190, 30))
CAPTION_BACKGROUND = (250, 248, 240)
ABSENT_BACKGROUND = (206, 206, 210)
MIN_FONT = 9

Visualizer = Callable[[Any, int, Mapping[str, Any]], np.ndarray]


@functools.lru_cache(maxsize=32)
def get_font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    """PIL's bundled font at ``size`` pixels (the fixed bitmap font where FreeType is unavailable)."""
    try:
        return ImageFont.load_default(size=size)
    except (TypeError, ImportError, OSError):  # Pillow < 10.1, or built without FreeType
        return ImageFont.load_default()


def colormap(t: np.ndarray) -> np.ndarray:
    """Values in ``[0, 1]`` → viridis colours, ``uint8 [..., 3]``."""
    x = np.clip(np.nan_to_num(t), 0.0, 1.0) * (len(_VIRIDIS) - 1)
    lo = np.minimum(np.floor(x).astype(np.int64), len(_VIRIDIS) - 2)
    frac = (x - lo)[..., None]
    return np.round(_VIRIDIS[lo] * (1 - frac) + _VIRIDIS[lo + 1] * frac).astype(np.uint8)


def _hashed_color(key: str) -> tuple[int, int, int]:
    """A stable, fairly saturated colour for anything without a fixed one."""
    h = zlib.crc32(key.encode())
    return (64 + h % 192, 64 + (h >> 8) % 192, 64 + (h >> 16) % 192)


#: The golden ratio's fraction: hues this far apart, id after id, never repeat and stay spread out.
_GOLDEN = (5 ** 0.5 - 1) / 2


def _walk_colors(ids: np.ndarray) -> np.ndarray:
    """Colours of class ids past the fixed ones, ``uint8 [..., 3]``: the hue walks the circle in golden-ratio
    steps, the saturation alternates (0.9, 0.6) and the brightness takes three levels, so neighbouring ids differ
    clearly; ids 0..1988 all get different colours (larger ids may repeat one)."""
    ids = np.asarray(ids, np.int64)
    h = (ids * _GOLDEN) % 1.0 * 6.0
    s = np.where(ids % 2 == 0, 0.9, 0.6)
    v = np.array([0.95, 0.75, 0.55])[(ids // 2) % 3]
    sector, f = np.floor(h).astype(np.int64) % 6, h - np.floor(h)
    p, q, t = v * (1 - s), v * (1 - f * s), v * (1 - (1 - f) * s)
    rgb = np.choose(sector[..., None], [np.stack(c, -1) for c in
                                        ((v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q))])
    return np.round(rgb * 255).astype(np.uint8)


@functools.lru_cache(maxsize=8)
def class_palette(count: int) -> np.ndarray:
    """``class_palette(n)[class_id]`` → RGB ``uint8`` for ids ``0..n - 1`` (:func:`class_color`'s colours)."""
    palette = _walk_colors(np.arange(max(count, len(_CLASS_COLORS))))
    palette[: len(_CLASS_COLORS)] = _CLASS_COLORS
    palette.flags.writeable = False
    return palette[:count]


def class_color(class_id_or_name: int | str) -> tuple[int, int, int]:
    """The palette colour of a class, by id (``semseg``: the six synthetic classes' fixed colours, then distinct
    colours for any larger id) or name (``det``: a synthetic class's colour, else one derived from the name)."""
    if isinstance(class_id_or_name, str):
        if class_id_or_name not in CLASS_NAMES:
            return _hashed_color(class_id_or_name)
        class_id_or_name = CLASS_NAMES.index(class_id_or_name)
    if class_id_or_name < len(_CLASS_COLORS):
        return _CLASS_COLORS[class_id_or_name]
    return tuple(int(c) for c in _walk_colors(np.int64(class_id_or_name)))


#: ``SEMSEG_PALETTE[class_id]`` → RGB, for every ``uint8`` id (:func:`class_palette` for any id).
SEMSEG_PALETTE = class_palette(256)


def _fit(image: np.ndarray, size: int, labels: bool = False) -> np.ndarray:
    """``uint8 [H, W, 3]`` → ``[size, size, 3]``."""
    if image.shape[:2] == (size, size):
        return image
    resample = Image.NEAREST if labels else Image.BILINEAR
    return np.asarray(Image.fromarray(image).resize((size, size), resample))


def _rgb(value: Any, size: int, context: Mapping[str, Any]) -> np.ndarray:
    return _fit(np.clip(np.asarray(value), 0, 255).astype(np.uint8)[..., :3], size)


def _depth(value: Any, size: int, context: Mapping[str, Any]) -> np.ndarray:
    depth = np.nan_to_num(np.asarray(value, dtype=np.float32))
    valid = depth != 0  # metric depth is >= 0; a standardised relative map (a tokenizer's) goes below 0
    if not valid.any():
        return np.zeros((size, size, 3), np.uint8)
    lo, hi = np.percentile(depth[valid], (2, 98))
    near_is_one = 1.0 - (depth - lo) / (hi - lo) if hi > lo else np.full_like(depth, 0.5)
    colors = np.where(valid[..., None], colormap(near_is_one), 0).astype(np.uint8)
    return _fit(colors, size)


def _normal(value: Any, size: int, context: Mapping[str, Any]) -> np.ndarray:
    normal = np.asarray(value, dtype=np.float32)
    valid = np.any(normal != 0, axis=-1, keepdims=True)
    colors = np.clip(np.round((normal + 1.0) * 127.5), 0, 255)
    return _fit(np.where(valid, colors, 0).astype(np.uint8), size)


def _semseg(value: Any, size: int, context: Mapping[str, Any]) -> np.ndarray:
    ids = np.maximum(np.asarray(value, np.int64), 0)
    palette = class_palette(1 << max(8, int(ids.max(initial=0)).bit_length()))  # a power of two: cached
    return _fit(palette[ids], size, labels=True)


def _edge(value: Any, size: int, context: Mapping[str, Any]) -> np.ndarray:
    edges = Image.fromarray((np.asarray(value) > 0).astype(np.uint8) * 255)
    shrink = max(edges.size) / size
    if shrink > 1.5:  # thicken first, or one-pixel edges fade to grey when shrunk
        edges = edges.filter(ImageFilter.MaxFilter(2 * int(shrink / 2) + 1))
    white = np.asarray(edges)
    return _fit(np.repeat(white[..., None], 3, axis=-1), size)


def _det(value: Any, size: int, context: Mapping[str, Any]) -> np.ndarray:
    if context.get("rgb") is not None:
        base = _rgb(context["rgb"], size, context)
    else:
        base = np.full((size, size, 3), 128, np.uint8)
    image = Image.fromarray(base)
    draw = ImageDraw.Draw(image)
    font = get_font(max(MIN_FONT, size // 11))
    width = max(1, size // 64)
    for coords, name in parse_det(str(value)):
        x0, y0, x1, y1 = (c / COORD_BINS * size for c in coords)
        color = class_color(name)
        draw.rectangle((x0, y0, max(x0, x1), max(y0, y1)), outline=color, width=width)
        left, top, right, bottom = draw.textbbox((0, 0), name, font=font)
        tx, ty = min(x0, size - (right - left) - 2), max(0.0, y0 - (bottom - top) - 3)
        draw.rectangle((tx, ty, tx + right - left + 2, ty + bottom - top + 3), fill=color)
        ink = (0, 0, 0) if sum(color) > 380 else (255, 255, 255)
        draw.text((tx + 1 - left, ty + 1 - top), name, fill=ink, font=font)
    return np.asarray(image)


def wrap_text(text: str, font: Any, width: float) -> list[str]:
    """Greedy word wrap to ``width`` pixels (a word longer than a line gets a line of its own)."""
    lines: list[str] = []
    for word in text.split():
        if lines and font.getlength(f"{lines[-1]} {word}") <= width:
            lines[-1] = f"{lines[-1]} {word}"
        else:
            lines.append(word)
    return lines


def text_tile(text: str, size: int, background: tuple[int, int, int] = CAPTION_BACKGROUND,
              ink: tuple[int, int, int] = (30, 30, 30)) -> np.ndarray:
    """``text`` wrapped onto a ``size``-pixel tile, in the largest font (down to ``MIN_FONT``) that fits."""
    image = Image.new("RGB", (size, size), background)
    draw = ImageDraw.Draw(image)
    pad = max(3, size // 24)
    for font_size in range(max(MIN_FONT, size // 8), MIN_FONT - 1, -1):
        font = get_font(font_size)
        line_height = font_size + 2
        lines = wrap_text(text, font, size - 2 * pad)
        fits = (size - 2 * pad) // line_height
        if len(lines) <= fits:
            break
    if len(lines) > fits:
        lines = lines[: max(fits, 1)]
        words = lines[-1].split()
        while len(words) > 1 and font.getlength(" ".join(words) + "…") > size - 2 * pad:
            words.pop()
        lines[-1] = " ".join(words).rstrip(".,;:") + "…"
    for i, line in enumerate(lines):
        draw.text((pad, pad + i * line_height), line, fill=ink, font=font)
    return np.asarray(image)


def _caption(value: Any, size: int, context: Mapping[str, Any]) -> np.ndarray:
    return text_tile(str(value), size)


def absent_tile(size: int, text: str = "absent") -> np.ndarray:
    """A neutral, hatched tile marking a modality a sample does not have."""
    image = Image.new("RGB", (size, size), ABSENT_BACKGROUND)
    draw = ImageDraw.Draw(image)
    for offset in range(-size, size, max(6, size // 8)):
        draw.line((offset, size, offset + size, 0), fill=(196, 196, 200), width=1)
    draw_centered(draw, (size / 2, size / 2), text, get_font(max(MIN_FONT, size // 9)), (110, 110, 118))
    return np.asarray(image)


def draw_centered(draw: ImageDraw.ImageDraw, center: tuple[float, float], text: str, font: Any,
                  fill: tuple[int, int, int]) -> None:
    """Draw ``text`` centred on ``center`` (measured, so it works for bitmap fonts too)."""
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    draw.text((center[0] - (left + right) / 2, center[1] - (top + bottom) / 2), text, fill=fill, font=font)


def _palette(value: Any, size: int, context: Mapping[str, Any]) -> np.ndarray:
    """A palette as vertical stripes of its colours (text, as read from a shard or generated, or 4M's JSON: its
    longest palette); an unreadable one as its text."""
    text = value if isinstance(value, str) else palette_text(value, max(int(k) for k in value[0]))
    colours = parse_palette_text(text)
    if not colours:
        return text_tile(text or "no colours", size)
    edges = np.linspace(0, size, len(colours) + 1).round().astype(int)
    tile = np.zeros((size, size, 3), np.uint8)
    for colour, left, right in zip(colours, edges[:-1], edges[1:]):
        tile[:, left:right] = colour
    return tile


def _metadata(value: Any, size: int, context: Mapping[str, Any]) -> np.ndarray:
    """Metadata as ``field value unit`` lines: a bin as the raw values it holds, raw numbers as they are."""
    return text_tile("; ".join(metadata_readings(value)) or "no fields", size)


def _features(value: Any, size: int, context: Mapping[str, Any]) -> np.ndarray:
    """A feature map ``[grid, grid, C]``: its three principal components as colours (module docstring)."""
    features = np.nan_to_num(np.asarray(value, np.float64))
    cells = features.reshape(-1, features.shape[-1])
    centred = cells - cells.mean(0)
    _, _, axes = np.linalg.svd(centred, full_matrices=False)
    axes = axes[:3] * np.sign(axes[:3][np.arange(len(axes[:3])), np.abs(axes[:3]).argmax(1)])[:, None]
    components = centred @ axes.T  # each axis signed by its largest loading: the data fixes it, not the solver
    colours = np.zeros((len(cells), 3))
    for c in range(components.shape[1]):
        lo, hi = np.percentile(components[:, c], (2, 98))
        colours[:, c] = np.clip((components[:, c] - lo) / (hi - lo), 0, 1) if hi > lo else 0.5
    tile = np.round(colours * 255).astype(np.uint8).reshape(features.shape[:-1] + (3,))
    return _fit(tile, size, labels=True)


#: The visualisers a modality record names (``visual``).
VISUALIZERS: dict[str, Visualizer] = {
    "rgb": _rgb,
    "depth": _depth,
    "normal": _normal,
    "semseg": _semseg,
    "edge": _edge,
    "det": _det,
    "caption": _caption,
    "palette": _palette,
    "metadata": _metadata,
    "features": _features,
}


def visualize(modality: str, value: Any, size: int, context: Mapping[str, Any] | None = None) -> np.ndarray:
    """``value`` of ``modality`` → an RGB ``uint8 [size, size, 3]`` tile; ``context`` is the rest of the sample."""
    if modality not in MODALITIES:
        raise KeyError(f"no visualizer for modality {modality!r}; known: {', '.join(MODALITIES)}")
    return VISUALIZERS[MODALITIES[modality].visual](value, size, context or {})
