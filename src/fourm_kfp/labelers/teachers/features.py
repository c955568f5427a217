"""CLIP and DINOv2 feature maps (4M-21's ``tok_clip`` and ``tok_dinov2`` targets), computed as ml-4m computes them.

* ``hf_clip`` (modality ``clip``): a CLIP vision tower (``CLIPVisionModelWithProjection``, or a whole CLIP folder):
  the patch tokens of the last layer, through the final layer norm and the projection, ``ln_post(x[:, 1:]) @ proj``
  (ml-4m's ``save_vq_tokens.py``): ``[grid, grid, projection_dim]``, 14 x 14 x 512 for CLIP-B/16 at 224 px.
* ``hf_dinov2`` (modality ``dinov2``): DINOv2's normed patch tokens (``x_norm_patchtokens``: the last hidden state
  after its layer norm, without the class and register tokens): ``[grid, grid, hidden_size]``, 16 x 16 x 768 for
  DINOv2-B/14 at 224 px.

The folder's processor resizes and crops the photo as the model was trained (CLIP: 224 px; DINOv2: 256 then a 224 px
centre crop). Config ``params``: ``bf16`` (default true). The dataset records each map's ``channels`` and ``grid``
(:attr:`~fourm_kfp.labelers.base.Labeler.modality_settings`), which the data gate checks every map against.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

import numpy as np

from fourm_kfp.labelers.base import LabelBatch, LabelerError, LabelerSetup, check_labels
from fourm_kfp.labelers.teachers.loading import TransformersTeacher, host


def processed_size(processor: Any) -> int:
    """The side of the square the processor feeds the network (its crop, else its resize)."""
    if getattr(processor, "do_center_crop", False) and getattr(processor, "crop_size", None):
        return int(processor.crop_size["height"])
    size = processor.size
    return int(size.get("height") or size["shortest_edge"])


class FeatureMapTeacher(TransformersTeacher):
    """A vision transformer whose patch tokens are the label (see the module docstring)."""

    version: ClassVar[str] = "1"
    defaults: ClassVar[Mapping[str, Any]] = {"bf16": True}

    def __init__(self, setup: LabelerSetup) -> None:
        super().__init__(setup)
        vision = self.model_config
        side = processed_size(self.processor)
        if side % vision.patch_size:
            raise LabelerError(f"labeler {self.name!r}: the processor's {side} px input is not whole patches of "
                               f"{vision.patch_size} px")
        self.grid = side // vision.patch_size
        self.channels = self.feature_channels(vision)

    def feature_channels(self, vision: Any) -> int:
        raise NotImplementedError

    def patch_features(self, outputs: Any) -> Any:
        """``[batch, grid * grid, channels]`` features of the network's outputs."""
        raise NotImplementedError

    @property
    def modality_settings(self) -> dict[str, Any]:
        return {"channels": self.channels, "grid": self.grid}

    def predict(self, batch: LabelBatch) -> list[np.ndarray]:
        """Each photo's feature map, float32 ``[grid, grid, channels]``."""
        with self.running():
            tokens = self.patch_features(self.model(**self.inputs(batch)))
        if tokens.shape[1] != self.grid * self.grid:
            raise LabelerError(f"labeler {self.name!r}: {tokens.shape[1]} patch tokens, expected {self.grid}^2")
        maps = tokens.reshape(len(batch), self.grid, self.grid, -1)
        return host(list(maps.unbind(0)))

    def label(self, batch: LabelBatch) -> list[Any]:
        return check_labels(self, batch, self.predict(batch))


class ClipFeatures(FeatureMapTeacher):
    name: ClassVar[str] = "hf_clip"
    modality = "clip"
    model_class: ClassVar[str] = "CLIPVisionModelWithProjection"

    def feature_channels(self, vision: Any) -> int:
        return int(vision.projection_dim)

    def patch_features(self, outputs: Any) -> Any:
        vision = self.model.vision_model
        return self.model.visual_projection(vision.post_layernorm(outputs.last_hidden_state[:, 1:]))


class Dinov2Features(FeatureMapTeacher):
    name: ClassVar[str] = "hf_dinov2"
    modality = "dinov2"
    model_class: ClassVar[str] = "AutoModel"

    def feature_channels(self, vision: Any) -> int:
        return int(vision.hidden_size)

    def patch_features(self, outputs: Any) -> Any:
        skip = 1 + int(getattr(self.model.config, "num_register_tokens", 0) or 0)
        return outputs.last_hidden_state[:, skip:]
