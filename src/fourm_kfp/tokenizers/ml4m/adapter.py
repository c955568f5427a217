"""ml-4m's tokenizers as this pipeline's image tokenizers (``train_tokenizers.from_ml4m: {<modality>: <folder>}``).

:class:`Ml4mTokenizer` wraps a tokenizer of the port (:class:`~.vqvae.VQVAE`: semseg, CLIP, DINOv2; or
:class:`~.divae.DiVAE`: rgb, depth, normal, edge) behind the interface the stages use of our own VQ-VAEs
(:class:`fourm_kfp.tokenizers.vqvae.VQVAE`): ``encode(arrays) -> LongTensor[B, h, w]`` from in-memory arrays,
``decode(tokens) -> arrays``, ``codec.reference(arrays)`` (what decoding reproduces), ``config.image_size`` (the
side of the in-memory values), ``config.grid_size``, ``config.codebook_size`` and ``config.modality``. Whatever the
decoder (a ViT, or a diffusion model sampled with a fixed seed), it plugs in through ``decode_tokens(codes)``.

**Resolution.** A tokenizer runs at the side of the pipeline's values: ``data.image_size`` for an image modality
(the crops pretokenize cuts; ``image_size / patch_size`` codes a side), a feature map's grid (one code per cell).
ml-4m's ViTs resize their position tables to the input's grid, and its ``224-448`` folders (whose config says 448)
are run at 224 for 4M's ``@224`` domains: so with ``data.image_size: 224`` a patch-16 tokenizer gives ml-4m's
14 x 14 codes. The side must be a multiple of the folder's patch size.

**Conventions** (:data:`CONVENTIONS`, by the modality's codec family; ml-4m's side is :mod:`.conventions`):

========  ===========================================  ===================================================
family    our in-memory value → the tokenizer's input   decoded output → our value
========  ===========================================  ===================================================
rgb       uint8 ``[H, W, 3]`` → Inception mean/std,     [-1, 1] → uint8 (:func:`.conventions.rgb_image`)
          [-1, 1] (:func:`.conventions.rgb`)
depth     metres or a relative map, invalid (0, not     the standardised map, ``[H, W]`` float32 (what
          finite) as 0 → standardised on the middle     :meth:`Ml4mCodec.reference` makes of the truth: ml-4m's
          80% of its values, zeros included, as ml-4m   tokenizer cannot give the map's scale back)
          does its 16-bit PNGs
normal    unit vectors, camera frame x right, y up, z   x, y, z in [-1, 1] in Omnidata's frame → ours
          to the camera (0 = invalid) → Omnidata's      (y negated), unit length (0 where the output is 0)
          frame (y down: ``n * (1, -1, 1)``, as the
          ``hf_normal`` teacher reads Omnidata), as
          its 8-bit PNG ``round((n / 2 + 0.5) * 255)``
          and then ``(x / 255 - 0.5) / 0.5``
          (:func:`.conventions.normal`)
semseg    the dataset's class ids ``0..K-1`` → ``id +    logits of ``n_labels`` classes → the argmax over
          1`` (ml-4m's ``(id + 1) mod 256``: 0 is "no    classes ``1..K`` less one (the dataset's ids; "no
          class"; a COCO-panoptic teacher's ids are     class" is never given: our maps have none)
          COCO's), ``K <= n_labels - 1``
edge      0/1 → the 8-bit 0/255 image's Inception       > 0 → 1
          normalisation, ±1 (ml-4m's ``canny_edge``
          takes ``RGBTransform``'s)
features  ``[g, g, C]`` → ``[C, g, g]`` unscaled, ``C``  ``[C, g, g]`` → ``[g, g, C]`` float32
          the folder's ``n_channels``
========  ===========================================  ===================================================

A feature map is taken as the dataset holds it: the maps of the ``hf_clip`` and ``hf_dinov2`` teachers with their
default ``preprocess: ml4m`` are the ones ml-4m's CLIP and DINOv2 tokenizers were trained on (ml-4m's crop, resize
and normalisation: :func:`.conventions.feature_teacher_input`), laid out as ml-4m's ``b d nh nw``
(``tests/labelers/test_feature_teachers.py`` checks both against ml-4m's code); maps made with ``preprocess:
processor`` are not.

Encoding runs in float32 (no autocast), as the folder's own computation. A DiVAE's decode is a reverse diffusion:
:data:`DECODE_SEED` seeds its noise for every call, so decoding the same codes gives the same arrays
(``decode_steps``: ml-4m's demo step counts unless given).
"""

