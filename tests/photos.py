"""A folder of a team's own photos for the real-data tests: random jpgs with caption side files, and broken files."""

from __future__ import annotations

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
