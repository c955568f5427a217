"""``train.init_from``: a source with another modality set gives each shared modality its own rows of the
embedding tables and head (bit for bit) and leaves the rest as freshly initialised, tied and untied heads map onto
each other, a model initialised from itself computes the same loss, and every kind of source (pretrain output,
checkpoint, ml-4m) is read and reported."""

from __future__ import annotations

import json
import math
import re
import types
from dataclasses import replace

import pytest
import torch
from safetensors import safe_open
from torch.distributed.checkpoint.state_dict import get_model_state_dict

from fourm_kfp.batch import ModalitySpec
from fourm_kfp.config.loader import load_config
from fourm_kfp.config.schema import ConfigError
from fourm_kfp.contract import run_stage
from fourm_kfp.contract.manifest import MANIFEST_NAME, commit_manifest
from fourm_kfp.model.fourm import FourM, FourMArgs, count_parameters
from fourm_kfp.model.ml4m import export_ml4m
from fourm_kfp.model.saved_model import export_model
from fourm_kfp.stages import get_stage
from fourm_kfp.storage import open_store
from fourm_kfp.train.checkpoint import CheckpointManager
from fourm_kfp.train.initial_weights import InitReport, load_initial_weights, map_weights
from fourm_kfp.train.pretrain_report import report_markdown
from tests.model.test_fourm import ARGS, random_batch
from tests.train.pretrain_helpers import smoke_upstream

RGB = ModalitySpec("rgb", "image", 32, grid=(4, 4), pixel_input=True, patch_size=2)
NORMAL = ModalitySpec("normal", "image", 16, grid=(4, 4))
#: the source has depth (not in the target); the target has semseg (not in the source) and a larger caption vocabulary
SOURCE = FourMArgs((RGB, NORMAL, ModalitySpec("depth", "image", 24, grid=(4, 4)),
                    ModalitySpec("caption", "sequence", 50, max_length=12)), dim=32, heads=4)
TARGET = FourMArgs((ModalitySpec("caption", "sequence", 60, max_length=12), RGB,
                    ModalitySpec("semseg", "image", 24, grid=(4, 4)), NORMAL), dim=32, heads=4)


def build(args: FourMArgs, seed: int) -> FourM:
    torch.manual_seed(seed)
    return FourM(args)


def rows(model: FourM, table: str, name: str) -> torch.Tensor:
    """The rows of modality ``name`` in ``table`` (worked out from the specs, not from the model's offsets)."""
    specs = model.args.modalities
    sizes = [1 if table == "enc_token_embed" and m.pixel_input else 1 if table == "modality_embed" else m.vocab_size
             for m in specs]
    index = [m.name for m in specs].index(name)
    start = sum(sizes[:index])
    weight = model.head.weight if table == "head" else getattr(model, table).weight
    return weight[start:start + sizes[index]]


def test_shared_modalities_take_their_rows_and_the_rest_stays_freshly_initialised():
    source, target = build(SOURCE, 0), build(TARGET, 1)
    report = map_weights(source, target, InitReport("src", "test"))
    fresh = build(TARGET, 1)
    with torch.no_grad():
        for table, name in [("dec_token_embed", "rgb"), ("dec_token_embed", "normal"), ("enc_token_embed", "normal"),
                            ("modality_embed", "rgb"), ("modality_embed", "normal"), ("modality_embed", "caption")]:
            assert torch.equal(rows(target, table, name), rows(source, table, name)), (table, name)
        for table, name in [("enc_token_embed", "rgb"), ("enc_token_embed", "caption"), ("dec_token_embed", "caption"),
                            ("enc_token_embed", "semseg"), ("dec_token_embed", "semseg"), ("modality_embed", "semseg")]:
            assert torch.equal(rows(target, table, name), rows(fresh, table, name)), (table, name)
            if name != "rgb":  # (rgb's placeholder row is zeros whatever the seed)
                assert not torch.equal(rows(target, table, name), rows(build(TARGET, 2), table, name))
        for key, tensor in source.state_dict().items():
            if not key.endswith("token_embed.weight") and key != "modality_embed.weight":
                assert torch.equal(target.state_dict()[key], tensor), key

    trunk = [k for k in target.state_dict() if not k.endswith(("token_embed.weight", "modality_embed.weight"))]
    assert report.imported == ["enc_token_embed[normal]", "dec_token_embed[rgb]", "dec_token_embed[normal]",
                               "modality_embed[caption]", "modality_embed[rgb]", "modality_embed[normal]", *trunk]
    assert report.new == [
        "enc_token_embed[caption]: vocab 50 in the source, 60 here",
        "enc_token_embed[rgb]: a placeholder row (rgb enters as pixel patches): never read, never imported",
        "enc_token_embed[semseg]: not in the source",
        "dec_token_embed[caption]: vocab 50 in the source, 60 here",
        "dec_token_embed[semseg]: not in the source",
        "modality_embed[semseg]: not in the source"]
    assert report.dropped == [f"{table}[depth]: not a modality here"
                              for table in ("enc_token_embed", "dec_token_embed", "modality_embed")]
    assert report.imported_parameters + report.new_parameters == count_parameters(target)
    assert report.new_parameters == 32 * (60 + 1 + 24 + 60 + 24 + 1)
    assert report.dropped_parameters == 32 * (24 + 24 + 1)
    assert report.to_dict()["new_parameters"] == report.new_parameters


