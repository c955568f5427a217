"""The port of ml-4m's VQ tokenizers (``fourm_kfp.tokenizers.ml4m``) against the outputs of ml-4m's own code
(issue 56), printing JSON.

``bench/ml4m_tokenizer_reference.py`` (run in ml-4m's environment, ``bash bench/ml4m_env.sh``) saved each scaled
tokenizer as ml-4m's ``save_pretrained`` does, with a seeded batch, ml-4m's codes and its decoded outputs, under
``tests/tokenizers/ml4m_reference/<name>/``. Here each folder is loaded by the port alone (``load_vqvae``, or
``load_vq_encoder`` for an encoder-only ``VQ``) and:

* **codes**: the port's codes on the batch must equal ml-4m's, every one. Ties are counted: latents whose best two
  codes score within ``1e-5`` (cosine similarity, or Memcodes' logit) of each other, where a last-bit difference
  in arithmetic could pick the other code; the smallest gap over the batch is reported too.
* **decoded**: the port's ``decode_tokens`` of ml-4m's codes within ``1e-4`` (max absolute difference) of ml-4m's.
* **the quantizers at the published codebook sizes** (lucid 16384 / 8192 / 4096 codes, Memcodes 8 x 8192 and
  8 x 1024): seeded codebooks and latents that both sides regenerate (``torch.randn``; the manifest's checksums
  confirm it), ml-4m's codes in ``quantizers/``; the same identity and tie count.
* the folder's key and shape list against ``keys.json``'s published sizes: the port built from each published
  ``config.json`` (on the meta device) has ml-4m's keys and shapes.

    .venv/bin/python bench/ml4m_tokenizer_compare.py [--output bench/results/ml4m_tokenizers-cpu-2026-11-28.json]
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import numpy as np
import torch

from fourm_kfp.tokenizers.ml4m import VQEncoder, VQVAE, load_vq_encoder, load_vqvae, read_folder
from fourm_kfp.tokenizers.ml4m.quantizers import build_quantizer
from fourm_kfp.tokenizers.ml4m.vit import PRESETS

from bench_output import emit
from ml4m_tokenizer_reference import full_size_tensors  # the seeded tensors, made as the reference made them

REFERENCE = Path(__file__).resolve().parent.parent / "tests/tokenizers/ml4m_reference"
TIE, DECODE_TOL = 1e-5, 1e-4


def compare_one(directory: Path) -> dict:
    folder = read_folder(directory / "folder")
    encoder_only = not (directory / "decoded.npy").exists()
    model = load_vq_encoder(folder) if encoder_only else load_vqvae(folder)
    inputs = torch.from_numpy(np.load(directory / "inputs.npy"))
    expected = torch.from_numpy(np.load(directory / "codes.npy"))
    with torch.no_grad():
        codes = model.encode(inputs)
        scores = model.code_scores(inputs)
    top2 = scores.topk(2, dim=-1).values
    gaps = (top2[..., 0] - top2[..., 1]).flatten()
    result = {
        "folder_digest": folder.digest, "codebook_size": model.codebook_size, "codes_shape": list(codes.shape),
        "codes": int(codes.numel()), "codes_identical": bool(codes.shape == expected.shape
                                                             and torch.equal(codes, expected)),
        "codes_differing": int((codes != expected).sum()) if codes.shape == expected.shape else None,
        "ties_below_1e-5": int((gaps < TIE).sum()), "smallest_top2_gap": float(gaps.min()),
    }
    if not encoder_only:
        decoded = torch.from_numpy(np.load(directory / "decoded.npy"))
        with torch.no_grad():
            ours = model.decode_tokens(expected)
        error = float((ours - decoded).abs().max())
        result.update({"decoded_shape": list(ours.shape), "decoded_max_abs_error": error,
                       "decoded_scale": float(decoded.abs().max()), "decoded_within_1e-4": error <= DECODE_TOL})
    return result


def full_size_quantizer(spec: dict) -> tuple[torch.nn.Module, torch.Tensor]:
    """The port's quantizer of a full-size entry, filled with the regenerated tensors, and its latents."""
    tensors = full_size_tensors(spec)
    sums = {k: float(v.double().sum()) for k, v in tensors.items()}
    if any(abs(sums[k] - spec["checksums"][k]) > 1e-6 * max(1.0, abs(sums[k])) for k in sums):
        raise RuntimeError(f"torch.randn no longer regenerates the reference's tensors: {sums} vs "
                           f"{spec['checksums']}")
    q = build_quantizer(spec["quant_type"], latent_dim=spec["latent_dim"], codebook_size=spec["codebook_size"],
                        num_codebooks=spec["num_codebooks"]).eval()
    with torch.no_grad():
        if spec["quant_type"] == "lucid":
            q._codebook.embed.copy_(tensors["embed"])
        else:
            q.codes.copy_(tensors["codes"])
            q.to_k.weight.copy_(tensors["to_k"])
            q.to_v.weight.copy_(tensors["to_v"])
    return q, tensors["latents"]


