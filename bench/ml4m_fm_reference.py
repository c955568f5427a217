"""ml-4m's own FM at 4M-21's and 4M-7's shapes, saved by its own ``save_pretrained``, and what its own code computes
on a batch from its own ``UnifiedMasking``: the references ``tests/model/test_ml4m.py`` compares our import with,
without a checkout (issue 64).

For each of ``4m21`` and ``4m7`` the shape is read from ml-4m's training configs (``cfgs/default/4m/models/main/
4m-b_mod{21,7}_500b.yaml``, its data config and alphas mixture): the domains in and out, in ml-4m's order, less those
fourm-kfp has no modality for (``t5_caption``, ``human_poses``, ``tok_imagebind@224``, ``sam_instance``, the global
tokens: listed in the manifest); the token budgets; the text tokenizer. The trunk is scaled down (width
:data:`DIM`, :data:`HEADS` heads, :data:`LAYERS` blocks). ``FM(config)`` (ml-4m's ``fourm.models.fm``, its real
``MODALITY_INFO``), every parameter then random on a coarse grid (:func:`coarse_random`: the files compress about
9x, so all vocabularies fit in a few MB), ``save_pretrained(folder)``.

The batch: :data:`BATCH` samples of random token grids, random WordPiece words for the texts and a random image
(ImageNet-normalised, as ml-4m's ``RGBTransform`` gives it), masked by ml-4m's ``UnifiedMasking`` with the
modality info its training scripts build (``run_training_4m.setup_modality_info`` and
``fourm.data.pretrain_utils.setup_sampling_mod_info``, run from the checkout's source) and the mixture's
Dirichlets. One change: ``tok_rgb@224`` gets no inputs, as our import reads rgb from ``rgb@224``'s pixel patches
(``tok_rgb@224``'s encoder embedding is dropped, and reported).

What ml-4m computes, in float64: each target token's logits, from its own methods chained as ``FourM.forward``
chains them (``bench/ml4m_compare.py``'s ``ml4m_logits``: the decoder run twice with the same shuffle to learn
which tensor index each target came from), kept as the first :data:`FIRST_LOGITS`, the log-sum-exp and the target's
logit; and the per-modality losses of ``FM.forward(loss_type="mod")``.

Written to ``tests/model/ml4m_reference/fm_<shape>/``: ``config.json`` (ml-4m's), ``model.safetensors.xz``
(ml-4m's file, xz-compressed; its sha256 in the manifest: a rerun writes the same tensors, but the header's list
of shared names comes in Python's set order, so the bytes can differ), ``batch.safetensors.xz`` (the masked batch, the image as
uint8), ``outputs.safetensors`` and ``manifest.json`` (this command, the ml-4m commit, the versions, the shape).
Run it in the ``bench/ml4m_env.sh`` environment (plus ``tokenizers``, which ``fourm.data.masking`` imports)::

    FOURM_REFERENCE=/tmp/ml-4m PYTHONPATH=src .venv-ml4m/bin/python bench/ml4m_fm_reference.py \\
        --reference-commit cda590f

``--compare`` writes nothing: it takes *every* domain of the shape (those we drop included) at ``--dim`` (64),
``--layers`` (2 2), ``--heads`` (4) with ml-4m's own initialisation, imports ``save_pretrained``'s folder and
prints, per modality, the largest logit difference (float32) and the argmax agreement on a ``UnifiedMasking`` batch
(issue 64's measurement).
"""

from __future__ import annotations

import argparse
import ast
import copy
import hashlib
import json
import lzma
import platform
import random
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import torch
import yaml
from safetensors.torch import save_file

from fourm_kfp.batch import normalised_pixels
from fourm_kfp.model.ml4m import DOMAINS, PIXEL_DOMAIN, SWIGLU_NOBIAS

from ml4m_reference import STAND_INS, load_reference, reference_path

SHAPES = {"4m21": "cfgs/default/4m/models/main/4m-b_mod21_500b.yaml",
          "4m7": "cfgs/default/4m/models/main/4m-b_mod7_500b.yaml"}
