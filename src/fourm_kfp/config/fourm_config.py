"""The configs of fourm-kfp: the three linked training configs (main, data, alphas) and one config per stage.

On disk a config set is a folder (a preset under ``fourm_kfp/configs/<preset>/`` or a user's own) holding:

* ``train.yaml`` — the main training config (model, token budgets, optimizer, schedule, steps, logging,
  checkpointing); its ``data:`` key names the data config file;
* ``data.yaml`` — what the dataset is (image size, modalities, input and target modalities); its ``alphas:`` key
  names the alphas config file;
* ``alphas.yaml`` — the Dirichlet mixture that splits token budgets across modalities;
* ``prepare_data.yaml`` — how the ``prepare-data`` stage makes the dataset;
* ``train_tokenizers.yaml`` — the tokenizers the ``train-tokenizers`` stage trains;
* ``label.yaml`` — the labelers of the ``label`` stage and its data gate (a preset without one has no labelers);
* ``pretokenize.yaml`` — how the ``pretokenize`` stage turns every sample into tokens (crops, batching);
* ``evaluate.yaml`` — what the ``evaluate`` stage scores, and the model gate.

Each stage section's file is ``<section>.yaml``; a folder that lacks one gets that section's defaults (the linked
``train``/``data``/``alphas`` files are always required).

Each file's top-level mapping is one *section* of :class:`FourMConfig`; dotted overrides address a section first
(``data.image_size=96``, ``train.model.dim=256``). Every field documents itself (``fourm-kfp config --describe``).

Over 400 lines and one concern: the schema of the whole config, one dataclass per section, each field with its
description and default; a section split off would be a module of a few dataclasses that every loader still has to
assemble here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from fourm_kfp.config.schema import option
from fourm_kfp.data.modalities import MODALITIES
from fourm_kfp.data.sources import SOURCES, source_of

ALL_MODALITIES = tuple(MODALITIES)
#: train-tokenizers' defaults: a VQ-VAE for every image modality of the table, in its order
VQVAE_MODALITIES = tuple(name for name, m in MODALITIES.items() if m.tokenizer == "vqvae")
#: ... and one WordPiece tokenizer over every text modality, caption first (its val unknown-token rate is reported)
WORDPIECE_MODALITIES = tuple(sorted((name for name, m in MODALITIES.items() if m.tokenizer == "wordpiece"),
                                    key=lambda name: name != "caption"))


def _check_modalities(names: tuple[str, ...], field: str) -> None:
    unknown = [m for m in names if m not in MODALITIES]
    if unknown:
        raise ValueError(f"{field}: unknown modalities {unknown}; known: {list(MODALITIES)}")


@dataclass(frozen=True)
class ModelConfig:
    """Transformer encoder-decoder sizes (reference: tiny 6+6/384/6, B 12+12/768/12, L 24+24/1024/16)."""

    encoder_layers: int = option(6, "encoder blocks", min=1)
    decoder_layers: int = option(6, "decoder blocks", min=1)
    dim: int = option(384, "model width", min=8)
    heads: int = option(6, "attention heads (dim must divide evenly)", min=1)
    rgb_input: Literal["tokens", "pixels"] = option("tokens", "rgb enters the encoder as VQ tokens or pixel patches")
    tie_embeddings: bool = option(True, "tie each decoder output head to its decoder token embedding")
    max_text_length: int = option(64, "longest caption/det token sequence (input or target); longer is cut",
                                  min=8)
    position_temperature: float = option(10000.0, "longest wavelength of the fixed sin-cos positions (ml-4m: "
                                                  "10000); at a small width most of 10000's frequencies do not vary "
                                                  "over a 16-cell grid", min=2.0)
    # ml-4m's layout (a model imported from or exported to apple/ml-4m's format): off, the model is as it always was
    context_bias: bool = option(False, "a bias on the decoder's context projection, as ml-4m's models have",
                                omit_at_default=True)
    pixel_modality_embed: bool = option(False, "rgb pixel patches get a modality embedding of their own, apart from "
                                               "rgb tokens', as ml-4m's rgb@224 and tok_rgb@224", omit_at_default=True)
    pixel_normalisation: Literal["symmetric", "imagenet"] = option(
        "symmetric", "rgb_input pixels: uint8 to [-1, 1] (symmetric), or ImageNet's channel mean and std as ml-4m",
        omit_at_default=True)
    text_conventions: Literal["fourm-kfp", "ml4m"] = option(
        "fourm-kfp", "how texts are span-masked: bare ids and sentinels from [S_0], or ml-4m's: [EOS] appended to "
                     "each text and sentinels from [S_1]", omit_at_default=True)

    def __post_init__(self) -> None:
        if self.dim % self.heads:
            raise ValueError(f"model.dim={self.dim} is not divisible by model.heads={self.heads}")
        pixel_only = [f for f, on in (("pixel_normalisation", self.pixel_normalisation != "symmetric"),
                                      ("pixel_modality_embed", self.pixel_modality_embed)) if on]
        if pixel_only and self.rgb_input != "pixels":
            raise ValueError(f"model.{pixel_only[0]} applies to rgb read as pixel patches (model.rgb_input: pixels); "
                             f"rgb_input is {self.rgb_input!r}")


@dataclass(frozen=True)
class OptimizerConfig:
    """AdamW with linear warmup then cosine decay; lr = base_lr * global_batch_size / 256."""

    base_lr: float = option(1e-4, "learning rate per 256 samples of global batch", min=0.0)
    betas: tuple[float, ...] = option((0.9, 0.95), "AdamW betas", min=0.0, max=1.0)
    weight_decay: float = option(0.05, "AdamW weight decay (none on norms and biases)", min=0.0)
    decay_embeddings: bool = option(False, "apply weight decay to embeddings too")
    warmup_steps: int = option(0, "linear warmup steps", min=0)
    min_lr_ratio: float = option(0.0, "final lr as a fraction of the peak", min=0.0, max=1.0)
    grad_clip: float = option(1.0, "max gradient norm (0 disables clipping)", min=0.0)

    def __post_init__(self) -> None:
        if len(self.betas) != 2:
            raise ValueError(f"optimizer.betas must have two values, got {list(self.betas)}")


@dataclass(frozen=True)
class TrainConfig:
    """The main training config: model, masking budgets, optimizer and schedule, parallelism, logging,
    validation and checkpoints. The schedule's length comes from ``steps``, ``epochs`` or ``tokens`` (one)."""

    data: str = option("data.yaml", "data config file, relative to this file", versioned=False)
    model: ModelConfig = option(ModelConfig(), "model sizes")
    input_budget: int = option(128, "input tokens per sample, split across modalities", min=1)
    target_budget: int = option(128, "target tokens per sample, split across modalities", min=1)
    loss_weighting: Literal["modality", "token"] = option(
        "modality", "mean of per-modality losses (4M) or mean over all target tokens")
    label_smoothing: float = option(0.0, "cross-entropy label smoothing", min=0.0, max=0.5)
    span_mean_length: float = option(3.0, "text span masking: mean span length in tokens", min=1.0)
    fill_budgets: bool = option(True, "what text cannot use of its share (a short caption, the sentinels' overhead) "
                                      "goes to image modalities, so every sample fills its budgets; false: it is "
                                      "left empty, as in ml-4m, and a text-heavy draw keeps the text nearly alone "
                                      "among the inputs (what teaches generating from a caption)")
    optimizer: OptimizerConfig = option(OptimizerConfig(), "optimizer and schedule")
    steps: int = option(0, "optimizer steps (0: from epochs or tokens)", min=0)
    epochs: float = option(0.0, "passes over the train split (0: from steps or tokens)", min=0.0)
    tokens: int = option(0, "input + target tokens to train on (0: from steps or epochs)", min=0)
    global_batch_size: int = option(256, "samples per optimizer step over all ranks", min=1)
    micro_batch_size: int = option(0, "samples per forward pass per rank (0: global batch / world size; "
                                   "smaller means gradient accumulation)", versioned=False, min=0)
    precision: Literal["auto", "bf16", "fp32"] = option(
        "auto", "auto: bf16 autocast on GPUs and CPUs with native bf16, fp32 elsewhere", versioned=False)
    parallelism: Literal["ddp", "fsdp"] = option("ddp", "data parallel: DDP (small models) or FSDP2 (large)",
                                                 versioned=False)
    activation_checkpointing: bool = option(False, "recompute block activations in backward", versioned=False)
    compile: bool = option(False, "torch.compile each block", versioned=False)
    seed: int = option(0, "training seed (init, masking, data order)")
    nonfinite: Literal["skip", "fail"] = option("skip", "a non-finite loss or gradient: skip the step, or fail")
    max_skipped_steps: int = option(10, "fail when more steps than this were skipped as non-finite", min=0)
    log_every: int = option(10, "steps between metric lines", versioned=False, min=1)
    val_every: int = option(0, "steps between validations (0: only at the start and the end)", versioned=False,
                            min=0)
    val_batches: int = option(4, "validation batches (fixed seed and budgets)", versioned=False, min=1)
    checkpoint_every: int = option(500, "steps between checkpoints", versioned=False, min=1)
    keep_last: int = option(2, "checkpoints kept besides the permanent ones", versioned=False, min=1)
    snapshot_every: int = option(0, "also export the model's weights every this many steps (snapshots/, scored by "
                                    "the evaluation's scores-against-steps figure; 0: none)", min=0)
    keep_every: int = option(0, "keep every checkpoint whose step is a multiple of this (0: none)",
                             versioned=False, min=0)
    loader_workers: int = option(-1, "data loader worker processes per rank (-1: on a GPU the CPUs per local rank "
                                 "less one, at most 14; on the CPU 1)", versioned=False, min=-1)
    profile_steps: int = option(0, "profile this many early steps on rank 0 (0: off)", versioned=False, min=0)
    resume_from: str = option("", "start from this checkpoint URI (model, optimizer, schedule, loader): a cool-down")
    init_from: str = option("", "load only model weights from a pretrain output, a checkpoint or an ml-4m folder or "
                                ".safetensors URI, mapped modality by modality (fine-tuning)")

    def __post_init__(self) -> None:
        given = [name for name in ("steps", "epochs", "tokens") if getattr(self, name)]
        if len(given) != 1:
            raise ValueError(f"give exactly one of steps, epochs, tokens for the schedule's length, got "
                             f"{given or 'none'}")
        if self.resume_from and self.init_from:
            raise ValueError("resume_from and init_from exclude each other")


