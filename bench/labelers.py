"""Benchmark the label stage's labelers: images/s of one worker, and each transformers teacher's bare forward.

Reported: images/s of one label worker per labeler, the workers a 10-million-image dataset needs to be labelled in an
hour, and for the transformers teachers also the network's bare forward and the ratio of the two.

    .venv/bin/python bench/labelers.py [--image-size 224] [--images 64] [--batch-size 16] [--rounds 7]
                                       [--labelers canny_edge,hf_depth,...] [--device cpu|cuda]
                                       [--teacher runs/demo/pretrain/<address>] [--quick] [--output x.json]

Every labeler labels the same images (the photographs scikit-image ships, centre-cropped and resized to
``--image-size``, repeated; random pixels when scikit-image is not installed) in this one process with torch's
default threads (one label worker as the pipeline runs it), after one warm-up batch.

* The built-ins (``canny_edge``, ``color_palette``, ``metadata``) label ``--images`` photos in batches of
  ``--batch-size``: ``images_per_s_per_worker``, and ``workers_for_10m_images_in_1h`` = ``ceil(1e7 / (rate * 3600))``.
* The transformers teachers (``hf_depth``, ``hf_semseg``, ``hf_det``, ``hf_caption``, ``hf_normal``,
  ``normal_from_depth``, ``hf_clip``, ``hf_dinov2``) are small but real-shaped random-weight networks built offline
  into a temporary folder (``fourm_kfp.testing``, size ``small``), on ``--device``. Each times one batch of ``--batch-size``
  photos without captions (the caption teacher labels only those), three ways, interleaved in each of ``--rounds``
  rounds (worker, bare forward, pre-processing, worker, ...), so that a 2-core machine's noise falls on all three
  alike; the medians over the rounds are reported:

  - ``worker``: ``labeler.label(batch)``, what the label stage calls per batch (the folder's processor, one forward,
    post-processing, the transfer to the host);
  - ``bare_forward``: ``model(**inputs)`` on the batch already pre-processed and on the device, inside the labeler's
    own inference/autocast context (``labeler.running()``); for ``hf_caption`` ``model.generate(...)`` with the
    labeler's generation arguments; on a GPU followed by a synchronisation;
  - ``pre_processing``: ``labeler.inputs(batch)``, the processor's call and the copy to the device;
  - ``ratio``: worker images/s / bare-forward images/s (the median of the rounds' ratios; the target is >= 0.8;
    ``ratio_of_best``: the same of the fastest round of each, the least disturbed by other processes), and
    ``post_processing_and_host_s``: the worker's time less the other two (median over the rounds).

  ``normal_from_depth`` has no network: it reads the depth labels ``hf_depth`` made of the batch. Its entry times
  its own ``label`` (``worker``), and ``with_depth_teacher``: ``hf_depth``'s label then its own, against
  ``hf_depth``'s bare forward.

``--labelers`` names those to time (comma-separated; default all); ``--teacher`` adds ``fourm_model`` reading depth
off the photos with that pretrain output (a GPU when there is one). Prints one JSON object, with the device, torch's
threads and the machine's matmul rate measured after the timings.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

import numpy as np
from PIL import Image

from fourm_kfp.hardware import cpu_matmul_rate
from fourm_kfp.labelers.base import LabelBatch
from fourm_kfp.labelers.registry import build_labeler

from bench_output import emit

PHOTOS = ("astronaut.png", "brick.png", "camera.png", "chelsea.png", "coffee.png", "coins.png", "grass.png",
          "gravel.png", "hubble_deep_field.jpg", "ihc.png", "moon.png", "motorcycle_left.png",
          "motorcycle_right.png", "retina.jpg", "rocket.jpg")
BUILTINS = ("canny_edge", "color_palette", "metadata")
TEACHERS = ("hf_depth", "hf_semseg", "hf_det", "hf_caption", "hf_normal", "normal_from_depth", "hf_clip",
            "hf_dinov2")
#: the params each teacher is configured with: hf_depth a MiDaS-like relative inverse-depth DPT; hf_det keeps every
#: box (a random network's scores are all below the default 0.6), so each photo gets max_boxes (64): the most work
#: its post-processing does
TEACHER_PARAMS: dict[str, dict[str, Any]] = {"hf_depth": {"depth": "relative", "inverse": True},
                                             "hf_det": {"threshold": 0.0}}


def photos(count: int, size: int) -> tuple[list[np.ndarray], str]:
    """``count`` RGB squares of ``size`` px: the sample photos, centre-cropped (else random pixels)."""
    try:
        from fourm_kfp.storage import package_folder

        folder = package_folder("pkg://skimage/data")
        source = "scikit-image sample photos"
        base = []
        for name in PHOTOS:
            with Image.open(os.path.join(folder, name)) as im:
                im = im.convert("RGB")
                side = min(im.size)
                left, top = (im.width - side) // 2, (im.height - side) // 2
                base.append(np.asarray(im.crop((left, top, left + side, top + side)).resize((size, size))))
    except Exception:  # noqa: BLE001 - no scikit-image: random pixels still time the labelers
        source = "random pixels"
        rng = np.random.default_rng(0)
        base = [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(len(PHOTOS))]
    return [base[i % len(base)] for i in range(count)], source


def rate(labeler, images: list[np.ndarray], batch_size: int) -> dict[str, float]:
    batches = [LabelBatch(tuple(f"k{i + j}" for j in range(len(chunk))), tuple(chunk),
                          tuple("a photo of something" for _ in chunk), tuple((640, 480) for _ in chunk))
               for i in range(0, len(images), batch_size) if (chunk := images[i:i + batch_size])]
    labeler.label(batches[0])  # warm-up: first-call costs (caches, kernels) are not the steady state
    start = time.perf_counter()
    for batch in batches:
        labeler.label(batch)
    seconds = time.perf_counter() - start
    per_s = len(images) / seconds
    return {"images": len(images), "seconds": round(seconds, 3), "images_per_s_per_worker": round(per_s, 1),
            "workers_for_10m_images_in_1h": math.ceil(1e7 / (per_s * 3600))}


def _timer(device: str) -> Callable[[Callable[[], Any]], float]:
    """Seconds one call takes, the device's queued work included."""
    import torch

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def timed(call: Callable[[], Any]) -> float:
        sync()
        start = time.perf_counter()
        call()
        sync()
        return time.perf_counter() - start

    return timed