DIM, HEADS, LAYERS = 8, 2, (1, 1)
BATCH = 4
FIRST_LOGITS = 32
#: the decoder's modality shuffle (``random.sample``) is seeded alike for the two runs that key the logits
SHUFFLE_SEED = 7
OUT = Path(__file__).resolve().parents[1] / "tests" / "model" / "ml4m_reference"
#: fourm-kfp's modalities as ml-4m domains (and rgb's pixel patches)
MAPPED = {d.name for d in DOMAINS.values()} | {PIXEL_DOMAIN}


def upstream_function(path: Path, name: str, namespace: dict):
    """The function ``name`` of the ml-4m source file ``path``, run as written in ``namespace`` (its module imports
    the whole training stack; the function needs only what ``namespace`` gives it)."""
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    exec(compile(ast.Module([node], []), str(path), "exec"), namespace)
    return namespace[name]


def coarse_random(fm: torch.nn.Module, seed: int) -> None:
    """Every parameter random on a coarse grid: LayerNorm weights 1 + N(0, 0.25) in steps of 1/16, token tables and
    output heads N(0, 0.5) in steps of 1/4, the rest N(0, 0.5) in steps of 1/16 (at a trained model's scale the
    SwiGLU of a width-8 model is near-linear, where a swapped gate and up compute almost the same). Exact in float32
    and float64."""
    norms = {f"{m}.weight" for m, module in fm.named_modules() if isinstance(module, torch.nn.LayerNorm)}
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in fm.named_parameters():
            values = torch.randn(p.shape, generator=generator)
            if name in norms:
                p.copy_(1 + (4 * values).round() / 16)
            elif name.endswith(("token_emb.weight", "to_logits.weight")):
                p.copy_((2 * values).round() / 4)
            else:
                p.copy_((8 * values).round() / 16)


def ml4m_target_logits(fm, mod_dict, num_encoder: int, num_decoder: int) -> dict[tuple[str, int, int], torch.Tensor]:
    """ml-4m's logits per valid target token, keyed ``(domain, sample, index)``: the index into the domain's
    ``tensor`` of the target (image) or of the token it is predicted from (text: the target is ``index + 1``)."""
    with torch.no_grad():
        enc = {m: fm.encoder_embeddings[m](dict(d)) for m, d in mod_dict.items() if m in fm.encoder_embeddings}
        tokens, emb, mask, _ = fm.forward_mask_encoder(enc, num_encoder)
        dec = {m: fm.decoder_embeddings[m].forward_embed(dict(d)) for m, d in mod_dict.items()
               if m in fm.decoder_embeddings}
        random.seed(SHUFFLE_SEED)
        y_tokens, y_emb, y_mask, _, y_attention, y_mod = fm.forward_mask_decoder(dec, num_decoder)
        located = {m: {**d, "ids": torch.arange(d["ids"].shape[1]).expand_as(d["ids"])} for m, d in dec.items()}
        random.seed(SHUFFLE_SEED)
        index = fm.forward_mask_decoder(located, num_decoder)[3]
        x = fm.forward_encoder(tokens + emb, encoder_mask=mask)
        context = fm.decoder_proj_context(x) + emb
        y = fm.forward_decoder(y_tokens + y_emb, context, encoder_mask=mask, decoder_attention_mask=y_attention)
        ids = {fm.modality_info[m]["id"]: m for m in dec}
        out = {}
        for b, j in zip(*torch.nonzero(~y_mask[:, 0], as_tuple=True)):
            domain = ids[int(y_mod[b, j])]
            position = int(index[b, j]) - (fm.modality_info[domain]["type"] == "seq")  # text targets: ids[:, 1:]
            out[(domain, int(b), position)] = fm.decoder_embeddings[domain].forward_logits(y[b, j])
    return out


def shape_of(path: Path, shape: str) -> types.SimpleNamespace:
    """``shape``'s training config, dataset entry, domains in and out (ml-4m's order) and token budgets."""
    train_cfg = yaml.safe_load((path / SHAPES[shape]).read_text())
    data_cfg_path = train_cfg["data_config"]
    dataset = next(iter(yaml.safe_load((path / data_cfg_path).read_text())["train"]["datasets"].values()))
    return types.SimpleNamespace(
        train_cfg=train_cfg, data_cfg_path=data_cfg_path, dataset=dataset,
        domains_in=dataset["in_domains"].split("-"), domains_out=dataset["out_domains"].split("-"),
        num_input=dataset.get("num_input_tokens") or train_cfg["num_input_tokens"],
        num_target=dataset.get("num_target_tokens") or train_cfg["num_target_tokens"])


