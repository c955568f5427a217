"""Our ml-4m converter (``fourm_kfp.model.ml4m``) against ml-4m's own ``FM``, printing JSON (issue 46).

A tiny model (2+2 blocks, width 32) over ml-4m's real 224-px domains and vocabularies: rgb as 16-px pixel
patches (``rgb@224``) and as tokens (``tok_rgb@224``, 16384), depth (``tok_depth@224``, 8192), semseg
(``tok_semseg@224``, 4096), caption and det (30000-token text, 256 positions). Every parameter is random (LayerNorm
weights, the context bias, the mask token, modality embeddings, output heads apart from the input tables), fp32.

* **ours → ml-4m**: our model is exported (:func:`~fourm_kfp.model.ml4m.export_ml4m`) and loaded by
  ``FM.from_pretrained(folder, strict=True)`` and by the safetensors-metadata route (``fourm.utils.load_safetensors`` then
  ``FM(config).load_state_dict``: nothing unexpected, nothing missing but a shared embedding's second name); both
  must give our logits (max |Δ| per token ≤ 1e-5). Two variants:
  ``ml4m_layout`` (our ml-4m switches on: context bias, rgb@224's own modality embedding, untied heads) and
  ``defaults`` (tied heads, no context bias, one rgb embedding); both read ImageNet-normalised pixels, as ml-4m's
  data pipeline gives them (a model reading [-1, 1] pixels is refused by the export).
* **ml-4m → ours**: ``FM(config)`` (with ``tok_rgb@224`` also an input, and ``tok_clip@224``, which comes in as our
  ``clip`` feature-map modality at its 14 x 14 grid), every parameter random, ``save_pretrained(folder)``, imported by :func:`~fourm_kfp.model.ml4m.import_ml4m`:
  logits ≤ 1e-4 of ml-4m's.

Each on two batches masked by our masking (:mod:`fourm_kfp.masking.multimodal_masking`): every slot filled, and
with padding (budgets larger than the samples' tokens). ml-4m shuffles its decoder's modalities, so tokens are
matched by (sample, modality, position): ml-4m's decoder is run by its own methods as its ``forward`` chains them,
twice with the same shuffle, the second time with the targets replaced by their positions. The per-modality losses
of ``model(mod_dict, ...)`` (ml-4m's ``forward``) are compared with ours. ``keys`` writes ml-4m's state-dict keys
and shapes for the ``ml4m_layout`` model's config (``tests/model/ml4m_tiny_keys.json``, which the always-on tests
check our export against).

    FOURM_REFERENCE=/path/to/ml-4m python bench/ml4m_compare.py [--output f.json]
    FOURM_REFERENCE=/path/to/ml-4m python bench/ml4m_compare.py keys --output tests/model/ml4m_tiny_keys.json

The references the always-on tests compare our import with (ml-4m's own FM at 4M-21's and 4M-7's shapes, on a batch
from ml-4m's ``UnifiedMasking``) are made by ``bench/ml4m_fm_reference.py``.

ml-4m's model code needs ``einops`` and ``huggingface_hub`` (its ``PyTorchModelHubMixin``); see
``bench/ml4m_reference.py`` for how it is loaded without its data pipeline.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import random
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from fourm_kfp.batch import ModalitySpec
from fourm_kfp.masking.dirichlet_masking import MixtureComponent
from fourm_kfp.masking.multimodal_masking import MaskingArgs, collate, mask_sample
from fourm_kfp.model.fourm import FourM, FourMArgs
from fourm_kfp.model.ml4m import CONFIG, DOMAINS, PIXEL_DOMAIN, export_ml4m, import_ml4m, ml4m_config

from bench_output import emit
from ml4m_reference import STAND_INS, load_reference, ml4m_batch, reference_path

LAYERS, DIM, HEADS = (2, 2), 32, 2
BATCH, BUDGET, PADDED_BUDGET = 6, 48, 96
SENTINELS = tuple(range(4, 104))
TEXT_MAX = 256
OURS_TO_ML4M_TOL, ML4M_TO_OURS_TOL = 1e-5, 1e-4


def specs(normalisation: str) -> tuple[ModalitySpec, ...]:
    grid = (14, 14)
    return (ModalitySpec("rgb", "image", 16384, grid=grid, pixel_input=True, patch_size=16,
                         pixel_normalisation=normalisation),
            ModalitySpec("depth", "image", 8192, grid=grid), ModalitySpec("semseg", "image", 4096, grid=grid),
            ModalitySpec("det", "sequence", 30000, max_length=TEXT_MAX),
            ModalitySpec("caption", "sequence", 30000, max_length=TEXT_MAX))


def randomise(model: torch.nn.Module, seed: int) -> None:
    """Every parameter random at a trained model's scale (normal, std 0.05; LayerNorm weights 1 + 0.2 N), the
    pixel placeholder row kept zero."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            values = torch.randn(p.shape, generator=generator)
            p.copy_(1.0 + 0.2 * values if "norm" in name else 0.05 * values)
        if isinstance(model, FourM):
            for index, spec in enumerate(model.args.modalities):
                if spec.pixel_input:
                    model.enc_token_embed.weight[model.enc_token_offset[index]].zero_()


