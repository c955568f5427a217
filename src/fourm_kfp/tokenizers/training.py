"""Train a VQ-VAE tokenizer (single process, or DDP under torchrun) and evaluate it against a trivial baseline.

:func:`train_vqvae` is a short AdamW loop with linear warm-up, cosine decay and gradient clipping. When
``torch.distributed`` is initialised (e.g. ``torchrun`` with the gloo or nccl backend) the model is wrapped in
``DistributedDataParallel``; each rank feeds its own batches, gradients are averaged by DDP and the codebook's
EMA statistics by the quantizer, so every rank ends with identical weights. Only rank 0 logs.

:func:`evaluate_tokenizer` round-trips validation arrays through tokens and reports the modality's errors
(:mod:`.metrics`), the same errors of the trivial baseline, their ratio and codebook usage / perplexity.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from typing import Callable, Iterable, Iterator, Mapping

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from fourm_kfp.hardware import flush_denormals
from fourm_kfp.tokenizers.metrics import METRICS
from fourm_kfp.tokenizers.vqvae import VQVAE, VQVAEConfig

logger = logging.getLogger(__name__)

Batch = Mapping[str, np.ndarray]
BatchSource = Iterable[Batch] | Callable[[int], Batch]


def _lr_factor(step: int, steps: int, warmup_steps: int, min_lr_ratio: float) -> float:
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(steps - warmup_steps, 1)
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def _batches(source: BatchSource, modality: str) -> Iterator[np.ndarray]:
    if callable(source):
        return (source(step)[modality] for step in itertools.count())
    return (batch[modality] for batch in source)


def train_vqvae(
    config: VQVAEConfig,
    train_batches: BatchSource,
    steps: int,
    lr: float = 1e-3,
    *,
    warmup_steps: int = 20,
    min_lr_ratio: float = 0.1,
    weight_decay: float = 1e-4,
    grad_clip: float = 1.0,
    log_every: int = 50,
    seed: int = 0,
    device: str | torch.device = "cpu",
    precision: str = "fp32",
) -> tuple[VQVAE, list[dict[str, float]]]:
    """Train a tokenizer for ``config.modality`` for ``steps`` steps; returns ``(model, log records)``.

    ``train_batches`` yields (or, if callable, maps the step number to) dicts of in-memory batches
    ``{modality: [B, H, W(, C)] array}``; under DDP each rank passes its own. ``config.norm_stats`` must already
    be fitted (:func:`~fourm_kfp.tokenizers.modality_codecs.fit_normalisation`). The model comes back unwrapped
    and in eval mode. Every ``log_every`` steps (and at the end) rank 0 logs step, loss, codebook usage and
    perplexity (means over the interval), samples/s over all ranks and ETA; the same values are the records.
    ``precision="bf16"`` runs encoder and decoder under bfloat16 autocast (for GPUs; the codebook lookup and the
    loss stay in float32).
    """
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"precision must be 'fp32' or 'bf16', got {precision!r}")
    device = torch.device(device)
    torch.manual_seed(seed)
    model = VQVAE(config).to(device).train()
    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    net = model
    if dist.is_initialized():
        device_ids = [device.index] if device.type == "cuda" else None
        net = DistributedDataParallel(model, device_ids=device_ids, broadcast_buffers=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, steps, warmup_steps, min_lr_ratio))
    records: list[dict[str, float]] = []
    sums: dict[str, torch.Tensor] = {}
    start = time.monotonic()
    samples, batches = 0, _batches(train_batches, config.modality)
    with flush_denormals(device):  # weights and gradients drift into subnormals: several-fold slower on the CPU
        for step in range(1, steps + 1):
            arrays = next(batches)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                _, _, losses = net(model.prepare(arrays))
            optimizer.zero_grad(set_to_none=True)
            losses["loss"].backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            optimizer.step()
            schedule.step()
            samples += len(arrays) * world
            for key in ("loss", "recon", "usage", "perplexity"):
                sums[key] = sums.get(key, 0.0) + losses[key].detach()
            if step % log_every == 0 or step == steps:
                now = time.monotonic()
                interval = step - (records[-1]["step"] if records else 0)
                record = {"step": step, **{k: float(v) / interval for k, v in sums.items()}}
                record["samples_per_s"] = samples / (now - start)
                record["eta_s"] = (now - start) / step * (steps - step)
                records.append(record)
                sums = {}
                if rank == 0:
                    logger.info(
                        "train-tokenizer %s: step %d/%d loss %.4f recon %.4f usage %.1f%% perplexity %.0f "
                        "%.1f samples/s ETA %ds", config.modality, step, steps, record["loss"], record["recon"],
                        100 * record["usage"], record["perplexity"], record["samples_per_s"], record["eta_s"],
                    )  # fmt: skip
    return model.eval(), records


@torch.no_grad()
def evaluate_tokenizer(
    model: VQVAE, val_arrays: np.ndarray, train_arrays: np.ndarray | None = None, batch_size: int = 64
) -> dict[str, float]:
    """Round-trip ``val_arrays`` ``[N, H, W(, C)]`` through tokens; errors vs the original, and the baseline's.

    Keys: the modality's errors (:mod:`.metrics`), the same prefixed ``baseline_`` for the trivial baseline
    fitted on ``train_arrays`` (on ``val_arrays`` if none are given, which flatters the baseline),
    ``error_ratio`` (primary error / the baseline's; the demo target is <= 0.25), ``codebook_usage`` (fraction
    of codes used on the validation set), ``perplexity`` and ``tokens_per_image``. Runs locally (no collectives).
    """
    metrics = METRICS[model.config.modality]
    was_training = model.training
    model.eval()
    tokens, recon = [], []
    for i in range(0, len(val_arrays), batch_size):
        codes = model.encode(val_arrays[i : i + batch_size])
        tokens.append(codes.flatten().cpu())
        recon.append(model.decode(codes))
    model.train(was_training)
    # what the tokens reproduce (a relative depth map standardised), for the reconstruction and the baseline alike
    val_arrays = model.codec.reference(val_arrays)
    errors = metrics.errors(np.concatenate(recon), val_arrays)
    baseline = metrics.baseline(val_arrays if train_arrays is None else model.codec.reference(train_arrays))
    baseline_errors = metrics.errors(np.broadcast_to(baseline, val_arrays.shape), val_arrays)
    counts = torch.bincount(torch.cat(tokens), minlength=model.config.codebook_size).double()
    probs = counts / counts.sum()
    return {
        **errors,
        **{f"baseline_{k}": v for k, v in baseline_errors.items()},
        "error_ratio": errors[metrics.primary] / max(baseline_errors[metrics.primary], 1e-12),
        "codebook_usage": float((counts > 0).double().mean()),
        "perplexity": float(torch.exp(-(probs * torch.log(probs.clamp_min(1e-12))).sum())),
        "tokens_per_image": float(model.config.grid_size**2),
    }
