"""The pipeline's stages: this table says what the runner needs to know of each (name, the config it reads,
its upstream stages, its code version), and ``stages/<name>.py`` holds its body, top to bottom: read the committed
inputs, compute, write the output and its reports.

A body module is imported when its stage first runs (:func:`_body`), so reading the table (the CLI, the planner, the
pipeline compiler) imports neither torch nor the data libraries. Each stage is a pure function of (config, inputs)
writing one content-addressed output; bump ``code_version`` when a stage's code changes what it writes. A stage
may be off under a config (``enabled``: the label stage without labelers), and then it is out of every address.

Adding a stage is its body (``stages/<name>.py``), its config section (a dataclass in
:data:`fourm_kfp.config.fourm_config.SECTIONS` and its field in ``FourMConfig``), its KFP component, one entry here
(with its place in :data:`PIPELINE`, and in :data:`DATASET` when its output is a layer of the dataset; its pod's CPU
and memory, and its job launcher if it can run as a cluster job) and its line in the pipeline (its task and its
``<stage>_force`` parameter): the CLI, the planner, the run follower, the pods' placement, the job parameters and the
downstream stages' inputs read this table.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from fourm_kfp.contract.spec import StageSpec


def _body(module: str, function: str = "run") -> Callable[..., Any]:
    """``fourm_kfp.stages.<module>.<function>``, imported on its first call."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(f"{__name__}.{module}"), function)(*args, **kwargs)

    call.__qualname__ = call.__name__ = f"{module}.{function}"
    return call


def _labelers_configured(config: Any) -> bool:
    return bool(config.label.labelers)


def _prepare_data_view(config: Any) -> dict[str, Any]:
    """What prepare-data's address covers of ``data.modalities``: those its source writes (its record's
    ``modalities``, :data:`fourm_kfp.data.sources.SOURCES`), in their order, so that adding a labelled modality to
    the data config does not move it. Beside the ``prepare_data`` section, also how the source processes what it
    reads where the config does not say (its record's ``processing``: a photo source crops as ml-4m crops); a
    source without any (the synthetic scenes) has the section as it is."""
    from fourm_kfp.data.sources import source_of

    source = source_of(config.prepare_data.source)
    view: dict[str, Any] = {"data.modalities": [m for m in config.data.modalities if m in source.modalities]}
    if source.processing:
        from fourm_kfp.config.schema import versioned_dict

        view["prepare_data"] = {**versioned_dict(config.prepare_data), **source.processing}
    return view


def _pretokenize_view(config: Any) -> dict[str, Any]:
    """What pretokenize's address covers of ``pretokenize``: the section, and with an ml-4m rgb tokenizer
    (``train_tokenizers.from_ml4m.rgb``) that its rgb crops are resized bicubically, as ml-4m's ``save_vq_tokens.py``
    does (other configs: the section as it is, their addresses unmoved)."""
    if "rgb" not in (config.train_tokenizers.from_ml4m or {}):
        return {}
    from fourm_kfp.config.schema import versioned_dict

    return {"pretokenize": {**versioned_dict(config.pretokenize), "camera_resample": "bicubic"}}


PREPARE_DATA = StageSpec(
    name="prepare-data",
    step_resources=("8", "16Gi"),
    dataset_layer=True,
    run=_body("prepare_data"),
    config_keys=("data.image_size", "data.modalities", "prepare_data"),
    source_fingerprint=_body("prepare_data", "source_fingerprint"),
    run_part=_body("prepare_data", "run_part"),
    narrow_config=_prepare_data_view,
    resumable=True,  # a fan-out worker skips the output shards already committed
    # 2: closer camera in the synthetic scenes (objects ~12% of pixels, was ~6%); 3: per-shard key index
    code_version=3,
)
LABEL = StageSpec(
    name="label",
    step_resources=("8", "32Gi"),
    run=_body("label"),
    run_part=_body("label", "run_part"),
    resumable=True,  # a fan-out worker skips the output shards already committed
    config_keys=("data.image_size", "data.modalities", "label"),
    upstream=(PREPARE_DATA,),
    source_fingerprint=_body("label", "labelers_fingerprint"),  # each labeler's version and weights digest
    enabled=_labelers_configured,
    off_when="label.labelers is empty",
    dataset_layer=True,
    wants_accelerator=_body("label", "wants_accelerator"),  # a teacher network: GPU pods for the workers
    # 2: label_preview.png's metadata column reads as fields in their units (a bin as the raw values it holds), not
    #    as bin ids; the shards are the same bytes
    code_version=2,
)
#: The stages whose outputs make up the dataset, lowest layer first: a later stage reads them as one
#: (``StageContext.dataset``), so a new layer is one entry here.
DATASET: tuple[StageSpec, ...] = (PREPARE_DATA, LABEL)

