"""Our train step against the reference implementation (apple/ml-4m) at the reference's own configuration, printing
JSON (issue 16, target 1).

Both models are built in one process at ml-4m's ``fm_tiny_6e_6d_swiglu_nobias`` / ``fm_base_12e_12d_swiglu_nobias``
settings with the modalities of its 4M pre-training: rgb at 224 px entering the encoder as 16-px pixel patches
(ml-4m ``rgb@224``, ``ImageEncoderEmbedding``) and predicted as 14x14 tokens of a 16384 vocabulary
(``tok_rgb@224``), depth 14x14 tokens of 8192 (``tok_depth@224``, input and target), caption 30000-token WordPiece
of at most 256 tokens (``caption``, input and target). 128 input + 128 target tokens per sample, batch 8, AdamW,
2 threads, in fp32 (``--precision fp32``, the default) or in bf16 (``--precision bf16``: the reference's own default,
``run_training_4m.py --dtype bfloat16``, whose forward runs under ``torch.cuda.amp.autocast``; on the CPU, where that
autocast does nothing, the bench puts the same forward under the CPU's ``torch.autocast``; ours runs as the pretrain
stage does with ``precision: bf16``, or ``auto`` on a CPU with bf16 arithmetic).

One batch is masked once by our masking (:func:`fourm_kfp.masking.multimodal_masking.mask_sample`) and the same
samples (the same tokens, positions, pixels and per-modality budgets) are written in the reference's input format,
the per-modality ``tensor`` / ``input_mask`` / ``target_mask`` / ``decoder_attention_mask`` of
``fourm/data/masking.py``'s ``UnifiedMasking`` (a caption target of ``n`` decoder tokens is ``n + 1`` ids, as the
reference's decoder shifts it), so both steps see exactly the same number of valid input and target tokens.

The reference's step is what its training loop (``run_training_4m.py``) does: ``loss, _ =
model(mod_dict, num_encoder_tokens, num_decoder_tokens, loss_type="mod")`` (under autocast in bf16), backward,
gradient clipping, the AdamW of its ``create_optimizer`` (its parameter groups, torch's default AdamW
implementation). Ours is
the model as the pretrain stage builds it for one process (:func:`fourm_kfp.model.parallelize.parallelize`) and
:func:`fourm_kfp.train.step.train_step` with :func:`fourm_kfp.train.optimizer.build_optimizer` (product defaults).

The reference is imported from ``--reference PATH`` / ``$FOURM_REFERENCE`` (default ``/tmp/ml-4m`` when present),
never vendored; without it the JSON says so and only our step is timed. Its package ``__init__`` files pull in the
whole data pipeline (torchvision, OpenCV, albumentations, boto3, webdataset, ...), none of which the model needs, so
the bench loads ``fourm.models.fm`` and its real submodules (``fm_utils``, ``encoder_embeddings``,
``decoder_embeddings``, ``utils.timm.registry``, ``utils.optim_factory``) without running those ``__init__`` files;
``fm.py``'s module-level ``from fourm.data.modality_info import MODALITY_INFO`` (unused by the ``FourM`` class, which
takes ``modality_info`` as an argument) gets an empty dict, and ``fm.py``'s ``random.sample(dict.items(), n)`` (a
``TypeError`` since Python 3.11) gets 3.10's behaviour. The model code timed is the reference's, unchanged.

Timing: warm-up steps for both, then ``--rounds`` rounds alternating ours and the reference's (``--steps`` steps
each); best and median seconds per step and tokens/s (tokens = (input + target) x batch), and ours/reference; the
machine's fp32 matmul rate before and after (``machine_before``/``machine_after``), since 2-core machines differ.

What bounds the ratio at equal arithmetic: before timing, one step of each runs under torch's FLOP counter
(``matmul_gflop_per_step``: every matrix product, batched product and fused attention kernel, forward and
backward; equal for both at tiny, ours 0.5% more at base in fp32, where the fused kernel's backward computes the
scores again). ``matmul_floor_s`` is that count at the machine's square-matmul rate of the run's precision
(``machine_before``), the time of a step that did nothing but its products at that rate, and
``ratio_ceiling_at_equal_flops`` the reference's median step over our floor: the most any implementation with our
products could reach against this reference on this machine (an optimistic bound: the step's thinner products
run below the square-matmul rate, and everything else takes time).
Both steps run in one process, so both get the allocator setting our stage runner makes
(:func:`fourm_kfp.allocator.reuse_freed_memory`, ``--allocator reuse``, the default) or neither
(``--allocator default``).

    python bench/reference_compare.py [--configs tiny,base] [--rounds 5] [--steps 3] [--reference PATH]
                                      [--precision fp32|bf16] [--allocator reuse|default] [--output f.json]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from torch.utils import flop_counter

from fourm_kfp.batch import ModalitySpec
from fourm_kfp.config.fourm_config import OptimizerConfig
from fourm_kfp.allocator import reuse_freed_memory
from fourm_kfp.hardware import cpu_has_native_bf16, cpu_matmul_rate, resolve_precision
from fourm_kfp.masking.dirichlet_masking import MixtureComponent
from fourm_kfp.masking.multimodal_masking import MaskingArgs, collate, mask_sample
from fourm_kfp.model.fourm import FourM, FourMArgs
from fourm_kfp.model.parallelize import parallelize
from fourm_kfp.train.optimizer import build_optimizer
from fourm_kfp.train.step import StepSettings, autocast, train_step

from bench_output import emit
from ml4m_reference import load_reference, ml4m_batch

#: ml-4m model config name, (encoder layers, decoder layers, width, heads)
CONFIGS = {"tiny": ("fm_tiny_6e_6d_swiglu_nobias", (6, 6, 384, 6)),
           "base": ("fm_base_12e_12d_swiglu_nobias", (12, 12, 768, 12))}
IMAGE_SIZE, PATCH, GRID = 224, 16, 14
RGB_VOCAB, DEPTH_VOCAB, TEXT_VOCAB, TEXT_MAX = 16384, 8192, 30000, 256
INPUT_TOKENS, TARGET_TOKENS, BATCH = 128, 128, 8
CAPTION_LENGTH = (20, 60)  # caption ids per sample (uniform), well under TEXT_MAX
SENTINELS = tuple(range(4, 104))
LR, GRAD_CLIP = 1e-4, 1.0
#: our modality index -> the reference's encoder / decoder modality names
REF_NAMES = {"rgb": ("rgb@224", "tok_rgb@224"), "depth": ("tok_depth@224", "tok_depth@224"),
             "caption": ("caption", "caption")}


# -- our side ---------------------------------------------------------------------------------------------------------

def our_specs() -> tuple[ModalitySpec, ...]:
    return (ModalitySpec("rgb", "image", RGB_VOCAB, grid=(GRID, GRID), pixel_input=True, patch_size=PATCH),
            ModalitySpec("depth", "image", DEPTH_VOCAB, grid=(GRID, GRID)),
            ModalitySpec("caption", "sequence", TEXT_VOCAB, max_length=TEXT_MAX))


def masked_samples(specs, seed: int = 0):
    ones = tuple(0.5 for _ in specs)
    masking = MaskingArgs(specs, INPUT_TOKENS, TARGET_TOKENS, (MixtureComponent(1.0, ones, ones),), SENTINELS)
    rng = np.random.default_rng(seed)
    samples, raw = [], []
    for _ in range(BATCH):
        tokens = {"rgb": rng.integers(0, RGB_VOCAB, (GRID, GRID)), "depth": rng.integers(0, DEPTH_VOCAB, (GRID, GRID)),
                  "caption": rng.integers(104, TEXT_VOCAB, int(rng.integers(*CAPTION_LENGTH))).tolist()}
        pixels = rng.integers(0, 256, (IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
        samples.append(mask_sample(rng, masking, tokens, pixels))
        raw.append(tokens)
    return masking, samples, raw


def build_ours(layers) -> FourM:
    """As the pretrain stage builds it for one process (``parallelize``: the CPU's in-place table gradients)."""
    enc_l, dec_l, dim, heads = layers
    torch.manual_seed(0)
    model = FourM(FourMArgs(our_specs(), enc_l, dec_l, dim, heads))
    return parallelize(model)


# -- the reference ----------------------------------------------------------------------------------------------------

def reference_modality_info() -> dict:
    """The fields of ml-4m's ``MODALITY_INFO`` that ``FourM`` reads (``id``, ``type``), for our four domains; the ids
    are distinct small ints (ml-4m uses a 15-bit hash of the name; only distinctness matters)."""
    return {"rgb@224": {"type": "img", "id": 1, "max_tokens": GRID * GRID},
            "tok_rgb@224": {"type": "img", "id": 2, "max_tokens": GRID * GRID},
            "tok_depth@224": {"type": "img", "id": 3, "max_tokens": GRID * GRID},
            "caption": {"type": "seq", "id": 4, "max_tokens": TEXT_MAX}}


def build_reference(ref: SimpleNamespace, config: str) -> torch.nn.Module:
    """As ``run_training_4m.py`` builds it from ``MODALITY_INFO``'s embedding partials (same arguments)."""
    torch.manual_seed(0)
    encoder = {"rgb@224": ref.enc.ImageEncoderEmbedding(num_channels=3, patch_size=PATCH, image_size=IMAGE_SIZE),
               "tok_depth@224": ref.enc.ImageTokenEncoderEmbedding(vocab_size=DEPTH_VOCAB, patch_size=PATCH,
                                                                   image_size=IMAGE_SIZE),
               "caption": ref.enc.SequenceEncoderEmbedding(vocab_size=TEXT_VOCAB, max_length=TEXT_MAX, padding_idx=0)}
    decoder = {"tok_rgb@224": ref.dec.ImageTokenDecoderEmbedding(vocab_size=RGB_VOCAB, patch_size=PATCH,
                                                                 image_size=IMAGE_SIZE),
               "tok_depth@224": ref.dec.ImageTokenDecoderEmbedding(vocab_size=DEPTH_VOCAB, patch_size=PATCH,
                                                                   image_size=IMAGE_SIZE),
               "caption": ref.dec.SequenceDecoderEmbedding(vocab_size=TEXT_VOCAB, max_length=TEXT_MAX, padding_idx=0)}
    return getattr(ref.fm, config)(encoder_embeddings=encoder, decoder_embeddings=decoder,
                                   modality_info=reference_modality_info())


def reference_optimizer(ref: SimpleNamespace, model: torch.nn.Module) -> torch.optim.Optimizer:
    cfg = OptimizerConfig()
    args = SimpleNamespace(opt="adamw", lr=LR, weight_decay=cfg.weight_decay, opt_eps=1e-8,
                           opt_betas=tuple(cfg.betas), momentum=0.9)
    with contextlib.redirect_stdout(sys.stderr):  # it prints its settings
        return ref.optim.create_optimizer(args, model, skip_list=model.no_weight_decay())


def reference_batch(samples, raw, specs) -> dict[str, dict[str, torch.Tensor]]:
    """Our masked samples in ``UnifiedMasking``'s output format (``True`` in a mask = not used), collated."""
    return ml4m_batch(samples, raw, specs, {name: REF_NAMES[name] for name in REF_NAMES}, (TEXT_MAX + 1) * 2)


def reference_valid_tokens(batch) -> tuple[int, int]:
    enc = sum(int((~batch[m]["input_mask"]).sum()) for m in ("rgb@224", "tok_depth@224", "caption"))
    dec = sum(int((~batch[m]["target_mask"]).sum()) for m in ("tok_rgb@224", "tok_depth@224"))
    caption = batch["caption"]["target_mask"]
    dec += int((~caption[:, 1:] & ~caption[:, :-1]).sum())
    return enc, dec


def reference_step(model, optimizer, batch, dtype: torch.dtype | None) -> torch.Tensor:
    # the model writes 'x'/'emb'/'ids' into the per-modality dicts: give it fresh ones each step
    mod_dict = {name: dict(d) for name, d in batch.items()}
    with autocast(torch.device("cpu"), dtype):  # run_training_4m.py: autocast(dtype=dtype, enabled=dtype != fp32)
        loss, _ = model(mod_dict, num_encoder_tokens=INPUT_TOKENS, num_decoder_tokens=TARGET_TOKENS,
                        loss_type="mod")
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    optimizer.step()
    return loss.detach()


# -- timing -----------------------------------------------------------------------------------------------------------

def parameter_breakdown(model: torch.nn.Module) -> dict[str, int]:
    parts: dict[str, int] = {}
    for name, p in model.named_parameters():
        key = name.split(".")[0]
        parts[key] = parts.get(key, 0) + p.numel()
    return parts


def summary(times: list[float], tokens: int) -> dict:
    best, median = min(times), statistics.median(times)
    return {"step_s_best": best, "step_s_median": median, "tokens_per_s_best": tokens / best,
            "tokens_per_s_median": tokens / median, "step_s_rounds": times}


def _fused_attention_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)


