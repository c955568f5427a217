"""The caption grammar of the synthetic scenes: their vocabulary, the phrases a caption is composed of, and the
parser that reads the objects back.

The renderer (:mod:`fourm_kfp.data.synthetic_scenes`) decides *what* a caption says (which objects are visible,
which is nearer, where each one sits) and composes the sentence with the functions here; the evaluation scores a
generated caption by reading it back with :func:`parse_caption`. Both sides use this one module, so a word or a
phrase is spelled once.

A caption names each visible object as ``a <size> <colour> <shape>`` (:func:`object_phrase`), with words from
:data:`SIZE_WORDS`, :data:`COLOR_WORDS` and :data:`SHAPE_WORDS`; a scene with no visible object is
:data:`EMPTY_SCENE`. Sentences, by the number of objects (``variant`` is the scene's ``caption_variant``):

* one object: the object alone, with its place (:func:`horizontal_place`), or ``... on the ground``
  (:func:`single_object`);
* two: ``A in front of B`` / ``B behind A`` when one stands behind the other in the image (:func:`in_depth`), else
  ``A left of B`` / ``B right of A`` (:func:`side_by_side`);
* more: the two-object sentence, then each further object with its place, ``..., C on the left and D in the
  middle`` (:func:`with_others`).
"""

from __future__ import annotations

import re

from fourm_kfp.data.modalities import OBJECT_CLASSES

#: The shape words: a caption names an object by its class.
SHAPE_WORDS: tuple[str, ...] = OBJECT_CLASSES
#: The colour words (the renderer gives each an albedo).
COLOR_WORDS: tuple[str, ...] = ("red", "green", "blue", "yellow", "purple", "cyan", "orange", "white", "gray")
#: The size words (the renderer gives each a radius).
SIZE_WORDS: tuple[str, ...] = ("small", "medium", "large")
#: The caption of a scene in which no object is visible.
EMPTY_SCENE = "an empty scene"

#: An object as a caption names it: ``(size, colour, shape)``.
CaptionObject = tuple[str, str, str]


# -- composing ----------------------------------------------------------------------------------------------------

def object_phrase(size: str, color: str, shape: str) -> str:
    """``a <size> <colour> <shape>``: how a caption names an object (what :func:`parse_caption` reads)."""
    return f"a {size} {color} {shape}"


def horizontal_place(x: float, width: int) -> str:
    """Where an object sits in an image ``width`` pixels wide, by the third its centroid ``x`` falls in."""
    return "on the left" if x < width / 3 else "on the right" if x > 2 * width / 3 else "in the middle"


def placed(obj: str, place: str) -> str:
    """An object phrase followed by its place."""
    return f"{obj} {place}"


def single_object(obj: str, place: str, variant: int) -> str:
    """The caption of one object: alone, with its place, or on the ground (``variant % 3``)."""
    return [obj, placed(obj, place), f"{obj} on the ground"][variant % 3]


def in_depth(near: str, far: str, variant: int) -> str:
    """Two objects one behind the other: ``near in front of far`` or ``far behind near`` (``variant % 2``)."""
    return f"{near} in front of {far}" if variant % 2 else f"{far} behind {near}"


def side_by_side(left: str, right: str, variant: int) -> str:
    """Two objects side by side: ``left left of right`` or ``right right of left`` (``variant % 2``)."""
    return f"{left} left of {right}" if variant % 2 else f"{right} right of {left}"


def with_others(sentence: str, others: list[str]) -> str:
    """``sentence`` followed by further (placed) object phrases: ``sentence, B, C and D``."""
    if not others:
        return sentence
    return ", ".join([sentence, *others[:-1]]) + f" and {others[-1]}"


# -- parsing ------------------------------------------------------------------------------------------------------

_OBJECT = re.compile(rf"\b({'|'.join(SIZE_WORDS)})\s+({'|'.join(COLOR_WORDS)})\s+({'|'.join(SHAPE_WORDS)})\b")


def parse_caption(text: str) -> list[CaptionObject]:
    """The ``(size, colour, shape)`` objects a caption names, in order (:data:`EMPTY_SCENE` → ``[]``); case and
    spacing are free, a phrase with a word outside the vocabulary is not an object."""
    return [(size, colour, shape) for size, colour, shape in _OBJECT.findall(text.lower())]
