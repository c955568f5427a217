"""What caption-to-rgb's score is made of, on a trained model of a run folder.

caption-to-rgb is scored by the shapes the model's own semseg finds in the image it generated (the evaluate stage).
This probe takes that score apart, on the same val scenes, sampling and seed as the stage:

* ``generated``: the stage's score; ``generated_captions_shuffled``: the same images drawn from the captions of
  other scenes (a fixed derangement), scored against each scene's own caption. If the image follows its caption,
  shuffling costs F1; if the two are equal, the image does not depend on which shapes the caption names;
* ``read_true_pixels`` and ``read_true_tokens``: the model's reading of the true image, from its pixels and from
  its rgb tokens decoded (the stage's ceiling): what a perfect generator would score with this reader;
* ``constant_best`` (the stage's baseline, fitted on training captions) and ``constant_most_common``: one set of
  shapes for every scene;
* ``shapes_per_image``: how many shapes the reader finds in a generated image, against ``shapes_per_caption``;
* ``caption_cross_entropy``: per image target (semseg, rgb), the model's cross-entropy of the scene's true tokens
  (every position) with the scene's whole caption as the only input, and with another scene's (``shuffled``):
  how much the caption alone tells the model about the image. Equal means the model ignores the caption;
* ``caption_to_semseg``: the semseg map generated from the caption alone, its shapes read directly (no rgb in
  between), with the caption and with another scene's: in one argmax pass (``one_pass``: whether the model can
  draw the named shapes at all) and with caption-to-rgb's sampling (``sampled``);
* ``via_semseg``: a chain, as 4M generates: the semseg map from the caption first (``one_pass`` or ``sampled`` as
  above), then the image from the caption and that map, read as ``generated`` is (``shuffled``: both from another
  scene's caption); ``from_true_semseg``: the image from the caption and the scene's true semseg tokens, what the
  chain would score with a perfect first step;
* ``sweep`` (with ``--sweep``): ``generated``, ``generated_captions_shuffled``, ``from_true_semseg`` and
  ``via_semseg`` (after the semseg map ``sampled`` above) again under other sampling settings of the image, each
  given as ``key=value`` pairs over the evaluation's sampling (``--sweep temperature=0.5 --sweep
  temperature=0.7,guidance=1``): which settings draw images that follow their caption, and whether the generator
  draws a cleaner image from a perfect layout or from the chain's.

    .venv/bin/python experiments/tools/caption_to_rgb_probe.py --preset proof --root runs/proof [--sweep KEY=VALUE]

Prints one JSON object (``--output`` writes it too). The stage outputs are found by content address under
``--root``, as ``fourm-kfp stage`` finds them (``--set`` as there: :func:`run_outputs.open_run_outputs`, beside
this script). Not a benchmark: an experiment's probe (``experiments/README.md``).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import torch

from fourm_kfp.config.loader import load_config
from fourm_kfp.config.schema import to_dict
from fourm_kfp.evaluation import shape_presence as tm
from fourm_kfp.evaluation import targets
from fourm_kfp.evaluation.any_to_any import AnyToAny
from fourm_kfp.evaluation.tasks import Baselines, read_semseg
from fourm_kfp.hardware import reuse_freed_memory
from fourm_kfp.masking.multimodal_masking import MaskedSample, MaskingArgs, collate
from fourm_kfp.model.generation import SamplingArgs
from fourm_kfp.evaluation.scene_loading import train_ground_truth
from run_outputs import open_run_outputs  # beside this script

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))  # the benches' strict-JSON writer
from bench_output import emit  # noqa: E402


def _derangement(n: int, seed: int) -> list[int]:
    """A permutation of ``range(n)`` that moves every index (each scene gets another scene's caption)."""
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(n)
        if n < 2 or not np.any(order == np.arange(n)):
            return [int(i) for i in order]


def _scores(sets: list[frozenset[str]], true: list[frozenset[str]]) -> dict[str, float]:
    whole = tm.shape_set_f1(sets, true)
    return {"f1": whole["shape_presence_f1"], "precision": whole["shape_presence_f1.precision"],
            "recall": whole["shape_presence_f1.recall"]}


@torch.inference_mode()
def caption_cross_entropy(engine: AnyToAny, captions: list[np.ndarray], truth: list[np.ndarray], target: str,
                          batch_size: int) -> float:
    """Mean cross-entropy (nats a token: the model's own loss) of every position of ``target``'s true token grids,
    each scene's whole caption the only encoder input, batched as the loader would collate it."""
    model = engine.generator.model
    names = model.args.names
    caption, image = names.index("caption"), names.index(target)
    positions = engine.specs[target].num_positions
    masking = MaskingArgs(model.args.modalities, input_budget=max(len(c) for c in captions),
                          target_budget=positions, mixture=(), sentinels=())
    total, count = 0.0, 0
    for start in range(0, len(captions), batch_size):
        samples = []
        for ids, grid in zip(captions[start:start + batch_size], truth[start:start + batch_size]):
            ids = np.asarray(ids, np.int64)
            enc = np.stack([ids, np.full(ids.size, caption), np.arange(ids.size)], axis=1)
            dec = np.stack([np.zeros(positions, np.int64), np.asarray(grid, np.int64).reshape(-1),
                            np.full(positions, image), np.arange(positions)], axis=1)
            samples.append(MaskedSample(enc, dec))
        out = model(collate(samples, masking).to(engine.device))
        total += float(out.modality_losses[target]) * out.token_counts[target]
        count += out.token_counts[target]
    return total / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="proof")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--root", required=True, help="the run folder whose stage outputs to read")
    parser.add_argument("--model", help="a pretrain output URI to probe instead of the one the config addresses "
                        "(another model on the same data and tokenizers)")
    parser.add_argument("--scenes", type=int, help="val scenes (default: evaluate.num_samples)")
    parser.add_argument("--sweep", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE...]",
                        help="another sampling of the image to score (evaluate.sampling keys over the config's); "
                        "repeatable")
    parser.add_argument("--output")
    args = parser.parse_args()
    reuse_freed_memory()
    run = open_run_outputs(args.preset, args.root, args.overrides, model_uri=args.model, scenes=args.scenes)
    cfg, engine, prepared, scenes = run.config.evaluate, run.engine, run.prepared, run.scenes
    captions = scenes.truth["caption"]
    true = [tm.caption_shapes(c) for c in captions]
    sampling = SamplingArgs(**to_dict(cfg.sampling))
    # each sweep spec as evaluate.sampling overrides, typed and checked by the config (before any work)
    variants = [SamplingArgs(**to_dict(load_config(args.preset, overrides=args.overrides + [
        f"evaluate.sampling.{pair}" for pair in spec.split(",") if pair]).evaluate.sampling)) for spec in args.sweep]
    reading = SamplingArgs(steps=cfg.map_steps, temperature=0.0)
    start = time.perf_counter()

    def read(rgb_tokens: list[np.ndarray], images: list[np.ndarray] | None = None) -> list[frozenset[str]]:
        images = images if images is not None else engine.detokenize("rgb", rgb_tokens)
        semseg = read_semseg(engine, rgb_tokens, images, reading, cfg.seed + 1, cfg.batch_size)
        return [tm.shapes_in_semseg(s) for s in semseg]

    def generated_from(order: list[int], args: SamplingArgs = sampling) -> list[frozenset[str]]:
        inputs = engine.token_inputs("caption", [scenes.tokens["caption"][i] for i in order])
        rgb = engine.generate_tokens(inputs, "rgb", args, cfg.seed, cfg.batch_size)
        return read([g.tokens for g in rgb])

    order = list(range(len(scenes)))
    derangement = _derangement(len(scenes), cfg.seed)
    generated = generated_from(order)
    shuffled = generated_from(derangement)

    def semseg_tokens(order: list[int], args: SamplingArgs) -> list[np.ndarray]:
        inputs = engine.token_inputs("caption", [scenes.tokens["caption"][i] for i in order])
        return [g.tokens for g in engine.generate_tokens(inputs, "semseg", args, cfg.seed, cfg.batch_size)]

    def semseg_scores(maps: list[np.ndarray]) -> dict[str, float]:
        sets = [tm.shapes_in_semseg(m) for m in engine.detokenize("semseg", maps)]
        return {**_scores(sets, true), "shapes_per_map": float(np.mean([len(s) for s in sets]))}

    def rgb_via_semseg(order: list[int], maps: list[np.ndarray], args: SamplingArgs = sampling) -> dict[str, float]:
        inputs = [{"caption": scenes.tokens["caption"][i], "semseg": np.asarray(m).reshape(-1)}
                  for i, m in zip(order, maps)]
        rgb = engine.generate_tokens(inputs, "rgb", args, cfg.seed, cfg.batch_size)
        return _scores(read([g.tokens for g in rgb]), true)

    # Each semseg drawn from the captions once: scored directly (caption_to_semseg) and as the chain's first step.
    orders = {"matched": order, "shuffled": derangement}
    drawn = {(name, label): semseg_tokens(o, args) for name, args in (("one_pass", reading), ("sampled", sampling))
             for label, o in orders.items()}

    conditioning = {target: {label: caption_cross_entropy(engine, [scenes.tokens["caption"][i] for i in o],
                                                          scenes.tokens[target], target, cfg.batch_size)
                             for label, o in (("matched", order), ("shuffled", derangement))}
                    for target in ("semseg", "rgb")}
    true_maps = [scenes.tokens["semseg"][i] for i in order]
    sweep = []
    for variant in variants:
        matched = generated_from(order, variant)
        sweep.append({"sampling": dataclasses.asdict(variant), "generated": _scores(matched, true),
                      "generated_captions_shuffled": _scores(generated_from(derangement, variant), true),
                      "from_true_semseg": rgb_via_semseg(order, true_maps, variant),
                      "via_semseg": rgb_via_semseg(order, drawn["sampled", "matched"], variant),
                      "shapes_per_image": float(np.mean([len(s) for s in matched]))})
    train_captions = train_ground_truth(prepared, ["caption"], cfg.baseline_samples)["caption"]
    best = Baselines.fit({"caption": train_captions}).shapes
    most_common = targets.most_common([tm.caption_shapes(c) for c in train_captions])
    result = {
        "bench": "caption_to_rgb_probe", "model": run.model_uri, "scenes": len(scenes),
        "sampling": to_dict(cfg.sampling), "map_steps": cfg.map_steps, "seed": cfg.seed,
        "generated": _scores(generated, true),
        "generated_captions_shuffled": _scores(shuffled, true),
        "read_true_pixels": _scores(read(scenes.tokens["rgb"], scenes.truth["rgb"]), true),
        "read_true_tokens": _scores(read(scenes.tokens["rgb"]), true),
        "constant_best": {"shapes": sorted(best), **_scores([best] * len(true), true)},
        "constant_most_common": {"shapes": sorted(most_common), **_scores([most_common] * len(true), true)},
        "shapes_per_image": float(np.mean([len(s) for s in generated])),
        "shapes_per_caption": float(np.mean([len(t) for t in true])),
        "caption_cross_entropy": conditioning,
        "caption_to_semseg": {name: {label: semseg_scores(drawn[name, label]) for label in orders}
                              for name in ("one_pass", "sampled")},
        "via_semseg": {name: {label: rgb_via_semseg(o, drawn[name, label]) for label, o in orders.items()}
                       for name in ("one_pass", "sampled")},
        "from_true_semseg": rgb_via_semseg(order, true_maps),
        **({"sweep": sweep} if sweep else {}),
        "seconds": round(time.perf_counter() - start, 1), "threads": torch.get_num_threads(),
    }
    emit(result, args.output)


if __name__ == "__main__":
    main()
