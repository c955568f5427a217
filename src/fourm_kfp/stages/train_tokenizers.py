"""The ``train-tokenizers`` stage: a VQ-VAE per image modality and one WordPiece tokenizer for text, trained on the
prepared dataset and committed as the bundle that :func:`fourm_kfp.tokenizers.bundle.load_tokenizers` reads back.

Reads the dataset's shards (prepare-data's, with the label stage's modalities when it ran; local or S3), trains
each image tokenizer on the train split (single process, or DDP when the stage runs under torchrun), evaluates it
on the val split against a trivial baseline (the per-pixel mean image / majority class), trains the text tokenizer
on the sequence modalities (captions, det strings, ...) or takes an existing one as it is
(``train_tokenizers.text_tokenizer_from``: ml-4m's, say), and writes the bundle that
:func:`fourm_kfp.tokenizers.bundle.load_tokenizers` reads back, plus a report and a reconstruction grid.

A modality named in ``train_tokenizers.from_ml4m`` is not trained: its tokenizer is apple/ml-4m's, read from the
folder named there (:mod:`fourm_kfp.tokenizers.ml4m.adapter`: the conventions between our arrays and its inputs,
the side it runs at). The folder's two files are copied into the bundle as they are (so the bundle stands alone, as
with our own tokenizers), the index records its source, digest and config, the report its reconstruction error on
the val images beside the same baseline, and the folder's digest is part of the stage's address.

In one process on a CPU with several cores, the image tokenizers train side by side in forked worker processes, the
cores split among them (:mod:`fourm_kfp.tokenizers.parallel_training`).

The stage is resumable. Each VQ-VAE being trained saves a checkpoint every ``train_tokenizers.checkpoint_every``
steps and at its last step into ``checkpoints/<modality>/step-NNNNNNNN/`` of the stage's own output
(:mod:`fourm_kfp.train.checkpoint`: DCP, ``_COMPLETE`` last; the newest complete one is kept), which the runner keeps
across restarts. A restarted run resumes each tokenizer from its newest complete checkpoint (weights, optimizer,
schedule, RNG, batch position: :mod:`fourm_kfp.tokenizers.training`) and trains a finished one (a checkpoint at its
last step) no further, and commits the bytes an uninterrupted run commits. The checkpoints are working state, not
payload: no manifest lists them, so how often a run saved or whether it was interrupted changes neither its address
nor its payload. The WordPiece text tokenizer has none: it is deterministic and takes seconds, so a restart trains
it again.

The dataset's class vocabularies and modality settings (:mod:`fourm_kfp.data.vocabularies`) shape the tokenizers:
the semseg tokenizer has one channel per class of the vocabulary, a relative depth is standardised per image, a
feature map's tokenizer (``clip``, ``dinov2``) has its channels and one token per cell of its grid (each saved as
its codec's settings), the text tokenizer keeps the class names whole, and the index records the
vocabularies that differ from the defaults, for the stages that read the model back.
"""

from __future__ import annotations

import io
import json
import logging
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fourm_kfp import distributed
from fourm_kfp.contract import ExternalSource, StageContext, StageResult
from fourm_kfp.data.dataset_report import render_preview_grid
from fourm_kfp.data.modalities import get_modality
from fourm_kfp.hardware import training_nondeterminism
from fourm_kfp.data.shard_stream import MissingModalityError, available_modalities, iter_texts
from fourm_kfp.data.vocabularies import DatasetMeta, read_dataset_meta
from fourm_kfp.storage import open_store
from fourm_kfp.tokenizers.bundle import INDEX_FILE, TEXT_FILE, VOCABULARIES, image_key
from fourm_kfp.tokenizers.image_batches import SHUFFLE_BUFFER, ImageBatches, modality_arrays
from fourm_kfp.tokenizers.ml4m.adapter import describe, folder_digest, index_entry, load_ml4m_tokenizer
from fourm_kfp.tokenizers.ml4m.folder import CONFIG as ML4M_CONFIG
from fourm_kfp.tokenizers.ml4m.folder import WEIGHTS as ML4M_WEIGHTS
from fourm_kfp.tokenizers.ml4m.folder import TokenizerFolderError, read_folder
from fourm_kfp.tokenizers.modality_codecs import MAX_FIT_IMAGES, fit_normalisation, get_codec
from fourm_kfp.tokenizers.parallel_training import train_image_tokenizers
from fourm_kfp.tokenizers.saved_tokenizer import save_image_tokenizer
from fourm_kfp.tokenizers.text_tokenizer import (mean_tokens_per_text, read_text_tokenizer, save_text_tokenizer,
                                                 special_token_ids, train_text_tokenizer, unknown_token_rate)