TRAIN_TOKENIZERS = StageSpec(
    name="train-tokenizers",
    step_resources=("8", "32Gi"),
    job_launcher="in-pod",  # a multi-node job when told (its ViT VQ-VAEs at 4m-b take days on one GPU)
    run=_body("train_tokenizers"),
    config_keys=("data.image_size", "train_tokenizers"),
    source_fingerprint=_body("train_tokenizers", "source_fingerprint"),  # text_tokenizer_from, from_ml4m
    upstream=DATASET,
    resumable=True,  # a restarted run keeps each VQ-VAE's checkpoints and continues from the newest complete ones
    code_version=7,  # 2: reproducible bytes (deterministic WordPiece, no timings or absolute URIs)
    # 3: the conv VQ-VAE's encoder is patch-local (a token is a function of its own patch)
    # 4: the report's usage target is a collapse check (>= 10%), not >= 50%
    # 5: subnormal floats flushed to zero on the thread that trains on the CPU
    # 6: ... and on all of torch's OpenMP worker threads (hardware.flush_denormals): a rounding-level change
    # 7: on a multi-core CPU the image tokenizers train side by side, the cores split among them (rounding-level)
)
PRETOKENIZE = StageSpec(
    name="pretokenize",
    step_resources=("8", "16Gi"),
    run=_body("pretokenize"),
    run_part=_body("pretokenize", "run_part"),
    resumable=True,
    config_keys=("data.image_size", "pretokenize"),
    narrow_config=_pretokenize_view,
    upstream=(*DATASET, TRAIN_TOKENIZERS),
    code_version=2,  # 2: reproducible bytes (no timings or absolute URIs in the index and the report)
)
PRETRAIN = StageSpec(
    name="pretrain",
    step_resources=("16", "64Gi"),
    job_launcher="pytorchjob",  # a multi-node PyTorchJob unless told otherwise
    run=_body("pretrain"),
    config_keys=("train", "data", "alphas"),
    source_fingerprint=_body("pretrain", "init_fingerprint"),  # what train.init_from holds
    upstream=(PRETOKENIZE, TRAIN_TOKENIZERS),
    resumable=True,  # a restarted run keeps its checkpoints and continues from the newest complete one
    # 2: reproducible bytes (no timings, store-relative URIs, DCP metadata without save ids);
    # 3: fused AdamW on the CPU too (the same update up to rounding, so not the same bytes as version 2);
    # 4: in-place token-table gradients in one CPU process (autograd's values summed in another order)
    # 5: gradient clipping inside the fused AdamW (its grad_scale divides; clip_grad_norm_ multiplied)
    # 6: the decoder's context is the projected encoder output plus the inputs' position and modality embeddings
    # 7: the encoder table has one placeholder row for a pixel-input modality, not its vocabulary; the head and its
    # cross-entropy in one function (the same values up to rounding); no encoder mask when every slot is valid
    # 8: attention in training on the CPU as explicit batched matmuls where faster than the fused kernel (the same
    # values up to rounding; layers.attention)
    # 9: the placeholder row of a pixel-input modality starts at zero; the model also in ml-4m's format (ml4m/) when
    # ml-4m can hold it; train.init_from maps modality by modality and reports what it took
    # 10: a checkpoint's train_state.json also holds the metric and validation history up to its step, so a run
    # killed and resumed commits the bytes of an uninterrupted one (its metrics, report and curves were partial)
    code_version=10,
)
#: The evaluate stage's gate decision, in its output and its MLflow run: where ``fourm-kfp submit --wait``, the local
#: run and the evaluate component read the verdict.
GATE_FILE = "gate.json"

EVALUATE = StageSpec(
    name="evaluate",
    step_resources=("8", "32Gi"),
    run=_body("evaluate"),
    # train and alphas: the masked-modeling loss uses the training budgets and masking, as pretrain's validation
    config_keys=("evaluate", "data", "train", "alphas"),
    upstream=(PRETRAIN, PRETOKENIZE, TRAIN_TOKENIZERS, *DATASET),
    code_version=7,  # 2: claims with confidence (bootstrap intervals), reproducible bytes (gate in run records)
    # 3: a generated rgb read as pixels takes its kept tokens back between steps; text targets take text_sampling
    # 4: bf16 autocast on CPUs with bf16 arithmetic too (as pretrain's precision auto), not only on CUDA
    # 5: caption-to-rgb's shape F1 with its precision and recall
    # 6: caption-to-rgb's baseline is the best constant set of shapes (naming every shape), not the most common one
    #    and its ceiling the true image's rgb tokens read back by the model (not the true semseg tokens)
    # 7: the report states its decode budget (images decoded per modality, decoder passes per image)
    # the gate's decision depends on the registry, not on the inputs: outside the reproducible payload
    run_records=(GATE_FILE, "reports/model_gate.md"),
)

#: The pipeline, in order; every stage's upstream stages come before it.
PIPELINE: tuple[StageSpec, ...] = (PREPARE_DATA, LABEL, TRAIN_TOKENIZERS, PRETOKENIZE, PRETRAIN, EVALUATE)
STAGES: dict[str, StageSpec] = {spec.name: spec for spec in PIPELINE}


def get_stage(name: str) -> StageSpec:
    try:
        return STAGES[name]
    except KeyError:
        raise KeyError(f"unknown stage {name!r}; stages: {', '.join(STAGES)}") from None
