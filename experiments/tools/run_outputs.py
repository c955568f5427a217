"""A finished run folder opened for reading: its committed stage outputs, its trained model and its val scenes.

What a script needs to take a trained model apart after ``fourm-kfp run`` (or ``fourm-kfp stage``) has committed
the stages: the experiments' probes (this folder, and ``../2026-11-26-layout-to-rgb-zen4/``) call
:func:`open_run_outputs` instead of reaching into a stage body. It runs no stage and writes nothing:

1. the config is loaded as the run loaded it (the preset and the same ``--set`` overrides: the addresses follow
   from the config alone);
2. prepare-data, train-tokenizers, pretokenize and pretrain are found by content address under the run's store
   (:func:`fourm_kfp.contract.runner.output_store`, as ``fourm-kfp stage`` and ``status`` find them), and each must
   be committed (its manifest present), else an :class:`~fourm_kfp.contract.manifest.IncompleteOutputError` (a
   user error) names the stage and the place;
3. the model (the pretrain output, or another model trained on the same data and tokenizers) is opened with its
   tokenizers as an :class:`~fourm_kfp.evaluation.any_to_any.AnyToAny`;
4. the first val scenes are read with the evaluate stage's loader
   (:func:`fourm_kfp.evaluation.scene_loading.load_scenes`: ground truth and crop-0 tokens) from prepare-data's
   output alone, not from the whole dataset the evaluate stage reads: a run with labelers has its labelled
   modalities in the label stage's layer, which is not opened here, so their ground truth is missing.

It lives with its callers, outside the package: like them it imports the package as it was at the commit this folder
is pinned to (``COMMIT``; ``experiments/run.sh`` runs a script there), and it imports no stage body.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from fourm_kfp.config.fourm_config import FourMConfig
from fourm_kfp.config.loader import load_config
from fourm_kfp.contract.manifest import require_manifest
from fourm_kfp.contract.runner import output_store
from fourm_kfp.evaluation.any_to_any import AnyToAny
from fourm_kfp.evaluation.scene_loading import load_scenes
from fourm_kfp.evaluation.tasks import Scenes
from fourm_kfp.stages import PREPARE_DATA, PRETOKENIZE, PRETRAIN, TRAIN_TOKENIZERS
from fourm_kfp.storage import Store, open_store

#: the stages whose committed outputs a trained model is read from, upstream first
READ_STAGES = (PREPARE_DATA, TRAIN_TOKENIZERS, PRETOKENIZE, PRETRAIN)


@dataclass(frozen=True)
class RunOutputs:
    """A run folder's committed outputs, its model with its tokenizers, and its first val scenes."""

    config: FourMConfig
    outputs: dict[str, Store]  # stage name -> its committed output (the four of READ_STAGES)
    model_uri: str  # the pretrain output's URI, or the model given instead
    engine: AnyToAny
    scenes: Scenes  # the first val scenes' ground truth and tokens, from prepare-data's output (step 4 above)

    @property
    def prepared(self) -> Store:
        """prepare-data's output: the val scenes' exact ground truth, and the training split."""
        return self.outputs[PREPARE_DATA.name]


def open_run_outputs(preset: str, root: str, overrides: Sequence[str] = (), *, model_uri: str | None = None,
                     scenes: int | None = None) -> RunOutputs:
    """The committed outputs of ``preset`` (with ``overrides``) under the store ``root`` (a run folder or any store
    URI), the model of its pretrain output (or ``model_uri``: another model trained on the same data and tokenizers)
    with those tokenizers, and its first ``scenes`` val scenes (default: ``evaluate.num_samples``)."""
    config = load_config(preset, overrides=list(overrides))
    store_root = open_store(root)
    outputs = {}
    for spec in READ_STAGES:
        store = output_store(spec, config, store_root)
        require_manifest(store, f"the {spec.name} output of preset {preset!r}")
        outputs[spec.name] = store
    model_uri = model_uri or outputs[PRETRAIN.name].uri
    engine = AnyToAny(model_uri, tokenizers_uri=outputs[TRAIN_TOKENIZERS.name].uri)
    loaded = load_scenes(engine, outputs[PREPARE_DATA.name], outputs[PRETOKENIZE.name],
                         scenes or config.evaluate.num_samples)
    return RunOutputs(config, outputs, model_uri, engine, loaded)
