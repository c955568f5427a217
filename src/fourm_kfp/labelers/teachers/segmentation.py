"""Semantic segmentation from transformers' semantic and universal segmentation networks, as class-id maps.

Config: ``name: hf_semseg``, ``weights``: the model folder (Mask2Former, MaskFormer, SegFormer, UperNet, DPT, BEiT,
...), ``params``: ``bf16`` (default true). A universal model (Mask2Former, MaskFormer) is read as transformers'
``post_process_semantic_segmentation`` reads it, every pixel the class of its most likely mask (Mask2Former's in
fewer operations, :func:`mask2former_semantic_maps`); a semantic one by
the per-pixel argmax of its logits resized to the photo. The model's ``id2label`` is the vocabulary, in id order:
the label stage records it in the dataset (4M-21's Mask2Former Swin-B COCO panoptic gives 133 classes; 4M's 134th,
"no class", is never predicted by this post-processing). Ids are stored as uint8, or uint16 past 256 classes.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

import numpy as np

from fourm_kfp.data.modalities import class_id_dtype
from fourm_kfp.labelers.base import LabelBatch, LabelerError, LabelerSetup, check_labels
from fourm_kfp.labelers.teachers.loading import TransformersTeacher, auto_model_types, host

#: model types transformers loads as universal segmentation (masks with classes) rather than per-pixel logits
UNIVERSAL_TYPES = frozenset({"mask2former", "maskformer"})


#: the side transformers' Mask2Former post-processing brings every mask to before it resizes to the photo
MASK2FORMER_MASK_SIDE = 384


#: query masks brought through the 384 px step at once, per photo: a few MB, so the step stays in the CPU's cache
MASK2FORMER_QUERY_CHUNK = 16


def mask2former_semantic_maps(outputs: Any, size: tuple[int, int]) -> Any:
    """transformers' ``Mask2FormerImageProcessor.post_process_semantic_segmentation`` for a batch of photos of one
    ``size``, in fewer operations: it weighs the query masks (sigmoid of their logits resized to 384 px) by the
    queries' class probabilities and resizes the class maps to the photo; bilinear resizing is linear, so resizing
    the query masks to the photo first and weighing them there is the same map, computed on the photo's pixels
    rather than 384 x 384 of them; and each mask is resized on its own, so a photo's masks go through the 384 px step
    a few at a time (:data:`MASK2FORMER_QUERY_CHUNK`), in the cache, rather than all at once through memory. On a CPU
    the post-processing took half the time of a Swin-T forward at 224 px, now a sixth; the tests check the maps
    against transformers' own, pixel for pixel."""
    import torch
    import torch.nn.functional as F

    side = (MASK2FORMER_MASK_SIDE, MASK2FORMER_MASK_SIDE)
    logits = outputs.masks_queries_logits.float()
    classes = outputs.class_queries_logits.float().softmax(dim=-1)[..., :-1]
    maps = []
    for image in range(logits.shape[0]):
        masks = torch.cat([F.interpolate(F.interpolate(chunk, size=side, mode="bilinear", align_corners=False)
                                         .sigmoid_(), size=size, mode="bilinear", align_corners=False)
                           for chunk in logits[image:image + 1].split(MASK2FORMER_QUERY_CHUNK, dim=1)], dim=1)
        maps.append(torch.einsum("bqc,bqhw->bchw", classes[image:image + 1], masks).argmax(dim=1)[0])
    return maps


def vocabulary(config: Mapping[str, Any], where: str) -> tuple[str, ...]:
    """The class names of a model config's ``id2label``, in id order; ids must run 0..n-1."""
    id2label = config.get("id2label") or {}
    try:
        names = {int(k): str(v) for k, v in id2label.items()}
    except ValueError:
        raise LabelerError(f"{where}: the model's id2label has keys that are not ids: {sorted(id2label)[:5]}") from None
    if not names or sorted(names) != list(range(len(names))):
        raise LabelerError(f"{where}: the model's id2label must name classes 0..n-1, got ids {sorted(names)[:10]}")
    return tuple(names[i] for i in range(len(names)))


class SegmentationTeacher(TransformersTeacher):
    name: ClassVar[str] = "hf_semseg"
    version: ClassVar[str] = "1"
    modality = "semseg"
    reads_models: ClassVar[str] = "semantic-segmentation models and MaskFormer/Mask2Former"
    defaults: ClassVar[Mapping[str, Any]] = {"bf16": True}

    def __init__(self, setup: LabelerSetup) -> None:
        super().__init__(setup)
        self._classes = vocabulary(self.config, f"labeler {self.name!r}")
        self.dtype = class_id_dtype(len(self._classes))

    def accepted_model_types(self) -> frozenset[str]:
        return auto_model_types("MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES") | UNIVERSAL_TYPES

    def classes_for(self, config: Mapping[str, Any]) -> tuple[str, str]:
        universal = config.get("model_type") in UNIVERSAL_TYPES
        return ("AutoModelForUniversalSegmentation" if universal else "AutoModelForSemanticSegmentation",
                "AutoImageProcessor")

    @property
    def classes(self) -> tuple[str, ...]:
        return self._classes

    def predict(self, batch: LabelBatch) -> list[np.ndarray]:
        """The processor's semantic maps at each photo's size (int64 class ids)."""
        outputs = self.forward(batch)
        sizes = self.target_sizes(batch)
        if self.config.get("model_type") == "mask2former" and len(set(sizes)) == 1:
            return host(list(mask2former_semantic_maps(outputs, sizes[0])))
        return host(list(self.processor.post_process_semantic_segmentation(outputs, target_sizes=sizes)))

    def label(self, batch: LabelBatch) -> list[Any]:
        return check_labels(self, batch, [ids.astype(self.dtype) for ids in self.predict(batch)])