def fm_config(domains_in: list[str], domains_out: list[str], dim: int, layers: tuple[int, int], heads: int) -> dict:
    return {"domains_in": domains_in, "domains_out": domains_out, "image_size": 224, "patch_size": 16, "dim": dim,
            "encoder_depth": layers[0], "decoder_depth": layers[1], "num_heads": heads, **SWIGLU_NOBIAS}


def masked_batch(path: Path, info: types.SimpleNamespace, config: dict, seed: int):
    """:data:`BATCH` random samples of ``config``'s domains masked by ml-4m's ``UnifiedMasking`` as its training
    sets it up (see the module docstring): ``(collated mod_dict, the uint8 images, the masking's modality info)``."""
    from fourm.data.masking import UnifiedMasking
    from fourm.data.modality_info import MODALITY_INFO
    from tokenizers import Tokenizer

    all_domains = sorted(set(config["domains_in"]) | set(config["domains_out"]))
    setup_modality_info = upstream_function(path / "run_training_4m.py", "setup_modality_info",
                                            {"MODALITY_INFO": MODALITY_INFO})
    setup_sampling = upstream_function(path / "fourm/data/pretrain_utils.py", "setup_sampling_mod_info",
                                       {"copy": copy, "yaml": yaml, "print": lambda *a, **k: None})
    modality_info = setup_modality_info(types.SimpleNamespace(all_domains=all_domains, input_size=224,
                                                              patch_size=16))
    dataset_cfg = {**info.dataset, "in_domains": "-".join(config["domains_in"]),
                   "out_domains": "-".join(config["domains_out"]),
                   "alphas_config": str(path / info.dataset["alphas_config"])}
    mod_info, weights_mix = setup_sampling(dataset_cfg, modality_info)
    mod_info["tok_rgb@224"]["input_alphas"] = [0.0] * len(mod_info["tok_rgb@224"]["input_alphas"])
    text_tokenizer = Tokenizer.from_file(str(path / info.train_cfg["tokenizer_path"]))
    masking = UnifiedMasking(modality_info=mod_info, text_tokenizer=text_tokenizer,
                             input_tokens_range=(info.num_input, info.num_input),
                             target_tokens_range=(info.num_target, info.num_target), sampling_weights=weights_mix)
    words = sorted(w for w in text_tokenizer.get_vocab() if w.isalpha() and w.islower())
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    samples, images = [], []
    for _ in range(BATCH):
        raw = {}
        for domain, entry in mod_info.items():
            if domain == PIXEL_DOMAIN:  # 2x2 blocks of 32 levels: compresses, still varies inside every patch
                image = np.repeat(np.repeat(rng.integers(0, 32, (112, 112, 3)) * 8, 2, 0), 2, 1).astype(np.uint8)
                images.append(image)
                raw[domain] = torch.from_numpy(np.ascontiguousarray(normalised_pixels(image, "imagenet")))
            elif entry["type"] == "img":
                raw[domain] = torch.from_numpy(rng.integers(0, entry["vocab_size"], entry["max_tokens"]))
            else:
                raw[domain] = " ".join(rng.choice(words, int(rng.integers(4, 40))))
        samples.append(masking(raw))
    mod_dict = {d: {k: torch.stack([s[d][k] for s in samples]) for k in samples[0][d]} for d in mod_info}
    return mod_dict, images, mod_info