def _fused_attention_backward_flops(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None,
                                    **kwargs) -> int:
    return flop_counter.sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def _inplace_addmm_flops(self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * a_shape[0] * a_shape[1] * b_shape[1]


#: What torch's FLOP counter does not list: the CPU's fused attention kernels, counted as its other fused kernels are
#: (two batched products forward; five backward, the scores computed again), and the in-place product-and-add
#: (``addmm_``) with which our token tables accumulate their gradients (model/table_gradients.py; in fp32 the tied
#: head's weight gradient). Torch's own formulas (``sdpa_flop``, ``addmm_flop``) come wrapped for its registry, which
#: a custom mapping wraps again, so these call the raw counts.
UNLISTED_FLOPS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _fused_attention_flops,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _fused_attention_backward_flops,
    torch.ops.aten.addmm_: _inplace_addmm_flops}


def matmul_flops(run) -> int:
    """The FLOPs of the matrix products in one call of ``run`` (a train step: forward, backward, optimizer)."""
    with flop_counter.FlopCounterMode(display=False, custom_mapping=UNLISTED_FLOPS) as counter:
        run()
    return counter.get_total_flops()


def compare(name: str, ref: SimpleNamespace | None, rounds: int, steps: int, warmup: int,
            dtype: torch.dtype | None, matmul_gflops: float) -> dict:
    config, layers = CONFIGS[name]
    specs = our_specs()
    masking, samples, raw = masked_samples(specs)
    ours_batch = collate(samples, masking)
    ours = build_ours(layers)
    ours_opt = build_optimizer(ours, OptimizerConfig(), LR)
    settings = StepSettings(dtype, GRAD_CLIP, tuple(s.name for s in specs))
    cpu = torch.device("cpu")
    tokens = BATCH * (INPUT_TOKENS + TARGET_TOKENS)
    result = {"reference_config": config, "encoder_layers": layers[0], "decoder_layers": layers[1],
              "dim": layers[2], "heads": layers[3], "tokens_per_step": tokens,
              "ours": {"parameters": sum(p.numel() for p in ours.parameters()),
                       "parameters_by_module": parameter_breakdown(ours),
                       "valid_input_tokens": int(ours_batch.enc_valid.sum()),
                       "valid_target_tokens": int(ours_batch.dec_valid.sum())}}
    runners = {"ours": lambda: train_step(ours, ours_opt, [ours_batch], settings, cpu)["loss"]}
    if ref is not None:
        reference = build_reference(ref, config)
        ref_opt = reference_optimizer(ref, reference)
        ref_batch = reference_batch(samples, raw, specs)
        valid_in, valid_out = reference_valid_tokens(ref_batch)
        result["reference"] = {"parameters": sum(p.numel() for p in reference.parameters()),
                               "parameters_by_module": parameter_breakdown(reference),
                               "valid_input_tokens": valid_in, "valid_target_tokens": valid_out}
        runners["reference"] = lambda: reference_step(reference, ref_opt, ref_batch, dtype)
    losses = {}
    for label, run in runners.items():
        for _ in range(warmup):
            losses[label] = float(run())
    flops = {label: matmul_flops(run) for label, run in runners.items()}
    times: dict[str, list[float]] = {label: [] for label in runners}
    for _ in range(rounds):
        for label, run in runners.items():  # interleaved: ours, reference, ours, reference, ...
            start = time.perf_counter()
            for _ in range(steps):
                run()
            times[label].append((time.perf_counter() - start) / steps)
    for label in runners:
        result[label].update(summary(times[label], tokens))
        result[label]["loss_after_warmup"] = losses[label]
        result[label]["matmul_gflop_per_step"] = flops[label] / 1e9
        result[label]["matmul_floor_s"] = flops[label] / (matmul_gflops * 1e9)
    if ref is not None:
        o, r = result["ours"], result["reference"]
        result["ratio_ours_over_reference"] = {"best": o["tokens_per_s_best"] / r["tokens_per_s_best"],
                                               "median": o["tokens_per_s_median"] / r["tokens_per_s_median"]}
        result["ratio_ceiling_at_equal_flops"] = r["step_s_median"] / o["matmul_floor_s"]
        result["parameter_difference_ours_minus_reference"] = o["parameters"] - r["parameters"]
    return result


