"""Which of our modalities ml-4m can hold, as which of its domains, and what is refused, by name, in each direction.

ml-4m names its encoder and decoder inputs *domains* (``fourm/data/modality_info.py``): ``tok_rgb@224`` tokens,
``rgb@224`` pixel patches, ``caption`` text, ... Each modality record's ``ml4m`` entry
(:class:`~fourm_kfp.data.modalities.Ml4mDomain`) says which domain it is exchanged as; a record whose ``ml4m`` is
None has none, and a model holding it cannot be written in ml-4m's format (:func:`ml4m_unexpressible` says so by
name; importing leaves such a modality out, since no ml-4m model has it).

Refused on export (:func:`ml4m_unexpressible`): a modality without a domain, a grid or vocabulary the domain does
not have, a text longer than its positions, pixel patches ml-4m does not read, and a trunk switch ml-4m does not
compute (temperature, LayerNorm eps, a width its 2-D positions cannot split). Refused on import (:func:`refusals`):
anything that is not a ``*_swiglu_nobias`` trunk. Dropped on import (:func:`import_modalities`): the domains we have
no modality for, and those not asked for, each with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from fourm_kfp.batch import ModalitySpec
from fourm_kfp.data.modalities import MODALITIES
from fourm_kfp.model.fourm import FourMArgs

IMAGE_SIZE, PATCH_SIZE = 224, 16
GRID = (IMAGE_SIZE // PATCH_SIZE, IMAGE_SIZE // PATCH_SIZE)
PIXEL_DOMAIN = "rgb@224"  # rgb as pixel patches (encoder only)
TEMPERATURE = 10000.0


class Ml4mError(ValueError):
    """A model or folder that cannot be converted; the message names the reason and the place."""


@dataclass(frozen=True)
class Domain:
    """One of ml-4m's token domains (``fourm/data/modality_info.py``): a modality record's ``ml4m`` entry with the
    modality's kind."""

    name: str
    kind: str  # "image" | "sequence"
    vocab_size: int
    max_length: int = 0  # sequence: the longest text its embeddings take (ml-4m's ``max_length``)
    grid: tuple[int, int] = GRID  # image: its token grid at 224 px


#: our modality -> ml-4m's token domain (the modalities whose record has an ``ml4m`` entry)
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


def _no_domain(name: str) -> str:
    """Why modality ``name`` has no ml-4m domain, and what to do about it."""
    if name in MODALITIES:
        return (f"modality {name!r} has no ml-4m domain (its modality record's ml4m is None): ml-4m's format cannot "
                f"hold it; train the model without it (leave it out of data.modalities) to export to ml-4m")
    return f"modality {name!r} has no ml-4m domain (ml-4m has {sorted(_BY_DOMAIN)})"


# -- ours -> ml-4m --------------------------------------------------------------------------------------------------

def ml4m_unexpressible(args: FourMArgs) -> list[str]:
    """Why ``args``' model cannot be written in ml-4m's format (empty: it can)."""
    reasons = []
    for spec in args.modalities:
        domain = DOMAINS.get(spec.name)
        if domain is None:
            reasons.append(_no_domain(spec.name))
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


# -- ml-4m -> ours --------------------------------------------------------------------------------------------------

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


def import_modalities(config: dict[str, Any], modalities: Sequence[str] | None, pixels: bool, source: str
                      ) -> tuple[list[str], list[str]]:
    """``(ours, dropped)``: our modalities an ml-4m ``config``'s domains give, in the config's order (an exported model
    comes back in its own), and each domain left out with its reason. ``modalities``: keep only these of ours (one
    without an ml-4m domain cannot be in the source, so it is left out); ``pixels``: rgb is read from ``rgb@224``'s
    patches. Raises :class:`Ml4mError` when none is left."""
    domains = list(config["domains_in"]) + list(config["domains_out"])
    names, dropped = [], []
    for domain in dict.fromkeys(domains):
        ours = "rgb" if domain == PIXEL_DOMAIN else _BY_DOMAIN.get(domain)
        if ours is None:
            dropped.append(f"{domain}: no such modality in fourm-kfp")
        elif modalities is not None and ours not in modalities:
            dropped.append(f"{domain}: {ours!r} not among the modalities asked for")
        elif domain == PIXEL_DOMAIN and not pixels:
            dropped.append(f"{domain}: rgb is read as tokens here")
        elif ours not in names:
            names.append(ours)
    if not names:
        without = [name for name in modalities or () if name not in DOMAINS]
        raise Ml4mError(f"{source}: none of its domains {domains} is a fourm-kfp modality "
                        f"{'among ' + str(list(modalities)) if modalities is not None else ''}"
                        + (f" ({', '.join(without)}: no ml-4m domain)" if without else ""))
    return names, dropped


def import_spec(name: str, pixels: bool) -> ModalitySpec:
    """Our modality ``name`` at its ml-4m domain's vocabulary and grid (rgb from pixel patches when ``pixels``)."""
    domain = DOMAINS[name]
    if domain.kind == "image":
        pixel = name == "rgb" and pixels
        return ModalitySpec(name, "image", domain.vocab_size, grid=domain.grid, pixel_input=pixel,
                            patch_size=PATCH_SIZE if pixel else 0,
                            pixel_normalisation="imagenet" if pixel else "symmetric")
    return ModalitySpec(name, "sequence", domain.vocab_size, max_length=domain.max_length)
