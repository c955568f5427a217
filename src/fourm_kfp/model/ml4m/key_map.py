"""The one key map between ml-4m's ``FM`` state dict and our :class:`~fourm_kfp.model.fourm.FourM`'s, and the two
directions read from it: :func:`to_ml4m` (export) and :func:`from_ml4m` (import).

:func:`key_map` lists, for one model, every tensor ml-4m's ``FM`` holds and where it is ours (the way torchtitan's
``state_dict_adapter.py`` keeps one ``from_hf_map`` and inverts it for ``to_hf``), so a tensor is placed once and both
directions follow:

* a :class:`Pair` is one of our tensors, or some rows of one (a modality's rows of a concatenated table, the gate or
  up half of a fused SwiGLU MLP), with the ml-4m names that hold it (a modality embedding ml-4m shares between its
  encoder and decoder has two; export writes the first, import reads whichever is there and refuses names that
  disagree) and its :class:`Layout` there (a reshape, or the patch projection's pixel order);
* a :class:`Fixed` is a buffer ml-4m keeps and we compute (sin-cos ``pos_emb``, the zero LayerNorm ``bias``): export
  writes the computed value, import checks the stored one against it.

Pairs with one label (the two halves of a fused MLP) are imported together or not at all. Import names every ml-4m
key the map has no place for, and the import report (:class:`Ml4mImport`) lists our parameters nothing came for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from fourm_kfp.batch import ModalitySpec
from fourm_kfp.model.fourm import FourM
from fourm_kfp.model.layers import sincos_1d, sincos_2d
from fourm_kfp.model.ml4m.domains import DOMAINS, PIXEL_DOMAIN, TEMPERATURE, Ml4mError

#: rows of every text domain's ``pos_emb`` buffer (ml-4m's ``max_sincos_pos_emb``: its ``[:max_length]`` cut
#: slices the buffer's batch axis, so the buffer keeps all 512 whatever the domain's ``max_length``)
SEQUENCE_POSITIONS = 512
#: position tolerance: ml-4m computes its sin-cos tables in float32 (angles up to 511 rad: ~3e-5 off), we in
#: float64 (then float32); a learned table is off by its init (std 0.02) or more
POSITION_ATOL = 1e-4


@dataclass(frozen=True)
class Layout:
    """How a tensor of ours is laid out in ml-4m (before the reshape to the other side's shape), and back."""

    to_ml4m: Callable[[torch.Tensor], torch.Tensor]
    from_ml4m: Callable[[torch.Tensor], torch.Tensor]


#: the same values in the same order (a reshape at most)
SAME = Layout(lambda t: t, lambda t: t)


def patch_layout(patch: int) -> Layout:
    """Our patch projection reads its input laid out (c, ph, pw), ml-4m's ``rgb@224.proj`` (ph, pw, c)."""
    def to_ml4m(weight: torch.Tensor) -> torch.Tensor:
        return weight.reshape(weight.shape[0], 3, patch, patch).permute(0, 2, 3, 1).reshape(weight.shape[0], -1)

    def from_ml4m(weight: torch.Tensor) -> torch.Tensor:
        return weight.reshape(weight.shape[0], patch, patch, 3).permute(0, 3, 1, 2).reshape(weight.shape[0], -1)

    return Layout(to_ml4m, from_ml4m)


@dataclass(frozen=True)
class Pair:
    """One tensor in both formats: ``rows`` of our ``ours`` (all of it: None) is ml-4m's ``names[0]``."""

    ours: str
    #: ml-4m's names of this tensor: export writes the first ``written``, import takes the first present
    names: tuple[str, ...]
    shape: tuple[int, ...]  # ml-4m's
    rows: slice | None = None
    #: what the import report calls it (default ``ours``); pairs with one label are imported together or not at all
    label: str = ""
    layout: Layout = SAME
    written: int = 1
    #: a source without it means zero (ml-4m's context projection bias, written zero for a bias-free one)
    zero_if_absent: bool = False


@dataclass(frozen=True)
class Fixed:
    """A buffer ml-4m keeps and we compute: ``value`` on export; on import the stored one must be within
    ``tolerance`` of it, else ``refusal`` (formatted with the ``error``) names what it is."""

    name: str
    value: torch.Tensor
    tolerance: float
    refusal: str


@dataclass(frozen=True)
class KeyMap:
    """Every ml-4m tensor of one model, in import order, and the ml-4m key prefixes of what the model leaves out on
    purpose, with the reason."""

    entries: list[Pair | Fixed]
    skipped: dict[str, str]


@dataclass
class Ml4mImport:
    """What :func:`~fourm_kfp.model.ml4m.import_ml4m` took: the ml-4m keys it used, those it dropped (with the
    reason), and our parameters the source had nothing for (left at their fresh initialisation)."""

    source: str
    imported: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    dropped_domains: list[str] = field(default_factory=list)
    #: scalars of the source's tensors that were dropped (those of dropped domains included)
    dropped_parameters: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "imported": self.imported, "dropped": self.dropped, "missing": self.missing,
                "dropped_domains": self.dropped_domains, "dropped_parameters": self.dropped_parameters}


