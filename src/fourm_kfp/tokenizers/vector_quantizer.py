"""An EMA vector quantizer with a cosine-similarity codebook and dead-code restarts (as in 4M / ViT-VQGAN).

Features ``[B, D, h, w]`` are projected (1x1 conv) to a small lookup space (``code_dim``, e.g. 32) and
L2-normalised; the nearest code by cosine similarity is the token. Codes are not learned by gradient descent:
each training step moves them by an exponential moving average (EMA) of the inputs assigned to them
(cluster-size and embedding-sum EMAs with ``decay``, Laplace smoothing, codes re-normalised). The encoder is
pulled towards its codes by a commitment loss (``beta``) and receives the decoder's gradient through the
straight-through estimator. A code whose bias-corrected EMA usage (assignments per step) falls below
``dead_threshold`` is restarted from a random recent encoder output, kept in a small ring buffer.

Under ``torch.distributed`` the per-step statistics are all-reduced and restarts are broadcast from rank 0, so
every rank keeps an identical codebook (wrap the model with ``broadcast_buffers=False``: the ring buffer is
per-rank on purpose). Only training-mode forwards communicate; evaluation is local. Randomness comes from
torch's default generator, so results are deterministic given the torch seed.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class VectorQuantizer(nn.Module):
    """Quantizes ``[B, in_dim, h, w]`` features to ``codebook_size`` cosine-similarity codes."""

    def __init__(
        self,
        in_dim: int,
        codebook_size: int,
        code_dim: int = 32,
        decay: float = 0.99,
        beta: float = 0.25,
        dead_threshold: float = 1.0,
        buffer_size: int = 8192,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.codebook_size, self.decay, self.beta = codebook_size, decay, beta
        self.dead_threshold, self.eps = dead_threshold, eps
        self.proj_in = nn.Conv2d(in_dim, code_dim, 1)
        self.proj_out = nn.Conv2d(code_dim, in_dim, 1)
        self.register_buffer("codebook", F.normalize(torch.randn(codebook_size, code_dim), dim=1))
        self.register_buffer("ema_cluster_size", torch.zeros(codebook_size))
        self.register_buffer("ema_embed_sum", torch.zeros(codebook_size, code_dim))
        self.register_buffer("ema_steps", torch.zeros((), dtype=torch.long))
        # Recent projected inputs for restarts: per rank, not saved with the model.
        self.register_buffer("recent", torch.zeros(buffer_size, code_dim), persistent=False)
        self.register_buffer("recent_count", torch.zeros((), dtype=torch.long), persistent=False)

    def lookup(self, codes: torch.Tensor) -> torch.Tensor:
        """Token ids ``[B, h, w]`` → quantized features ``[B, in_dim, h, w]`` (what the decoder consumes)."""
        return self.proj_out(self.codebook[codes].permute(0, 3, 1, 2))

    def _project(self, x: torch.Tensor) -> torch.Tensor:
        """Features ``[B, in_dim, h, w]`` → unit vectors ``[B * h * w, code_dim]`` in the lookup space (float32)."""
        z = F.normalize(self.proj_in(x.float()), dim=1)
        return z.permute(0, 2, 3, 1).reshape(-1, z.shape[1])

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids ``[B, h, w]`` of features ``[B, in_dim, h, w]``; no statistics are touched."""
        b, _, h, w = x.shape
        with torch.autocast(device_type=x.device.type, enabled=False):
            return (self._project(x) @ self.codebook.t()).argmax(dim=1).reshape(b, h, w)

    def usage(self) -> torch.Tensor:
        """Bias-corrected EMA of assignments per training step, per code."""
        steps = max(int(self.ema_steps), 1)
        return self.ema_cluster_size / (1.0 - self.decay**steps)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """``x [B, in_dim, h, w]`` → ``(quantized [B, in_dim, h, w], codes [B, h, w], stats)``.

        ``stats``: ``commit`` (the weighted commitment loss, to add to the training loss), ``usage`` (fraction
        of codes used by this batch, all ranks), ``perplexity`` (of the batch's code histogram) and, in training
        mode, ``restarted`` (codes restarted this step).
        """
        b, _, h, w = x.shape
        with torch.autocast(device_type=x.device.type, enabled=False):
            flat = self._project(x)
            codes = (flat.detach() @ self.codebook.t()).argmax(dim=1)
            quant = self.codebook[codes]
            commit = self.beta * (flat - quant).pow(2).sum(dim=1).mean()
            counts = torch.bincount(codes, minlength=self.codebook_size).float()
            stats = {"commit": commit}
            if self.training:
                with torch.no_grad():
                    stats["restarted"] = self._update(flat.detach(), codes, counts)
            probs = counts / counts.sum()
            stats["usage"] = (counts > 0).float().mean()
            stats["perplexity"] = torch.exp(-(probs * torch.log(probs.clamp_min(1e-12))).sum())
            quant = flat + (quant - flat).detach()  # straight-through: the decoder's gradient reaches the encoder
            quant = quant.reshape(b, h, w, -1).permute(0, 3, 1, 2)
        return self.proj_out(quant), codes.reshape(b, h, w), stats

    def _update(self, flat: torch.Tensor, codes: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """One EMA step (``counts`` is all-reduced in place), then restart dead codes; returns how many."""
        embed_sum = torch.zeros_like(self.ema_embed_sum).index_add_(0, codes, flat)
        if _distributed():
            dist.all_reduce(counts)
            dist.all_reduce(embed_sum)
        self.ema_cluster_size.mul_(self.decay).add_(counts, alpha=1 - self.decay)
        self.ema_embed_sum.mul_(self.decay).add_(embed_sum, alpha=1 - self.decay)
        self.ema_steps += 1
        # Laplace smoothing keeps the division finite; the direction is what the cosine codebook keeps.
        n = self.ema_cluster_size.sum()
        size = (self.ema_cluster_size + self.eps) / (n + self.codebook_size * self.eps) * n
        seen = (self.ema_cluster_size > 0).unsqueeze(1)
        self.codebook.copy_(torch.where(seen, F.normalize(self.ema_embed_sum / size.unsqueeze(1), dim=1), self.codebook))
        self._remember(flat)
        return self._restart_dead()

    def _remember(self, flat: torch.Tensor) -> None:
        size = self.recent.shape[0]
        take = flat[torch.randperm(flat.shape[0], device=flat.device)[:size]]
        slots = (self.recent_count + torch.arange(take.shape[0], device=flat.device)) % size
        self.recent[slots] = take
        self.recent_count += take.shape[0]

    def _restart_dead(self) -> torch.Tensor:
        dead = (self.usage() < self.dead_threshold).nonzero().squeeze(1)
        if dead.numel() == 0:
            return torch.zeros((), device=dead.device)
        filled = int(min(int(self.recent_count), self.recent.shape[0]))
        fresh = self.recent[torch.randint(0, filled, (dead.numel(),), device=dead.device)]
        if _distributed():
            dist.broadcast(fresh, src=0)
        # A restarted code starts at twice the threshold, so it survives a step or two without assignments.
        start = 2 * self.dead_threshold * (1.0 - self.decay ** int(self.ema_steps))
        self.codebook[dead] = fresh
        self.ema_embed_sum[dead] = fresh * start
        self.ema_cluster_size[dead] = start
        return torch.tensor(float(dead.numel()), device=dead.device)
