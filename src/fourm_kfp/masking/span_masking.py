"""T5-style span masking of a token sequence with sentinel tokens (4M's masking of text modalities).

``n`` tokens are masked in ``s`` spans (``s`` about ``n / mean_span_length``, never adjacent): the input is the
text with each span replaced by its sentinel ``[S_i]``; the target is the spans, each led by its sentinel, ended
by one more sentinel. Merging input and target restores the text (:func:`unmask`). A text that is only a target
is predicted whole: ``[S_0] text [S_1]``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def _composition(rng: np.random.Generator, total: int, parts: int) -> np.ndarray:
    """``parts`` non-negative integers summing to ``total``, uniformly among compositions."""
    if parts == 1:
        return np.array([total])
    cuts = np.sort(rng.choice(total + parts - 1, parts - 1, replace=False))
    return np.diff(np.concatenate([[-1], cuts, [total + parts - 1]])) - 1


def span_mask(rng: np.random.Generator, tokens: Sequence[int], n_masked: int, mean_span_length: float,
              sentinels: Sequence[int]) -> tuple[list[int], list[int]]:
    """``(input, target)`` id lists; ``n_masked`` is clipped to ``1 .. len(tokens) - 1``."""
    length = len(tokens)
    if length < 2:
        return list(tokens), []
    n = int(np.clip(n_masked, 1, length - 1))
    spans = int(np.clip(round(n / mean_span_length), 1, min(n, length - n + 1, len(sentinels) - 1)))
    masked = _composition(rng, n - spans, spans) + 1  # every span at least one token
    gaps = _composition(rng, length - n - (spans - 1), spans + 1)
    gaps[1:-1] += 1  # spans never touch
    inputs, targets, pos = [], [], 0
    for i in range(spans):
        inputs += list(tokens[pos:pos + gaps[i]])
        pos += gaps[i]
        inputs.append(sentinels[i])
        targets += [sentinels[i], *tokens[pos:pos + masked[i]]]
        pos += masked[i]
    inputs += list(tokens[pos:])
    targets.append(sentinels[spans])
    return inputs, targets


def whole_target(tokens: Sequence[int], sentinels: Sequence[int]) -> list[int]:
    """The target of a text that is not an input at all."""
    return [sentinels[0], *tokens, sentinels[1]]


def unmask(inputs: Sequence[int], targets: Sequence[int], sentinels: Sequence[int]) -> list[int]:
    """The original sequence from a span-masked ``(input, target)`` pair."""
    sentinel_index = {s: i for i, s in enumerate(sentinels)}
    spans: dict[int, list[int]] = {}
    current = None
    for t in targets:
        if t in sentinel_index:
            current = sentinel_index[t]
            spans[current] = []
        elif current is not None:
            spans[current].append(t)
    out = []
    for t in inputs:
        out += spans.get(sentinel_index[t], []) if t in sentinel_index else [t]
    return out
