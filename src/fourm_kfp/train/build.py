"""From config and committed inputs to the objects training needs: modality specs, model, masking and loaders.

The model's modalities are the data config's input and target modalities that the pretokenized dataset holds,
in the data config's order: an image modality with its codebook and token grid (``rgb`` optionally as pixel
patches, normalised as ``train.model.pixel_normalisation`` says), a text modality with the shared WordPiece vocabulary
and ``train.model.max_text_length`` positions, masked under ``train.model.text_conventions`` (the sentinels masking
uses, and the ``[EOS]`` the loader appends under ml-4m's).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import torch

from fourm_kfp.batch import ModalitySpec
from fourm_kfp.data.pretokenized import token_name
from fourm_kfp.hardware import loader_workers
from fourm_kfp.masking.dirichlet_masking import MixtureComponent
from fourm_kfp.masking.multimodal_masking import MaskingArgs
from fourm_kfp.masking.token_loader import DatasetRef, LoaderArgs
from fourm_kfp.model.fourm import FourMArgs
from fourm_kfp.storage import open_store
from fourm_kfp.tokenizers.bundle import INDEX_FILE
from fourm_kfp.tokenizers.text_tokenizer import text_eos, text_sentinels

TEXT_TOKENIZER = "text/tokenizer.json"


@dataclass(frozen=True)
class TrainingInputs:
    """What the committed upstream outputs say: the pretokenized index, the tokenizer index and text tokenizer."""

    pretokenized_uri: str
    tokenizers_uri: str
    pretokenized: dict[str, Any]
    tokenizers: dict[str, Any]
    text_tokenizer_json: str

    @classmethod
    def read(cls, pretokenized_uri: str, tokenizers_uri: str) -> "TrainingInputs":
        from fourm_kfp.masking.token_loader import read_index

        store = open_store(tokenizers_uri)
        text = store.get_text(TEXT_TOKENIZER) if store.exists(TEXT_TOKENIZER) else ""
        return cls(pretokenized_uri, tokenizers_uri, read_index(pretokenized_uri),
                   json.loads(store.get_bytes(INDEX_FILE)), text)

    @property
    def special_tokens(self) -> dict[str, int]:
        return (self.tokenizers.get("text") or {}).get("special_tokens", {})


def modality_specs(config: Any, inputs: TrainingInputs) -> tuple[ModalitySpec, ...]:
    """The model's modalities (see the module docstring)."""
    data, model = config.data, config.train.model
    wanted = [m for m in data.modalities if m in data.input_modalities or m in data.target_modalities]
    grids = inputs.pretokenized["modalities"]
    text = inputs.pretokenized.get("text", {})
    specs = []
    for name in wanted:
        if token_name(name) in grids:
            info = grids[token_name(name)]
            grid = tuple(info["grid"])
            pixels = name == "rgb" and model.rgb_input == "pixels" and inputs.pretokenized.get("rgb_pixels")
            specs.append(ModalitySpec(name, "image", info["vocab_size"], grid=grid, pixel_input=bool(pixels),
                                      patch_size=data.image_size // grid[1] if pixels else 0,
                                      pixel_normalisation=model.pixel_normalisation if pixels else "symmetric"))
        elif name in text.get("modalities", []):
            specs.append(ModalitySpec(name, "sequence", text["vocab_size"], max_length=model.max_text_length))
    if not specs:
        raise ValueError(f"the pretokenized data at {inputs.pretokenized_uri} holds none of the modalities "
                         f"{wanted}")
    return tuple(specs)


def model_args(config: Any, specs: tuple[ModalitySpec, ...]) -> FourMArgs:
    train = config.train
    return FourMArgs(specs, encoder_layers=train.model.encoder_layers, decoder_layers=train.model.decoder_layers,
                     dim=train.model.dim, heads=train.model.heads, tie_embeddings=train.model.tie_embeddings,
                     label_smoothing=train.label_smoothing, loss_weighting=train.loss_weighting,
                     position_temperature=train.model.position_temperature, context_bias=train.model.context_bias,
                     pixel_modality_embed=train.model.pixel_modality_embed)


def masking_args(config: Any, specs: tuple[ModalitySpec, ...], inputs: TrainingInputs) -> MaskingArgs:
    """Budgets, the alphas mixture over ``specs`` (a modality a component does not name gets alpha 0), and the
    sentinel ids of the text tokenizer and the id appended to each text, as ``train.model.text_conventions`` says."""
    names = [s.name for s in specs]
    mixture = tuple(MixtureComponent(c.weight, tuple(c.input_alphas.get(n, 0.0) for n in names),
                                     tuple(c.target_alphas.get(n, 0.0) for n in names))
                    for c in config.alphas.mixture)
    usable = [c for c in mixture if any(c.input_alphas) and any(c.target_alphas)]
    if not usable:
        raise ValueError(f"no alphas component has both an input and a target among the model's modalities {names}")
    conventions, specials = config.train.model.text_conventions, inputs.special_tokens
    sentinels = text_sentinels(specials, conventions)
    return MaskingArgs(specs, config.train.input_budget, config.train.target_budget, tuple(usable),
                       sentinels or tuple(range(4, 24)), config.train.span_mean_length,
                       config.train.fill_budgets, text_eos(specials, conventions) if specials else None)


def loader_args(config: Any, inputs: TrainingInputs, masking: MaskingArgs, batch_size: int, rank: int,
                world_size: int, device: torch.device) -> LoaderArgs:
    """The loader of this rank on ``device`` (pinned memory and, with ``train.loader_workers: -1``, more worker
    processes on a GPU: :func:`fourm_kfp.hardware.loader_workers`)."""
    datasets = (DatasetRef(inputs.pretokenized_uri, config.data.weight),
                *(DatasetRef(uri, weight) for uri, weight in config.data.extra_datasets.items()))
    return LoaderArgs(datasets, masking, inputs.text_tokenizer_json, batch_size, seed=config.train.seed, rank=rank,
                      world_size=world_size, num_workers=loader_workers(config.train.loader_workers, device),
                      pin_memory=device.type == "cuda")
