"""CLIP and DINOv2 feature maps (4M-21's ``tok_clip`` and ``tok_dinov2`` targets), computed as ml-4m computes them.

* ``hf_clip`` (modality ``clip``): a CLIP vision tower (``CLIPVisionModelWithProjection``, or a whole CLIP folder):
  the patch tokens of the last layer, through the final layer norm and the projection, ``ln_post(x[:, 1:]) @ proj``
  (ml-4m's ``save_vq_tokens.py``): ``[grid, grid, projection_dim]``, 14 x 14 x 512 for CLIP-B/16 at 224 px.
  It reads folders of the model types ``clip`` and ``clip_vision_model``.
* ``hf_dinov2`` (modality ``dinov2``): DINOv2's normed patch tokens (``x_norm_patchtokens``: the last hidden state
  after its layer norm, without the class and register tokens): ``[grid, grid, hidden_size]``, 16 x 16 x 768 for
  DINOv2-B/14 at 224 px. It reads folders of the model types ``dinov2`` and ``dinov2_with_registers``.

The network's input side is the folder's processor's (its crop, else its resize: 224 px for both published
folders), so ``grid`` is that side over the patch size. Param ``preprocess`` says how a photo becomes that input:

* ``ml4m`` (the default): as ml-4m made the maps its CLIP and DINOv2 tokenizers were trained on
  (:func:`fourm_kfp.tokenizers.ml4m.conventions.feature_teacher_input`): the whole centred square (the prepared
  photos are square already) resized to the side by Pillow's bicubic, normalised with ImageNet's mean and std. The
  map covers the same square as the sample's rgb, depth and semseg. DINOv2's position table (518 px) is resized to
  the grid as DINOv2's own code does (``interpolate_offset`` 0.1: a scale factor of ``(grid + 0.1) / 37``, which
  ml-4m runs through ``torch.hub``), not as transformers does (to the grid's size); a registers model's
  (``interpolate_offset`` 0, antialiased) is the same in both.
* ``processor``: the folder's own processor and transformers' own forward (CLIP: shortest side to 224, a 224 px
  crop, CLIP's mean and std; DINOv2: 256 px then a 224 px centre crop, so its map covers the middle 87.5%).

Other config ``params``: ``bf16`` (default true). The dataset records each map's ``channels`` and ``grid``
(:attr:`~fourm_kfp.labelers.base.Labeler.modality_settings`), which the data gate checks every map against.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Mapping

import numpy as np

from fourm_kfp.labelers.base import LabelBatch, LabelerError, LabelerSetup, check_labels
from fourm_kfp.labelers.teachers.loading import TransformersTeacher, host

#: param ``preprocess``: how a photo becomes the network's input (see the module docstring)
PREPROCESS = ("ml4m", "processor")
#: DINOv2's ``interpolate_offset`` for its models without registers (``dinov2/hub/backbones.py``)
DINOV2_INTERPOLATE_OFFSET = 0.1


def processed_size(processor: Any) -> int:
    """The side of the square the processor feeds the network (its crop, else its resize)."""
    if getattr(processor, "do_center_crop", False) and getattr(processor, "crop_size", None):
        return int(processor.crop_size["height"])
    size = processor.size
    return int(size.get("height") or size["shortest_edge"])


class FeatureMapTeacher(TransformersTeacher):
    """A vision transformer whose patch tokens are the label (see the module docstring)."""

    version: ClassVar[str] = "2"
    defaults: ClassVar[Mapping[str, Any]] = {"bf16": True, "preprocess": "ml4m"}
    #: the config model types it reads
    model_types: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, setup: LabelerSetup) -> None:
        preprocess = {**self.defaults, **setup.params}.get("preprocess")
        if preprocess not in PREPROCESS:
            raise LabelerError(f"labeler {self.name!r}: param 'preprocess' must be one of {', '.join(PREPROCESS)}, "
                               f"got {preprocess!r}")
        super().__init__(setup)
        vision = self.model_config
        self.side = processed_size(self.processor)
        if self.side % vision.patch_size:
            raise LabelerError(f"labeler {self.name!r}: the processor's {self.side} px input is not whole patches of "
                               f"{vision.patch_size} px")
        self.grid = self.side // vision.patch_size
        self.channels = self.feature_channels(vision)

    def accepted_model_types(self) -> frozenset[str]:
        return self.model_types

    def feature_channels(self, vision: Any) -> int:
        raise NotImplementedError

    def patch_features(self, outputs: Any) -> Any:
        """``[batch, grid * grid, channels]`` features of the network's outputs."""
        raise NotImplementedError

    @property
    def modality_settings(self) -> dict[str, Any]:
        return {"channels": self.channels, "grid": self.grid}

    def inputs(self, batch: LabelBatch, **extra: Any) -> dict[str, Any]:
        """The batch as the network's ``pixel_values`` (param ``preprocess``), on the device."""
        if self.params["preprocess"] == "processor":
            return super().inputs(batch, **extra)
        from fourm_kfp.tokenizers.ml4m.conventions import feature_teacher_input

        pixels = feature_teacher_input(batch.images, self.side)
        return {"pixel_values": pixels.to(self.device, non_blocking=True)}

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
    model_types: ClassVar[frozenset[str]] = frozenset({"clip", "clip_vision_model"})
    reads_models: ClassVar[str] = "CLIP vision towers (a CLIP folder or its vision model with projection)"

    def feature_channels(self, vision: Any) -> int:
        return int(vision.projection_dim)

    def patch_features(self, outputs: Any) -> Any:
        vision = self.model.vision_model
        return self.model.visual_projection(vision.post_layernorm(outputs.last_hidden_state[:, 1:]))


