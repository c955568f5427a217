"""apple/ml-4m's model format, both ways, with no ml-4m dependency: :func:`import_ml4m` and :func:`export_ml4m`.

ml-4m publishes its models (4M-7, 4M-21; B, L, XL) as a folder of ``config.json`` + ``model.safetensors`` that its
``FM`` class loads (``FM.from_pretrained(folder)``), or as one ``.safetensors`` file whose metadata holds the same
config (``fourm.utils.load_safetensors``, then ``FM(config).load_state_dict``). ``config`` names the encoder and
decoder *domains* (``domains_in``, ``domains_out``: ``rgb@224`` pixel patches, ``tok_rgb@224`` tokens, ``caption``
text, ...) and the trunk (``dim``, ``encoder_depth``, ``decoder_depth``, ``num_heads``, the bias and activation
switches). Each domain has its own embedding module: ``encoder_embeddings.<domain>.{token_emb | proj, mod_emb,
pos_emb}`` and ``decoder_embeddings.<domain>.{token_emb, to_logits, mod_emb, pos_emb}``; a domain in both shares
one ``mod_emb`` (ml-4m's ``save_pretrained`` then writes only one of the two names).

Our :class:`~fourm_kfp.model.fourm.FourM` computes the same function as ml-4m's ``*_swiglu_nobias`` models when its
ml-4m switches are on (``FourMArgs.context_bias``, ``pixel_modality_embed``, untied heads, ImageNet pixel
normalisation, sin-cos temperature 10000): what differs is the layout, mapped here tensor by tensor:

=====================================================  =============================================================
ml-4m                                                  fourm-kfp
=====================================================  =============================================================
``encoder.i.mlp.fc1`` (gate), ``fc3`` (up), ``fc2``   ``encoder.i.mlp.gate_up`` (gate rows, then up), ``mlp.down``
``encoder_embeddings.rgb@224.proj`` (ph, pw, c)        ``patch_embed`` (c, ph, pw)
``mask_token`` [1, 1, D]                               ``mask_token`` [D]
per-domain ``token_emb`` / ``to_logits``               rows of ``enc_token_embed`` / ``dec_token_embed`` / ``head``
per-domain ``mod_emb`` [1, 1, D]                       a row of ``modality_embed`` (``pixel_modality_embed``)
``decoder_proj_context`` (weight, bias)                ``context_proj``
``pos_emb`` buffers, LayerNorm ``bias`` buffers        computed (checked on import, written on export)
=====================================================  =============================================================

Modalities: ours ↔ ml-4m's 224-px domains (:data:`DOMAINS`, from each modality record's ``ml4m`` entry); our ``edge``
(occlusion boundaries and creases) is exchanged as ml-4m's ``tok_sam_edge@224``, instance boundaries; ``clip`` and
``dinov2`` as ``tok_clip@224`` (14 x 14 tokens) and ``tok_dinov2@224`` (16 x 16: DINOv2's 14-px patches). A model
that cannot be written exactly (a grid or vocabulary ml-4m's domain does not have, a modality it lacks, a text longer
than its positions) is refused with the reasons (:func:`ml4m_unexpressible`); importing refuses anything that is not
a ``*_swiglu_nobias`` trunk, names every key it has no place for, and lists the domains it drops.

An exported folder also holds ``fourm-kfp.json`` (what the model is, in our terms: its card), which ml-4m ignores.
"""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
import yaml
from safetensors import safe_open
from safetensors.torch import save_file

from fourm_kfp.batch import ModalitySpec
from fourm_kfp.data.modalities import MODALITIES
from fourm_kfp.model.fourm import FourM, FourMArgs
from fourm_kfp.model.layers import sincos_1d, sincos_2d
from fourm_kfp.storage import Store, file_store, open_store