@dataclass(frozen=True)
class DataConfig:
    """What the dataset is: image size and modalities."""

    alphas: str = option("alphas.yaml", "alphas config file, relative to this file", versioned=False)
    image_size: int = option(64, "side of every image modality in pixels", min=16, max=1024)
    modalities: tuple[str, ...] = option(ALL_MODALITIES, "modalities the dataset holds (a source may lack some)")
    input_modalities: tuple[str, ...] = option(ALL_MODALITIES, "modalities the encoder may see")
    target_modalities: tuple[str, ...] = option(ALL_MODALITIES, "modalities the decoder predicts")
    extra_datasets: dict[str, float] = option({}, "other pretokenized datasets (URI: sampling weight) mixed into "
                                              "training beside the pipeline's own", min=0.0)
    weight: float = option(1.0, "sampling weight of the pipeline's own pretokenized dataset", min=0.0)

    def __post_init__(self) -> None:
        for field in ("modalities", "input_modalities", "target_modalities"):
            _check_modalities(getattr(self, field), field)
        extra = sorted(set(self.input_modalities + self.target_modalities) - set(self.modalities))
        if extra:
            raise ValueError(f"input/target modalities {extra} are not in modalities {list(self.modalities)}")


@dataclass(frozen=True)
class DirichletComponent:
    """One Dirichlet of the mixture: concentration per modality for the input and the target budget."""

    name: str = option(doc="component name, e.g. all-to-all")
    weight: float = option(1.0, "mixture weight", min=0.0)
    input_alphas: dict[str, float] = option({}, "input concentration per modality (0 = never an input)", min=0.0)
    target_alphas: dict[str, float] = option({}, "target concentration per modality (0 = never a target)", min=0.0)

    def __post_init__(self) -> None:
        _check_modalities(tuple(self.input_alphas) + tuple(self.target_alphas), f"mixture component {self.name!r}")
        for kind, alphas in (("input_alphas", self.input_alphas), ("target_alphas", self.target_alphas)):
            bad = {m: a for m, a in alphas.items() if a < 0}
            if bad:
                raise ValueError(f"{kind} of {self.name!r} must be >= 0, got {bad}")


