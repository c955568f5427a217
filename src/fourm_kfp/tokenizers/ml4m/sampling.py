"""Sampling a DiVAE decoder as ml-4m does, on diffusers' maintained schedulers.

ml-4m ships its own copies of diffusers' DDPM and DDIM schedulers (``fourm/vq/scheduling``, written against
diffusers 0.20). The DiVAE's ``scheduler`` setting picks one: ``"ddpm"`` (the default, and what ml-4m's DiVAE
training script leaves it at) or anything else for DDIM. Both read ``num_train_timesteps``, ``beta_schedule``,
``prediction_type``, ``clip_sample``, ``thresholding`` and ``zero_terminal_snr`` from the DiVAE's config and keep
diffusers' defaults otherwise (betas 1e-4 to 0.02, ``set_alpha_to_one``, no step offset, thresholding ratio 0.995
with a maximum of 1, which makes thresholding a clip to [-1, 1]). What differs from stock diffusers, and how
:func:`ml4m_scheduler` makes today's ``DDPMScheduler`` / ``DDIMScheduler`` equal them:

* zero terminal SNR is applied to every named beta schedule (``rescale_betas_zero_snr``; ml-4m's rescaling is the
  same computation) and keeps ``alphas_cumprod[-1] == 0`` exactly;
* ``"shifted_cosine:<s>"`` gives ``alphas_cumprod`` directly (a logistic of a shifted, clamped log-SNR, the last
  set to 0); here they are written into the scheduler after it is built;
* timesteps: ml-4m's DDPM always spaces them ``leading`` (``0, r, 2r, ...`` with the integer ratio ``r =
  1000 // steps``, whatever mode is asked); its DDIM spaces them ``trailing`` by default with the *integer* ratio
  (``999, 999 - r, ...``, down to ``r - 1``), which is diffusers' ``trailing`` when ``steps`` divides the training
  steps and one or more extra steps otherwise: :func:`ml4m_timesteps` computes ml-4m's list and
  :func:`sample` sets it.

The loop (:func:`sample`): start from ``noise`` (default: ``torch.randn`` of the image's shape from ``generator``,
on the CPU, as ml-4m draws it), and for each timestep call the decoder on (image, t, code embedding) and step the
scheduler in float32; DDPM steps draw their noise from the same ``generator``. No classifier-free guidance (ml-4m's
tokenizer decodes use none).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np
import torch

#: The scheduler settings a DiVAE config may hold, with ml-4m's DiVAE defaults
SCHEDULE_DEFAULTS: dict[str, Any] = {
    "scheduler": "ddpm",
    "num_train_timesteps": 1000,
    "beta_schedule": "squaredcos_cap_v2",
    "prediction_type": "v_prediction",
    "clip_sample": False,
    "thresholding": True,
    "zero_terminal_snr": True,
}

#: ml-4m's demo step counts (``fourm/utils/plotting_utils.py``: 25, and 10 for edges)
DEFAULT_STEPS = 25
EDGE_STEPS = 10


def default_steps(modality: str | None) -> int:
    """The demos' step count for a modality name (``rgb``, ``depth``, ``canny_edge``, ``tok_sam_edge@224``, ...)."""
    return EDGE_STEPS if modality and "edge" in modality else DEFAULT_STEPS


def schedule_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """The scheduler settings of a DiVAE config (missing ones take ml-4m's defaults)."""
    settings = {key: config.get(key, default) for key, default in SCHEDULE_DEFAULTS.items()}
    settings["scheduler"] = "ddpm" if settings["scheduler"] == "ddpm" else "ddim"
    return settings


def shifted_cosine_alphas_cumprod(num_train_timesteps: int, shift: float) -> torch.Tensor:
    """ml-4m's ``shifted_cosine:<shift>`` schedule: the cosine schedule's log-SNR moved by ``-2 log(shift)``."""
    t = torch.linspace(0, 1, num_train_timesteps).to(torch.float64)
    log_snr = -2 * (torch.tan(torch.pi * t / 2).log() + np.log(shift))
    alphas_cumprod = log_snr.clamp(-15, 15).float().sigmoid()
    alphas_cumprod[-1] = 0.0
    return alphas_cumprod


def ml4m_scheduler(config: Mapping[str, Any]):
    """diffusers' ``DDPMScheduler`` or ``DDIMScheduler`` with ml-4m's schedule for a DiVAE config."""
    from diffusers import DDIMScheduler, DDPMScheduler

    settings = schedule_settings(config)
    beta_schedule = str(settings["beta_schedule"])
    shifted = beta_schedule.startswith("shifted_cosine:")
    common = dict(
        num_train_timesteps=int(settings["num_train_timesteps"]),
        beta_schedule="linear" if shifted else beta_schedule,
        prediction_type=settings["prediction_type"],
        clip_sample=bool(settings["clip_sample"]),
        thresholding=bool(settings["thresholding"]),
        rescale_betas_zero_snr=bool(settings["zero_terminal_snr"]) and not shifted,
    )
    if settings["scheduler"] == "ddpm":
        scheduler = DDPMScheduler(**common, variance_type="fixed_small", timestep_spacing="leading")
    else:
        scheduler = DDIMScheduler(**common, set_alpha_to_one=True, timestep_spacing="trailing")
    if shifted:
        shift = float(beta_schedule.split(":")[1])
        # both schedulers' steps read only alphas_cumprod
        scheduler.alphas_cumprod = shifted_cosine_alphas_cumprod(common["num_train_timesteps"], shift)
    return scheduler


def ml4m_timesteps(scheduler, steps: int) -> torch.Tensor:
    """The timesteps ml-4m visits in ``steps`` steps (see the module docstring)."""
    total = int(scheduler.config.num_train_timesteps)
    if steps < 1 or steps > total:
        raise ValueError(f"steps must be between 1 and {total}, got {steps}")
    ratio = total // steps
    if type(scheduler).__name__.startswith("DDPM"):
        values = (np.arange(0, steps) * ratio)[::-1]
    else:
        values = np.arange(total, 0, -ratio) - 1
    return torch.from_numpy(values.astype(np.int64).copy())


def prepare(scheduler, steps: int) -> torch.Tensor:
    """Sets ``scheduler`` up for ``steps`` steps and returns the timesteps it will visit."""
    scheduler.set_timesteps(steps)
    timesteps = ml4m_timesteps(scheduler, steps)
    scheduler.timesteps = timesteps
    return timesteps


@torch.no_grad()
def sample(
    decoder: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    cond: torch.Tensor,
    scheduler,
    *,
    steps: int,
    shape: tuple[int, int, int, int],
    noise: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Runs the reverse process from ``noise`` (or fresh noise of ``shape`` from ``generator``) to an image."""
    device = cond.device
    if noise is None:
        noise = torch.randn(shape, generator=generator)
    elif tuple(noise.shape) != tuple(shape):
        raise ValueError(f"noise has shape {tuple(noise.shape)}, the decode needs {tuple(shape)}")
    image = noise.to(device=device, dtype=torch.float32)
    for t in prepare(scheduler, steps):
        prediction = decoder(image, t.to(device), cond)
        image = scheduler.step(prediction.float(), t, image, generator=generator).prev_sample
    return image
