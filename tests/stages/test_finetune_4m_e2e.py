"""The ``finetune-4m`` recipe end to end on random weights in 4M-7's layout, scaled down: a random 4M-7-shaped model
(ml-4m's domains and vocabularies: ``rgb@224`` pixels, ``tok_rgb``, ``tok_depth``, ``tok_semseg``, ``tok_normal``,
``tok_clip``, ``caption``, ``det``; tiny width and depth) written as an ml-4m folder by our exporter, random ml-4m
tokenizer folders for its image modalities built by the port at the domains' vocabularies (DiVAEs for rgb, depth,
normal and edge, a VQ-VAE for semseg, as ml-4m publishes them), and a tiny WordPiece (ml-4m's own when
``FOURM_REFERENCE`` names an ml-4m checkout). Every stage of the preset runs with ``--set`` overrides that scale it
down; the tokenizers are the folders (not trained) and ``reports/init_report.json`` says the token tables of the
modalities with ml-4m tokenizers were imported and are meaningful. The same run on tokenizers trained here
(``from_ml4m: {}``) imports the same rows and says they are not meaningful."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from fourm_kfp.batch import ModalitySpec
from fourm_kfp.config.loader import load_config
from fourm_kfp.contract import lineage, run_stage
from fourm_kfp.model.fourm import FourM, FourMArgs
from fourm_kfp.model.ml4m import DOMAINS, export_ml4m
from fourm_kfp.stages import PIPELINE
from fourm_kfp.storage import open_store
from fourm_kfp.tokenizers.ml4m import read_folder
from fourm_kfp.tokenizers.text_tokenizer import save_text_tokenizer, train_text_tokenizer
from fourm_kfp.train.token_tables import ML4M_WORDPIECE, OWN_CODES
from tests.stages.test_ml4m_tokenizers_pipeline import make_folder

#: 4M-7's domains (ml-4m's cfgs/default/4m/data/cc12m/main/mix_mod7_all2all_rgb2all_a0.5.yaml): rgb@224 and
#: tok_rgb, tok_depth, tok_semseg, tok_normal, tok_clip, caption, det
FOURM7 = ("rgb", "depth", "semseg", "normal", "clip", "caption", "det")
DIM, HEADS, LAYERS = 16, 2, 1
SIDE, PATCH = 64, 16  # 4 x 4 codes a side, and rgb's 16-px pixel patches as rgb@224's
IMAGE = ("rgb", "depth", "normal", "semseg", "edge")  # the preset's image modalities
TEXT = ("caption", "det")
#: ml-4m's tokenizers' layouts (DiVAEs with a patched UNet decoder, edge's a UViT as the published folder's; semseg a
#: ViT VQ-VAE over 134 labels), scaled down
TINY = {"enc_type": "vit_tiny_enc", "quant_type": "lucid", "latent_dim": 8, "post_mlp": True, "norm_codes": True,
        "num_codebooks": 1, "image_size": SIDE, "patch_size": PATCH}
DIVAE = {**TINY, "dec_type": "unet_patched_tiny", "num_train_timesteps": 1000, "beta_schedule": "linear",
         "prediction_type": "sample", "thresholding": True, "zero_terminal_snr": True,
         "cls_free_guidance_dropout": 0.0}
CONFIGS = {"rgb": {**DIVAE, "n_channels": 3}, "depth": {**DIVAE, "n_channels": 1},
           "normal": {**DIVAE, "n_channels": 3},
           "edge": {**DIVAE, "dec_type": "uvit_tiny_p4_f16", "conditioning": "concat", "n_channels": 1},
           "semseg": {**TINY, "dec_type": "vit_tiny_dec", "n_channels": 8, "n_labels": 134, "patch_proj": True}}


def fourm7(folder: Path) -> Path:
    """A random 4M-7-shaped model (tiny trunk, ml-4m's vocabularies and 14 x 14 grids) as an ml-4m folder."""
    specs = []
    for name in FOURM7:
        domain = DOMAINS[name]
        if domain.kind == "image":
            pixel = name == "rgb"
            specs.append(ModalitySpec(name, "image", domain.vocab_size, grid=domain.grid, pixel_input=pixel,
                                      patch_size=16 if pixel else 0,
                                      pixel_normalisation="imagenet" if pixel else "symmetric"))
        else:
            specs.append(ModalitySpec(name, "sequence", domain.vocab_size, max_length=64))
    torch.manual_seed(7)
    model = FourM(FourMArgs(tuple(specs), encoder_layers=LAYERS, decoder_layers=LAYERS, dim=DIM, heads=HEADS,
                            tie_embeddings=False, context_bias=True, pixel_modality_embed=True))
    config = export_ml4m(model, folder)
    assert "tok_clip@224" in config["domains_out"] and "tok_sam_edge@224" not in config["domains_out"]
    return folder


def tokenizer_folders(root: Path) -> dict[str, Path]:
    """Random ml-4m tokenizer folders at the vocabularies of the model's domains (edge: 4M-21's tok_sam_edge)."""
    return {m: make_folder(root / m, {**CONFIGS[m], "codebook_size": DOMAINS[m].vocab_size}, seed)
            for seed, m in enumerate(IMAGE)}


def text_tokenizer(root: Path) -> Path:
    reference = os.environ.get("FOURM_REFERENCE")
    if reference:  # ml-4m's own WordPiece: its 30000 ids are the source's rows
        path = Path(reference) / "fourm/utils/tokenizer/trained/text_tokenizer_4m_wordpiece_30k.json"
        assert path.exists(), f"FOURM_REFERENCE={reference} is not an ml-4m checkout: no {path}"
        return path
    path = root / "wordpiece.json"
    save_text_tokenizer(train_text_tokenizer(["a red cube", "a blue sphere on a green floor"], 64, 8), path)
    return path


def _config(model: Path, tokenizers: dict[str, Path], text: Path):
    overrides = [
        "prepare_data.num_train=8", "prepare_data.num_val=4", "prepare_data.preview_samples=2",
        f"data.image_size={SIDE}",
        "train_tokenizers.from_ml4m={" + ", ".join(f"{m}: {p}" for m, p in tokenizers.items()) + "}",
        f"train_tokenizers.text_tokenizer_from={text}", "train_tokenizers.max_val_images=2",
        "train_tokenizers.recon_samples=1",
        # what trains when a modality is not from ml-4m: tiny VQ-VAEs at ml-4m's vocabularies (the preset's)
        "train_tokenizers.image={architecture: conv, patch_size: 16, hidden_dim: 16, depth: 1, codebook_size: 8192, "
        "code_dim: 8, steps: 2, batch_size: 2, lr: 1.0e-3, warmup_steps: 1}",
        "pretokenize.n_crops=1", "pretokenize.batch_size=4", "pretokenize.check_samples=2",
        f"train.model.encoder_layers={LAYERS}", f"train.model.decoder_layers={LAYERS}", f"train.model.dim={DIM}",
        f"train.model.heads={HEADS}", "train.model.max_text_length=64", "train.input_budget=16",
        "train.target_budget=16", "train.steps=2", "train.global_batch_size=4", "train.optimizer.warmup_steps=1",
        "train.log_every=1", "train.checkpoint_every=2", "train.val_batches=1", "train.compile=false",
        f"train.init_from={model}",
        "evaluate.tasks=[rgb-to-semseg]", "evaluate.num_samples=2", "evaluate.batch_size=2",
        "evaluate.masked_batches=1", "evaluate.baseline_samples=4", "evaluate.grid_samples=1"]
    return load_config("finetune-4m", overrides=overrides)


def _run(config, store, tmp_path, through: str = "evaluate") -> dict[str, str]:
    uris = {}
    for spec in PIPELINE:
        if spec.is_enabled(config):
            uris[spec.name] = run_stage(spec, config, store,
                                        tracking_uri=lineage.default_tracking_uri(tmp_path)).output_uri
        if spec.name == through:
            break
    return uris


def test_finetune_4m_imports_meaningful_token_tables_with_ml4m_tokenizers(tmp_path):
    model = fourm7(tmp_path / "4M-7_B_CC12M")
    folders = tokenizer_folders(tmp_path / "models")
    text = text_tokenizer(tmp_path)
    ml4m_text = bool(os.environ.get("FOURM_REFERENCE"))
    config = _config(model, folders, text)
    store = open_store(str(tmp_path / "run"), create=True)
    uris = _run(config, store, tmp_path)
    assert "evaluate" in uris and "label" not in uris  # every stage the preset runs

    # the tokenizers are the folders, as they are: not trained
    bundle = open_store(uris["train-tokenizers"])
    index = json.loads(bundle.get_bytes("tokenizers.json"))
    manifest = json.loads(bundle.get_bytes("_MANIFEST.json"))
    digests = {m: read_folder(folder).digest for m, folder in folders.items()}
    for modality, folder in folders.items():
        entry = index["image"][modality]
        assert entry["kind"] == "ml4m" and entry["digest"] == digests[modality], modality
        assert entry["family"] == ("vqvae" if modality == "semseg" else "divae")
        assert entry["codebook_size"] == DOMAINS[modality].vocab_size
        for name in ("config.json", "model.safetensors"):
            assert bundle.get_bytes(f"image/{modality}/{name}") == (folder / name).read_bytes()
        assert f"{modality}.train_images_seen" not in manifest["metrics"]

    init = json.loads(open_store(uris["pretrain"]).get_bytes("reports/init_report.json"))
    print(json.dumps(init["token_tables"], indent=2, sort_keys=True))
    tables = init["token_tables"]
    assert init["kind"] == "ml-4m" and set(tables) == set(IMAGE) | set(TEXT)
    for modality in ("rgb", "depth", "normal", "semseg"):  # 4M-7's image domains, with ml-4m's tokenizers
        entry = tables[modality]
        assert entry["imported"] and entry["meaningful"] is True, (modality, entry)
        assert entry["tokenizer"] == f"ml4m:{digests[modality]}" and entry["tokenizer_source"] == str(
            folders[modality])
        assert entry["source_vocab"] == entry["tokenizer_vocab"] == DOMAINS[modality].vocab_size
        assert "dec_token_embed" in entry["tables"] and "head" in entry["tables"]
    assert ("enc_token_embed" in tables["depth"]["tables"]) and ("enc_token_embed" not in tables["rgb"]["tables"])
    # 4M-7 has no edge domain: ml-4m's edge tokenizer, but nothing to import
    assert tables["edge"] == {"imported": False, "meaningful": False, "tokenizer": f"ml4m:{digests['edge']}",
                              "tokenizer_source": str(folders["edge"]), "tokenizer_vocab": 8192,
                              "reason": "not imported: enc_token_embed: not in the source"}
    for modality in TEXT:
        entry = tables[modality]
        if ml4m_text:  # ml-4m's WordPiece: its rows
            assert entry["imported"] and entry["meaningful"] is True, entry
            assert entry["tokenizer"].removeprefix("ml4m:") in ML4M_WORDPIECE
        else:  # a tiny WordPiece: another vocabulary, nothing imported
            assert not entry["imported"] and entry["meaningful"] is False
            assert entry["tokenizer"].startswith("file:") and "vocab 30000 in the source" in entry["reason"]
    assert any(d.startswith("tok_clip@224") for d in init["dropped"])
    markdown = open_store(uris["pretrain"]).get_text("reports/pretrain_report.md")
    assert "- token tables: meaningful: " in markdown and "rgb" in markdown

    # the same run on tokenizers trained here: the same rows imported, not meaningful
    own = _config(model, {}, text)
    assert not own.train_tokenizers.from_ml4m
    uris = _run(own, store, tmp_path, through="pretrain")
    own_index = json.loads(open_store(uris["train-tokenizers"]).get_bytes("tokenizers.json"))
    assert all("kind" not in own_index["image"][m] for m in IMAGE)  # trained
    own_init = json.loads(open_store(uris["pretrain"]).get_bytes("reports/init_report.json"))
    print(json.dumps(own_init["token_tables"], indent=2, sort_keys=True))
    for modality in ("rgb", "depth", "normal", "semseg"):
        entry = own_init["token_tables"][modality]
        assert entry["imported"] and entry["meaningful"] is False, (modality, entry)
        assert entry["tables"] == tables[modality]["tables"]
        assert entry["tokenizer"].startswith("fourm-kfp:") and OWN_CODES in entry["reason"]
    assert own_init["imported_parameters"] == init["imported_parameters"]