from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fourm_kfp.data.modalities import class_id_dtype, get_modality
from fourm_kfp.storage import open_store
from fourm_kfp.tokenizers.ml4m import conventions
from fourm_kfp.tokenizers.ml4m.folder import CONFIG, WEIGHTS, TokenizerFolder, TokenizerFolderError
from fourm_kfp.tokenizers.ml4m.vqvae import VQConfig

#: The index's ``kind`` of an ml-4m tokenizer (our own VQ-VAEs' entries have none).
KIND = "ml4m"
#: Seeds a DiVAE's sampling noise on every decode.
DECODE_SEED = 0
#: Omnidata's camera frame (y down) ↔ ours (y up): the same sign flip both ways.
OMNIDATA_FRAME = (1.0, -1.0, 1.0)


def _numpy(arrays: Any) -> np.ndarray:
    return arrays.cpu().numpy() if isinstance(arrays, torch.Tensor) else np.asarray(arrays)


class Ml4mCodec:
    """One codec family's conventions between our in-memory arrays and an ml-4m tokenizer's input and output."""

    name: str

    def check(self, cfg: VQConfig, settings: Mapping[str, Any]) -> list[str]:
        """What keeps a tokenizer of config ``cfg`` from taking this family's values (the dataset's ``settings``)."""
        return []

    def to_input(self, arrays: Any, settings: Mapping[str, Any]) -> torch.Tensor:
        raise NotImplementedError

    def to_arrays(self, decoded: torch.Tensor, settings: Mapping[str, Any]) -> np.ndarray:
        raise NotImplementedError

    def reference(self, arrays: np.ndarray) -> np.ndarray:
        """The in-memory values decoding reproduces, for arrays as stored (the arrays themselves but for depth)."""
        return arrays


def _channels(cfg: VQConfig, wanted: int, family: str) -> list[str]:
    if cfg.n_labels is not None or cfg.n_channels != wanted:
        return [f"a {family} tokenizer takes {wanted} channel(s), the folder's has n_channels {cfg.n_channels}"
                + (f" and n_labels {cfg.n_labels}" if cfg.n_labels is not None else "")]
    return []


def _image(cfg: VQConfig) -> list[str]:
    return [] if cfg.patch_proj else ["patch_proj is off: a feature-map tokenizer, not an image one"]


class RGB(Ml4mCodec):
    name = "rgb"

    def check(self, cfg, settings):
        return _channels(cfg, 3, "rgb") + _image(cfg)

    def to_input(self, arrays, settings):
        return conventions.rgb(_numpy(arrays).astype(np.uint8, copy=False))

    def to_arrays(self, decoded, settings):
        return conventions.rgb_image(decoded)


class Depth(Ml4mCodec):
    name = "depth"

    def check(self, cfg, settings):
        return _channels(cfg, 1, "depth") + _image(cfg)

    def _standardised(self, arrays: Any) -> torch.Tensor:
        depth = torch.as_tensor(_numpy(arrays), dtype=torch.float32)
        depth = torch.where(torch.isfinite(depth) & (depth > 0), depth, 0.0)  # invalid as ml-4m's PNG zeros
        return torch.stack([conventions.standardise_depth(d) for d in depth])

    def to_input(self, arrays, settings):
        return self._standardised(arrays).unsqueeze(1)

    def to_arrays(self, decoded, settings):
        return decoded[:, 0].float().cpu().numpy().astype(np.float32)

    def reference(self, arrays):
        return self._standardised(arrays).numpy()


