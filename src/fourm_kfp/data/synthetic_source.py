"""The ``synthetic`` source of prepare-data: procedurally generated, exactly aligned 3-D scenes in seven modalities
(:mod:`fourm_kfp.data.synthetic_scenes`), rendered in worker processes; deterministic for a seed.

Plan: the train scenes ``0 .. num_train - 1``, then the val scenes, fill their split's shards of
``samples_per_shard`` in order; a job is one shard. The config describes the data wholly: no fingerprint, and the
preview renders its scenes again (the shards hold depth and normals quantised).
"""

from __future__ import annotations

import multiprocessing
import os
from typing import Any, Iterable, Iterator

from fourm_kfp.data.shard_writer import encode_sample
from fourm_kfp.data.source_record import EncodedSample, Source, SourceJob, SourcePlan, chunks

#: (seed, index, image size, the modalities kept): what a worker process renders one scene from
Scene = tuple[int, int, int, tuple[str, ...]]


def plan(config: Any) -> SourcePlan:
    """One job per output shard: the train scenes, then the val scenes, in order."""
    cfg = config.prepare_data
    jobs = []
    for split, start, count in (("train", 0, cfg.num_train), ("val", cfg.num_train, cfg.num_val)):
        scenes = range(start, start + count)
        jobs += [SourceJob(((split, i),), chunk, len(chunk))
                 for i, chunk in enumerate(chunks(scenes, cfg.samples_per_shard))]
    return SourcePlan(jobs)


def _scene(scene: Scene) -> dict[str, Any]:
    from fourm_kfp.data.synthetic_scenes import synthetic_sample

    seed, index, image_size, modalities = scene
    return {m: v for m, v in synthetic_sample(seed, index, image_size).items() if m in modalities}


def _render(scene: Scene) -> tuple[str, dict[str, Any], dict[str, bytes]]:
    sample = _scene(scene)
    return f"{scene[1]:08d}", sample, encode_sample(sample, scene[3])


def _scenes(config: Any, indices: Iterable[int]) -> Iterator[Scene]:
    for index in indices:
        yield config.prepare_data.seed, index, config.data.image_size, tuple(config.data.modalities)


def items(config: Any, the_plan: SourcePlan, jobs: list[SourceJob]) -> Iterator[tuple[int, EncodedSample]]:
    """Every scene of ``jobs``, rendered and encoded by ``prepare_data.workers`` processes."""
    work = [(pos, job.shards[0][0], index) for pos, job in enumerate(jobs) for index in job.inputs]
    scenes = _scenes(config, (index for _, _, index in work))
    workers = min(config.prepare_data.workers or os.cpu_count() or 1, max(len(work) // 64, 1))
    pool = multiprocessing.get_context("forkserver").Pool(workers) if workers > 1 else None
    try:
        rendered = pool.imap(_render, scenes, chunksize=16) if pool else map(_render, scenes)
        for (pos, split, _), (key, sample, encoded) in zip(work, rendered, strict=True):
            yield pos, EncodedSample(split, key, sample, encoded)
    finally:
        if pool:
            pool.terminate()


def render(config: Any, keys: list[str]) -> list[dict[str, Any]]:
    """The scenes of ``keys`` rendered again, unquantised (the preview)."""
    return [_scene(scene) for scene in _scenes(config, map(int, keys))]


SYNTHETIC = Source(
    name="synthetic",
    description="synthetic scenes",
    # what synthetic_scenes.render_scene draws (tests/data/test_sources.py checks that they are the same)
    modalities=("rgb", "depth", "normal", "semseg", "edge", "det", "caption"),
    plan=plan,
    items=items,
    render=render,
    unit="scenes",
)
