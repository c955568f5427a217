"""The caption grammar: captions parse back into the objects they name, and on real synthetic scenes every visible
object is named once."""

from __future__ import annotations

from collections import Counter

from fourm_kfp.data import scene_captions as captions
from fourm_kfp.data.modalities import parse_det
from fourm_kfp.data.scene_captions import COLOR_WORDS, EMPTY_SCENE, SIZE_WORDS, parse_caption
from fourm_kfp.data.synthetic_scenes import synthetic_sample

#: Rendered once: 20 small scenes (1 to 4 objects each) for the checks against real data.
SAMPLES = [synthetic_sample(0, index, 32) for index in range(20)]


def test_parse_caption():
    assert parse_caption(EMPTY_SCENE) == []
    assert parse_caption("a small red sphere left of a large blue cube") == [("small", "red", "sphere"),
                                                                               ("large", "blue", "cube")]
    assert parse_caption("A Small  Red Sphere") == [("small", "red", "sphere")]
    assert parse_caption("a small red and a huge blue sphere") == []  # incomplete / unknown words


def test_parse_caption_on_real_captions():
    # A caption names every visible object once, and det boxes exactly the visible objects.
    counts = []
    for sample in SAMPLES:
        objects, boxes = parse_caption(sample["caption"]), parse_det(sample["det"])
        assert Counter(o[2] for o in objects) == Counter(name for _, name in boxes)
        assert all(size in SIZE_WORDS and colour in COLOR_WORDS for size, colour, _ in objects)
        assert (sample["caption"] == EMPTY_SCENE) == (not objects)
        counts.append(len(objects))
    assert max(counts) >= 3  # the "..., ... and ..." phrasing is covered


def test_every_sentence_the_writer_composes_parses_back_to_its_objects():
    red, blue, cone = ("small", "red", "sphere"), ("large", "blue", "cube"), ("medium", "gray", "cone")
    a, b, c = (captions.object_phrase(*o) for o in (red, blue, cone))
    assert a == "a small red sphere"
    for variant in range(6):
        assert parse_caption(captions.single_object(a, captions.horizontal_place(5.0, 32), variant)) == [red]
        assert sorted(parse_caption(captions.in_depth(a, b, variant))) == sorted([red, blue])
        assert sorted(parse_caption(captions.side_by_side(a, b, variant))) == sorted([red, blue])
    sentence = captions.with_others(captions.side_by_side(a, b, 1), [captions.placed(c, "in the middle")] * 2)
    assert sentence == "a small red sphere left of a large blue cube, a medium gray cone in the middle and " \
                       "a medium gray cone in the middle"
    assert parse_caption(sentence) == [red, blue, cone, cone]
    assert [captions.horizontal_place(x, 30) for x in (9.9, 10.0, 20.0, 20.1)] == [
        "on the left", "in the middle", "in the middle", "on the right"]
