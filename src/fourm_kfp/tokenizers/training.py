"""Train a VQ-VAE tokenizer (single process, or DDP under torchrun) and evaluate it against a trivial baseline.

:func:`train_vqvae` is a short AdamW loop with linear warm-up, cosine decay and gradient clipping. When
``torch.distributed`` is initialised (e.g. ``torchrun`` with the gloo or nccl backend) the model is wrapped in
``DistributedDataParallel``; each rank feeds its own batches, gradients are averaged by DDP and the codebook's
EMA statistics by the quantizer, so every rank ends with identical weights. Only rank 0 logs.

With :class:`Checkpointing` it saves its state every ``every`` steps and at its last step, and a restarted call
resumes from the newest complete checkpoint: the same steps follow, bit for bit on the CPU. A checkpoint holds the
weights and codebook statistics, the optimizer, the schedule's step and the world size (DCP and rank 0's train
state), and per rank the batch stream's position, the log records and the sums of the log interval under way, the
buffers the model's state dict leaves out (the quantizer's ring of recent inputs, from which dead codes restart)
and the RNG states. A checkpoint at the last step means the tokenizer is trained: a restart loads it and trains no
step. The checkpoint store itself is the caller's (the stage hands in :mod:`fourm_kfp.train.checkpoint`'s).

:func:`evaluate_tokenizer` round-trips validation arrays through tokens and reports the modality's errors
(:mod:`.metrics`), the same errors of the trivial baseline, their ratio and codebook usage / perplexity.
"""

from __future__ import annotations

import base64
import itertools
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Protocol

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
#: What a log interval sums: the losses and codebook statistics.
LOGGED = ("loss", "recon", "usage", "perplexity")


class ResumableBatches(Protocol):
    """Batches with a position a checkpoint holds (:class:`fourm_kfp.tokenizers.image_batches.ImageBatches`)."""

    def __iter__(self) -> Iterator[Batch]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class Checkpointing:
    """Where :func:`train_vqvae` saves its state, every ``every`` steps and at its last, and finds it when restarted:
    a checkpoint store's calls (:mod:`fourm_kfp.train.checkpoint`'s): ``save(step, app_state, rank_state,
    train_state)`` (collective; it adds the RNG states to ``rank_state["rng"]``), ``latest()`` (the newest complete
    checkpoint or ``None``), ``load(checkpoint, app_state)`` (into ``app_state`` in place; returns ``(train_state,
    rank_state or None)``) and ``restore_rng(rank_state["rng"])``."""

    every: int
    save: Callable[[int, dict[str, Any], dict[str, Any], dict[str, Any]], Any]
    latest: Callable[[], Any]
    load: Callable[[Any, dict[str, Any]], tuple[dict[str, Any], dict[str, Any] | None]]
    restore_rng: Callable[[dict[str, str]], None]

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"Checkpointing.every must be at least 1 step, got {self.every}")

    def due(self, step: int, steps: int) -> bool:
        """Whether ``step`` of ``steps`` is saved: every ``every`` steps and the last."""
        return step % self.every == 0 or step == steps


@dataclass
class _Progress:
    """Where training stands besides the model and optimizer: the last step done, this rank's log records and the
    sums of the log interval under way."""

    step: int = 0
    records: list[dict[str, float]] = field(default_factory=list)
    sums: dict[str, torch.Tensor] = field(default_factory=dict)


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
    train_batches: BatchSource | ResumableBatches,
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
    checkpointing: Checkpointing | None = None,
) -> tuple[VQVAE, list[dict[str, float]]]:
    """Train a tokenizer for ``config.modality`` for ``steps`` steps; returns ``(model, log records)``.

    ``train_batches`` yields (or, if callable, maps the step number to) dicts of in-memory batches
    ``{modality: [B, H, W(, C)] array}``; under DDP each rank passes its own. ``config.norm_stats`` must already
    be fitted (:func:`~fourm_kfp.tokenizers.modality_codecs.fit_normalisation`). The model comes back unwrapped
    and in eval mode. Every ``log_every`` steps (and at the end) rank 0 logs step, loss, codebook usage and
    perplexity (means over the interval), samples/s over all ranks and ETA; the same values are the records.
    ``precision="bf16"`` runs encoder and decoder under bfloat16 autocast (for GPUs; the codebook lookup and the
    loss stay in float32). ``checkpointing`` saves and resumes (module docstring); it needs ``train_batches`` with
    a position (:class:`ResumableBatches`).
    """
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"precision must be 'fp32' or 'bf16', got {precision!r}")
    if checkpointing is not None and not hasattr(train_batches, "load_state_dict"):
        raise TypeError(f"train_vqvae({config.modality!r}): checkpointing needs batches with a position "
                        f"(state_dict/load_state_dict), got {type(train_batches).__name__}")
    device = torch.device(device)
    torch.manual_seed(seed)
    model = VQVAE(config).to(device).train()
    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, steps, warmup_steps, min_lr_ratio))
    progress = _Progress()
    if checkpointing is not None:
        progress = _restore(checkpointing, model, optimizer, schedule, train_batches, steps, device) or progress
    net = model
    if dist.is_initialized():
        device_ids = [device.index] if device.type == "cuda" else None
        net = DistributedDataParallel(model, device_ids=device_ids, broadcast_buffers=False)
    records, sums = progress.records, progress.sums
    start, first = time.monotonic(), progress.step
    samples, batches = 0, _batches(train_batches, config.modality)
    with flush_denormals(device):  # weights and gradients drift into subnormals: several-fold slower on the CPU
        for step in range(first + 1, steps + 1):
            arrays = next(batches)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                _, _, losses = net(model.prepare(arrays))
            optimizer.zero_grad(set_to_none=True)
            losses["loss"].backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            optimizer.step()
            schedule.step()
            samples += len(arrays) * world
            for key in LOGGED:
                sums[key] = sums.get(key, 0.0) + losses[key].detach()
            if step % log_every == 0 or step == steps:
                now = time.monotonic()
                interval = step - (records[-1]["step"] if records else 0)
                record = {"step": step, **{k: float(v) / interval for k, v in sums.items()}}
                record["samples_per_s"] = samples / (now - start)
                record["eta_s"] = (now - start) / (step - first) * (steps - step)
                records.append(record)
                sums = {}
                if rank == 0:
                    logger.info(
                        "train-tokenizer %s: step %d/%d loss %.4f recon %.4f usage %.1f%% perplexity %.0f "
                        "%.1f samples/s ETA %ds", config.modality, step, steps, record["loss"], record["recon"],
                        100 * record["usage"], record["perplexity"], record["samples_per_s"], record["eta_s"],
                    )  # fmt: skip
            if checkpointing is not None and checkpointing.due(step, steps):
                _save(checkpointing, step, model, optimizer, schedule, train_batches, _Progress(step, records, sums),
                      world)
    return model.eval(), records