# -- the map --------------------------------------------------------------------------------------------------------

_ZERO_BIAS = "is not zero: the model has LayerNorm biases (norm_bias), which fourm-kfp does not compute"
_LEARNED_POSITIONS = (f"differs from the fixed sin-cos positions (temperature {TEMPERATURE:g}) by {{error:.2g}}: "
                      f"learned positions are not supported")


def _positions(spec: ModalitySpec, dim: int) -> torch.Tensor:
    """ml-4m's ``pos_emb`` buffer [1, N, D] of ``spec``."""
    if spec.kind == "image":
        return sincos_2d(*spec.grid, dim, TEMPERATURE).unsqueeze(0)
    return sincos_1d(SEQUENCE_POSITIONS, dim, TEMPERATURE).unsqueeze(0)


def _rows(model: FourM, table: str, index: int) -> slice:
    """The rows of modality ``index`` in our concatenated ``table`` (``enc``: a pixel modality has one placeholder)."""
    spec = model.args.modalities[index]
    if table == "enc":
        start, size = int(model.enc_token_offset[index]), 1 if spec.pixel_input else spec.vocab_size
    else:
        start, size = int(model.token_offset[index]), spec.vocab_size
    return slice(start, start + size)


def _trunk(model: FourM) -> list[Pair | Fixed]:
    """The trunk: norms, attention, the fused SwiGLU MLPs (ml-4m's fc1 gate, fc3 up, fc2 down), the context
    projection and the mask token."""
    args, dim = model.args, model.args.dim
    shapes = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    names = ["encoder_norm.weight", "decoder_norm.weight"]
    names += [f"encoder.{i}.{n}" for i in range(args.encoder_layers)
              for n in ("norm1.weight", "attn.qkv.weight", "attn.proj.weight", "norm2.weight")]
    names += [f"decoder.{i}.{n}" for i in range(args.decoder_layers)
              for n in ("norm1.weight", "self_attn.qkv.weight", "self_attn.proj.weight", "query_norm.weight",
                        "context_norm.weight", "cross_attn.q.weight", "cross_attn.kv.weight",
                        "cross_attn.proj.weight", "norm2.weight")]
    entries: list[Pair | Fixed] = [Pair(name, (name,), shapes[name]) for name in names]
    entries.append(Pair("context_proj.weight", ("decoder_proj_context.weight",), (dim, dim)))
    entries.append(Pair("context_proj.bias", ("decoder_proj_context.bias",), (dim,), zero_if_absent=True)
                   if args.context_bias else Fixed("decoder_proj_context.bias", torch.zeros(dim), 0.0, _ZERO_BIAS))
    blocks = [f"encoder.{i}" for i in range(args.encoder_layers)] + [f"decoder.{i}" for i in range(args.decoder_layers)]
    for block in blocks:
        fused = f"{block}.mlp.gate_up.weight"
        hidden = shapes[fused][0] // 2
        entries += [Pair(fused, (f"{block}.mlp.fc1.weight",), (hidden, dim), slice(0, hidden)),
                    Pair(fused, (f"{block}.mlp.fc3.weight",), (hidden, dim), slice(hidden, 2 * hidden)),
                    Pair(f"{block}.mlp.down.weight", (f"{block}.mlp.fc2.weight",), (dim, hidden))]
    norms = ["encoder_norm", "decoder_norm"]
    norms += [f"encoder.{i}.{n}" for i in range(args.encoder_layers) for n in ("norm1", "norm2")]
    norms += [f"decoder.{i}.{n}" for i in range(args.decoder_layers)
              for n in ("norm1", "query_norm", "context_norm", "norm2")]
    entries += [Fixed(f"{norm}.bias", torch.zeros(dim), 0.0, _ZERO_BIAS) for norm in norms]
    entries.append(Pair("mask_token", ("mask_token",), (1, 1, dim)))
    return entries


