"""A team's own photos for the real-data tests: a folder of random jpgs with caption side files and broken files,
and the bytes of a WebDataset tar."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image


def write_photo_folder(folder: Path, good: int, bad: int = 0) -> Path:
    """``good`` random 40x60 photos ``img{i}.jpg`` with captions ``img{i}.txt``, and ``bad`` files
    ``broken{i}.jpg`` that are no image; returns ``folder`` (created)."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(good):
        Image.fromarray(rng.integers(0, 255, (40, 60, 3), dtype=np.uint8)).save(folder / f"img{i}.jpg")
        (folder / f"img{i}.txt").write_text(f"a photo number {i}")
    for i in range(bad):
        (folder / f"broken{i}.jpg").write_bytes(b"not an image")
    return folder


def make_tar(members: list[tuple[str, bytes]]) -> bytes:
    """The bytes of a tar holding ``(name, data)`` members, in order (a WebDataset shard)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
