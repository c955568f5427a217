"""Surface normals: a DPT with a 3-channel head in Omnidata's layout, and normals derived from a depth teacher.

transformers has no normal-estimation network, so this module provides two labelers of the ``normal`` modality:

* ``hf_normal``: :class:`DPTForNormalEstimation`, transformers' DPT (``DPTForDepthEstimation``, plain or hybrid)
  whose head ends in 3 channels instead of 1, the layout of Omnidata's normal model (``DPTDepthModel`` with
  ``num_channels=3``: conv, 2x upsampling, conv, ReLU, 1x1 conv to 3 channels, ReLU), loaded from a folder as
  ``save_pretrained`` writes it (weights converted from an Omnidata checkpoint, or trained). Its output is read as
  Omnidata's: clamped to [0, 1], ``n = 2 x - 1``, in 2D-3D-S's camera frame (x right, y down, z towards the
  camera; EPFL-VILAB/omnidata#13), then turned into this pipeline's frame (x right, y up, z towards the camera) and
  made unit length. A pixel whose vector is near zero is invalid (the zero vector).
* ``normal_from_depth``: no weights of its own; it reads the depth labels another labeler listed before it made of
  the same photos (:attr:`~fourm_kfp.labelers.base.Labeler.reads`) and takes the normal of the surface they
  describe: each pixel back-projected through a pinhole camera of horizontal field of view ``fov_deg`` (default
  60), the normal the cross product of the surface's derivatives along the image's axes (central differences),
  facing the camera. A relative depth gives the same normals as metric depth up to its scale, which normals do not
  depend on. Pixels of invalid depth, or next to one, are invalid.
"""

from __future__ import annotations

import functools
import math
from typing import Any, ClassVar, Mapping

import numpy as np

from fourm_kfp.labelers.base import LabelBatch, Labeler, LabelerError, LabelerSetup, check_labels
from fourm_kfp.labelers.teachers.loading import TransformersTeacher

#: A decoded vector shorter than this is no normal (invalid).
MIN_NORMAL_LENGTH = 1e-3
#: Omnidata's camera frame (x right, y down, z towards the camera) -> ours (x right, y up, z towards the camera).
OMNIDATA_TO_CAMERA = np.array([1.0, -1.0, 1.0], np.float32)


def unit_normals(vectors: np.ndarray) -> np.ndarray:
    """``[..., 3]`` vectors made unit length; those shorter than :data:`MIN_NORMAL_LENGTH` become zero (invalid)."""
    norm = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return np.where(norm > MIN_NORMAL_LENGTH, vectors / np.maximum(norm, MIN_NORMAL_LENGTH), 0.0).astype(np.float32)


@functools.lru_cache(maxsize=1)
def _dpt_normal_class():
    from torch import nn
    from transformers import DPTForDepthEstimation

    class DPTForNormalEstimation(DPTForDepthEstimation):
        """DPT whose head ends in 3 channels (Omnidata's normal layout); ``predicted_depth`` holds ``[B, 3, H, W]``
        in [0, 1] after ReLU, to be read as Omnidata's encoding."""

        def __init__(self, config):
            super().__init__(config)
            last = self.head.head[-2]
            self.head.head[-2] = nn.Conv2d(last.in_channels, 3, kernel_size=1, stride=1, padding=0)
            self.post_init()

    return DPTForNormalEstimation


def __getattr__(name: str) -> Any:
    """``DPTForNormalEstimation`` is built on first use, so importing this module needs no transformers."""
    if name == "DPTForNormalEstimation":
        cls = _dpt_normal_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)


class NormalTeacher(TransformersTeacher):
    name: ClassVar[str] = "hf_normal"
    version: ClassVar[str] = "1"
    modality = "normal"
    reads_models: ClassVar[str] = "DPTs with a 3-channel head"
    defaults: ClassVar[Mapping[str, Any]] = {"bf16": True}

    def accepted_model_types(self) -> frozenset[str]:
        return frozenset({"dpt"})

    def classes_for(self, config: Mapping[str, Any]) -> tuple[type, str]:
        return _dpt_normal_class(), "AutoImageProcessor"

    def predict(self, batch: LabelBatch) -> np.ndarray:
        """The network's output at each photo's size (bicubic, as transformers resizes DPT depth), ``[B, H, W, 3]``
        in Omnidata's encoding, clamped to [0, 1]."""
        import torch.nn.functional as F

        sizes = set(self.target_sizes(batch))
        if len(sizes) != 1:
            raise LabelerError(f"labeler {self.name!r}: a batch of photos of several sizes {sorted(sizes)}")
        out = self.forward(batch).predicted_depth.float()
        out = F.interpolate(out, size=sizes.pop(), mode="bicubic", align_corners=False).clamp(0.0, 1.0)
        return out.permute(0, 2, 3, 1).cpu().numpy()

    def label(self, batch: LabelBatch) -> list[Any]:
        encoded = self.predict(batch)
        return check_labels(self, batch, [unit_normals((2.0 * e - 1.0) * OMNIDATA_TO_CAMERA) for e in encoded])


def _unit(vectors: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return np.divide(vectors, norm, out=np.zeros_like(vectors), where=norm > 0)


def normals_from_depth(depth: np.ndarray, fov_deg: float) -> np.ndarray:
    """Unit normals ``[H, W, 3]`` (x right, y up, z towards the camera) of the surface a depth map ``[H, W]``
    describes, seen by a pinhole camera of horizontal field of view ``fov_deg``; zero where depth is invalid."""
    depth = np.asarray(depth, np.float64)
    height, width = depth.shape
    focal = (width / 2.0) / math.tan(math.radians(fov_deg) / 2.0)
    v, u = np.mgrid[0:height, 0:width].astype(np.float64)
    # Back-projected points in the camera frame of the image (x right, y down, z away from the camera).
    points = np.stack([(u - (width - 1) / 2.0) * depth / focal, (v - (height - 1) / 2.0) * depth / focal, depth], -1)
    d_u = _unit(np.gradient(points, axis=1))  # unit tangents: the cross product's length is the sine of their
    d_v = _unit(np.gradient(points, axis=0))  # angle, whatever the depth's scale
    facing = np.cross(d_v, d_u)  # towards the camera: z < 0 in this frame
    camera = facing * np.array([1.0, -1.0, -1.0])  # -> x right, y up, z towards the camera
    positive = depth > 0
    valid = positive.copy()  # a pixel and its four neighbours have depth
    valid[1:] &= positive[:-1]
    valid[:-1] &= positive[1:]
    valid[:, 1:] &= positive[:, :-1]
    valid[:, :-1] &= positive[:, 1:]
    return np.where(valid[..., None], unit_normals(camera), 0.0).astype(np.float32)


class NormalFromDepth(Labeler):
    name: ClassVar[str] = "normal_from_depth"
    version: ClassVar[str] = "1"
    modality = "normal"
    reads: ClassVar[tuple[str, ...]] = ("depth",)
    defaults: ClassVar[Mapping[str, Any]] = {"fov_deg": 60.0}

    def __init__(self, setup: LabelerSetup) -> None:
        super().__init__(setup)
        self.check_number("fov_deg", 1.0, 179.0)

    def label(self, batch: LabelBatch) -> list[Any]:
        depths = batch.labels.get("depth")
        if depths is None:
            raise LabelerError(f"labeler {self.name!r}: the batch carries no depth labels to derive normals from")
        fov = float(self.params["fov_deg"])
        return check_labels(self, batch, [None if d is None else normals_from_depth(d, fov) for d in depths])
