"""Learning tests: the 4M model learns where things are, through the pipeline's own parts.

Scenes come from the synthetic renderer, tokens from conv VQ-VAEs trained here, batches from the loader's masking
(:func:`mask_sample`/:func:`collate`, 4M's two kinds of draw: rgb alone in, and every modality in part), updates
from the trainer's :func:`train_step` with its optimizer and schedule, maps from the :class:`Generator` with the
evaluation's sampling of a map (one argmax pass, ``evaluate.map_steps``) and with 8-step MaskGIT (which feeds the
tokens it keeps back to the encoder), decoded by the tokenizers and scored with the evaluation's metrics against the **tokenizer ceiling** (the ground truth's own tokens
decoded: what a perfect token predictor scores). Each rgb test runs with rgb entering the encoder as pixel patches
and as rgb tokens.

One rgb model per input path serves the first two (trained once, on 4 scenes, the same scenes shifted by whole
patches and mirrored: 12 images):

* **overfit**: on those 12 images, rgb -> semseg and rgb -> normal reach 0.9 of the ceiling in one pass, 0.7 with
  MaskGIT;
* **the map follows the scene**: the map generated for a shifted (mirrored) scene is the shifted (mirrored) map, not
  the map of the scene as it was;
* **the map follows the caption**: trained caption -> semseg on 16 scenes, the map generated from a scene's caption
  is that scene's map, and drawn from another scene's caption it is not (the text input path).

These are memorisation tests (a few scenes): they prove the parts carry where things are from the image (or the
caption) to the map (pixel normalisation, patch order, positions, tokenizer alignment, masking, the decoder's
context, MaskGIT decoding, a text input's embeddings), not that a model generalises; the evaluation stage measures
that. The first demo model failed the
second: its maps were one blob in the middle whatever the input, and a mirrored image gave the same logits
(``docs/records/``, the record of what the model learns, says what was found and changed). Minute-long: marked
``learning`` (``make test`` runs them; ``-m "not learning"`` leaves them out).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest
import torch

from fourm_kfp.batch import ModalitySpec
from fourm_kfp.config.fourm_config import EvaluateConfig, OptimizerConfig
from fourm_kfp.config.schema import to_dict
from fourm_kfp.data.synthetic_scenes import synthetic_sample
from fourm_kfp.evaluation.dense_metrics import normal_stats, semseg_stats
from fourm_kfp.hardware import resolve_precision
from fourm_kfp.masking.dirichlet_masking import MixtureComponent
from fourm_kfp.masking.multimodal_masking import MaskingArgs, collate, mask_sample
from fourm_kfp.model.fourm import FourM, FourMArgs
from fourm_kfp.model.generation import Generator, SamplingArgs
from fourm_kfp.model.parallelize import parallelize
from fourm_kfp.tokenizers import VQVAE, VQVAEConfig, fit_normalisation
from fourm_kfp.tokenizers.training import train_vqvae
from fourm_kfp.train.optimizer import Schedule, build_optimizer, set_learning_rate
from fourm_kfp.train.step import StepSettings, train_step
from tests.worker_sharing import made_once

pytestmark = pytest.mark.learning

SIZE, PATCH = 32, 4
GRID = SIZE // PATCH
MODALITIES = ("rgb", "semseg", "normal")
#: the evaluation's sampling of a map read off an image (``evaluate.sampling`` with ``evaluate.map_steps``: one
#: argmax pass over the grid), and the 8-step MaskGIT it used before (kept tokens go back into the encoder)
_EVALUATION = EvaluateConfig()
SAMPLING = replace(SamplingArgs(**to_dict(_EVALUATION.sampling)), steps=_EVALUATION.map_steps)
MASKGIT = SamplingArgs(steps=8, order="maskgit", schedule="cosine", temperature=0.0)
#: the fraction of the ceiling MaskGIT must keep. On the shared scene model (2000 steps, 24 images; 2026-11-26, 2-core
#: Zen 4) it kept 0.89-0.97 of semseg and 0.99-1.0 of normal, pixels and tokens, seeds 0-1 in bf16 and seed 0 in fp32,
#: where one pass reached 1.0 (a model trained on rgb inputs alone kept 0.71 of semseg: fed back, its own tokens were
#: inputs it had never seen; hence MIXTURE); at 800 steps on 12 images (2026-12-02, 2-core EPYC, seeds 0-4) 0.80-0.91
MASKGIT_BAR = 0.7
#: (metric, higher is better) compared with the ceiling: the fraction of the ceiling's score the model reaches
SCORES = {"semseg": "miou", "normal": "within_11_25"}
#: 4M's two kinds of draw, over (rgb, semseg, normal): rgb alone in, and every modality in part. MaskGIT feeds the
#: tokens it has fixed back to the encoder, so the model must have learnt to read semseg and normal as inputs:
#: trained on rgb inputs alone, a model whose single argmax pass scored the ceiling lost 30% of it in 8 steps.
MIXTURE = (MixtureComponent(1.0, (1.0, 0.0, 0.0), (0.0, 1.0, 1.0)), MixtureComponent(1.0, (1.0, 1.0, 1.0), (0.0, 1.0, 1.0)))


def render(seed: int, count: int) -> list[dict]:
    return [synthetic_sample(seed, i, SIZE) for i in range(count)]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory, worker_id) -> dict[str, VQVAE]:
    """rgb, semseg and normal conv VQ-VAEs (256 codes, 8x8 tokens at 32 px) trained on 512 scenes, once for all
    the xdist workers (each of this module's three units may run on another)."""
    return made_once(tmp_path_factory, worker_id, "learning-tokenizers", lambda _folder: train_tokenizers(),
                     save=lambda trained, path: torch.save(trained, path),
                     load=lambda path: torch.load(path, weights_only=False))


def train_tokenizers() -> dict[str, VQVAE]:
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
          model_specs: tuple[ModalitySpec, ...] | None = None,
          mixture: tuple[MixtureComponent, ...] = MIXTURE) -> FourM:
    """A 2+2-layer model of width 128 trained rgb -> {semseg, normal}: every rgb token in, the target budget (one
    grid) split between the two targets by the Dirichlet draw, as the loader masks. ``model_specs`` and ``mixture``
    train other modalities (a sequence modality's tokens: the scene's id list)."""
    torch.manual_seed(seed)
    model_specs = model_specs or specs(pixels)
    model = FourM(FourMArgs(model_specs, encoder_layers=2, decoder_layers=2, dim=128, heads=4))
    trunk = parallelize(model)
    masking = MaskingArgs(model_specs, input_budget=GRID * GRID, target_budget=GRID * GRID,
                          mixture=mixture, sentinels=())
    optimizer = build_optimizer(model, OptimizerConfig(), peak_lr=2e-3)
    schedule = Schedule(2e-3, warmup_steps=20, total_steps=steps, min_lr_ratio=0.1)
    # The precision `precision: auto` picks here, as the pipeline trains (the Generator's default is the same rule):
    # bf16 autocast on a CPU with native bf16, fp32 elsewhere. The shared scene model's maps scored alike in both
    # (one pass 1.000 of the ceiling everywhere, MaskGIT 0.89-1.00; training 130-150 s in bf16, 160 s in fp32, on a
    # 2-core Zen 4, 2026-11-26), and the caption test's too (0.893, the ceiling; 0.233 from another scene's caption).
    settings = StepSettings(resolve_precision("auto", torch.device("cpu")), 1.0, model.args.names)
    rng = np.random.default_rng(seed)
    for step in range(steps):
        set_learning_rate(optimizer, schedule.lr(step))
        samples = [mask_sample(rng, masking, {s.name: scenes[i]["tokens"][s.name].reshape(GRID, GRID)
                                              if s.kind == "image" else list(scenes[i]["tokens"][s.name])
                                              for s in model_specs}, scenes[i]["rgb"])
                   for i in rng.integers(0, len(scenes), batch)]
        train_step(trunk, optimizer, [collate(samples, masking)], settings, torch.device("cpu"))
    return model.eval()


