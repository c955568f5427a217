"""The two conversions: :func:`export_ml4m` (our model as an ml-4m folder) and :func:`import_ml4m` (an ml-4m model as
ours), each the domains' refusals (:mod:`~fourm_kfp.model.ml4m.domains`), the key map
(:mod:`~fourm_kfp.model.ml4m.key_map`) and the files (:mod:`~fourm_kfp.model.ml4m.folder`), in that order."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch

from fourm_kfp.model.fourm import FourM, FourMArgs
from fourm_kfp.model.ml4m.domains import (DOMAINS, PIXEL_DOMAIN, TEMPERATURE, Ml4mError, import_modalities,
                                          import_spec, ml4m_config, ml4m_unexpressible, refusals)
from fourm_kfp.model.ml4m.folder import read_ml4m, write_ml4m
from fourm_kfp.model.ml4m.key_map import Ml4mImport, from_ml4m, to_ml4m
from fourm_kfp.storage import Store, open_store


def ml4m_state(model: FourM) -> dict[str, torch.Tensor]:
    """``model``'s weights as ml-4m's ``FM`` state dict (every key ``FM(config).state_dict()`` has, shared
    modality embeddings under the decoder's name). Raises :class:`Ml4mError` naming every reason when the model
    cannot be written (:func:`~fourm_kfp.model.ml4m.domains.ml4m_unexpressible`)."""
    reasons = ml4m_unexpressible(model.args)
    if reasons:
        raise Ml4mError("this model cannot be written in ml-4m's format: " + "; ".join(reasons))
    return to_ml4m(model)


def export_ml4m(model: FourM, output: Store | str | Path, card: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write ``model`` as an ml-4m folder at ``output`` (a store, a URI or a path): ``config.json``,
    ``model.safetensors`` (the config also in its metadata, for ``fourm.utils.load_safetensors``) and
    ``fourm-kfp.json`` (``card``: what the model is in our terms). Returns the config. Raises :class:`Ml4mError`
    naming every reason when the model cannot be written."""
    store = output if isinstance(output, Store) else open_store(str(output), create=True)
    state = ml4m_state(model)
    config = ml4m_config(model.args)
    write_ml4m(store, state, config, card)
    return config


def import_ml4m(source: str | Path, modalities: Sequence[str] | None = None,
                rgb_input: str | None = None) -> tuple[FourM, Ml4mImport]:
    """An ml-4m model (folder or ``.safetensors`` file, local or ``s3://``) as our :class:`FourM` (in eval mode,
    on the CPU) and what was taken.

    ``modalities``: keep only these of ours (default: every one the source has a domain for; one without an ml-4m
    domain is left out, since no ml-4m model holds it). ``rgb_input``: ``"pixels"`` (rgb from ``rgb@224``'s
    patches) or ``"tokens"`` (from ``tok_rgb@224``'s); default pixels when the source has ``rgb@224``. Raises
    :class:`Ml4mError` for a trunk we do not compute exactly, and for tensors whose shape disagrees with the
    config."""
    config, tensors = read_ml4m(source)
    report = Ml4mImport(str(source))
    reasons = refusals(config)
    if reasons:
        raise Ml4mError(f"{source}: not importable: " + "; ".join(reasons))
    domains_in = list(config["domains_in"])
    pixels = PIXEL_DOMAIN in domains_in and rgb_input != "tokens" and (modalities is None or "rgb" in modalities)
    if rgb_input == "pixels" and PIXEL_DOMAIN not in domains_in:
        raise Ml4mError(f"{source}: rgb_input 'pixels' but the model has no {PIXEL_DOMAIN} input")
    names, report.dropped_domains = import_modalities(config, modalities, pixels, str(source))
    args = FourMArgs(tuple(import_spec(name, pixels) for name in names), encoder_layers=int(config["encoder_depth"]),
                     decoder_layers=int(config["decoder_depth"]), dim=int(config["dim"]),
                     heads=int(config["num_heads"]), tie_embeddings=False, position_temperature=TEMPERATURE,
                     context_bias=True, pixel_modality_embed=pixels and _pixel_embed_separate(tensors))
    model = FourM(args)
    from_ml4m(model, tensors, report, str(source))
    return model.eval(), report


def _pixel_embed_separate(tensors: dict[str, torch.Tensor]) -> bool:
    """Whether ``rgb@224``'s modality embedding differs from ``tok_rgb@224``'s (ml-4m's own training gives them
    separate ones; a model exported from ours with one embedding has them equal)."""
    pixel = tensors.get(f"encoder_embeddings.{PIXEL_DOMAIN}.mod_emb")
    token = tensors.get(f"decoder_embeddings.{DOMAINS['rgb'].name}.mod_emb",
                        tensors.get(f"encoder_embeddings.{DOMAINS['rgb'].name}.mod_emb"))
    return pixel is not None and (token is None or not torch.equal(pixel, token))