def _modality(model: FourM, index: int) -> tuple[list[Pair | Fixed], dict[str, str]]:
    """Modality ``index``'s embeddings: its decoder domain's, and its encoder domain's (its token domain's, or
    ``rgb@224``'s pixel patches)."""
    args, dim = model.args, model.args.dim
    spec = args.modalities[index]
    domain = DOMAINS[spec.name].name
    dec, enc = f"decoder_embeddings.{domain}", f"encoder_embeddings.{domain}"
    head = "dec_token_embed.weight" if args.tie_embeddings else "head.weight"
    rows, label = _rows(model, "dec", index), f"modality_embed[{spec.name}]"
    positions = _positions(spec, dim)
    entries: list[Pair | Fixed] = [
        Pair("dec_token_embed.weight", (f"{dec}.token_emb.weight",), (spec.vocab_size, dim), rows,
             f"dec_token_embed[{spec.name}]"),
        Pair(head, (f"{dec}.to_logits.weight",), (spec.vocab_size, dim), rows, f"head[{spec.name}]")]
    # the encoder's mod_emb is the decoder's (share_modality_embeddings): ml-4m's save_pretrained writes the shared
    # tensor once, under the decoder's name, and FM.from_pretrained(strict=True) expects just that
    shared = (f"{dec}.mod_emb", f"{enc}.mod_emb")
    if not spec.pixel_input:
        return entries + [
            Pair("modality_embed.weight", shared, (1, 1, dim), slice(index, index + 1), label),
            Fixed(f"{dec}.pos_emb", positions, POSITION_ATOL, _LEARNED_POSITIONS),
            Pair("enc_token_embed.weight", (f"{enc}.token_emb.weight",), (spec.vocab_size, dim),
                 _rows(model, "enc", index), f"enc_token_embed[{spec.name}]"),
            Fixed(f"{enc}.pos_emb", positions, POSITION_ATOL, _LEARNED_POSITIONS)], {}
    pixel = f"encoder_embeddings.{PIXEL_DOMAIN}"
    if args.pixel_modality_embed:  # rgb@224's own modality embedding
        embeddings = [Pair("modality_embed.weight", shared, (1, 1, dim), slice(index, index + 1), label),
                      Pair("pixel_modality_embed", (f"{pixel}.mod_emb",), (1, 1, dim))]
    else:  # one embedding, written for both rgb domains
        embeddings = [Pair("modality_embed.weight", (f"{dec}.mod_emb", f"{pixel}.mod_emb", f"{enc}.mod_emb"),
                           (1, 1, dim), slice(index, index + 1), label, written=2)]
    return entries + embeddings + [
        Fixed(f"{dec}.pos_emb", positions, POSITION_ATOL, _LEARNED_POSITIONS),
        Pair("patch_embed.weight", (f"{pixel}.proj.weight",), (dim, 3 * spec.patch_size ** 2),
             layout=patch_layout(spec.patch_size)),
        Fixed(f"{pixel}.pos_emb", positions, POSITION_ATOL, _LEARNED_POSITIONS),
    ], {enc + ".": f"rgb reads pixel patches here, not {domain} tokens"}


def key_map(model: FourM) -> KeyMap:
    """Every tensor of ml-4m's ``FM`` for ``model``'s modalities and trunk, and where it is ours."""
    entries, skipped = _trunk(model), {}
    for index in range(len(model.args.modalities)):
        more, skip = _modality(model, index)
        entries += more
        skipped.update(skip)
    return KeyMap(entries, skipped)


# -- ours -> ml-4m --------------------------------------------------------------------------------------------------

def to_ml4m(model: FourM) -> dict[str, torch.Tensor]:
    """``model``'s weights as ml-4m's ``FM`` state dict, as its ``save_pretrained`` writes it (a shared modality
    embedding once, under the decoder's name)."""
    ours = {k: v.detach().cpu().float() for k, v in model.state_dict().items()}
    state: dict[str, torch.Tensor] = {}
    for entry in key_map(model).entries:
        if isinstance(entry, Fixed):
            state[entry.name] = entry.value.clone()
            continue
        value = ours[entry.ours] if entry.rows is None else ours[entry.ours][entry.rows]
        for name in entry.names[:entry.written]:
            state[name] = entry.layout.to_ml4m(value).reshape(entry.shape).clone()
    return {k: v.contiguous() for k, v in state.items()}


