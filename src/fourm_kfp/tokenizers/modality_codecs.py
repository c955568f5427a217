"""Per-modality codecs between in-memory arrays (:mod:`fourm_kfp.data.modalities`) and VQ-VAE tensors.

A codec says, for the image-like modalities whose record names it (``codec``, a key of :data:`CODECS`), how a batch
of in-memory arrays becomes the network input ``[B, in_channels, H, W]``, which reconstruction loss fits the decoder
output ``[B, out_channels, H, W]``, and how that output becomes in-memory arrays again. The network input is also the
reconstruction target.

==========  ==============================================  ==============================================
modality    input channels                                  output channels → arrays; loss
==========  ==============================================  ==============================================
rgb         3: ``(x / 255 - mean) / std`` per channel        3 → uint8 ``[H, W, 3]``; MSE + 0.5 * L1
depth       2: normalised log-depth (0 where invalid),      2: log-depth + validity logit → metres, 0 where
            validity; relative depth: the map standardised  invalid (relative: the standardised map); L1 on
            per image (:func:`standardize_depth`)           valid pixels + BCE on validity
normal      3: unit vectors, zero where invalid              4: vector + validity logit → unit vectors or 0;
                                                            (1 - cosine) on valid pixels + BCE on validity
semseg      one-hot over the vocabulary's classes             class logits → ids (uint8; uint16 above 256
                                                            classes); cross-entropy
edge        1: 0/1 (``edge``, ``canny_edge``)              1 logit → uint8 0/1; BCE
features    C: a feature map ``[g, g, C]`` (``clip``,         C → float32 ``[g, g, C]`` (un-standardised);
            ``dinov2``) standardised per channel with the    MSE on the standardised features
            training maps' mean and std
==========  ==============================================  ==============================================

Normalisation statistics come from training data (:func:`fit_normalisation`, on up to 512 images),
are stored in :class:`~fourm_kfp.tokenizers.vqvae.VQVAEConfig` ``.norm_stats`` and hence saved with the
tokenizer. Codecs are looked up by name in :data:`CODECS`.

What a codec takes from the dataset (:mod:`fourm_kfp.data.vocabularies`) are its *settings*
(:meth:`ImageCodec.settings_for`): semseg's ``classes`` (the vocabulary's size, when not the six synthetic
classes) and depth's ``relative`` (a teacher's relative depth). They are saved with the tokenizer
(``VQVAEConfig.codec_settings``), and :func:`get_codec` builds the codec they describe; a codec without settings
(every tokenizer saved before settings existed) is the default one: six classes, metric depth. A feature map's
codec always has its settings, ``channels`` and ``grid`` (the labeler's, which the dataset records): they give its
channel count and its tokenizer's grid (patch 1: one token per cell of the teacher's grid).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch
import torch.nn.functional as F

from fourm_kfp.data.modalities import MODALITIES, class_id_dtype, get_modality
from fourm_kfp.data.vocabularies import DEFAULT_VOCABULARIES, DatasetMeta

Stats = dict[str, list[float]]
#: :func:`fit_normalisation` looks at no more images than this.
MAX_FIT_IMAGES = 512


def _tensor(arrays: Any, device: torch.device | str | None) -> torch.Tensor:
    return torch.as_tensor(np.asarray(arrays) if not isinstance(arrays, torch.Tensor) else arrays, device=device)


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp_min(1.0)


class ImageCodec:
    """Base class: one image-like modality's input format, loss and output format."""

    name: str
    in_channels: int
    out_channels: int

    def fit(self, arrays: np.ndarray) -> Stats:
        """Normalisation statistics from a sample of training arrays ``[N, H, W(, C)]``."""
        return {}

    def settings_for(self, meta: DatasetMeta, modality: str | None = None) -> dict[str, Any]:
        """What this codec takes from a dataset's vocabularies and modality settings for ``modality`` (default: the
        codec's own name; empty: the default codec)."""
        return {}

    def configured(self, settings: Mapping[str, Any]) -> "ImageCodec":
        """The codec with ``settings`` (:meth:`settings_for`'s)."""
        raise ValueError(f"the {self.name} codec takes no settings, got {dict(settings)}")

    def reference(self, arrays: np.ndarray) -> np.ndarray:
        """The in-memory values that decoding tokens reproduces, for arrays as stored: the arrays themselves (a
        relative depth map standardised)."""
        return arrays

    def to_input(self, arrays: Any, stats: Stats, device: torch.device | str | None = None) -> torch.Tensor:
        """In-memory batch ``[B, H, W(, C)]`` (numpy or torch) → float input ``[B, in_channels, H, W]``."""
        raise NotImplementedError

    def loss(self, out: torch.Tensor, x: torch.Tensor, stats: Stats) -> torch.Tensor:
        """Reconstruction loss of decoder output ``out`` for input ``x``."""
        raise NotImplementedError

    def to_arrays(self, out: torch.Tensor, stats: Stats) -> np.ndarray:
        """Decoder output ``[B, out_channels, H, W]`` → in-memory batch (numpy, the modality's dtype)."""
        raise NotImplementedError


