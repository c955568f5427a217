"""Real-world image bytes → the ``rgb`` modality: a uint8 ``[S, S, 3]`` square, or a :class:`BadSampleError`.

:func:`normalize_image` decodes fully (so a truncated file fails here, not in a later stage), applies the EXIF
orientation, converts every Pillow mode to 8-bit RGB and keeps the centred square resized to ``S`` (as ml-4m does);
:func:`normalize_image_sized` also returns the upright image's size before the crop.

Mode handling:

* transparency (``RGBA``, ``LA``, ``PA``, ``P``/``L``/``RGB`` with a ``transparency`` key) is composited over white;
* integer and float images (``I;16``, ``I;16B``, ``I``, ``F``) are stretched from their own min..max to 0..255
  (a 12-bit sensor image would otherwise be nearly black or clipped white); a constant image has no range to
  stretch and is clipped to 0..255 instead;
* everything else (``L``, ``P``, ``CMYK``, ``1``, ``YCbCr``, ...) goes through Pillow's own ``convert("RGB")``.

Images above Pillow's ``Image.MAX_IMAGE_PIXELS`` are rejected as decompression bombs (Pillow only warns between
1x and 2x that limit; here the warning is an error too), without decoding them.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

#: Images whose shorter side is below this are skipped as ``too_small``.
DEFAULT_MIN_SIDE = 16
#: Pillow modes holding more than 8 bits per pixel; they are stretched by their actual value range.
_WIDE_MODES = frozenset({"I;16", "I;16L", "I;16B", "I;16N", "I", "F"})
_ALPHA_MODES = frozenset({"RGBA", "RGBa", "LA", "La", "PA"})
_WHITE = (255, 255, 255, 255)


class BadSampleError(Exception):
    """A sample that cannot be used: ``reason`` is a short machine-readable code, ``name`` says which sample.

    Reasons raised here: ``unreadable``, ``truncated``, ``too_small``, ``decompression_bomb``; the sources in
    :mod:`fourm_kfp.data.ingest` add their own (see there).
    """

    def __init__(self, reason: str, name: str, detail: str = ""):
        super().__init__(reason, name, detail)  # all three in args, so the error survives pickling
        self.reason, self.name, self.detail = reason, name, detail

    def __str__(self) -> str:
        return f"{self.name}: {self.reason}" + (f" ({self.detail})" if self.detail else "")


def normalize_image(data: bytes, image_size: int, name: str, min_side: int = DEFAULT_MIN_SIDE) -> np.ndarray:
    """Decode ``data`` and return it as a uint8 ``[image_size, image_size, 3]`` RGB array.

    Raises :class:`BadSampleError` (``name`` is only used in its message) for anything that is not a usable image.
    """
    return normalize_image_sized(data, image_size, name, min_side)[0]


def normalize_image_sized(data: bytes, image_size: int, name: str,
                          min_side: int = DEFAULT_MIN_SIDE) -> tuple[np.ndarray, tuple[int, int]]:
    """:func:`normalize_image` and the image's original ``(width, height)``: upright (after the EXIF
    orientation), before the resize and centre crop."""
    image = _open(data, name)
    with image:
        if min(image.size) < min_side:
            raise BadSampleError("too_small", name, f"{image.width}x{image.height} px, minimum side is {min_side}")
        try:
            image.load()
            rgb = _to_rgb(ImageOps.exif_transpose(image))
        except Exception as exc:
            raise BadSampleError(_load_failure_reason(exc), name, f"{type(exc).__name__}: {exc}") from exc
    return np.asarray(_resize_center_crop(rgb, image_size)), rgb.size


def _open(data: bytes, name: str) -> Image.Image:
    """``Image.open`` (header only) with decompression bombs and unknown formats as :class:`BadSampleError`."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            return Image.open(io.BytesIO(data))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise BadSampleError("decompression_bomb", name, str(exc)) from exc
    except UnidentifiedImageError as exc:
        raise BadSampleError("unreadable", name, "not an image in a format Pillow can read") from exc
    except Exception as exc:  # a recognised format with a broken header
        raise BadSampleError("unreadable", name, f"{type(exc).__name__}: {exc}") from exc


def _load_failure_reason(exc: Exception) -> str:
    if isinstance(exc, Image.DecompressionBombError):
        return "decompression_bomb"
    if isinstance(exc, EOFError) or "truncated" in str(exc).lower():
        return "truncated"
    return "unreadable"


def _to_rgb(image: Image.Image) -> Image.Image:
    """Any Pillow mode → 8-bit ``RGB`` (see the module docstring for the rules)."""
    if image.mode in _WIDE_MODES:
        return Image.fromarray(_stretch_to_uint8(np.asarray(image)), mode="L").convert("RGB")
    if image.mode in _ALPHA_MODES or "transparency" in image.info:
        rgba = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, _WHITE), rgba).convert("RGB")
    return image.convert("RGB")


def _stretch_to_uint8(values: np.ndarray) -> np.ndarray:
    values = values.astype(np.float64)
    finite = np.isfinite(values)
    if not finite.any():
        return np.zeros(values.shape, np.uint8)
    lo, hi = values[finite].min(), values[finite].max()
    values = np.where(finite, values, lo)
    if hi <= lo:
        return np.clip(values, 0, 255).astype(np.uint8)
    return np.round((values - lo) * (255.0 / (hi - lo))).astype(np.uint8)


def _resize_center_crop(image: Image.Image, size: int) -> Image.Image:
    """Keep the largest centred square and resize it to ``size`` with Pillow's bicubic filter, as ml-4m's
    ``CenterCropImageAugmenter`` and its image transform prepare a photo (``fourm/data/image_augmenter.py``): the
    offsets are rounded down, the crop is whole pixels, and the resampling reads no pixel beyond the crop. So the
    teachers that resize this square again (``hf_clip``, ``hf_dinov2`` at 224 px) see what ml-4m's scripts saw."""
    width, height = image.size
    side = min(width, height)
    left, top = (width - side) // 2, (height - side) // 2
    square = image.crop((left, top, left + side, top + side))
    return square if side == size else square.resize((size, size), Image.Resampling.BICUBIC)