@dataclass(frozen=True)
class AlphasConfig:
    """A mixture of Dirichlet distributions over modalities (4M's multimodal masking: a sample's input and target
    token budgets are split across the modalities by a draw from one component of the mixture)."""

    mixture: tuple[DirichletComponent, ...] = option((), "the mixture components")

    def __post_init__(self) -> None:
        if not self.mixture:
            raise ValueError("mixture: at least one component is needed")
        if sum(c.weight for c in self.mixture) <= 0:
            raise ValueError("mixture: the weights must not all be zero")

    def restricted_to(self, inputs: tuple[str, ...], targets: tuple[str, ...]) -> tuple["AlphasConfig", list[str]]:
        """The mixture over the modalities the data holds, and a note per dropped entry.

        A modality outside ``inputs``/``targets`` gets no budget; a component left with no input modality is an
        error; one left with no target modality is dropped (it would teach nothing).
        """
        kept, notes = [], []
        for c in self.mixture:
            inp = {m: a for m, a in c.input_alphas.items() if m in inputs}
            tgt = {m: a for m, a in c.target_alphas.items() if m in targets}
            dropped = sorted((set(c.input_alphas) - set(inp)) | (set(c.target_alphas) - set(tgt)))
            if dropped:
                notes.append(f"component {c.name!r}: no budget for {dropped} (not in the data's modalities)")
            if not any(a > 0 for a in inp.values()):
                raise ValueError(f"alphas component {c.name!r} has no input modality left among "
                                 f"data.input_modalities {list(inputs)}: give it an input alpha or remove it")
            if not any(a > 0 for a in tgt.values()):
                notes.append(f"component {c.name!r} dropped: no target modality left")
                continue
            kept.append(dataclasses.replace(c, input_alphas=inp, target_alphas=tgt))
        if not kept:
            raise ValueError(f"no alphas component has a target among data.target_modalities {list(targets)}")
        return AlphasConfig(tuple(kept)), notes


