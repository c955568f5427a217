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
import tempfile
from pathlib import Path

import torch

from fourm_kfp import distributed
from fourm_kfp.contract import StageContext, StageResult
from fourm_kfp.hardware import peak_flops, resolve_precision, training_device, training_nondeterminism
from fourm_kfp.masking.token_loader import TokenLoader, validation_batches
from fourm_kfp.model.fourm import FourM, flops_per_token
from fourm_kfp.model.parallelize import full_state_dict, parallelize, unwrap
from fourm_kfp.model.ml4m import export_ml4m, ml4m_unexpressible
from fourm_kfp.model.saved_model import WEIGHTS, export_model, put_weights, snapshot_key, snapshot_steps
from fourm_kfp.stages import PRETOKENIZE, TRAIN_TOKENIZERS
from fourm_kfp.storage import Store
from fourm_kfp.train.batch_plan import batch_layout, total_steps
from fourm_kfp.train.build import TrainingInputs, loader_args, masking_args, modality_specs, model_args
from fourm_kfp.train.checkpoint import CheckpointManager, complete_checkpoints
from fourm_kfp.train.initial_weights import load_initial_weights
from fourm_kfp.train.marginal_baseline import marginal_losses
from fourm_kfp.train.metrics import ConsoleSink, JsonLinesSink, MetricWriter, TrackerSink
from fourm_kfp.train.optimizer import Schedule, build_optimizer, peak_learning_rate
from fourm_kfp.train.pretrain_report import pretrain_report, report_markdown, throughput, training_curves_png
from fourm_kfp.train.replica_divergence import replica_divergence
from fourm_kfp.train.step import StepSettings
from fourm_kfp.train.trainer import LoopSettings, Loader, Trainer
from fourm_kfp.train.validation import masked_modeling_validator

log = logging.getLogger("fourm_kfp.train")
PRETOKENIZED, TOKENIZERS = PRETOKENIZE.name, TRAIN_TOKENIZERS.name
#: Where a model ml-4m can express is also written in its format (``config.json``, ``model.safetensors``).
ML4M_FOLDER = "ml4m/"
#: The exported weights are also an MLflow artifact up to this size.
MAX_MLFLOW_MODEL_BYTES = 512 << 20


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
    init = load_initial_weights(model, train.init_from, inputs.tokenizers_uri) if train.init_from else None
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
    checkpoints = CheckpointManager(store.child("checkpoints"), train.keep_last, train.keep_every,
                                    upload_in_background=True)
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
                        pretokenized_uri=inputs.pretokenized_uri, text_special_ids=specials, step=state.step,
                        text_conventions=cfg.train.model.text_conventions)
    ml4m = _export_ml4m(model_state, args, ctx.output, card)
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
    report = pretrain_report(trainer, marginal, card, state, steps)
    ctx.write_report("pretrain_report.json", json.dumps(report, indent=2, sort_keys=True).encode())
    if init is not None:
        ctx.write_report("init_report.json", json.dumps(init.to_dict(), indent=2, sort_keys=True).encode())
    ctx.write_report("pretrain_report.md", report_markdown(report, init).encode())
    ctx.write_report("training_curves.png", training_curves_png(writer.history, trainer.val_history, marginal))
    ctx.tracker.log_artifact("model/model.json", json.dumps(card, indent=2).encode())
    if card["parameters"] * 4 <= MAX_MLFLOW_MODEL_BYTES:  # larger models stay in the store; the card has the URI
        ctx.tracker.log_artifact("model/model.safetensors", ctx.output.get_bytes("model/model.safetensors"))
    metrics = {"steps": float(state.step), "tokens": float(state.tokens), "skipped_steps": float(state.skipped),
               "replica_divergence": divergence, "resumed": float(resumed), **throughput(writer),
               **{k.replace("/", "."): v for k, v in trainer.val_history[-1].items() if k != "step"}}
    counts = {"steps": state.step, "parameters": card["parameters"], "modalities": list(args.names),
              "precision": precision,  # not part of the address: a machine's own choice
              "ml4m_export": ml4m}
    if init is not None:  # train.init_from: what it took, in the manifest and the MLflow run
        counts.update(init.counts())
        metrics.update({key: float(value) for key, value in init.counts().items()})
    return StageResult(counts=counts, metrics=metrics, nondeterminism=training_nondeterminism(device))


def init_fingerprint(config) -> str | None:
    """The address's share of ``train.init_from`` (:func:`fourm_kfp.train.initial_weights.source_fingerprint`);
    None without one."""
    from fourm_kfp.train.initial_weights import source_fingerprint

    return source_fingerprint(config.train.init_from) if config.train.init_from else None


def _export_ml4m(state: dict[str, torch.Tensor], args, output, card: dict) -> str | list[str]:
    """The model also in apple/ml-4m's format under ``ml4m/`` when its shapes can be written there
    (:func:`~fourm_kfp.model.ml4m.ml4m_unexpressible`): ``"ml4m/"``, or why not."""
    reasons = ml4m_unexpressible(args)
    if reasons:
        log.info("pretrain: no ml-4m export (%s)", "; ".join(reasons))
        return reasons
    model = FourM(args)
    model.load_state_dict(state)
    folder = output.child(ML4M_FOLDER)
    export_ml4m(model, folder, card={**card, "ml4m_of": WEIGHTS})
    log.info("pretrain: the model in ml-4m's format at %s", folder.uri)
    return ML4M_FOLDER


def _snapshot(model: torch.nn.Module, store: Store, step: int) -> None:
    """``train.snapshot_every``: the weights at ``step`` beside the model (gathered on every rank, written by
    rank 0)."""
    state = full_state_dict(model)
    if distributed.is_primary():
        put_weights(store, snapshot_key(step), state)
