"""The contract between masking (which builds batches in the loader) and the 4M model (which consumes them), and the
pixel normalisation both sides apply to an image the model reads as patches. It sits below ``data``, ``masking``
and ``model`` and imports none of them.

Masking turns each sample into a fixed number of **encoder slots** (the input token budget ``E``) and **decoder
slots** (the target token budget ``D``); a batch stacks them. Each slot names its modality (an index into
``ModalitySpec`` order), its position inside that modality (grid index ``row * width + col`` for an image
modality, sequence index for text), and its token. Padding slots (a sample with fewer tokens than the budget)
have ``valid == False`` and are ignored by attention and loss.

Everything the model needs to avoid host synchronisation is computed on the CPU by the loader: the decoder slots
sorted by modality (``target_order``) and the per-modality counts (``target_counts``, plain Python ints), so the
output heads run on contiguous segments without a ``nonzero`` on the device.

Modalities are the data modalities (``rgb``, ``depth``, ``normal``, ``semseg``, ``edge``, ``det``, ``caption``,
or a subset); an image modality's tokens come from its VQ-VAE (``tok_<name>`` in pretokenized shards). ``rgb``
may instead enter the encoder as pixel patches (``ModalitySpec.pixel_input``): then its encoder slots carry no
token and the model embeds ``pixels`` patches at the slots' positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal

import numpy as np
import torch

#: Label value the loss ignores (PyTorch's default ``ignore_index``).
IGNORE_INDEX = -100
#: An image the model reads as pixel patches enters as ``(x - PIXEL_MEAN) / PIXEL_STD``: uint8 to [-1, 1].
PIXEL_MEAN, PIXEL_STD = 127.5, 127.5
#: ml-4m's normalisation (``ModalitySpec.pixel_normalisation == "imagenet"``): ImageNet's per-channel mean and
#: standard deviation of [0, 1] values, as uint8 values.
IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


def normalised_pixels(images: np.ndarray, normalisation: str = "symmetric") -> np.ndarray:
    """``[..., H, W, 3]`` pixel values (uint8) as the model's float32 ``[..., 3, H, W]`` input (a view):
    ``symmetric`` maps 0..255 to [-1, 1], ``imagenet`` subtracts ImageNet's channel means and divides by its
    standard deviations."""
    if normalisation == "imagenet":
        mean, std = np.asarray(IMAGENET_MEAN, np.float32), np.asarray(IMAGENET_STD, np.float32)
    elif normalisation == "symmetric":
        mean, std = np.float32(PIXEL_MEAN), np.float32(PIXEL_STD)
    else:
        raise ValueError(f"pixel normalisation {normalisation!r}: expected 'symmetric' or 'imagenet'")
    return np.moveaxis((np.asarray(images).astype(np.float32) - mean) / std, -1, -3)


@dataclass(frozen=True)
class ModalitySpec:
    """What the model knows about one modality.

    ``kind`` "image": a ``grid`` (height, width) of VQ-VAE tokens, 2-D sin-cos positions, bidirectional decoder
    attention. ``kind`` "sequence": text of at most ``max_length`` tokens (the shared WordPiece vocabulary),
    1-D positions, causal decoder attention with teacher forcing.
    """

    name: str
    kind: Literal["image", "sequence"]
    vocab_size: int
    grid: tuple[int, int] = (0, 0)  # image only: token grid (height, width)
    max_length: int = 0  # sequence only: longest token sequence (input or target), positions 0..max_length-1
    pixel_input: bool = False  # image only: the encoder embeds pixel patches instead of tokens
    patch_size: int = 0  # pixel_input only: pixels per patch side (image side = grid * patch_size)
    #: pixel_input only: how pixel values are normalised (:func:`normalised_pixels`; ml-4m: "imagenet")
    pixel_normalisation: Literal["symmetric", "imagenet"] = "symmetric"

    @property
    def num_positions(self) -> int:
        return self.grid[0] * self.grid[1] if self.kind == "image" else self.max_length

    def __post_init__(self) -> None:
        if self.kind == "image" and min(self.grid) <= 0:
            raise ValueError(f"modality {self.name!r}: an image modality needs a positive grid, got {self.grid}")
        if self.kind == "sequence" and self.max_length <= 0:
            raise ValueError(f"modality {self.name!r}: a sequence modality needs max_length > 0")
        if self.pixel_input and (self.kind != "image" or self.patch_size <= 0):
            raise ValueError(f"modality {self.name!r}: pixel_input needs an image modality and a patch_size")
        if self.pixel_normalisation not in ("symmetric", "imagenet"):
            raise ValueError(f"modality {self.name!r}: pixel_normalisation {self.pixel_normalisation!r} is not "
                             f"'symmetric' or 'imagenet'")


@dataclass
class MaskedBatch:
    """One batch of masked samples (``B`` samples, ``E`` encoder slots, ``D`` decoder slots each).

    Encoder:
      ``enc_tokens`` long [B, E] token ids (0 for padding and pixel-input slots);
      ``enc_modality`` long [B, E] modality index; ``enc_position`` long [B, E]; ``enc_valid`` bool [B, E].
    Decoder:
      ``dec_tokens`` long [B, D] the decoder's input token: for a sequence modality the previous token of the
      target sequence (teacher forcing); unused (0) for image modalities, whose queries are the mask token;
      ``dec_targets`` long [B, D] the token to predict (``IGNORE_INDEX`` on padding);
      ``dec_modality``, ``dec_position`` long [B, D]; ``dec_valid`` bool [B, D].
    Pixels (only when a modality has ``pixel_input``): ``pixels`` float [B, 3, H, W], normalised.
    Computed by the loader on the CPU:
      ``target_order`` long [n] indices into the flattened ``B * D`` decoder slots, valid slots only, grouped by
      modality in ``ModalitySpec`` order (moved to the device like the other tensors: a host-to-device copy needs
      no synchronisation); ``target_counts`` list[int], plain Python ints that stay on the host, how many of
      ``target_order`` belong to each modality (sums to n), so the heads split segments without a device sync;
      ``enc_all_valid`` bool, a host flag: every encoder slot of every sample is valid (no padding), so attention
      over the encoder needs no mask (False when unknown: the masks are then built from ``enc_valid``).
    """

    enc_tokens: torch.Tensor
    enc_modality: torch.Tensor
    enc_position: torch.Tensor
    enc_valid: torch.Tensor
    dec_tokens: torch.Tensor
    dec_targets: torch.Tensor
    dec_modality: torch.Tensor
    dec_position: torch.Tensor
    dec_valid: torch.Tensor
    target_order: torch.Tensor
    target_counts: list[int]
    pixels: torch.Tensor | None = None
    keys: list[str] = field(default_factory=list)  # sample keys, for debugging and evaluation
    enc_all_valid: bool = False

    @property
    def batch_size(self) -> int:
        return self.enc_tokens.shape[0]

    def to(self, device: torch.device | str, non_blocking: bool = True) -> "MaskedBatch":
        """A copy with every tensor moved to ``device`` (``target_counts`` stays a host list)."""
        return MaskedBatch(**{f.name: (v.to(device, non_blocking=non_blocking)
                                       if isinstance(v := getattr(self, f.name), torch.Tensor) else v)
                              for f in fields(self)})

    def pin_memory(self) -> "MaskedBatch":
        """Pinned copies of the tensors (the DataLoader calls this when ``pin_memory=True``)."""
        return MaskedBatch(**{f.name: (v.pin_memory() if isinstance(v := getattr(self, f.name), torch.Tensor)
                                       else v) for f in fields(self)})
