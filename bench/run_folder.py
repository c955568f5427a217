"""A run folder's trained model and val scenes, for the benches that probe a model after the pipeline ran.

The stage outputs are found by content address under the run's root (:func:`fourm_kfp.contract.runner.
output_store`, as ``fourm-kfp stage`` finds them), so the preset and overrides must be the run's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from fourm_kfp.config.fourm_config import FourMConfig
from fourm_kfp.config.loader import load_config
from fourm_kfp.contract.runner import output_store
from fourm_kfp.evaluation.any_to_any import AnyToAny
from fourm_kfp.evaluation.tasks import Scenes
from fourm_kfp.stages import STAGES
from fourm_kfp.stages.evaluate import load_scenes
from fourm_kfp.storage import Store, open_store


@dataclass
class RunFolder:
    config: FourMConfig
    prepared: Store  # prepare-data's output (the val scenes' ground truth, the training captions)
    model_uri: str
    engine: AnyToAny
    scenes: Scenes  # the first val scenes' ground truth and tokens (stages.evaluate.load_scenes)


def open_run(preset: str, root: str, overrides: Sequence[str] = (), model_uri: str | None = None,
             scenes: int | None = None) -> RunFolder:
    """The model of ``root``'s pretrain output (or ``model_uri``, another model on the same data and tokenizers)
    with its tokenizers, and the first ``scenes`` val scenes (default: ``evaluate.num_samples``)."""
    config = load_config(preset, overrides=list(overrides))
    store = {name: output_store(STAGES[name], config, open_store(root))
             for name in ("prepare-data", "train-tokenizers", "pretokenize", "pretrain")}
    model_uri = model_uri or store["pretrain"].uri
    engine = AnyToAny(model_uri, tokenizers_uri=store["train-tokenizers"].uri)
    loaded = load_scenes(engine, store["prepare-data"], store["pretokenize"], scenes or config.evaluate.num_samples)
    return RunFolder(config, store["prepare-data"], model_uri, engine, loaded)
