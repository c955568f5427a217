"""Modality tokenizers: every modality becomes a sequence of discrete tokens.

* Image-like modalities (rgb, depth, normal, semseg, edge, ...; a teacher's feature map, clip and dinov2, too) use a
  VQ-VAE (:mod:`.vqvae`) with an EMA, cosine-similarity codebook (:mod:`.vector_quantizer`). How a modality's
  in-memory arrays become network inputs, which loss fits it and how decoder outputs become arrays again lives in
  the codec registry (:mod:`.modality_codecs`); per-modality error metrics and trivial baselines in :mod:`.metrics`.
* Sequence modalities (det, caption, color_palette, metadata) share one WordPiece tokenizer (:mod:`.text_tokenizer`)
  whose vocabulary holds the coordinate tokens ``v0=0`` .. ``v3=999``, the class names and 4M's span-masking
  sentinels (or ml-4m's own WordPiece, ``train_tokenizers.text_tokenizer_from``).
* :mod:`.ml4m`: apple/ml-4m's own tokenizers (ViT VQ-VAEs and diffusion DiVAEs), read from their folders and used
  instead of training one (``train_tokenizers.from_ml4m``).
* :mod:`.training` trains a VQ-VAE (single process or DDP; checkpointed and resumed when given a checkpoint store)
  and evaluates it against a trivial baseline; :mod:`.image_batches` streams its training batches from a dataset's
  shards with a position a checkpoint holds; :mod:`.parallel_training` trains several side by side in forked
  single-thread processes; :mod:`.saved_tokenizer` stores it as ``config.json`` + ``model.safetensors`` (no pickles).
"""

from fourm_kfp.tokenizers.modality_codecs import CODECS, ImageCodec, fit_normalisation, get_codec
from fourm_kfp.tokenizers.saved_tokenizer import load_image_tokenizer, save_image_tokenizer
from fourm_kfp.tokenizers.text_tokenizer import (
    decode,
    encode,
    load_text_tokenizer,
    mean_tokens_per_text,
    save_text_tokenizer,
    special_token_ids,
    train_text_tokenizer,
    unknown_token_rate,
)
from fourm_kfp.tokenizers.training import evaluate_tokenizer, train_vqvae
from fourm_kfp.tokenizers.vector_quantizer import VectorQuantizer
from fourm_kfp.tokenizers.vqvae import VQVAE, VQVAEConfig

__all__ = [
    "CODECS",
    "ImageCodec",
    "VQVAE",
    "VQVAEConfig",
    "VectorQuantizer",
    "decode",
    "encode",
    "evaluate_tokenizer",
    "fit_normalisation",
    "get_codec",
    "load_image_tokenizer",
    "load_text_tokenizer",
    "mean_tokens_per_text",
    "save_image_tokenizer",
    "save_text_tokenizer",
    "special_token_ids",
    "train_text_tokenizer",
    "train_vqvae",
    "unknown_token_rate",
]