def our_model(variant: str) -> FourM:
    if variant == "ml4m_layout":
        args = FourMArgs(specs("imagenet"), *LAYERS, DIM, HEADS, tie_embeddings=False, context_bias=True,
                         pixel_modality_embed=True)
    else:
        args = FourMArgs(specs("imagenet"), *LAYERS, DIM, HEADS)
    model = FourM(args)
    randomise(model, seed=1)
    return model.eval()


def batches(model_specs, seed: int = 0):
    """``[(name, our batch, samples, raw tokens, budget)]``: every slot filled, and padded."""
    ones = tuple(1.0 for _ in model_specs)
    masking = MaskingArgs(model_specs, BUDGET, BUDGET, (MixtureComponent(1.0, ones, ones),), SENTINELS)
    rng = np.random.default_rng(seed)
    samples, raw = [], []
    for _ in range(BATCH):
        tokens = {s.name: rng.integers(0, s.vocab_size, s.grid) for s in model_specs if s.kind == "image"}
        for s in model_specs:
            if s.kind == "sequence":
                tokens[s.name] = rng.integers(104, s.vocab_size, int(rng.integers(8, 30))).tolist()
        pixels = rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)
        samples.append(mask_sample(rng, masking, tokens, pixels))
        raw.append(tokens)
    padded = dataclasses.replace(masking, input_budget=PADDED_BUDGET, target_budget=PADDED_BUDGET)
    return [("full", collate(samples, masking), samples, raw, BUDGET),
            ("padded", collate(samples, padded), samples, raw, PADDED_BUDGET)]


def domain_map(model_specs) -> dict[str, tuple[str, str]]:
    return {s.name: (PIXEL_DOMAIN if s.pixel_input else DOMAINS[s.name].name, DOMAINS[s.name].name)
            for s in model_specs}


# -- logits by (sample, modality, position) ----------------------------------------------------------------------------

def our_logits(model: FourM, batch) -> dict[tuple[int, str, int], torch.Tensor]:
    with torch.no_grad():
        hidden = model.decode(model.encode(batch), batch)
    out = {}
    for b, j in zip(*torch.nonzero(batch.dec_valid, as_tuple=True)):
        m = int(batch.dec_modality[b, j])
        out[(int(b), model.args.names[m], int(batch.dec_position[b, j]))] = model.logits(hidden[b, j], m)
    return out


def our_losses(model: FourM, batch) -> dict[str, float]:
    with torch.no_grad():
        return {k: float(v) for k, v in model(batch).modality_losses.items()}


