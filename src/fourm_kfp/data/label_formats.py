"""4M-21's text formats of two pseudo-labelled sequence modalities: ``color_palette`` and ``metadata``.

Both are stored in a shard as JSON (what a labeler returns, 4M's own JSON) and turned into text for the shared
WordPiece tokenizer when read, as 4M's ``ColorPaletteTransform`` and ``MetadataTransform`` do
(``fourm/data/modality_transforms.py`` of apple/ml-4m). The text uses the tokenizer's added tokens ``v0=<n>`` and
``v1=<n>`` (``n`` < 1000), each one token id.

=============  ====================================================  ============================================
modality       stored (``json``)                                     text (what the tokenizer sees)
=============  ====================================================  ============================================
color_palette  ``[{"1": [[r, g, b]], "2": [[r, g, b], [r, g, b]],``  ``v1=<k> v0=<r> v0=<g> v0=<b> ...``: one
               ``..., "7": [7 colours]}]`` (ints 0..255): a palette  palette of ``k`` colours (``3 k`` ``v0=``
               of each length (4M's palette JSON)                    tokens)
metadata       ``{"brightness": 131.7, "original_width": 640, ...}``  ``v1=<field id> v0=<bin> ...``, fields in
               raw numbers by field (4M's metadata JSON)             the order of their ids
=============  ====================================================  ============================================

**Palette length.** 4M draws ``k`` uniformly from 1..7 each time a sample is loaded. We read shards
deterministically, so :func:`decode_palette` picks ``k`` from the stored bytes instead:
``lengths[zlib.crc32(data) % len(lengths)]`` over the sorted lengths the JSON holds, which for a full palette is
``1 + crc32(data) % 7``. The length is the same on every read of a sample and spread evenly over samples.

**Metadata fields.** :data:`METADATA_FIELDS` holds the image statistics of 4M-21 with 4M's ids (its
``metadata_id_map``) and 4M's quantisation, unchanged: the original width and height in steps of 32 px
(``value // 32``) and the caption's character, word and sentence counts, each clipped to 0..999; colourfulness,
brightness, contrast, saturation and entropy clipped to their range ``[vmin, vmax]`` and binned into 50 bins as
``int((value - vmin) / (vmax - vmin) * 49)``. 4M shuffles the fields each time a sample is loaded; we keep them in
the fixed order of their ids, so a sample always reads as the same text.

**Text given to the codecs.** :meth:`Modality.decode` of a sequence modality returns its text, so a stage that
decodes a sample and encodes it again hands the encoder text. Both encoders therefore accept the text form too, and
store it so that it decodes to the same text: palette text becomes a palette of that one length; metadata text,
whose bins cannot be turned back into raw numbers, is stored as ``{"bins": {field: bin, ...}}`` (``bins`` is no
field's name, so the two stored forms cannot be confused). Text given to an encoder must be well formed; the
``parse_*`` readers of generated text are tolerant instead and skip what does not parse, as
:func:`fourm_kfp.data.modalities.parse_det` does.
"""

from __future__ import annotations

import json
import math
import numbers
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: Palette lengths 1..MAX_PALETTE_COLORS (4M-21 stores palettes of 1 to 7 colours).
MAX_PALETTE_COLORS = 7
#: The largest bin the ``v0=``/``v1=`` tokens can hold (the tokenizer's 1000 coordinate tokens: 0..999).
MAX_TOKEN_VALUE = 999
#: The key under which metadata given as text is stored (as bins, not raw numbers).
METADATA_BINS_KEY = "bins"

_TOKEN = re.compile(r"v([01])=(\d+)")


def _token(token: str) -> tuple[int, int] | None:
    """``(kind, value)`` of a ``v0=<n>`` / ``v1=<n>`` token (``n`` ≤ 999), or None when the token is not one."""
    match = _TOKEN.fullmatch(token)
    if match is None or int(match.group(2)) > MAX_TOKEN_VALUE:
        return None
    return int(match.group(1)), int(match.group(2))


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode("utf-8")


def _json_value(data: bytes, modality: str) -> Any:
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"modality {modality!r}: stored value is not JSON: {exc}") from None