def dinov2_position_table(table: Any, height: int, width: int, patch_size: int) -> Any:
    """DINOv2's own ``interpolate_pos_encoding`` (``dinov2/models/vision_transformer.py``, models without registers):
    the ``1 x (1 + M^2) x D`` table at the input's grid, bicubic (no antialiasing) with the scale factor
    ``(grid + 0.1) / M``, in float32."""
    import torch
    import torch.nn.functional as F

    positions = table.shape[1] - 1
    rows, cols = height // patch_size, width // patch_size
    if positions == rows * cols and height == width:
        return table
    side = int(math.sqrt(positions))
    patches = table[:, 1:].float().reshape(1, side, side, -1).permute(0, 3, 1, 2)
    scale = ((rows + DINOV2_INTERPOLATE_OFFSET) / side, (cols + DINOV2_INTERPOLATE_OFFSET) / side)
    patches = F.interpolate(patches, scale_factor=scale, mode="bicubic", antialias=False)
    if tuple(patches.shape[-2:]) != (rows, cols):
        raise ValueError(f"DINOv2's position table resized to {tuple(patches.shape[-2:])}, not {(rows, cols)}")
    patches = patches.permute(0, 2, 3, 1).reshape(1, rows * cols, -1)
    return torch.cat((table[:, :1].float(), patches), dim=1).to(table.dtype)


class DINOv2Model:
    """Reads a ``dinov2`` folder as transformers' ``Dinov2Model`` whose position table is resized as DINOv2's own
    code resizes it (:func:`dinov2_position_table`); a model class for :func:`~.loading.load_model`, which keeps it
    apart from the folder's plain ``Dinov2Model`` (param ``preprocess: processor``)."""

    @staticmethod
    def from_pretrained(folder: str, **kwargs: Any) -> Any:
        from transformers import Dinov2Model

        model = Dinov2Model.from_pretrained(folder, **kwargs)
        embeddings = model.embeddings

        def interpolate_pos_encoding(tokens: Any, height: int, width: int) -> Any:
            return dinov2_position_table(embeddings.position_embeddings, height, width, embeddings.patch_size)

        embeddings.interpolate_pos_encoding = interpolate_pos_encoding
        return model


class Dinov2Features(FeatureMapTeacher):
    name: ClassVar[str] = "hf_dinov2"
    modality = "dinov2"
    model_class: ClassVar[str] = "AutoModel"
    model_types: ClassVar[frozenset[str]] = frozenset({"dinov2", "dinov2_with_registers"})
    reads_models: ClassVar[str] = "DINOv2 backbones (with or without registers)"

    def classes_for(self, config: Mapping[str, Any]) -> tuple[str | type, str]:
        if self.params["preprocess"] == "ml4m" and config.get("model_type") == "dinov2":
            return DINOv2Model, self.processor_class
        return self.model_class, self.processor_class

    def feature_channels(self, vision: Any) -> int:
        return int(vision.hidden_size)

    def patch_features(self, outputs: Any) -> Any:
        skip = 1 + int(getattr(self.model.config, "num_register_tokens", 0) or 0)
        return outputs.last_hidden_state[:, skip:]
