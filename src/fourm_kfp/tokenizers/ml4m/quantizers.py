"""ml-4m's two quantizers at inference (``fourm/vq/quantizers``), with its parameter and buffer names.

* :class:`LucidQuantizer` (``quant_type: lucid``, ml-4m's ``VectorQuantizerLucid``): an EMA codebook, stored as the
  buffer ``_codebook.embed`` (``K x d``) beside ``_codebook.initted`` and ``_codebook.cluster_size`` (and, for a
  Euclidean codebook, ``_codebook.embed_avg``). With ``norm_codes`` (cosine similarity, every 4M-21 image
  tokenizer) a latent's code is the argmax of ``l2norm(latent) . l2norm(code)``; without, the nearest code in
  Euclidean distance. The quantized vector is the *stored* code (not renormalised), also for
  :meth:`~LucidQuantizer.indices_to_embedding`. ``num_codebooks > 1`` puts a linear ``project_in`` /
  ``project_out`` around ``heads`` codebook lookups of the same table.
* :class:`Memcodes` (``quant_type: memcodes``; the global-feature and human-pose tokenizers): ``heads`` codebooks
  ``codes`` (``heads x K x d``) read through per-head key and value maps ``to_k`` / ``to_v`` (``heads x d x d``,
  no bias); a latent's code per head is the argmax of ``(q / sqrt(d)) . key``; the output is that code's value.

Both return codes as ml-4m's ``tokens``: ``B x H x W`` (one head), ``B x heads x H x W`` (several). Training-time
behaviour (EMA updates, dead-code replacement, Gumbel sampling, the commitment loss) is not ported: these modules
only tokenize and detokenize. :meth:`scores` gives the similarities the argmax is taken over, so a comparison can
count ties.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def l2norm(t: torch.Tensor) -> torch.Tensor:
    return F.normalize(t, p=2, dim=-1)


class _Codebook(nn.Module):
    """The buffers of ml-4m's ``CosineSimCodebook`` / ``EuclideanCodebook`` (state-dict names ``_codebook.*``)."""

    def __init__(self, codebook_size: int, dim: int, cosine: bool):
        super().__init__()
        self.cosine = cosine
        embed = torch.empty(codebook_size, dim)
        nn.init.kaiming_uniform_(embed)
        if cosine:
            embed = l2norm(embed)
        self.register_buffer("initted", torch.ones(1))
        self.register_buffer("cluster_size", torch.zeros(codebook_size))
        if not cosine:
            self.register_buffer("embed_avg", embed.clone())
        self.register_buffer("embed", embed)

    def scores(self, flat: torch.Tensor) -> torch.Tensor:
        """``N x K`` similarities of ``N x d`` latents to every code (higher is nearer)."""
        flat = flat.float()
        if self.cosine:
            return l2norm(flat) @ l2norm(self.embed).t()
        embed = self.embed.t()
        return -(flat.pow(2).sum(1, keepdim=True) - 2 * flat @ embed + embed.pow(2).sum(0, keepdim=True))


