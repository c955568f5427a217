"""Benchmark prepare-data: synthetic scene rendering, real-image ingestion, shard writes to local disk vs S3, and
the stage's real-data workers.

    .venv/bin/python bench/prepare_data.py [--scenes 300] [--image-size 64] [--photos 200] [--quick] [--output x.json]

Prints one JSON object. The S3 figure is measured against a local ``rclone serve s3`` started by the benchmark,
in the same run as the local-disk figure, so their ratio compares like with like (same samples, same machine).

``stage_workers``: the prepare-data stage itself (one fan-out worker: a part process with one decode thread per
core) over an image folder and over a WebDataset of the same 640x480 JPEGs (random pixels: a worst case for the
JPEG decoder), at ``--real-image-size`` (4m-b's 224 px): images/s per worker, and how many workers a 10-million-image
source needs to finish in an hour (``ceil(1e7 / (rate * 3600))``). ``--quick`` runs everything on a few samples,
to check that the benchmark works (its figures are then noise).
"""

from __future__ import annotations

import argparse
import io
import math
import os
import platform
import tarfile
import tempfile
import time
from pathlib import Path

from fourm_kfp import storage
from fourm_kfp.config.loader import load_config
from fourm_kfp.contract import run_stage
from fourm_kfp.data.modalities import MODALITIES
from fourm_kfp.data.shard_writer import ShardWriter, encode_sample
from fourm_kfp.data.synthetic_scenes import synthetic_sample
from fourm_kfp.hardware import cpu_matmul_rate
from fourm_kfp.testing import serve_s3
from fourm_kfp.stages import get_stage

from bench_output import emit


def render_rate(count: int, image_size: int) -> tuple[float, float, list[dict[str, bytes]]]:
    """Scenes/s for rendering alone and for render + encode (one process), and the encoded samples."""
    start = time.perf_counter()
    samples = [synthetic_sample(0, i, image_size) for i in range(count)]
    render_s = time.perf_counter() - start
    start = time.perf_counter()
    encoded = [encode_sample(s, tuple(MODALITIES)) for s in samples]
    encode_s = time.perf_counter() - start
    return count / render_s, count / (render_s + encode_s), encoded


def write_rate(store: storage.Store, encoded: list[dict[str, bytes]], samples_per_shard: int) -> dict[str, float]:
    nbytes = sum(len(b) for sample in encoded for b in sample.values())
    start = time.perf_counter()
    writer = ShardWriter(store, "train", tuple(MODALITIES), samples_per_shard)
    for i, sample in enumerate(encoded):
        writer.write(f"{i:08d}", sample)
    summary = writer.close()
    seconds = time.perf_counter() - start
    return {"seconds": round(seconds, 3), "megabytes": round(nbytes / 1e6, 2), "shards": summary["shards"],
            "mb_per_s": round(nbytes / 1e6 / seconds, 1), "samples_per_s": round(len(encoded) / seconds, 1)}


def ingest_rate(folder: Path, count: int, image_size: int, workers: int) -> float:
    """Real-data ingestion (JPEG decode, EXIF, resize, crop) in images/s with ``workers`` threads."""
    from fourm_kfp.data.ingest import iter_image_folder

    store = storage.open_store(str(folder))
    start = time.perf_counter()
    items = sum(1 for _ in iter_image_folder(store, image_size, workers=workers))
    assert items == count
    return count / (time.perf_counter() - start)


