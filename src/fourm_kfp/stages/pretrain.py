"""The ``pretrain`` stage: the 4M model trained on the pretokenized data: build, restore, train, validate, export,
report; resumable, single- or multi-process.

One function for every launcher: a plain process, ``torchrun``/torchx with several processes, or a PyTorchJob pod
(rank and world from the environment; ranks share no file system). Every rank runs :func:`run`; rank 0 alone
writes metrics files, weight snapshots (``train.snapshot_every``), the exported model and the report. Checkpoints
and snapshots live under the stage's own output (``checkpoints/``, ``snapshots/``), which the runner keeps across
restarts (the stage is resumable), so a restarted job continues from its newest complete checkpoint by itself.
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fourm_kfp import distributed
from fourm_kfp.config.schema import ConfigError
from fourm_kfp.contract import StageContext, StageResult
from fourm_kfp.hardware import peak_flops, resolve_precision, training_device, training_nondeterminism
from fourm_kfp.masking.token_loader import TokenLoader, validation_batches
from fourm_kfp.model.fourm import FourM, flops_per_token
from fourm_kfp.model.parallelize import full_state_dict, parallelize, unwrap
from fourm_kfp.model.saved_model import export_model, put_weights, snapshot_key, snapshot_steps
from fourm_kfp.stages import PRETOKENIZE, TRAIN_TOKENIZERS
from fourm_kfp.storage import Store
from fourm_kfp.train import curves
from fourm_kfp.train.build import TrainingInputs, loader_args, masking_args, modality_specs, model_args
from fourm_kfp.train.checkpoint import CheckpointManager, complete_checkpoints, find_checkpoint
from fourm_kfp.train.metrics import ConsoleSink, JsonLinesSink, MetricWriter, TrackerSink
from fourm_kfp.train.optimizer import Schedule, build_optimizer, peak_learning_rate
from fourm_kfp.train.step import StepSettings, autocast
from fourm_kfp.train.trainer import LoopSettings, Loader, Trainer

log = logging.getLogger("fourm_kfp.train")
PRETOKENIZED, TOKENIZERS = PRETOKENIZE.name, TRAIN_TOKENIZERS.name
#: The exported weights are also an MLflow artifact up to this size.
MAX_MLFLOW_MODEL_BYTES = 512 << 20


def batch_layout(train: Any, world: int) -> tuple[int, int]:
    """``(micro batch per rank, micro-batches per step)`` from the global batch."""
    micro = train.micro_batch_size or train.global_batch_size // world
    if micro < 1 or train.global_batch_size % (micro * world):
        raise ConfigError(f"train.global_batch_size={train.global_batch_size} is not a multiple of "
                          f"micro_batch_size ({micro}) x world size ({world})")
    return micro, train.global_batch_size // (micro * world)


def total_steps(train: Any, train_samples: int) -> int:
    """The schedule's length from ``steps``, ``epochs`` or ``tokens``."""
    if train.steps:
        return train.steps
    if train.epochs:
        return max(math.ceil(train.epochs * train_samples / train.global_batch_size), 1)
    return max(math.ceil(train.tokens / (train.global_batch_size * (train.input_budget + train.target_budget))), 1)


def marginal_losses(train_batches: list, val_batches: list, names: tuple[str, ...],
                    vocab: list[int]) -> dict[str, float]:
    """Per modality: the cross-entropy on the val targets of predicting the train targets' marginal distribution
    (add-one smoothed) — the loss a model reaches that ignores its inputs and positions."""
    out = {}
    for i, name in enumerate(names):
        counts = np.ones(vocab[i])
        for b in train_batches:
            t = b.dec_targets[(b.dec_modality == i) & b.dec_valid].numpy()
            counts += np.bincount(t, minlength=vocab[i])[: vocab[i]]
        logp = np.log(counts / counts.sum())
        targets = np.concatenate([b.dec_targets[(b.dec_modality == i) & b.dec_valid].numpy() for b in val_batches])
        if targets.size:
            out[name] = float(-logp[targets].mean())
    return out


