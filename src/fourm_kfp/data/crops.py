"""Aligned augmentation by pre-computed crops, as 4M does: one crop, applied identically to every modality.

Each sample gets ``n_crops`` crops: crop 0 is the full view, the others random resized crops (area fraction in
``scale``, aspect ratio in ``ratio``) that are mirrored with probability ``flip_probability``. Draws are seeded by
``(seed, sample key)``, so a rerun gives the same crops byte for byte.

Every modality is cut to the same window and resized back its own way, the rule its record names (``crop``, a key
of :data:`CROP_RULES`):

* ``camera`` (``rgb``) — bilinear (a photo tolerates interpolation), or Pillow's bicubic when the crops are for an
  ml-4m tokenizer (``camera_resample="bicubic"``: what ml-4m's ``save_vq_tokens.py`` does by default, its
  ``resample_mode`` None, i.e. ``PIL.Image.resize``'s default filter on the uint8 photo);
* ``nearest`` (``depth``, ``semseg``, ``edge``, ``canny_edge``, ...) — nearest neighbour: values stay exact and
  invalid pixels (depth 0) never blend into valid ones, class ids and edge bits stay ids and bits;
* ``normal`` — nearest neighbour, and a flip negates the x component (camera frame, x to the right);
* ``grid`` (a feature map, ``clip``, ``dinov2``: ``[grid, grid, C]``, not the image's size) — the window scaled to
  the grid's cells and resized back to the grid by nearest neighbour (each output cell takes the cell under its
  centre). The teacher saw the whole image, so this approximates the features of the crop by those of the cells it
  covers (a view of the same scene, not a re-run of the teacher);
* a flip mirrors columns (every rule's);
* ``boxes`` (``det``) — boxes mapped into the crop (and mirrored), clipped to it, and dropped when less than
  ``MIN_VISIBLE`` of their area remains;
* ``keep`` — ``caption`` and the other sequence modalities (whole-image statistics: ``color_palette``,
  ``metadata``, as 4M leaves them) as they are.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np
from PIL import Image

from fourm_kfp.data.modalities import COORD_BINS, MODALITIES, format_det, parse_det

#: A box keeps at least this fraction of its area inside the crop, or it is dropped.
MIN_VISIBLE = 0.3


@dataclass(frozen=True)
class Crop:
    """A window of the source image in pixels (``x0``, ``y0``, ``width``, ``height``) and a horizontal flip."""

    x0: int
    y0: int
    width: int
    height: int
    flip: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _rng(seed: int, key: str) -> np.random.Generator:
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def draw_crops(key: str, seed: int, n_crops: int, image_size: int, scale: tuple[float, float],
               ratio: tuple[float, float], flip_probability: float) -> list[Crop]:
    """Crop 0 is the full view; the others random resized crops (torchvision's sampling rule)."""
    rng = _rng(seed, key)
    crops = [Crop(0, 0, image_size, image_size)]
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(n_crops - 1):
        crop = None
        for _attempt in range(10):
            area = image_size * image_size * rng.uniform(*scale)
            aspect = math.exp(rng.uniform(*log_ratio))
            w, h = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
            if 0 < w <= image_size and 0 < h <= image_size:
                crop = Crop(int(rng.integers(0, image_size - w + 1)), int(rng.integers(0, image_size - h + 1)), w, h)
                break
        crop = crop or Crop(0, 0, image_size, image_size)
        crops.append(Crop(crop.x0, crop.y0, crop.width, crop.height, bool(rng.random() < flip_probability)))
    return crops


#: Pillow's filter for each ``camera_resample``
CAMERA_RESAMPLE = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}


def _resize(array: np.ndarray, crop: Crop, size: int, resample: str | None) -> np.ndarray:
    """The window resized to ``size`` by Pillow's ``resample`` filter (a key of :data:`CAMERA_RESAMPLE`), or by
    nearest neighbour when None; then mirrored if the crop flips."""
    window = array[crop.y0:crop.y0 + crop.height, crop.x0:crop.x0 + crop.width]
    if resample is not None:
        out = np.asarray(Image.fromarray(window).resize((size, size), CAMERA_RESAMPLE[resample]))
    else:  # nearest: pixel centres of the output map to source pixels
        rows = np.minimum(((np.arange(size) + 0.5) * crop.height / size).astype(np.int64), crop.height - 1)
        cols = np.minimum(((np.arange(size) + 0.5) * crop.width / size).astype(np.int64), crop.width - 1)
        out = window[rows][:, cols]
    return out[:, ::-1] if crop.flip else out


