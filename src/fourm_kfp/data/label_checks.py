"""The data gate's value checks: is a label a valid value of its modality?

:func:`check_value` returns ``None`` for a valid value, else the reason in words; the label stage fails naming the
shard, the key and the modality. What is checked, per modality (the in-memory forms of
:mod:`fourm_kfp.data.modalities`):

=================  ============================================================================================
depth              a finite float map of the image's size; metric depth within ``[0, max_depth_m]`` (0 =
                   invalid), at most ``max_invalid_fraction`` invalid pixels; a relative depth (standardised per
                   image) is only checked for finite values
normal             ``[H, W, 3]``, every valid vector of unit length (within 2%), at most ``max_invalid_fraction``
                   zero vectors
semseg             integer ids inside the class vocabulary (when the labeler has one), at most 65535
edge, canny_edge   a binary map (0/1)
det                boxes ``v0=xmin v1=ymin v2=xmax v3=ymax name`` and nothing else, each bin inside the image
                   (``0..COORD_BINS-1``), ``xmin <= xmax`` and ``ymin <= ymax``, each name in the class vocabulary
                   (when the labeler has one); not empty (a labeler without boxes for an image returns None)
caption, …         a non-empty string (a sequence modality)
color_palette      1 to 7 colours per length, three channels in 0..255
clip, dinov2       a finite float feature map (no image-size check: its shape is ``[grid, grid, channels]`` of the
                   labeler's modality settings, both of which it must report)
=================  ============================================================================================

Any other image modality must also have the prepared images' size
(:meth:`~fourm_kfp.data.modalities.Modality.shape`). The check of a modality is named by its record (``check``, a
key of :data:`CHECKS`); an image modality without one passes the shape check only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from fourm_kfp.data.modalities import COORD_BINS, MAX_FEATURE_MAGNITUDE, MAX_SEMSEG_CLASSES, MODALITIES


@dataclass(frozen=True)
class CheckSettings:
    """The gate's thresholds (the ``label`` config section's)."""

    image_size: int
    max_invalid_fraction: float = 0.5
    max_depth_m: float = 1000.0
    relative_depth: bool = False
    classes: Sequence[str] | None = None
    #: the labeler's settings of its modality (:attr:`fourm_kfp.labelers.base.Labeler.modality_settings`: a
    #: feature map's ``channels`` and ``grid``), as the dataset's ``modality_settings`` will record them
    modality_settings: Mapping[str, Any] = field(default_factory=dict)


def _shape(value: Any, modality: str, settings: CheckSettings) -> str | None:
    """The shape of an image-size map; a grid-sized one's (a feature map) is its own check's."""
    spec = MODALITIES[modality]
    if spec.grid_sized:
        return None
    array = np.asarray(value)
    want = spec.shape(settings.image_size)
    if array.shape != want:
        return f"shape {array.shape}, expected {want}"
    return None


def _depth(value: Any, settings: CheckSettings) -> str | None:
    depth = np.asarray(value, np.float64)
    if not np.isfinite(depth).all():
        return "non-finite depth values"
    if settings.relative_depth:
        return None
    if depth.min() < 0 or depth.max() > settings.max_depth_m:
        return f"depth outside [0, {settings.max_depth_m}] m (min {depth.min():.3g}, max {depth.max():.3g})"
    invalid = float((depth == 0).mean())
    if invalid > settings.max_invalid_fraction:
        return f"{invalid:.0%} of the depth pixels are invalid (0), more than {settings.max_invalid_fraction:.0%}"
    return None


def _normal(value: Any, settings: CheckSettings) -> str | None:
    normal = np.asarray(value, np.float64)
    if not np.isfinite(normal).all():
        return "non-finite normal vectors"
    norm = np.linalg.norm(normal, axis=-1)
    valid = norm > 0
    invalid = 1.0 - float(valid.mean())
    if invalid > settings.max_invalid_fraction:
        return f"{invalid:.0%} of the normals are zero (invalid), more than {settings.max_invalid_fraction:.0%}"
    if valid.any() and np.abs(norm[valid] - 1.0).max() > 0.02:
        return f"normals are not unit vectors (lengths {norm[valid].min():.3f}..{norm[valid].max():.3f})"
    return None


def _semseg(value: Any, settings: CheckSettings) -> str | None:
    ids = np.asarray(value)
    if not np.issubdtype(ids.dtype, np.integer):
        return f"class ids of dtype {ids.dtype}, expected integers"
    if settings.classes is not None and ids.size and (ids.min() < 0 or ids.max() >= len(settings.classes)):
        return (f"class ids {int(ids.min())}..{int(ids.max())} outside the vocabulary of {len(settings.classes)} "
                "classes")
    if ids.size and (ids.min() < 0 or ids.max() >= MAX_SEMSEG_CLASSES):
        return f"class ids {int(ids.min())}..{int(ids.max())} outside 0..{MAX_SEMSEG_CLASSES - 1} (a 16-bit PNG)"
    return None


def _binary(value: Any, settings: CheckSettings) -> str | None:
    values = np.unique(np.asarray(value))
    if not set(values.tolist()) <= {0, 1}:
        return f"values {values[:5].tolist()} in a binary map (expected 0 and 1)"
    return None


def _palette(value: Any, settings: CheckSettings) -> str | None:
    if not (isinstance(value, list) and len(value) == 1 and isinstance(value[0], dict) and value[0]):
        return "not 4M's palette JSON (a list holding one mapping of length -> colours)"
    for length, colours in value[0].items():
        if not (str(length).isdigit() and 1 <= int(length) <= 7):
            return f"palette length {length!r} outside 1..7"
        array = np.asarray(colours)
        if array.shape != (int(length), 3):
            return f"palette of length {length} has shape {array.shape}, expected ({length}, 3)"
        if array.min() < 0 or array.max() > 255:
            return f"palette of length {length} has channels outside 0..255"
    return None


def _det(value: Any, settings: CheckSettings) -> str | None:
    if not isinstance(value, str):
        return f"a {type(value).__name__}, expected the det text"
    tokens = value.split()
    if not tokens:
        return "an empty text"
    if len(tokens) % 5:
        return f"{len(tokens)} tokens, not whole boxes of five (v0=.. v1=.. v2=.. v3=.. name)"
    for i in range(0, len(tokens), 5):
        box, name = tokens[i:i + 4], tokens[i + 4]
        bins = []
        for position, token in enumerate(box):
            tag, _, number = token.partition("=")
            if tag != f"v{position}" or not number.isdigit():
                return f"box {i // 5}: {' '.join(box)!r} is not v0=<bin> v1=<bin> v2=<bin> v3=<bin>"
            bins.append(int(number))
        if max(bins) >= COORD_BINS:
            return f"box {i // 5} ({name}): bins {bins} outside the image (0..{COORD_BINS - 1})"
        if bins[0] > bins[2] or bins[1] > bins[3]:
            return f"box {i // 5} ({name}): bins {bins} have xmin > xmax or ymin > ymax"
        if "=" in name:
            return f"box {i // 5}: a coordinate {name!r} where the class name belongs"
        if settings.classes is not None and name not in settings.classes:
            return f"box {i // 5}: class {name!r} is not in the labeler's vocabulary of {len(settings.classes)} classes"
    return None


def _features(value: Any, modality: str, settings: CheckSettings) -> str | None:
    """A feature map: ``[grid, grid, channels]`` of the labeler's settings, finite (float16-storable)."""
    array = np.asarray(value)
    want = MODALITIES[modality].shape(settings.image_size, settings.modality_settings)
    if 0 in want:
        return (f"the labeler reports no channels and grid of its {modality} feature map (its modality_settings "
                f"give {dict(settings.modality_settings)}): they size the tokenizer")
    if array.shape != want:
        return f"shape {array.shape}, expected [grid, grid, channels] = {want} (the labeler's modality settings)"
    if not np.issubdtype(array.dtype, np.floating):
        return f"features of dtype {array.dtype}, expected floats"
    if not np.isfinite(array).all():
        return "non-finite feature values"
    if np.abs(array).max(initial=0.0) > MAX_FEATURE_MAGNITUDE:
        return f"feature values beyond +-{MAX_FEATURE_MAGNITUDE:g} (a shard stores float16)"
    return None


