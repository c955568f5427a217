"""Each modality's tokenizer input exactly as ml-4m's data pipeline makes it (``fourm/data/modality_transforms.py``,
the transforms its tokenizers were trained and are run with), from the files ml-4m reads; and the inverse maps for
decoded outputs. Every function returns what :meth:`~.vqvae.VQEncoder.encode` takes, batched (``B x ...``) when
given a batch.

========  ==========================================  ==========================================================
modality  ml-4m's file / teacher output               tokenizer input
========  ==========================================  ==========================================================
rgb       8-bit RGB ``H x W x 3``                     ``3 x H x W`` float32 in [-1, 1]: ``(x / 255 - 0.5) / 0.5``
                                                      (Inception mean and std; 4M's own pixel input, ``rgb@224``,
                                                      takes ImageNet's instead: :func:`rgb_imagenet`)
depth     16-bit PNG ``H x W`` (any unit)             ``1 x H x W`` float32: ``d = png / 65535``, standardised by
                                                      the mean and (unbiased) variance of the middle 80% of its
                                                      sorted values: ``(d - mean) / sqrt(var + 1e-6)``
normal    8-bit RGB ``H x W x 3``                     ``3 x H x W`` float32: ``(x / 255 - 0.5) / 0.5``
semseg    8-bit COCO ids ``H x W`` (255: none)        ``H x W`` int64 class ids 0..133: ``(id + 1) mod 256``, so
                                                      0 is "no class" and COCO's 133 classes are 1..133
CLIP      CLIP-B/16's last tokens without [CLS],      ``512 x 14 x 14`` at 224 px: ``B x (N_H N_W) x D`` laid out
          after its projection                        as ``B x D x N_H x N_W`` (:func:`feature_map`), unscaled;
                                                      the teacher's own input: :func:`feature_teacher_input`
DINOv2    DINOv2-B/14's ``x_norm_patchtokens``        ``768 x 16 x 16`` at 224 px, the same layout and input
global    DINOv2's ``x_norm_clstoken`` /              ``B x D x 1 x 1`` (:func:`global_feature`)
          ImageBind's token 0; human poses' 207
          pose numbers
========  ==========================================  ==========================================================

``tests/tokenizers/ml4m_reference/conventions.npz`` holds fixed inputs put through ml-4m's own transform classes
(``bench/ml4m_tokenizer_reference.py``); the tests check these functions against them.

This pipeline's in-memory arrays differ from ml-4m's files in places (depth in metres, normals as float vectors
in our camera frame, semseg ids of the dataset's vocabulary): mapping them onto ml-4m's conventions is the
integration's work, not this module's. Depth standardisation is affine, so any unit gives the same input up to
the ``1e-6`` in the variance (:func:`standardise_depth` takes floats).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

INCEPTION_MEAN, INCEPTION_STD = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
#: COCO's semantic classes plus "no class" (ml-4m's ``COCO_SEMSEG_NUM_CLASSES``)
SEMSEG_CLASSES = 134
#: the share of sorted depth values left out at each end before standardising
DEPTH_TRIM = 0.1


def _to_float_chw(image: np.ndarray) -> torch.Tensor:
    """An 8-bit ``[B x] H x W x C`` image as float32 ``[B x] C x H x W`` in [0, 1] (torchvision's ``to_tensor``)."""
    x = torch.from_numpy(np.ascontiguousarray(image))
    if x.dtype != torch.uint8:
        raise TypeError(f"expected an 8-bit image, not {x.dtype}")
    return x.movedim(-1, -3).contiguous().float().div(255)


def _normalise(x: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    shape = (-1, 1, 1)
    return (x - torch.tensor(mean, dtype=x.dtype).view(shape)) / torch.tensor(std, dtype=x.dtype).view(shape)


def rgb(image: np.ndarray) -> torch.Tensor:
    """The rgb tokenizer's input: 8-bit ``[B x] H x W x 3`` to float32 ``[B x] 3 x H x W`` in [-1, 1]."""
    return _normalise(_to_float_chw(image), INCEPTION_MEAN, INCEPTION_STD)


def rgb_imagenet(image: np.ndarray) -> torch.Tensor:
    """4M's pixel input (``rgb@224``): ImageNet mean and std."""
    return _normalise(_to_float_chw(image), IMAGENET_MEAN, IMAGENET_STD)


def feature_teacher_input(images: Sequence[np.ndarray], side: int) -> torch.Tensor:
    """What ml-4m feeds CLIP-B/16 and DINOv2-B/14 to make the feature maps its CLIP and DINOv2 tokenizers were
    trained on (``run_training_vqvae.py``; ``save_vq_tokens.py`` at pre-tokenization): each 8-bit ``H x W x 3``
    photo's centred square (``CenterCropImageAugmenter``: offsets floored) resized to ``side`` x ``side`` by Pillow's
    bicubic (``RGBTransform.image_augment`` with ``resample_mode`` None, both scripts' default), then ImageNet's mean
    and std (the tokenizers' training configs set ``imagenet_default_mean_and_std: True``; ``save_vq_tokens.py``
    itself would take Inception's 0.5 / 0.5, which the published tokenizers never saw): float32
    ``B x 3 x side x side``."""
    from PIL import Image

    squares = []
    for image in images:
        height, width = image.shape[:2]
        square = min(height, width)
        top, left = (height - square) // 2, (width - square) // 2
        crop = np.ascontiguousarray(image[top:top + square, left:left + square])
        if square != side:
            crop = np.asarray(Image.fromarray(crop).resize((side, side), Image.Resampling.BICUBIC))
        squares.append(crop)
    return rgb_imagenet(np.stack(squares))


def normal(image: np.ndarray) -> torch.Tensor:
    """The normal tokenizer's input: an 8-bit normal map ``[B x] H x W x 3`` to ``(x / 255 - 0.5) / 0.5``."""
    return _normalise(_to_float_chw(image), (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))


def standardise_depth(depth: torch.Tensor | np.ndarray) -> torch.Tensor:
    """ml-4m's truncated standardisation of one depth map (any shape): mean and unbiased variance of the middle
    80% of its sorted values (invalid zeros included, as ml-4m includes them)."""
    d = torch.as_tensor(depth, dtype=torch.float32)
    values = torch.sort(d.reshape(-1)).values
    n = values.shape[0]
    middle = values[int(DEPTH_TRIM * n): int((1 - DEPTH_TRIM) * n)]
    return (d - middle.mean()) / torch.sqrt(middle.var() + 1e-6)


def depth(png: np.ndarray) -> torch.Tensor:
    """The depth tokenizer's input from a 16-bit depth PNG's values: ``[B x] H x W`` to ``[B x] 1 x H x W``,
    each map standardised on its own."""
    scaled = torch.tensor(np.asarray(png) / (2 ** 16 - 1.0), dtype=torch.float32)
    if scaled.dim() == 2:
        return standardise_depth(scaled).unsqueeze(0)
    return torch.stack([standardise_depth(m) for m in scaled]).unsqueeze(1)


def semseg(ids: np.ndarray) -> torch.Tensor:
    """The semseg tokenizer's input from 8-bit COCO class ids (255 = unlabelled): ``(id + 1) mod 256`` as int64,
    0 = no class."""
    ids = np.asarray(ids)
    if ids.dtype != np.uint8:
        raise TypeError(f"expected 8-bit COCO ids, not {ids.dtype}")
    shifted = (ids + np.uint8(1)).astype(np.int64)
    if int(shifted.max(initial=0)) >= SEMSEG_CLASSES:
        raise ValueError(f"semseg ids above {SEMSEG_CLASSES - 2} (COCO has 133 classes; 255 means none)")
    return torch.from_numpy(shifted)


def feature_map(tokens: torch.Tensor | np.ndarray, grid: tuple[int, int]) -> torch.Tensor:
    """A teacher's patch tokens ``B x (N_H N_W) x D`` (row-major) as the tokenizer's ``B x D x N_H x N_W``."""
    t = torch.as_tensor(tokens, dtype=torch.float32)
    b, n, d = t.shape
    if n != grid[0] * grid[1]:
        raise ValueError(f"{n} tokens are not a {grid[0]} x {grid[1]} grid")
    return t.transpose(1, 2).reshape(b, d, *grid)


def global_feature(vectors: torch.Tensor | np.ndarray) -> torch.Tensor:
    """Global features or pose vectors ``B x D`` as the MLP tokenizers' ``B x D x 1 x 1``."""
    v = torch.as_tensor(vectors, dtype=torch.float32)
    return v[:, :, None, None]


def rgb_image(decoded: torch.Tensor) -> np.ndarray:
    """A decoded rgb ``[B x] 3 x H x W`` in [-1, 1] back to 8-bit ``[B x] H x W x 3``."""
    x = (decoded.detach().float().clamp(-1, 1) * 0.5 + 0.5) * 255
    return x.round().to(torch.uint8).movedim(-3, -1).cpu().numpy()


def semseg_ids(logits: torch.Tensor) -> np.ndarray:
    """Decoded semseg logits ``B x 134 x H x W`` to COCO ids (``class - 1``; 255 = no class), 8-bit."""
    return (logits.argmax(dim=1).cpu().numpy().astype(np.int64) - 1).astype(np.uint8)
