"""4M's multimodal masking of one sample, and the collation of masked samples into a :class:`MaskedBatch`.

Per sample (all on the CPU, in the loader's workers, from a generator seeded for that sample):

1. pick a mixture component and split the input budget (:mod:`.dirichlet_masking`), each modality capped by the
   tokens it has (a grid's cells, a text's tokens);
2. split the target budget the same way, an image modality capped by the cells its inputs left over;
3. image modalities: one random permutation of the grid, the first ``k`` cells are inputs and the next ``m``
   targets, so they never overlap; text modalities: span masking (:mod:`.span_masking`) sized by the same
   budgets, the target decoded with teacher forcing (the decoder sees the previous target token);
4. with ``fill_budgets`` (the default), a text's share is capped by the tokens it has and what it could not use
   (its sentinel overhead, a short caption) moves to image modalities with cells left, so the budgets are filled
   exactly whenever the sample has the tokens. Without it (ml-4m's rule), a text's share is capped only by the
   model's ``max_length`` and what the text cannot use stays empty: a draw that gives the caption most of the input
   budget has the caption nearly alone among the inputs, the situation of generating from a caption.

A modality the sample lacks gets no budget. :func:`collate` pads to the budgets and computes the host-side
``target_order``/``target_counts`` the model's heads use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

from fourm_kfp.batch import IGNORE_INDEX, MaskedBatch, ModalitySpec, normalised_pixels
from fourm_kfp.masking.dirichlet_masking import MixtureComponent, pick_component, split_budget
from fourm_kfp.masking.span_masking import span_mask, whole_target


@dataclass(frozen=True)
class MaskingArgs:
    modalities: tuple[ModalitySpec, ...]
    input_budget: int
    target_budget: int
    mixture: tuple[MixtureComponent, ...]
    sentinels: tuple[int, ...]  # sentinel ids in the order spans take them: [S_0], [S_1], ... (ml-4m's: from [S_1])
    span_mean_length: float = 3.0
    fill_budgets: bool = True  # text's unused share to image modalities (False: left empty, as ml-4m)
    text_eos: int | None = None  # an id the loader appends to every text before masking (ml-4m's [EOS]); None: none


@dataclass
class MaskedSample:
    """Slots of one sample, one row each: encoder ``[n, 3]`` (token, modality, position) and decoder ``[n, 4]``
    (input token, target, modality, position), int64; plus the rgb pixels as stored (uint8 ``[H, W, 3]``) when a
    modality takes pixel input (:func:`collate` normalises a batch's at once)."""

    enc: np.ndarray = field(default_factory=lambda: np.zeros((0, 3), np.int64))
    dec: np.ndarray = field(default_factory=lambda: np.zeros((0, 4), np.int64))
    pixels: np.ndarray | None = None
    key: str = ""


def _text_slots(rng: np.random.Generator, ids: list[int], k: int, m: int, mean_span: float,
                sentinels: Sequence[int]) -> tuple[list[int], list[int]]:
    """Encoder ids (at most ``k``) and the target sequence (at most ``m + 1`` ids: ``m`` decoder slots)."""
    if m > 0 and k > 0:
        inputs, target = span_mask(rng, ids, round(len(ids) * m / (k + m)), mean_span, sentinels)
    elif m > 0:
        inputs, target = [], whole_target(ids, sentinels)
    else:
        inputs, target = list(ids), []
    return inputs[:k], target[:m + 1] if len(target) > 1 else []


def mask_sample(rng: np.random.Generator, args: MaskingArgs, tokens: dict[str, Any], pixels: np.ndarray | None,
                key: str = "") -> MaskedSample:
    """``tokens``: per modality name, a token grid ``[h, w]`` (image) or an id list (text); absent = not there."""
    specs = args.modalities
    sizes = np.array([np.asarray(tokens[s.name]).size if s.name in tokens else 0 for s in specs], dtype=np.int64)
    is_image = np.array([s.kind == "image" for s in specs])
    # What a text can take of a budget: its own tokens (+1 as a target: the closing sentinel), or without
    # fill_budgets the longest text the model reads, whatever this one's length. A grid: its cells.
    if args.fill_budgets:
        text_in, text_out = sizes, sizes + 1
    else:
        text_in = text_out = np.array([s.max_length for s in specs], dtype=np.int64)
    component = pick_component(rng, args.mixture)
    k = split_budget(rng, args.input_budget, np.array(component.input_alphas),
                     np.where(is_image, sizes, text_in) * (sizes > 0))
    m = split_budget(rng, args.target_budget, np.array(component.target_alphas),
                     np.where(is_image, sizes - k, text_out) * (sizes > 0))
    sample = MaskedSample(key=key)
    text_unused_in, text_unused_out = 0, 0
    texts = {}
    for i, spec in enumerate(specs):
        if spec.kind == "sequence" and sizes[i]:
            inputs, target = _text_slots(rng, list(tokens[spec.name]), int(k[i]), int(m[i]),
                                         args.span_mean_length, args.sentinels)
            texts[i] = (inputs, target)
            text_unused_in += int(k[i]) - len(inputs)
            text_unused_out += int(m[i]) - max(len(target) - 1, 0)
    # With fill_budgets, what text could not use goes to image modalities with cells left (inputs first, then
    # targets); without, it stays empty.
    for budget, unused in ((k, text_unused_in), (m, text_unused_out)) if args.fill_budgets else ():
        for i, spec in enumerate(specs):
            if unused <= 0:
                break
            if spec.kind == "image" and sizes[i]:
                spare = sizes[i] - k[i] - m[i]
                extra = int(min(spare, unused))
                budget[i] += extra
                unused -= extra
    # Each slot field as one array per modality, joined once: a sample's slots cost a few array operations
    # instead of a Python tuple per slot.
    enc: tuple[list, list, list] = ([], [], [])
    dec: tuple[list, list, list, list] = ([], [], [], [])
    for i, spec in enumerate(specs):
        if not sizes[i]:
            continue
        if spec.kind == "image":
            grid = np.asarray(tokens[spec.name]).reshape(-1)
            order = rng.permutation(grid.size)
            inputs, targets = order[: k[i]], order[k[i]: k[i] + m[i]]
            enc_tokens = np.zeros(len(inputs), np.int64) if spec.pixel_input else grid[inputs]
            dec_inputs = np.zeros(len(targets), np.int64)
            dec_targets = grid[targets]
        else:
            text_inputs, target = texts[i]
            enc_tokens, inputs = np.array(text_inputs, np.int64), np.arange(len(text_inputs))
            dec_inputs, dec_targets = np.array(target[:-1], np.int64), np.array(target[1:], np.int64)
            targets = np.arange(len(dec_targets))
        for columns, values in zip(enc, (enc_tokens, np.full(len(inputs), i), inputs)):
            columns.append(values)
        for columns, values in zip(dec, (dec_inputs, dec_targets, np.full(len(targets), i), targets)):
            columns.append(values)
    if enc[0]:
        sample.enc = np.stack([np.concatenate(c).astype(np.int64, copy=False) for c in enc], axis=1)
    if dec[0]:
        sample.dec = np.stack([np.concatenate(c).astype(np.int64, copy=False) for c in dec], axis=1)
    if pixels is not None and any(s.pixel_input for s in specs):
        sample.pixels = np.asarray(pixels)
    return sample


def collate(samples: Sequence[MaskedSample], args: MaskingArgs) -> MaskedBatch:
    """Stack masked samples into fixed-size padded tensors (``E = input_budget``, ``D = target_budget``)."""
    b, e, d = len(samples), args.input_budget, args.target_budget
    enc = np.zeros((3, b, e), np.int64)
    dec = np.zeros((4, b, d), np.int64)
    dec[1] = IGNORE_INDEX
    enc_valid, dec_valid = np.zeros((b, e), bool), np.zeros((b, d), bool)
    for j, s in enumerate(samples):
        n = min(len(s.enc), e)
        enc[:, j, :n] = s.enc[:n].T
        enc_valid[j, :n] = True
        n = min(len(s.dec), d)
        dec[:, j, :n] = s.dec[:n].T
        dec_valid[j, :n] = True
    flat_mod = np.where(dec_valid, dec[2], len(args.modalities)).reshape(-1)
    order = np.argsort(flat_mod, kind="stable")[: int(dec_valid.sum())]
    counts = np.bincount(flat_mod, minlength=len(args.modalities) + 1)[: len(args.modalities)].tolist()
    pixels = None
    if any(s.pixels is not None for s in samples):
        shape = next(s.pixels.shape for s in samples if s.pixels is not None)
        stored = np.stack([s.pixels if s.pixels is not None else np.zeros(shape, np.uint8) for s in samples])
        normalisation = next(s.pixel_normalisation for s in args.modalities if s.pixel_input)
        # a channels-first view of channels-last memory, as the model has had
        normalised = normalised_pixels(stored, normalisation)
        normalised[[s.pixels is None for s in samples]] = 0.0  # a sample without pixels reads zeros
        pixels = torch.from_numpy(normalised)
    t = torch.from_numpy
    return MaskedBatch(t(enc[0]), t(enc[1]), t(enc[2]), t(enc_valid), t(dec[0]), t(dec[1]), t(dec[2]), t(dec[3]),
                       t(dec_valid), t(order), counts, pixels, [s.key for s in samples], bool(enc_valid.all()))