@dataclass(frozen=True)
class PrepareDataConfig:
    """The prepare-data stage: where samples come from and how they are sharded."""

    source: str = option("synthetic", "where the samples come from: "
                         + ", ".join(f"{name} ({s.description})" for name, s in SOURCES.items()),
                         choices=SOURCES.keys())  # a live view: the sources of the table (fourm_kfp.data.sources)
    source_uri: str = option("", "folder or WebDataset location for real data: a local path, s3://bucket/prefix, or "
                                 "pkg://<python package>/<folder> (a folder inside an installed package)")
    captions_file: str = option("", "image_folder only: JSONL/CSV of file -> caption (else <name>.txt files)")
    include: tuple[str, ...] = option((), "image_folder only: the images whose path (relative to source_uri) "
                                          "matches one of these glob patterns, e.g. ['*.jpg', 'cats/*'] (none: "
                                          "every image)", omit_at_default=True)
    num_train: int = option(1000, "synthetic: train scenes", min=1)
    num_val: int = option(100, "synthetic: val scenes", min=0)
    val_fraction: float = option(0.05, "real data: fraction of samples put in val (by key hash)", min=0.0, max=0.5)
    seed: int = option(0, "synthetic: scene seed")
    samples_per_shard: int = option(1000, "samples per tar shard", min=1)
    max_bad_fraction: float = option(0.05, "fail when more than this fraction of samples is unreadable",
                                     min=0.0, max=1.0)
    min_image_side: int = option(16, "real data: skip images smaller than this", min=1)
    preview_samples: int = option(6, "samples in the preview grid", versioned=False, min=1, max=64)
    workers: int = option(0, "processes rendering/decoding samples (0 = one per core)", versioned=False, min=0)

    def __post_init__(self) -> None:
        if source_of(self.source).external and not self.source_uri:
            raise ValueError(f"source_uri is required when source is {self.source!r}")


