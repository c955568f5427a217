"""The learning tests' parts this experiment's two memorisation scripts train with, copied from
``tests/test_learning.py`` (commit 90e2bea) so that no experiment imports the test suite: 32-px synthetic scenes,
conv VQ-VAEs for rgb, semseg and normal (256 codes, 8x8 tokens), and a 2+2-layer ``FourM`` of width 128 trained
through the loader's masking and the trainer's step, in the precision ``precision: auto`` picks.

If the tests' parts change, this copy does not: it is what the figures of this folder's README were made with.
"""

from __future__ import annotations

import numpy as np
import torch

from fourm_kfp.batch import ModalitySpec
from fourm_kfp.config.fourm_config import OptimizerConfig
from fourm_kfp.data.synthetic_scenes import synthetic_sample
from fourm_kfp.hardware import resolve_precision
from fourm_kfp.masking.dirichlet_masking import MixtureComponent
from fourm_kfp.masking.multimodal_masking import MaskingArgs, collate, mask_sample
from fourm_kfp.model.fourm import FourM, FourMArgs
from fourm_kfp.model.parallelize import parallelize
from fourm_kfp.tokenizers import VQVAE, VQVAEConfig, fit_normalisation
from fourm_kfp.tokenizers.training import train_vqvae
from fourm_kfp.train.optimizer import Schedule, build_optimizer, set_learning_rate
from fourm_kfp.train.step import StepSettings, train_step

SIZE, PATCH = 32, 4
GRID = SIZE // PATCH
MODALITIES = ("rgb", "semseg", "normal")
#: 4M's two kinds of draw over (rgb, semseg, normal): rgb alone in, and every modality in part
MIXTURE = (MixtureComponent(1.0, (1.0, 0.0, 0.0), (0.0, 1.0, 1.0)),
           MixtureComponent(1.0, (1.0, 1.0, 1.0), (0.0, 1.0, 1.0)))


def render(seed: int, count: int) -> list[dict]:
    return [synthetic_sample(seed, i, SIZE) for i in range(count)]


def tokenizers() -> dict[str, VQVAE]:
    """rgb, semseg and normal conv VQ-VAEs (256 codes, 8x8 tokens at 32 px) trained on 512 scenes."""
    scenes = render(seed=100, count=512)
    out = {}
    for modality in MODALITIES:
        arrays = np.stack([s[modality] for s in scenes])
        config = VQVAEConfig.for_modality(modality, image_size=SIZE, patch_size=PATCH, hidden_dim=64, depth=1,
                                          codebook_size=256, code_dim=32, ema_decay=0.9,
                                          norm_stats=fit_normalisation(modality, arrays))
        rng = np.random.default_rng(0)
        out[modality], _ = train_vqvae(config, lambda step: {modality: arrays[rng.integers(0, len(arrays), 8)]},
                                       steps=600, lr=4e-3, log_every=10**9)
    return out


def tokenize(tokenizers: dict[str, VQVAE], scenes: list[dict]) -> list[dict]:
    """Each scene with its ``tokens`` per modality (flat grids)."""
    grids = {m: tokenizers[m].encode(np.stack([s[m] for s in scenes])).reshape(len(scenes), -1).numpy()
             for m in MODALITIES}
    return [{**s, "tokens": {m: grids[m][i] for m in MODALITIES}} for i, s in enumerate(scenes)]


def specs(pixels: bool) -> tuple[ModalitySpec, ...]:
    rgb = ModalitySpec("rgb", "image", 256, grid=(GRID, GRID), pixel_input=pixels, patch_size=PATCH if pixels else 0)
    return (rgb, *(ModalitySpec(m, "image", 256, grid=(GRID, GRID)) for m in ("semseg", "normal")))


def train(scenes: list[dict], pixels: bool, steps: int, batch: int = 16, seed: int = 0,
          mixture: tuple[MixtureComponent, ...] = MIXTURE) -> FourM:
    """A 2+2-layer model of width 128 over (rgb, semseg, normal), every draw's budgets one grid, masked by
    ``mixture`` as the loader masks; rgb enters as pixel patches when ``pixels``, else as tokens."""
    torch.manual_seed(seed)
    model_specs = specs(pixels)
    model = FourM(FourMArgs(model_specs, encoder_layers=2, decoder_layers=2, dim=128, heads=4))
    trunk = parallelize(model)
    masking = MaskingArgs(model_specs, input_budget=GRID * GRID, target_budget=GRID * GRID,
                          mixture=mixture, sentinels=())
    optimizer = build_optimizer(model, OptimizerConfig(), peak_lr=2e-3)
    schedule = Schedule(2e-3, warmup_steps=20, total_steps=steps, min_lr_ratio=0.1)
    settings = StepSettings(resolve_precision("auto", torch.device("cpu")), 1.0, model.args.names)
    rng = np.random.default_rng(seed)
    for step in range(steps):
        set_learning_rate(optimizer, schedule.lr(step))
        samples = [mask_sample(rng, masking, {s.name: scenes[i]["tokens"][s.name].reshape(GRID, GRID)
                                              for s in model_specs}, scenes[i]["rgb"])
                   for i in rng.integers(0, len(scenes), batch)]
        train_step(trunk, optimizer, [collate(samples, masking)], settings, torch.device("cpu"))
    return model.eval()
