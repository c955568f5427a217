"""The ViT encoder and decoder of ml-4m's VQ tokenizers (``fourm/vq/models/vit_models.py``), as its ``VQ`` /
``VQVAE`` build them, with the same parameter names so that ml-4m's ``model.safetensors`` loads unchanged.

* :class:`ViTEncoder`: a patch projection (a ``P x P`` convolution of stride ``P``; a ``1 x 1`` one over a feature
  map when ``patch_proj`` is off), plus a 2-D sine-cosine position table stored as the parameter ``pos_emb``
  (``1 x D x N_H x N_W``, resized bicubically to the input's grid), pre-norm transformer blocks, and, with
  ``post_mlp``, a residual tanh MLP after a LayerNorm. No final norm. Output ``B x D x N_H x N_W``.
* :class:`ViTDecoder`: the position table added to the ``B x D x N_H x N_W`` input, the same blocks, the optional
  tanh MLP, a linear map of each token to a ``C x P x P`` patch (``C`` values per cell without ``patch_proj``), and
  with ``out_conv`` two ConvNeXt blocks over the image.

Sizes are ml-4m's presets, named as its configs name them (``enc_type``/``dec_type``: ``vit_b_enc``, ...):
:data:`PRESETS`. Attention is computed as ml-4m computes it without xFormers (scores, softmax, weighted sum), so
our outputs follow its arithmetic, not only its maths.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ViTSize:
    dim: int
    depth: int
    heads: int
    mlp_ratio: float = 4.0


#: ml-4m's ViT presets (``vit_<size>_enc`` / ``vit_<size>_dec``). ``tiny`` is not ml-4m's: it is the scaled-down
#: size that ``bench/ml4m_tokenizer_reference.py`` adds to ml-4m's module (built by ml-4m's own ViT classes) so
#: that a reference tokenizer fits in the repository.
PRESETS: dict[str, ViTSize] = {
    "s": ViTSize(512, 8, 8),
    "b": ViTSize(768, 12, 12),
    "l": ViTSize(1024, 24, 16),
    "tiny": ViTSize(16, 2, 2),
}

LN_EPS = 1e-6


def preset(name: str, part: str) -> ViTSize:
    """The size of ``vit_<size>_<part>`` (``part``: ``enc`` or ``dec``); a ``KeyError`` naming the known ones."""
    prefix, suffix = "vit_", f"_{part}"
    size = name[len(prefix):-len(suffix)] if name.startswith(prefix) and name.endswith(suffix) else None
    if size not in PRESETS:
        known = ", ".join(f"vit_{s}_{part}" for s in PRESETS)
        raise KeyError(f"{name!r} is no ViT {part}oder preset (known: {known})")
    return PRESETS[size]


def pair(value: int | tuple[int, int]) -> tuple[int, int]:
    return value if isinstance(value, tuple) else (value, value)


def sincos_table(h: int, w: int, dim: int, temperature: float = 10000.0) -> torch.Tensor:
    """ml-4m's 2-D sine-cosine position table, ``1 x dim x h x w``: per cell ``[sin(a), cos(a), sin(b), cos(b)]``
    over ``dim / 4`` frequencies, where ``a`` and ``b`` are the cell's indices as ml-4m's meshgrid lays them."""
    if dim % 4:
        raise ValueError(f"a 2-D sine-cosine table needs a width divisible by 4, not {dim}")
    first, second = torch.meshgrid(torch.arange(w, dtype=torch.float32), torch.arange(h, dtype=torch.float32),
                                   indexing="ij")
    quarter = dim // 4
    freqs = 1.0 / (temperature ** (torch.arange(quarter, dtype=torch.float32) / quarter))
    a = first.reshape(-1)[:, None] * freqs[None, :]
    b = second.reshape(-1)[:, None] * freqs[None, :]
    table = torch.cat([a.sin(), a.cos(), b.sin(), b.cos()], dim=1)  # (w*h) x dim, read as h x w below
    return table.reshape(h, w, dim).permute(2, 0, 1).unsqueeze(0).contiguous()


def resized_positions(table: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """The position table at ``grid``, ``1 x (N_H N_W) x D`` (bicubic, as ml-4m resizes it even to its own size)."""
    table = F.interpolate(table, size=grid, mode="bicubic", align_corners=False)
    return table.flatten(2).transpose(1, 2)


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int, act: type[nn.Module] = nn.GELU):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = act()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, qkv_bias: bool = True):
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        weights = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
        return self.proj((weights @ v).transpose(1, 2).reshape(b, n, c))


class Block(nn.Module):
    """Pre-norm self-attention and MLP, each residual."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float = 4.0, qkv_bias: bool = True):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=LN_EPS)
        self.attn = Attention(dim, heads, qkv_bias)
        self.norm2 = nn.LayerNorm(dim, eps=LN_EPS)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ConvNeXtBlock(nn.Module):
    """A depthwise 7x7 convolution, LayerNorm, a 4x pointwise MLP and a per-channel scale, residual."""

    def __init__(self, dim: int, layer_scale: float = 1e-6):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(layer_scale * torch.ones(dim)) if layer_scale > 0 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.pwconv2(self.act(self.pwconv1(self.norm(self.dwconv(x).permute(0, 2, 3, 1)))))
        if self.gamma is not None:
            y = self.gamma * y
        return x + y.permute(0, 3, 1, 2)


def _blocks(size: ViTSize) -> nn.Sequential:
    return nn.Sequential(*[Block(size.dim, size.heads, size.mlp_ratio) for _ in range(size.depth)])


