"""How much of an rgb token a layout determines: plug-in entropies of the val scenes' rgb tokens, alone, given the
position, given the same position's semseg token (and its row), and the held-out cross-entropy of a lookup table
p(rgb token | semseg token) fitted on half the scenes.
    .venv/bin/python experiments/2026-11-26-layout-to-rgb-zen4/token_entropy.py demo runs/demo 256
"""
import sys
from pathlib import Path
from collections import Counter
import numpy as np
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))  # the probes' run_outputs.py
from run_outputs import open_run_outputs  # noqa: E402
preset, root, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
scenes = open_run_outputs(preset, root, scenes=n).scenes
rgb = np.stack([np.asarray(t).reshape(-1) for t in scenes.tokens["rgb"]])
sem = np.stack([np.asarray(t).reshape(-1) for t in scenes.tokens["semseg"]])
def H(x):
    c = np.array(list(Counter(x).values()), float); p = c / c.sum(); return float(-(p * np.log(p)).sum())
def Hc(y, x):  # H(y|x) plug-in
    tot = 0.0; N = len(y)
    for v in np.unique(x):
        m = x == v; tot += m.sum() / N * H(y[m])
    return tot
pos = np.tile(np.arange(rgb.shape[1]), rgb.shape[0])
r, s = rgb.reshape(-1), sem.reshape(-1)
print("pairs", r.size, "H(rgb)", H(r), "H(rgb|pos)", Hc(r, pos), "H(rgb|sem)", Hc(r, s), "H(rgb|sem,row)", Hc(r, s * 100 + pos // 16))
print("distinct rgb", len(set(r)), "distinct sem", len(set(s)))
# split train/val halves for held-out CE estimate of a lookup table p(rgb|sem) with add-alpha smoothing
half = rgb.shape[0] // 2
tr_r, tr_s = rgb[:half].reshape(-1), sem[:half].reshape(-1); va_r, va_s = rgb[half:].reshape(-1), sem[half:].reshape(-1)
V = 512
for alpha in (0.01, 0.1):
    table = {}
    for a, b in zip(tr_s, tr_r): table.setdefault(a, Counter())[b] += 1
    glob = Counter(tr_r)
    ce = 0.0
    for a, b in zip(va_s, va_r):
        c = table.get(a, Counter()); tot = sum(c.values())
        p = (c[b] + alpha * (glob[b] + 1) / (len(tr_r) + V)) / (tot + alpha) if tot else (glob[b] + 1) / (len(tr_r) + V)
        ce -= np.log(p)
    print("held-out CE of lookup p(rgb|sem same pos), alpha", alpha, ce / len(va_r))