class LucidQuantizer(nn.Module):
    """ml-4m's ``VectorQuantizerLucid`` as its ``VQ`` builds it (``codebook_dim = dim``, ``heads =
    num_codebooks``), in eval mode."""

    def __init__(self, dim: int, codebook_size: int, heads: int = 1, cosine: bool = True,
                 norm_latents: bool = False):
        super().__init__()
        self.heads, self.norm_latents, self.codebook_size = heads, norm_latents, codebook_size
        inner = dim * heads
        self.project_in = nn.Linear(dim, inner) if inner != dim else nn.Identity()
        self.project_out = nn.Linear(inner, dim) if inner != dim else nn.Identity()
        self._codebook = _Codebook(codebook_size, dim, cosine)

    @property
    def codebook(self) -> torch.Tensor:
        return self._codebook.embed

    def _latents(self, x: torch.Tensor) -> torch.Tensor:
        """``B x C x H x W`` -> ``(B heads) x (H W) x d``, as the codebook sees them."""
        b = x.shape[0]
        x = self.project_in(x.flatten(2).transpose(1, 2))
        if self.heads > 1:
            x = x.reshape(b, x.shape[1], self.heads, -1).permute(0, 2, 1, 3).reshape(b * self.heads, x.shape[1], -1)
        return l2norm(x) if self.norm_latents else x

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """``B x heads x (H W) x K``: each latent's similarity to every code."""
        latents = self._latents(x)
        s = self._codebook.scores(latents.reshape(-1, latents.shape[-1]))
        return s.reshape(x.shape[0], self.heads, -1, self.codebook_size)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(quantized B x C x H x W, codes)``."""
        b, _, h, w = x.shape
        latents = self._latents(x)
        flat = latents.reshape(-1, latents.shape[-1])
        codes = self._codebook.scores(flat).argmax(dim=-1)
        quant = F.embedding(codes, self.codebook).reshape(latents.shape)
        codes = codes.reshape(latents.shape[:-1])
        if self.heads > 1:
            quant = quant.reshape(b, self.heads, h * w, -1).permute(0, 2, 1, 3).reshape(b, h * w, -1)
            codes = codes.reshape(b, self.heads, h, w)
        else:
            codes = codes.reshape(b, h, w)
        quant = self.project_out(quant)
        return quant.transpose(1, 2).reshape(b, -1, h, w), codes

    def indices_to_embedding(self, codes: torch.Tensor) -> torch.Tensor:
        """``B x H x W`` codes to ``B x d x H x W`` code vectors (ml-4m: one head only, no ``project_out``)."""
        if codes.dim() != 3:
            raise ValueError(f"lucid codes are B x H x W, not {tuple(codes.shape)}")
        return F.embedding(codes, self.codebook).permute(0, 3, 1, 2)


class Memcodes(nn.Module):
    """ml-4m's ``Memcodes`` (image feature maps in, ``accept_image_fmap``), in eval mode."""

    def __init__(self, dim: int, codebook_size: int, heads: int = 1):
        super().__init__()
        if dim % heads:
            raise ValueError(f"Memcodes: a {dim}-wide latent does not split into {heads} heads")
        self.heads, self.dim, self.codebook_size = heads, dim, codebook_size
        head_dim = dim // heads
        self.scale = head_dim ** -0.5
        self.codes = nn.Parameter(torch.randn(heads, codebook_size, head_dim))
        self.to_k = HeadMix(heads, head_dim)
        self.to_v = HeadMix(heads, head_dim)

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """``B x heads x (H W) x K``: each latent's logits over the codes."""
        q = x.flatten(2).transpose(1, 2)
        q = q.reshape(q.shape[0], q.shape[1], self.heads, -1).permute(0, 2, 1, 3) * self.scale
        return torch.einsum("b h i d, h j d -> b h i j", q, self.to_k(self.codes))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(quantized B x C x H x W, codes)``."""
        b, _, h, w = x.shape
        codes = self.scores(x).argmax(dim=-1)  # B x heads x (H W)
        quant = self._values(codes)  # B x heads x (H W) x d
        quant = quant.permute(0, 2, 1, 3).reshape(b, h * w, self.dim).transpose(1, 2).reshape(b, self.dim, h, w)
        codes = codes.reshape(b, self.heads, h, w)
        return quant, codes[:, 0] if self.heads == 1 else codes

    def _values(self, codes: torch.Tensor) -> torch.Tensor:
        values = self.to_v(self.codes)  # heads x K x d
        return torch.stack([values[i][codes[:, i]] for i in range(self.heads)], dim=1)

    def indices_to_embedding(self, codes: torch.Tensor) -> torch.Tensor:
        """``B x heads x H x W`` codes to ``B x (heads d) x H x W`` (ml-4m handles ``H = W = 1``, the global
        tokenizers' shape; ``B x H x W`` is taken for one head)."""
        if codes.dim() == 3 and self.heads == 1:
            codes = codes[:, None]
        if codes.dim() != 4 or codes.shape[1] != self.heads:
            raise ValueError(f"Memcodes codes are B x {self.heads} x H x W, not {tuple(codes.shape)}")
        b, _, h, w = codes.shape
        quant = self._values(codes.flatten(2))  # B x heads x (H W) x d
        return quant.permute(0, 1, 3, 2).reshape(b, self.dim, h, w)


class HeadMix(nn.Module):
    """``einops.layers.torch.EinMix('h n d -> h n c', weight_shape='h d c')``: a per-head ``d x c`` matrix, no
    bias (state-dict name ``weight``)."""

    def __init__(self, heads: int, dim: int):
        super().__init__()
        bound = dim ** -0.5
        self.weight = nn.Parameter(torch.empty(heads, dim, dim).uniform_(-bound, bound))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("h n d, h d c -> h n c", x, self.weight)


def build_quantizer(quant_type: str, *, latent_dim: int, codebook_size: int, num_codebooks: int = 1,
                    norm_codes: bool = True, norm_latents: bool = False) -> nn.Module:
    """The quantizer of an ml-4m ``VQ`` config (``quant_type``: ``lucid`` or ``memcodes``)."""
    if quant_type == "lucid":
        return LucidQuantizer(latent_dim, codebook_size, heads=num_codebooks, cosine=norm_codes,
                              norm_latents=norm_latents)
    if quant_type == "memcodes":
        return Memcodes(latent_dim, codebook_size, heads=num_codebooks)
    raise ValueError(f"quant_type {quant_type!r} is neither 'lucid' nor 'memcodes'")
