"""A VQ-VAE image tokenizer: ``[H, W]`` in-memory arrays ↔ ``[H / patch, W / patch]`` token grids.

Two architectures share one interface:

* ``"conv"`` — small and convolutional, for the smoke and demo presets on CPU. The encoder is **patch-local**:
  one convolution with kernel and stride ``patch_size``, then per-position (1x1) layers with a per-position channel
  norm, so a token is a function of its own patch and nothing else. The decoder (3x3 convs and residual blocks at
  token resolution, transposed convs up; ``patch_size`` a power of two >= 2) sees each token's neighbours, for
  smooth reconstructions. Why local: a model that predicts tokens can only learn what the tokens say about the
  scene. Measured on the demo's semseg (64 px, 512 codes): with 3x3 convs and GroupNorm (image-wide statistics) in
  the encoder, the entropy of the code given its exact 4x4 label patch was 4.4 nats (the one all-ground patch had
  392 different codes), so the 4M model's semseg loss sat at that floor and the position of objects hardly moved
  it; patch-local, that entropy is 0 by construction, perplexity fell from 264 to 5 and reconstruction was as good
  (mIoU 0.97).
* ``"vit"`` — a ViT encoder/decoder (patch embedding, pre-norm blocks with ``F.scaled_dot_product_attention``,
  learned positions, a linear pixel head), e.g. ViT-B-like with ``patch_size=16`` at 224 px for 4m-b.

The model owns its modality's codec (:mod:`.modality_codecs`) and normalisation statistics
(``config.norm_stats``), so :meth:`VQVAE.encode` takes in-memory arrays and :meth:`VQVAE.decode` gives them back.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fourm_kfp.tokenizers.modality_codecs import get_codec
from fourm_kfp.tokenizers.vector_quantizer import VectorQuantizer


@dataclass(frozen=True)
class VQVAEConfig:
    """Everything needed to rebuild a tokenizer (saved as JSON next to its weights)."""

    modality: str
    in_channels: int
    out_channels: int
    image_size: int = 64
    patch_size: int = 4  # downsampling factor: the token grid is image_size // patch_size square
    architecture: str = "conv"  # "conv" or "vit"
    hidden_dim: int = 64  # conv: channels at token resolution (halved per finer level); vit: width
    depth: int = 1  # conv: residual blocks at token resolution; vit: blocks in encoder and in decoder
    heads: int = 4  # vit only
    codebook_size: int = 512
    code_dim: int = 32
    ema_decay: float = 0.99
    beta: float = 0.25
    dead_threshold: float = 1.0  # restart codes with fewer EMA assignments per training step than this
    norm_stats: dict[str, list[float]] = field(default_factory=dict)  # from fit_normalisation
    #: the codec's settings from the dataset (semseg ``classes``, depth ``relative``; ``ImageCodec.settings_for``);
    #: saved only when there are any, so a config without them (saved before they existed) is the default codec
    codec_settings: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"architecture must be one of {sorted(ARCHITECTURES)}, got {self.architecture!r}")
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size {self.image_size} is not a multiple of patch_size {self.patch_size}")
        power_of_two = self.patch_size >= 2 and not self.patch_size & (self.patch_size - 1)
        if self.architecture == "conv" and not power_of_two:
            raise ValueError(f"the conv architecture needs a power-of-two patch_size >= 2, got {self.patch_size}")
        if self.architecture == "vit" and self.hidden_dim % self.heads:
            raise ValueError(f"vit: hidden_dim {self.hidden_dim} is not divisible by heads {self.heads}")

    @classmethod
    def for_modality(cls, modality: str, codec_settings: dict[str, Any] | None = None,
                     **overrides: Any) -> VQVAEConfig:
        """A config with the channel counts of ``modality``'s codec (with ``codec_settings``); ``overrides`` set any
        other field."""
        codec = get_codec(modality, codec_settings)
        return cls(modality=modality, in_channels=codec.in_channels, out_channels=codec.out_channels,
                   codec_settings=dict(codec_settings or {}), **overrides)

    @property
    def grid_size(self) -> int:
        return self.image_size // self.patch_size

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if not data["codec_settings"]:  # the default codec: saved as before codec settings existed
            del data["codec_settings"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VQVAEConfig:
        return cls(**data)


class ChannelNorm(nn.Module):
    """LayerNorm over the channels at each position of ``[B, C, H, W]``: unlike GroupNorm, whose statistics span
    the whole image, it makes no position depend on any other."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ResBlock(nn.Module):
    """Two normalised, activated convolutions of ``kernel`` size and a skip connection."""

    def __init__(self, channels: int, kernel: int = 3) -> None:
        super().__init__()
        self.body = nn.Sequential(
            ChannelNorm(channels), nn.SiLU(), nn.Conv2d(channels, channels, kernel, padding=kernel // 2),
            ChannelNorm(channels), nn.SiLU(), nn.Conv2d(channels, channels, kernel, padding=kernel // 2),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


def _conv_widths(cfg: VQVAEConfig) -> list[int]:
    """Decoder channels before each 2x upsampling, coarsest first: hidden, hidden/2, ... (at least 16)."""
    levels = int(math.log2(cfg.patch_size))
    return [max(cfg.hidden_dim >> i, 16) for i in range(levels)]


def conv_networks(cfg: VQVAEConfig) -> tuple[nn.Module, nn.Module]:
    """The patch-local encoder and the convolutional decoder of the ``conv`` architecture (module docstring)."""
    h = cfg.hidden_dim
    encoder = nn.Sequential(
        nn.Conv2d(cfg.in_channels, h, cfg.patch_size, stride=cfg.patch_size), nn.SiLU(), nn.Conv2d(h, h, 1),
        *(ResBlock(h, kernel=1) for _ in range(cfg.depth)), ChannelNorm(h), nn.SiLU(),
    )  # fmt: skip
    decoder: list[nn.Module] = [nn.Conv2d(h, h, 3, padding=1)]
    decoder += [ResBlock(h) for _ in range(cfg.depth)]
    decoder += [ChannelNorm(h), nn.SiLU()]
    ups = _conv_widths(cfg)
    for c_in, c_out in zip(ups, [*ups[1:], ups[-1] // 2]):
        decoder += [nn.ConvTranspose2d(c_in, c_out, 4, stride=2, padding=1), nn.SiLU()]
    decoder += [nn.Conv2d(ups[-1] // 2, cfg.out_channels, 3, padding=1)]
    return encoder, nn.Sequential(*decoder)


class Block(nn.Module):
    """A pre-norm transformer block with fused scaled-dot-product attention."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d))
        return x + self.mlp(self.norm2(x))


class ViTEncoder(nn.Module):
    def __init__(self, cfg: VQVAEConfig) -> None:
        super().__init__()
        self.embed = nn.Conv2d(cfg.in_channels, cfg.hidden_dim, cfg.patch_size, stride=cfg.patch_size)
        self.pos = nn.Parameter(torch.randn(1, cfg.grid_size**2, cfg.hidden_dim) * 0.02)
        self.blocks = nn.Sequential(*(Block(cfg.hidden_dim, cfg.heads) for _ in range(cfg.depth)))
        self.norm = nn.LayerNorm(cfg.hidden_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.embed(x)
        b, d, h, w = z.shape
        z = self.norm(self.blocks(z.flatten(2).transpose(1, 2) + self.pos))
        return z.transpose(1, 2).reshape(b, d, h, w)


class ViTDecoder(nn.Module):
    def __init__(self, cfg: VQVAEConfig) -> None:
        super().__init__()
        self.patch, self.out_channels = cfg.patch_size, cfg.out_channels
        self.pos = nn.Parameter(torch.randn(1, cfg.grid_size**2, cfg.hidden_dim) * 0.02)
        self.blocks = nn.Sequential(*(Block(cfg.hidden_dim, cfg.heads) for _ in range(cfg.depth)))
        self.norm = nn.LayerNorm(cfg.hidden_dim)
        self.head = nn.Linear(cfg.hidden_dim, cfg.patch_size**2 * cfg.out_channels)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        b, _, h, w = z.shape
        pixels = self.head(self.norm(self.blocks(z.flatten(2).transpose(1, 2) + self.pos)))
        pixels = pixels.view(b, h, w, self.patch, self.patch, self.out_channels).permute(0, 5, 1, 3, 2, 4)
        return pixels.reshape(b, self.out_channels, h * self.patch, w * self.patch)


ARCHITECTURES = {"conv": conv_networks, "vit": lambda cfg: (ViTEncoder(cfg), ViTDecoder(cfg))}


class VQVAE(nn.Module):
    """Encoder → :class:`VectorQuantizer` → decoder, with its modality's codec for inputs, loss and outputs."""

    #: what decoding one image costs (the evaluation states its decode budget with it): one decoder pass
    decoder_kind = "VQ-VAE"
    decoder_passes = 1

    def __init__(self, config: VQVAEConfig) -> None:
        super().__init__()
        self.config = config
        self.codec = get_codec(config.modality, config.codec_settings)
        if (self.codec.in_channels, self.codec.out_channels) != (config.in_channels, config.out_channels):
            raise ValueError(f"{config.modality} tokenizer: the config has {config.in_channels} input and "
                             f"{config.out_channels} output channels, its codec (settings {config.codec_settings}) "
                             f"{self.codec.in_channels} and {self.codec.out_channels}")
        self.encoder, self.decoder = ARCHITECTURES[config.architecture](config)
        self.quantizer = VectorQuantizer(
            config.hidden_dim, config.codebook_size, config.code_dim, config.ema_decay, config.beta,
            config.dead_threshold,
        )  # fmt: skip

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def prepare(self, arrays: Any) -> torch.Tensor:
        """In-memory batch ``[B, H, W(, C)]`` → the normalised network input on the model's device."""
        return self.codec.to_input(arrays, self.config.norm_stats, self.device)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """Network input ``x`` (from :meth:`prepare`) → ``(decoder output, codes [B, h, w], losses)``.

        ``losses``: ``loss`` (= ``recon`` + ``commit``, what to optimise), ``recon``, ``commit``, and the
        quantizer's ``usage``, ``perplexity`` (and ``restarted`` while training).
        """
        quantized, codes, stats = self.quantizer(self.encoder(x))
        recon = self.decoder(quantized)
        stats["recon"] = self.codec.loss(recon.float(), x, self.config.norm_stats)
        stats["loss"] = stats["recon"] + stats["commit"]
        return recon, codes, stats

    @torch.no_grad()
    def encode(self, images: Any) -> torch.Tensor:
        """In-memory batch (numpy or torch, ``[B, H, W(, C)]``) → token ids ``LongTensor[B, h, w]``."""
        return self.quantizer.encode(self.encoder(self.prepare(images)))

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor) -> np.ndarray:
        """Token ids ``[B, h, w]`` → in-memory batch (numpy, the modality's units, dtype and validity)."""
        out = self.decoder(self.quantizer.lookup(torch.as_tensor(tokens, device=self.device)))
        return self.codec.to_arrays(out, self.config.norm_stats)
