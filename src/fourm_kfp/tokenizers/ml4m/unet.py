"""The patched UNet that decodes ml-4m's DiVAE tokenizers (4M-21's rgb, depth, normal and edge), inference only.

What ml-4m builds for ``dec_type: "unet_patched"`` (``fourm/vq/models/unet``): the image is cut into ``patch_size``
squares whose pixels become channels (``pixel_unshuffle``: channel index ``c * p * p + row * p + col``), the
quantized code embedding (``B x latent_dim x h x w``) is brought to that grid by nearest-neighbour interpolation and
concatenated behind them, an ADM-style UNet (GroupNorm of 32 groups, SiLU, residual blocks that add a projected
timestep embedding, single-head self-attention at the chosen downsampling rates, strided-conv downsampling,
nearest + conv upsampling, skip connections by concatenation) maps the grid to ``out_channels * p * p`` channels,
and ``pixel_shuffle`` puts them back as pixels. The decoder predicts what the DiVAE was trained to predict (``x0``
for 4M-21's tokenizers, ``prediction_type: "sample"``).

Module and parameter names are those of ml-4m's checkpoints (``decoder.input_blocks.1.0.in_layers.0.weight``, ...),
so a ``model.safetensors`` loads without renaming. Presets: :data:`UNET_PRESETS` (``unet_patched`` is ml-4m's
only UNet preset); :func:`register_unet_preset` adds one.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class UNetPreset:
    """The architecture a ``dec_type`` names (ml-4m's factory arguments)."""

    patch_size: int
    model_channels: int
    num_res_blocks: int
    attention_resolutions: tuple[int, ...]
    channel_mult: tuple[int, ...]

    def as_dict(self) -> dict:
        return asdict(self)


#: The UNet decoders by ``dec_type``. ``unet_patched`` is ml-4m's (``fourm/vq/models/unet/unet.py``; 196M
#: parameters at 3 channels). ``unet_patched_tiny`` is not ml-4m's: it is the scaled-down decoder that
#: ``bench/ml4m_divae_reference.py`` adds to ml-4m's module (built by ml-4m's own UNet class) so that a reference
#: DiVAE fits in the repository; it keeps every kind of layer (residual blocks with and without a skip convolution,
#: attention at a downsampled rate and in the middle, strided downsampling, upsampling).
UNET_PRESETS: dict[str, UNetPreset] = {
    "unet_patched": UNetPreset(
        patch_size=4, model_channels=256, num_res_blocks=3, attention_resolutions=(4, 8), channel_mult=(1, 2, 2, 2)
    ),
    "unet_patched_tiny": UNetPreset(
        patch_size=4, model_channels=32, num_res_blocks=0, attention_resolutions=(2,), channel_mult=(1, 1)
    ),
}


def register_unet_preset(name: str, **fields) -> UNetPreset:
    """Adds (or replaces) the preset ``name``; its fields are :class:`UNetPreset`'s."""
    preset = UNetPreset(
        patch_size=int(fields["patch_size"]),
        model_channels=int(fields["model_channels"]),
        num_res_blocks=int(fields["num_res_blocks"]),
        attention_resolutions=tuple(int(v) for v in fields["attention_resolutions"]),
        channel_mult=tuple(int(v) for v in fields["channel_mult"]),
    )
    UNET_PRESETS[name] = preset
    return preset


def _norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(32, channels)


def timestep_features(timesteps: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """Sinusoidal features of the timesteps: ``dim // 2`` cosines, then as many sines (zero-padded if ``dim`` odd)."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32) / half).to(timesteps.device)
    angles = timesteps.float()[:, None] * freqs[None]
    features = torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)
    if dim % 2:
        features = F.pad(features, (0, 1))
    return features


class ResBlock(nn.Module):
    """GroupNorm-SiLU-conv, plus the projected timestep embedding, GroupNorm-SiLU-conv; a 1x1 conv skip if widths
    differ."""

    def __init__(self, channels: int, emb_channels: int, out_channels: int | None = None):
        super().__init__()
        out_channels = out_channels or channels
        self.in_layers = nn.Sequential(_norm(channels), nn.SiLU(), nn.Conv2d(channels, out_channels, 3, padding=1))
        self.emb_layers = nn.Sequential(nn.SiLU(), nn.Linear(emb_channels, out_channels))
        self.out_layers = nn.Sequential(
            _norm(out_channels), nn.SiLU(), nn.Dropout(0.0), nn.Conv2d(out_channels, out_channels, 3, padding=1)
        )
        self.skip_connection = nn.Identity() if out_channels == channels else nn.Conv2d(channels, out_channels, 1)

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        h = self.in_layers(x)
        h = h + self.emb_layers(emb).to(h.dtype)[:, :, None, None]
        return self.skip_connection(x) + self.out_layers(h)


class AttentionBlock(nn.Module):
    """Single-head self-attention over the grid's positions (ml-4m's "legacy" q/k/v channel order), residual."""

    def __init__(self, channels: int):
        super().__init__()
        self.norm = _norm(channels)
        self.qkv = nn.Conv1d(channels, channels * 3, 1)
        self.proj_out = nn.Conv1d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, height, width = x.shape
        flat = x.reshape(b, c, height * width)
        q, k, v = self.qkv(self.norm(flat)).transpose(1, 2).unsqueeze(1).chunk(3, dim=-1)  # each B 1 T C
        attended = F.scaled_dot_product_attention(q, k, v).squeeze(1).transpose(1, 2)
        return (flat + self.proj_out(attended)).reshape(b, c, height, width)


class Downsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.op = nn.Conv2d(channels, channels, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x)


class Upsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2, mode="nearest"))


class Stage(nn.ModuleList):
    """The layers of one UNet stage; residual blocks take the timestep embedding, the others do not."""

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        for layer in self:
            x = layer(x, emb) if isinstance(layer, ResBlock) else layer(x)
        return x


class PatchedUNet(nn.Module):
    """The DiVAE decoder: ``forward(sample, timestep, cond)`` predicts (for 4M-21's tokenizers) the clean image.

    ``sample``: ``B x channels x H x W`` (H and W multiples of ``patch_size``); ``timestep``: a number, a 0-d or a
    ``B`` tensor; ``cond``: the quantized code embedding ``B x cond_channels x h x w``; ``cond_mask`` (optional,
    ``B x h x w``, True = dropped) zeroes conditioning positions as ml-4m's classifier-free-guidance training did.
    """

    def __init__(
        self,
        *,
        in_channels: int,
        out_channels: int,
        cond_channels: int,
        image_size: int,
        preset: UNetPreset,
    ):
        super().__init__()
        p = preset.patch_size
        mc = preset.model_channels
        self.patch_size = p
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.cond_channels = cond_channels
        self.sample_size = image_size
        self.model_channels = mc
        self.preset = preset
        emb_dim = 4 * mc
        self.time_embed = nn.Sequential(nn.Linear(mc, emb_dim), nn.SiLU(), nn.Linear(emb_dim, emb_dim))

        width = preset.channel_mult[0] * mc
        first_width = width
        stem = nn.Conv2d(in_channels * p * p + cond_channels, width, 3, padding=1)
        self.input_blocks = nn.ModuleList([Stage([stem])])
        skip_widths = [width]
        rate = 1
        levels = len(preset.channel_mult)
        for level, mult in enumerate(preset.channel_mult):
            for _ in range(preset.num_res_blocks):
                layers: list[nn.Module] = [ResBlock(width, emb_dim, mult * mc)]
                width = mult * mc
                if rate in preset.attention_resolutions:
                    layers.append(AttentionBlock(width))
                self.input_blocks.append(Stage(layers))
                skip_widths.append(width)
            if level != levels - 1:
                self.input_blocks.append(Stage([Downsample(width)]))
                skip_widths.append(width)
                rate *= 2
        self.middle_block = Stage([ResBlock(width, emb_dim), AttentionBlock(width), ResBlock(width, emb_dim)])
        self.output_blocks = nn.ModuleList()
        for level in reversed(range(levels)):
            mult = preset.channel_mult[level]
            for i in range(preset.num_res_blocks + 1):
                layers = [ResBlock(width + skip_widths.pop(), emb_dim, mult * mc)]
                width = mult * mc
                if rate in preset.attention_resolutions:
                    layers.append(AttentionBlock(width))
                if level and i == preset.num_res_blocks:
                    layers.append(Upsample(width))
                    rate //= 2
                self.output_blocks.append(Stage(layers))
        self.out = nn.Sequential(_norm(width), nn.SiLU(), nn.Conv2d(first_width, out_channels * p * p, 3, padding=1))

    def forward(
        self,
        sample: torch.Tensor,
        timestep: torch.Tensor | float | int,
        cond: torch.Tensor,
        cond_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        b, _, height, width = sample.shape
        p = self.patch_size
        if height % p or width % p:
            raise ValueError(f"image size {height}x{width} is not a multiple of the decoder's patch size {p}")
        if cond_mask is not None:
            cond = torch.where(cond_mask[:, None], torch.zeros((), dtype=cond.dtype, device=cond.device), cond)
        grid = (height // p, width // p)
        h = torch.cat([F.pixel_unshuffle(sample, p), F.interpolate(cond.to(sample.dtype), grid, mode="nearest")], 1)

        t = torch.as_tensor(timestep, device=sample.device)
        t = t.reshape(1) if t.ndim == 0 else t
        emb = self.time_embed(timestep_features(t, self.model_channels).to(h.dtype))

        skips = []
        for stage in self.input_blocks:
            h = stage(h, emb)
            skips.append(h)
        h = self.middle_block(h, emb)
        for stage in self.output_blocks:
            h = stage(torch.cat([h, skips.pop()], dim=1), emb)
        return F.pixel_shuffle(self.out(h), p)


def build_unet(
    dec_type: str,
    *,
    channels: int,
    cond_channels: int,
    image_size: int,
    presets: dict[str, UNetPreset] | None = None,
) -> PatchedUNet:
    """The decoder ml-4m builds for ``dec_type`` (KeyError naming the known presets when it is not one)."""
    table = UNET_PRESETS if presets is None else presets
    if dec_type not in table:
        raise KeyError(f"dec_type {dec_type!r} is not a UNet decoder this port knows (known: {sorted(table)})")
    return PatchedUNet(
        in_channels=channels, out_channels=channels, cond_channels=cond_channels, image_size=image_size,
        preset=table[dec_type],
    )

