"""Compile the pipeline to YAML (the committed ``pipelines/fourm_pretrain.yaml``), for the images of one tag."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fourm_kfp.errors import UserError


def default_output() -> Path:
    import fourm_kfp.pipelines

    return Path(fourm_kfp.pipelines.__file__).resolve().parent / "fourm_pretrain.yaml"


def compile_pipeline(output: str | os.PathLike | None = None, image_tag: str = "") -> Path:
    """Write the compiled pipeline to ``output`` (default: the committed file). ``image_tag``: the tag of the
    images its steps (and the jobs they launch) run, e.g. a commit the image workflow built; default the package
    version (or ``$FOURM_IMAGE_TAG``). The components take their image when they are defined, so another tag is
    compiled in a fresh interpreter."""
    from fourm_kfp.images import IMAGE_TAG, IMAGE_TAG_ENV, IMAGE_TAG_PATTERN

    path = Path(output) if output else default_output()
    if image_tag and not IMAGE_TAG_PATTERN.fullmatch(image_tag):
        raise UserError(f"--image-tag {image_tag!r}: not a Docker image tag ([A-Za-z0-9_][A-Za-z0-9_.-]*, at most "
                        "128 characters)")
    if image_tag and image_tag != IMAGE_TAG:
        subprocess.run([sys.executable, "-m", "fourm_kfp.cli", "compile", "--output", str(path)], check=True,
                       env={**os.environ, IMAGE_TAG_ENV: image_tag}, stdout=subprocess.DEVNULL)
        return path
    from kfp import compiler

    from fourm_kfp.pipelines.fourm_pretrain import fourm_pretrain

    compiler.Compiler().compile(fourm_pretrain, str(path))
    return path