def test_other_widths_and_shapes_are_new_with_their_reason():
    report = map_weights(build(replace(SOURCE, dim=16, heads=2), 0), build(TARGET, 1), InitReport("src", "test"))
    assert report.imported == []
    assert "dec_token_embed[normal]: width 16 in the source, 32 here" in report.new
    assert "enc_token_embed[caption]: vocab 50 in the source, 60 here; width 16 in the source, 32 here" in report.new
    assert "encoder_norm.weight: shape [16] in the source, [32] here" in report.new
    assert report.new_parameters == count_parameters(build(TARGET, 1))


def test_a_tied_model_takes_its_head_from_the_decoder_rows_and_drops_a_separate_head():
    source, target = build(replace(SOURCE, tie_embeddings=False), 0), build(TARGET, 1)
    report = map_weights(source, target, InitReport("src", "test"))
    assert torch.equal(rows(target, "dec_token_embed", "normal"), rows(source, "dec_token_embed", "normal"))
    assert "head[normal]: this model's head is its dec_token_embed (tie_embeddings)" in report.dropped
    assert "head[depth]: not a modality here" in report.dropped
    assert not any(entry.startswith("head") for entry in report.imported + report.new)
    assert report.dropped_parameters == 32 * (24 + 24 + 1) + 32 * (32 + 16 + 24 + 50)


def test_a_separate_head_from_a_tied_source_takes_the_decoder_rows():
    source, target = build(SOURCE, 0), build(replace(TARGET, tie_embeddings=False), 1)
    report = map_weights(source, target, InitReport("src", "test"))
    assert torch.equal(rows(target, "head", "normal"), rows(source, "dec_token_embed", "normal"))
    assert torch.equal(rows(target, "head", "semseg"), rows(build(replace(TARGET, tie_embeddings=False), 1),
                                                            "head", "semseg"))
    assert {"head[rgb] (from dec_token_embed[rgb])", "head[normal] (from dec_token_embed[normal])"} <= set(
        report.imported)
    assert {"head[caption]: vocab 50 in the source, 60 here", "head[semseg]: not in the source"} <= set(report.new)
    assert report.imported_parameters + report.new_parameters == count_parameters(target)


def test_separate_heads_map_head_to_head():
    source = build(replace(SOURCE, tie_embeddings=False), 0)
    target = build(replace(TARGET, tie_embeddings=False), 1)
    report = map_weights(source, target, InitReport("src", "test"))
    assert torch.equal(rows(target, "head", "rgb"), rows(source, "head", "rgb"))
    assert not torch.equal(rows(target, "head", "rgb"), rows(source, "dec_token_embed", "rgb"))
    assert "head[rgb]" in report.imported and "head[depth]: not a modality here" in report.dropped


def test_a_model_initialised_from_itself_computes_the_same_loss():
    source, target = build(ARGS, 0).eval(), build(ARGS, 1).eval()
    batch = random_batch()
    with torch.no_grad():
        assert not torch.equal(target(batch).loss, source(batch).loss)
        report = map_weights(source, target, InitReport("src", "test"))
        assert torch.equal(target(batch).loss, source(batch).loss)
    assert report.new == ["enc_token_embed[rgb]: a placeholder row (rgb enters as pixel patches): never read, "
                          "never imported"] and report.dropped == [] and report.new_parameters == 32