def interleaved(calls: dict[str, Callable[[], Any]], rounds: int, device: str) -> dict[str, list[float]]:
    """Each call's seconds in each round, the calls run one after the other in every round (after a warm-up)."""
    timed = _timer(device)
    for call in calls.values():
        call()
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            seconds[name].append(timed(call))
    return seconds


def bare_forward(labeler, inputs: dict[str, Any]) -> Callable[[], Any]:
    """The teacher's network alone on pre-processed inputs, in the labeler's inference/autocast context."""
    if labeler.name == "hf_caption":
        args = {"max_new_tokens": int(labeler.params["max_new_tokens"]), "num_beams": int(labeler.params["num_beams"]),
                "do_sample": False}

        def call():
            with labeler.running():
                return labeler.model.generate(**inputs, **args)
    else:
        def call():
            with labeler.running():
                return labeler.model(**inputs)
    return call


def summary(seconds: dict[str, list[float]], images: int, worker: str = "worker", bare: str = "bare_forward"
            ) -> dict[str, Any]:
    """Medians over the rounds: images/s of each call, and the worker's share of the bare forward's rate."""
    out: dict[str, Any] = {}
    for name, values in seconds.items():
        out[name] = {"s_per_batch": round(statistics.median(values), 4),
                     "images_per_s": round(images / statistics.median(values), 2),
                     "rounds_s": [round(v, 4) for v in values]}
    if bare in seconds:
        out["ratio"] = round(statistics.median(b / w for w, b in zip(seconds[worker], seconds[bare])), 3)
        out["ratio_rounds"] = [round(b / w, 3) for w, b in zip(seconds[worker], seconds[bare])]
        out["ratio_of_best"] = round(min(seconds[bare]) / min(seconds[worker]), 3)
    return out


def teacher_description(labeler) -> str:
    millions = sum(p.numel() for p in labeler.model.parameters()) / 1e6
    return f"{type(labeler.model).__name__}, {millions:.1f} M parameters"


