"""The UViT that decodes ml-4m's UViT DiVAE tokenizers (``dec_type: "uvit_*"``; 4M-21's edge tokenizer), inference
only.

What ml-4m builds for those ``dec_type`` (``fourm/vq/models/uvit.py``, after U-ViT / simple diffusion): the noisy
image is cut into ``patch_size`` squares by a strided convolution (``conv_in``), a diffusers-style UNet of residual
blocks (``down_blocks``: GroupNorm of 32 groups, SiLU, 3x3 convolutions, the projected timestep embedding added
between them, strided-conv downsampling) brings it to the bottleneck, optionally halved once more
(``downsample_mid``), where a Transformer (``mid_block``) runs over the grid's positions: pre-norm blocks whose
LayerNorms are shifted and scaled by the timestep embedding and whose branches are gated by it (adaLN-Zero), with a
fixed 2-D sine-cosine position embedding (``mid_pos_emb``, resized bicubically to the grid). The quantized code
embedding (``B x cond_dim x h x w``) enters there: ``cond_type "concat"`` resizes it (nearest) to the grid, projects
it to the Transformer's width and adds it to the tokens; ``"xattn"`` lets every block cross-attend to the codes.
Optional long skips join the first half of the blocks to the second. The UNet's up blocks (``up_blocks``, residual
blocks over the concatenated skips, nearest upsampling and a convolution) come back up, and a transposed
convolution (``conv_out``) turns the patch grid back into pixels.

Module and parameter names are ml-4m's (and, for the UNet parts, diffusers 0.20's ``ResnetBlock2D``,
``DownBlock2D``, ``UpBlock2D``, ``Downsample2D``, ``Upsample2D``, ``Timesteps``, ``TimestepEmbedding``, which ml-4m
uses), so a ``model.safetensors`` loads without renaming. ``downsample_mid`` holds its convolution under two names
(``conv`` and ``Conv2d_0``), as diffusers' ``Downsample2D`` does; a saved folder stores that tensor once.

Presets: :data:`UVIT_PRESETS`, ml-4m's factory functions by name (what they fix; the DiVAE passes the sample size,
the channels, ``cond_dim`` = the codes' ``latent_dim``, ``cond_type`` = its ``conditioning``); what ml-4m leaves at
its defaults (positional timestep features of ``block_out_channels[0]`` channels flipped to cosine first, a timestep
embedding 4x as wide, SiLU, GroupNorm eps 1e-5, a 32x32 position embedding, no resolution embedding) is fixed here
too. :func:`register_uvit_preset` adds one.

Over 400 lines and one concern: one network, whose parts (the UNet blocks, the Transformer blocks, the presets) exist
only for it and load one ml-4m file together.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fourm_kfp.tokenizers.ml4m.unet import timestep_features
from fourm_kfp.tokenizers.ml4m.vit import Mlp, sincos_table

#: ml-4m's UViT settings every factory leaves at the class's defaults
GROUPS, GROUP_NORM_EPS, POSEMB_SIDE = 32, 1e-5, 32
CONDITIONING = ("concat", "xattn")


@dataclass(frozen=True)
class UViTPreset:
    """The architecture a ``uvit_*`` ``dec_type`` names (the arguments ml-4m's factory function passes)."""

    patch_size: int
    block_out_channels: tuple[int, ...]
    layers_per_block: int
    downsample_before_mid: bool
    mid_layers: int
    mid_num_heads: int
    mid_dim: int
    mid_mlp_ratio: float = 4
    mid_qkv_bias: bool = True
    mid_use_long_skip: bool = False

    def as_dict(self) -> dict:
        return asdict(self)


def _family(blocks: tuple[int, ...], before_mid: bool, layers: int, heads: int, dim: int, long_skip: bool = False):
    return UViTPreset(patch_size=4, block_out_channels=blocks, layers_per_block=2, downsample_before_mid=before_mid,
                      mid_layers=layers, mid_num_heads=heads, mid_dim=dim, mid_use_long_skip=long_skip)


#: ml-4m's UViT decoders by ``dec_type`` (``fourm/vq/models/uvit.py``'s factory functions), plus the scaled-down
#: ``uvit_tiny_p4_f16`` and ``uvit_tiny_p4_f16_longskip`` that ``bench/ml4m_divae_reference.py`` adds to ml-4m's
#: module (built by ml-4m's own ``UViT`` class) so that a reference fits in the repository; they keep the published
#: decoder's structure (patch 4, two UNet levels, the extra downsampling before the Transformer) at a smaller width
#: and depth.
UVIT_PRESETS: dict[str, UViTPreset] = {
    "uvit_b_p4_f16": _family((128, 256), True, 12, 12, 768),
    "uvit_l_p4_f16": _family((128, 256), True, 24, 16, 1024),
    "uvit_h_p4_f16": _family((128, 256), True, 32, 16, 1280),
    "uvit_b_p4_f16_longskip": _family((128, 256), True, 13, 12, 768, long_skip=True),
    "uvit_l_p4_f16_longskip": _family((128, 256), True, 25, 16, 1024, long_skip=True),
    "uvit_b_p4_f8": _family((128, 256), False, 12, 12, 768),
    "uvit_l_p4_f8": _family((128, 256), False, 24, 16, 1024),
    "uvit_b_p4_f16_extraconv": _family((128, 256, 512), False, 12, 12, 768),
    "uvit_l_p4_f16_extraconv": _family((128, 256, 512), False, 24, 16, 1024),
    # scaled down for the committed references (not ml-4m's; see bench/ml4m_divae_reference.py)
    "uvit_tiny_p4_f16": _family((32, 32), True, 2, 2, 32),
    "uvit_tiny_p4_f16_longskip": UViTPreset(patch_size=4, block_out_channels=(32, 32), layers_per_block=1,
                                            downsample_before_mid=True, mid_layers=5, mid_num_heads=2, mid_dim=32,
                                            mid_use_long_skip=True),
}


def register_uvit_preset(name: str, **fields) -> UViTPreset:
    """Adds (or replaces) the preset ``name``; its fields are :class:`UViTPreset`'s."""
    preset = UViTPreset(
        patch_size=int(fields["patch_size"]),
        block_out_channels=tuple(int(v) for v in fields["block_out_channels"]),
        layers_per_block=int(fields["layers_per_block"]),
        downsample_before_mid=bool(fields["downsample_before_mid"]),
        mid_layers=int(fields["mid_layers"]),
        mid_num_heads=int(fields["mid_num_heads"]),
        mid_dim=int(fields["mid_dim"]),
        mid_mlp_ratio=float(fields.get("mid_mlp_ratio", 4)),
        mid_qkv_bias=bool(fields.get("mid_qkv_bias", True)),
        mid_use_long_skip=bool(fields.get("mid_use_long_skip", False)),
    )
    UVIT_PRESETS[name] = preset
    return preset


# -- the diffusers 0.20 pieces ml-4m's UViT is made of ---------------------------------------------------------------


class TimestepEmbedding(nn.Module):
    """diffusers' ``TimestepEmbedding``: ``linear_2(silu(linear_1(features)))``."""

    def __init__(self, in_channels: int, time_embed_dim: int):
        super().__init__()
        self.linear_1 = nn.Linear(in_channels, time_embed_dim)
        self.linear_2 = nn.Linear(time_embed_dim, time_embed_dim)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.silu(self.linear_1(features)))