def test_a_pretrain_output_is_mapped_per_modality(tmp_path):
    source = build(SOURCE, 0)
    store = open_store(str(tmp_path / "pretrain" / "abc"), create=True)
    export_model(source.state_dict(), SOURCE, store, tokenizers_uri=str(tmp_path / "tok" / "x"),
                 pretokenized_uri=str(tmp_path / "pre" / "y"), text_special_ids={}, step=3)
    commit_manifest(store, {"stage": "pretrain"})
    target = build(TARGET, 1)
    report = load_initial_weights(target, store.uri)
    assert report.kind == "pretrain output" and report.source == store.uri
    assert torch.equal(rows(target, "dec_token_embed", "normal"), rows(source, "dec_token_embed", "normal"))
    assert "modality_embed[depth]: not a modality here" in report.dropped


def test_a_checkpoint_is_read_by_name_and_shape(tmp_path):
    source = build(replace(SOURCE, context_bias=True), 0)
    run = open_store(str(tmp_path / "run"), create=True)
    CheckpointManager(run.child("checkpoints")).save(4, {"model": get_model_state_dict(source)}, {}, {})
    target = build(TARGET, 1)
    report = load_initial_weights(target, run.uri)  # a run's output without a model: its newest checkpoint
    assert report.kind == "checkpoint" and report.source.endswith("checkpoints/step-00000004")
    assert torch.equal(target.encoder[0].attn.qkv.weight, source.encoder[0].attn.qkv.weight)
    assert torch.equal(target.modality_embed.weight, source.modality_embed.weight)  # four modalities each
    assert torch.equal(target.dec_token_embed.weight, build(TARGET, 1).dec_token_embed.weight)
    assert "dec_token_embed.weight: shape [122, 32] in the source, [132, 32] here" in report.new
    assert "context_proj.bias: not in this model" in report.dropped
    assert report.imported_parameters + report.new_parameters == count_parameters(target)


def test_an_ml4m_source_is_converted_to_the_targets_modalities_and_its_dropped_keys_reported(tmp_path, monkeypatch):
    source, calls = build(SOURCE, 0), []

    def import_ml4m(uri, modalities=None):  # normal's decoder rows were not in the file: the source's own init
        calls.append((uri, tuple(modalities)))
        return source, types.SimpleNamespace(dropped=["decoder_embeddings.sam_instance: not a modality here"],
                                             dropped_domains=["tok_clip@224: no such modality"],
                                             missing=["dec_token_embed[normal]", "decoder.0.norm1.weight"],
                                             dropped_parameters=77)

    monkeypatch.setattr("fourm_kfp.model.ml4m.import_ml4m", import_ml4m)
    folder = tmp_path / "fm"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"domains_in": ["rgb@224", "caption"]}))
    target = build(TARGET, 1)
    report = load_initial_weights(target, str(folder))
    assert calls == [(str(folder), TARGET.names)] and report.kind == "ml-4m"
    assert torch.equal(rows(target, "enc_token_embed", "normal"), rows(source, "enc_token_embed", "normal"))
    assert report.dropped[-2:] == ["tok_clip@224: no such modality",
                                   "decoder_embeddings.sam_instance: not a modality here"]
    assert report.dropped_parameters >= 77  # the import's dropped scalars are counted with the mapping's own
    assert {"dec_token_embed[normal]: not in the source", "decoder.0.norm1.weight: not in the source"} <= set(
        report.new)
    assert torch.equal(rows(target, "dec_token_embed", "normal"), rows(build(TARGET, 1), "dec_token_embed", "normal"))
    file = str(tmp_path / "fm.safetensors")  # a bare weights file is ml-4m's too, whether or not it exists yet
    assert load_initial_weights(build(TARGET, 1), file).kind == "ml-4m" and calls[-1][0] == file


def test_an_exported_ml4m_folder_initialises_the_shared_modalities(tmp_path):
    rgb = ModalitySpec("rgb", "image", 16384, grid=(14, 14), pixel_input=True, patch_size=16,
                       pixel_normalisation="imagenet")
    caption = ModalitySpec("caption", "sequence", 30000, max_length=16)
    source = build(FourMArgs((rgb, ModalitySpec("depth", "image", 8192, grid=(14, 14)), caption), dim=32, heads=4,
                             tie_embeddings=False, context_bias=True), 0)
    export_ml4m(source, tmp_path / "fm")
    target = build(FourMArgs((caption, rgb, ModalitySpec("semseg", "image", 4096, grid=(14, 14))), dim=32, heads=4), 1)
    report = load_initial_weights(target, str(tmp_path / "fm"))
    assert torch.equal(rows(target, "dec_token_embed", "caption"), rows(source, "dec_token_embed", "caption"))
    assert torch.equal(target.patch_embed.weight, source.patch_embed.weight)
    assert torch.equal(target.decoder[1].mlp.gate_up.weight, source.decoder[1].mlp.gate_up.weight)
    assert {"dec_token_embed[semseg]: not in the source", "enc_token_embed[semseg]: not in the source"} <= set(
        report.new)
    assert "head[caption]: this model's head is its dec_token_embed (tie_embeddings)" in report.dropped
    assert any(entry.startswith("decoder_embeddings.tok_depth@224.token_emb.weight") for entry in report.dropped)
    # every dropped scalar of the file is counted: depth's whole domain and the untied caption and rgb heads
    with safe_open(str(tmp_path / "fm" / "model.safetensors"), framework="pt") as f:
        sizes = {k: f.get_slice(k).get_shape() for k in f.keys()}
    dropped_keys = {entry.split(": ")[0] for entry in report.dropped} & set(sizes)
    assert any(k.startswith("decoder_embeddings.tok_depth@224.") for k in dropped_keys)
    from_file = sum(math.prod(sizes[k]) for k in dropped_keys)
    assert from_file >= 2 * 8192 * 32 and report.dropped_parameters >= from_file