def ml4m_logits(fm, mod_dict, budget: int, model_specs) -> dict[tuple[int, str, int], torch.Tensor]:
    """ml-4m's logits per valid target token, from its own methods chained as ``FourM.forward`` chains them."""
    names = {domain: name for name, (_, domain) in domain_map(model_specs).items()}
    with torch.no_grad():
        enc = {m: fm.encoder_embeddings[m](dict(d)) for m, d in mod_dict.items() if m in fm.encoder_embeddings}
        tokens, emb, mask, _ = fm.forward_mask_encoder(enc, budget)
        dec = {m: fm.decoder_embeddings[m].forward_embed(dict(d)) for m, d in mod_dict.items()
               if m in fm.decoder_embeddings}
        random.seed(7)
        y_tokens, y_emb, y_mask, _, y_attention, y_mod = fm.forward_mask_decoder(dec, budget)
        # the same shuffle again, each target id replaced by its index in the modality's tensor
        located = {m: {**d, "ids": torch.arange(d["ids"].shape[1]).expand_as(d["ids"])} for m, d in dec.items()}
        random.seed(7)
        _, _, _, index, _, _ = fm.forward_mask_decoder(located, budget)
        x = fm.forward_encoder(tokens + emb, encoder_mask=mask)
        context = fm.decoder_proj_context(x) + emb
        y = fm.forward_decoder(y_tokens + y_emb, context, encoder_mask=mask, decoder_attention_mask=y_attention)
    ids = {fm.modality_info[m]["id"]: m for m in dec}
    out = {}
    valid = ~y_mask[:, 0]
    for b, j in zip(*torch.nonzero(valid, as_tuple=True)):
        domain = ids[int(y_mod[b, j])]
        position = int(index[b, j])
        if fm.modality_info[domain]["type"] == "seq":  # target t_{r+1} at tensor index start + r + 1 -> slot r
            start = int(torch.nonzero(~mod_dict[domain]["target_mask"][b])[0])
            position -= start + 1
        out[(int(b), names[domain], position)] = fm.decoder_embeddings[domain].forward_logits(y[b, j])
    return out


def ml4m_losses(fm, mod_dict, budget: int, model_specs) -> dict[str, float]:
    names = {domain: name for name, (_, domain) in domain_map(model_specs).items()}
    with torch.no_grad():
        _, losses = fm({m: dict(d) for m, d in mod_dict.items()}, num_encoder_tokens=budget,
                       num_decoder_tokens=budget, loss_type="mod")
    return {names[m]: float(v) for m, v in losses.items()}


def difference(ours: dict, theirs: dict) -> dict:
    if set(ours) != set(theirs):
        raise AssertionError(f"target tokens differ: {len(set(ours) ^ set(theirs))} of {len(ours)} "
                             f"(e.g. {sorted(set(ours) ^ set(theirs))[:3]})")
    worst = max((ours[k] - theirs[k]).abs().max().item() for k in ours)
    scale = max(theirs[k].abs().max().item() for k in ours)
    return {"tokens": len(ours), "max_abs_diff": worst, "max_abs_logit": scale}


def compare_pair(ours: FourM, fm, model_specs) -> dict:
    result = {}
    for name, batch, samples, raw, budget in batches(model_specs):
        mod_dict = ml4m_batch(samples, raw, model_specs, domain_map(model_specs), (TEXT_MAX + 1) * 2)
        diff = difference(our_logits(ours, batch), ml4m_logits(fm, mod_dict, budget, model_specs))
        mine, theirs = our_losses(ours, batch), ml4m_losses(fm, mod_dict, budget, model_specs)
        diff["loss_max_abs_diff"] = max(abs(mine[k] - theirs[k]) for k in mine)
        diff["losses"] = {k: [mine[k], theirs[k]] for k in mine}
        diff["padding"] = bool((~batch.enc_valid).any() or (~batch.dec_valid).any())
        result[name] = diff
    return result


# -- the two directions -----------------------------------------------------------------------------------------------