def _integer(value: Any, what: str) -> int:
    """``value`` as an int; a bool, a fraction or a non-number is an error naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
            or value != int(value):
        raise ValueError(f"{what}: expected an integer, got {value!r}")
    return int(value)


# ---------------------------------------------------------------------------------------------------- color_palette


def _palettes(value: Any) -> dict[int, list[tuple[int, int, int]]]:
    """The palettes of 4M's palette JSON (a list holding one dict ``{"<k>": [k colours]}``), checked: length → its
    colours. Keys may be ints or their strings; colours are three ints in 0..255."""
    if not (isinstance(value, (list, tuple)) and len(value) == 1 and isinstance(value[0], Mapping)):
        raise ValueError(f"modality 'color_palette': expected a list holding one dict {{'<k>': [k colours]}} "
                         f"(4M's palette JSON), got {type(value).__name__} {str(value)[:80]}")
    palettes: dict[int, list[tuple[int, int, int]]] = {}
    for key, colours in value[0].items():
        k = _integer(int(key) if isinstance(key, str) and key.isdigit() else key,
                     f"modality 'color_palette': palette length {key!r}")
        if not 1 <= k <= MAX_PALETTE_COLORS or k in palettes:
            raise ValueError(f"modality 'color_palette': palette lengths are 1..{MAX_PALETTE_COLORS}, each once; "
                             f"got {key!r}")
        if not isinstance(colours, (list, tuple)) or len(colours) != k:
            raise ValueError(f"modality 'color_palette': palette {k} needs {k} colours, got {str(colours)[:80]}")
        checked = []
        for colour in colours:
            if not isinstance(colour, (list, tuple)) or len(colour) != 3:
                raise ValueError(f"modality 'color_palette': palette {k}: a colour is [r, g, b], got {colour!r}")
            rgb = tuple(_integer(c, f"modality 'color_palette': palette {k}: colour {colour!r}") for c in colour)
            if not all(0 <= c <= 255 for c in rgb):
                raise ValueError(f"modality 'color_palette': palette {k}: colour {colour!r} is outside 0..255")
            checked.append(rgb)
        palettes[k] = checked
    if not palettes:
        raise ValueError("modality 'color_palette': the palette JSON holds no palette")
    return dict(sorted(palettes.items()))


def palette_text(palettes: Any, k: int) -> str:
    """The text of the length-``k`` palette of ``palettes`` (4M's palette JSON): ``v1=<k> v0=<r> v0=<g> v0=<b> ...``."""
    checked = _palettes(palettes)
    if k not in checked:
        raise ValueError(f"modality 'color_palette': no palette of length {k!r}; the value has {sorted(checked)}")
    return _palette_text(k, checked[k])


def _palette_text(k: int, colours: list[tuple[int, int, int]]) -> str:
    return " ".join([f"v1={k}"] + [f"v0={c}" for colour in colours for c in colour])


def parse_palette_text(text: str) -> list[tuple[int, int, int]]:
    """The colours of a palette text (inverse of :func:`palette_text`, without its length).

    Generated text need not be well formed, so a colour is three consecutive ``v0=<n>`` tokens with ``n`` in
    0..255; a token that is not one (the ``v1=<k>`` length, a value out of range, a word piece) drops the colour it
    interrupts and reading goes on after it. The ``v1=<k>`` length is neither needed nor enforced."""
    colours: list[tuple[int, int, int]] = []
    pending: list[int] = []
    for token in text.split():
        parsed = _token(token)
        if parsed is None or parsed[0] != 0 or parsed[1] > 255:
            pending = []
            continue
        pending.append(parsed[1])
        if len(pending) == 3:
            colours.append((pending[0], pending[1], pending[2]))
            pending = []
    return colours


def _palette_from_text(text: str) -> list[dict[str, list[list[int]]]]:
    """The one-length palette JSON of a well-formed palette text; anything else is an error quoting it."""
    tokens = text.split()
    first = _token(tokens[0]) if tokens else None
    colours = parse_palette_text(text)
    if first is None or first[0] != 1 or not 1 <= first[1] <= MAX_PALETTE_COLORS or len(colours) != first[1] \
            or len(tokens) != 1 + 3 * first[1]:
        raise ValueError(f"modality 'color_palette': text must be 'v1=<k> v0=<r> v0=<g> v0=<b> ...' with k in "
                         f"1..{MAX_PALETTE_COLORS} and k colours in 0..255, got {text[:120]!r}")
    return [{str(first[1]): [list(c) for c in colours]}]


def encode_palette(value: Any) -> bytes:
    """4M's palette JSON (or a palette text, stored as a palette of that one length) → canonical JSON bytes."""
    if isinstance(value, str):
        value = _palette_from_text(value)
    palettes = _palettes(value)
    return _json_bytes([{str(k): [list(c) for c in colours] for k, colours in palettes.items()}])


def decode_palette(data: bytes) -> str:
    """Stored palette JSON → the text of one of its lengths, picked from the bytes (see the module docstring)."""
    palettes = _palettes(_json_value(data, "color_palette"))
    k = list(palettes)[zlib.crc32(data) % len(palettes)]
    return _palette_text(k, palettes[k])


# --------------------------------------------------------------------------------------------------------- metadata


@dataclass(frozen=True)
class Quantisation:
    """How 4M turns a raw metadata number into a bin: ``size`` (``value // step``), ``count`` (the integer itself)
    or ``range`` (``[vmin, vmax]`` into ``bins`` bins); sizes and counts are clipped to 0..999."""

    kind: str
    step: int = 1
    vmin: float = 0.0
    vmax: float = float(MAX_TOKEN_VALUE)
    bins: int = MAX_TOKEN_VALUE + 1

    @property
    def max_bin(self) -> int:
        return self.bins - 1 if self.kind == "range" else MAX_TOKEN_VALUE

    def bin_values(self, index: int) -> str:
        """The raw values bin ``index`` holds, for a person: ``416 to 447`` (a size), ``16`` (a count), ``130 to 135``
        (a range's bin), ``>=150`` (the last bin, which holds everything clipped to the top). "to", not a hyphen: a
        preview tile's small font draws a hyphen as a faint pixel, and ``32-63`` reads as ``3263``."""
        if self.kind != "range":
            if index >= MAX_TOKEN_VALUE:
                return f">={MAX_TOKEN_VALUE * self.step}"
            return f"{index * self.step} to {(index + 1) * self.step - 1}" if self.step > 1 else str(index)
        if index >= self.bins - 1:
            return f">={self.vmax:g}"
        width = (self.vmax - self.vmin) / (self.bins - 1)
        return f"{self.vmin + index * width:.3g} to {self.vmin + (index + 1) * width:.3g}"

    def bin(self, value: Any, field: str) -> int:
        """The bin of raw ``value`` (an integer for sizes and counts, any finite number for ranges)."""
        what = f"modality 'metadata': field {field!r}"
        if self.kind != "range":
            return max(0, min(_integer(value, what) // self.step, MAX_TOKEN_VALUE))
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise ValueError(f"{what}: expected a finite number, got {value!r}")
        clipped = max(self.vmin, min(float(value), self.vmax))
        return int((clipped - self.vmin) / (self.vmax - self.vmin) * (self.bins - 1))


_SIZE = Quantisation("size", step=32)
_COUNT = Quantisation("count")

#: The metadata fields: name → (4M's id, the ``N`` of its ``v1=N`` token; its quantisation).
METADATA_FIELDS: dict[str, tuple[int, Quantisation]] = {
    "original_width": (0, _SIZE),
    "original_height": (1, _SIZE),
    "caption_n_chars": (2, _COUNT),
    "caption_n_words": (3, _COUNT),
    "caption_n_sentences": (4, _COUNT),
    "colorfulness": (9, Quantisation("range", vmin=0, vmax=150, bins=50)),
    "brightness": (10, Quantisation("range", vmin=0, vmax=255, bins=50)),
    "contrast": (11, Quantisation("range", vmin=0, vmax=127, bins=50)),
    "saturation": (12, Quantisation("range", vmin=0, vmax=255, bins=50)),
    "entropy": (13, Quantisation("range", vmin=0, vmax=10, bins=50)),
}
_FIELD_BY_ID = {field_id: name for name, (field_id, _) in METADATA_FIELDS.items()}
#: How a person reads each metadata field: its words and the unit of its raw value (the image statistics are on the
#: scales of the metadata labeler: brightness and saturation of 0..255, entropy in bits).
METADATA_READING: dict[str, tuple[str, str]] = {
    "original_width": ("original width", "px"),
    "original_height": ("original height", "px"),
    "caption_n_chars": ("caption", "chars"),
    "caption_n_words": ("caption", "words"),
    "caption_n_sentences": ("caption", "sentences"),
    "colorfulness": ("colorfulness", ""),
    "brightness": ("brightness", "of 255"),
    "contrast": ("contrast", ""),
    "saturation": ("saturation", "of 255"),
    "entropy": ("entropy", "bits"),
}


def _field(name: Any) -> tuple[int, Quantisation]:
    try:
        return METADATA_FIELDS[name]
    except (KeyError, TypeError):
        raise ValueError(f"modality 'metadata': unknown field {name!r}; known fields: "
                         f"{', '.join(METADATA_FIELDS)}") from None


def _checked_fields(fields: Any) -> dict[str, Any]:
    if not isinstance(fields, Mapping) or not fields:
        raise ValueError(f"modality 'metadata': expected a non-empty dict of field -> number, got {str(fields)[:80]}")
    for name in fields:
        _field(name)
    return dict(fields)


def metadata_bins(fields: Mapping[str, Any]) -> dict[str, int]:
    """Raw metadata numbers by field → their bins (4M's quantisation), in the order of the field ids."""
    fields = _checked_fields(fields)
    return {name: quant.bin(fields[name], name) for name, (_, quant) in METADATA_FIELDS.items() if name in fields}


def _bins_text(bins: Mapping[str, int]) -> str:
    order = sorted(bins, key=lambda name: METADATA_FIELDS[name][0])
    return " ".join(f"v1={METADATA_FIELDS[name][0]} v0={bins[name]}" for name in order)


def metadata_text(fields: Mapping[str, Any]) -> str:
    """The text of raw metadata (field → number): ``v1=<id> v0=<bin> ...``, fields in the order of their ids."""
    return _bins_text(metadata_bins(fields))


def parse_metadata_text(text: str) -> dict[str, int]:
    """Field → bin of a metadata text (inverse of :func:`metadata_text` up to quantisation).

    Generated text need not be well formed, so a field is a ``v1=<id>`` token of a known field followed directly
    by a ``v0=<bin>`` token with the bin in that field's range; anything else is skipped and reading resumes at the
    next token. A field given twice keeps its first bin."""
    tokens = [_token(t) for t in text.split()]
    bins: dict[str, int] = {}
    i = 0
    while i + 1 < len(tokens):
        head, value = tokens[i], tokens[i + 1]
        name = _FIELD_BY_ID.get(head[1]) if head is not None and head[0] == 1 else None
        if name is None or value is None or value[0] != 0 or value[1] > METADATA_FIELDS[name][1].max_bin:
            i += 1
            continue
        bins.setdefault(name, value[1])
        i += 2
    return bins


def metadata_readings(value: str | Mapping[str, Any]) -> list[str]:
    """What a person reads of a metadata value: ``<field> <value> <unit>`` per field, in the order of the field ids.
    A text (as read from a shard, or generated) or stored bins give the raw values each bin holds
    (``original width 416 to 447 px``); raw numbers (a labeler's metadata JSON) are shown as they are
    (``original width 430 px``)."""
    if isinstance(value, str) or (isinstance(value, Mapping) and set(value) == {METADATA_BINS_KEY}):
        bins = parse_metadata_text(value) if isinstance(value, str) else _stored_bins(value[METADATA_BINS_KEY])
        shown = {name: METADATA_FIELDS[name][1].bin_values(b) for name, b in bins.items()}
    else:
        fields = _checked_fields(value)
        shown = {name: str(int(v)) if isinstance(v, numbers.Integral) or float(v).is_integer() else f"{v:.4g}"
                 for name, v in fields.items()}
    order = sorted(shown, key=lambda name: METADATA_FIELDS[name][0])
    return [" ".join(part for part in (METADATA_READING[name][0], shown[name], METADATA_READING[name][1]) if part)
            for name in order]


def encode_metadata(value: Any) -> bytes:
    """Raw metadata (field → number, 4M's metadata JSON) → canonical JSON bytes. A metadata text is stored as its
    bins under :data:`METADATA_BINS_KEY` (see the module docstring); it must be well formed."""
    if isinstance(value, str):
        bins = parse_metadata_text(value)
        if not bins or 2 * len(bins) != len(value.split()):
            raise ValueError(f"modality 'metadata': text must be 'v1=<field id> v0=<bin> ...' with known field ids "
                             f"({', '.join(f'{n}={i}' for n, (i, _) in METADATA_FIELDS.items())}), each once, and "
                             f"bins in range; got {value[:120]!r}")
        return _json_bytes({METADATA_BINS_KEY: bins})
    fields = _checked_fields(value)
    metadata_bins(fields)  # validates every number
    return _json_bytes({name: int(v) if isinstance(v, numbers.Integral) else float(v) for name, v in fields.items()})


def decode_metadata(data: bytes) -> str:
    """Stored metadata JSON → its text (raw numbers are quantised; stored bins are taken as they are)."""
    value = _json_value(data, "metadata")
    if isinstance(value, dict) and set(value) == {METADATA_BINS_KEY}:
        return _bins_text(_stored_bins(value[METADATA_BINS_KEY]))
    return metadata_text(value)


def _stored_bins(bins: Any) -> dict[str, int]:
    """Stored metadata bins, checked: every field known, every bin an integer in its field's range."""
    checked = {}
    for name, value in _checked_fields(bins).items():
        checked[name] = _integer(value, f"modality 'metadata': stored bin of field {name!r}")
        if not 0 <= checked[name] <= METADATA_FIELDS[name][1].max_bin:
            raise ValueError(f"modality 'metadata': stored bin of field {name!r} is {value}, outside "
                             f"0..{METADATA_FIELDS[name][1].max_bin}")
    return checked
