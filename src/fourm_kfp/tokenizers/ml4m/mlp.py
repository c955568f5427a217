"""The MLP encoders and decoders of ml-4m's global-feature and human-pose tokenizers
(``fourm/vq/models/mlp_models.py``), named by an id such as ``BottleneckMLP/B_6-Wi_1024``: ``B_<blocks>``,
``Wi_<width>`` and optionally ``Ex_<expansion>`` (default 4), after "Scaling MLPs" (arXiv 2306.13575).

* ``BottleneckMLP``: ``linear_in`` to the width, then per block ``x + block(layernorm(x))`` with
  ``block = Linear(width, e width), GELU, Linear(e width, width)``, then ``linear_out``.
* ``MLP``: ``linear_in``, then per layer ``layer(layernorm(z))`` (no residual, no activation), ``linear_out``.

An image-shaped input (``B x C x H x W``; the global features are ``B x C x 1 x 1``) is mapped cell by cell and
keeps its shape. A missing input or output width is the MLP's width, as ml-4m's ``VQ`` builds them (the encoder's
output and the decoder's input are the width).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class MlpSpec:
    kind: str
    blocks: int
    width: int
    expansion: int = 4


def parse_mlp_id(model_id: str) -> MlpSpec:
    """``BottleneckMLP/B_6-Wi_1024[-Ex_4]`` → its kind, blocks, width and expansion; ``ValueError`` otherwise."""
    try:
        kind, architecture = model_id.split("/")
        parts = architecture.split("-")
        blocks, width = int(parts[0].split("_")[1]), int(parts[1].split("_")[1])
        expansion = int(parts[2].split("_")[1]) if len(parts) == 3 else 4
    except (ValueError, IndexError):
        raise ValueError(f"{model_id!r} is not an MLP id such as 'BottleneckMLP/B_6-Wi_1024'") from None
    if kind not in ("BottleneckMLP", "MLP"):
        raise ValueError(f"{model_id!r}: the MLP kind is 'BottleneckMLP' or 'MLP', not {kind!r}")
    return MlpSpec(kind, blocks, width, expansion)


class _PointwiseMLP(nn.Module):
    dim_in: int
    dim_out: int

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 4:
            b, _, h, w = x.shape
            out = self.body(x.flatten(2).transpose(1, 2))
            return out.transpose(1, 2).reshape(b, -1, h, w)
        return self.body(x)

    def body(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class _Bottleneck(nn.Module):
    def __init__(self, thin: int, wide: int):
        super().__init__()
        self.block = nn.Sequential(nn.Linear(thin, wide), nn.GELU(), nn.Linear(wide, thin))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class BottleneckMLP(_PointwiseMLP):
    def __init__(self, dim_in: int, dim_out: int, blocks: int, width: int, expansion: int = 4):
        super().__init__()
        self.dim_in, self.dim_out = dim_in, dim_out
        self.linear_in = nn.Linear(dim_in, width)
        self.blocks = nn.ModuleList([_Bottleneck(width, expansion * width) for _ in range(blocks)])
        self.layernorms = nn.ModuleList([nn.LayerNorm(width) for _ in range(blocks)])
        self.linear_out = nn.Linear(width, dim_out)

    def body(self, x: torch.Tensor) -> torch.Tensor:
        x = self.linear_in(x)
        for block, norm in zip(self.blocks, self.layernorms):
            x = x + block(norm(x))
        return self.linear_out(x)


class StandardMLP(_PointwiseMLP):
    def __init__(self, dim_in: int, dim_out: int, blocks: int, width: int):
        super().__init__()
        self.dim_in, self.dim_out = dim_in, dim_out
        self.linear_in = nn.Linear(dim_in, width)
        self.linear_out = nn.Linear(width, dim_out)
        self.layers = nn.ModuleList([nn.Linear(width, width) for _ in range(blocks - 1)])
        self.layernorms = nn.ModuleList([nn.LayerNorm(width) for _ in range(blocks - 1)])

    def body(self, x: torch.Tensor) -> torch.Tensor:
        z = self.linear_in(x)
        for layer, norm in zip(self.layers, self.layernorms):
            z = layer(norm(z))
        return self.linear_out(z)


def build_mlp(model_id: str, dim_in: int | None = None, dim_out: int | None = None) -> _PointwiseMLP:
    spec = parse_mlp_id(model_id)
    dim_in, dim_out = dim_in or spec.width, dim_out or spec.width
    if spec.kind == "BottleneckMLP":
        return BottleneckMLP(dim_in, dim_out, spec.blocks, spec.width, spec.expansion)
    return StandardMLP(dim_in, dim_out, spec.blocks, spec.width)