class Normal(Ml4mCodec):
    name = "normal"

    def check(self, cfg, settings):
        return _channels(cfg, 3, "normal") + _image(cfg)

    def to_input(self, arrays, settings):
        omnidata = _numpy(arrays).astype(np.float32) * np.asarray(OMNIDATA_FRAME, np.float32)
        png = np.clip(np.round((omnidata * 0.5 + 0.5) * 255.0), 0, 255).astype(np.uint8)
        return conventions.normal(png)

    def to_arrays(self, decoded, settings):
        frame = torch.tensor(OMNIDATA_FRAME, device=decoded.device).view(1, 3, 1, 1)
        vectors = decoded.float().clamp(-1, 1) * frame
        unit = F.normalize(vectors, dim=1, eps=1e-6) * (vectors.norm(dim=1, keepdim=True) > 1e-6)
        return unit.permute(0, 2, 3, 1).cpu().numpy().astype(np.float32)


class Semseg(Ml4mCodec):
    name = "semseg"

    def check(self, cfg, settings):
        classes = int(settings.get("classes", 0))
        problems = _image(cfg)
        if cfg.n_labels is None:
            problems.append("no n_labels: not a semseg tokenizer (it embeds class ids)")
        elif classes > cfg.n_labels - 1:
            problems.append(f"the dataset's semseg vocabulary has {classes} classes, the tokenizer's n_labels "
                            f"{cfg.n_labels} hold {cfg.n_labels - 1} and 'no class'")
        return problems

    def to_input(self, arrays, settings):
        return torch.as_tensor(_numpy(arrays).astype(np.int64)) + 1

    def to_arrays(self, decoded, settings):
        classes = int(settings["classes"])
        ids = decoded[:, 1:classes + 1].float().argmax(dim=1).cpu().numpy()
        return ids.astype(class_id_dtype(classes))


class Edge(Ml4mCodec):
    name = "edge"

    def check(self, cfg, settings):
        return _channels(cfg, 1, "edge") + _image(cfg)

    def to_input(self, arrays, settings):
        # ml-4m's RGBTransform of the 0/255 image, Inception's mean and std: (x / 255 - 0.5) / 0.5 = -1 or 1
        return torch.from_numpy(np.where(_numpy(arrays) > 0, 1.0, -1.0).astype(np.float32)).unsqueeze(1)

    def to_arrays(self, decoded, settings):
        return (decoded[:, 0] > 0).to(torch.uint8).cpu().numpy()


class Features(Ml4mCodec):
    name = "features"

    def check(self, cfg, settings):
        channels = int(settings.get("channels", 0))
        problems = [] if not cfg.patch_proj else ["patch_proj is on: an image tokenizer, not a feature map's"]
        if cfg.n_channels != channels:
            problems.append(f"the dataset's feature maps have {channels} channels, the tokenizer takes "
                            f"n_channels {cfg.n_channels}")
        return problems

    def to_input(self, arrays, settings):
        return torch.as_tensor(_numpy(arrays), dtype=torch.float32).permute(0, 3, 1, 2).contiguous()

    def to_arrays(self, decoded, settings):
        return decoded.float().permute(0, 2, 3, 1).cpu().numpy().astype(np.float32)


#: The conventions of each codec family (a modality record's ``codec``) that an ml-4m tokenizer can take.
CONVENTIONS: dict[str, Ml4mCodec] = {c.name: c for c in (RGB(), Depth(), Normal(), Semseg(), Edge(), Features())}


