"""The modality registry: what each modality is in memory and how it is stored in a shard.

A *sample* is a dict ``{modality_name: value}``; a modality a source lacks is simply not in the dict.
In-memory values (what sources produce and later stages consume):

=============  ==============================================  ==========================================
modality       in memory                                       in a shard (member ``<key>.<ext>``)
=============  ==============================================  ==========================================
rgb            uint8 ``[H, W, 3]``                             ``png`` (8-bit RGB)
depth          float32 ``[H, W]`` metres along the camera      ``png`` (16-bit, millimetres; 0 = invalid)
               axis, 0 where invalid (sky, no data)
normal         float32 ``[H, W, 3]`` unit vectors, camera      ``png`` (8-bit RGB of ``(n + 1) / 2``;
               frame (x right, y up, z towards the camera),    black = invalid)
               zero vector where invalid
semseg         uint8 ``[H, W]`` class ids of the dataset's     ``png`` (8-bit grey; 16-bit grey when an
               vocabulary; uint16 when one is above 255        id is above 255)
edge           uint8 ``[H, W]`` 0/1                            ``png`` (8-bit grey, 0/255)
det            str: boxes as ``v0=.. v1=.. v2=.. v3=.. name``  ``txt`` (UTF-8)
               (xmin ymin xmax ymax in ``COORD_BINS`` bins)
caption        str                                             ``txt`` (UTF-8)
canny_edge     uint8 ``[H, W]`` 0/1 (Canny on the photo)       ``png`` (8-bit grey, 0/255)
color_palette  str when read from a shard: ``v1=k v0=r       ``json`` (4M's palette JSON: a palette of
               v0=g v0=b ...``; 4M's JSON structure from a     each length 1..7)
               labeler
metadata       str when read from a shard: ``v1=<id>         ``json`` (4M's metadata JSON: raw numbers
               v0=<bin> ...``; the raw fields from a labeler   by field)
=============  ==============================================  ==========================================

The last three come from the label stage's labelers (:mod:`fourm_kfp.labelers`); their text forms are 4M-21's
(:mod:`fourm_kfp.data.label_formats`).

:data:`MODALITIES` is the one table of modalities: kind, in-memory channels, file extension and codec, tokenizer
kind (``vqvae`` per image modality, the shared ``wordpiece`` for text), the primary metric its tokenizer reports,
and the family of metrics and baseline the evaluate stage scores it with as a generated target (``scoring``). The
other per-modality registries (tokenizer codecs and metrics in :mod:`fourm_kfp.tokenizers`, visualisers in
:mod:`fourm_kfp.data.modality_visuals`, pretokenized names in :mod:`fourm_kfp.data.pretokenized`) follow it, and a
test checks that every modality is fully described. Everything is looked up by name
(``MODALITIES["depth"].encode(x)``), so stages treat modalities as data rather than ``if`` chains.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
from PIL import Image

from fourm_kfp.data.label_formats import decode_metadata, decode_palette, encode_metadata, encode_palette

#: Semantic classes of the synthetic scenes (index = class id in ``semseg``): the semseg vocabulary of a dataset that
#: names none (a dataset's own is data: :mod:`fourm_kfp.data.vocabularies`).
CLASS_NAMES: tuple[str, ...] = ("background", "ground", "sphere", "cube", "cylinder", "cone")
#: Object classes that appear in the synthetic scenes' ``det`` and captions (the default det vocabulary).
OBJECT_CLASSES: tuple[str, ...] = CLASS_NAMES[2:]
#: Box coordinates are quantised to this many bins (tokens ``v0=0`` .. ``v3=999``).
COORD_BINS = 1000
#: Depth is stored in millimetres in a 16-bit PNG, so this is the largest depth a shard can hold.
MAX_DEPTH_M = 65.535
#: semseg is stored as a 16-bit PNG at most, so a vocabulary has at most this many classes (ids 0..65535).
MAX_SEMSEG_CLASSES = 65536


@dataclass(frozen=True)
class Modality:
    """One modality: its kind, its file extension in shards, and its byte codec."""

    name: str
    kind: str  # "image" (a pixel grid, tokenized by a VQ-VAE) or "sequence" (text, tokenized by WordPiece)
    ext: str
    encode: Callable[[Any], bytes]
    decode: Callable[[bytes], Any]
    channels: int  # in-memory channels of an image modality (1 = [H, W]); 0 for text
    tokenizer: str  # "vqvae" (one per modality) or "wordpiece" (shared by the sequence modalities)
    metric: str  # primary error metric of its tokenizer ("mse", "abs_rel", ...; lower is better)
    #: how the evaluate stage scores it as a generated target (an ``rgb-to-<name>`` task): the scorer family in
    #: :data:`fourm_kfp.evaluation.targets.SCORERS` (its metrics and trivial baseline); "" = not a task's target
    scoring: str = ""
    #: a camera picture: a user's file of it (``fourm-kfp generate --from``) may be any image format PIL reads, and
    #: is converted to RGB and resized to the model's image size; a file of any other image modality must be in its
    #: shard format (``ext``, ``decode``) at the model's size
    camera_image: bool = False


def _png_bytes(array: np.ndarray, mode: str | None = None) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array, mode=mode).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def _png_array(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im)


def _check(array: Any, name: str, ndim: int, channels: int | None = None) -> np.ndarray:
    array = np.asarray(array)
    if array.ndim != ndim or (channels is not None and array.shape[-1] != channels):
        want = f"[H, W, {channels}]" if channels else "[H, W]"
        raise ValueError(f"modality {name!r}: expected an array of shape {want}, got {array.shape}")
    return array


def encode_rgb(rgb: np.ndarray) -> bytes:
    return _png_bytes(_check(rgb, "rgb", 3, 3).astype(np.uint8, copy=False))


def decode_rgb(data: bytes) -> np.ndarray:
    return _png_array(data)[..., :3]


def encode_depth(depth: np.ndarray) -> bytes:
    depth = _check(depth, "depth", 2).astype(np.float32, copy=False)
    mm = np.clip(np.round(np.nan_to_num(depth, nan=0.0) * 1000.0), 0, 65535).astype(np.uint16)
    return _png_bytes(mm)


def decode_depth(data: bytes) -> np.ndarray:
    return _png_array(data).astype(np.float32) / 1000.0


def encode_normal(normal: np.ndarray) -> bytes:
    normal = _check(normal, "normal", 3, 3).astype(np.float32, copy=False)
    valid = np.any(normal != 0, axis=-1, keepdims=True)
    # Valid normals map to 1..255 per channel so that pure black stays reserved for "invalid".
    pixels = np.clip(np.round((normal + 1.0) * 127.0) + 1, 1, 255)
    return _png_bytes(np.where(valid, pixels, 0).astype(np.uint8))


def decode_normal(data: bytes) -> np.ndarray:
    pixels = _png_array(data)[..., :3].astype(np.float32)
    valid = np.any(pixels != 0, axis=-1, keepdims=True)
    normal = (pixels - 1.0) / 127.0 - 1.0
    norm = np.linalg.norm(normal, axis=-1, keepdims=True)
    return np.where(valid, normal / np.maximum(norm, 1e-6), 0.0).astype(np.float32)


def class_id_dtype(num_classes: int) -> type[np.unsignedinteger]:
    """The dtype of the ids of ``num_classes`` classes: uint8 up to 256 classes, else uint16."""
    if not 0 < num_classes <= MAX_SEMSEG_CLASSES:
        raise ValueError(f"modality 'semseg': {num_classes} classes; a shard holds 1 to {MAX_SEMSEG_CLASSES}")
    return np.uint8 if num_classes <= 256 else np.uint16


def encode_semseg(classes: np.ndarray) -> bytes:
    """An 8-bit grey PNG when every id is at most 255, else a 16-bit one (ids up to 65535, stored exactly)."""
    ids = _check(classes, "semseg", 2)
    low, high = (int(ids.min()), int(ids.max())) if ids.size else (0, 0)
    if low < 0 or high >= MAX_SEMSEG_CLASSES:
        raise ValueError(f"modality 'semseg': class ids {low}..{high} outside 0..{MAX_SEMSEG_CLASSES - 1}")
    return _png_bytes(ids.astype(class_id_dtype(high + 1), copy=False))


def decode_semseg(data: bytes) -> np.ndarray:
    """Class ids: uint8 from an 8-bit PNG, uint16 from a 16-bit one."""
    ids = _png_array(data)
    return ids.astype(np.uint8 if ids.dtype == np.uint8 else np.uint16)


def encode_edge(edges: np.ndarray) -> bytes:
    return _png_bytes((_check(edges, "edge", 2) > 0).astype(np.uint8) * 255)


def decode_edge(data: bytes) -> np.ndarray:
    return (_png_array(data) > 127).astype(np.uint8)


def encode_text(text: str) -> bytes:
    if not isinstance(text, str):
        raise ValueError(f"text modality: expected str, got {type(text).__name__}")
    return text.encode("utf-8")


def decode_text(data: bytes) -> str:
    return data.decode("utf-8")


MODALITIES: dict[str, Modality] = {
    m.name: m
    for m in (
        Modality("rgb", "image", "png", encode_rgb, decode_rgb, 3, "vqvae", "mse", camera_image=True),
        Modality("depth", "image", "png", encode_depth, decode_depth, 1, "vqvae", "abs_rel", scoring="depth"),
        Modality("normal", "image", "png", encode_normal, decode_normal, 3, "vqvae", "angle_deg", scoring="normal"),
        Modality("semseg", "image", "png", encode_semseg, decode_semseg, 1, "vqvae", "pixel_err", scoring="classes"),
        Modality("edge", "image", "png", encode_edge, decode_edge, 1, "vqvae", "pixel_err"),
        Modality("det", "sequence", "txt", encode_text, decode_text, 0, "wordpiece", "unknown_token_rate",
                 scoring="boxes"),
        Modality("caption", "sequence", "txt", encode_text, decode_text, 0, "wordpiece", "unknown_token_rate",
                 scoring="caption"),
        # The pseudo-labelled modalities of 4M-21 that the label stage makes from a photo (fourm_kfp.labelers).
        Modality("canny_edge", "image", "png", encode_edge, decode_edge, 1, "vqvae", "pixel_err", scoring="edges"),
        Modality("color_palette", "sequence", "json", encode_palette, decode_palette, 0, "wordpiece",
                 "unknown_token_rate", scoring="palette"),
        Modality("metadata", "sequence", "json", encode_metadata, decode_metadata, 0, "wordpiece",
                 "unknown_token_rate", scoring="metadata"),
    )
}

IMAGE_MODALITIES: tuple[str, ...] = tuple(n for n, m in MODALITIES.items() if m.kind == "image")
SEQUENCE_MODALITIES: tuple[str, ...] = tuple(n for n, m in MODALITIES.items() if m.kind == "sequence")


def get_modality(name: str) -> Modality:
    """The registered modality called ``name``; a clear error lists the known ones."""
    try:
        return MODALITIES[name]
    except KeyError:
        raise KeyError(f"unknown modality {name!r}; known modalities: {', '.join(MODALITIES)}") from None


def format_det(boxes: list[tuple[float, float, float, float]], names: list[str], width: int, height: int) -> str:
    """Boxes in pixels ``(xmin, ymin, xmax, ymax)`` → the det text ``v0=.. v1=.. v2=.. v3=.. name ...``."""
    binned = []
    for (x0, y0, x1, y1), name in zip(boxes, names, strict=True):
        q = [
            int(np.clip(np.floor(v / size * COORD_BINS), 0, COORD_BINS - 1))
            for v, size in ((x0, width), (y0, height), (x1, width), (y1, height))
        ]
        binned.append((tuple(q), name))
    return _det_text(binned)


def _det_text(boxes: list[tuple[tuple[int, ...], str]]) -> str:
    return " ".join(f"v0={q[0]} v1={q[1]} v2={q[2]} v3={q[3]} {name}" for q, name in boxes)


def well_formed_det(text: str, classes: Sequence[str] | None = None) -> str:
    """The boxes of generated det text that make a valid label, as det text ("" when none does): those
    :func:`parse_det` reads, with ``xmin <= xmax``, ``ymin <= ymax`` and, given a vocabulary, a name in it. What a
    generative teacher's det label is (the label stage's gate refuses anything else)."""
    vocabulary = None if classes is None else set(classes)
    return _det_text([(q, name) for q, name in parse_det(text) if q[0] <= q[2] and q[1] <= q[3]
                      and (vocabulary is None or name in vocabulary)])


def parse_det(text: str) -> list[tuple[tuple[int, int, int, int], str]]:
    """Inverse of :func:`format_det` (coordinates stay in bins).

    Generated det text need not be well formed, so this reads it the way a scorer must: a box is four
    consecutive tokens ``v0=<bin> v1=<bin> v2=<bin> v3=<bin>`` with bins in ``[0, COORD_BINS)`` followed by a
    name that is not itself a coordinate; anything else (a token like ``v2=67iu``, a missing name, a box cut
    short) is skipped and reading resumes at the next token.
    """
    tokens = text.split()
    boxes = []
    i = 0
    while i + 4 < len(tokens):
        coords = [_coordinate_bin(tokens[i + k], k) for k in range(4)]
        name = tokens[i + 4]
        if None in coords or _DET_COORD.fullmatch(name):
            i += 1
            continue
        boxes.append((tuple(coords), name))
        i += 5
    return boxes


_DET_COORD = re.compile(r"v([0-3])=(\d+)")


def _coordinate_bin(token: str, position: int) -> int | None:
    """The bin of a ``v<position>=<bin>`` token, or None when the token is not one."""
    match = _DET_COORD.fullmatch(token)
    if match is None or int(match.group(1)) != position or int(match.group(2)) >= COORD_BINS:
        return None
    return int(match.group(2))