def generate(model: FourM, tokenizers: dict[str, VQVAE], scenes: list[dict], target: str,
             sampling: SamplingArgs = SAMPLING) -> np.ndarray:
    """Decoded maps of ``target`` generated from each scene's rgb (pixels or tokens, as the model reads it)."""
    pixels = model.args.modalities[0].pixel_input
    inputs = [{"rgb": s["tokens"]["rgb"], **({"pixels": s["rgb"]} if pixels else {})} for s in scenes]
    generated = Generator(model).generate(inputs, target, sampling)
    return tokenizers[target].decode(torch.as_tensor(np.stack([g.tokens for g in generated])))


def score(target: str, predicted: np.ndarray, truth: np.ndarray, region: np.ndarray | None = None) -> float:
    if region is not None:  # score the pixels of the region only (a whole-image mask of the same shape)
        predicted, truth = predicted[:, region][:, None], truth[:, region][:, None]
    stats = semseg_stats(predicted, truth) if target == "semseg" else normal_stats(predicted, truth)
    return stats.whole()[SCORES[target]]


def ceiling(tokenizers: dict[str, VQVAE], scenes: list[dict], target: str) -> np.ndarray:
    grids = np.stack([s["tokens"][target].reshape(GRID, GRID) for s in scenes])
    return tokenizers[target].decode(torch.as_tensor(grids))