def write_reference(ref, shape: str, out: Path, seed: int) -> dict:
    path = ref.path
    info = shape_of(path, shape)
    data_cfg_path, dataset, num_input, num_target = info.data_cfg_path, info.dataset, info.num_input, info.num_target
    config = fm_config([d for d in info.domains_in if d in MAPPED], [d for d in info.domains_out if d in MAPPED],
                       DIM, LAYERS, HEADS)
    unmapped = sorted(set(info.domains_in + info.domains_out) - MAPPED)

    torch.manual_seed(seed)
    fm = ref.fm.FM(config=config)
    coarse_random(fm, seed)
    fm.eval()
    folder = out / f"fm_{shape}"
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ml4m-fm-") as tmp:
        fm.save_pretrained(tmp)
        weights = (Path(tmp) / "model.safetensors").read_bytes()
        (folder / "config.json").write_bytes((Path(tmp) / "config.json").read_bytes())
    (folder / "model.safetensors.xz").write_bytes(lzma.compress(weights, preset=9 | lzma.PRESET_EXTREME))

    mod_dict, images, mod_info = masked_batch(path, info, config, seed)
    stored = {f"{d}.{k}": v.contiguous() for d, entry in mod_dict.items() for k, v in entry.items()
              if not (d == PIXEL_DOMAIN and k == "tensor")}
    stored[f"{PIXEL_DOMAIN}.pixels"] = torch.from_numpy(np.stack(images))
    with tempfile.TemporaryDirectory(prefix="ml4m-batch-") as tmp:
        save_file(stored, str(Path(tmp) / "batch.safetensors"))
        (folder / "batch.safetensors.xz").write_bytes(
            lzma.compress((Path(tmp) / "batch.safetensors").read_bytes(), preset=9))

    fm64 = copy.deepcopy(fm).double()
    mod_dict64 = {d: {k: (v.double() if v.is_floating_point() else v) for k, v in e.items()}
                  for d, e in mod_dict.items()}
    logits = ml4m_target_logits(fm64, mod_dict64, num_input, num_target)
    with torch.no_grad():
        _, losses = fm64({m: dict(d) for m, d in mod_dict64.items()}, num_encoder_tokens=num_input,
                         num_decoder_tokens=num_target, loss_type="mod")
    outputs, counts = {}, {}
    for domain in config["domains_out"]:
        keys = sorted(k for k in logits if k[0] == domain)
        stacked = torch.stack([logits[k] for k in keys])
        tensor = mod_dict[domain]["tensor"]
        step = int(mod_info[domain]["type"] == "seq")
        targets = torch.tensor([int(tensor[b, i + step]) for _, b, i in keys])
        outputs[f"{domain}.keys"] = torch.tensor([[b, i] for _, b, i in keys])
        outputs[f"{domain}.targets"] = targets
        outputs[f"{domain}.first_logits"] = stacked[:, :FIRST_LOGITS].float().contiguous()
        outputs[f"{domain}.logsumexp"] = torch.logsumexp(stacked, -1).float()
        outputs[f"{domain}.target_logit"] = stacked.gather(1, targets[:, None])[:, 0].float()
        counts[domain] = len(keys)
    save_file(outputs, str(folder / "outputs.safetensors"))
    inputs = {d: int((~e["input_mask"]).sum()) for d, e in mod_dict.items()}
    return {"shape": shape, "ml4m_configs": [SHAPES[shape], data_cfg_path, dataset["alphas_config"]],
            "domains_in": config["domains_in"], "domains_out": config["domains_out"],
            "not_mapped": unmapped, "dim": DIM, "heads": HEADS, "layers": list(LAYERS),
            "batch": BATCH, "num_input_tokens": num_input, "num_target_tokens": num_target, "seed": seed,
            "tok_rgb_inputs": "none (tok_rgb@224's input alphas set to 0: rgb enters as rgb@224 pixels)",
            "weights": "coarse_random: LayerNorm 1 + N(0, .25) in 1/16 steps, token tables and heads N(0, .5) in "
                       "1/4 steps, the rest N(0, .5) in 1/16 steps; saved by FM.save_pretrained (float32)",
            "model_safetensors_sha256": hashlib.sha256(weights).hexdigest(),
            "precision": "float64 (FM.double()); logits stored as float32", "first_logits": FIRST_LOGITS,
            "inputs_per_domain": inputs, "targets_per_domain": counts,
            "losses": {m: float(v) for m, v in losses.items()}}