@dataclass(frozen=True)
class Ml4mTokenizerConfig:
    """What the stages read of a tokenizer (as of :class:`fourm_kfp.tokenizers.vqvae.VQVAEConfig`)."""

    modality: str
    image_size: int  # the side of the in-memory values: data.image_size, or a feature map's grid
    grid_size: int
    codebook_size: int
    family: str  # "vqvae" or "divae"
    codec_settings: dict[str, Any] = field(default_factory=dict)
    decode_steps: int | None = None  # a DiVAE's sampling steps (None: ml-4m's demos')


def _family(cfg: VQConfig, where: str) -> str:
    kind = cfg.kind
    if kind not in ("vqvae", "divae"):
        raise TokenizerFolderError(f"{where}: a {kind!r} tokenizer (enc_type {cfg.enc_type!r}, dec_type "
                                   f"{cfg.dec_type!r}); the pipeline needs a decoder (a VQ-VAE's or a DiVAE's) for "
                                   "the tokenizer report, evaluate and generate")
    return kind


def describe(folder: TokenizerFolder, modality: str, side: int, settings: Mapping[str, Any],
             where: str) -> Ml4mTokenizerConfig:
    """The tokenizer ``folder`` makes for ``modality`` at ``side``; a :class:`TokenizerFolderError` starting with
    ``where`` (``train_tokenizers.from_ml4m.<modality>``) says every reason it cannot."""
    family_name = get_modality(modality).codec
    if family_name not in CONVENTIONS:
        raise TokenizerFolderError(f"{where}: {modality!r} has no ml-4m conventions (known for the codec families "
                                   f"{sorted(CONVENTIONS)})")
    try:
        cfg = VQConfig.from_dict(folder.config, where=f"{folder.uri}/{CONFIG}")
    except TypeError as exc:
        raise TokenizerFolderError(f"{where}: {folder.uri}/{CONFIG}: {exc}") from None
    problems = CONVENTIONS[family_name].check(cfg, settings)
    if cfg.num_codebooks != 1:
        problems.append(f"{cfg.num_codebooks} codebooks; a token grid holds one code per cell")
    if cfg.patch_proj and side % cfg.patch_size:
        problems.append(f"the pipeline's {side}-px values are not a multiple of its patch size {cfg.patch_size} "
                        "(set data.image_size to one)")
    if problems:
        raise TokenizerFolderError(f"{where}: the ml-4m tokenizer at {folder.uri} does not fit {modality}: "
                                   + "; ".join(problems))
    grid = side // cfg.patch_size if cfg.patch_proj else side
    return Ml4mTokenizerConfig(modality, side, grid, cfg.codebook_size, _family(cfg, where), dict(settings))


def _network(folder: TokenizerFolder, config: Ml4mTokenizerConfig) -> nn.Module:
    if config.family == "divae":
        if importlib.util.find_spec("diffusers") is None:
            raise TokenizerFolderError(f"{folder.uri}: a DiVAE (diffusion decoder) samples with diffusers' schedulers; "
                                       "install the `ml4m` extra (pip install 'fourm-kfp[ml4m]')")
        from fourm_kfp.tokenizers.ml4m.divae import load_divae

        return load_divae(folder, modality=config.modality)
    from fourm_kfp.tokenizers.ml4m.vqvae import load_vqvae

    return load_vqvae(folder)


