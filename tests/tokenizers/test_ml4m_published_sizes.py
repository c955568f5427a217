"""Every published ml-4m tokenizer folder's configuration, rebuilt, against the size its ``model.safetensors`` is listed
at on the hub.

``tests/tokenizers/ml4m_reference/published_folders.json`` holds, for each ``EPFL-VILAB/4M_tokenizers_*`` folder,
the configuration the port rebuilds for it (from ml-4m's training configs, corrected where the listed size showed
a wrong guess: the patch-14 feature tokenizers' 28x28 position tables, the global ones' 16 codebooks), the size the
hub's file listing shows and the page it was seen on. Each network is built by the port on the meta device (no
memory); its state dict, each tensor counted once in float32 (ml-4m's saves), plus the safetensors header those keys
make, must be the listed size within the listing's rounding (3 significant digits) and a few KB of header metadata.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

from fourm_kfp.tokenizers.ml4m.divae import DiVAE
from fourm_kfp.tokenizers.ml4m.vqvae import VQVAE, VQConfig

PUBLISHED = json.loads((Path(__file__).parent / "ml4m_reference" / "published_folders.json").read_text())["folders"]
UNITS = {"kB": 1e3, "MB": 1e6, "GB": 1e9}
#: what the header's ``__metadata__`` may add ("Convert ckpt to safetensors with metadata": the config, a few hundred
#: bytes)
METADATA_SLACK = 4096


def listed_bounds(listed: str) -> tuple[float, float]:
    """The byte range a hub listing such as ``874 MB`` or ``1.15 GB`` (3 significant digits) stands for."""
    value, unit = re.fullmatch(r"([\d.]+) (kB|MB|GB)", listed).groups()
    decimals = len(value.partition(".")[2])
    half = 0.5 * 10 ** -decimals * UNITS[unit]
    return float(value) * UNITS[unit] - half, float(value) * UNITS[unit] + half


def build(config: dict) -> torch.nn.Module:
    cls = DiVAE if VQConfig.from_dict(config).kind == "divae" else VQVAE
    with torch.device("meta"):
        return cls(config)


def file_bytes(model: torch.nn.Module) -> int:
    """What safetensors writes for ``model``'s state dict: an 8-byte length, the JSON header (padded to 8) and each
    tensor once (diffusers' ``Downsample2D`` registers one convolution under two names: one stored)."""
    header, offset, seen = {}, 0, set()
    for key, tensor in model.state_dict().items():
        if key.endswith((".Conv2d_0.weight", ".Conv2d_0.bias")):
            continue
        assert key not in seen
        seen.add(key)
        size = math.prod(tensor.shape) * 4  # float32, as ml-4m saves
        header[key] = {"dtype": "F32", "shape": list(tensor.shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":"))
    return 8 + len(text) + (-len(text)) % 8 + offset


@pytest.mark.parametrize("name", sorted(n for n, e in PUBLISHED.items() if e["listed"]))
def test_the_rebuilt_configuration_has_the_listed_size(name):
    entry = PUBLISHED[name]
    low, high = listed_bounds(entry["listed"])
    size = file_bytes(build(entry["config"]))
    assert low <= size <= high + METADATA_SLACK, (
        f"{name}: the rebuilt configuration makes {size / 1e6:.2f} MB, the hub lists {entry['listed']} "
        f"({entry['seen']}): a wrong guess of its configuration")


def test_the_edge_folder_is_a_uvit_divae_and_no_unet_variant_fits():
    """874 MB is ml-4m's ViT-B encoder with the ``uvit_b_p4_f16`` decoder; the patched UNet at the same settings
    is far larger."""
    entry = PUBLISHED["edge_8k_224-512"]
    assert entry["config"]["dec_type"] == "uvit_b_p4_f16"
    low, high = listed_bounds(entry["listed"])
    unet = file_bytes(build({**entry["config"], "dec_type": "unet_patched"}))
    assert unet > high + 20e6


def test_the_wrong_guesses_would_have_been_caught():
    """The training configs' values the listed sizes refuse: 32x32 position tables for the patch-14 feature
    tokenizers (448 / 14), 8 codebooks for the global ones."""
    for name, change in (("DINOv2-B14_8k_224-448", {"image_size": 448}),
                         ("ImageBind-H14_8k_224-448", {"image_size": 448}),
                         ("DINOv2-B14-global_8k_16_224", {"num_codebooks": 8}),
                         ("ImageBind-H14-global_8k_16_224", {"num_codebooks": 8})):
        low, high = listed_bounds(PUBLISHED[name]["listed"])
        size = file_bytes(build({**PUBLISHED[name]["config"], **change}))
        assert not low <= size <= high + METADATA_SLACK, name


def test_every_published_folder_is_listed_with_its_source():
    assert set(PUBLISHED) == {
        "rgb_16k_224-448", "depth_8k_224-448", "normal_8k_224-448", "edge_8k_224-512", "semseg_4k_224-448",
        "CLIP-B16_8k_224-448", "DINOv2-B14_8k_224-448", "DINOv2-B14-global_8k_16_224", "ImageBind-H14_8k_224-448",
        "ImageBind-H14-global_8k_16_224", "sam-instance_1k_64", "human-poses_1k_8"}
    for name, entry in PUBLISHED.items():
        assert entry["seen"] and entry["config_from"], name
        if entry["listed"]:
            assert f"4M_tokenizers_{name}" in entry["seen"], name