class ResnetBlock2D(nn.Module):
    """diffusers' ``ResnetBlock2D`` (pre-norm, SiLU, the timestep embedding added after the first convolution; a 1x1
    ``conv_shortcut`` when the widths differ)."""

    def __init__(self, in_channels: int, out_channels: int, temb_channels: int):
        super().__init__()
        self.norm1 = nn.GroupNorm(GROUPS, in_channels, eps=GROUP_NORM_EPS)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.time_emb_proj = nn.Linear(temb_channels, out_channels)
        self.norm2 = nn.GroupNorm(GROUPS, out_channels, eps=GROUP_NORM_EPS)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        self.conv_shortcut = nn.Conv2d(in_channels, out_channels, 1) if in_channels != out_channels else None

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.time_emb_proj(F.silu(temb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return (x if self.conv_shortcut is None else self.conv_shortcut(x)) + h


class Downsample2D(nn.Module):
    """diffusers' ``Downsample2D`` with a 3x3 stride-2 convolution. ``both_names``: diffusers' default ``name="conv"``
    registers that convolution as ``conv`` and as ``Conv2d_0`` (one module, two state-dict keys)."""

    def __init__(self, channels: int, both_names: bool = False):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2, padding=1)
        if both_names:
            self.Conv2d_0 = self.conv

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class Upsample2D(nn.Module):
    """diffusers' ``Upsample2D``: nearest upsampling (x2, or to ``size``), then a 3x3 convolution."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor, size: tuple[int, int] | None = None) -> torch.Tensor:
        x = F.interpolate(x, scale_factor=2.0, mode="nearest") if size is None else F.interpolate(
            x, size=size, mode="nearest")
        return self.conv(x)


class DownBlock2D(nn.Module):
    """diffusers' ``DownBlock2D``: residual blocks, then (except at the last level) a downsampling; every output is
    kept for the skips."""

    def __init__(self, num_layers: int, in_channels: int, out_channels: int, temb_channels: int, downsample: bool):
        super().__init__()
        self.resnets = nn.ModuleList(
            ResnetBlock2D(in_channels if i == 0 else out_channels, out_channels, temb_channels)
            for i in range(num_layers))
        self.downsamplers = nn.ModuleList([Downsample2D(out_channels)]) if downsample else None

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        outputs: tuple[torch.Tensor, ...] = ()
        for resnet in self.resnets:
            x = resnet(x, temb)
            outputs += (x,)
        for down in self.downsamplers or ():
            x = down(x)
            outputs += (x,)
        return x, outputs


class UpBlock2D(nn.Module):
    """diffusers' ``UpBlock2D``: residual blocks over the input concatenated with one skip each, then (except at the
    last level) an upsampling."""

    def __init__(self, num_layers: int, in_channels: int, prev_output_channel: int, out_channels: int,
                 temb_channels: int, upsample: bool):
        super().__init__()
        self.resnets = nn.ModuleList(
            ResnetBlock2D((prev_output_channel if i == 0 else out_channels)
                          + (in_channels if i == num_layers - 1 else out_channels), out_channels, temb_channels)
            for i in range(num_layers))
        self.upsamplers = nn.ModuleList([Upsample2D(out_channels)]) if upsample else None

    def forward(self, x: torch.Tensor, skips: tuple[torch.Tensor, ...], temb: torch.Tensor,
                size: tuple[int, int] | None = None) -> torch.Tensor:
        for resnet in self.resnets:
            x = resnet(torch.cat([x, skips[-1]], dim=1), temb)
            skips = skips[:-1]
        for up in self.upsamplers or ():
            x = up(x, size)
        return x


# -- the Transformer bottleneck ----------------------------------------------------------------------------------------


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1.0 + scale.unsqueeze(1)) + shift.unsqueeze(1)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Softmax attention over ``B x heads x N x d``; ``mask`` True = not attended (ml-4m fills with -max)."""
    bias = None
    if mask is not None:
        bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(mask, -torch.finfo(q.dtype).max)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


class Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int, qkv_bias: bool):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4).unbind(0)
        out = _attend(q, k, v, None if mask is None else mask.unsqueeze(1))
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


class CrossAttention(nn.Module):
    def __init__(self, dim: int, dim_context: int, num_heads: int, qkv_bias: bool):
        super().__init__()
        self.num_heads = num_heads
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim_context, dim * 2, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, context: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, n, c = x.shape
        m = context.shape[1]
        q = self.q(x).reshape(b, n, self.num_heads, c // self.num_heads).permute(0, 2, 1, 3)
        k, v = self.kv(context).reshape(b, m, 2, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4).unbind(0)
        out = _attend(q, k, v, None if mask is None else mask.unsqueeze(1))
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


class Block(nn.Module):
    """ml-4m's UViT ``Block`` (``DecoderBlock`` with ``dim_context``: a cross-attention to the codes after the
    self-attention): adaLN modulation of each LayerNorm and adaLN-Zero gates from the timestep embedding; with
    ``skip``, a ``skip_linear`` joins a long-skip input first."""

    def __init__(self, dim: int, num_heads: int, temb_dim: int, mlp_ratio: float, qkv_bias: bool, skip: bool,
                 dim_context: int | None = None):
        super().__init__()
        self.cross = dim_context is not None
        self.norm1 = nn.LayerNorm(dim)
        if self.cross:
            self.self_attn = Attention(dim, num_heads, qkv_bias)
            self.cross_attn = CrossAttention(dim, dim_context, num_heads, qkv_bias)
            self.query_norm = nn.LayerNorm(dim)
            self.context_norm = nn.LayerNorm(dim_context)
        else:
            self.attn = Attention(dim, num_heads, qkv_bias)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        branches = 3 if self.cross else 2
        self.adaLN_modulation = nn.Linear(temb_dim, 2 * branches * dim)
        self.adaLN_gate = nn.Linear(temb_dim, branches * dim)
        self.skip_linear = nn.Linear(2 * dim, dim) if skip else None

    def forward(self, x: torch.Tensor, temb: torch.Tensor, context: torch.Tensor | None = None,
                context_mask: torch.Tensor | None = None, skip: torch.Tensor | None = None) -> torch.Tensor:
        branches = 3 if self.cross else 2
        gates = self.adaLN_gate(F.silu(temb)).unsqueeze(1).chunk(branches, dim=-1)
        mods = self.adaLN_modulation(F.silu(temb)).chunk(2 * branches, dim=-1)
        if self.skip_linear is not None:
            x = self.skip_linear(torch.cat([x, skip], dim=-1))
        attn = self.self_attn if self.cross else self.attn
        x = x + gates[0] * attn(modulate(self.norm1(x), mods[0], mods[1]))
        if self.cross:
            x = x + gates[1] * self.cross_attn(modulate(self.query_norm(x), mods[2], mods[3]),
                                               self.context_norm(context), context_mask)
        x = x + gates[-1] * self.mlp(modulate(self.norm2(x), mods[-2], mods[-1]))
        return x


class MidTransformer(nn.Module):
    """ml-4m's ``TransformerConcatCond`` (``cond_type="concat"``) and ``TransformerXattnCond`` (``"xattn"``)."""

    def __init__(self, *, unet_dim: int, cond_dim: int, preset: UViTPreset, time_embed_dim: int, cond_type: str):
        super().__init__()
        dim, layers = preset.mid_dim, preset.mid_layers
        self.cond_type = cond_type
        self.use_long_skip = preset.mid_use_long_skip
        if self.use_long_skip and layers % 2 != 1:
            raise ValueError(f"a UViT with long skips needs an odd number of mid_layers, not {layers}")
        # ml-4m's build_2d_sincos_posemb(side, side, dim)
        self.mid_pos_emb = nn.Parameter(sincos_table(POSEMB_SIDE, POSEMB_SIDE, dim), requires_grad=False)
        xattn = cond_type == "xattn"
        self.mid_block = nn.ModuleList(
            Block(dim, preset.mid_num_heads, time_embed_dim, preset.mid_mlp_ratio, preset.mid_qkv_bias,
                  skip=self.use_long_skip and i > layers // 2, dim_context=cond_dim if xattn else None)
            for i in range(layers))
        if not xattn:
            self.mid_cond_proj = nn.Linear(cond_dim, dim)
        self.mid_proj_in = nn.Linear(unet_dim, dim)
        self.mid_proj_out = nn.Linear(dim, unet_dim)
        if not xattn:
            self.mask_token = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor, temb: torch.Tensor, cond: torch.Tensor,
                cond_mask: torch.Tensor | None = None) -> torch.Tensor:
        b, _, height, width = x.shape
        x = self.mid_proj_in(x.flatten(2).transpose(1, 2))
        context = context_mask = None
        if self.cond_type == "concat":
            tokens = self.mid_cond_proj(F.interpolate(cond, (height, width)).flatten(2).transpose(1, 2))
            if cond_mask is not None:
                mask = F.interpolate(cond_mask.unsqueeze(1).float(), (height, width), mode="nearest") > 0.5
                tokens = torch.where(mask.flatten(1)[..., None], self.mask_token.to(tokens.dtype), tokens)
            x = x + tokens
            pos = F.interpolate(self.mid_pos_emb, (height, width), mode="bicubic", align_corners=False)
        else:
            context = cond.flatten(2).transpose(1, 2)
            if cond_mask is not None:
                context_mask = cond_mask.flatten(1)[:, None, :].expand(b, height * width, -1)
            pos = F.interpolate(self.mid_pos_emb, (height, width), mode="nearest")
        x = x + pos.flatten(2).transpose(1, 2)
        if not self.use_long_skip:
            for block in self.mid_block:
                x = block(x, temb, context, context_mask)
        else:
            half = len(self.mid_block) // 2
            skips = []
            for block in self.mid_block[:half]:
                x = block(x, temb, context, context_mask)
                skips.append(x)
            x = self.mid_block[half](x, temb, context, context_mask)
            for block in self.mid_block[half + 1:]:
                x = block(x, temb, context, context_mask, skip=skips.pop())
        return self.mid_proj_out(x).transpose(1, 2).reshape(b, -1, height, width)


class UViT(nn.Module):
    """The UViT decoder: ``forward(sample, timestep, cond, cond_mask=None)`` predicts what the DiVAE was trained to
    predict. ``sample``: ``B x in_channels x H x W`` (H and W multiples of ``patch_size``); ``timestep``: a number, a
    0-d or a ``B`` tensor; ``cond``: the quantized code embedding ``B x cond_dim x h x w``; ``cond_mask`` (optional,
    True = dropped): ``B x h x w``."""

    def __init__(self, *, in_channels: int, out_channels: int, cond_dim: int, sample_size: int, preset: UViTPreset,
                 cond_type: str = "concat"):
        super().__init__()
        if cond_type not in CONDITIONING:
            raise ValueError(f"conditioning {cond_type!r} is not one of ml-4m's UViT conditionings "
                             f"{list(CONDITIONING)}")
        blocks = preset.block_out_channels
        if any(c % GROUPS for c in blocks):
            raise ValueError(f"the UViT's block_out_channels {list(blocks)} must be multiples of {GROUPS} (GroupNorm)")
        self.preset = preset
        self.patch_size = preset.patch_size
        self.in_channels, self.out_channels, self.sample_size = in_channels, out_channels, sample_size
        self.feature_dim = blocks[0]
        time_embed_dim = 4 * blocks[0]
        self.conv_in = nn.Conv2d(in_channels, blocks[0], preset.patch_size, stride=preset.patch_size)
        self.time_embedding = TimestepEmbedding(blocks[0], time_embed_dim)
        last = len(blocks) - 1
        self.down_blocks = nn.ModuleList(
            DownBlock2D(preset.layers_per_block, blocks[max(i - 1, 0)], blocks[i], time_embed_dim, i != last)
            for i in range(len(blocks)))
        if preset.downsample_before_mid:
            self.downsample_mid = Downsample2D(blocks[-1], both_names=True)
        self.mid_block = MidTransformer(unet_dim=blocks[-1], cond_dim=cond_dim, preset=preset,
                                        time_embed_dim=time_embed_dim, cond_type=cond_type)
        if preset.downsample_before_mid:
            self.upsample_mid = Upsample2D(blocks[-1])
        reversed_blocks = list(reversed(blocks))
        self.up_blocks = nn.ModuleList(
            UpBlock2D(preset.layers_per_block + 1, reversed_blocks[min(i + 1, last)], reversed_blocks[max(i - 1, 0)],
                      reversed_blocks[i], time_embed_dim, i != last)
            for i in range(len(blocks)))
        self.conv_norm_out = nn.GroupNorm(GROUPS, blocks[0], eps=GROUP_NORM_EPS)
        self.conv_out = nn.ConvTranspose2d(blocks[0], out_channels, preset.patch_size, stride=preset.patch_size)
        self.num_upsamplers = last

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor | float | int, cond: torch.Tensor,
                cond_mask: torch.Tensor | None = None) -> torch.Tensor:
        height, width = sample.shape[-2:]
        p = self.patch_size
        if height % p or width % p:
            raise ValueError(f"image size {height}x{width} is not a multiple of the decoder's patch size {p}")
        forward_size = any(s % (2 ** self.num_upsamplers) for s in (height, width))
        t = torch.as_tensor(timestep, device=sample.device)
        t = t.reshape(1) if t.ndim == 0 else t
        t = t.expand(sample.shape[0])
        temb = self.time_embedding(timestep_features(t, self.feature_dim).to(sample.dtype))

        h = self.conv_in(sample)
        skips: tuple[torch.Tensor, ...] = (h,)
        for block in self.down_blocks:
            h, outputs = block(h, temb)
            skips += outputs
        if hasattr(self, "downsample_mid"):
            h = self.downsample_mid(h)
        h = self.mid_block(h, temb, cond.to(h.dtype), cond_mask)
        if hasattr(self, "upsample_mid"):
            h = self.upsample_mid(h)
        for i, block in enumerate(self.up_blocks):
            count = len(block.resnets)
            own, skips = skips[-count:], skips[:-count]
            size = tuple(skips[-1].shape[2:]) if forward_size and i != len(self.up_blocks) - 1 else None
            h = block(h, own, temb, size)
        return self.conv_out(F.silu(self.conv_norm_out(h)))


def build_uvit(dec_type: str, *, channels: int, cond_dim: int, image_size: int, conditioning: str = "concat",
               presets: dict[str, UViTPreset] | None = None) -> UViT:
    """The decoder ml-4m's DiVAE builds for a ``uvit_*`` ``dec_type`` (KeyError naming the known presets when it is
    not one)."""
    table = UVIT_PRESETS if presets is None else presets
    if dec_type not in table:
        raise KeyError(f"dec_type {dec_type!r} is not a UViT decoder this port knows (known: {sorted(table)})")
    return UViT(in_channels=channels, out_channels=channels, cond_dim=cond_dim, sample_size=image_size,
                preset=table[dec_type], cond_type=conditioning)
