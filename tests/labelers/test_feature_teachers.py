"""The feature-map teachers (``hf_clip``, ``hf_dinov2``) against apple/ml-4m's own computation of the maps its CLIP
and DINOv2 tokenizers were trained on (``tests/labelers/ml4m_feature_maps/``, made by
``bench/ml4m_feature_reference.py`` with ml-4m's centre crop, resize and normalisation, ml-4m's CLIP
``VisionTransformer`` and DINOv2's ``DinoVisionTransformer``, from random weights): the same weights, converted to
transformers' folders as transformers' own conversion scripts name them, give the same maps on photos that are not
square, given raw and through prepare-data (and a DINOv2 with registers gives DINOv2's own code's maps on the same
inputs); the maps reach an ml-4m tokenizer's input as ml-4m lays them out; and a folder of another family is
refused at build."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fourm_kfp.data.image_normalize import normalize_image_sized
from fourm_kfp.labelers.base import LabelBatch, LabelerError
from fourm_kfp.labelers.registry import build_labeler

REFERENCE = Path(__file__).resolve().parent / "ml4m_feature_maps"
MANIFEST = json.loads((REFERENCE / "manifest.json").read_text())
PHOTOS = list(MANIFEST["photos"])


def _reference(name: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(REFERENCE / f"{name}.safetensors")


def _photo(name: str) -> np.ndarray:
    return np.asarray(Image.open(REFERENCE / f"{name}.png").convert("RGB"))


def _save_hub_folder(model_class, config, tensors: dict[str, torch.Tensor], folder: Path) -> None:
    """``config.json`` and the tensors under the hub checkpoints' names, after checking that transformers loads
    every one of its parameters from them and nothing else."""
    from safetensors.torch import save_file

    config.save_pretrained(folder)
    save_file({k: v.contiguous() for k, v in tensors.items()}, folder / "model.safetensors",
              metadata={"format": "pt"})
    model, info = model_class.from_pretrained(folder, output_loading_info=True)
    assert not any(info.values()), info
    loaded = dict(model.named_parameters())
    assert sum(v.numel() for v in loaded.values()) == sum(v.numel() for v in tensors.values())


def _clip_folder(folder: Path) -> Path:
    """ml-4m's CLIP ``VisionTransformer`` weights as a ``CLIPVisionModelWithProjection`` folder (the names of
    transformers' ``convert_clip_original_pytorch_to_hf.py``), with CLIP-B/16's processor files."""
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModelWithProjection

    spec, theirs = MANIFEST["clip"], _reference("clip")
    width = spec["width"]
    config = CLIPVisionConfig(hidden_size=width, intermediate_size=4 * width, num_hidden_layers=spec["layers"],
                              num_attention_heads=spec["heads"], image_size=spec["input_resolution"],
                              patch_size=spec["patch_size"], projection_dim=spec["output_dim"],
                              hidden_act="quick_gelu", layer_norm_eps=1e-5)
    ours = {"vision_model.embeddings.patch_embedding.weight": theirs["conv1.weight"],
            "vision_model.embeddings.class_embedding": theirs["class_embedding"],
            "vision_model.embeddings.position_embedding.weight": theirs["positional_embedding"],
            "visual_projection.weight": theirs["proj"].T}
    for part in ("weight", "bias"):
        ours[f"vision_model.pre_layrnorm.{part}"] = theirs[f"ln_pre.{part}"]
        ours[f"vision_model.post_layernorm.{part}"] = theirs[f"ln_post.{part}"]
        for i in range(spec["layers"]):
            block, layer = f"transformer.resblocks.{i}", f"vision_model.encoder.layers.{i}"
            for name, value in zip("qkv", theirs[f"{block}.attn.in_proj_{part}"].chunk(3)):
                ours[f"{layer}.self_attn.{name}_proj.{part}"] = value
            for mine, upstream in (("self_attn.out_proj", "attn.out_proj"), ("layer_norm1", "ln_1"),
                                   ("layer_norm2", "ln_2"), ("mlp.fc1", "mlp.c_fc"), ("mlp.fc2", "mlp.c_proj")):
                ours[f"{layer}.{mine}.{part}"] = theirs[f"{block}.{upstream}.{part}"]
    _save_hub_folder(CLIPVisionModelWithProjection, config, ours, folder)
    CLIPImageProcessor(size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224}).save_pretrained(folder)
    return folder


def _dinov2_folder(folder: Path, reference: str = "dinov2") -> Path:
    """DINOv2's ``DinoVisionTransformer`` weights (``reference``: ``dinov2``, or ``dinov2_reg`` with registers) as a
    ``Dinov2Model`` / ``Dinov2WithRegistersModel`` folder (the names of transformers' ``convert_dinov2_to_hf.py`` and
    ``convert_dinov2_with_registers_to_hf.py``), with DINOv2-B/14's processor files (256 px, a 224 px centre crop)."""
    from transformers import (BitImageProcessor, Dinov2Config, Dinov2Model, Dinov2WithRegistersConfig,
                              Dinov2WithRegistersModel)

    spec, theirs = MANIFEST[reference], _reference(reference)
    registers = spec["num_register_tokens"]
    config_class, model_class = ((Dinov2WithRegistersConfig, Dinov2WithRegistersModel) if registers
                                 else (Dinov2Config, Dinov2Model))
    config = config_class(hidden_size=spec["embed_dim"], num_hidden_layers=spec["depth"],
                          num_attention_heads=spec["num_heads"], mlp_ratio=spec["mlp_ratio"],
                          patch_size=spec["patch_size"], image_size=spec["img_size"],
                          layerscale_value=spec["init_values"], layer_norm_eps=1e-6,
                          **({"num_register_tokens": registers} if registers else {}))
    ours = {"embeddings.cls_token": theirs["cls_token"], "embeddings.mask_token": theirs["mask_token"],
            "embeddings.position_embeddings": theirs["pos_embed"]}
    if registers:
        ours["embeddings.register_tokens"] = theirs["register_tokens"]
    for part in ("weight", "bias"):
        ours[f"embeddings.patch_embeddings.projection.{part}"] = theirs[f"patch_embed.proj.{part}"]
        ours[f"layernorm.{part}"] = theirs[f"norm.{part}"]
        for i in range(spec["depth"]):
            block, layer = f"blocks.{i}", f"encoder.layer.{i}"
            for name, value in zip(("query", "key", "value"), theirs[f"{block}.attn.qkv.{part}"].chunk(3)):
                ours[f"{layer}.attention.attention.{name}.{part}"] = value
            for mine, upstream in (("attention.output.dense", "attn.proj"), ("norm1", "norm1"), ("norm2", "norm2"),
                                   ("mlp.fc1", "mlp.fc1"), ("mlp.fc2", "mlp.fc2")):
                ours[f"{layer}.{mine}.{part}"] = theirs[f"{block}.{upstream}.{part}"]
    for i in range(spec["depth"]):
        ours[f"encoder.layer.{i}.layer_scale1.lambda1"] = theirs[f"blocks.{i}.ls1.gamma"]
        ours[f"encoder.layer.{i}.layer_scale2.lambda1"] = theirs[f"blocks.{i}.ls2.gamma"]
    _save_hub_folder(model_class, config, ours, folder)
    BitImageProcessor(size={"shortest_edge": 256}, crop_size={"height": 224, "width": 224}, do_center_crop=True,
                      image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225]).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("ml4m-features")
    return {"clip": str(_clip_folder(root / "clip")), "dinov2": str(_dinov2_folder(root / "dinov2")),
            "dinov2_reg": str(_dinov2_folder(root / "dinov2_reg", "dinov2_reg"))}


