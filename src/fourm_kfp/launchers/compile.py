"""Compile the pipeline to YAML (the committed ``pipelines/fourm_pretrain.yaml``)."""

from __future__ import annotations

import os
from pathlib import Path


def default_output() -> Path:
    import fourm_kfp.pipelines

    return Path(fourm_kfp.pipelines.__file__).resolve().parent / "fourm_pretrain.yaml"


def compile_pipeline(output: str | os.PathLike | None = None) -> Path:
    from kfp import compiler

    from fourm_kfp.pipelines.fourm_pretrain import fourm_pretrain

    path = Path(output) if output else default_output()
    compiler.Compiler().compile(fourm_pretrain, str(path))
    return path