@dataclass(frozen=True)
class LabelerEntry:
    """One labeler of the label stage: a registry name, its parameters, and a teacher's weights."""

    name: str = option(doc="labeler name: canny_edge, color_palette, metadata, fourm_model, a transformers teacher "
                           "(hf_depth, hf_semseg, hf_det, hf_caption, hf_normal, normal_from_depth, hf_clip, "
                           "hf_dinov2), or an installed plug-in's (the fourm_kfp.labelers entry-point group)")
    params: dict[str, Any] = option({}, "the labeler's own parameters (an unknown one is an error naming it)")
    weights: str = option("", "a teacher's weights: a file or a model folder (a local path or s3:// URI), "
                              "hf://<repo>@<40-hex commit>, or preset:<name> (that preset's model); its digest is "
                              "part of the label stage's address")
    source: str = option("", "where a local weights folder comes from, hf://<repo>@<40-hex commit>: when the folder "
                             "is missing, the error gives the command that fetches it there", versioned=False)


@dataclass(frozen=True)
class LabelConfig:
    """The label stage: pseudo-labels for the prepared images (4M's teachers), and the data gate before the
    tokenizers. With no labelers the stage is off: it runs nothing and no address moves."""

    labelers: tuple[LabelerEntry, ...] = option((), "labelers run on every prepared image, each making one modality: "
                                                    "a list of {name, params, weights, source} (see LabelerEntry)")
    missing: Literal["drop", "keep"] = option(
        "drop", "a sample lacking one of required_modalities: drop it from every modality, or keep it without that "
                "modality (4M gives an absent modality no tokens); either way the stage fails when more than "
                "max_missing_fraction of the samples lack one")
    required_modalities: tuple[str, ...] = option(
        (), "modalities every sample must have (none: rgb and every labelled modality)")
    max_missing_fraction: float = option(0.05, "the most samples (fraction) the gate may drop or find incomplete "
                                               "before it fails the stage", min=0.0, max=1.0)
    max_invalid_fraction: float = option(0.5, "value check: the most invalid pixels (depth 0, zero normals) a map "
                                              "may have", min=0.0, max=1.0)
    max_depth_m: float = option(1000.0, "value check: the largest metric depth in metres (a relative, standardised "
                                        "depth is checked for finite values only)", min=0.0)
    batch_size: int = option(32, "images per labeler call", versioned=False, min=1)
    preview_samples: int = option(6, "photos in the report's preview grid beside their labels", versioned=False,
                                  min=1, max=64)

    def __post_init__(self) -> None:
        _check_modalities(self.required_modalities, "label.required_modalities")


@dataclass(frozen=True)
class ImageTokenizerConfig:
    """One VQ-VAE: its network, codebook and training schedule."""

    architecture: Literal["conv", "vit"] = option("conv", "conv (small, CPU presets) or vit (ViT-B style, 4m-b)")
    patch_size: int = option(8, "pixels per token side: the token grid is image_size / patch_size", min=1)
    hidden_dim: int = option(64, "conv: channels at token resolution; vit: width", min=8)
    depth: int = option(2, "conv: residual blocks at token resolution; vit: blocks per encoder/decoder", min=1)
    heads: int = option(4, "vit attention heads", min=1)
    codebook_size: int = option(512, "codes in the codebook (the modality's vocabulary)", min=2)
    code_dim: int = option(32, "dimension of the L2-normalised lookup space", min=2)
    ema_decay: float = option(0.99, "EMA decay of the codebook statistics", min=0.0, max=1.0)
    beta: float = option(0.25, "commitment loss weight", min=0.0)
    steps: int = option(300, "optimizer steps", min=1)
    batch_size: int = option(32, "images per step (per process)", min=1)
    lr: float = option(1e-3, "peak learning rate (AdamW, warmup then cosine)", min=0.0)
    warmup_steps: int = option(20, "linear warmup steps", min=0)


