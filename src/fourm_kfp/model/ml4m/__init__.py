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
that cannot be written exactly (a grid or vocabulary ml-4m's domain does not have, a modality whose record has no ``ml4m``
domain, a text longer than its positions) is refused with the reasons (:func:`ml4m_unexpressible`); importing refuses
anything that is not a ``*_swiglu_nobias`` trunk, names every key it has no place for, and lists the domains it drops.

An exported folder also holds ``fourm-kfp.json`` (what the model is, in our terms: its card), which ml-4m ignores.

The conversion is split the way torchtitan's ``state_dict_adapter.py`` separates a checkpoint format from the model:

* :mod:`~fourm_kfp.model.ml4m.domains`: which of our modalities is which ml-4m domain, and what each direction
  refuses, by name;
* :mod:`~fourm_kfp.model.ml4m.key_map`: the one table of where each ml-4m tensor is ours, read in both directions
  (:func:`~fourm_kfp.model.ml4m.key_map.to_ml4m`, :func:`~fourm_kfp.model.ml4m.key_map.from_ml4m`);
* :mod:`~fourm_kfp.model.ml4m.folder`: the files (``config.json``, ``model.safetensors``, a ``.safetensors`` file's
  metadata), read and written in ``save_pretrained``'s layout;
* :mod:`~fourm_kfp.model.ml4m.convert`: :func:`import_ml4m` and :func:`export_ml4m`, the three in turn.
"""

from fourm_kfp.model.ml4m.convert import export_ml4m, import_ml4m, ml4m_state
from fourm_kfp.model.ml4m.domains import (
    DOMAINS,
    FOURM_DEFAULTS,
    GRID,
    IMAGE_SIZE,
    PATCH_SIZE,
    PIXEL_DOMAIN,
    SWIGLU_NOBIAS,
    TEMPERATURE,
    Domain,
    Ml4mError,
    ml4m_config,
    ml4m_unexpressible,
    refusals,
)
from fourm_kfp.model.ml4m.folder import CONFIG, EXPORT_CARD, WEIGHTS, read_ml4m
from fourm_kfp.model.ml4m.key_map import POSITION_ATOL, SEQUENCE_POSITIONS, Ml4mImport

__all__ = ["CONFIG", "DOMAINS", "EXPORT_CARD", "FOURM_DEFAULTS", "GRID", "IMAGE_SIZE", "PATCH_SIZE", "PIXEL_DOMAIN",
           "POSITION_ATOL", "SEQUENCE_POSITIONS", "SWIGLU_NOBIAS", "TEMPERATURE", "WEIGHTS", "Domain", "Ml4mError",
           "Ml4mImport", "export_ml4m", "import_ml4m", "ml4m_config", "ml4m_state", "ml4m_unexpressible", "read_ml4m",
           "refusals"]