def compare_at_scale(ref, shape: str, dim: int, layers: tuple[int, int], heads: int, seed: int) -> dict:
    """The issue-64 measurement: ml-4m's FM with *all* of ``shape``'s domains (ours and those we drop) at ``dim``,
    ml-4m's own initialisation, saved by ``save_pretrained`` and imported by ``import_ml4m``; both run in float32 on a
    ``UnifiedMasking`` batch of the domains we map. Per modality: target tokens, the largest logit difference and
    how often the two argmaxes agree."""
    from fourm_kfp.model.ml4m import import_ml4m
    from ml4m_reference import ours_from_ml4m

    path = ref.path
    info = shape_of(path, shape)
    torch.manual_seed(seed)
    fm = ref.fm.FM(config=fm_config(info.domains_in, info.domains_out, dim, layers, heads)).eval()
    with tempfile.TemporaryDirectory(prefix="ml4m-fm-") as tmp:
        fm.save_pretrained(tmp)
        model, report = import_ml4m(tmp)
    mapped = fm_config([d for d in info.domains_in if d in MAPPED], [d for d in info.domains_out if d in MAPPED],
                       dim, layers, heads)
    mod_dict = masked_batch(path, info, mapped, seed)[0]
    theirs = ml4m_target_logits(fm, mod_dict, info.num_input, info.num_target)
    specs = model.args.modalities
    domains = {s.name: (PIXEL_DOMAIN if s.pixel_input else DOMAINS[s.name].name, DOMAINS[s.name].name) for s in specs}
    batch, index = ours_from_ml4m(mod_dict, specs, domains)
    per_modality = {}
    with torch.no_grad():
        hidden = model.decode(model.encode(batch), batch)
        for m, spec in enumerate(specs):
            slots = torch.nonzero(batch.dec_valid & (batch.dec_modality == m)).tolist()
            ours = {(domains[spec.name][1], b, int(index[b, j])): model.logits(hidden[b, j], m) for b, j in slots}
            keys = sorted(k for k in theirs if k[0] == domains[spec.name][1])
            if sorted(ours) != keys:
                raise AssertionError(f"{spec.name}: the target tokens differ from ml-4m's")
            per_modality[spec.name] = {
                "targets": len(keys),
                "max_abs_diff": max(float((ours[k] - theirs[k]).abs().max()) for k in keys) if keys else 0.0,
                "argmax_agreement": (sum(int(ours[k].argmax() == theirs[k].argmax()) for k in keys) / len(keys)
                                     if keys else None)}
    return {"shape": shape, "dim": dim, "layers": list(layers), "heads": heads, "weights": "ml-4m's own init",
            "imported_tensors": len(report.imported), "dropped_domains": report.dropped_domains,
            "max_abs_diff": max(v["max_abs_diff"] for v in per_modality.values()), "per_modality": per_modality}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", default=None, help="ml-4m checkout (default $FOURM_REFERENCE or /tmp/ml-4m)")
    parser.add_argument("--reference-commit", default="", help="the checkout's commit, recorded in the manifest")
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compare", action="store_true",
                        help="write nothing: compare our import with ml-4m at --dim/--layers/--heads (every domain)")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--layers", type=int, nargs=2, default=(2, 2))
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--out", type=Path, default=OUT, help=f"where the fm_<shape> folders go (default {OUT})")
    args = parser.parse_args(argv)
    path = reference_path(args.reference)
    if path is None:
        raise SystemExit("no ml-4m checkout: give --reference PATH or set FOURM_REFERENCE")
    if "torchvision" not in sys.modules:  # .venv-ml4m's CUDA torchvision wheel: its C++ ops do not load on a CPU
        sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
        STAND_INS.append("torchvision._meta_registrations (empty)")
    ref = load_reference(path, modality_info="real")
    torch.set_num_threads(2)
    import einops
    import huggingface_hub
    import safetensors
    import tokenizers

    versions = {m.__name__: m.__version__ for m in (torch, np, tokenizers, huggingface_hub, einops, safetensors)}
    command = "PYTHONPATH=src .venv-ml4m/bin/python bench/ml4m_fm_reference.py " + " ".join(
        sys.argv[1:] if argv is None else argv)
    if args.compare:
        results = {"command": command, "reference_commit": args.reference_commit, "versions": versions,
                   **{shape: compare_at_scale(ref, shape, args.dim, tuple(args.layers), args.heads, args.seed)
                      for shape in args.shapes}}
        print(json.dumps(results, indent=1))
        return results
    results = {}
    for shape in args.shapes:
        result = {"command": command, "reference_commit": args.reference_commit, "python": platform.python_version(),
                  "versions": versions, "stand_ins": list(STAND_INS), **write_reference(ref, shape, args.out, args.seed)}
        (args.out / f"fm_{shape}" / "manifest.json").write_text(json.dumps(result, indent=2) + "\n")
        results[shape] = result
    print(json.dumps({s: {"targets": r["targets_per_domain"], "losses": r["losses"]} for s, r in results.items()},
                     indent=1))
    return results


if __name__ == "__main__":
    main()
