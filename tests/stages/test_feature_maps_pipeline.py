"""A teacher's feature map (``clip``) through the whole pipeline on tiny synthetic data: the label stage records its
channels and grid in ``dataset_meta.json``, train-tokenizers trains a ViT VQ-VAE over its cells sized by them,
pretokenize writes one token per cell of every crop, pretrain gives it a modality of its own, and evaluate scores
``rgb-to-clip`` by cosine similarity beside the mean-map baseline; ``fourm-kfp generate``'s engine decodes generated
tokens back to a feature map."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fourm_kfp.config.loader import load_config
from fourm_kfp.contract import lineage, run_stage
from fourm_kfp.data.pretokenized import decode_member, token_name
from fourm_kfp.data.shard_stream import iter_split
from fourm_kfp.data.vocabularies import META_FILE
from fourm_kfp.evaluation.any_to_any import AnyToAny, read_input, write_output
from fourm_kfp.stages import get_stage
from fourm_kfp.storage import open_store
from tests.labeler_plugins import GATE_LABELERS, expose_entry_points

GRID, CHANNELS = 4, 8
MODALITIES = "[rgb, caption, clip]"
ALPHAS = ("[{name: all, weight: 1.0, input_alphas: {rgb: 1.0, caption: 0.5, clip: 0.5}, "
          "target_alphas: {rgb: 0.5, caption: 0.5, clip: 1.0}}]")


@pytest.fixture
def feature_teacher(tmp_path, monkeypatch):
    expose_entry_points(tmp_path / "site", monkeypatch, "gate-labelers", "1", GATE_LABELERS)


def test_a_feature_map_goes_from_its_teacher_to_a_scored_task(tmp_path, feature_teacher):
    config = load_config("smoke", overrides=[
        "prepare_data.num_train=12", "prepare_data.num_val=4",
        f"data.modalities={MODALITIES}", f"data.input_modalities={MODALITIES}", f"data.target_modalities={MODALITIES}",
        f"alphas.mixture={ALPHAS}",
        f"label.labelers=[{{name: feature_map, params: {{grid: {GRID}, channels: {CHANNELS}}}}}]",
        "train_tokenizers.image_modalities=[rgb, clip]", "train_tokenizers.text_modalities=[caption]",
        "train.steps=2", "evaluate.tasks=[rgb-to-clip]", "evaluate.num_samples=4", "evaluate.baseline_samples=8"])
    store = open_store(str(tmp_path / "run"), create=True)
    uris = {stage: run_stage(get_stage(stage), config, store).output_uri
            for stage in ("prepare-data", "label", "train-tokenizers", "pretokenize", "pretrain")}

    labelled = open_store(uris["label"])
    assert json.loads(labelled.get_bytes(META_FILE)) == {
        "modality_settings": {"clip": {"channels": CHANNELS, "grid": GRID}}}
    _, sample = next(iter_split(labelled, "val", ["clip"]))
    assert sample["clip"].shape == (GRID, GRID, CHANNELS) and sample["clip"].dtype == np.float32

    tokenizers = open_store(uris["train-tokenizers"])
    clip = json.loads(tokenizers.get_bytes("image/clip/config.json"))["config"]
    assert clip["codec_settings"] == {"channels": CHANNELS, "grid": GRID}
    assert (clip["in_channels"], clip["image_size"], clip["patch_size"], clip["architecture"]) == (
        CHANNELS, GRID, 1, "vit")
    report = json.loads(tokenizers.get_bytes("reports/tokenizer_report.json"))["image"]["clip"]
    assert {"mse", "cosine", "baseline_mse", "error_ratio"} <= set(report)

    pretokenized = open_store(uris["pretokenize"])
    index = json.loads(pretokenized.get_bytes("pretokenized.json"))
    assert index["modalities"][token_name("clip")]["grid"] == [GRID, GRID]
    _, tokens = next(iter_split(pretokenized, "train", [token_name("clip")], decode=decode_member))
    assert tokens[token_name("clip")].shape == (config.pretokenize.n_crops, GRID, GRID)

    outcome = run_stage(get_stage("evaluate"), config, store, tracking_uri=lineage.default_tracking_uri(tmp_path))
    evaluation = json.loads(open_store(outcome.output_uri).get_bytes("evaluation.json"))
    [task] = evaluation["tasks"]
    assert task["task"] == "rgb-to-clip" and task["primary"] == "cosine" and task["higher_is_better"]
    for side in ("model", "ceiling", "baseline"):
        assert -1.0 <= task[side]["cosine"] <= 1.0 and task[side]["mse"] >= 0.0
    assert task["ceiling"]["cosine"] > 0.5  # the tokenizer's own reconstruction of the truth

    engine = AnyToAny(uris["pretrain"])
    assert engine.side("clip") == GRID and engine.image_size == config.data.image_size
    _, val = next(iter_split(open_store(uris["prepare-data"]), "val", ["rgb"]))
    [generated] = engine.generate([{"rgb": val["rgb"]}], ["clip"])
    assert generated["clip"].shape == (GRID, GRID, CHANNELS) and generated["clip"].dtype == np.float32
    written = write_output(tmp_path / "out", "clip", generated["clip"])
    assert [p.name for p in written] == ["clip.npy", "clip_view.png"]
    np.testing.assert_allclose(read_input("clip", str(written[0]), engine.side("clip")), generated["clip"],
                               rtol=1e-3, atol=1e-3)
