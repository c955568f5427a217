"""Does a model that has memorised 16-24 scenes draw each scene's image from its semseg map, under which samplings?

The learning tests' parts (learning_parts.py, a copy of those in tests/test_learning.py: tokenizers, the loader's
masking, the trainer's step); rgb read as pixels (generation reads each step's kept tokens back as decoded pixels)
and, with --tokens, as tokens too.
    .venv/bin/python experiments/2026-11-26-layout-to-rgb-zen4/memorised_layout_to_rgb.py STEPS SCENES [--tokens]
"""
import sys, time, json
from pathlib import Path
import numpy as np, torch
import learning_parts as L  # beside this script: the learning tests' parts, copied
from fourm_kfp.masking.dirichlet_masking import MixtureComponent
from fourm_kfp.model.generation import Generator, SamplingArgs

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1500
t0 = time.time()
tok = L.tokenizers()
print("tokenizers", time.time() - t0, flush=True)
n_sc = int(sys.argv[2]) if len(sys.argv) > 2 else 24
scenes = L.tokenize(tok, L.render(seed=1, count=n_sc))
truth_rgb = np.stack([s["rgb"] for s in scenes]).astype(np.float32)
ceil = tok["rgb"].decode(torch.as_tensor(np.stack([s["tokens"]["rgb"].reshape(L.GRID, L.GRID) for s in scenes])))
def mse(a): return float(((a.astype(np.float32) - truth_rgb) ** 2).mean())
print("ceiling mse", mse(ceil))
MIX = (MixtureComponent(1.0, (0.0, 1.0, 0.0), (1.0, 0.0, 0.0)), MixtureComponent(1.0, (1.0, 1.0, 1.0), (1.0, 1.0, 0.0)))
SAMPLINGS = {"argmax1": SamplingArgs(steps=1, temperature=0.0), "maskgit8-greedy": SamplingArgs(steps=8, temperature=0.0),
             "roar16-t1": SamplingArgs(steps=16, order="roar", temperature=1.0),
             "roar16-t1-g3": SamplingArgs(steps=16, order="roar", temperature=1.0, guidance=3.0)}
out = {}
for pixels in ((True, False) if "--tokens" in sys.argv else (True,)):
    t0 = time.time()
    model = L.train(scenes, pixels, steps=steps, mixture=MIX)
    print("train", pixels, time.time() - t0, flush=True)
    gen = Generator(model, pixel_decoders={"rgb": tok["rgb"].decode} if pixels else None)
    inputs = [{"semseg": s["tokens"]["semseg"]} for s in scenes]
    others = [{"semseg": scenes[(i + 1) % len(scenes)]["tokens"]["semseg"]} for i in range(len(scenes))]
    true_tokens = np.stack([s["tokens"]["rgb"] for s in scenes])
    for name, args in SAMPLINGS.items():
        g = np.stack([x.tokens.reshape(-1) for x in gen.generate(inputs, "rgb", args)])
        go = np.stack([x.tokens.reshape(-1) for x in gen.generate(others, "rgb", args)])
        img = tok["rgb"].decode(torch.as_tensor(g.reshape(-1, L.GRID, L.GRID)))
        imgo = tok["rgb"].decode(torch.as_tensor(go.reshape(-1, L.GRID, L.GRID)))
        r = {"token_acc": float((g == true_tokens).mean()), "acc_other_vs_this": float((go == true_tokens).mean()), "acc_other_vs_other": float((go == np.roll(true_tokens, -1, 0)).mean()), "mse": mse(img), "mse_other": mse(imgo)}
        out[f"{'pixels' if pixels else 'tokens'}/{name}"] = r
        print(pixels, name, r, flush=True)
json.dump(out, open(Path(__file__).with_name(f"memorised_layout_to_rgb-{steps}-{n_sc}.json"), "w"), indent=1)  # beside this script