def time_teachers(names: list[str], image_size: int, batch_size: int, rounds: int, device: str) -> dict[str, Any]:
    """The teachers' entries (see the module docstring), each built into a temporary folder."""
    import torch

    from fourm_kfp.testing import save_random_teacher

    images, _ = photos(batch_size, image_size)
    batch = LabelBatch(tuple(f"k{i}" for i in range(batch_size)), tuple(images))  # no captions: all get one
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-teachers-") as root:
        built: dict[str, Any] = {}

        def teacher(name: str):
            if name not in built:
                folder = save_random_teacher(name, os.path.join(root, name), image_size, "small")
                built[name] = build_labeler(name, TEACHER_PARAMS.get(name, {}), str(folder), device)
            return built[name]

        for name in names:
            if name == "normal_from_depth":
                depth = teacher("hf_depth")
                normals = build_labeler(name, {}, "", device)

                def with_depth_labels(depths):
                    return LabelBatch(batch.keys, batch.images, labels={"depth": tuple(depths)})

                labelled = with_depth_labels(depth.label(batch))
                seconds = interleaved({
                    "worker": lambda: normals.label(labelled),
                    "with_depth_teacher": lambda: normals.label(with_depth_labels(depth.label(batch))),
                    "depth_bare_forward": bare_forward(depth, depth.inputs(batch)),
                }, rounds, device)
                entry = {"model": "no network: it reads hf_depth's labels of the batch",
                         **summary({"worker": seconds["worker"]}, batch_size),
                         "with_depth_teacher": summary({"worker": seconds["with_depth_teacher"],
                                                        "bare_forward": seconds["depth_bare_forward"]}, batch_size)}
            else:
                labeler = teacher(name)
                inputs = labeler.inputs(batch)
                seconds = interleaved({"worker": lambda: labeler.label(batch),
                                       "bare_forward": bare_forward(labeler, inputs),
                                       "pre_processing": lambda: labeler.inputs(batch)}, rounds, device)
                post = [w - b - p for w, b, p in
                        zip(seconds["worker"], seconds["bare_forward"], seconds["pre_processing"])]
                entry = {"model": teacher_description(labeler), **summary(seconds, batch_size),
                         "post_processing_and_host_s": round(statistics.median(post), 4)}
                if name == "hf_caption":
                    with torch.inference_mode():
                        entry["generated_tokens"] = int(bare_forward(labeler, inputs)().shape[1])
            per_s = entry["worker"]["images_per_s"]
            entry["workers_for_10m_images_in_1h"] = math.ceil(1e7 / (per_s * 3600))
            results[name] = entry
            ratio = entry["ratio"] if "ratio" in entry else entry["with_depth_teacher"]["ratio"]
            print(f"{name}: worker {per_s} images/s, ratio {ratio}", file=sys.stderr, flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--images", type=int, default=64, help="photos each built-in labels")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds of each teacher's timings")
    parser.add_argument("--device", default="cpu", help="the teachers' device (cpu, cuda, cuda:1, ...)")
    parser.add_argument("--teacher", default="", help="a pretrain output's URI: also time fourm_model (depth)")
    parser.add_argument("--labelers", default=",".join((*BUILTINS, *TEACHERS)),
                        help="the labelers to time, comma-separated (default: every built-in and teacher)")
    parser.add_argument("--quick", action="store_true", help="a few images and one round: checks the bench runs")
    parser.add_argument("--output", help="also write the JSON here")
    args = parser.parse_args()
    if args.quick:
        args.images, args.batch_size, args.rounds = 8, 4, 1
    names = [name for name in args.labelers.split(",") if name]
    unknown = sorted(set(names) - set(BUILTINS) - set(TEACHERS))
    if unknown:
        parser.error(f"unknown labelers {unknown}: choose from {', '.join((*BUILTINS, *TEACHERS))}")
    images, source = photos(args.images, args.image_size)
    labelers = {name: build_labeler(name) for name in names if name in BUILTINS}
    if args.teacher:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        labelers["fourm_model(depth)"] = build_labeler("fourm_model", {"modality": "depth"}, args.teacher, device)
    rates = {name: rate(labeler, images, args.batch_size) for name, labeler in labelers.items()}
    result: dict[str, Any] = {"benchmark": "labelers", "images": source, "image_size": args.image_size,
                              "batch_size": args.batch_size, "labelers": rates}
    teachers = [name for name in names if name in TEACHERS]
    if teachers:
        import torch
        import transformers

        result["teachers"] = time_teachers(teachers, args.image_size, args.batch_size, args.rounds, args.device)
        result["teacher_setup"] = {
            "device": args.device,
            "device_name": (torch.cuda.get_device_name(args.device) if args.device.startswith("cuda")
                            else platform.processor() or platform.machine()),
            "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "transformers": transformers.__version__, "batch_size": args.batch_size, "rounds": args.rounds,
            "photos": "one batch of the sample photos, without captions",
            "timing": "worker, bare forward, pre-processing one after the other in every round; medians over rounds"}
    result["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(), **cpu_matmul_rate()}
    emit(result, args.output)


if __name__ == "__main__":
    main()