@dataclass(frozen=True)
class TrainTokenizersConfig:
    """The train-tokenizers stage: a VQ-VAE per image modality and one WordPiece tokenizer for text."""

    image_modalities: tuple[str, ...] = option(VQVAE_MODALITIES,
                                               "image modalities to tokenize (those the data lacks are skipped)")
    image: ImageTokenizerConfig = option(ImageTokenizerConfig(), "VQ-VAE settings shared by every modality")
    per_modality: dict[str, dict[str, Any]] = option({}, "per-modality overrides of `image`, e.g. {semseg: {steps: 400}}"
                                                     " (over what a modality needs: a feature map's vit, patch 1)")
    max_train_images: int = option(0, "train images per modality (0 = all)", min=0)
    max_val_images: int = option(256, "val images per modality for the report (0 = all)", min=0)
    text_modalities: tuple[str, ...] = option(WORDPIECE_MODALITIES,
                                              "sequence modalities the text tokenizer learns (those the data lacks "
                                              "are skipped)")
    text_vocab_size: int = option(2000, "WordPiece vocabulary size (coordinate tokens come on top)", min=16)
    num_sentinels: int = option(100, "span-masking sentinel tokens [S_0]..[S_n-1]", min=1)
    text_tokenizer_from: str = option("", "a WordPiece tokenizer.json (local path or s3:// URI, e.g. ml-4m's "
                                          "text_tokenizer_4m_wordpiece_30k.json) used as it is instead of training "
                                          "one; text_vocab_size and num_sentinels then do not apply",
                                      omit_at_default=True)
    from_ml4m: dict[str, str] = option({}, "image modalities whose tokenizer is apple/ml-4m's instead of one trained "
                                       "here: {<modality>: <tokenizer folder>} (config.json + model.safetensors, "
                                       "local or s3://, e.g. EPFL-VILAB/4M_tokenizers_semseg_4k_224-448 downloaded); "
                                       "the folder is copied into the bundle, its digest is part of the address",
                                       omit_at_default=True)
    seed: int = option(0, "training seed")
    recon_samples: int = option(6, "samples in the reconstruction grid", versioned=False, min=1, max=32)
    checkpoint_every: int = option(500, "steps between checkpoints of each VQ-VAE being trained, and one at its last "
                                        "step (checkpoints/<modality>/ in the stage's output, the newest kept, outside "
                                        "the payload): a restarted run resumes every tokenizer from its newest and "
                                        "trains a finished one no further, committing the same bytes (0: none)",
                                   versioned=False, min=0)

    def __post_init__(self) -> None:
        from fourm_kfp.data.modalities import IMAGE_MODALITIES, SEQUENCE_MODALITIES

        _check_modalities(self.image_modalities + self.text_modalities, "train_tokenizers")
        wrong = [m for m in self.image_modalities if m not in IMAGE_MODALITIES]
        wrong += [m for m in self.text_modalities if m not in SEQUENCE_MODALITIES]
        if wrong:
            raise ValueError(f"image_modalities must be image modalities and text_modalities sequence ones: {wrong}")
        for modality, folder in self.from_ml4m.items():
            if modality not in self.image_modalities:
                raise ValueError(f"from_ml4m.{modality}: {modality!r} is not one of image_modalities "
                                 f"{list(self.image_modalities)}")
            if not folder.strip():
                raise ValueError(f"from_ml4m.{modality}: an empty folder")
        for modality in self.per_modality:
            self.image_config(modality)  # validate the overrides now, at load time

    def image_config(self, modality: str) -> ImageTokenizerConfig:
        """The shared ``image`` settings, then what the modality's record needs (``tokenizer_defaults``: a feature
        map's ViT over single cells), then ``per_modality[modality]``."""
        from fourm_kfp.config.schema import from_dict, to_dict

        if modality not in self.image_modalities:
            raise ValueError(f"per_modality names {modality!r}, which image_modalities does not list")
        merged = {**to_dict(self.image), **MODALITIES[modality].tokenizer_defaults,
                  **self.per_modality.get(modality, {})}
        return from_dict(ImageTokenizerConfig, merged, f"per_modality.{modality}")


