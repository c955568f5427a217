"""ml-4m's VQ tokenizers (``fourm/vq/vqvae.py``) without ml-4m: the encoder and quantizer every tokenizer shares
(:class:`VQEncoder`, ml-4m's ``VQ``; its DiVAEs add a diffusion decoder to it) and the VQ-VAE with a ViT or MLP
decoder (:class:`VQVAE`: semseg, CLIP, DINOv2, ImageBind feature maps; global features and human poses).

A model is built from its folder's ``config.json`` (ml-4m's constructor arguments, :class:`VQConfig`), never by
name from a hub, and its ``model.safetensors`` loads with ml-4m's parameter names:

* ``cls_emb`` (semseg only: ``n_labels`` class ids to ``n_channels`` channels), ``encoder`` (a ViT, :mod:`.vit`, or
  an MLP, :mod:`.mlp`, by ``enc_type``), ``quant_proj`` (a 1x1 convolution to ``latent_dim``), ``quantize``
  (:mod:`.quantizers`, by ``quant_type``);
* a VQ-VAE adds ``post_quant_proj`` (1x1, ``latent_dim`` to the decoder's width) and ``decoder`` (by ``dec_type``),
  whose output has ``n_channels`` channels, or ``n_labels`` logits for semseg.

``encode(x) -> codes`` takes the network input ml-4m's tokenizer takes (:mod:`.conventions` makes it from arrays):
``B x C x H x W`` floats, ``B x H x W`` class ids for semseg, ``B x C x 1 x 1`` for global features. Codes are
``B x H_Q x W_Q`` (``B x heads x H_Q x W_Q`` with several codebooks). ``decode_tokens(codes)`` is the VQ-VAE's
reconstruction (``B x C x H x W``; logits for semseg).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fourm_kfp.tokenizers.ml4m import mlp, quantizers, vit
from fourm_kfp.tokenizers.ml4m.folder import TokenizerFolder, TokenizerFolderError, load_into, read_folder

#: ImageNet's mean and std, which ml-4m's ``undo_std`` takes off before a tokenizer's encoder
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

#: constructor arguments only a DiVAE (diffusion decoder) takes: a config with any of them is not a VQ-VAE's
DIVAE_KEYS = frozenset({"num_train_timesteps", "beta_schedule", "prediction_type", "zero_terminal_snr",
                        "cls_free_guidance_dropout", "conditioning", "dec_transformer_dropout", "thresholding",
                        "clip_sample", "scheduler", "masked_cfg"})
#: state-dict prefixes of the decoder side: what an encoder-only load leaves out (ml-4m's ``encoder_only``)
DECODER_PREFIXES = ("decoder", "post_quant_proj")


@dataclass
class VQConfig:
    """The constructor arguments of ml-4m's ``VQ`` / ``VQVAE`` that shape the network at inference, with ml-4m's
    defaults. Training-only ones (EMA decay, dead-code threshold, commitment weight, k-means init, checkpoint
    paths, freezing) are kept in ``other`` and do not change what is computed."""

    image_size: int = 224
    image_size_enc: int | None = None
    n_channels: int = 3
    n_labels: int | None = None
    enc_type: str = "vit_b_enc"
    patch_proj: bool = True
    post_mlp: bool = False
    patch_size: int = 16
    quant_type: str = "lucid"
    codebook_size: int = 16384
    num_codebooks: int = 1
    latent_dim: int = 32
    norm_codes: bool = True
    norm_latents: bool = False
    undo_std: bool = False
    # VQVAE
    dec_type: str = "vit_b_dec"
    out_conv: bool = False
    image_size_dec: int | None = None
    patch_size_dec: int | None = None
    other: dict[str, Any] = field(default_factory=dict)
    given: frozenset[str] = frozenset()  # the keys the config named (the rest are ml-4m's defaults)

    @classmethod
    def from_dict(cls, config: dict[str, Any], where: str = "config") -> "VQConfig":
        names = {f.name for f in dataclasses.fields(cls)} - {"other", "given"}
        known = {k: v for k, v in config.items() if k in names}
        other = {k: v for k, v in config.items() if k not in names}
        for key in ("image_size", "n_channels", "patch_size", "codebook_size", "num_codebooks", "latent_dim"):
            if key in known:
                known[key] = _integer(known[key], key, where)
        for key in ("image_size_enc", "n_labels", "image_size_dec", "patch_size_dec"):
            if known.get(key) is not None:
                known[key] = _integer(known[key], key, where)
        return cls(**known, other=other, given=frozenset(config))

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.pop("given")
        return {**out.pop("other"), **out}

    @property
    def kind(self) -> str:
        """``divae``, ``vqvae`` (a ViT or MLP decoder) or ``vq`` (encoder and quantizer only). ml-4m's configs do
        not name their class: a saved config holds the arguments passed and the class's own ones, so a DiVAE's
        names its diffusion settings, a VQ-VAE's its decoder's, a ``VQ``'s neither."""
        if DIVAE_KEYS & self.given or self.dec_type.startswith(("unet", "uvit", "controlnet")):
            return "divae"
        if {"dec_type", "out_conv", "image_size_dec", "patch_size_dec"} & self.given:
            return "vqvae" if ("vit" in self.dec_type or "MLP" in self.dec_type) else "other"
        return "vq"