from fourm_kfp.tokenizers.tokenizer_report import report_markdown
from fourm_kfp.tokenizers.training import Checkpointing, evaluate_tokenizer, train_vqvae
from fourm_kfp.tokenizers.vqvae import VQVAEConfig
from fourm_kfp.train.checkpoint import CheckpointManager, load_checkpoint, set_rng_state

log = logging.getLogger(__name__)
#: Val images for the report when max_val_images is 0 (the report needs a bounded set).
MAX_VAL_IMAGES = 1024


#: Where each VQ-VAE's checkpoints live in the stage's output: ``checkpoints/<modality>/`` (outside the payload).
CHECKPOINTS = "checkpoints"
#: Checkpoints kept per tokenizer: a restart reads only the newest complete one.
KEEP_CHECKPOINTS = 1


def _bounded(data, split: str, modality: str, limit: int, seed: int | None = None) -> np.ndarray:
    """At most ``limit`` arrays: the first ones in order (``seed=None``), or drawn through the shuffle buffer."""
    shuffle = 0 if seed is None else min(SHUFFLE_BUFFER, 2 * limit)
    arrays = list(modality_arrays(data, split, modality, limit, shuffle_buffer=shuffle, seed=seed or 0))
    if not arrays:
        raise MissingModalityError(f"split {split!r} at {data.uri} has no {modality!r} samples")
    return np.stack(arrays)


def _checkpointing(ctx: StageContext, modality: str) -> Checkpointing | None:
    """How the modality's VQ-VAE checkpoints (``train_tokenizers.checkpoint_every``; None: it does not), past the
    recording store: no manifest lists them."""
    every = ctx.config.train_tokenizers.checkpoint_every
    if not every:
        return None
    manager = CheckpointManager(ctx.output.inner.child(CHECKPOINTS, modality), keep_last=KEEP_CHECKPOINTS)
    return Checkpointing(every, manager.save, manager.latest, load_checkpoint, set_rng_state)


