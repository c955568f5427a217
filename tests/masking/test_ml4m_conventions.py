"""The data-side settings an ml-4m model needs, off by default: ImageNet pixel normalisation from ``train.model`` to
the batch and to generation, ml-4m's text conventions (``[EOS]`` appended, sentinels from ``[S_1]``), a tokenizer
JSON made elsewhere (ml-4m's, when a checkout is at hand) used as the text tokenizer, and the addresses: each setting
moves the stages it changes, and none moves anything at its default."""

from __future__ import annotations

import os
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models

from fourm_kfp.batch import IMAGENET_MEAN, IMAGENET_STD
from fourm_kfp.config.loader import load_config
from fourm_kfp.config.schema import ConfigError
from fourm_kfp.contract import run_stage
from fourm_kfp.contract.addressing import stage_address
from fourm_kfp.masking.multimodal_masking import collate, mask_sample
from fourm_kfp.masking.span_masking import unmask
from fourm_kfp.masking.token_loader import DatasetRef, LoaderArgs, _SampleEncoder
from fourm_kfp.model.fourm import FourM
from fourm_kfp.model.generation import Generator, SamplingArgs
from fourm_kfp.stages import PIPELINE, get_stage
from fourm_kfp.storage import open_store
from fourm_kfp.tokenizers.text_tokenizer import (TextTokenizerError, read_text_tokenizer, save_text_tokenizer,
                                                 special_token_ids, text_sentinels, train_text_tokenizer)
from fourm_kfp.train.build import TrainingInputs, masking_args, modality_specs, model_args

#: ml-4m's WordPiece in the checkout ``FOURM_REFERENCE`` names (the other ml-4m tests' variable)
ML4M_TOKENIZER = "fourm/utils/tokenizer/trained/text_tokenizer_4m_wordpiece_30k.json"
TEXTS = ["a small red cube left of a large blue sphere", "a green cylinder", "two yellow cubes on a grey floor"]


@pytest.fixture(scope="module")
def text_tokenizer() -> Tokenizer:
    return train_text_tokenizer(TEXTS * 4, vocab_size=120, num_sentinels=10, class_names=())


def _inputs(tok: Tokenizer) -> TrainingInputs:
    """What the committed tokenizers and pretokenized data say, for a 4x4 rgb grid (16 px) and a caption."""
    pretokenized = {"modalities": {"tok_rgb": {"grid": [4, 4], "vocab_size": 32}}, "rgb_pixels": True,
                    "text": {"modalities": ["caption"], "vocab_size": tok.get_vocab_size()}}
    tokenizers = {"text": {"special_tokens": special_token_ids(tok)}}
    return TrainingInputs("mem://pretokenized", "mem://tokenizers", pretokenized, tokenizers, tok.to_str())


def _config(*overrides: str):
    return load_config("smoke", overrides=["data.image_size=16", "data.modalities=[rgb, caption]",
                                           "data.input_modalities=[rgb, caption]",
                                           "data.target_modalities=[rgb, caption]", *overrides])


def _setup(tok, *overrides):
    config, inputs = _config(*overrides), _inputs(tok)
    specs = modality_specs(config, inputs)
    return config, inputs, specs, masking_args(config, specs, inputs)


# -- pixels ------------------------------------------------------------------------------------------------------


def test_imagenet_normalisation_reaches_the_batch_and_a_sample_without_pixels_reads_zeros(text_tokenizer):
    _, _, specs, masking = _setup(text_tokenizer, "train.model.rgb_input=pixels",
                                  "train.model.pixel_normalisation=imagenet")
    assert [(s.name, s.pixel_input, s.pixel_normalisation) for s in specs] == [("rgb", True, "imagenet"),
                                                                                ("caption", False, "symmetric")]
    image = np.zeros((16, 16, 3), np.uint8)
    image[2, 5] = (200, 100, 50)
    rng = np.random.default_rng(0)
    grid = np.arange(16).reshape(4, 4)
    batch = collate([mask_sample(rng, masking, {"rgb": grid}, image),
                     mask_sample(rng, masking, {"caption": [7, 8, 9]}, None)], masking)
    expected = [(v - m) / s for v, m, s in zip((200, 100, 50), IMAGENET_MEAN, IMAGENET_STD)]
    np.testing.assert_allclose(batch.pixels[0, :, 2, 5].numpy(), expected, rtol=1e-5)
    np.testing.assert_allclose(batch.pixels[0, :, 0, 0].numpy(), [-m / s for m, s in zip(IMAGENET_MEAN, IMAGENET_STD)],
                               rtol=1e-5)
    assert not batch.pixels[1].any()  # no pixels: zero after normalisation, whatever the normalisation
    symmetric = _setup(text_tokenizer, "train.model.rgb_input=pixels")[3]
    default = collate([mask_sample(np.random.default_rng(0), symmetric, {"rgb": grid}, image)], symmetric)
    np.testing.assert_allclose(default.pixels[0, :, 2, 5].numpy(), [(v - 127.5) / 127.5 for v in (200, 100, 50)],
                               rtol=1e-6)