def _integer(value: Any, key: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).isdigit():
        raise TokenizerFolderError(f"{where}: {key!r} must be a whole number, not {value!r}")
    return int(value)


class VQEncoder(nn.Module):
    """ml-4m's ``VQ``: input preparation, encoder, ``quant_proj`` and quantizer (names as in its state dict)."""

    def __init__(self, config: VQConfig | dict[str, Any]):
        super().__init__()
        cfg = config if isinstance(config, VQConfig) else VQConfig.from_dict(config)
        self.config = cfg
        self.cls_emb = nn.Embedding(cfg.n_labels, cfg.n_channels) if cfg.n_labels is not None else None
        if "vit" in cfg.enc_type:
            self.encoder = vit.build_encoder(cfg.enc_type, in_channels=cfg.n_channels, patch_size=cfg.patch_size,
                                             resolution=cfg.image_size_enc or cfg.image_size,
                                             patch_proj=cfg.patch_proj, post_mlp=cfg.post_mlp)
            enc_dim = self.encoder.dim_tokens
        elif "MLP" in cfg.enc_type:
            self.encoder = mlp.build_mlp(cfg.enc_type, dim_in=cfg.n_channels, dim_out=None)
            enc_dim = self.encoder.dim_out
        else:
            raise ValueError(f"enc_type {cfg.enc_type!r} is neither a ViT ('vit_*_enc') nor an MLP ('...MLP/...')")
        self.quant_proj = nn.Conv2d(enc_dim, cfg.latent_dim, 1)
        self.quantize = quantizers.build_quantizer(cfg.quant_type, latent_dim=cfg.latent_dim,
                                                   codebook_size=cfg.codebook_size, num_codebooks=cfg.num_codebooks,
                                                   norm_codes=cfg.norm_codes, norm_latents=cfg.norm_latents)
        self.eval()

    @property
    def codebook_size(self) -> int:
        return self.config.codebook_size

    def prepare_input(self, x: torch.Tensor) -> torch.Tensor:
        """ml-4m's ``prepare_input``: ImageNet standardisation undone to [-1, 1] when ``undo_std``; class ids
        embedded (``B x H x W`` -> ``B x n_channels x H x W``) for semseg."""
        if self.config.undo_std:
            mean = torch.tensor(IMAGENET_MEAN, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
            std = torch.tensor(IMAGENET_STD, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
            x = 2.0 * (x * std + mean) - 1.0
        if self.cls_emb is not None:
            x = self.cls_emb(x.long()).permute(0, 3, 1, 2)
        return x

    def latents(self, x: torch.Tensor) -> torch.Tensor:
        """The quantizer's input, ``B x latent_dim x H_Q x W_Q``."""
        return self.quant_proj(self.encoder(self.prepare_input(x)))

    def encode_quant(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(quantized latents, codes)`` of a batch (ml-4m's ``encode`` less its training loss)."""
        return self.quantize(self.latents(x))

    @torch.no_grad()
    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """The batch's codes (ml-4m's ``tokenize``)."""
        return self.encode_quant(x)[1]

    @torch.no_grad()
    def code_scores(self, x: torch.Tensor) -> torch.Tensor:
        """``B x heads x (H_Q W_Q) x K``: each latent's similarity to every code (the codes are the argmax)."""
        return self.quantize.scores(self.latents(x))

    def tokens_to_embedding(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes to the quantized latents the decoder reads, ``B x latent_dim x H_Q x W_Q``."""
        return self.quantize.indices_to_embedding(codes)


class VQVAE(VQEncoder):
    """ml-4m's ``VQVAE``: :class:`VQEncoder` plus ``post_quant_proj`` and a ViT or MLP ``decoder``."""

    def __init__(self, config: VQConfig | dict[str, Any]):
        super().__init__(config)
        cfg = self.config
        out_channels = cfg.n_channels if cfg.n_labels is None else cfg.n_labels
        if "vit" in cfg.dec_type:
            self.decoder = vit.build_decoder(cfg.dec_type, out_channels=out_channels,
                                             patch_size=cfg.patch_size_dec or cfg.patch_size,
                                             resolution=cfg.image_size_dec or cfg.image_size,
                                             patch_proj=cfg.patch_proj, post_mlp=cfg.post_mlp, out_conv=cfg.out_conv)
            dec_dim = self.decoder.dim_tokens
        elif "MLP" in cfg.dec_type:
            self.decoder = mlp.build_mlp(cfg.dec_type, dim_in=None, dim_out=out_channels)
            dec_dim = self.decoder.dim_in
        else:
            raise ValueError(f"dec_type {cfg.dec_type!r} is neither a ViT ('vit_*_dec') nor an MLP ('...MLP/...')")
        self.post_quant_proj = nn.Conv2d(cfg.latent_dim, dec_dim, 1)
        self.eval()

    def decode_quant(self, quant: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.post_quant_proj(quant))

    @torch.no_grad()
    def decode_tokens(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes to the reconstruction, ``B x C x H x W`` (semseg: ``n_labels`` logits)."""
        return self.decode_quant(self.tokens_to_embedding(codes))

    @torch.no_grad()
    def autoencode(self, x: torch.Tensor) -> torch.Tensor:
        return self.decode_quant(self.encode_quant(x)[0])


def _config_of(folder: TokenizerFolder) -> VQConfig:
    try:
        return VQConfig.from_dict(folder.config, where=f"{folder.uri}/config.json")
    except TypeError as exc:
        raise TokenizerFolderError(f"{folder.uri}/config.json: {exc}") from None


def _build(cls: type[VQEncoder], folder: TokenizerFolder, ignore: tuple[str, ...] = ()) -> VQEncoder:
    cfg = _config_of(folder)
    try:
        model = cls(cfg)
    except (KeyError, ValueError) as exc:
        raise TokenizerFolderError(f"{folder.uri}/config.json: {exc.args[0] if exc.args else exc}") from None
    load_into(model, folder, ignore=ignore)
    model.folder_digest = folder.digest
    return model.eval()


def load_vq_encoder(source: str | Path | TokenizerFolder) -> VQEncoder:
    """The encoder and quantizer of any ml-4m VQ tokenizer folder (a VQ-VAE's or a DiVAE's; the decoder's keys
    are left out, as ml-4m's ``encoder_only`` load does)."""
    folder = source if isinstance(source, TokenizerFolder) else read_folder(source)
    return _build(VQEncoder, folder, ignore=DECODER_PREFIXES)


def load_vqvae(source: str | Path | TokenizerFolder) -> VQVAE:
    """A VQ-VAE tokenizer folder (ViT or MLP decoder) as :class:`VQVAE`; a DiVAE's folder is refused (its
    decoder is a diffusion model)."""
    folder = source if isinstance(source, TokenizerFolder) else read_folder(source)
    kind = _config_of(folder).kind
    if kind != "vqvae":
        hint = "; load it with fourm_kfp.tokenizers.ml4m.divae.load_divae" if kind == "divae" else ""
        raise TokenizerFolderError(f"{folder.uri}: a {kind} tokenizer, not a VQ-VAE (dec_type "
                                   f"{folder.config.get('dec_type')!r}){hint}")
    return _build(VQVAE, folder)