def _train_image_tokenizer(ctx: StageContext, meta: DatasetMeta, modality: str,
                           device: str) -> tuple[Any, dict[str, float], dict]:
    cfg = ctx.config.train_tokenizers
    data = ctx.dataset
    settings = cfg.image_config(modality)
    # the vocabulary's classes, relative depth, a feature map's channels and grid
    codec_settings = get_codec(modality).settings_for(meta, modality)
    reference = _bounded(data, "train", modality, MAX_FIT_IMAGES, cfg.seed)  # normalisation and baseline
    val = _bounded(data, "val", modality, cfg.max_val_images or MAX_VAL_IMAGES)
    side = get_modality(modality).shape(ctx.config.data.image_size, meta.settings(modality))[0]  # a feature map's grid
    config = VQVAEConfig.for_modality(
        modality, codec_settings, image_size=side, patch_size=settings.patch_size,
        architecture=settings.architecture, hidden_dim=settings.hidden_dim, depth=settings.depth,
        heads=settings.heads, codebook_size=settings.codebook_size, code_dim=settings.code_dim,
        ema_decay=settings.ema_decay, beta=settings.beta,
        norm_stats=fit_normalisation(modality, reference, codec_settings))
    batches = ImageBatches(data, modality, settings.batch_size, cfg.seed, cfg.max_train_images or None)
    checkpointing = _checkpointing(ctx, modality)
    resumed = checkpointing.latest() if checkpointing else None
    started = time.monotonic()
    model, records = train_vqvae(config, batches, settings.steps,
                                 lr=settings.lr, warmup_steps=settings.warmup_steps, seed=cfg.seed, device=device,
                                 log_every=max(settings.steps // 10, 1), checkpointing=checkpointing)
    metrics = evaluate_tokenizer(model, val, reference)
    metrics["train_images_seen"] = float(settings.steps * settings.batch_size * distributed.world_size())
    summary = {"grid_size": config.grid_size, "codebook_size": config.codebook_size,
               "final_loss": records[-1]["loss"] if records else None}
    # Wall-clock and this run's history: the stage's metrics (manifest, MLflow) only, never the report or the index
    # (the payload).
    run_metrics = {"train_seconds": time.monotonic() - started,
                   "resumed_from_step": float(resumed.step if resumed else 0)}
    return model, metrics, {"val": val[: cfg.recon_samples], "summary": summary, "run_metrics": run_metrics}


def _where(modality: str) -> str:
    return f"train_tokenizers.from_ml4m.{modality}"


def _ml4m_tokenizer(ctx: StageContext, meta: DatasetMeta, modality: str, device: str) -> tuple[Any, dict, dict]:
    """apple/ml-4m's tokenizer of ``modality`` from its folder (``train_tokenizers.from_ml4m``), evaluated on the
    val images as a trained one is; the extra dict holds its index entry and the folder's digest."""
    cfg = ctx.config.train_tokenizers
    data = ctx.dataset
    uri = cfg.from_ml4m[modality]
    try:
        folder = read_folder(uri)
    except TokenizerFolderError as exc:
        raise TokenizerFolderError(f"{_where(modality)}: {exc}") from None
    settings = get_codec(modality).settings_for(meta, modality)
    if get_modality(modality).codec == "semseg":  # the vocabulary's size, whether or not it is the default
        settings = {"classes": len(meta.vocabulary(modality))}
    side = get_modality(modality).shape(ctx.config.data.image_size, meta.settings(modality))[0]
    config = describe(folder, modality, side, settings, _where(modality))
    model = load_ml4m_tokenizer(folder, config, device=device)
    reference = _bounded(data, "train", modality, MAX_FIT_IMAGES, cfg.seed)  # the baseline
    val = _bounded(data, "val", modality, cfg.max_val_images or MAX_VAL_IMAGES)
    metrics = evaluate_tokenizer(model, val, reference)
    log.info("train-tokenizers: %s is ml-4m's tokenizer at %s (%s, digest %s), not trained", modality, uri,
             config.family, folder.digest[:12])
    summary = index_entry(folder, uri, config)
    return model, metrics, {"val": val[: cfg.recon_samples], "summary": summary, "ml4m_digest": folder.digest}


def _training_samples(cfg: Any, modality: str) -> int:
    """Samples the modality's tokenizer trains on (steps x batch): side by side, the largest start first."""
    settings = cfg.image_config(modality)
    return settings.steps * settings.batch_size


def _reconstruction_grid(models: dict[str, Any], examples: dict[str, np.ndarray]) -> bytes:
    """Rows alternate input / reconstruction of the same val sample; one column per modality."""
    count = min(len(v) for v in examples.values())
    rows, labels = [], []
    for i in range(count):
        rows.append({m: examples[m][i] for m in models})
        rows.append({m: models[m].decode(models[m].encode(examples[m][i : i + 1]))[0] for m in models})
        labels += [f"val {i}: input", "reconstruction"]
    buf = io.BytesIO()
    render_preview_grid(rows, list(models), row_labels=labels).save(buf, format="PNG")
    return buf.getvalue()


def run(ctx: StageContext) -> StageResult:
    cfg = ctx.config.train_tokenizers
    data = ctx.dataset
    device = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
    meta = read_dataset_meta(data)
    present = set(available_modalities(data, "train"))
    image_modalities = [m for m in cfg.image_modalities if m in present]
    missing = sorted(set(cfg.image_modalities) - present)
    if missing:
        log.info("train-tokenizers: the dataset has no %s; no tokenizer for them", missing)

    models, metrics, examples, index_image, run_metrics, sources = {}, {}, {}, {}, {}, []
    from_ml4m = [m for m in image_modalities if m in cfg.from_ml4m]
    trained = train_image_tokenizers(partial(_train_image_tokenizer, ctx, meta),
                                     [m for m in image_modalities if m not in from_ml4m], device,
                                     partial(_training_samples, cfg))
    trained.update({m: _ml4m_tokenizer(ctx, meta, m, device) for m in from_ml4m})
    for modality in image_modalities:
        model, modality_metrics, extra = trained[modality]
        models[modality], examples[modality] = model, extra["val"]
        metrics[modality] = modality_metrics
        index_image[modality] = extra["summary"]
        run_metrics.update({f"{modality}.{k}": v for k, v in extra.get("run_metrics", {}).items()})
        if not ctx.is_primary:
            continue
        if "ml4m_digest" in extra:  # ml-4m's: its folder's files as they are
            sources.append(ExternalSource(f"ml4m_tokenizer.{modality}", cfg.from_ml4m[modality],
                                          extra["ml4m_digest"]))
            _copy_folder(ctx, modality, cfg.from_ml4m[modality], extra["ml4m_digest"])
            continue
        with tempfile.TemporaryDirectory() as tmp:
            folder = save_image_tokenizer(model, Path(tmp) / modality)
            for path in sorted(folder.iterdir()):
                ctx.output.put_file(image_key(modality, path.name), path)

    text_modalities = [m for m in cfg.text_modalities if m in present]
    text_metrics, index_text = {}, None
    if text_modalities and ctx.is_primary:
        if cfg.text_tokenizer_from:  # used as it is
            tok, digest = read_text_tokenizer(cfg.text_tokenizer_from)
            sources.append(ExternalSource("text_tokenizer", cfg.text_tokenizer_from, digest))
        else:
            tok = train_text_tokenizer(iter_texts(data, "train", text_modalities), cfg.text_vocab_size,
                                       cfg.num_sentinels, class_names=meta.text_class_names)
        val_captions = list(iter_texts(data, "val", text_modalities[:1], limit=cfg.max_val_images or None))
        text_metrics = {"unknown_token_rate": unknown_token_rate(tok, val_captions),
                        "mean_tokens_per_text": mean_tokens_per_text(tok, val_captions),
                        "vocab_size": float(tok.get_vocab_size())}
        with tempfile.TemporaryDirectory() as tmp:
            save_text_tokenizer(tok, Path(tmp) / "tokenizer.json")
            ctx.output.put_file(TEXT_FILE, Path(tmp) / "tokenizer.json")
        index_text = {"modalities": text_modalities, "vocab_size": tok.get_vocab_size(),
                      "special_tokens": special_token_ids(tok, cfg.text_tokenizer_from or "the text tokenizer")}

    report = {"image": metrics, "text": text_metrics, "skipped_modalities": missing}
    if from_ml4m:
        report["ml4m"] = {m: {k: index_image[m][k] for k in ("source", "digest", "family")} for m in from_ml4m}
    if ctx.is_primary:
        index = {"image": index_image, "text": index_text, "image_size": ctx.config.data.image_size}
        if meta.custom_vocabularies:  # the defaults are left out: a synthetic dataset's index is as it was
            index[VOCABULARIES] = meta.custom_vocabularies
        ctx.output.put_bytes(INDEX_FILE, json.dumps(index, indent=2, sort_keys=True).encode())
        ctx.write_report("tokenizer_report.json", json.dumps(report, indent=2, sort_keys=True).encode())
        ctx.write_report("tokenizer_report.md", report_markdown(report).encode())
        if models:
            ctx.write_report("reconstructions.png", _reconstruction_grid(models, examples))

    flat = {f"{m}.{k}": v for m, values in metrics.items() for k, v in values.items()}
    flat.update({f"text.{k}": v for k, v in text_metrics.items()}, **run_metrics)
    counts = {"image_tokenizers": sorted(models), "text_tokenizer": index_text is not None}
    return StageResult(counts=counts, metrics=flat, sources=sources, nondeterminism=training_nondeterminism(device))


def _copy_folder(ctx: StageContext, modality: str, uri: str, digest: str) -> None:
    """The ml-4m folder's two files into the bundle, as they are; they must still be what was read (``digest``)."""
    source = open_store(uri.rstrip("/"))
    with tempfile.TemporaryDirectory(prefix="fourm-ml4m-copy-") as tmp:
        for name in (ML4M_CONFIG, ML4M_WEIGHTS):
            source.get_file(name, Path(tmp) / name)
        if folder_digest(tmp) != digest:
            raise TokenizerFolderError(f"{_where(modality)}: {uri} changed while the stage read it")
        for name in (ML4M_CONFIG, ML4M_WEIGHTS):
            ctx.output.put_file(image_key(modality, name), Path(tmp) / name)


def source_fingerprint(config: Any) -> str | None:
    """What the address covers of the tokenizers read from outside beyond their URIs: the digest of
    ``train_tokenizers.text_tokenizer_from``'s file and of each ``from_ml4m`` folder (a missing or unusable file
    fails here, naming the setting, before anything runs); None when every tokenizer is trained. With no ml-4m
    folder it is the text tokenizer's digest alone, as before ``from_ml4m`` existed."""
    cfg = config.train_tokenizers
    text = read_text_tokenizer(cfg.text_tokenizer_from)[1] if cfg.text_tokenizer_from else None
    if not cfg.from_ml4m:
        return text
    folders = {}
    for modality, uri in sorted(cfg.from_ml4m.items()):
        try:
            folders[modality] = folder_digest(uri)
        except TokenizerFolderError as exc:
            raise TokenizerFolderError(f"{_where(modality)}: {exc}") from None
    return json.dumps({"text_tokenizer": text, "ml4m": folders}, sort_keys=True)