def ours_to_ml4m(ref, variant: str) -> dict:
    model = our_model(variant)
    with tempfile.TemporaryDirectory(prefix="ml4m-out-") as folder:
        export_ml4m(model, folder)
        by_folder = ref.fm.FM.from_pretrained(folder, strict=True).eval()
        ckpt, config = ref.checkpoint.load_safetensors(str(Path(folder) / "model.safetensors"))
        by_file = ref.fm.FM(config=config)
        # A shared modality embedding is in the file once, under the decoder's name, as ml-4m's save_pretrained
        # writes it: loading that name fills the encoder's too (one parameter), so the encoder's alias is the only
        # key allowed missing, and nothing may be unexpected.
        missing, unexpected = by_file.load_state_dict(ckpt, strict=False)
        aliases = {k.replace("decoder_embeddings.", "encoder_embeddings.", 1) for k in ckpt if k.endswith(".mod_emb")}
        if unexpected or set(missing) - aliases:
            raise AssertionError(f"ml-4m's FM: unexpected {unexpected}, missing {sorted(set(missing) - aliases)}")
        by_file.eval()
        return {"from_pretrained": compare_pair(model, by_folder, model.args.modalities),
                "load_safetensors": compare_pair(model, by_file, model.args.modalities)}


def reference_config() -> dict:
    config = ml4m_config(our_model("ml4m_layout").args)
    config["domains_in"] = config["domains_in"] + [DOMAINS["rgb"].name, "tok_clip@224"]
    config["domains_out"] = config["domains_out"] + ["tok_clip@224"]
    return config


def ml4m_to_ours(ref) -> dict:
    torch.manual_seed(3)
    fm = ref.fm.FM(config=reference_config())
    randomise(fm, seed=2)
    fm.eval()
    with tempfile.TemporaryDirectory(prefix="ml4m-in-") as folder:
        fm.save_pretrained(folder)
        saved = sorted(k for k in json.loads((Path(folder) / CONFIG).read_text()))
        model, report = import_ml4m(folder)
    result = compare_pair(model, fm, model.args.modalities)
    result["import"] = {"imported_keys": len(report.imported), "dropped": report.dropped,
                        "dropped_domains": report.dropped_domains, "missing": report.missing,
                        "config_keys": saved}
    return result


def reference_keys(ref) -> dict:
    config = ml4m_config(our_model("ml4m_layout").args)
    fm = ref.fm.FM(config=config)
    return {"config": config, "keys": {k: list(v.shape) for k, v in sorted(fm.state_dict().items())}}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", nargs="?", choices=["compare", "keys"], default="compare")
    parser.add_argument("--reference", default=None, help="ml-4m checkout (default $FOURM_REFERENCE or /tmp/ml-4m)")
    parser.add_argument("--reference-commit", default="", help="the checkout's commit, recorded in the JSON")
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    path = reference_path(args.reference)
    if path is None:
        raise SystemExit("no ml-4m checkout: give --reference PATH or set FOURM_REFERENCE")
    ref = load_reference(path, modality_info="real")
    torch.set_num_threads(2)
    meta = {"reference": str(path), "reference_commit": args.reference_commit, "stand_ins": STAND_INS,
            "torch": torch.__version__, "python": platform.python_version(),
            "command": "python bench/ml4m_compare.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    if args.what == "keys":
        result = {**meta, **reference_keys(ref)}
    else:
        result = {**meta, "model": {"layers": LAYERS, "dim": DIM, "heads": HEADS, "batch": BATCH,
                                    "budgets": [BUDGET, PADDED_BUDGET]},
                  "ours_to_ml4m": {v: ours_to_ml4m(ref, v) for v in ("ml4m_layout", "defaults")},
                  "ml4m_to_ours": ml4m_to_ours(ref)}
        worst_out = max(batch["max_abs_diff"] for variant in result["ours_to_ml4m"].values()
                        for route in variant.values() for batch in route.values())
        worst_in = max(v["max_abs_diff"] for k, v in result["ml4m_to_ours"].items() if k != "import")
        result["summary"] = {"ours_to_ml4m_max_abs_diff": worst_out, "ml4m_to_ours_max_abs_diff": worst_in,
                             "ours_to_ml4m_within": worst_out <= OURS_TO_ML4M_TOL,
                             "ml4m_to_ours_within": worst_in <= ML4M_TO_OURS_TOL}
    emit(result, args.output)
    return result


if __name__ == "__main__":
    main()