def test_generation_normalises_pixels_as_the_model_was_trained(text_tokenizer):
    config, _, specs, _ = _setup(text_tokenizer, "train.model.rgb_input=pixels",
                                 "train.model.pixel_normalisation=imagenet", "train.model.dim=32",
                                 "train.model.heads=4", "train.model.encoder_layers=1", "train.model.decoder_layers=1")
    torch.manual_seed(0)
    model = FourM(model_args(config, specs)).eval()
    seen, encode = [], model.encode

    def spy(batch):
        seen.append(batch.pixels.clone())
        return encode(batch)

    model.encode = spy
    image = np.full((16, 16, 3), 255, np.uint8)
    sentinels = text_sentinels(special_token_ids(text_tokenizer))
    Generator(model, sentinels, precision="fp32").generate(
        [{"pixels": image}, {"caption": np.array([7, 8])}], "rgb", SamplingArgs(steps=1, temperature=0))
    expected = [(255 - m) / s for m, s in zip(IMAGENET_MEAN, IMAGENET_STD)]
    np.testing.assert_allclose(seen[0][0, :, 7, 7].numpy(), expected, rtol=1e-5)
    assert not seen[0][1].any()  # the sample without pixels reads zeros, as in training


# -- text ----------------------------------------------------------------------------------------------------------


def _masked_texts(tok, *overrides, samples=40):
    """``(ids the loader made, restored text, target)`` of a caption alone in its sample, masked many times under
    the given config: the smoke mixture gives it an input and a target share (all-to-all, never cut: a caption alone
    is capped by its own length) or only a target (rgb-to-all: the whole text is the target)."""
    _, inputs, specs, masking = _setup(tok, *overrides)
    loader = LoaderArgs((DatasetRef("mem://pretokenized"),), masking, inputs.text_tokenizer_json, batch_size=1)
    tokens, _ = _SampleEncoder(loader).tokens({"caption": TEXTS[0]}, 0)
    caption = [s.name for s in specs].index("caption")
    out = []
    for seed in range(samples):
        sample = mask_sample(np.random.default_rng(seed), masking, tokens, None)
        enc = sample.enc[sample.enc[:, 1] == caption, 0].tolist()
        dec = sample.dec[sample.dec[:, 2] == caption]
        target = [int(dec[0, 0]), *dec[:, 1].tolist()] if len(dec) else []
        inputs = enc or target[:1]  # a whole target: the text is the first span
        out.append((list(tokens["caption"]), unmask(inputs, target, masking.sentinels), target))
    return out


def test_ml4m_text_conventions_append_eos_and_start_the_sentinels_at_s1(text_tokenizer):
    specials = special_token_ids(text_tokenizer)
    bare = text_tokenizer.encode(TEXTS[0]).ids
    masked = _masked_texts(text_tokenizer, "train.model.text_conventions=ml4m", "train.input_budget=64",
                           "train.target_budget=64")
    assert all(target for *_, target in masked)
    for ids, restored, target in masked:
        assert ids == [*bare, specials["[EOS]"]]
        assert restored == ids  # [EOS] ends the restored text
        assert target[0] == specials["[S_1]"]  # the first masked span takes [S_1]
        assert specials["[S_0]"] not in target


def test_the_default_text_conventions_are_unchanged(text_tokenizer):
    specials = special_token_ids(text_tokenizer)
    bare = text_tokenizer.encode(TEXTS[0]).ids
    masked = _masked_texts(text_tokenizer, "train.input_budget=64", "train.target_budget=64")
    assert all(target for *_, target in masked)
    for ids, restored, target in masked:
        assert ids == bare and restored == bare
        assert target[0] == specials["[S_0]"]


def test_ml4m_conventions_keep_a_long_text_within_the_model_length(text_tokenizer):
    """ml-4m appends [EOS] before the cut: a text longer than the model reads ends without it."""
    _, inputs, _, masking = _setup(text_tokenizer, "train.model.text_conventions=ml4m",
                                   "train.model.max_text_length=8")
    loader = LoaderArgs((DatasetRef("mem://pretokenized"),), masking, inputs.text_tokenizer_json, batch_size=1)
    ids, _ = _SampleEncoder(loader).tokens({"caption": TEXTS[0]}, 0)
    assert list(ids["caption"]) == text_tokenizer.encode(TEXTS[0]).ids[:6]
    short, _ = _SampleEncoder(loader).tokens({"caption": "a cube"}, 0)
    assert list(short["caption"])[-1] == special_token_ids(text_tokenizer)["[EOS]"]


