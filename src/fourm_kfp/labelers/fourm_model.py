"""A trained 4M model of this pipeline as a teacher: it labels photos with one of the modalities it generates.

Self-training: a model pre-trained where every modality exists (the synthetic scenes) reads depth, normals,
semantic segmentation, boxes or a caption off a team's photos through the any-to-any generation path
(:class:`fourm_kfp.evaluation.any_to_any.AnyToAny`), so a preset can label real photos end to end with no outside
network. Its labels are what that model believes, not ground truth: an evaluation against them says how well a
student reproduces its teacher.

Config (``label.labelers[]``): ``name: fourm_model``, ``weights``: the model, a committed pretrain output (a local
path or ``s3://`` URI of its folder; the label stage also takes ``preset:<name>``, that preset's pretrain output in
the same store), ``params``:

* ``modality``: what to label (one of the model's generated modalities: depth, normal, semseg, det, caption, ...);
* ``steps``: MaskGIT steps for an image modality (1: one pass over the whole grid, most likely tokens, as the
  evaluate stage reads maps off an image); text is decoded greedily.

Generation is at temperature 0, so labels are deterministic; of generated boxes only the well-formed ones are kept
(none: no det label for that photo); a photo of another size than the model's is resized
to it (bilinear) and an image label back to the photo's size (nearest for class ids and binary maps).
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar, Mapping

import numpy as np
from PIL import Image

from fourm_kfp.data.modalities import get_modality, well_formed_det
from fourm_kfp.labelers.base import LabelBatch, Labeler, LabelerError, LabelerSetup, check_labels


def _resize(value: np.ndarray, size: int, discrete: bool) -> np.ndarray:
    if value.shape[0] == size:
        return value
    if value.ndim == 3 and value.dtype != np.uint8:  # normals: per channel, then back to unit length
        channels = [_resize(value[..., c], size, False) for c in range(value.shape[-1])]
        stacked = np.stack(channels, axis=-1)
        norm = np.linalg.norm(stacked, axis=-1, keepdims=True)
        return np.where(norm > 0, stacked / np.maximum(norm, 1e-6), 0.0).astype(np.float32)
    mode = Image.NEAREST if discrete else Image.BILINEAR
    if value.dtype == np.float32:
        return np.asarray(Image.fromarray(value, mode="F").resize((size, size), mode), np.float32)
    return np.asarray(Image.fromarray(value).resize((size, size), mode))


@functools.lru_cache(maxsize=4)
def _engine(model_uri: str, device: str):
    """One loaded model per process, shared by the labelers that read several modalities off it."""
    from fourm_kfp.evaluation.any_to_any import AnyToAny

    return AnyToAny(model_uri, device=device)


class FourMModelLabeler(Labeler):
    name: ClassVar[str] = "fourm_model"
    version: ClassVar[str] = "2"  # 2: a det label keeps only well-formed boxes
    needs_weights: ClassVar[bool] = True
    wants_accelerator: ClassVar[bool] = True
    weights_kind: ClassVar[str] = "model"  # a committed pretrain output (a folder), not one file
    defaults: ClassVar[Mapping[str, Any]] = {"modality": "depth", "steps": 1}

    def __init__(self, setup: LabelerSetup) -> None:
        super().__init__(setup)
        from fourm_kfp.model.generation import SamplingArgs

        self.modality = str(self.params["modality"])
        get_modality(self.modality)
        self.engine = _engine(str(setup.weights_path), setup.device)
        if "rgb" not in self.engine.modalities or self.modality not in self.engine.modalities:
            raise LabelerError(f"labeler 'fourm_model': the model at {setup.weights_path} generates "
                               f"{self.engine.modalities}, not {self.modality!r} from rgb")
        self.sampling = SamplingArgs(steps=int(self.params["steps"]), temperature=0.0)

    @property
    def classes(self) -> tuple[str, ...] | None:
        """The model's vocabulary of the modality (its tokenizer bundle's), for semseg and det."""
        return self.engine.vocabularies.get(self.modality)

    def label(self, batch: LabelBatch) -> list[Any]:
        size = self.engine.image_size
        inputs = [{"rgb": _resize(np.asarray(image, np.uint8), size, False)} for image in batch.images]
        outputs = self.engine.generate(inputs, [self.modality], self.sampling, batch_size=max(len(inputs), 1))
        values = [out[self.modality] for out in outputs]
        spec = get_modality(self.modality)
        if spec.kind == "image" and not spec.grid_sized:  # a feature map stays at its grid
            values = [_resize(np.asarray(v), image.shape[0], spec.discrete) for v, image in zip(values, batch.images)]
        elif self.modality == "det":  # generated text: only its well-formed boxes, none = no label
            values = [well_formed_det(v, self.classes) or None for v in values]
        return check_labels(self, batch, values)
