"""The scenes an evaluation scores, read from committed stage outputs: the val scenes' exact ground truth (prepare-data)
with their crop-0 tokens (pretokenize), the training scenes the trivial baselines are fitted on, and which tasks
the model and the data both allow. Used by the evaluate stage and by anything that takes a trained model apart
(the experiments' probes)."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from fourm_kfp.data.pretokenized import decode_member, token_name
from fourm_kfp.data.shard_stream import available_modalities, iter_split
from fourm_kfp.evaluation.any_to_any import AnyToAny
from fourm_kfp.evaluation.targets import task_modalities
from fourm_kfp.evaluation.tasks import Scenes

log = logging.getLogger(__name__)


def load_scenes(engine: AnyToAny, prepared, pretokenized, limit: int) -> Scenes:
    """The first ``limit`` val scenes: ground truth of every modality the model knows and every one of these scenes
    has (real photos may lack one: a caption that came with some photos only), and their crop-0 tokens. A modality
    some of the scenes lack has no ground truth here, so the tasks that need it are skipped, saying so."""
    candidates = [m for m in engine.modalities if m in available_modalities(prepared, "val")]
    samples = list(iter_split(prepared, "val", candidates, limit=limit))
    keys = [key for key, _ in samples]
    partial = [m for m in candidates if not all(m in sample for _, sample in samples)]
    if partial:
        log.info("evaluate: %s missing from some of the %d val scenes: no ground truth for them", partial, len(keys))
    truth_names = [m for m in candidates if m not in partial]
    truth = {m: [sample[m] for _, sample in samples] for m in truth_names}
    tokens: dict[str, list[np.ndarray]] = {}
    image = [m for m in truth_names if engine.specs[m].kind == "image"]
    token_names = [token_name(m) for m in image if token_name(m) in available_modalities(pretokenized, "val")]
    token_keys = []
    for key, sample in iter_split(pretokenized, "val", token_names, decode=decode_member, limit=limit):
        token_keys.append(key)
        for name in token_names:  # crop 0: the full view
            grid = np.asarray(sample[name])[0].reshape(-1).astype(np.int64)
            tokens.setdefault(name.removeprefix("tok_"), []).append(grid)
    if token_names and token_keys != keys:
        raise ValueError(f"val keys differ between {prepared.uri} and {pretokenized.uri}: the pretokenized data "
                         "was not made from this prepared data")
    for m in truth_names:
        if engine.specs[m].kind == "sequence":
            tokens[m] = engine.tokenize(m, truth[m])
    return Scenes(keys, truth, tokens)


def train_ground_truth(prepared, names: list[str], limit: int) -> dict[str, list[Any]]:
    """The values of ``names`` (those the prepared data has) in the first ``limit`` training scenes that have them:
    what the trivial baselines are fitted on."""
    names = [m for m in names if m in available_modalities(prepared, "train")]
    values: dict[str, list[Any]] = {m: [] for m in names}
    for _, sample in iter_split(prepared, "train", names, limit=limit):
        for m in names:
            if m in sample:  # real photos may lack one (a caption that came with some only)
                values[m].append(sample[m])
    return values


def runnable_tasks(requested: tuple[str, ...], scenes: Scenes, modalities: list[str]) -> tuple[list[str], list[str]]:
    """Tasks whose modalities the model and the data both have; the others with the reason."""
    run, skipped = [], []
    for task in requested:
        missing = sorted(task_modalities(task) - (set(modalities) & set(scenes.truth)))
        if missing:
            skipped.append(f"{task} (no {', '.join(missing)})")
        else:
            run.append(task)
    return run, skipped