@dataclass(frozen=True)
class PretokenizeConfig:
    """The pretokenize stage: every sample's image modalities to VQ-VAE tokens, over pre-computed aligned crops."""

    n_crops: int = option(4, "aligned crops per sample (crop 0 is the full view)", min=1)
    crop_scale: tuple[float, ...] = option((0.6, 1.0), "random resized crop: area fraction range", min=0.05, max=1.0)
    crop_ratio: tuple[float, ...] = option((0.75, 1.3333), "random resized crop: aspect ratio range", min=0.1,
                                           max=10.0)
    flip_probability: float = option(0.5, "probability that a crop (other than crop 0) is mirrored", min=0.0,
                                     max=1.0)
    seed: int = option(0, "crop seed (crops are drawn per sample key)")
    keep_rgb_pixels: bool = option(True, "also store each crop's rgb pixels (pixel-patch input, evaluation)")
    batch_size: int = option(64, "images per encoder forward pass", versioned=False, min=1)
    decode_workers: int = option(-1, "processes that decode and crop shards beside the encoder (-1: on a GPU the "
                                 "CPUs less one, at most 15, on the CPU none; 0: the reader thread)",
                                 versioned=False, min=-1)
    check_samples: int = option(32, "val samples decoded back by the collect step's check", versioned=False, min=0)
    check_tolerance: float = option(0.1, "collect check: allowed relative deviation from the tokenizer report",
                                    versioned=False, min=0.0)

    def __post_init__(self) -> None:
        for name in ("crop_scale", "crop_ratio"):
            low_high = getattr(self, name)
            if len(low_high) != 2 or low_high[0] > low_high[1]:
                raise ValueError(f"{name} must be [low, high] with low <= high, got {list(low_high)}")


#: The one task that is not ``rgb-to-<m>``: an image generated from the caption, scored through the semseg the
#: model reads off it (:data:`fourm_kfp.evaluation.targets.CHAINED_TASKS`).
CAPTION_TO_RGB = "caption-to-rgb"


def evaluation_tasks(modalities: dict[str, Any] = MODALITIES) -> tuple[str, ...]:
    """Cross-modal tasks the evaluate stage knows (``<source>-to-<target>``; see :mod:`fourm_kfp.evaluation.tasks`):
    ``rgb-to-<m>`` for every modality with a ``scoring`` in the modality table, and :data:`CAPTION_TO_RGB` (scored
    through the semseg the model reads off its own image)."""
    return tuple(f"rgb-to-{name}" for name, m in modalities.items() if m.scoring) + (CAPTION_TO_RGB,)


#: The tasks of the modality table (the evaluate section's default and choices).
EVALUATION_TASKS = evaluation_tasks()


@dataclass(frozen=True)
class SamplingConfig:
    """How the evaluate stage generates (the fields of :class:`fourm_kfp.model.generation.SamplingArgs`)."""

    steps: int = option(8, "image targets: MaskGIT/ROAR steps", min=1)
    order: str = option("maskgit", "image targets: keep the most confident tokens (maskgit) or random ones (roar)",
                        choices=("maskgit", "roar"))
    schedule: str = option("cosine", "image targets: tokens fixed per step", choices=("cosine", "linear"))
    temperature: float = option(0.0, "sampling temperature (0 = most likely token)", min=0.0)
    top_k: int = option(0, "sample among the k most likely tokens (0 = all)", min=0)
    top_p: float = option(1.0, "nucleus sampling mass", min=0.0, max=1.0)
    guidance: float = option(1.0, "classifier-free guidance scale (1 = off)", min=0.0)


