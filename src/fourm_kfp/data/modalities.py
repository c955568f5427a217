"""The modality table: one record per modality, what it is in memory, how it is stored in a shard, and how every
later layer treats it.

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
clip, dinov2   float32 ``[grid, grid, channels]``: a teacher   ``npy`` (float16, :func:`encode_feature_map`)
               network's patch features (4M-21's
               ``tok_clip``, ``tok_dinov2``); ``grid`` is the
               teacher's token grid, not the image size
=============  ==============================================  ==========================================

The modalities after ``metadata`` come from the label stage's labelers (:mod:`fourm_kfp.labelers`); the text forms
of ``color_palette`` and ``metadata`` are 4M-21's (:mod:`fourm_kfp.data.label_formats`). A feature map's
``channels`` and ``grid`` are the dataset's modality settings (:mod:`fourm_kfp.data.vocabularies`), which the
labeler that made it reports.

:data:`MODALITIES` is the one table of modalities. A :class:`Modality` record holds everything a modality is:

* on this floor: its kind, in-memory channels and shape (:meth:`Modality.shape`), shard extension and codec, how an
  aligned crop transforms it (``crop``, a rule of :data:`fourm_kfp.data.crops.CROP_RULES`), whether its values are
  ids or flags (``discrete``: never interpolated), the dataset settings it takes (``settings``, with their
  defaults), the data gate's value check (``check``, :data:`fourm_kfp.data.label_checks.CHECKS`) and its
  visualiser (``visual``, :data:`fourm_kfp.data.modality_visuals.VISUALIZERS`);
* for the floors above, which hold the code, the *name* of its family there, resolved where it is used (so no
  import runs up a floor): the tokenizer (``tokenizer``: ``vqvae`` per image modality, the shared ``wordpiece`` for
  text), an image tokenizer's codec (``codec``, :data:`fourm_kfp.tokenizers.modality_codecs.CODECS`), its error
  metrics and trivial baseline (``errors``, :data:`fourm_kfp.tokenizers.metrics.ERROR_FAMILIES`) and the primary
  one (``metric``), the train-tokenizers settings it needs beneath a preset's ``per_modality``
  (``tokenizer_defaults``), the evaluate stage's scorer family (``scoring``,
  :data:`fourm_kfp.evaluation.targets.SCORERS`), and its token domain in apple/ml-4m's format (``ml4m``, read by
  :mod:`fourm_kfp.model.ml4m`; None where ml-4m has none).

``tests/data/test_modality_table.py`` checks that every record is complete: each name resolves in its family table
and each consumer reaches every modality. Everything is looked up by name (``MODALITIES["depth"].encode(x)``), so
stages treat modalities as data rather than ``if`` chains: a modality coded, checked, drawn and scored like an
existing one is one record here.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

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
class Ml4mDomain:
    """A modality's token domain in apple/ml-4m's format (its ``fourm/data/modality_info.py`` entry): the name, the
    vocabulary, an image domain's token grid at 224 px, a text domain's longest text."""

    name: str
    vocab_size: int
    grid: tuple[int, int] = (14, 14)  # image: 224 px in 16-px patches (DINOv2's 14-px patches: 16 x 16)
    max_length: int = 0  # sequence: the longest text its embeddings take (ml-4m's ``max_length``)


@dataclass(frozen=True)
class Modality:
    """One modality: everything it is, in one record (see the module docstring for each field's family table)."""

    name: str
    kind: str  # "image" (a grid, tokenized by a VQ-VAE) or "sequence" (text, tokenized by WordPiece)
    ext: str
    encode: Callable[[Any], bytes]
    decode: Callable[[bytes], Any]
    channels: int  # in-memory channels of an image modality (1 = [H, W]; 0: its ``channels`` setting); 0 for text
    tokenizer: str  # "vqvae" (one per modality) or "wordpiece" (shared by the sequence modalities)
    metric: str  # primary error metric of its tokenizer ("mse", "abs_rel", ...; lower is better)
    #: how the evaluate stage scores it as a generated target (an ``rgb-to-<name>`` task): the scorer family in
    #: :data:`fourm_kfp.evaluation.targets.SCORERS` (its metrics and trivial baseline); "" = not a task's target
    scoring: str = ""
    #: a camera picture: a user's file of it (``fourm-kfp generate --from``) may be any image format PIL reads, and
    #: is converted to RGB and resized to the model's image size; a file of any other image modality must be in its
    #: shard format (``ext``, ``decode``) at its tokenizer's size
    camera_image: bool = False
    #: the data gate's value check (:data:`fourm_kfp.data.label_checks.CHECKS`) on top of an image modality's shape
    #: check; "" = the shape check only
    check: str = ""
    #: its visualiser (:data:`fourm_kfp.data.modality_visuals.VISUALIZERS`)
    visual: str = ""
    #: how an aligned crop transforms it (:data:`fourm_kfp.data.crops.CROP_RULES`)
    crop: str = "keep"
    #: values are class ids or flags: resized by nearest neighbour only, never blended
    discrete: bool = False
    #: an image tokenizer's codec family (:data:`fourm_kfp.tokenizers.modality_codecs.CODECS`)
    codec: str = ""
    #: an image tokenizer's error metrics and trivial baseline (:data:`fourm_kfp.tokenizers.metrics.ERROR_FAMILIES`)
    errors: str = ""
    #: train-tokenizers settings (``ImageTokenizerConfig`` fields) this modality needs, over the preset's shared
    #: ``image`` section and beneath its ``per_modality`` entry (a feature map: a ViT over patches of one cell)
    tokenizer_defaults: Mapping[str, Any] = field(default_factory=dict, hash=False)
    #: the dataset modality settings it takes, with their defaults (``dataset_meta.json``,
    #: :mod:`fourm_kfp.data.vocabularies`)
    settings: Mapping[str, Any] = field(default_factory=dict, hash=False)
    #: its side is the dataset's ``grid`` setting (a teacher's token grid) and its channels the ``channels``
    #: setting, not the prepared image's size
    grid_sized: bool = False
    #: its token domain in ml-4m's format; None: ml-4m has none (a model holding it is not exported to ml-4m, and an
    #: ml-4m model cannot give it)
    ml4m: Ml4mDomain | None = None

    def shape(self, image_size: int, settings: Mapping[str, Any] | None = None) -> tuple[int, ...]:
        """The in-memory shape of a value of this image modality: ``[S, S]`` or ``[S, S, C]`` for a map of the
        prepared images' size ``S``; ``[grid, grid, channels]`` of its ``settings`` (the dataset's, defaults filled
        in for those not given; 0 where unknown) for a grid-sized one."""
        if self.kind != "image":
            raise ValueError(f"modality {self.name!r} is a {self.kind} modality: it has no array shape")
        given = {**self.settings, **(settings or {})}
        side = int(given["grid"]) if self.grid_sized else image_size
        channels = int(given["channels"]) if self.grid_sized else self.channels
        return (side, side) + ((channels,) if self.grid_sized or channels > 1 else ())


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
        want = f"[H, W, {channels}]" if channels else "[H, W]" if ndim == 2 else "[H, W, C]"
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


#: The largest magnitude a feature map's shard member holds (float16's largest finite value).
MAX_FEATURE_MAGNITUDE = float(np.finfo(np.float16).max)


def encode_feature_map(features: np.ndarray) -> bytes:
    """A feature map ``[grid, grid, channels]`` as an ``.npy`` of float16 (format 1.0, C order: the same array
    gives the same bytes). float16 keeps 11 significant bits: each value is stored to within a relative 2^-11
    (about 0.05%; values below 6e-5 in magnitude lose relative precision, those below 3e-8 become 0), which moves a
    feature vector's cosine to the original by less than 1e-6. A non-finite value, or one beyond float16's range
    (65504), is refused rather than stored as infinity."""
    features = _check(features, "feature map", 3).astype(np.float32, copy=False)
    if not np.isfinite(features).all() or np.abs(features).max(initial=0.0) > MAX_FEATURE_MAGNITUDE:
        raise ValueError(f"feature map: values must be finite and within +-{MAX_FEATURE_MAGNITUDE:g} (float16)")
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.ascontiguousarray(features.astype(np.float16)), version=(1, 0),
                              allow_pickle=False)
    return buf.getvalue()


