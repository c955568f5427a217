"""Benchmark prepare-data: synthetic scene rendering, real-image ingestion, and shard writes to local disk vs S3.

    .venv/bin/python bench/prepare_data.py [--scenes 300] [--image-size 64] [--output bench.json]

Prints one JSON object. The S3 figure is measured against a local ``rclone serve s3`` started by the benchmark,
in the same run as the local-disk figure, so their ratio compares like with like (same samples, same machine).
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

from fourm_kfp import storage
from fourm_kfp.data.modalities import MODALITIES
from fourm_kfp.data.shard_writer import ShardWriter, encode_sample
from fourm_kfp.data.synthetic_scenes import synthetic_sample
from fourm_kfp.hardware import cpu_matmul_rate
from fourm_kfp.local_s3_server import serve_s3

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenes", type=int, default=300)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--samples-per-shard", type=int, default=1000)
    parser.add_argument("--repeat-writes", type=int, default=20, help="write the rendered set this many times")
    parser.add_argument("--photos", type=int, default=200, help="640x480 JPEGs for the real-data ingest figure")
    parser.add_argument("--output", help="also write the JSON here")
    args = parser.parse_args()

    render_scenes_s, render_encode_s, encoded = render_rate(args.scenes, args.image_size)
    encoded = encoded * args.repeat_writes
    with tempfile.TemporaryDirectory() as tmp:
        make_photos(Path(tmp) / "photos", args.photos)
        cores = os.cpu_count() or 1
        ingest_1 = ingest_rate(Path(tmp) / "photos", args.photos, args.image_size, 1)
        ingest_n = ingest_rate(Path(tmp) / "photos", args.photos, args.image_size, cores)
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
        "shard_write_local": local,
        "shard_write_s3": s3,
        "s3_over_local_throughput": round(s3["mb_per_s"] / local["mb_per_s"], 3),
    }
    emit(result, args.output)


if __name__ == "__main__":
    main()
