"""ml-4m's DiVAE tokenizers (``fourm/vq/vqvae.py``'s ``DiVAE``) without ml-4m: 4M-21's rgb, depth, normal and edge
tokenizers, whose decoder is a diffusion model conditioned on the quantized codes.

:class:`DiVAE` is the shared encoder (:class:`~fourm_kfp.tokenizers.ml4m.vqvae.VQEncoder`: ``encode(x) -> codes``,
``tokens_to_embedding``) plus ``decoder``, built from the config's ``dec_type`` with ``n_channels`` in and out and
``latent_dim`` conditioning channels: the patched UNet of :mod:`.unet` (``unet_patched``: rgb, depth, normal) or
the UViT of :mod:`.uvit` (``uvit_*``: the edge tokenizer; the config's ``conditioning``, ml-4m's default
``concat``, says how the codes enter). ``decode_tokens(codes, steps, noise=...,
generator=...)`` looks the codes up in the codebook and runs the reverse diffusion of :mod:`.sampling`: ml-4m's
schedule (the config's ``scheduler``, ``num_train_timesteps``, ``beta_schedule``, ``prediction_type``,
``clip_sample``, ``thresholding``, ``zero_terminal_snr``, with ml-4m's defaults) on diffusers' own DDPM / DDIM
schedulers, the same number of decoder passes as steps.

Defaults follow ml-4m's demos: 25 steps, 10 for edges (``modality``, or the config's ``domain``, says which); the
decoded image is as large as the codes' grid times the encoder's patch size (the demos pass ``image_size=224`` for
14x14 codes; ml-4m's own default would be the decoder's training size). Outputs are the decoder's range: [-1, 1]
for rgb and edges, the tokenizer's normalised depth for depth.

:func:`load_divae` reads a folder (``config.json`` + ``model.safetensors``, local or ``s3://``); a config or a state
that does not fit fails naming the folder and the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import torch

from fourm_kfp.tokenizers.ml4m import sampling
from fourm_kfp.tokenizers.ml4m.folder import TokenizerFolder, TokenizerFolderError, load_into, read_folder
from fourm_kfp.tokenizers.ml4m.unet import UNET_PRESETS, build_unet
from fourm_kfp.tokenizers.ml4m.uvit import UVIT_PRESETS, build_uvit
from fourm_kfp.tokenizers.ml4m.vqvae import VQConfig, VQEncoder

PREDICTION_TYPES = ("sample", "epsilon", "v_prediction")
BETA_SCHEDULES = ("linear", "scaled_linear", "squaredcos_cap_v2")


def check_schedule(settings: Mapping[str, Any]) -> None:
    """ValueError naming the key when a schedule setting is not one ml-4m (and this port) can sample with."""
    if settings["prediction_type"] not in PREDICTION_TYPES:
        raise ValueError(f"prediction_type {settings['prediction_type']!r} is not one of {list(PREDICTION_TYPES)}")
    schedule = str(settings["beta_schedule"])
    if schedule not in BETA_SCHEDULES:
        shift = schedule.partition("shifted_cosine:")[2]
        try:
            ok = schedule.startswith("shifted_cosine:") and float(shift) > 0
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(f"beta_schedule {schedule!r} is not one of {list(BETA_SCHEDULES)} or "
                             "'shifted_cosine:<shift>'")
    steps = settings["num_train_timesteps"]
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"num_train_timesteps must be a positive whole number, not {steps!r}")


class DiVAE(VQEncoder):
    """ml-4m's ``DiVAE`` at inference: encoder, quantizer and the diffusion decoder (names as in its state dict)."""

    def __init__(self, config: VQConfig | dict[str, Any], modality: str | None = None):
        super().__init__(config)
        cfg = self.config
        image_size = cfg.image_size_dec or cfg.image_size
        if cfg.dec_type in UNET_PRESETS:
            self.decoder = build_unet(cfg.dec_type, channels=cfg.n_channels, cond_channels=cfg.latent_dim,
                                      image_size=image_size)
        elif cfg.dec_type in UVIT_PRESETS:
            self.decoder = build_uvit(cfg.dec_type, channels=cfg.n_channels, cond_dim=cfg.latent_dim,
                                      image_size=image_size, conditioning=cfg.other.get("conditioning", "concat"))
        else:
            raise KeyError(f"dec_type {cfg.dec_type!r} is not a DiVAE decoder this port builds (known: "
                           f"{sorted(UNET_PRESETS) + sorted(UVIT_PRESETS)})")
        self.schedule = sampling.schedule_settings(cfg.other)
        check_schedule(self.schedule)
        self.modality = modality or cfg.other.get("domain")
        self.default_steps = sampling.default_steps(self.modality)
        self.eval()

    def make_scheduler(self, kind: str | None = None):
        """A fresh diffusers scheduler with this tokenizer's schedule; ``kind`` (``"ddpm"`` / ``"ddim"``) overrides
        the config's ``scheduler``."""
        settings = dict(self.schedule)
        if kind is not None:
            if kind not in ("ddpm", "ddim"):
                raise ValueError(f"scheduler must be 'ddpm' or 'ddim', not {kind!r}")
            settings["scheduler"] = kind
        return sampling.ml4m_scheduler(settings)

    @torch.no_grad()
    def decode_quant(
        self,
        quant: torch.Tensor,
        steps: int | None = None,
        *,
        noise: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        image_size: int | tuple[int, int] | None = None,
        scheduler: str | None = None,
    ) -> torch.Tensor:
        """The decoder's sample for quantized latents ``B x latent_dim x h x w`` (see :meth:`decode_tokens`)."""
        if image_size is None:
            size = (quant.shape[-2] * self.config.patch_size, quant.shape[-1] * self.config.patch_size)
        else:
            size = image_size if isinstance(image_size, tuple) else (int(image_size), int(image_size))
        shape = (quant.shape[0], self.config.n_channels, *size)
        return sampling.sample(self.decoder, quant, self.make_scheduler(scheduler),
                               steps=self.default_steps if steps is None else int(steps), shape=shape, noise=noise,
                               generator=generator)

    @torch.no_grad()
    def decode_tokens(
        self,
        codes: torch.Tensor,
        steps: int | None = None,
        *,
        noise: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        image_size: int | tuple[int, int] | None = None,
        scheduler: str | None = None,
    ) -> torch.Tensor:
        """Codes ``B x h x w`` to images ``B x n_channels x H x W`` in ``steps`` decoder passes (default: the
        demos', :attr:`default_steps`). ``noise``: the starting image (default: ``torch.randn`` from ``generator``,
        as ml-4m draws it); DDPM steps draw their noise from ``generator``. ``image_size``: default the codes'
        grid times the encoder's patch size. ``scheduler``: ``"ddpm"`` or ``"ddim"`` instead of the config's."""
        return self.decode_quant(self.tokens_to_embedding(codes), steps, noise=noise, generator=generator,
                                 image_size=image_size, scheduler=scheduler)

    @torch.no_grad()
    def autoencode(self, x: torch.Tensor, steps: int | None = None, **kwargs) -> torch.Tensor:
        """Encode, quantize and decode a batch (``kwargs`` as :meth:`decode_tokens`; the size is the input's)."""
        kwargs.setdefault("image_size", (x.shape[-2], x.shape[-1]))
        return self.decode_quant(self.encode_quant(x)[0], steps, **kwargs)


def load_divae(source: str | Path | TokenizerFolder, modality: str | None = None) -> DiVAE:
    """A DiVAE tokenizer folder (``EPFL-VILAB/4M_tokenizers_{rgb_16k,depth_8k,normal_8k,edge_8k}_*``) as
    :class:`DiVAE`; ``modality`` (``rgb``, ``depth``, ``normal``, ``edge``, ...) picks the default steps."""
    folder = source if isinstance(source, TokenizerFolder) else read_folder(source)
    where = f"{folder.uri}/config.json"
    try:
        cfg = VQConfig.from_dict(folder.config, where=where)
    except TypeError as exc:
        raise TokenizerFolderError(f"{where}: {exc}") from None
    if cfg.kind != "divae":
        raise TokenizerFolderError(f"{folder.uri}: a {cfg.kind} tokenizer, not a DiVAE (dec_type {cfg.dec_type!r})")
    try:
        model = DiVAE(cfg, modality=modality)
    except (KeyError, ValueError) as exc:
        raise TokenizerFolderError(f"{where}: {exc.args[0] if exc.args else exc}") from None
    load_into(model, folder)
    model.folder_digest = folder.digest
    return model.eval()
