"""A shard's samples decoded and cropped in chunks, off the encoder's thread: in worker processes, or inline.

The pretokenize reader thread reads each shard's stored member bytes (cheap) in chunks of :func:`chunk_samples`
samples and submits every chunk to a crop executor (:func:`crop_executor`): ``pretokenize.decode_workers``
processes (forkserver, so a parent with CUDA initialised is safe), or, with 0 workers, the reader thread itself.
:func:`crop_chunk` decodes each member (``get_modality(m).decode``, as the shard stream does) and cuts the sample's
aligned crops with :mod:`fourm_kfp.data.crops`, exactly as a single thread would (the output bytes do not depend
on the worker count), and returns the chunk's crops of each image modality stacked in one tensor
``[samples * n_crops, H, W(, C)]``. Tensors returned by a worker travel through shared memory (torch registers its
reductions with the pickler ``multiprocessing`` uses), not through the result pipe: the chunks in flight (about
``2 * workers`` of up to ~21 MiB) live in ``/dev/shm``, so a container needs more than Docker's and Kubernetes'
64 MiB default there (an in-memory ``emptyDir``, as the training job templates mount). A sample that cannot be
decoded or cropped is a :class:`CropError` naming the shard, the modality's tar and the key; a worker that dies is
a :class:`DecodeWorkerError` naming the shard.
"""

from __future__ import annotations

import multiprocessing
import signal
from concurrent.futures import BrokenExecutor, Executor, Future, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np
import torch

from fourm_kfp.contract.shard_jobs import Shard
from fourm_kfp.data.crops import apply_crop, draw_crops
from fourm_kfp.data.modalities import get_modality
from fourm_kfp.data.shard_stream import iter_joined_shard
from fourm_kfp.data.shard_writer import shard_key
from fourm_kfp.errors import UserError
from fourm_kfp.hardware import available_cpus, spare_cpu_workers
from fourm_kfp.storage import Store

#: Crop pixels of one image modality in a chunk (a chunk of all five image modalities holds 21 bytes per pixel,
#: ~21 MiB): big enough that a worker's per-chunk overhead is small, small enough to keep several in flight.
CHUNK_PIXELS = 2**20
#: The most decode workers ``pretokenize.decode_workers: -1`` starts.
MAX_AUTO_DECODE_WORKERS = 15


class CropError(UserError):
    """A sample of a shard that cannot be decoded or cropped (a corrupt member, an image of the wrong size)."""


class DecodeWorkerError(UserError):
    """A decode worker process died (killed for memory, or a bus error when shared memory ran out)."""


@dataclass(frozen=True)
class CropSettings:
    n_crops: int
    scale: tuple[float, float]
    ratio: tuple[float, float]
    flip_probability: float
    seed: int
    #: how rgb crops are resized (``fourm_kfp.data.crops.CAMERA_RESAMPLE``): bicubic for an ml-4m rgb tokenizer
    camera_resample: str = "bilinear"


@dataclass(frozen=True)
class RawChunk:
    """Consecutive samples of one shard as stored: ``{modality: member bytes}`` per key."""

    shard: str  # the shard's key index URI (names the shard in errors)
    tars: dict[str, str]  # modality -> its tar's URI
    keys: list[str]
    samples: list[dict[str, bytes]]


class StackedCrops(NamedTuple):
    """The crops of one image modality in a chunk: the samples that have it and their crops, sample by sample."""

    rows: list[int]  # positions in the chunk of the samples holding the modality
    crops: torch.Tensor  # [len(rows) * n_crops, H, W(, C)]


@dataclass
class CroppedChunk:
    keys: list[str]
    images: dict[str, StackedCrops]  # every image modality some sample of the chunk holds
    values: list[dict[str, list[Any]]]  # per sample: each other modality's value in every crop
    crops: list[list[dict[str, Any]]]  # per sample: its crop windows (``Crop.to_dict``)


def decode_workers(setting: int, device: torch.device, cpus: int | None = None) -> int:
    """``pretokenize.decode_workers``; ``-1``: with the encoders on a GPU the CPUs less one (for the encoding
    process), at most :data:`MAX_AUTO_DECODE_WORKERS`, at least one; with the encoders on the CPU none (they keep
    every core busy: on 2 cores one worker only added its start-up, 39.7 s against 38.8 s for the demo stage);
    ``0``: decode and crop in the reader thread."""
    if setting >= 0:
        return setting
    return spare_cpu_workers(cpus or available_cpus(), MAX_AUTO_DECODE_WORKERS) if device.type == "cuda" else 0