# -- tokenizer JSONs made elsewhere ------------------------------------------------------------------------------


def test_ml4m_tokenizer_json_loads_as_our_text_tokenizer():
    checkout = os.environ.get("FOURM_REFERENCE")
    if not checkout:
        pytest.skip("FOURM_REFERENCE (an apple/ml-4m checkout) is not set")
    path = Path(checkout) / ML4M_TOKENIZER
    assert path.is_file(), f"FOURM_REFERENCE={checkout} is no ml-4m checkout: {path} is missing"
    tok, digest = read_text_tokenizer(str(path))
    specials = special_token_ids(tok)
    assert [specials[t] for t in ("[PAD]", "[UNK]", "[SOS]", "[EOS]", "[S_0]", "[S_1]")] == [0, 1, 2, 3, 4, 5]
    assert text_sentinels(specials, "ml4m")[:2] == (specials["[S_1]"], specials["[S_2]"])
    ids = tok.encode("A cat sitting on a red sofa. v0=12 v1=400").ids
    assert tok.token_to_id("[UNK]") not in ids and tok.token_to_id("v0=12") in ids
    assert tok.decode(ids) == "a cat sitting on a red sofa. v0=12 v1=400"
    assert digest.startswith("sha256:")


def test_a_tokenizer_json_without_a_special_token_is_an_error_naming_the_file_and_the_token(tmp_path):
    tok = Tokenizer(models.WordPiece({"[PAD]": 0, "[UNK]": 1, "[EOS]": 2, "[S_0]": 3, "[S_1]": 4, "cube": 5},
                                     unk_token="[UNK]"))
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    with pytest.raises(TextTokenizerError, match=r"tokenizer\.json.*\[SOS\]"):
        read_text_tokenizer(str(path))
    with pytest.raises(TextTokenizerError, match="no such file"):
        read_text_tokenizer(str(tmp_path / "absent.json"))


def test_train_tokenizers_uses_a_given_text_tokenizer_as_it_is(tmp_path, text_tokenizer):
    given = tmp_path / "given.json"
    save_text_tokenizer(text_tokenizer, given)
    config = load_config("smoke", overrides=["prepare_data.num_train=6", "prepare_data.num_val=2",
                                             "train_tokenizers.image_modalities=[]",
                                             f"train_tokenizers.text_tokenizer_from={given}"])
    store = open_store(str(tmp_path / "store"), create=True)
    run_stage(get_stage("prepare-data"), config, store)
    output = open_store(run_stage(get_stage("train-tokenizers"), config, store).output_uri)
    committed = Tokenizer.from_str(output.get_text("text/tokenizer.json"))
    assert committed.get_vocab() == text_tokenizer.get_vocab()
    index = json.loads(output.get_bytes("tokenizers.json"))
    assert index["text"]["special_tokens"] == special_token_ids(text_tokenizer)


# -- addresses -----------------------------------------------------------------------------------------------------


def _addresses(config) -> dict[str, str]:
    memo: dict[str, str] = {}
    return {s.name: stage_address(s, config, memo) for s in PIPELINE if s.is_enabled(config)}


@pytest.mark.parametrize("override", ["train.model.context_bias=true", "train.model.pixel_modality_embed=true",
                                      "train.model.pixel_normalisation=imagenet",
                                      "train.model.text_conventions=ml4m"])
def test_each_model_setting_moves_pretrain_and_what_follows_only(override):
    pixels = ["train.model.rgb_input=pixels"]  # the pixel settings apply to rgb read as patches only
    plain = _addresses(load_config("smoke", overrides=pixels))
    changed = _addresses(load_config("smoke", overrides=pixels + [override]))
    assert {name for name in plain if plain[name] != changed[name]} == {"pretrain", "evaluate"}
    at_default = override.split("=")[0] + "=" + {"true": "false", "imagenet": "symmetric",
                                                 "ml4m": "fourm-kfp"}[override.split("=")[1]]
    assert _addresses(load_config("smoke", overrides=pixels + [at_default])) == plain


def test_pixel_settings_need_rgb_as_pixels():
    with pytest.raises(ConfigError, match=r"model.pixel_normalisation applies to rgb read as pixel patches"):
        load_config("smoke", overrides=["train.model.pixel_normalisation=imagenet"])


def test_a_given_text_tokenizer_moves_train_tokenizers_and_what_follows(tmp_path, text_tokenizer):
    given = tmp_path / "given.json"
    save_text_tokenizer(text_tokenizer, given)
    plain = _addresses(load_config("smoke"))
    changed = _addresses(load_config("smoke", overrides=[f"train_tokenizers.text_tokenizer_from={given}"]))
    assert {name for name in plain if plain[name] != changed[name]} == {"train-tokenizers", "pretokenize",
                                                                        "pretrain", "evaluate"}
