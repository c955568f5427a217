"""An example labeler plug-in for fourm-kfp: a tiny convolutional depth teacher (``tiny_depth``).

It shows how a team wraps its own network as a labeler (see the README beside ``pyproject.toml``): the package
declares the class in the ``fourm_kfp.labelers`` entry-point group, the class subclasses
:class:`fourm_kfp.labelers.base.Labeler` with ``needs_weights`` and ``wants_accelerator`` set, and its weights are
read from the local file the label stage fetched (``setup.weights_path``: a local path or an ``s3://`` URI in the
config, never a model hub), as a ``torch.save`` state dict read with ``weights_only=True`` or a ``.safetensors``
file.

:class:`TinyDepthNet` maps RGB (uint8 scaled to 0..1) to positive relative depth (a softplus output, up to an
unknown scale) with three 3×3 convolutions; it has no dropout or normalisation statistics, so in eval mode it is a
fixed function. :class:`TinyDepthLabeler` runs it batched on ``setup.device`` and returns one float32 ``[H, W]``
array per image (the ``depth`` modality). :func:`save_random_network` writes a randomly initialised network, for
tests and for trying the plug-in out.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from fourm_kfp.labelers.base import LabelBatch, Labeler, LabelerError, LabelerSetup, check_labels

__all__ = ["TinyDepthLabeler", "TinyDepthNet", "load_state_dict", "save_random_network"]


class TinyDepthNet(nn.Module):
    """RGB ``[N, 3, H, W]`` in 0..1 → positive relative depth ``[N, H, W]``: three 3×3 convolutions."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1), nn.ReLU(),
            nn.Conv2d(width, 1, 3, padding=1), nn.Softplus(),
        )

    def forward(self, rgb: torch.Tensor) -> torch.Tensor:
        return self.layers(rgb)[:, 0]


def load_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The tensors of a weights file: ``.safetensors``, or a ``torch.save`` state dict read with
    ``weights_only=True`` (which refuses pickled code)."""
    if str(path).endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(str(path))
    return torch.load(path, map_location="cpu", weights_only=True)


def save_random_network(path: str | os.PathLike, seed: int = 0, width: int = 16) -> TinyDepthNet:
    """A :class:`TinyDepthNet` initialised from ``seed`` (the global torch generator is left as it was), saved to
    ``path`` (safetensors when it ends in ``.safetensors``, else ``torch.save``); returns the network in eval mode."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = TinyDepthNet(width)
    state = net.state_dict()
    if str(path).endswith(".safetensors"):
        from safetensors.torch import save_file

        save_file(state, str(path))
    else:
        torch.save(state, path)
    return net.eval()


class TinyDepthLabeler(Labeler):
    """Relative depth from :class:`TinyDepthNet`: params ``width`` (its channel count, which the weights must
    match) and ``batch_size`` (most images per forward pass)."""

    name = "tiny_depth"
    version = "1"
    modality = "depth"
    needs_weights = True
    wants_accelerator = True
    #: read by the label stage's data gate: a relative depth is checked for finite values only
    relative_depth = True
    defaults: ClassVar[Mapping[str, Any]] = {"width": 16, "batch_size": 32}

    def __init__(self, setup: LabelerSetup) -> None:
        super().__init__(setup)
        for key in ("width", "batch_size"):
            if isinstance(self.params[key], bool) or not isinstance(self.params[key], int) or self.params[key] < 1:
                raise LabelerError(f"labeler {self.name!r}: param {key!r} must be an integer >= 1, "
                                   f"got {self.params[key]!r}")
        if not setup.weights_path:
            raise LabelerError(f"labeler {self.name!r} needs weights: set its 'weights' to a local path or s3:// URI")
        self.net = TinyDepthNet(self.params["width"])
        try:
            self.net.load_state_dict(load_state_dict(setup.weights_path))
        except Exception as exc:  # any unreadable or mismatched file: name it
            raise LabelerError(f"labeler {self.name!r}: cannot load weights {setup.weights_path} "
                               f"(width {self.params['width']}): {exc}") from exc
        self.device = torch.device(setup.device)
        self.net.to(self.device).eval()

    @torch.inference_mode()
    def depth(self, images: list[np.ndarray]) -> list[np.ndarray]:
        """Relative depth of images of one size, one forward pass per ``batch_size`` of them."""
        out = []
        for start in range(0, len(images), self.params["batch_size"]):
            rgb = torch.from_numpy(np.stack(images[start:start + self.params["batch_size"]]).astype(np.uint8))
            rgb = rgb.to(self.device).permute(0, 3, 1, 2).float().div(255.0).contiguous()
            out.extend(d.numpy() for d in self.net(rgb).float().cpu())
        return out

    def label(self, batch: LabelBatch) -> list[Any]:
        # images of different sizes go through the network in separate groups, each in batch order
        values: list[Any] = [None] * len(batch)
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, image in enumerate(batch.images):
            groups.setdefault(np.shape(image), []).append(i)
        for indices in groups.values():
            for i, depth in zip(indices, self.depth([batch.images[i] for i in indices]), strict=True):
                values[i] = depth.astype(np.float32, copy=False)
        return check_labels(self, batch, values)
