"""The pretokenized dataset: what the ``pretokenize`` stage writes and the token loader reads.

Same shard layout as the prepared data (:mod:`.shard_writer`): ``<split>/<name>/shard-NNNNNN.tar``, one tar per
modality and shard index, the same sample keys in the same order in every modality (a sample lacking a modality
has no member there), plus the per-shard key index the shard writer keeps. Each sample was cut into ``n_crops``
aligned crops (crop 0 is the full view); every member holds all crops of one sample:

==============  ===========================  ======================================================
name            member ``<key>.<ext>``       content
==============  ===========================  ======================================================
``tok_<m>``     ``npy``                      ``[n_crops, h, w]`` token grid of image modality ``m``
                                             (smallest unsigned dtype holding the codebook)
``rgb``         ``npy``                      ``[n_crops, H, W, 3]`` uint8 pixels of each crop (pixel-
                                             patch input, evaluation)
``caption``     ``txt``                      the caption (the same for every crop); likewise every
                                             other sequence modality but det (``color_palette``,
                                             ``metadata``: 4M-21's token text, whole-image statistics)
``det``         ``json``                     list of ``n_crops`` det strings, boxes in crop coordinates
``crop``        ``json``                     list of ``n_crops`` ``{"x0", "y0", "width", "height",
                                             "flip"}`` in source pixels
==============  ===========================  ======================================================

Text is kept as text: the trainer tokenizes it itself (span masking needs the token sequence). The output root
holds ``pretokenized.json``: ``{"n_crops", "image_size", "tokenizers_uri", "modalities": {name: {"vocab_size",
"grid", "dtype"}}, "text": {"vocab_size", ...}, "splits": {split: samples}}``.
"""

from __future__ import annotations

import functools
import io
import json
import re
from typing import Any

import numpy as np

from fourm_kfp.data.modalities import MODALITIES, SEQUENCE_MODALITIES

INDEX_FILE = "pretokenized.json"
CROP = "crop"
TOKEN_PREFIX = "tok_"


def token_name(modality: str) -> str:
    """``"depth"`` → ``"tok_depth"``."""
    return f"{TOKEN_PREFIX}{modality}"


def source_modality(name: str) -> str:
    """``"tok_depth"`` → ``"depth"``; other names are returned as they are."""
    return name[len(TOKEN_PREFIX):] if name.startswith(TOKEN_PREFIX) else name


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned integer dtype that holds ids ``0 .. vocab_size - 1``."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if vocab_size - 1 <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    raise ValueError(f"vocabulary of {vocab_size} does not fit in 32 bits")


def member_ext(name: str) -> str:
    """The member extension of a pretokenized modality (see the table above)."""
    if name.startswith(TOKEN_PREFIX) or name == "rgb":
        return "npy"
    if name == CROP:
        return "json"
    if name in SEQUENCE_MODALITIES:  # a text a crop changes (det's boxes) is kept per crop
        return "txt" if MODALITIES[name].crop == "keep" else "json"
    raise KeyError(f"unknown pretokenized modality {name!r}")


@functools.lru_cache(maxsize=256)
def _npy_header(descr: str, shape: tuple[int, ...]) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def encode_npy(array: np.ndarray) -> bytes:
    """The bytes ``np.save`` writes for ``array`` (C order), its header cached per dtype and shape: the pretokenize
    writer encodes six arrays per sample, and ``np.save`` spends ~20 µs building each header."""
    array = np.ascontiguousarray(array)
    if array.dtype.hasobject:
        raise ValueError("an .npy member cannot hold Python objects")
    return _npy_header(np.lib.format.dtype_to_descr(array.dtype), array.shape) + array.tobytes()


def encode_member(name: str, value: Any) -> bytes:
    ext = member_ext(name)
    if ext == "npy":
        return encode_npy(value)
    if ext == "json":
        return json.dumps(value, separators=(",", ":")).encode("utf-8")
    return value.encode("utf-8")


#: The header ``np.save`` writes for a C-ordered array of a plain dtype (format 1.0).
_NPY_HEADER = re.compile(rb"\{'descr': '([<>|][a-z]\d+)', 'fortran_order': False, 'shape': \(([\d, ]*)\), \}\s*\n")


def decode_npy(data: bytes) -> np.ndarray:
    """An ``.npy`` member. The loader reads thousands per second: the header ``np.save`` writes (format 1.0, C
    order, a plain dtype) is matched directly instead of ``np.load``'s ``ast``-based parse (a fifth of a loader
    worker's time); anything else goes to ``np.load``."""
    match = _NPY_HEADER.match(data, 10) if data[:8] == b"\x93NUMPY\x01\x00" else None
    if match is None or match.end() != 10 + int.from_bytes(data[8:10], "little"):
        return np.load(io.BytesIO(data), allow_pickle=False)
    shape = tuple(int(n) for n in match.group(2).split(b",") if n.strip())
    return np.frombuffer(data, np.dtype(match.group(1).decode()), offset=match.end()).reshape(shape).copy()


def decode_member(name: str, data: bytes) -> Any:
    ext = member_ext(name)
    if ext == "npy":
        return decode_npy(data)
    if ext == "json":
        return json.loads(data)
    return data.decode("utf-8")