CONFIG, WEIGHTS = "config.json", "model.safetensors"
#: What this pipeline adds to an ml-4m folder it exports: the exported model's card (not ml-4m's).
EXPORT_CARD = "fourm-kfp.json"
IMAGE_SIZE, PATCH_SIZE = 224, 16
GRID = (IMAGE_SIZE // PATCH_SIZE, IMAGE_SIZE // PATCH_SIZE)
PIXEL_DOMAIN = "rgb@224"  # rgb as pixel patches (encoder only)
TEMPERATURE = 10000.0
#: rows of every text domain's ``pos_emb`` buffer (ml-4m's ``max_sincos_pos_emb``: its ``[:max_length]`` cut
#: slices the buffer's batch axis, so the buffer keeps all 512 whatever the domain's ``max_length``)
SEQUENCE_POSITIONS = 512
#: position tolerance: ml-4m computes its sin-cos tables in float32 (angles up to 511 rad: ~3e-5 off), we in
#: float64 (then float32); a learned table is off by its init (std 0.02) or more
POSITION_ATOL = 1e-4


@dataclass(frozen=True)
class Domain:
    """One of ml-4m's token domains (``fourm/data/modality_info.py``): a modality record's ``ml4m`` entry with the
    modality's kind."""

    name: str
    kind: str  # "image" | "sequence"
    vocab_size: int
    max_length: int = 0  # sequence: the longest text its embeddings take (ml-4m's ``max_length``)
    grid: tuple[int, int] = GRID  # image: its token grid at 224 px


#: our modality -> ml-4m's token domain
DOMAINS: dict[str, Domain] = {name: Domain(m.ml4m.name, m.kind, m.ml4m.vocab_size, m.ml4m.max_length,
                                           tuple(m.ml4m.grid))
                              for name, m in MODALITIES.items() if m.ml4m is not None}
_BY_DOMAIN = {d.name: name for name, d in DOMAINS.items()}

#: the trunk ml-4m's ``*_swiglu_nobias`` models have: config field -> value
SWIGLU_NOBIAS = {"act_layer": "SiLU", "gated_mlp": True, "qkv_bias": False, "proj_bias": False, "mlp_bias": False,
                 "norm_bias": False, "qk_norm": False, "decoder_causal_mask": False, "decoder_sep_mask": True,
                 "num_register_tokens": 0, "mlp_ratio": 4.0, "share_modality_embeddings": True}


#: ml-4m's ``FourM.__init__`` defaults for the switches above (``act_layer`` and ``norm_bias`` have none in ``FM``)
FOURM_DEFAULTS = {"gated_mlp": False, "qkv_bias": True, "proj_bias": True, "mlp_bias": True, "qk_norm": False,
                  "decoder_causal_mask": False, "decoder_sep_mask": True, "num_register_tokens": 0, "mlp_ratio": 4.0,
                  "share_modality_embeddings": True}


class Ml4mError(ValueError):
    """A model or folder that cannot be converted; the message names the reason and the place."""


@dataclass
class Ml4mImport:
    """What :func:`import_ml4m` took: the ml-4m keys it used, those it dropped (with the reason), and our
    parameters the source had nothing for (left at their fresh initialisation)."""

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


# -- what can be written --------------------------------------------------------------------------------------------

def ml4m_unexpressible(args: FourMArgs) -> list[str]:
    """Why ``args``' model cannot be written in ml-4m's format (empty: it can)."""
    reasons = []
    for spec in args.modalities:
        domain = DOMAINS.get(spec.name)
        if domain is None:
            reasons.append(f"modality {spec.name!r} has no ml-4m domain (ml-4m has {sorted(_BY_DOMAIN)})")
            continue
        if spec.vocab_size != domain.vocab_size:
            reasons.append(f"modality {spec.name!r}: vocabulary {spec.vocab_size}, ml-4m's {domain.name} has "
                           f"{domain.vocab_size}")
        if spec.kind == "image" and tuple(spec.grid) != domain.grid:
            reasons.append(f"modality {spec.name!r}: token grid {tuple(spec.grid)}, ml-4m's {domain.name} is "
                           f"{domain.grid} (at {IMAGE_SIZE} px)")
        if spec.kind == "sequence" and spec.max_length > domain.max_length:
            reasons.append(f"modality {spec.name!r}: {spec.max_length} text positions, ml-4m's {domain.name} has "
                           f"{domain.max_length}")
        if spec.pixel_input and spec.patch_size != PATCH_SIZE:
            reasons.append(f"modality {spec.name!r}: {spec.patch_size}-px pixel patches, ml-4m's {PIXEL_DOMAIN} "
                           f"takes {PATCH_SIZE}-px")
        if spec.pixel_input and spec.pixel_normalisation != "imagenet":
            # no bias in ml-4m's patch projection to absorb the other mean, and its modality embedding is added
            # to the decoder's context too, so a rescaled projection cannot give the same function
            reasons.append(f"modality {spec.name!r} reads pixels normalised {spec.pixel_normalisation!r}; ml-4m "
                           f"feeds ImageNet-normalised pixels (train.model.pixel_normalisation: imagenet)")
    if args.position_temperature != TEMPERATURE:
        reasons.append(f"sin-cos temperature {args.position_temperature:g}, ml-4m's is {TEMPERATURE:g}")
    if args.norm_eps != 1e-6:
        reasons.append(f"LayerNorm eps {args.norm_eps:g}, ml-4m's is 1e-06")
    if args.dim % 4:
        reasons.append(f"width {args.dim} is not a multiple of 4 (ml-4m's 2-D sin-cos positions)")
    return reasons


def ml4m_config(args: FourMArgs) -> dict[str, Any]:
    """The ``config`` ml-4m's ``FM`` is built from, for ``args``' model."""
    domains_in = [PIXEL_DOMAIN if s.pixel_input else DOMAINS[s.name].name for s in args.modalities]
    domains_out = [DOMAINS[s.name].name for s in args.modalities]
    return {"domains_in": domains_in, "domains_out": domains_out, "image_size": IMAGE_SIZE,
            "patch_size": PATCH_SIZE, "dim": args.dim, "encoder_depth": args.encoder_layers,
            "decoder_depth": args.decoder_layers, "num_heads": args.heads, **SWIGLU_NOBIAS}


# -- our tensors <-> ml-4m's ----------------------------------------------------------------------------------------

def _rows(model: FourM, table: str, index: int) -> slice:
    """The rows of modality ``index`` in our concatenated ``table`` (``enc``: a pixel modality has one placeholder)."""
    spec = model.args.modalities[index]
    if table == "enc":
        start, size = int(model.enc_token_offset[index]), 1 if spec.pixel_input else spec.vocab_size
    else:
        start, size = int(model.token_offset[index]), spec.vocab_size
    return slice(start, start + size)


def _trunk_pairs(args: FourMArgs) -> list[tuple[str, str]]:
    """(ml-4m key, our key) of the trunk tensors that map one to one (the MLPs are split/fused separately)."""
    pairs = [("encoder_norm.weight", "encoder_norm.weight"), ("decoder_norm.weight", "decoder_norm.weight"),
             ("decoder_proj_context.weight", "context_proj.weight")]
    for i in range(args.encoder_layers):
        for name in ("norm1.weight", "attn.qkv.weight", "attn.proj.weight", "norm2.weight"):
            pairs.append((f"encoder.{i}.{name}", f"encoder.{i}.{name}"))
    for i in range(args.decoder_layers):
        for name in ("norm1.weight", "self_attn.qkv.weight", "self_attn.proj.weight", "query_norm.weight",
                     "context_norm.weight", "cross_attn.q.weight", "cross_attn.kv.weight", "cross_attn.proj.weight",
                     "norm2.weight"):
            pairs.append((f"decoder.{i}.{name}", f"decoder.{i}.{name}"))
    return pairs


def _norm_bias_keys(args: FourMArgs) -> list[str]:
    """ml-4m's LayerNorm keeps a zero ``bias`` buffer in its bias-free models: one per norm."""
    keys = ["encoder_norm.bias", "decoder_norm.bias"]
    keys += [f"encoder.{i}.{n}.bias" for i in range(args.encoder_layers) for n in ("norm1", "norm2")]
    keys += [f"decoder.{i}.{n}.bias" for i in range(args.decoder_layers)
             for n in ("norm1", "query_norm", "context_norm", "norm2")]
    return keys


def _blocks(args: FourMArgs) -> list[str]:
    return [f"encoder.{i}" for i in range(args.encoder_layers)] + [f"decoder.{i}" for i in range(args.decoder_layers)]


def _positions(spec: ModalitySpec, dim: int) -> torch.Tensor:
    """ml-4m's ``pos_emb`` buffer [1, N, D] of ``spec``."""
    if spec.kind == "image":
        return sincos_2d(*spec.grid, dim, TEMPERATURE).unsqueeze(0)
    return sincos_1d(SEQUENCE_POSITIONS, dim, TEMPERATURE).unsqueeze(0)


def _patch_to_ml4m(weight: torch.Tensor, patch: int) -> torch.Tensor:
    """Our patch projection (input laid out c, ph, pw) as ml-4m's (ph, pw, c)."""
    d = weight.shape[0]
    return weight.reshape(d, 3, patch, patch).permute(0, 2, 3, 1).reshape(d, -1)


def _patch_from_ml4m(weight: torch.Tensor, patch: int) -> torch.Tensor:
    d = weight.shape[0]
    return weight.reshape(d, patch, patch, 3).permute(0, 3, 1, 2).reshape(d, -1)


def ml4m_state(model: FourM) -> dict[str, torch.Tensor]:
    """``model``'s weights as ml-4m's ``FM`` state dict (every key ``FM(config).state_dict()`` has, shared
    modality embeddings under both names)."""
    reasons = ml4m_unexpressible(model.args)
    if reasons:
        raise Ml4mError("this model cannot be written in ml-4m's format: " + "; ".join(reasons))
    args, ours = model.args, {k: v.detach().cpu().float() for k, v in model.state_dict().items()}
    dim = args.dim
    state: dict[str, torch.Tensor] = {}
    for theirs, key in _trunk_pairs(args):
        state[theirs] = ours[key].clone()
    for block in _blocks(args):
        gate, up = ours[f"{block}.mlp.gate_up.weight"].chunk(2, dim=0)
        state[f"{block}.mlp.fc1.weight"], state[f"{block}.mlp.fc3.weight"] = gate.clone(), up.clone()
        state[f"{block}.mlp.fc2.weight"] = ours[f"{block}.mlp.down.weight"].clone()
    for key in _norm_bias_keys(args):
        state[key] = torch.zeros(dim)
    state["decoder_proj_context.bias"] = ours["context_proj.bias"].clone() if args.context_bias else torch.zeros(dim)
    state["mask_token"] = ours["mask_token"].reshape(1, 1, dim).clone()
    head = ours["dec_token_embed.weight"] if args.tie_embeddings else ours["head.weight"]
    for index, spec in enumerate(args.modalities):
        domain = DOMAINS[spec.name]
        mod_emb = ours["modality_embed.weight"][index].reshape(1, 1, dim)
        dec = f"decoder_embeddings.{domain.name}"
        state[f"{dec}.token_emb.weight"] = ours["dec_token_embed.weight"][_rows(model, "dec", index)].clone()
        state[f"{dec}.to_logits.weight"] = head[_rows(model, "dec", index)].clone()
        state[f"{dec}.mod_emb"] = mod_emb.clone()
        state[f"{dec}.pos_emb"] = _positions(spec, dim)
        if spec.pixel_input:
            enc = f"encoder_embeddings.{PIXEL_DOMAIN}"
            pixel_emb = ours["pixel_modality_embed"] if args.pixel_modality_embed else ours["modality_embed.weight"][
                index]
            state[f"{enc}.proj.weight"] = _patch_to_ml4m(ours["patch_embed.weight"], spec.patch_size)
            state[f"{enc}.mod_emb"] = pixel_emb.reshape(1, 1, dim).clone()
            state[f"{enc}.pos_emb"] = _positions(spec, dim)
        else:
            enc = f"encoder_embeddings.{domain.name}"
            state[f"{enc}.token_emb.weight"] = ours["enc_token_embed.weight"][_rows(model, "enc", index)].clone()
            # the encoder's mod_emb is the decoder's (share_modality_embeddings): ml-4m's save_pretrained writes the
            # shared tensor once, under the decoder's name, and FM.from_pretrained(strict=True) expects just that
            state[f"{enc}.pos_emb"] = _positions(spec, dim)
    return {k: v.contiguous() for k, v in state.items()}


def export_ml4m(model: FourM, output: Store | str | Path, card: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write ``model`` as an ml-4m folder at ``output`` (a store, a URI or a path): ``config.json``,
    ``model.safetensors`` (the config also in its metadata, for ``fourm.utils.load_safetensors``) and
    ``fourm-kfp.json`` (``card``: what the model is in our terms). Returns the config. Raises :class:`Ml4mError`
    naming every reason when the model cannot be written."""
    store = output if isinstance(output, Store) else open_store(str(output), create=True)
    state = ml4m_state(model)
    config = ml4m_config(model.args)
    metadata = {key: json.dumps(value) for key, value in config.items()}  # YAML reads JSON values back
    with tempfile.TemporaryDirectory(prefix="fourm-ml4m-") as tmp:
        path = Path(tmp) / WEIGHTS
        save_file(dict(sorted(state.items())), str(path), metadata=metadata)
        store.put_file(WEIGHTS, path)
    store.put_bytes(CONFIG, json.dumps(config, indent=2).encode())
    if card is not None:
        store.put_bytes(EXPORT_CARD, json.dumps(card, indent=2, sort_keys=True).encode())
    return config


# -- ml-4m -> ours --------------------------------------------------------------------------------------------------

def read_ml4m(source: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``(config, tensors)`` of an ml-4m folder (``config.json`` + ``model.safetensors``) or ``.safetensors``
    file (config in its metadata), local or ``s3://``."""
    uri = str(source)
    with tempfile.TemporaryDirectory(prefix="fourm-ml4m-") as tmp:
        local = Path(tmp) / WEIGHTS
        if uri.endswith(".safetensors"):
            store, name = file_store(uri)
            if not name or not store.exists(name):
                raise Ml4mError(f"{uri}: no such file")
            store.get_file(name, local)
            config = None
        else:
            store = open_store(uri)
            for key in (CONFIG, WEIGHTS):
                if not store.exists(key):
                    raise Ml4mError(f"{store.uri_of(key)}: missing (an ml-4m folder holds {CONFIG} and {WEIGHTS})")
            config = json.loads(store.get_bytes(CONFIG))
            store.get_file(WEIGHTS, local)
        with safe_open(str(local), framework="pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
            if config is None:
                metadata = f.metadata() or {}
                config = {k: _metadata_value(v) for k, v in metadata.items()}
    for key in ("domains_in", "domains_out", "dim", "encoder_depth", "decoder_depth", "num_heads"):
        if key not in config:
            raise Ml4mError(f"{uri}: the config has no {key!r} (is this an ml-4m FM model?)")
    return config, tensors


def _metadata_value(text: str) -> Any:
    """A safetensors metadata value as ml-4m reads it (YAML, ``None`` as null)."""
    try:
        return yaml.safe_load(text.replace("None", "null"))
    except yaml.YAMLError:
        return text


def refusals(config: dict[str, Any]) -> list[str]:
    """Why a config is not a ``*_swiglu_nobias`` trunk we compute exactly (empty: it is). A key the config leaves
    out has ml-4m's ``FourM`` default (:data:`FOURM_DEFAULTS`)."""
    reasons = []
    for key, want in SWIGLU_NOBIAS.items():
        have = config.get(key, FOURM_DEFAULTS.get(key))
        if have != want:  # 4 == 4.0: an int ratio is the same ratio
            reasons.append(f"{key} is {have!r}, fourm-kfp computes {want!r} (ml-4m's *_swiglu_nobias models)")
    if config.get("image_size", IMAGE_SIZE) != IMAGE_SIZE or config.get("patch_size", PATCH_SIZE) != PATCH_SIZE:
        reasons.append(f"image_size/patch_size {config.get('image_size')}/{config.get('patch_size')}, expected "
                       f"{IMAGE_SIZE}/{PATCH_SIZE}")
    return reasons


def import_ml4m(source: str | Path, modalities: Sequence[str] | None = None,
                rgb_input: str | None = None) -> tuple[FourM, Ml4mImport]:
    """An ml-4m model (folder or ``.safetensors`` file, local or ``s3://``) as our :class:`FourM` (in eval mode,
    on the CPU) and what was taken.

    ``modalities``: keep only these of ours (default: every one the source has a domain for). ``rgb_input``:
    ``"pixels"`` (rgb from ``rgb@224``'s patches) or ``"tokens"`` (from ``tok_rgb@224``'s); default pixels when
    the source has ``rgb@224``. Raises :class:`Ml4mError` for a trunk we do not compute exactly, and for tensors
    whose shape disagrees with the config."""
    config, tensors = read_ml4m(source)
    report = Ml4mImport(str(source))
    reasons = refusals(config)
    if reasons:
        raise Ml4mError(f"{source}: not importable: " + "; ".join(reasons))
    domains_in, domains_out = list(config["domains_in"]), list(config["domains_out"])
    dim, heads = int(config["dim"]), int(config["num_heads"])
    pixels = PIXEL_DOMAIN in domains_in and rgb_input != "tokens" and (modalities is None or "rgb" in modalities)
    if rgb_input == "pixels" and PIXEL_DOMAIN not in domains_in:
        raise Ml4mError(f"{source}: rgb_input 'pixels' but the model has no {PIXEL_DOMAIN} input")
    names = []
    for domain in dict.fromkeys(domains_in + domains_out):
        ours = "rgb" if domain == PIXEL_DOMAIN else _BY_DOMAIN.get(domain)
        if ours is None:
            report.dropped_domains.append(f"{domain}: no such modality in fourm-kfp")
        elif modalities is not None and ours not in modalities:
            report.dropped_domains.append(f"{domain}: {ours!r} not among the modalities asked for")
        elif domain == PIXEL_DOMAIN and not pixels:
            report.dropped_domains.append(f"{domain}: rgb is read as tokens here")
        elif ours not in names:
            names.append(ours)
    if not names:
        raise Ml4mError(f"{source}: none of its domains {domains_in + domains_out} is a fourm-kfp modality "
                        f"{'among ' + str(list(modalities)) if modalities is not None else ''}")
    specs = []
    for name in names:  # in the config's order (an exported model comes back in its own)
        domain = DOMAINS[name]
        if domain.kind == "image":
            pixel = name == "rgb" and pixels
            specs.append(ModalitySpec(name, "image", domain.vocab_size, grid=domain.grid, pixel_input=pixel,
                                      patch_size=PATCH_SIZE if pixel else 0,
                                      pixel_normalisation="imagenet" if pixel else "symmetric"))
        else:
            specs.append(ModalitySpec(name, "sequence", domain.vocab_size, max_length=domain.max_length))
    pixel_separate = pixels and _pixel_embed_separate(tensors)
    args = FourMArgs(tuple(specs), encoder_layers=int(config["encoder_depth"]),
                     decoder_layers=int(config["decoder_depth"]), dim=dim, heads=heads, tie_embeddings=False,
                     position_temperature=TEMPERATURE, context_bias=True, pixel_modality_embed=pixel_separate)
    model = FourM(args)
    _load(model, tensors, report, str(source))
    return model.eval(), report


def _pixel_embed_separate(tensors: dict[str, torch.Tensor]) -> bool:
    """Whether ``rgb@224``'s modality embedding differs from ``tok_rgb@224``'s (ml-4m's own training gives them
    separate ones; a model exported from ours with one embedding has them equal)."""
    pixel = tensors.get(f"encoder_embeddings.{PIXEL_DOMAIN}.mod_emb")
    token = tensors.get(f"decoder_embeddings.{DOMAINS['rgb'].name}.mod_emb",
                        tensors.get(f"encoder_embeddings.{DOMAINS['rgb'].name}.mod_emb"))
    return pixel is not None and (token is None or not torch.equal(pixel, token))


def _load(model: FourM, tensors: dict[str, torch.Tensor], report: Ml4mImport, source: str) -> None:
    """Fill ``model`` from ml-4m's ``tensors``; every key used goes to ``report.imported``, every other one to
    ``report.dropped`` with its reason, and our parameters that got nothing to ``report.missing``."""
    args, dim = model.args, model.args.dim
    state = {k: v.clone() for k, v in model.state_dict().items()}
    used: set[str] = set()
    dropped: dict[str, str] = {}
    filled: set[str] = set()

    def take(key: str, shape: tuple[int, ...]) -> torch.Tensor | None:
        if key not in tensors:
            return None
        value = tensors[key]
        if tuple(value.shape) != tuple(shape):
            raise Ml4mError(f"{source}: {key} has shape {list(value.shape)}, the config implies {list(shape)}")
        used.add(key)
        return value.float()

    def put(ours: str, value: torch.Tensor | None, rows: slice | None = None, label: str | None = None) -> None:
        if value is None:
            return
        if rows is None:
            state[ours] = value.reshape(state[ours].shape).clone()
        else:
            state[ours][rows] = value
        filled.add(label or ours)

    for theirs, ours in _trunk_pairs(args):
        put(ours, take(theirs, tuple(state[ours].shape)))
    bias = take("decoder_proj_context.bias", (dim,))
    put("context_proj.bias", bias if bias is not None else torch.zeros(dim))
    hidden = state["encoder.0.mlp.down.weight"].shape[1] if args.encoder_layers else \
        state["decoder.0.mlp.down.weight"].shape[1]
    for block in _blocks(args):
        gate, up = take(f"{block}.mlp.fc1.weight", (hidden, dim)), take(f"{block}.mlp.fc3.weight", (hidden, dim))
        if gate is not None and up is not None:
            put(f"{block}.mlp.gate_up.weight", torch.cat([gate, up]))
        put(f"{block}.mlp.down.weight", take(f"{block}.mlp.fc2.weight", (dim, hidden)))
    for key in _norm_bias_keys(args):
        value = take(key, (dim,))
        if value is not None and value.abs().max() > 0:
            raise Ml4mError(f"{source}: {key} is not zero: the model has LayerNorm biases (norm_bias), which "
                            f"fourm-kfp does not compute")
    put("mask_token", take("mask_token", (1, 1, dim)))
    head = "dec_token_embed.weight" if args.tie_embeddings else "head.weight"
    for index, spec in enumerate(args.modalities):
        domain = DOMAINS[spec.name]
        rows_dec = _rows(model, "dec", index)
        dec = f"decoder_embeddings.{domain.name}"
        put("dec_token_embed.weight", take(f"{dec}.token_emb.weight", (spec.vocab_size, dim)), rows_dec,
            f"dec_token_embed[{spec.name}]")
        put(head, take(f"{dec}.to_logits.weight", (spec.vocab_size, dim)), rows_dec, f"head[{spec.name}]")
        mod = take(f"{dec}.mod_emb", (1, 1, dim))
        _check_positions(take(f"{dec}.pos_emb", tuple(_positions(spec, dim).shape)), spec, dim,
                         f"{dec}.pos_emb", source)
        if spec.pixel_input:
            enc = f"encoder_embeddings.{PIXEL_DOMAIN}"
            proj = take(f"{enc}.proj.weight", (dim, 3 * spec.patch_size ** 2))
            put("patch_embed.weight", None if proj is None else _patch_from_ml4m(proj, spec.patch_size))
            pixel_mod = take(f"{enc}.mod_emb", (1, 1, dim))
            if args.pixel_modality_embed:
                put("pixel_modality_embed", pixel_mod)
            elif mod is None:
                mod = pixel_mod
            _check_positions(take(f"{enc}.pos_emb", tuple(_positions(spec, dim).shape)), spec, dim,
                             f"{enc}.pos_emb", source)
            token_enc = f"encoder_embeddings.{domain.name}"
            shared = take(f"{token_enc}.mod_emb", (1, 1, dim))  # the token input's embedding (shared with dec)
            mod = mod if mod is not None else shared
            for key in sorted(k for k in tensors if k.startswith(token_enc + ".") and k not in used):
                dropped[key] = f"rgb reads pixel patches here, not {domain.name} tokens"
        else:
            enc = f"encoder_embeddings.{domain.name}"
            put("enc_token_embed.weight", take(f"{enc}.token_emb.weight", (spec.vocab_size, dim)),
                _rows(model, "enc", index), f"enc_token_embed[{spec.name}]")
            enc_mod = take(f"{enc}.mod_emb", (1, 1, dim))
            if enc_mod is not None and mod is not None and not torch.equal(enc_mod, mod):
                raise Ml4mError(f"{source}: {enc}.mod_emb and {dec}.mod_emb differ; fourm-kfp shares one modality "
                                f"embedding between encoder and decoder (ml-4m's share_modality_embeddings)")
            mod = mod if mod is not None else enc_mod
            _check_positions(take(f"{enc}.pos_emb", tuple(_positions(spec, dim).shape)), spec, dim,
                             f"{enc}.pos_emb", source)
        if mod is not None:
            state["modality_embed.weight"][index] = mod.reshape(dim)
            filled.add(f"modality_embed[{spec.name}]")
    for key in sorted(set(tensors) - used - set(dropped)):
        embedding = key.startswith(("encoder_embeddings.", "decoder_embeddings."))
        dropped[key] = "its domain is not imported" if embedding else "no place for it in fourm-kfp's model"
    model.load_state_dict(state)
    report.imported = sorted(used)
    report.dropped = [f"{key}: {why}" for key, why in sorted(dropped.items())]
    report.dropped_parameters = sum(tensors[key].numel() for key in dropped)
    report.missing = _missing(model, filled)


def _check_positions(value: torch.Tensor | None, spec: ModalitySpec, dim: int, key: str, source: str) -> None:
    if value is None:
        return
    expected = _positions(spec, dim)
    error = (value - expected).abs().max().item()
    if not math.isfinite(error) or error > POSITION_ATOL:
        raise Ml4mError(f"{source}: {key} differs from the fixed sin-cos positions (temperature {TEMPERATURE:g}) "
                        f"by {error:.2g}: learned positions are not supported")


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