def test_a_source_of_no_known_kind_or_an_unreadable_one_is_a_config_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "other"}))
    with pytest.raises(ConfigError, match=re.escape(f"train.init_from: {tmp_path} is neither a pretrain output")):
        load_initial_weights(build(TARGET, 1), str(tmp_path))
    with pytest.raises(ConfigError, match=re.escape(f"train.init_from: {tmp_path}/missing.safetensors")):
        load_initial_weights(build(TARGET, 1), f"{tmp_path}/missing.safetensors")


def test_the_pretrain_report_has_a_section_on_the_initialisation():
    init = map_weights(build(SOURCE, 0), build(TARGET, 1), InitReport("s3://bucket/pretrain/abc", "pretrain output"))
    report = {"first_val_step": 0, "last_val_step": 2, "steps": 2, "tokens": 10, "parameters": 5,
              "skipped_steps": 0, "modalities": {}}
    assert "Initialised from" not in report_markdown(report)
    text = report_markdown(report, init)
    assert (f"`s3://bucket/pretrain/abc` (pretrain output): {init.imported_parameters:,} parameters imported, "
            f"{init.new_parameters:,} freshly initialised, {init.dropped_parameters:,} of the source dropped") in text
    assert f"- imported ({len(init.imported)}): `enc_token_embed[normal]`; `dec_token_embed[rgb]`;" in text
    assert f"and {len(init.imported) - 5} more" in text
    assert "- dropped (3): `enc_token_embed[depth]: not a modality here`;" in text


def test_the_pretrain_stage_starts_from_another_runs_model_and_reports_it(tmp_path):
    store = open_store(str(tmp_path), create=True)
    inputs = smoke_upstream(store)
    spec, sets = get_stage("pretrain"), ["train.steps=2", "train.val_every=2"]
    first = run_stage(spec, load_config("smoke", overrides=sets), store, input_uris=inputs)
    second = run_stage(spec, load_config("smoke", overrides=[*sets, f"train.init_from={first.output_uri}"]), store,
                       input_uris=inputs)
    out = open_store(second.output_uri)
    init = json.loads(out.get_bytes("reports/init_report.json"))
    counts = json.loads(out.get_bytes(MANIFEST_NAME))["counts"]
    assert init["kind"] == "pretrain output" and init["dropped"] == [] and init["new_parameters"] < 1000
    assert counts["init_imported_parameters"] == init["imported_parameters"] > 0
    assert counts["init_imported_parameters"] + counts["init_new_parameters"] == counts["parameters"]
    assert second.metrics["init_new_parameters"] == init["new_parameters"]
    assert "## Initialised from" in out.get_text("reports/pretrain_report.md")
    # the same tokenizers as the source was trained with: every table's rows imported and meaningful
    tables = init["token_tables"]
    assert set(tables) == set(json.loads(open_store(first.output_uri).get_bytes("model/model.json"))["modalities"])
    assert all(t["imported"] and t["meaningful"] is True and "reason" not in t for t in tables.values()), tables
    assert tables["rgb"]["tokenizer"].startswith("fourm-kfp:") and tables["caption"]["tokenizer"].startswith(
        "fourm-kfp:")
    # the second run's first validation sees the first run's last weights
    before = json.loads(open_store(first.output_uri).get_bytes("reports/pretrain_report.json"))["modalities"]
    after = json.loads(out.get_bytes("reports/pretrain_report.json"))["modalities"]
    assert after and set(after) == set(before)
    for name, m in after.items():
        assert m["val_loss_start"] == before[name]["val_loss_end"], name