DIFFERENCES = [
    "Same trunk: encoder/decoder depth, width, heads, bias-free linears and LayerNorms, SwiGLU feed-forward, "
    "the same precision (fp32, or both forwards under the CPU's bf16 autocast), AdamW (betas 0.9/0.95, weight "
    "decay 0.05 on matrices, eps 1e-8), grad clip 1.0.",
    "Same batch content: one masking (ours) of 8 samples, written in each implementation's input format; the same "
    "valid input and target tokens per sample (see valid_*_tokens).",
    "rgb: both embed 16-px pixel patches of a 224 px image with a bias-free linear (ours: ModalitySpec pixel_input, "
    "patch_size 16; reference: ImageEncoderEmbedding rgb@224) and predict 14x14 tokens of 16384 (ours: the same "
    "'rgb' modality's output head; reference: a separate domain tok_rgb@224). In the reference, rgb@224 input and "
    "tok_rgb@224 target are two domains masked independently (a cell may be both input and target); ours keeps "
    "them disjoint (the batch here has disjoint cells for both).",
    "Embeddings: ours has one encoder and one decoder token table over all modalities (the encoder's with one "
    "placeholder row for rgb, which enters as pixels) with the output head tied to the decoder table; the reference "
    "has per-domain tables, each decoder embedding sharing its table with its output head (share_embedding=True), "
    "and no encoder table for tok_rgb@224.",
    "Decoder context: both project the normalised encoder output (dim x dim) and add each input's position and "
    "modality embedding again (reference: decoder_proj_context, with bias; ours: context_proj, bias-free, since "
    "pretrain code_version 6). Modality embeddings: the reference learns one per embedding module (shared between "
    "encoder and decoder); ours one learned modality embedding table, plus a learned mask token.",
    "Parameters: the trunks (encoder, decoder blocks) have identical counts; in all the reference has dim more "
    "(decoder_proj_context's bias). Ours keeps one placeholder row for rgb in its shared encoder table (pixel input "
    "never reads rgb tokens; since pretrain code_version 7, before which the table kept all 16384 rgb rows).",
    "Optimizer implementation: ours build_optimizer's AdamW (fused on the CPU since commit b059a3c, foreach "
    "before); the reference torch's default (for-loop on CPU), as its create_optimizer builds it.",
    "Loss: both average per-modality mean cross-entropies ('mod'); the reference masks by boolean indexing of the "
    "decoder output, ours by the loader's host-side target order. Ours computes each modality's head and "
    "cross-entropy in one function whose backward turns the saved softmax into the logits' gradient in place "
    "(table_gradients._SliceCrossEntropy, since pretrain code_version 7); the reference autograd's log_softmax "
    "and nll_loss.",
    "Attention: the reference multiplies q by k, masks, takes the softmax and multiplies by v through autograd "
    "(fm_utils.Attention); ours, in fp32 training on the CPU, explicit batched matmuls with a hand-written backward "
    "where one call's scores have at most layers.EXPLICIT_ATTENTION_MAX_SCORES elements (tiny's shapes; since "
    "pretrain code_version 8), else the fused scaled_dot_product_attention (base's).",
    "Attention masks: ours attends over the encoder without a mask when the loader flags every encoder slot "
    "valid (MaskedBatch.enc_all_valid, as in this batch; since pretrain code_version 7); the reference always "
    "passes its masks.",
    "Gradients: ours, as the pretrain stage builds it for one process on the CPU (parallelize), writes the token "
    "tables' gradients in place (model/table_gradients.py, since pretrain code_version 4); the reference leaves "
    "them to autograd (a fresh table-sized gradient per table and step).",
    "Clipping: ours inside the fused AdamW (its grad_scale input divides the gradients in its kernel, since pretrain "
    "code_version 5); the reference's clip_grad_norm_ multiplies every gradient in a pass of its own.",
    "Allocator: one process runs both steps, so both get the same glibc setting (freed_memory_reused: freed "
    "memory kept for reuse, as our stage runner sets it for every stage, or glibc's default).",
    "Precision: with --precision bf16 both forwards run under the CPU's bf16 autocast (the reference's loop uses "
    "CUDA's autocast, which does nothing on a CPU).",
    "SwiGLU: ours one fused gate/up projection whose activation writes both halves' gradients into one tensor "
    "(layers._GatedSiLU); the reference two linears (fc1, fc3) and autograd's silu and product.",
]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="tiny,base")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                        help="bf16: both forwards under the CPU's bf16 autocast (the reference's default dtype)")
    parser.add_argument("--allocator", choices=("reuse", "default"), default="reuse",
                        help="reuse: glibc keeps freed memory for reuse, as our stage runner sets it (the one "
                             "process runs both steps, so the reference gets it too); default: glibc as it starts")
    parser.add_argument("--reference", default=os.environ.get("FOURM_REFERENCE")
                        or ("/tmp/ml-4m" if Path("/tmp/ml-4m").exists() else None))
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    dtype = resolve_precision(args.precision, torch.device("cpu"))
    reused = reuse_freed_memory() if args.allocator == "reuse" else False
    result = {"device": "cpu", "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
              "precision": args.precision, "cpu_has_native_bf16": cpu_has_native_bf16(),
              "freed_memory_reused": reused, "torch": torch.__version__, "batch": BATCH, "input_tokens": INPUT_TOKENS,
              "target_tokens": TARGET_TOKENS, "rounds": args.rounds, "steps_per_round": args.steps,
              "warmup_steps": args.warmup, "date": time.strftime("%Y-%m-%d"),
              "modalities": {"rgb": "224 px as 16-px pixel patches in; 14x14 tokens of 16384 out",
                             "depth": "14x14 tokens of 8192, in and out",
                             "caption": f"WordPiece ids of 30000, at most 256; {CAPTION_LENGTH[0]}-"
                                        f"{CAPTION_LENGTH[1] - 1} per sample here, in and out"},
              "differences": DIFFERENCES}
    result["machine_before"] = cpu_matmul_rate()  # the yardstick: 2-core machines differ up to 2x
    if Path("/proc/loadavg").exists():
        result["loadavg_before"] = Path("/proc/loadavg").read_text().split()[:3]
    ref = None
    path = Path(args.reference) if args.reference else None
    if path is not None and (path / "fourm" / "models" / "fm.py").exists():
        ref = load_reference(path)
        result["reference"] = {"path": str(path), "import": "fourm.models.fm and its model submodules, package "
                               "__init__ files skipped (they import the data pipeline), MODALITY_INFO left empty, "
                               "random.sample of a dict view as in Python 3.10"}
        commit = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True)
        if commit.returncode == 0:
            result["reference"]["commit"] = commit.stdout.strip()
    else:
        result["reference"] = {"skipped": f"no ml-4m checkout at {path} (--reference PATH or $FOURM_REFERENCE; "
                                          "git clone https://github.com/apple/ml-4m)" if path else
                               "no ml-4m checkout given (--reference PATH or $FOURM_REFERENCE)"}
    result["configs"] = {}
    rate = result["machine_before"]["bf16_matmul_gflops" if dtype == torch.bfloat16 else "fp32_matmul_gflops"]
    for name in args.configs.split(","):
        result["configs"][name] = compare(name, ref, args.rounds, args.steps, args.warmup, dtype, rate)
        print(f"{name}: done", file=sys.stderr)
    if Path("/proc/loadavg").exists():
        result["loadavg_after"] = Path("/proc/loadavg").read_text().split()[:3]
    result["machine_after"] = cpu_matmul_rate()
    emit(result, args.output)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