def chunk_samples(n_crops: int, image_size: int) -> int:
    """Samples per chunk: :data:`CHUNK_PIXELS` crop pixels of an image modality."""
    return max(1, CHUNK_PIXELS // (n_crops * image_size * image_size))


def raw_chunks(source: Store, shard: Shard, modalities: Sequence[str], size: int) -> Iterator[RawChunk]:
    """The input shard's samples as stored, ``size`` at a time, in key-index order."""
    uri = source.uri_of(shard.keys_key)
    tars = {m: source.uri_of(shard_key(shard.split, m, shard.index)) for m in modalities}
    keys: list[str] = []
    samples: list[dict[str, bytes]] = []
    for key, stored in iter_joined_shard(source, shard.split, shard.index, modalities, decode=None):
        keys.append(key)
        samples.append(stored)
        if len(keys) == size:
            yield RawChunk(uri, tars, keys, samples)
            keys, samples = [], []
    if keys:
        yield RawChunk(uri, tars, keys, samples)


def _decode(chunk: RawChunk, key: str, modality: str, data: bytes) -> Any:
    try:
        return get_modality(modality).decode(data)
    except Exception as exc:
        raise CropError(f"{chunk.tars[modality]}: member {key}.{get_modality(modality).ext} of shard {chunk.shard} "
                        f"cannot be decoded as {modality} ({type(exc).__name__}: {exc}); a corrupt shard: re-run "
                        "the stage that wrote it") from exc


def _crop(chunk: RawChunk, key: str, stored: dict[str, bytes], settings: CropSettings,
          image_size: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The sample's views through its crops, and the crop windows."""
    sample = {m: _decode(chunk, key, m, data) for m, data in stored.items()}
    crops = draw_crops(key, settings.seed, settings.n_crops, image_size, settings.scale, settings.ratio,
                       settings.flip_probability)
    try:
        return ([apply_crop(sample, c, image_size, settings.camera_resample) for c in crops],
                [c.to_dict() for c in crops])
    except Exception as exc:
        raise CropError(f"sample {key!r} of shard {chunk.shard} cannot be cropped to {image_size} px "
                        f"({type(exc).__name__}: {exc})") from exc


def crop_chunk(settings: CropSettings, image_size: int, chunk: RawChunk) -> CroppedChunk:
    """Decode and crop every sample of ``chunk``; each image modality's crops stacked in one tensor."""
    arrays: dict[str, list[np.ndarray]] = {}
    rows: dict[str, list[int]] = {}
    values: list[dict[str, list[Any]]] = []
    windows: list[list[dict[str, Any]]] = []
    for i, (key, stored) in enumerate(zip(chunk.keys, chunk.samples)):
        views, crops = _crop(chunk, key, stored, settings, image_size)
        for modality, value in views[0].items():
            if isinstance(value, np.ndarray):
                rows.setdefault(modality, []).append(i)
                arrays.setdefault(modality, []).extend(view[modality] for view in views)
        values.append({m: [view[m] for view in views] for m, v in views[0].items() if not isinstance(v, np.ndarray)})
        windows.append(crops)
    images = {m: StackedCrops(rows[m], torch.from_numpy(np.stack(a))) for m, a in arrays.items()}
    return CroppedChunk(list(chunk.keys), images, values, windows)


class _InlineExecutor(Executor):
    """Runs each call when it is submitted (``decode_workers: 0``: the reader thread decodes and crops)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # surfaced where the result is taken
            future.set_exception(exc)
        return future


def _init_worker() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it shuts the pool down
    torch.set_num_threads(1)


def crop_executor(workers: int) -> Executor:
    """``workers`` decode processes, or the calling thread with 0."""
    if not workers:
        return _InlineExecutor()
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("forkserver"),
                               initializer=_init_worker)


def cropped(future: Future, shard: str) -> CroppedChunk:
    """The chunk of ``shard`` a worker cropped (its error re-raised here; a dead worker named as such)."""
    try:
        return future.result()
    except BrokenExecutor:
        raise DecodeWorkerError(
            f"a decode worker died while cropping {shard} (killed for memory, or a bus error when /dev/shm is too "
            "small for the chunks in flight: give the pod more memory or shared memory, or set "
            "pretokenize.decode_workers to fewer workers or 0); committed shards are kept, a rerun resumes") from None
