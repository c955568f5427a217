"""A trained model's cross-entropy of the true rgb tokens given the caption, N of the scene's semseg tokens (at random
positions) and K of its rgb tokens (read as the pixels of the rgb tokens decoded), per scored position, split by
whether the same position's semseg token is among the inputs (the training input budget is 64 tokens).
    .venv/bin/python experiments/2026-11-26-layout-to-rgb-zen4/layout_cross_entropy.py demo runs/demo 64
"""
import sys, json, time
from pathlib import Path
import numpy as np, torch
from fourm_kfp.masking.multimodal_masking import MaskedSample, MaskingArgs, collate
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))  # the probes' run_outputs.py
from run_outputs import open_run_outputs  # noqa: E402

preset, root, n_scenes = sys.argv[1], sys.argv[2], int(sys.argv[3])
run = open_run_outputs(preset, root, scenes=n_scenes)
engine, scenes = run.engine, run.scenes
model = engine.generator.model
names = model.args.names
M = {n: names.index(n) for n in names}
P = engine.specs["rgb"].num_positions
decoded = engine.detokenize("rgb", scenes.tokens["rgb"])
rng = np.random.default_rng(0)

@torch.inference_mode()
def ce(n_semseg, n_rgb, caption=True, true_pixels=False, bs=32):
    """Per-target-position CE of rgb tokens at positions not given as rgb input; returns mean CE and CE split by
    whether the same position's semseg is visible."""
    tot, cnt, vis_tot, vis_cnt = 0.0, 0, 0.0, 0
    for start in range(0, len(scenes), bs):
        idx = range(start, min(start + bs, len(scenes)))
        samples, vis_masks = [], []
        for i in idx:
            enc = []
            if caption:
                c = np.asarray(scenes.tokens["caption"][i], np.int64)
                enc.append(np.stack([c, np.full(c.size, M["caption"]), np.arange(c.size)], 1))
            sem = np.asarray(scenes.tokens["semseg"][i]).reshape(-1)
            sp = np.sort(rng.permutation(P)[:n_semseg])
            enc.append(np.stack([sem[sp], np.full(sp.size, M["semseg"]), sp], 1))
            rgb = np.asarray(scenes.tokens["rgb"][i]).reshape(-1)
            rp = np.sort(rng.permutation(P)[:n_rgb])
            enc.append(np.stack([np.zeros(rp.size, np.int64), np.full(rp.size, M["rgb"]), rp], 1))
            tp = np.setdiff1d(np.arange(P), rp)
            dec = np.stack([np.zeros(tp.size, np.int64), rgb[tp], np.full(tp.size, M["rgb"]), tp], 1)
            pix = scenes.truth["rgb"][i] if true_pixels else decoded[i]
            samples.append(MaskedSample(np.concatenate(enc).astype(np.int64), dec.astype(np.int64), np.asarray(pix)))
            v = np.zeros(P, bool); v[sp] = True
            vis_masks.append(v[tp])
        width = max(len(s.enc) for s in samples)
        args = MaskingArgs(model.args.modalities, input_budget=width, target_budget=P, mixture=(), sentinels=())
        batch = collate(samples, args).to(engine.device)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=engine.generator.autocast):
            hidden = model.decode(model.encode(batch), batch)
            logits = model.logits(hidden, M["rgb"]).float()
        lp = logits.log_softmax(-1)
        tgt = batch.dec_targets
        valid = tgt >= 0
        nll = -lp.gather(-1, tgt.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        for j, v in enumerate(vis_masks):
            row = nll[j][valid[j]].numpy()
            tot += row.sum(); cnt += row.size
            vis_tot += row[v].sum(); vis_cnt += int(v.sum())
    return {"ce": float(tot / cnt), "ce_semseg_visible": float(vis_tot / max(vis_cnt, 1)), "ce_semseg_hidden": float(
            (tot - vis_tot) / max(cnt - vis_cnt, 1))}

out = {}
t0 = time.time()
for ns in (0, 16, 32, 64, 128, 256):
    out[f"semseg{ns}"] = ce(ns, 0); print("semseg", ns, out[f"semseg{ns}"], flush=True)
for draw, nr in enumerate((32, 64, 128, 192)):
    out[f"semseg256+rgb{nr}"] = ce(256, nr); print("semseg256+rgb", nr, out[f"semseg256+rgb{nr}"], flush=True)
    out[f"semseg0+rgb{nr}"] = ce(0, nr); print("semseg0+rgb", nr, out[f"semseg0+rgb{nr}"], flush=True)
    # the same inputs drawn again at other random positions: the spread of the figures above
    key = f"semseg32+rgb32 (draw {draw + 1})"
    out[key] = ce(32, 32); print(key, out[key], flush=True)
print(time.time() - t0)
json.dump(out, open(Path(__file__).with_name(f"layout_cross_entropy-{preset}.json"), "w"), indent=1)  # beside this script