def _text(value: Any, settings: CheckSettings) -> str | None:
    if isinstance(value, (dict, list)):  # a structured sequence value (metadata), encoded to text by its codec
        return None if value else "an empty value"
    if not isinstance(value, str) or not value.strip():
        return "an empty text"
    return None


#: A value check: ``(value, modality, settings)`` → None, or the problem in words.
Check = Callable[[Any, str, CheckSettings], "str | None"]


def _plain(check: Callable[[Any, CheckSettings], str | None]) -> Check:
    """A check that needs no modality name."""
    return lambda value, modality, settings: check(value, settings)


#: The value checks a modality record names (``check``), on top of an image modality's shape check.
CHECKS: dict[str, Check] = {
    "depth": _plain(_depth),
    "normal": _plain(_normal),
    "semseg": _plain(_semseg),
    "binary": _plain(_binary),
    "palette": _plain(_palette),
    "det": _plain(_det),
    "text": _plain(_text),
    "features": _features,
}


def check_value(modality: str, value: Any, settings: CheckSettings) -> str | None:
    """``None`` when ``value`` is a valid ``modality`` value, else why not (see the module docstring)."""
    spec = MODALITIES[modality]
    if spec.kind == "image":
        problem = _shape(value, modality, settings)
        if problem:
            return problem
    return CHECKS[spec.check](value, modality, settings) if spec.check else None