@pytest.fixture(scope="module")
def maps() -> dict[str, torch.Tensor]:
    return _reference("maps")


def _prepared(name: str) -> np.ndarray:
    """The photo as prepare-data stores it at the reference's side (its encoded bytes through the stage's own
    decode, centre crop and resize)."""
    buffer = io.BytesIO()
    Image.open(REFERENCE / f"{name}.png").save(buffer, format="PNG")
    return normalize_image_sized(buffer.getvalue(), MANIFEST["side"], name)[0]


#: each reference network: the labeler that reads it
LABELER = {"clip": "hf_clip", "dinov2": "hf_dinov2", "dinov2_reg": "hf_dinov2"}


def test_the_reference_photos_are_not_square_and_prepare_data_both_crops_and_resamples_them():
    sides = set()
    for name in PHOTOS:
        height, width = _photo(name).shape[:2]
        assert height != width
        sides.add(min(height, width) == MANIFEST["side"])
    assert sides == {True, False}  # some only cropped at 224 px, some resampled down or up


def _reference_map(maps: dict[str, torch.Tensor], network: str, photo: str) -> np.ndarray:
    return maps[f"{network}/{photo}"].permute(1, 2, 0).numpy()  # ml-4m's D x nh x nw as our [grid, grid, D]


@pytest.mark.parametrize("network", list(LABELER))
def test_the_maps_are_ml4m_s_on_photos_that_are_not_square(folders, maps, network):
    teacher = build_labeler(LABELER[network], {}, folders[network])
    assert teacher.params["preprocess"] == "ml4m"
    grid = MANIFEST["side"] // MANIFEST[network]["patch_size"]
    assert teacher.modality_settings["grid"] == grid
    made = teacher.label(LabelBatch(tuple(PHOTOS), tuple(_photo(name) for name in PHOTOS)))
    for name, mine in zip(PHOTOS, made):
        theirs = _reference_map(maps, network, name)
        assert mine.shape == theirs.shape == (grid, grid, teacher.channels)
        np.testing.assert_allclose(mine, theirs, rtol=0, atol=1e-5, err_msg=f"{network} on {name}")