class RGBCodec(ImageCodec):
    name, in_channels, out_channels = "rgb", 3, 3

    def fit(self, arrays: np.ndarray) -> Stats:
        pixels = np.asarray(arrays, dtype=np.float64).reshape(-1, 3) / 255.0
        return {"mean": pixels.mean(0).tolist(), "std": np.maximum(pixels.std(0), 1e-3).tolist()}

    def _mean_std(self, stats: Stats, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        return tuple(torch.tensor(stats[k], device=device).view(1, 3, 1, 1) for k in ("mean", "std"))

    def to_input(self, arrays, stats, device=None):
        x = _tensor(arrays, device).float().permute(0, 3, 1, 2) / 255.0
        mean, std = self._mean_std(stats, x.device)
        return (x - mean) / std

    def loss(self, out, x, stats):
        return F.mse_loss(out, x) + 0.5 * F.l1_loss(out, x)

    def to_arrays(self, out, stats):
        mean, std = self._mean_std(stats, out.device)
        rgb = ((out.float() * std + mean) * 255.0).round().clamp(0, 255)
        return rgb.to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()


def standardize_depth(depth: torch.Tensor, valid: torch.Tensor, trim: float = 0.1) -> torch.Tensor:
    """Each map of ``depth`` ``[B, H, W]`` standardised on its ``valid`` pixels (0 elsewhere), robustly: the mean
    and standard deviation are those of the valid values with the lowest and highest ``trim`` of them left out (4M's
    truncated depth standardisation of its teachers' relative depth, here over the valid pixels only)."""
    out = torch.zeros_like(depth, dtype=torch.float32)
    for i in range(depth.shape[0]):
        values = torch.sort(depth[i][valid[i]].float()).values
        if values.numel() == 0:
            continue
        kept = values[int(trim * values.numel()): max(int((1 - trim) * values.numel()), 1)]
        scale = torch.sqrt(kept.var(unbiased=kept.numel() > 1) + 1e-6)
        out[i] = torch.where(valid[i], (depth[i].float() - kept.mean()) / scale, 0.0)
    return out


class DepthCodec(ImageCodec):
    """Metric depth as normalised log-depth; relative depth (``relative=True``: a teacher's, of unknown scale and
    shift) standardised per image, and decoded to that standardised map."""

    name, in_channels, out_channels = "depth", 2, 2

    def __init__(self, relative: bool = False) -> None:
        self.relative = relative

    def settings_for(self, meta: DatasetMeta, modality: str | None = None) -> dict[str, Any]:
        return {"relative": True} if meta.setting(modality or self.name, "relative") else {}

    def configured(self, settings: Mapping[str, Any]) -> "DepthCodec":
        _check_settings(self, settings, {"relative"})
        return DepthCodec(relative=bool(settings.get("relative", False)))

    def _valid(self, depth: torch.Tensor) -> torch.Tensor:
        return torch.isfinite(depth) & (depth > 0)

    def reference(self, arrays: np.ndarray) -> np.ndarray:
        if not self.relative:
            return arrays
        depth = _tensor(arrays, None).float()
        return standardize_depth(depth, self._valid(depth)).numpy()

    def fit(self, arrays: np.ndarray) -> Stats:
        if self.relative:  # standardised per image: nothing to fit
            return {}
        depth = np.asarray(arrays, dtype=np.float64)
        logs = np.log(depth[np.isfinite(depth) & (depth > 0)])
        if logs.size == 0:
            raise ValueError("depth: no valid (positive) pixels to fit the normalisation on")
        return {"log_mean": [float(logs.mean())], "log_std": [float(max(logs.std(), 1e-3))]}

    def to_input(self, arrays, stats, device=None):
        depth = _tensor(arrays, device).float()
        valid = self._valid(depth)
        if self.relative:
            return torch.stack([standardize_depth(depth, valid), valid.float()], dim=1)
        log = (torch.log(torch.where(valid, depth, 1.0)) - stats["log_mean"][0]) / stats["log_std"][0]
        return torch.stack([torch.where(valid, log, 0.0), valid.float()], dim=1)

    def loss(self, out, x, stats):
        valid = x[:, 1]
        return _masked_mean((out[:, 0] - x[:, 0]).abs(), valid) + F.binary_cross_entropy_with_logits(out[:, 1], valid)

    def to_arrays(self, out, stats):
        out = out.float()
        depth = out[:, 0] if self.relative else torch.exp(out[:, 0] * stats["log_std"][0] + stats["log_mean"][0])
        return torch.where(out[:, 1] > 0, depth, 0.0).cpu().numpy().astype(np.float32)


class NormalCodec(ImageCodec):
    name, in_channels, out_channels = "normal", 3, 4

    def to_input(self, arrays, stats, device=None):
        return _tensor(arrays, device).float().permute(0, 3, 1, 2)

    def loss(self, out, x, stats):
        valid = (x.abs().sum(dim=1) > 0).float()
        cosine = F.cosine_similarity(out[:, :3], x, dim=1, eps=1e-6)
        return _masked_mean(1.0 - cosine, valid) + F.binary_cross_entropy_with_logits(out[:, 3], valid)

    def to_arrays(self, out, stats):
        out = out.float()
        normal = F.normalize(out[:, :3], dim=1, eps=1e-6) * (out[:, 3:] > 0)
        return normal.permute(0, 2, 3, 1).cpu().numpy().astype(np.float32)


class SemsegCodec(ImageCodec):
    """One channel per class of the vocabulary (``classes``; by default the six synthetic ones)."""

    name = "semseg"
    DEFAULT_CLASSES = len(DEFAULT_VOCABULARIES["semseg"])

    def __init__(self, classes: int = DEFAULT_CLASSES) -> None:
        self.id_dtype = class_id_dtype(classes)
        self.in_channels = self.out_channels = classes

    def settings_for(self, meta: DatasetMeta, modality: str | None = None) -> dict[str, Any]:
        classes = len(meta.vocabulary(modality or self.name))
        return {"classes": classes} if classes != self.DEFAULT_CLASSES else {}

    def configured(self, settings: Mapping[str, Any]) -> "SemsegCodec":
        _check_settings(self, settings, {"classes"})
        return SemsegCodec(int(settings.get("classes", self.DEFAULT_CLASSES)))

    def to_input(self, arrays, stats, device=None):
        ids = arrays if isinstance(arrays, torch.Tensor) else np.asarray(arrays, dtype=np.int64)  # uint16 too
        ids = _tensor(ids, device).long().clamp(0, self.in_channels - 1)
        return F.one_hot(ids, self.in_channels).permute(0, 3, 1, 2).float()

    def loss(self, out, x, stats):
        return F.cross_entropy(out, x.argmax(dim=1))

    def to_arrays(self, out, stats):
        ids = out.argmax(dim=1)
        if self.id_dtype == np.uint8:
            return ids.to(torch.uint8).cpu().numpy()
        return ids.cpu().numpy().astype(self.id_dtype)


class EdgeCodec(ImageCodec):
    """Plain BCE: a ``pos_weight`` for the sparse edges (``sqrt(neg / pos)`` ~ 4.4) buys recall with false alarms
    and measured worse (pixel error 2.1% vs 1.6% on the demo scenes at equal steps)."""

    name, in_channels, out_channels = "edge", 1, 1

    def to_input(self, arrays, stats, device=None):
        return (_tensor(arrays, device) > 0).float().unsqueeze(1)

    def loss(self, out, x, stats):
        return F.binary_cross_entropy_with_logits(out, x)

    def to_arrays(self, out, stats):
        return (out[:, 0] > 0).to(torch.uint8).cpu().numpy()


class FeatureCodec(ImageCodec):
    """A teacher's feature map ``[B, g, g, C]``: ``channels`` in and out, standardised per channel (the mean and
    standard deviation of the training maps' cells, the std at least 1e-6), fitted by MSE on that scale."""

    name = "features"

    def __init__(self, channels: int = 0) -> None:
        self.in_channels = self.out_channels = channels

    def settings_for(self, meta: DatasetMeta, modality: str | None = None) -> dict[str, Any]:
        if modality is None:
            raise ValueError("the features codec reads the settings of a named modality (clip, dinov2, ...)")
        settings = {name: meta.setting(modality, name) for name in ("channels", "grid")}
        if min(settings.values()) <= 0:
            raise ValueError(f"{modality}: the dataset's modality_settings give no channels and grid of its feature "
                             f"map ({settings}); the labeler that made it reports them (dataset_meta.json)")
        return settings

    def configured(self, settings: Mapping[str, Any]) -> "FeatureCodec":
        _check_settings(self, settings, {"channels", "grid"})
        return FeatureCodec(int(settings.get("channels", 0)))

    def fit(self, arrays: np.ndarray) -> Stats:
        cells = np.asarray(arrays, dtype=np.float64).reshape(-1, np.shape(arrays)[-1])
        return {"mean": cells.mean(0).tolist(), "std": np.maximum(cells.std(0), 1e-6).tolist()}

    def _mean_std(self, stats: Stats, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        return tuple(torch.tensor(stats[k], device=device).view(1, -1, 1, 1) for k in ("mean", "std"))

    def to_input(self, arrays, stats, device=None):
        x = _tensor(arrays, device).float().permute(0, 3, 1, 2)
        mean, std = self._mean_std(stats, x.device)
        return (x - mean) / std

    def loss(self, out, x, stats):
        return F.mse_loss(out, x)

    def to_arrays(self, out, stats):
        mean, std = self._mean_std(stats, out.device)
        return (out.float() * std + mean).permute(0, 2, 3, 1).cpu().numpy().astype(np.float32)


#: The codec families a modality record names (``codec``), each with its default settings.
CODECS: dict[str, ImageCodec] = {c.name: c for c in (RGBCodec(), DepthCodec(), NormalCodec(), SemsegCodec(),
                                                     EdgeCodec(), FeatureCodec())}


def _check_settings(codec: ImageCodec, settings: Mapping[str, Any], known: set[str]) -> None:
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ValueError(f"the {codec.name} codec has no settings {unknown}; it takes {sorted(known)}")


def get_codec(modality: str, settings: Mapping[str, Any] | None = None) -> ImageCodec:
    """The codec of an image-like modality (the family its record names), with ``settings``
    (:meth:`ImageCodec.settings_for`; none: the default codec); a clear error lists the modalities that have one."""
    family = get_modality(modality).codec
    if not family:
        known = [name for name, m in MODALITIES.items() if m.codec]
        raise KeyError(f"no image tokenizer codec for {modality!r}; known: {', '.join(known)}")
    codec = CODECS[family]
    return codec.configured(settings) if settings else codec


def fit_normalisation(modality: str, arrays: np.ndarray, settings: Mapping[str, Any] | None = None) -> Stats:
    """Normalisation statistics of ``modality`` (its codec with ``settings``) from training arrays ``[N, ...]``, for
    ``VQVAEConfig.norm_stats``.

    At most :data:`MAX_FIT_IMAGES` evenly spaced images are used, which keeps memory small on large datasets.
    """
    step = -(-len(arrays) // MAX_FIT_IMAGES)
    return get_codec(modality, settings).fit(np.asarray(arrays[::step]))