def masked_modeling_validator(batches: list, device: torch.device, dtype: torch.dtype | None, names: tuple[str, ...]):
    @torch.no_grad()
    def validate(model: torch.nn.Module) -> dict[str, float]:
        sums: dict[str, list[float]] = {}
        for batch in batches:
            with autocast(device, dtype):
                out = unwrap(model)(batch.to(device), with_accuracy=True)
            for name, loss in out.modality_losses.items():
                n = out.token_counts[name]
                acc = out.modality_accuracy[name]
                s = sums.setdefault(name, [0.0, 0.0, 0])
                s[0] += float(loss) * n
                s[1] += float(acc) * n
                s[2] += n
        values = {}
        for name in names:
            if name in sums:
                loss, acc, n = sums[name]
                values[f"val/loss/{name}"], values[f"val/accuracy/{name}"] = loss / n, acc / n
        losses = [v for k, v in values.items() if k.startswith("val/loss/")]
        values["val/loss"] = float(np.mean(losses)) if losses else math.nan
        return values

    return validate


def run(ctx: StageContext) -> StageResult:
    cfg = ctx.config
    train = cfg.train
    rank, world = distributed.rank(), distributed.world_size()
    inputs = TrainingInputs.read(ctx.inputs[PRETOKENIZED].uri, ctx.inputs[TOKENIZERS].uri)
    device = training_device()
    dtype = resolve_precision(train.precision, device)
    precision = "bf16" if dtype else "fp32"  # what ``auto`` resolved to here: logged and in the manifest's counts
    specs = modality_specs(cfg, inputs)
    args = model_args(cfg, specs)
    masking = masking_args(cfg, specs, inputs)
    micro, accum = batch_layout(train, world)
    steps = total_steps(train, inputs.pretokenized["splits"]["train"])
    log.info("pretrain: %d steps of %d samples (%d ranks x %d micro-batches of %d), %s on %s, modalities %s",
             steps, train.global_batch_size, world, accum, micro, precision, device,
             ", ".join(args.names))

    torch.manual_seed(train.seed)
    model = FourM(args).to(device)
    if train.init_from:
        _init_weights(model, train.init_from)
    trunk = parallelize(model, mode=train.parallelism if world > 1 else "none",
                        activation_checkpointing=train.activation_checkpointing, compile=train.compile,
                        param_dtype=dtype)
    optimizer = build_optimizer(unwrap(trunk), train.optimizer, peak_learning_rate(train.optimizer.base_lr,
                                                                                    train.global_batch_size))
    schedule = Schedule(optimizer.param_groups[0]["lr"], train.optimizer.warmup_steps, steps,
                        train.optimizer.min_lr_ratio)
    loader_cfg = loader_args(cfg, inputs, masking, micro, rank, world, device)
    loader = TokenLoader(loader_cfg)
    val = validation_batches(loader_cfg, train.val_batches)
    store = ctx.output.inner  # checkpoints and metrics are rewritten as training goes: recorded at the end
    checkpoints = CheckpointManager(store.child("checkpoints"), train.keep_last, train.keep_every)
    sinks = [ConsoleSink(steps), TrackerSink(ctx.tracker), JsonLinesSink(store, "metrics.jsonl")] \
        if distributed.is_primary() else []
    writer = MetricWriter(sinks)
    enc, dec = train.input_budget, train.target_budget
    loop = LoopSettings(total_steps=steps, accum=accum, log_every=train.log_every, val_every=train.val_every,
                        checkpoint_every=train.checkpoint_every, nonfinite=train.nonfinite,
                        max_skipped_steps=train.max_skipped_steps, profile_steps=train.profile_steps,
                        snapshot_every=train.snapshot_every, flops_per_token=flops_per_token(args, enc, dec),
                        peak_flops=peak_flops(device, dtype) * world)
    profile_dir = Path(tempfile.mkdtemp(prefix="fourm-profile-")) if train.profile_steps else None
    trainer = Trainer(model=trunk, optimizer=optimizer, schedule=schedule,
                      loader=Loader(loader.batches, loader.state_dict, loader.load_state_dict, loader.metrics),
                      validate=masked_modeling_validator(val, device, dtype, args.names), checkpoints=checkpoints,
                      metrics=writer, loop=loop,
                      step_settings=StepSettings(dtype, train.optimizer.grad_clip, args.names), device=device,
                      profile_dir=profile_dir, snapshot=lambda step: _snapshot(trunk, store, step))
    resumed = trainer.restore(train.resume_from or None)
    state = trainer.fit()

    divergence = replica_divergence(trunk) if train.parallelism == "ddp" else 0.0
    model_state = full_state_dict(trunk)  # collective under FSDP2
    if not distributed.is_primary():
        return StageResult()
    specials = inputs.special_tokens
    card = export_model(model_state, args, ctx.output, tokenizers_uri=inputs.tokenizers_uri,
                        pretokenized_uri=inputs.pretokenized_uri, text_special_ids=specials, step=state.step)
    for ckpt in complete_checkpoints(store.child("checkpoints")):
        for key in ckpt.store.list():
            ctx.output.record_existing(f"checkpoints/{ckpt.store.uri.rsplit('/', 1)[1]}/{key}")
    for step in snapshot_steps(store):  # some may come from a run this one resumed
        ctx.output.record_existing(snapshot_key(step))
    ctx.output.record_existing("metrics.jsonl")
    if profile_dir and (profile_dir / "trace.json").exists():
        ctx.output.put_file("profile/trace.json", profile_dir / "trace.json")
    sample_batches = TokenLoader(loader_cfg).batches()
    train_sample = [next(sample_batches) for _ in range(max(4, 256 // micro))]
    marginal = marginal_losses(train_sample, val, args.names, [s.vocab_size for s in specs])
    report = _report(trainer, marginal, card, state, steps)
    ctx.write_report("pretrain_report.json", json.dumps(report, indent=2, sort_keys=True).encode())
    ctx.write_report("pretrain_report.md", _markdown(report).encode())
    ctx.write_report("training_curves.png", _curves(writer.history, trainer.val_history, marginal))
    ctx.tracker.log_artifact("model/model.json", json.dumps(card, indent=2).encode())
    if card["parameters"] * 4 <= MAX_MLFLOW_MODEL_BYTES:  # larger models stay in the store; the card has the URI
        ctx.tracker.log_artifact("model/model.safetensors", ctx.output.get_bytes("model/model.safetensors"))
    metrics = {"steps": float(state.step), "tokens": float(state.tokens), "skipped_steps": float(state.skipped),
               "replica_divergence": divergence, "resumed": float(resumed), **_throughput(writer),
               **{k.replace("/", "."): v for k, v in trainer.val_history[-1].items() if k != "step"}}
    counts = {"steps": state.step, "parameters": card["parameters"], "modalities": list(args.names),
              "precision": precision}  # not part of the address: a machine's own choice
    return StageResult(counts=counts, metrics=metrics, nondeterminism=training_nondeterminism(device))


def _snapshot(model: torch.nn.Module, store: Store, step: int) -> None:
    """``train.snapshot_every``: the weights at ``step`` beside the model (gathered on every rank, written by
    rank 0)."""
    state = full_state_dict(model)
    if distributed.is_primary():
        put_weights(store, snapshot_key(step), state)


def replica_divergence(model: torch.nn.Module) -> float:
    """Largest difference between the ranks' parameter checksums (0 when the DDP replicas are identical, as they
    must be); a divergence is a bug, so it fails the run."""
    if distributed.world_size() == 1:
        return 0.0
    checksum = torch.stack([p.detach().double().sum() for p in unwrap(model).parameters()]).sum().reshape(1)
    gathered = [torch.zeros_like(checksum) for _ in range(distributed.world_size())]
    torch.distributed.all_gather(gathered, checksum)
    spread = float((torch.cat(gathered).max() - torch.cat(gathered).min()).abs())
    if spread != 0.0:
        raise RuntimeError(f"DDP replicas diverged: parameter checksums differ by {spread:g} across ranks")
    return spread


def _init_weights(model: FourM, uri: str) -> None:
    """``train.init_from``: model weights only, from a pretrain output or a checkpoint; what is missing stays
    freshly initialised (fine-tuning with new modalities)."""
    from fourm_kfp.storage import open_store
    from fourm_kfp.train.checkpoint import load_checkpoint

    store = open_store(uri)
    if store.exists("model/model.json"):
        from fourm_kfp.model.saved_model import load_model

        source, _ = load_model(store)
        state = source.state_dict()
    else:
        ckpt = find_checkpoint(store)
        if ckpt is None:
            raise ConfigError(f"train.init_from: {uri} is neither a pretrain output nor a checkpoint")
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        app = {"model": get_model_state_dict(model)}
        load_checkpoint(ckpt, app)
        state = app["model"]
    own = model.state_dict()
    usable = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    model.load_state_dict(usable, strict=False)
    log.info("init_from %s: %d of %d tensors loaded, %d initialised fresh", uri, len(usable), len(own),
             len(own) - len(usable))


def _report(trainer: Trainer, marginal: dict[str, float], card: dict, state: Any, steps: int) -> dict[str, Any]:
    first, last = trainer.val_history[0], trainer.val_history[-1]
    per_modality = {}
    for name in card["modalities"]:
        key = f"val/loss/{name}"
        if key in last:
            per_modality[name] = {"val_loss_start": first.get(key), "val_loss_end": last[key],
                                  "val_accuracy_end": last.get(f"val/accuracy/{name}"),
                                  "marginal_loss": marginal.get(name)}
    return {"steps": state.step, "planned_steps": steps, "tokens": state.tokens, "samples": state.samples,
            "skipped_steps": state.skipped, "parameters": card["parameters"],
            "first_val_step": int(first["step"]), "last_val_step": int(last["step"]),
            "modalities": per_modality, "val_history": trainer.val_history}


def _throughput(writer: MetricWriter) -> dict[str, float]:
    """Mean tokens/s and MFU of the logged intervals after the first (which includes start-up): wall-clock
    measures, so they go to the manifest and MLflow, never into the report files; absent when there was no such
    interval (a run shorter than two log intervals)."""
    lines = [h for h in writer.history if "tokens_per_s" in h][1:]
    means = {key: float(np.mean([h[key] for h in lines if key in h] or [math.nan])) for key in ("tokens_per_s", "mfu")}
    return {key: value for key, value in means.items() if math.isfinite(value)}


def _markdown(report: dict[str, Any]) -> str:
    first, last = report["first_val_step"], report["last_val_step"]
    lines = ["# pretrain", "",
             f"{report['steps']} steps, {report['tokens']:,} tokens, {report['parameters']:,} parameters, "
             f"skipped steps {report['skipped_steps']} (throughput: the stage's MLflow run and manifest metrics)", ""]
    if first > 0:
        lines += [f"This run started from a checkpoint: its first validation is at step {first} (the validation "
                  "history before a checkpoint is not saved with it).", ""]
    lines += [f"| modality | val loss at step {first} | val loss at step {last} | marginal (predict the token "
              "distribution) | end below marginal | val token accuracy |", "|---|---:|---:|---:|---|---:|"]
    for name, m in report["modalities"].items():
        below = "yes" if m["marginal_loss"] is not None and m["val_loss_end"] < m["marginal_loss"] else "no"
        lines.append(f"| {name} | {m['val_loss_start']:.3f} | {m['val_loss_end']:.3f} | "
                     f"{(m['marginal_loss'] or math.nan):.3f} | {below} | {m['val_accuracy_end']:.1%} |")
    return "\n".join(lines) + "\n"


def _curves(history: list[dict[str, float]], val_history: list[dict[str, float]],
            marginal: dict[str, float]) -> bytes:
    train = [(h["step"], h["loss"]) for h in history if "loss" in h and "tokens_per_s" in h]
    names = sorted({k.split("/", 2)[2] for h in val_history for k in h if k.startswith("val/loss/")})
    val = {n: [(h["step"], h[f"val/loss/{n}"]) for h in val_history if f"val/loss/{n}" in h] for n in names}
    return curves.stack_png([curves.line_chart("train loss (mean over modalities)", {"loss": train}),
                             curves.line_chart("validation loss per modality", val, marginal, "nats")])