@dataclass(frozen=True)
class GateConfig:
    """The model gate: register the evaluated model, and promote it to ``champion`` when it beats the current one.

    Not versioned: changing the gate does not re-evaluate a model (a rerun with the same model skips the stage)."""

    model_name: str = option("fourm-4m", "registered model name in the MLflow model registry", versioned=False)
    metric: str = option("val.loss", "primary metric of the evaluation (a key of evaluation.json's metrics)",
                         versioned=False)
    higher_is_better: bool = option(False, "direction of the primary metric", versioned=False)
    margin: float = option(0.01, "relative improvement over the champion needed to promote", versioned=False,
                           min=0.0)


@dataclass(frozen=True)
class EvaluateConfig:
    """The evaluate stage: masked-modeling loss, cross-modal generation against ground truth, report, gate."""

    tasks: tuple[str, ...] = option(EVALUATION_TASKS, "cross-modal tasks (those the data and model allow run)",
                                    choices=EVALUATION_TASKS)
    num_samples: int = option(64, "val scenes per cross-modal task", min=1)
    batch_size: int = option(32, "samples generated together", versioned=False, min=1)
    masked_batches: int = option(8, "val batches for the masked-modeling loss (budgets and seed of train)", min=1)
    baseline_samples: int = option(512, "train samples the trivial baselines are fitted on", min=1)
    grid_samples: int = option(6, "samples shown per task in the report's grids", versioned=False, min=1)
    seed: int = option(0, "generation seed")
    curve_samples: int = option(0, "val scenes on which every weight snapshot of the model (train.snapshot_every) "
                                   "and the final model are scored: the scores-against-steps figure (0: none)", min=0)
    sampling: SamplingConfig = option(SamplingConfig(), "generation of an image from text (caption-to-rgb's image)")
    map_steps: int = option(1, "MaskGIT steps for the maps read off an image (rgb-to-depth, -normal, -semseg, and "
                               "caption-to-rgb's reading of its own image), most likely tokens first at temperature "
                               "0: 1 is a single pass over the whole grid, which ml-4m's generation guide finds "
                               "enough for RGB->normal, where caption->RGB needs several", min=1)
    text_sampling: SamplingConfig = option(SamplingConfig(), "generation of text targets (rgb-to-caption, rgb-to-det): "
                                           "temperature, top-k/p, guidance (steps, order and schedule do not apply)")
    gate: GateConfig = option(GateConfig(), "the model gate")


#: Config sections in load order (train links data, data links alphas): name -> dataclass.
SECTIONS: dict[str, type] = {
    "train": TrainConfig,
    "data": DataConfig,
    "alphas": AlphasConfig,
    "prepare_data": PrepareDataConfig,
    "label": LabelConfig,
    "train_tokenizers": TrainTokenizersConfig,
    "pretokenize": PretokenizeConfig,
    "evaluate": EvaluateConfig,
}


@dataclass(frozen=True)
class FourMConfig:
    """Everything a pipeline run needs, resolved: the preset it came from and one typed section per file."""

    preset: str
    train: TrainConfig
    data: DataConfig
    alphas: AlphasConfig
    prepare_data: PrepareDataConfig
    label: LabelConfig
    train_tokenizers: TrainTokenizersConfig
    pretokenize: PretokenizeConfig
    evaluate: EvaluateConfig

    def __post_init__(self) -> None:
        for component in self.alphas.mixture:
            for kind, allowed in (("input_alphas", self.data.input_modalities),
                                  ("target_alphas", self.data.target_modalities)):
                extra = sorted(set(getattr(component, kind)) - set(allowed))
                if extra:
                    raise ValueError(f"alphas component {component.name!r}: {kind} names {extra}, "
                                     f"which data.{kind.split('_')[0]}_modalities does not list")