def shift(array: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Rolled by whole patches down and right (``[N, H, W, ...]``)."""
    return np.roll(array, (rows * PATCH, cols * PATCH), axis=(1, 2))


def mirror(modality: str, array: np.ndarray) -> np.ndarray:
    """Mirrored left-right (``[N, H, W, ...]``); a normal's x component changes sign (camera frame, x right)."""
    out = array[:, :, ::-1].copy()
    if modality == "normal":
        out[..., 0] *= -1
    return out


#: the scenes the rgb model of the overfit and follow tests trains on, each also shifted and mirrored, and its
#: training steps (rgb as pixel patches or as tokens). With MIXTURE, half the draws hide part of rgb. On 8 scenes (24
#: images): at 800 steps the pixel model's one pass scored 0.63-0.75 of the ceiling on the mirrored scenes' semseg, at
#: 1500 1.00 (seeds 0-1); after a change of the loss's rounding alone (the same losses to 1e-7 over 300 steps on random
#: tokens) seed 0's pixel model scored 0.73 there at 1500, and 2000 steps were kept; at 1000 the token model failed
#: (seed 0: 0.83), at 1400 the closest check over seeds 0-4 was 0.94. On 4 scenes (12 images), 2026-12-02 (2-core
#: EPYC, bf16, the closest score to its bar over every check of both tests, seeds 0-4): at 700 steps the pixel and
#: token models of seed 4 failed (0.85 and 0.895 against 0.9); at 800 every check passed, the closest 0.93 (pixels,
#: seed 4, mirrored semseg), MaskGIT 0.80-0.91 against its 0.7, in 45-57 s of training a model on one thread where
#: 1400 steps on 8 scenes took 77 s (docs/records/2026-12-02-test-suite-time.md). A model that reads what is in the
#: image but not where still fails: the map of the scene as it was scores 0.21 (shifted) and 0.44 (mirrored) of the
#: moved semseg's ceiling.
SCENES, STEPS = 4, 800
#: the fraction of the ceiling a moved scene's map must reach in one pass (test_the_generated_map_follows_the_scene);
#: measured at 2000 steps on 8 scenes (seeds 0-1 in bf16, 0 in fp32): 1.00 for every map, pixels and tokens (on 4
#: scenes at 800 steps, seeds 0-4: 0.93-1.00), where the map of the scene as it was scores 0.21-0.22 (shifted
#: semseg), 0.42-0.44 (mirrored semseg), 0.68-0.72 and 0.91-0.92 (normal: mostly ground, which does not move)
FOLLOW_BAR = 0.9
#: how the follow test moves a scene: by whole patches (2 down, 3 right), and mirrored left-right
MOVES = {"shifted": lambda m, a: shift(a, 2, 3), "mirrored": mirror}


@dataclass(frozen=True)
class SceneModel:
    """A model trained on ``scenes``' rgb -> {semseg, normal}: 4 scenes, then the same scenes moved by each of
    :data:`MOVES` (``moved[name]``, index for index), tokenized."""

    model: FourM
    originals: list[dict]
    moved: dict[str, list[dict]]

    @property
    def scenes(self) -> list[dict]:
        return trained_images(self.originals, self.moved)


def trained_images(originals: list[dict], moved: dict[str, list[dict]]) -> list[dict]:
    """The 12 images the scene model trains on, in order: the originals, then each move's copies."""
    return originals + [s for name in MOVES for s in moved[name]]


@pytest.fixture(scope="module", params=[True, False], ids=["rgb-pixels", "rgb-tokens"])
def scene_model(request, tokenizers) -> SceneModel:
    """One model per rgb input path (pixel patches, tokens), trained once for the overfit and the follow tests: 4
    scenes, their copies shifted by whole patches and mirrored (12 images)."""
    originals = render(seed=2, count=SCENES)
    moved = {name: [{m: move(m, s[m][None])[0] for m in MODALITIES} for s in originals]
             for name, move in MOVES.items()}
    originals, moved = tokenize(tokenizers, originals), {n: tokenize(tokenizers, v) for n, v in moved.items()}
    model = train(trained_images(originals, moved), request.param, steps=STEPS)
    return SceneModel(model, originals, moved)


def test_overfits_rgb_to_semseg_and_normal_to_the_tokenizer_ceiling(tokenizers, scene_model):
    """On the 12 images it was trained on, the map generated from each image's rgb reaches 0.9 of the tokenizer
    ceiling in one pass, and :data:`MASKGIT_BAR` of it with 8-step MaskGIT (its own tokens fed back as inputs)."""
    scenes, model = scene_model.scenes, scene_model.model
    failures = []
    for target in ("semseg", "normal"):
        truth = np.stack([s[target] for s in scenes])
        best = score(target, ceiling(tokenizers, scenes, target), truth)
        for name, sampling, bar in (("one pass", SAMPLING, 0.9), ("MaskGIT, 8 steps", MASKGIT, MASKGIT_BAR)):
            reached = score(target, generate(model, tokenizers, scenes, target, sampling), truth)
            if reached < bar * best:
                failures.append(f"rgb -> {target} ({name}): {SCORES[target]} {reached:.3f}, ceiling {best:.3f}")
    assert not failures, "; ".join(failures)


def test_the_generated_map_follows_the_scene(tokenizers, scene_model):
    """Trained on 4 scenes, their mirror images and the same scenes shifted by whole patches, the map generated
    for the mirrored (shifted) scene is the mirrored (shifted) map. A scene and its mirror image hold the same
    colours in the same amounts: a model that reads what is in the image but not where (the first demo model gave
    them the same logits) cannot tell the two maps apart."""
    failures = []
    for target in ("semseg", "normal"):
        truth = np.stack([s[target] for s in scene_model.originals])
        for name, move in MOVES.items():
            moved = scene_model.moved[name]
            generated = generate(scene_model.model, tokenizers, moved, target)
            follows, stays = score(target, generated, move(target, truth)), score(target, generated, truth)
            best = score(target, ceiling(tokenizers, moved, target), move(target, truth))
            if not (follows >= FOLLOW_BAR * best and follows > stays):
                failures.append(f"rgb -> {target}, {name} scene: {SCORES[target]} {follows:.3f} against the moved "
                                f"truth (ceiling {best:.3f}), {stays:.3f} against the scene as it was")
    assert not failures, "; ".join(failures)


#: training steps of test_the_generated_map_follows_the_caption. At 300, 400 and 600 steps (seeds 0-1 at 400) the maps
#: scored 0.88-0.89 mIoU against a ceiling of 0.89, and 0.23 when drawn from another scene's caption. With the caption's
#: word embeddings zeroed in the encoder (positions and modality left: the caption's length), 0.44: the test fails.
CAPTION_STEPS = 400


def test_the_generated_map_follows_the_caption(tokenizers):
    """Trained caption -> semseg (the whole caption the only input, as in a caption-only mixture component) on 16
    scenes with 16 different captions, the map generated from a scene's caption is that scene's map: the text input
    path (token and position embeddings of a sequence, the encoder's mask over a short input, cross-attention from
    image queries) carries what the caption says to the image target. Against each scene's truth, the map drawn from
    another scene's caption scores far lower: the map moves when the caption moves."""
    scenes, captions = [], set()
    for scene in render(seed=3, count=64):
        if scene["caption"] not in captions and len(scenes) < 16:
            captions.add(scene["caption"])
            scenes.append(scene)
    words = sorted({w for c in captions for w in c.split()})
    scenes = tokenize(tokenizers, scenes)
    for scene in scenes:  # a word-level vocabulary: the tokenizer is not what this test is about
        scene["tokens"]["caption"] = np.array([words.index(w) for w in scene["caption"].split()], np.int64)
    caption = ModalitySpec("caption", "sequence", len(words), max_length=32)
    semseg = ModalitySpec("semseg", "image", 256, grid=(GRID, GRID))
    model = train(scenes, pixels=False, steps=CAPTION_STEPS, model_specs=(semseg, caption),
                  mixture=(MixtureComponent(1.0, (0.0, 1.0), (1.0, 0.0)),))
    truth = np.stack([s["semseg"] for s in scenes])
    others = np.roll(np.arange(len(scenes)), 1)

    def generated(order) -> np.ndarray:
        inputs = [{"caption": scenes[i]["tokens"]["caption"]} for i in order]
        grids = [g.tokens for g in Generator(model).generate(inputs, "semseg", SAMPLING)]
        return tokenizers["semseg"].decode(torch.as_tensor(np.stack(grids)))

    best = score("semseg", ceiling(tokenizers, scenes, "semseg"), truth)
    follows = score("semseg", generated(range(len(scenes))), truth)
    shuffled = score("semseg", generated(others), truth)
    assert follows >= 0.9 * best and shuffled < 0.8 * follows, (
        f"caption -> semseg: mIoU {follows:.3f} from each scene's caption (ceiling {best:.3f}), {shuffled:.3f} from "
        f"another scene's caption")