def _app_state(model: VQVAE, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """DCP's state of the model and optimizer (the optimizer's is initialised first when it has taken no step)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optimizer_state}


def _unsaved_buffers(model: VQVAE) -> dict[str, torch.Tensor]:
    """The buffers the model's state dict leaves out: the quantizer's per-rank ring of recent inputs."""
    saved = model.state_dict().keys()
    return {name: buffer for name, buffer in model.named_buffers() if name not in saved}


def _save(checkpointing: Checkpointing, step: int, model: VQVAE, optimizer: torch.optim.Optimizer,
          schedule: torch.optim.lr_scheduler.LRScheduler, batches: ResumableBatches, progress: _Progress,
          world: int) -> None:
    sums = {k: {"value": float(v), "dtype": str(v.dtype).removeprefix("torch.")} for k, v in progress.sums.items()}
    buffers = {name: base64.b64encode(buffer.cpu().numpy().tobytes()).decode()
               for name, buffer in _unsaved_buffers(model).items()}
    rank_state = {"batches": batches.state_dict(), "records": progress.records, "sums": sums, "buffers": buffers}
    checkpointing.save(step, _app_state(model, optimizer), rank_state,
                       {"schedule": schedule.state_dict(), "world": world})


def _restore(checkpointing: Checkpointing, model: VQVAE, optimizer: torch.optim.Optimizer,
             schedule: torch.optim.lr_scheduler.LRScheduler, batches: ResumableBatches, steps: int,
             device: torch.device) -> _Progress | None:
    """Load the newest complete checkpoint into the model, optimizer, schedule and batches; ``None``: there is none."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    ckpt = checkpointing.latest()
    if ckpt is None:
        return None
    app_state = _app_state(model, optimizer)
    train_state, rank_state = checkpointing.load(ckpt, app_state)
    set_state_dict(model, optimizer, model_state_dict=app_state["model"], optim_state_dict=app_state["optim"])
    schedule.load_state_dict(train_state["schedule"])
    step, world = train_state["step"], dist.get_world_size() if dist.is_initialized() else 1
    modality, primary = model.config.modality, not dist.is_initialized() or dist.get_rank() == 0
    sums: dict[str, torch.Tensor] = {}
    if rank_state is not None and train_state["world"] == world:  # this rank continues exactly where it stopped
        batches.load_state_dict(rank_state["batches"])
        for name, buffer in _unsaved_buffers(model).items():
            saved = bytearray(base64.b64decode(rank_state["buffers"][name]))
            buffer.copy_(torch.frombuffer(saved, dtype=buffer.dtype).reshape(buffer.shape))
        checkpointing.restore_rng(rank_state["rng"])
        sums = {k: torch.tensor(v["value"], dtype=getattr(torch, v["dtype"]), device=device)
                for k, v in rank_state["sums"].items()}
    elif step < steps:
        logger.warning("train-tokenizer %s: resumed at step %d on %d processes from a checkpoint of %d: the batches "
                       "start again from the data's beginning, so the result is not the uninterrupted run's",
                       modality, step, world, train_state["world"])
    if primary and step == steps:
        logger.info("train-tokenizer %s: already trained (checkpoint at its last step, %d); not trained again",
                    modality, step)
    elif primary:
        logger.info("train-tokenizer %s: resumed from step %d of %d", modality, step, steps)
    return _Progress(step, rank_state["records"] if rank_state else [], sums)


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