@pytest.mark.parametrize("network", list(LABELER))
def test_photos_prepared_by_prepare_data_give_ml4m_s_maps(folders, maps, network):
    teacher = build_labeler(LABELER[network], {}, folders[network])
    prepared = tuple(_prepared(name) for name in PHOTOS)
    assert all(p.shape == (MANIFEST["side"], MANIFEST["side"], 3) for p in prepared)
    made = teacher.label(LabelBatch(tuple(PHOTOS), prepared))
    for name, mine in zip(PHOTOS, made):
        np.testing.assert_allclose(mine, _reference_map(maps, network, name), rtol=0, atol=1e-5,
                                   err_msg=f"{network} on prepared {name}")


@pytest.mark.parametrize("network", ["clip", "dinov2"])
def test_an_ml4m_tokenizer_sees_the_maps_as_ml4m_feeds_them(folders, maps, network):
    from fourm_kfp.tokenizers.ml4m.adapter import CONVENTIONS

    teacher = build_labeler(LABELER[network], {}, folders[network])
    made = teacher.label(LabelBatch(tuple(PHOTOS), tuple(_photo(name) for name in PHOTOS)))
    tokenizer_input = CONVENTIONS["features"].to_input(np.stack(made), teacher.modality_settings)
    theirs = torch.stack([maps[f"{network}/{name}"] for name in PHOTOS])  # what ml-4m's tokenize takes
    assert tokenizer_input.shape == theirs.shape and tokenizer_input.dtype == torch.float32
    np.testing.assert_allclose(tokenizer_input.numpy(), theirs.numpy(), rtol=0, atol=1e-5)


@pytest.mark.parametrize("network", list(LABELER))
def test_the_processor_setting_is_the_folder_s_processor_and_transformers_forward(folders, network):
    from transformers import AutoImageProcessor, AutoModel, CLIPVisionModelWithProjection

    labeler = LABELER[network]
    photos = tuple(_prepared(name) for name in PHOTOS)
    teacher = build_labeler(labeler, {"preprocess": "processor"}, folders[network])
    made = teacher.label(LabelBatch(tuple(PHOTOS), photos))
    model_class = CLIPVisionModelWithProjection if network == "clip" else AutoModel
    model = model_class.from_pretrained(folders[network]).eval()
    inputs = AutoImageProcessor.from_pretrained(folders[network])(images=list(photos), return_tensors="pt")
    with torch.no_grad():
        hidden = model(**inputs).last_hidden_state
        if network == "clip":
            tokens = model.visual_projection(model.vision_model.post_layernorm(hidden[:, 1:]))
        else:
            tokens = hidden[:, 1 + MANIFEST[network]["num_register_tokens"]:]
    for mine, theirs in zip(made, tokens.numpy()):
        np.testing.assert_allclose(mine.reshape(theirs.shape), theirs, atol=1e-5)
    ml4m = build_labeler(labeler, {}, folders[network]).label(LabelBatch(tuple(PHOTOS), photos))
    assert all(np.abs(a - b).max() > 1e-2 for a, b in zip(made, ml4m))  # not ml-4m's maps
    assert teacher.identity()["params"]["preprocess"] == "processor"
    assert teacher.identity() != build_labeler(labeler, {}, folders[network]).identity()


