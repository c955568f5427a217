"""The same memorised semseg -> rgb model (16 scenes) with the read-back decoder right, transposed, shifted by one
patch, or absent: whether drawing the image from its layout depends on reading the kept tokens back.
    .venv/bin/python experiments/2026-11-26-layout-to-rgb-zen4/read_back_sensitivity.py 1500
"""
import sys
import numpy as np
import learning_parts as L  # beside this script: the learning tests' parts, copied
from fourm_kfp.masking.dirichlet_masking import MixtureComponent
from fourm_kfp.model.generation import Generator, SamplingArgs
tok = L.tokenizers()
scenes = L.tokenize(tok, L.render(seed=4, count=16))
MIX = (MixtureComponent(1.0, (0.0, 1.0, 0.0), (1.0, 0.0, 0.0)), MixtureComponent(1.0, (1.0, 1.0, 1.0), (1.0, 1.0, 0.0)))
model = L.train(scenes, True, steps=int(sys.argv[1]), mixture=MIX)
truth = np.stack([s["tokens"]["rgb"] for s in scenes])
dec = tok["rgb"].decode
decoders = {"right": dec, "transposed": lambda g: np.ascontiguousarray(dec(g).transpose(0, 2, 1, 3)),
            "shifted": lambda g: np.roll(dec(g), 4, axis=2), "none": None}
for name, d in decoders.items():
    gen = Generator(model, pixel_decoders={"rgb": d} if d else None)
    for sname, args in {"roar16-t1": SamplingArgs(steps=16, order="roar", temperature=1.0),
                        "roar16-t1-g3": SamplingArgs(steps=16, order="roar", temperature=1.0, guidance=3.0)}.items():
        g = np.stack([x.tokens.reshape(-1) for x in gen.generate([{"semseg": s["tokens"]["semseg"]} for s in scenes], "rgb", args)])
        print(name, sname, float((g == truth).mean()), flush=True)