def compare_quantizer(root: Path, name: str, spec: dict) -> dict:
    q, latents = full_size_quantizer(spec)
    expected = torch.from_numpy(np.load(root / "quantizers" / f"{name}_codes.npy"))
    with torch.no_grad():
        _, codes = q(latents)
        top2 = q.scores(latents).topk(2, dim=-1).values
    gaps = (top2[..., 0] - top2[..., 1]).flatten()
    return {"codebook_size": spec["codebook_size"], "heads": spec["num_codebooks"], "codes": int(codes.numel()),
            "codes_identical": bool(codes.shape == expected.shape and torch.equal(codes, expected)),
            "ties_below_1e-5": int((gaps < TIE).sum()), "smallest_top2_gap": float(gaps.min())}


def published_shapes(keys: dict) -> dict:
    """For each published configuration: does the port built from its ``config.json`` have ml-4m's keys and
    shapes?"""
    out = {}
    for name, entry in keys.items():
        cls = VQEncoder if entry["class"] == "VQ" else VQVAE
        with torch.device("meta"):
            model = cls(entry["config_json"])
        ours = {k: list(v.shape) for k, v in model.state_dict().items()}
        theirs = entry["keys"]
        out[name] = {"keys": len(theirs), "same_keys_and_shapes": ours == theirs,
                     "missing": sorted(set(theirs) - set(ours))[:5], "extra": sorted(set(ours) - set(theirs))[:5],
                     "other_shape": sorted(k for k in set(ours) & set(theirs) if ours[k] != theirs[k])[:5]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", default=str(REFERENCE))
    parser.add_argument("--output")
    args = parser.parse_args()
    root = Path(args.reference)
    manifest = json.loads((root / "manifest.json").read_text())
    torch.set_num_threads(1)
    tiny = manifest["scaled_vit_preset"]["vit_tiny"]
    preset_matches = (PRESETS["tiny"].dim, PRESETS["tiny"].depth, PRESETS["tiny"].heads) == (
        tiny["dim_tokens"], tiny["depth"], tiny["num_heads"])
    tokenizers = {name: compare_one(root / name) for name in manifest["tokenizers"]}
    quantizers = {name: compare_quantizer(root, name, spec)
                  for name, spec in manifest.get("full_size_quantizers", {}).items()}
    shapes = published_shapes(json.loads((root / "keys.json").read_text()))
    decode_errors = [t["decoded_max_abs_error"] for t in tokenizers.values() if "decoded_max_abs_error" in t]
    emit({
        "what": "fourm_kfp.tokenizers.ml4m against apple/ml-4m's own VQ tokenizer code (issue 56)",
        "ml4m_commit": manifest["ml4m_commit"], "reference_made_by": manifest["command"],
        "reference_environment": manifest["environment"],
        "environment": {"python": platform.python_version(), "torch": torch.__version__, "threads": 1,
                        "machine": platform.machine()},
        "summary": {
            "codes_identical": all(t["codes_identical"] for t in [*tokenizers.values(), *quantizers.values()]),
            "codes_compared": sum(t["codes"] for t in tokenizers.values()),
            "ties_below_1e-5": sum(t["ties_below_1e-5"] for t in tokenizers.values()),
            "smallest_top2_gap": min(t["smallest_top2_gap"] for t in tokenizers.values()),
            "full_size_codes_compared": sum(q["codes"] for q in quantizers.values()),
            "full_size_ties_below_1e-5": sum(q["ties_below_1e-5"] for q in quantizers.values()),
            "full_size_smallest_top2_gap": min((q["smallest_top2_gap"] for q in quantizers.values()), default=None),
            "decoded_max_abs_error": max(decode_errors), "decoded_target": DECODE_TOL,
            "decoded_within_target": max(decode_errors) <= DECODE_TOL,
            "published_keys_and_shapes_match": all(s["same_keys_and_shapes"] for s in shapes.values()),
            "tiny_preset_matches_reference": preset_matches,
        },
        "tokenizers": tokenizers,
        "full_size_quantizers": quantizers,
        "published_configs": shapes,
    }, args.output)


if __name__ == "__main__":
    main()