def decode_feature_map(data: bytes) -> np.ndarray:
    """The float32 ``[grid, grid, channels]`` map of :func:`encode_feature_map`'s bytes."""
    return np.lib.format.read_array(io.BytesIO(data), allow_pickle=False).astype(np.float32)


def feature_map(name: str, ml4m: Ml4mDomain | None = None) -> Modality:
    """A teacher network's patch features (4M-21's feature-map modalities): a grid-sized float map, tokenized by a
    VQ-VAE over cells (a ViT, patch 1: ml-4m's feature tokenizers), scored by cosine similarity. ``ml4m``: its
    domain in ml-4m's format, if ml-4m has one (a feature map it lacks, SigLIP's say, has none: such a model is
    not exported to ml-4m)."""
    return Modality(name, "image", "npy", encode_feature_map, decode_feature_map, 0, "vqvae", "mse",
                    scoring="features", check="features", visual="features", crop="grid", codec="features",
                    errors="features", tokenizer_defaults={"architecture": "vit", "patch_size": 1},
                    settings={"channels": 0, "grid": 0}, grid_sized=True, ml4m=ml4m)


_TEXT_VOCABULARY = 30000  # ml-4m's shared WordPiece vocabulary

MODALITIES: dict[str, Modality] = {
    m.name: m
    for m in (
        Modality("rgb", "image", "png", encode_rgb, decode_rgb, 3, "vqvae", "mse", camera_image=True,
                 visual="rgb", crop="camera", codec="rgb", errors="rgb", ml4m=Ml4mDomain("tok_rgb@224", 16384)),
        Modality("depth", "image", "png", encode_depth, decode_depth, 1, "vqvae", "abs_rel", scoring="depth",
                 check="depth", visual="depth", crop="nearest", codec="depth", errors="depth",
                 settings={"relative": False}, ml4m=Ml4mDomain("tok_depth@224", 8192)),
        Modality("normal", "image", "png", encode_normal, decode_normal, 3, "vqvae", "angle_deg", scoring="normal",
                 check="normal", visual="normal", crop="normal", codec="normal", errors="normal",
                 ml4m=Ml4mDomain("tok_normal@224", 8192)),
        Modality("semseg", "image", "png", encode_semseg, decode_semseg, 1, "vqvae", "pixel_err", scoring="classes",
                 check="semseg", visual="semseg", crop="nearest", discrete=True, codec="semseg", errors="classes",
                 ml4m=Ml4mDomain("tok_semseg@224", 4096)),
        # occlusion boundaries and creases, exchanged as ml-4m's instance boundaries (SAM edges)
        Modality("edge", "image", "png", encode_edge, decode_edge, 1, "vqvae", "pixel_err", check="binary",
                 visual="edge", crop="nearest", discrete=True, codec="edge", errors="binary",
                 ml4m=Ml4mDomain("tok_sam_edge@224", 8192)),
        Modality("det", "sequence", "txt", encode_text, decode_text, 0, "wordpiece", "unknown_token_rate",
                 scoring="boxes", check="det", visual="det", crop="boxes",
                 ml4m=Ml4mDomain("det", _TEXT_VOCABULARY, max_length=256)),
        Modality("caption", "sequence", "txt", encode_text, decode_text, 0, "wordpiece", "unknown_token_rate",
                 scoring="caption", check="text", visual="caption",
                 ml4m=Ml4mDomain("caption", _TEXT_VOCABULARY, max_length=256)),
        # The pseudo-labelled modalities of 4M-21 that the label stage makes from a photo (fourm_kfp.labelers).
        Modality("canny_edge", "image", "png", encode_edge, decode_edge, 1, "vqvae", "pixel_err", scoring="edges",
                 check="binary", visual="edge", crop="nearest", discrete=True, codec="edge", errors="binary",
                 ml4m=Ml4mDomain("tok_canny_edge@224", 8192)),
        Modality("color_palette", "sequence", "json", encode_palette, decode_palette, 0, "wordpiece",
                 "unknown_token_rate", scoring="palette", check="palette", visual="palette",
                 ml4m=Ml4mDomain("color_palette", _TEXT_VOCABULARY, max_length=23)),
        Modality("metadata", "sequence", "json", encode_metadata, decode_metadata, 0, "wordpiece",
                 "unknown_token_rate", scoring="metadata", check="text", visual="metadata",
                 ml4m=Ml4mDomain("metadata", _TEXT_VOCABULARY, max_length=40)),
        # CLIP-B/16's ``ln_post(patch tokens) @ proj`` (512 channels, 14 x 14 at 224 px) and DINOv2-B/14's patch
        # tokens (768 channels, 16 x 16 at 224 px), or whatever teacher a labeler runs (its channels and grid)
        feature_map("clip", Ml4mDomain("tok_clip@224", 8192)),
        feature_map("dinov2", Ml4mDomain("tok_dinov2@224", 8192, grid=(16, 16))),
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