class Ml4mTokenizer(nn.Module):
    """An ml-4m tokenizer with our tokenizers' interface (module docstring)."""

    #: how pretokenize resizes the rgb crops this tokenizer encodes: Pillow's bicubic on the uint8 photo, as ml-4m's
    #: ``save_vq_tokens.py`` does by default (``resample_mode`` None: ``PIL.Image.resize``'s default filter)
    camera_resample = "bicubic"

    def __init__(self, network: nn.Module, config: Ml4mTokenizerConfig):
        super().__init__()
        self.network, self.config = network, config
        self.codec = CONVENTIONS[get_modality(config.modality).codec]
        self.eval()

    @property
    def device(self) -> torch.device:
        return next(self.network.parameters()).device

    @property
    def decoder_kind(self) -> str:
        if self.config.family != "divae":
            return "ml-4m VQ-VAE"
        return "ml-4m DiVAE (UViT)" if "uvit" in type(self.network.decoder).__name__.lower() else "ml-4m DiVAE (UNet)"

    @property
    def decoder_passes(self) -> int:
        """Decoder passes per decoded image: a DiVAE's sampling steps, else one."""
        if self.config.family != "divae":
            return 1
        return int(self.config.decode_steps or self.network.default_steps)

    def prepare(self, arrays: Any) -> torch.Tensor:
        """In-memory batch → the tokenizer's input on its device (ml-4m's conventions)."""
        return self.codec.to_input(arrays, self.config.codec_settings).to(self.device)

    @torch.no_grad()
    def encode(self, images: Any) -> torch.Tensor:
        """In-memory batch (numpy or torch, ``[B, H, W(, C)]``) → codes ``LongTensor[B, h, w]``, in float32."""
        with torch.autocast(self.device.type, enabled=False):
            return self.network.encode(self.prepare(images)).long()

    def decode_tokens(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes → the network's output (a DiVAE's sampled with :data:`DECODE_SEED`)."""
        codes = torch.as_tensor(codes, device=self.device).long()
        with torch.autocast(self.device.type, enabled=False):
            if self.config.family == "divae":
                generator = torch.Generator().manual_seed(DECODE_SEED)
                return self.network.decode_tokens(codes, self.config.decode_steps, generator=generator)
            return self.network.decode_tokens(codes)

    @torch.no_grad()
    def decode(self, tokens: Any) -> np.ndarray:
        """Codes ``[B, h, w]`` → in-memory batch (numpy, the modality's units and dtype)."""
        return self.codec.to_arrays(self.decode_tokens(tokens), self.config.codec_settings)


def load_ml4m_tokenizer(folder: TokenizerFolder, config: Ml4mTokenizerConfig, device: str = "cpu") -> Ml4mTokenizer:
    """The tokenizer of ``folder`` with ``config`` (:func:`describe`'s), in eval mode on ``device``."""
    return Ml4mTokenizer(_network(folder, config), config).to(device).eval()


def index_entry(folder: TokenizerFolder, source: str, config: Ml4mTokenizerConfig) -> dict[str, Any]:
    """The tokenizer bundle's record of an ml-4m tokenizer: where it came from (``source`` as configured), the
    folder's digest, its files' and its config, and what the stages read (grid, codebook, side, settings)."""
    return {"kind": KIND, "family": config.family, "source": source, "digest": folder.digest,
            "files": dict(sorted(folder.files.items())), "ml4m_config": folder.config,
            "grid_size": config.grid_size, "codebook_size": config.codebook_size, "image_size": config.image_size,
            "codec_settings": config.codec_settings}


def config_of_entry(modality: str, entry: Mapping[str, Any]) -> Ml4mTokenizerConfig:
    return Ml4mTokenizerConfig(modality, int(entry["image_size"]), int(entry["grid_size"]),
                               int(entry["codebook_size"]), str(entry["family"]),
                               dict(entry.get("codec_settings") or {}), entry.get("decode_steps"))


def folder_digest(uri: str) -> str:
    """:attr:`TokenizerFolder.digest` of the folder at ``uri`` without loading its tensors (streamed sha256 of
    ``config.json`` and ``model.safetensors``); a :class:`TokenizerFolderError` when a file is missing."""
    store = open_store(uri.rstrip("/"))
    lines = []
    for name in sorted((CONFIG, WEIGHTS)):
        if not store.exists(name):
            raise TokenizerFolderError(f"{store.uri}: no {name} (an ml-4m tokenizer folder holds {CONFIG} and "
                                       f"{WEIGHTS})")
        digest = hashlib.sha256()
        with store.open_read(name) as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
        lines.append(f"{name}:{digest.hexdigest()}\n")
    return hashlib.sha256("".join(lines).encode()).hexdigest()