# -- ml-4m -> ours --------------------------------------------------------------------------------------------------

def from_ml4m(model: FourM, tensors: dict[str, torch.Tensor], report: Ml4mImport, source: str) -> None:
    """Fill ``model`` from ml-4m's ``tensors``; every key used goes to ``report.imported``, every other one to
    ``report.dropped`` with its reason, and our parameters that got nothing to ``report.missing``. Raises
    :class:`Ml4mError` naming the key of a tensor whose shape disagrees with the config, of a buffer that is not
    what we compute, and of a shared embedding whose names disagree."""
    mapping = key_map(model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    used: set[str] = set()

    def take(key: str, shape: tuple[int, ...]) -> torch.Tensor | None:
        if key not in tensors:
            return None
        value = tensors[key]
        if tuple(value.shape) != tuple(shape):
            raise Ml4mError(f"{source}: {key} has shape {list(value.shape)}, the config implies {list(shape)}")
        used.add(key)
        return value.float()

    found: dict[str, list[tuple[Pair, torch.Tensor]]] = {}
    expected: dict[str, int] = {}
    for entry in mapping.entries:
        if isinstance(entry, Fixed):
            _check_fixed(take(entry.name, tuple(entry.value.shape)), entry, source)
            continue
        label = entry.label or entry.ours
        expected[label] = expected.get(label, 0) + 1
        value = _one_of(entry, take, source)
        if value is None and entry.zero_if_absent:
            value = torch.zeros(entry.shape)
        if value is not None:
            found.setdefault(label, []).append((entry, value))
    filled = set()
    for label, pairs in found.items():
        if len(pairs) == expected[label]:
            for pair, value in pairs:
                _put(state, pair, value)
            filled.add(label)
    dropped = {key: why for key in tensors if key not in used
               for prefix, why in mapping.skipped.items() if key.startswith(prefix)}
    for key in sorted(set(tensors) - used - set(dropped)):
        embedding = key.startswith(("encoder_embeddings.", "decoder_embeddings."))
        dropped[key] = "its domain is not imported" if embedding else "no place for it in fourm-kfp's model"
    model.load_state_dict(state)
    report.imported = sorted(used)
    report.dropped = [f"{key}: {why}" for key, why in sorted(dropped.items())]
    report.dropped_parameters = sum(tensors[key].numel() for key in dropped)
    report.missing = _missing(model, filled)


def _one_of(pair: Pair, take: Callable[[str, tuple[int, ...]], torch.Tensor | None], source: str
            ) -> torch.Tensor | None:
    """The value of ``pair`` under the first of its ml-4m names present; names that hold it too must agree."""
    present = [(name, value) for name in pair.names if (value := take(name, pair.shape)) is not None]
    for name, value in present[1:]:
        if not torch.equal(value, present[0][1]):
            raise Ml4mError(f"{source}: {name} and {present[0][0]} differ; fourm-kfp shares one modality embedding "
                            f"between encoder and decoder (ml-4m's share_modality_embeddings)")
    return present[0][1] if present else None


def _put(state: dict[str, torch.Tensor], pair: Pair, value: torch.Tensor) -> None:
    if pair.rows is None:
        state[pair.ours] = pair.layout.from_ml4m(value).reshape(state[pair.ours].shape).clone()
    else:
        state[pair.ours][pair.rows] = pair.layout.from_ml4m(value).reshape(state[pair.ours][pair.rows].shape)


def _check_fixed(value: torch.Tensor | None, fixed: Fixed, source: str) -> None:
    if value is None:
        return
    error = (value - fixed.value).abs().max().item()
    if not math.isfinite(error) or error > fixed.tolerance:
        raise Ml4mError(f"{source}: {fixed.name} {fixed.refusal.format(error=error)}")


def _missing(model: FourM, filled: set[str]) -> list[str]:
    """Our parameters (at modality granularity for the tables) that nothing was loaded into."""
    args = model.args
    wanted = [name for name, _ in model.named_parameters()
              if name not in ("enc_token_embed.weight", "dec_token_embed.weight", "head.weight",
                              "modality_embed.weight")]
    for spec in args.modalities:
        wanted += [f"dec_token_embed[{spec.name}]", f"modality_embed[{spec.name}]"]
        if not args.tie_embeddings:
            wanted.append(f"head[{spec.name}]")
        if not spec.pixel_input:
            wanted.append(f"enc_token_embed[{spec.name}]")
    return [name for name in wanted if name not in filled]