def test_dinov2_s_position_table_is_resized_as_dinov2_s_own_code_not_as_transformers(folders):
    from transformers import Dinov2Model

    from fourm_kfp.labelers.teachers.features import dinov2_position_table

    model = Dinov2Model.from_pretrained(folders["dinov2"]).eval()
    embeddings = model.embeddings
    side = MANIFEST["side"]
    ours = dinov2_position_table(embeddings.position_embeddings, side, side, embeddings.patch_size)
    tokens = torch.zeros(1, 1 + (side // 14) ** 2, MANIFEST["dinov2"]["embed_dim"])
    transformers_own = embeddings.interpolate_pos_encoding(tokens, side, side)
    assert ours.shape == transformers_own.shape == tokens.shape
    torch.testing.assert_close(ours[:, 0], transformers_own[:, 0])  # the class token's position stays
    assert (ours - transformers_own).abs().max() > 1e-3  # the scale factor (grid + 0.1) / 37, not 16 / 37


def test_preprocess_must_be_a_known_setting(folders):
    with pytest.raises(LabelerError, match=r"'hf_clip'.*preprocess.*ml4m, processor.*'bicubic'"):
        build_labeler("hf_clip", {"preprocess": "bicubic"}, folders["clip"])


def _siglip_folder(folder: Path) -> Path:
    from transformers import SiglipConfig, SiglipImageProcessor, SiglipModel

    torch.manual_seed(0)
    config = SiglipConfig(text_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                                       "num_attention_heads": 2, "vocab_size": 64},
                          vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                                         "num_attention_heads": 2, "image_size": 32, "patch_size": 16})
    SiglipModel(config).save_pretrained(folder)
    SiglipImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder)
    return folder


def _whole_clip_folder(folder: Path) -> Path:
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    torch.manual_seed(0)
    config = CLIPConfig(text_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                                     "num_attention_heads": 2, "vocab_size": 64},
                        vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                                       "num_attention_heads": 2, "image_size": 32, "patch_size": 16,
                                       "projection_dim": 8},  # as the hub's CLIP configs repeat it
                        projection_dim=8)
    CLIPModel(config).save_pretrained(folder)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("labeler, make, found, accepted", [
    ("hf_clip", _siglip_folder, "siglip", "clip, clip_vision_model"),
    ("hf_dinov2", _whole_clip_folder, "clip", "dinov2, dinov2_with_registers"),
])
def test_a_folder_of_another_family_is_refused_at_build_naming_what_the_labeler_reads(tmp_path, labeler, make,
                                                                                      found, accepted):
    folder = make(tmp_path / found)
    for where in (None, "label.labelers[3]"):
        with pytest.raises(LabelerError) as caught:
            build_labeler(labeler, {}, str(folder), where=where)
        message = str(caught.value)
        assert f"labeler {labeler!r}" in message and str(folder) in message
        assert f"{found!r} model" in message and accepted in message
        assert message.count(f"labeler {labeler!r}") == 1 and message.count(str(folder)) == 1, message
        assert message.startswith(where or "labeler")


def test_a_whole_clip_folder_is_read_by_hf_clip(tmp_path):
    folder = _whole_clip_folder(tmp_path / "clip")
    photo = np.zeros((40, 48, 3), np.uint8)
    made = build_labeler("hf_clip", {}, str(folder)).label(LabelBatch(("a",), (photo,)))
    assert made[0].shape == (2, 2, 8)