def crop_det(text: str, crop: Crop, image_size: int) -> str:
    """Boxes of a det string mapped into ``crop`` (and mirrored), clipped; mostly hidden boxes dropped."""
    boxes, names = [], []
    scale_in = image_size / COORD_BINS
    for (b0, b1, b2, b3), name in parse_det(text):
        x0, y0, x1, y1 = b0 * scale_in, b1 * scale_in, (b2 + 1) * scale_in, (b3 + 1) * scale_in
        cx0, cy0 = max(x0, crop.x0), max(y0, crop.y0)
        cx1, cy1 = min(x1, crop.x0 + crop.width), min(y1, crop.y0 + crop.height)
        area = (x1 - x0) * (y1 - y0)
        if cx1 <= cx0 or cy1 <= cy0 or (cx1 - cx0) * (cy1 - cy0) < MIN_VISIBLE * area:
            continue
        sx, sy = image_size / crop.width, image_size / crop.height
        nx0, nx1 = (cx0 - crop.x0) * sx, (cx1 - crop.x0) * sx
        if crop.flip:
            nx0, nx1 = image_size - nx1, image_size - nx0
        boxes.append((nx0, (cy0 - crop.y0) * sy, nx1, (cy1 - crop.y0) * sy))
        names.append(name)
    return format_det(boxes, names, image_size, image_size)


def _crop_grid(array: np.ndarray, crop: Crop, image_size: int) -> np.ndarray:
    """A ``[grid, grid, C]`` feature map through ``crop`` (in image pixels): see the module docstring."""
    grid = array.shape[0]
    scale = grid / image_size
    centres = (np.arange(grid) + 0.5) / grid
    rows = np.clip(np.floor((crop.y0 + centres * crop.height) * scale).astype(np.int64), 0, grid - 1)
    cols = np.clip(np.floor((crop.x0 + centres * crop.width) * scale).astype(np.int64), 0, grid - 1)
    out = array[rows][:, cols]
    return out[:, ::-1] if crop.flip else out


def _crop_normal(normal: np.ndarray, crop: Crop, image_size: int) -> np.ndarray:
    normal = _resize(normal, crop, image_size, None)
    return normal * np.array([-1.0, 1.0, 1.0], np.float32) if crop.flip else normal


#: How a crop transforms a modality's value, by the rule its record names: ``(value, crop, image size)`` → value
#: (``camera`` bilinearly; :func:`apply_crop` can make it bicubic).
CROP_RULES: dict[str, Callable[[Any, Crop, int], Any]] = {
    "camera": lambda value, crop, size: _resize(value, crop, size, "bilinear"),
    "nearest": lambda value, crop, size: _resize(value, crop, size, None),
    "normal": _crop_normal,
    "grid": _crop_grid,
    "boxes": crop_det,
    "keep": lambda value, crop, size: value,
}


def apply_crop(sample: dict[str, Any], crop: Crop, image_size: int,
               camera_resample: str = "bilinear") -> dict[str, Any]:
    """The sample seen through ``crop`` (modalities it lacks stay absent; a name outside the modality table is
    kept as it is); ``camera_resample``: the ``camera`` rule's filter (a key of :data:`CAMERA_RESAMPLE`)."""
    if camera_resample not in CAMERA_RESAMPLE:
        raise ValueError(f"camera_resample must be one of {sorted(CAMERA_RESAMPLE)}, not {camera_resample!r}")
    rules = {**CROP_RULES, "camera": lambda value, c, size: _resize(value, c, size, camera_resample)}
    out = {m: rules[MODALITIES[m].crop](v, crop, image_size) if m in MODALITIES else v
           for m, v in sample.items()}
    return {k: np.ascontiguousarray(v) if isinstance(v, np.ndarray) else v for k, v in out.items()}