def _init(module: nn.Module) -> None:
    """A fresh module's weights as ml-4m initialises them (Xavier-uniform linears, Q/K/V each as its own matrix;
    convolutions keep PyTorch's default); loading a folder overwrites them."""
    for name, m in module.named_modules():
        if isinstance(m, nn.Linear):
            rows = m.weight.shape[0] // 3 if "qkv" in name else m.weight.shape[0]
            bound = math.sqrt(6.0 / float(rows + m.weight.shape[1]))
            nn.init.uniform_(m.weight, -bound, bound)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


class ViTEncoder(nn.Module):
    """Images (``B x C x H x W``, sides multiples of the patch) or feature maps (``B x C x N_H x N_W`` without
    ``patch_proj``) to ``B x D x N_H x N_W``."""

    def __init__(self, *, in_channels: int, patch_size: int, resolution: int, size: ViTSize,
                 patch_proj: bool = True, post_mlp: bool = False):
        super().__init__()
        self.patch = pair(patch_size)
        self.patch_proj = patch_proj
        self.dim_tokens = size.dim
        height, width = pair(resolution)
        if height % self.patch[0] or width % self.patch[1]:
            raise ValueError(f"a {height}x{width} resolution is not a multiple of the {self.patch} patch")
        grid = (height // self.patch[0], width // self.patch[1])
        self.pos_emb = nn.Parameter(sincos_table(*grid, size.dim), requires_grad=False)
        kernel = self.patch if patch_proj else (1, 1)
        self.proj = nn.Conv2d(in_channels, size.dim, kernel_size=kernel, stride=kernel)
        self.blocks = _blocks(size)
        if post_mlp:
            self.norm_mlp = nn.LayerNorm(size.dim, eps=LN_EPS)
            self.post_mlp = Mlp(size.dim, int(size.mlp_ratio * size.dim), act=nn.Tanh)
        _init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.patch_proj:
            if x.shape[-2] % self.patch[0] or x.shape[-1] % self.patch[1]:
                raise ValueError(f"input sides {tuple(x.shape[-2:])} are not multiples of the patch {self.patch}")
            grid = (x.shape[-2] // self.patch[0], x.shape[-1] // self.patch[1])
        else:
            grid = (x.shape[-2], x.shape[-1])
        x = self.proj(x).flatten(2).transpose(1, 2)
        x = x + resized_positions(self.pos_emb, grid)
        x = self.blocks(x)
        if hasattr(self, "post_mlp"):
            x = x.float() + self.post_mlp(self.norm_mlp(x.float()))
        return x.transpose(1, 2).reshape(x.shape[0], -1, *grid)


class ViTDecoder(nn.Module):
    """``B x D x N_H x N_W`` to images ``B x C x (N_H P) x (N_W P)`` (``B x C x N_H x N_W`` without
    ``patch_proj``)."""

    def __init__(self, *, out_channels: int, patch_size: int, resolution: int, size: ViTSize,
                 patch_proj: bool = True, post_mlp: bool = False, out_conv: bool = False):
        super().__init__()
        self.out_channels = out_channels
        self.patch = pair(patch_size) if patch_proj else (1, 1)
        self.dim_tokens = size.dim
        height, width = pair(resolution)
        step = pair(patch_size)
        if height % step[0] or width % step[1]:
            raise ValueError(f"a {height}x{width} resolution is not a multiple of the {step} patch")
        self.pos_emb = nn.Parameter(sincos_table(height // step[0], width // step[1], size.dim), requires_grad=False)
        self.blocks = _blocks(size)
        if post_mlp:
            self.norm_mlp = nn.LayerNorm(size.dim, eps=LN_EPS)
            self.post_mlp = Mlp(size.dim, int(size.mlp_ratio * size.dim), act=nn.Tanh)
        self.out_proj = nn.Linear(size.dim, out_channels * self.patch[0] * self.patch[1])
        if out_conv:
            self.out_conv = nn.Sequential(ConvNeXtBlock(out_channels), ConvNeXtBlock(out_channels))
        _init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, nh, nw = x.shape
        x = x.flatten(2).transpose(1, 2)
        x = x + resized_positions(self.pos_emb, (nh, nw))
        x = self.blocks(x)
        if hasattr(self, "post_mlp"):
            x = x + self.post_mlp(self.norm_mlp(x))
        x = self.out_proj(x)
        ph, pw = self.patch
        x = x.reshape(b, nh, nw, self.out_channels, ph, pw).permute(0, 3, 1, 4, 2, 5)
        x = x.reshape(b, self.out_channels, nh * ph, nw * pw)
        if hasattr(self, "out_conv"):
            x = self.out_conv(x)
        return x


def build_encoder(enc_type: str, *, in_channels: int, patch_size: int, resolution: int, patch_proj: bool = True,
                  post_mlp: bool = False) -> ViTEncoder:
    return ViTEncoder(in_channels=in_channels, patch_size=patch_size, resolution=resolution,
                      size=preset(enc_type, "enc"), patch_proj=patch_proj, post_mlp=post_mlp)


def build_decoder(dec_type: str, *, out_channels: int, patch_size: int, resolution: int, patch_proj: bool = True,
                  post_mlp: bool = False, out_conv: bool = False) -> ViTDecoder:
    return ViTDecoder(out_channels=out_channels, patch_size=patch_size, resolution=resolution,
                      size=preset(dec_type, "dec"), patch_proj=patch_proj, post_mlp=post_mlp, out_conv=out_conv)
