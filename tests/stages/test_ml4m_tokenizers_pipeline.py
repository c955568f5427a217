"""apple/ml-4m's tokenizers in the pipeline (``train_tokenizers.from_ml4m``), on the smoke preset with small random
ml-4m folders built by the port's own constructors: a semseg VQ-VAE (ViT, 134 labels), a CLIP feature-map VQ-VAE
over a feature-map labeler's output and an edge DiVAE (a diffusion decoder, sampled with a fixed seed). The
modalities named are not trained; the bundle holds the folders and names them with their digests; pretokenize's
codes are the port's of the same crops; evaluate and the any-to-any engine decode with them; the tokenizer report
lists their reconstruction errors; a changed folder moves the address and a missing one fails naming the setting."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from fourm_kfp.config.loader import load_config
from fourm_kfp.contract import lineage, run_stage
from fourm_kfp.contract.addressing import stage_address
from fourm_kfp.data.crops import apply_crop, draw_crops
from fourm_kfp.data.pretokenized import decode_member, token_name
from fourm_kfp.data.shard_stream import iter_split
from fourm_kfp.errors import UserError
from fourm_kfp.evaluation.any_to_any import AnyToAny
from fourm_kfp.stages import TRAIN_TOKENIZERS, get_stage
from fourm_kfp.storage import open_store
from fourm_kfp.tokenizers.bundle import load_tokenizers
from fourm_kfp.tokenizers.ml4m import VQVAE, VQConfig, conventions, load_vqvae, read_folder
from fourm_kfp.tokenizers.ml4m.adapter import Ml4mTokenizer
from tests.labeler_plugins import GATE_LABELERS, expose_entry_points

GRID, CHANNELS = 4, 8
MODALITIES = "[rgb, semseg, edge, caption, clip]"
ALPHAS = ("[{name: all, weight: 1.0, input_alphas: {rgb: 1.0, semseg: 0.5, edge: 0.5, caption: 0.5, clip: 0.5}, "
          "target_alphas: {rgb: 0.5, semseg: 1.0, edge: 1.0, caption: 0.5, clip: 1.0}}]")
TINY = {"enc_type": "vit_tiny_enc", "dec_type": "vit_tiny_dec", "quant_type": "lucid", "latent_dim": 8,
        "codebook_size": 64, "post_mlp": True, "norm_codes": True, "num_codebooks": 1}
#: ml-4m's semseg tokenizer's layout (134 labels embedded to n_channels), at 64 px with patch 8: 8 x 8 codes
SEMSEG = {**TINY, "image_size": 64, "patch_size": 8, "n_channels": 8, "n_labels": 134, "patch_proj": True}
#: ml-4m's CLIP tokenizer's layout (a feature map's cells, no patch projection) over 8 channels
CLIP = {**TINY, "image_size": 64, "patch_size": 16, "n_channels": CHANNELS, "patch_proj": False}
#: ml-4m's edge DiVAE's layout (1 channel, a patched UNet decoder: the port's scaled-down preset), 4 x 4 codes
EDGE = {**TINY, "dec_type": "unet_patched_tiny", "image_size": 64, "patch_size": 16, "n_channels": 1,
        "num_train_timesteps": 1000, "beta_schedule": "linear", "prediction_type": "sample", "thresholding": True,
        "zero_terminal_snr": True, "cls_free_guidance_dropout": 0.0}


def make_folder(path: Path, config: dict, seed: int) -> Path:
    """An ml-4m tokenizer folder (a VQ-VAE's, or a DiVAE's) with random weights, as ``save_pretrained`` lays it
    out."""
    from fourm_kfp.tokenizers.ml4m.divae import DiVAE

    from safetensors.torch import save_model

    torch.manual_seed(seed)
    model = DiVAE(config) if VQConfig.from_dict(config).kind == "divae" else VQVAE(config)
    path.mkdir(parents=True, exist_ok=True)
    save_model(model, str(path / "model.safetensors"))  # a tensor held under two names stored once, as ml-4m saves
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    return path


@pytest.fixture(autouse=True)
def feature_teacher(tmp_path, monkeypatch):
    expose_entry_points(tmp_path / "site", monkeypatch, "gate-labelers", "1", GATE_LABELERS)


@pytest.fixture
def folders(tmp_path):
    return {"semseg": make_folder(tmp_path / "ml4m" / "semseg", SEMSEG, 1),
            "clip": make_folder(tmp_path / "ml4m" / "clip", CLIP, 2),
            "edge": make_folder(tmp_path / "ml4m" / "edge", EDGE, 5)}


def _config(folders, **extra):
    overrides = [
        "prepare_data.num_train=12", "prepare_data.num_val=4",
        f"data.modalities={MODALITIES}", f"data.input_modalities={MODALITIES}", f"data.target_modalities={MODALITIES}",
        f"alphas.mixture={ALPHAS}",
        f"label.labelers=[{{name: feature_map, params: {{grid: {GRID}, channels: {CHANNELS}}}}}]",
        "train_tokenizers.image_modalities=[rgb, semseg, edge, clip]", "train_tokenizers.text_modalities=[caption]",
        "train.steps=2", "evaluate.tasks=[rgb-to-semseg, rgb-to-clip]", "evaluate.num_samples=4",
        "evaluate.baseline_samples=8"]
    if folders:
        overrides.append("train_tokenizers.from_ml4m={" + ", ".join(f"{m}: {p}" for m, p in folders.items()) + "}")
    return load_config("smoke", overrides=overrides + [f"{k}={v}" for k, v in extra.items()])


def test_ml4m_tokenizers_go_through_the_pipeline(tmp_path, folders):
    config = _config(folders)
    store = open_store(str(tmp_path / "run"), create=True)
    uris = {stage: run_stage(get_stage(stage), config, store).output_uri
            for stage in ("prepare-data", "label", "train-tokenizers", "pretokenize", "pretrain")}

    # not trained: the bundle holds the folders' own files, and its index names them with their digests
    tokenizers = open_store(uris["train-tokenizers"])
    index = json.loads(tokenizers.get_bytes("tokenizers.json"))
    manifest = json.loads(tokenizers.get_bytes("_MANIFEST.json"))
    for modality, folder in folders.items():
        entry = index["image"][modality]
        read = read_folder(folder)
        assert entry["kind"] == "ml4m" and entry["source"] == str(folder)
        assert entry["family"] == ("divae" if modality == "edge" else "vqvae")
        assert entry["digest"] == read.digest and entry["ml4m_config"] == read.config
        for name in ("config.json", "model.safetensors"):
            assert tokenizers.get_bytes(f"image/{modality}/{name}") == (folder / name).read_bytes()
        assert f"{modality}.train_images_seen" not in manifest["metrics"]
        assert {"name": f"ml4m_tokenizer.{modality}", "uri": str(folder), "digest": read.digest} in \
            manifest["sources"]
    assert (index["image"]["semseg"]["grid_size"], index["image"]["semseg"]["codebook_size"]) == (8, 64)
    assert index["image"]["clip"]["grid_size"] == GRID
    assert "kind" not in index["image"]["rgb"] and "rgb.train_images_seen" in manifest["metrics"]  # trained

    report = json.loads(tokenizers.get_bytes("reports/tokenizer_report.json"))
    assert {"miou", "pixel_acc", "baseline_miou", "error_ratio", "codebook_usage"} <= set(report["image"]["semseg"])
    assert {"mse", "cosine", "baseline_mse", "error_ratio"} <= set(report["image"]["clip"])
    assert {"pixel_err", "miou", "baseline_pixel_err", "error_ratio"} <= set(report["image"]["edge"])
    assert report["ml4m"]["semseg"]["digest"] == read_folder(folders["semseg"]).digest
    markdown = tokenizers.get_text("reports/tokenizer_report.md")
    assert "| semseg | pixel_err |" in markdown and "semseg: apple/ml-4m's tokenizer (vqvae)" in markdown

    bundle = load_tokenizers(uris["train-tokenizers"])
    assert all(isinstance(bundle.image[m], Ml4mTokenizer) for m in folders)

    # pretokenize's codes are the port's encode of the same crops, in ml-4m's conventions
    pretokenized = open_store(uris["pretokenize"])
    pindex = json.loads(pretokenized.get_bytes("pretokenized.json"))
    assert pindex["modalities"][token_name("semseg")] == {"vocab_size": 64, "grid": [8, 8], "dtype": "uint8"}
    assert pindex["modalities"][token_name("clip")]["grid"] == [GRID, GRID]
    semseg, clip = load_vqvae(folders["semseg"]), load_vqvae(folders["clip"])
    p = config.pretokenize
    names = [token_name("semseg"), token_name("clip")]
    dataset = [open_store(uris["prepare-data"]), open_store(uris["label"])]
    checked = 0
    for (key, tokens), (key2, semseg_sample), (key3, clip_sample) in zip(
            iter_split(pretokenized, "train", names, decode=decode_member, limit=3),
            iter_split(dataset[0], "train", ["semseg"], limit=3), iter_split(dataset[1], "train", ["clip"], limit=3)):
        assert key == key2 == key3
        crops = draw_crops(key, p.seed, p.n_crops, config.data.image_size, tuple(p.crop_scale), tuple(p.crop_ratio),
                           p.flip_probability)
        views = [apply_crop({**semseg_sample, **clip_sample}, c, config.data.image_size) for c in crops]
        ids = np.stack([v["semseg"] for v in views])
        np.testing.assert_array_equal(tokens[token_name("semseg")], semseg.encode(conventions.semseg(ids)).numpy())
        features = torch.from_numpy(np.stack([v["clip"] for v in views])).permute(0, 3, 1, 2)
        np.testing.assert_array_equal(tokens[token_name("clip")], clip.encode(features).numpy())
        checked += 1
    assert checked == 3

    # evaluate decodes with them (the ceiling is the truth's tokens decoded), and so does generate's engine
    outcome = run_stage(get_stage("evaluate"), config, store, tracking_uri=lineage.default_tracking_uri(tmp_path))
    evaluation = json.loads(open_store(outcome.output_uri).get_bytes("evaluation.json"))
    tasks = {t["task"]: t for t in evaluation["tasks"]}
    assert set(tasks) == {"rgb-to-semseg", "rgb-to-clip"}  # edge has no task: generate decodes it below
    assert 0.0 <= tasks["rgb-to-semseg"]["ceiling"]["miou"] <= 1.0
    assert -1.0 <= tasks["rgb-to-clip"]["ceiling"]["cosine"] <= 1.0

    engine = AnyToAny(uris["pretrain"])
    assert isinstance(engine.tokenizers.image["semseg"], Ml4mTokenizer) and engine.side("semseg") == 64
    codes = torch.from_numpy(tokens[token_name("semseg")][:2].astype(np.int64))
    decoded = engine.detokenize("semseg", list(codes.numpy()))
    expected = semseg.decode_tokens(codes)[:, 1:7].argmax(1).numpy()  # classes 1..6 are the ids 0..5
    np.testing.assert_array_equal(np.stack(decoded), expected.astype(np.uint8))
    _, val = next(iter_split(dataset[0], "val", ["rgb"]))
    [generated] = engine.generate([{"rgb": val["rgb"]}], ["semseg", "edge", "clip"])
    assert generated["semseg"].shape == (64, 64) and generated["semseg"].max() < 6
    assert generated["edge"].shape == (64, 64) and set(np.unique(generated["edge"])) <= {0, 1}
    assert generated["clip"].shape == (GRID, GRID, CHANNELS)
    budget = engine.decode_budget()  # what evaluation reports as its decode budget: a DiVAE costs its steps
    assert budget["edge"] == {"images": 1, "decoder": "ml-4m DiVAE (UNet)", "passes_per_image": 10,
                              "decoder_passes": 10}
    assert budget["semseg"]["decoder"] == "ml-4m VQ-VAE" and budget["semseg"]["passes_per_image"] == 1


def test_the_folder_is_part_of_the_address(tmp_path, folders):
    plain = stage_address(TRAIN_TOKENIZERS, _config({}))
    with_ml4m = stage_address(TRAIN_TOKENIZERS, _config(folders))
    assert with_ml4m != plain
    make_folder(folders["semseg"], SEMSEG, 3)  # other weights in the same folder
    assert stage_address(TRAIN_TOKENIZERS, _config(folders)) != with_ml4m
    copy = shutil.copytree(folders["clip"], tmp_path / "elsewhere")
    assert stage_address(TRAIN_TOKENIZERS, _config({"clip": copy})) != stage_address(
        TRAIN_TOKENIZERS, _config({"clip": folders["clip"]}))  # the URI is configuration


def test_a_missing_folder_is_named_by_its_setting(tmp_path, folders):
    (folders["clip"] / "model.safetensors").unlink()
    with pytest.raises(UserError, match=r"train_tokenizers\.from_ml4m\.clip: .*clip: no model\.safetensors"):
        stage_address(TRAIN_TOKENIZERS, _config(folders))
    with pytest.raises(UserError, match=r"train_tokenizers\.from_ml4m\.semseg: .*nowhere: no config\.json"):
        stage_address(TRAIN_TOKENIZERS, _config({"semseg": tmp_path / "nowhere"}))


def test_a_folder_that_does_not_fit_fails_naming_the_setting_and_the_reason(tmp_path):
    wrong = make_folder(tmp_path / "wide_clip", {**CLIP, "n_channels": 16}, 4)
    config = _config({"clip": wrong})
    store = open_store(str(tmp_path / "run"), create=True)
    for stage in ("prepare-data", "label"):
        run_stage(get_stage(stage), config, store)
    with pytest.raises(UserError, match=r"train_tokenizers\.from_ml4m\.clip: .*8 channels, the tokenizer takes "
                                        r"n_channels 16"):
        run_stage(get_stage("train-tokenizers"), config, store)