def make_photos(folder: Path, count: int) -> None:
    import numpy as np
    from PIL import Image

    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(count):
        pixels = rng.integers(0, 255, (480, 640, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"photo{i:05d}.jpg", quality=90)


def make_webdataset(photos: Path, folder: Path, per_tar: int) -> int:
    """The photos as an img2dataset-style WebDataset: ``<key>.jpg`` and ``<key>.txt`` members, ``per_tar`` samples
    a tar; returns the number of tars."""
    folder.mkdir(parents=True)
    files = sorted(photos.glob("*.jpg"))
    for t, first in enumerate(range(0, len(files), per_tar)):
        with tarfile.open(folder / f"{t:05d}.tar", "w") as tar:
            for path in files[first:first + per_tar]:
                tar.add(path, arcname=path.name)
                caption = f"a photo called {path.stem}".encode()
                info = tarfile.TarInfo(f"{path.stem}.txt")
                info.size = len(caption)
                tar.addfile(info, io.BytesIO(caption))
    return math.ceil(len(files) / per_tar)


def stage_worker_rate(source: str, uri: Path, root: Path, image_size: int) -> dict[str, float]:
    """The prepare-data stage at width 1 over a real source: one worker's images/s (its part's samples over its
    part's seconds; the collect step's reports are not counted) and the workers 10 million images need in an hour."""
    rgb = "[rgb,caption]"
    config = load_config("smoke", overrides=[
        f"prepare_data.source={source}", f"prepare_data.source_uri={uri}", f"data.image_size={image_size}",
        f"data.modalities={rgb}", f"data.input_modalities={rgb}", f"data.target_modalities={rgb}",
        "prepare_data.samples_per_shard=1000", "prepare_data.val_fraction=0.05"])
    start = time.perf_counter()
    outcome = run_stage(get_stage("prepare-data"), config, storage.open_store(str(root), create=True))
    seconds = time.perf_counter() - start
    metrics = outcome.metrics
    rate = metrics["samples_per_second"]
    return {"images": metrics["samples_train"] + metrics["samples_val"], "image_size": image_size,
            "decode_threads": os.cpu_count() or 1, "stage_seconds": round(seconds, 2),
            "images_per_s_per_worker": round(rate, 1),
            "workers_for_10m_images_in_1h": math.ceil(1e7 / (rate * 3600))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenes", type=int, default=300)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--samples-per-shard", type=int, default=1000)
    parser.add_argument("--repeat-writes", type=int, default=20, help="write the rendered set this many times")
    parser.add_argument("--photos", type=int, default=200, help="640x480 JPEGs for the real-data ingest figure")
    parser.add_argument("--photos-per-tar", type=int, default=100, help="samples per tar of the WebDataset")
    parser.add_argument("--real-image-size", type=int, default=224, help="image size of the stage_workers figures")
    parser.add_argument("--quick", action="store_true", help="a few samples of everything: checks the bench runs")
    parser.add_argument("--output", help="also write the JSON here")
    args = parser.parse_args()
    if args.quick:
        args.scenes, args.repeat_writes, args.photos, args.photos_per_tar = 24, 2, 24, 8

    render_scenes_s, render_encode_s, encoded = render_rate(args.scenes, args.image_size)
    encoded = encoded * args.repeat_writes
    with tempfile.TemporaryDirectory() as tmp:
        make_photos(Path(tmp) / "photos", args.photos)
        cores = os.cpu_count() or 1
        ingest_1 = ingest_rate(Path(tmp) / "photos", args.photos, args.image_size, 1)
        ingest_n = ingest_rate(Path(tmp) / "photos", args.photos, args.image_size, cores)
        tars = make_webdataset(Path(tmp) / "photos", Path(tmp) / "wds", args.photos_per_tar)
        stage_workers = {
            "image_folder": stage_worker_rate("image_folder", Path(tmp) / "photos", Path(tmp) / "stage-folder",
                                              args.real_image_size),
            "webdataset": {"tars": tars, **stage_worker_rate("webdataset", Path(tmp) / "wds",
                                                             Path(tmp) / "stage-wds", args.real_image_size)},
        }
        local = write_rate(storage.open_store(str(Path(tmp) / "local")), encoded, args.samples_per_shard)
        (Path(tmp) / "s3").mkdir()
        with serve_s3(Path(tmp) / "s3", "bench-key", "bench-secret") as server:
            os.environ.update(server.env())
            s3 = write_rate(storage.open_store("s3://bench/prepare-data", create=True), encoded,
                            args.samples_per_shard)
    result = {
        "benchmark": "prepare_data",
        # the yardstick beside every rate: 2-core machines differ up to 2x (measured after the timings, in this run)
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), **cpu_matmul_rate()},
        "image_size": args.image_size,
        "synthetic_scenes_per_s": round(render_scenes_s, 1),
        "synthetic_scenes_per_s_with_encoding": round(render_encode_s, 1),
        "ingest_images_per_s_1_thread": round(ingest_1, 1),
        f"ingest_images_per_s_{cores}_threads": round(ingest_n, 1),
        "ingest_parallel_speedup": round(ingest_n / ingest_1, 2),
        "stage_workers": stage_workers,
        "shard_write_local": local,
        "shard_write_s3": s3,
        "s3_over_local_throughput": round(s3["mb_per_s"] / local["mb_per_s"], 3),
    }
    emit(result, args.output)


if __name__ == "__main__":
    main()
