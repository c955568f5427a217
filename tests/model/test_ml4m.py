"""The ml-4m converter (``fourm_kfp.model.ml4m``): round trips, the key and shape layout ml-4m's ``FM`` has (a list
generated once from ml-4m: ``ml4m_tiny_keys.json`` names its command and commit), what import refuses and drops,
ml-4m's own ``FM`` at 4M-21's and 4M-7's shapes against the numbers ml-4m's code computed on a ``UnifiedMasking``
batch (``ml4m_reference/``, made by ``bench/ml4m_fm_reference.py``), and, when an ml-4m checkout is given
(``FOURM_REFERENCE``), both directions against ml-4m's own ``FM``."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from fourm_kfp.batch import ModalitySpec
from fourm_kfp.model.fourm import FourM, FourMArgs
from fourm_kfp.model.ml4m import Ml4mError, export_ml4m, import_ml4m, ml4m_unexpressible

KEYS = json.loads((Path(__file__).parent / "ml4m_tiny_keys.json").read_text())
BENCH = Path(__file__).resolve().parents[2] / "bench"
GRID = (14, 14)


def specs(normalisation: str = "imagenet") -> tuple[ModalitySpec, ...]:
    """The modalities of the committed key list (ml-4m's vocabularies and grids)."""
    return (ModalitySpec("rgb", "image", 16384, grid=GRID, pixel_input=True, patch_size=16,
                         pixel_normalisation=normalisation),
            ModalitySpec("depth", "image", 8192, grid=GRID), ModalitySpec("semseg", "image", 4096, grid=GRID),
            ModalitySpec("det", "sequence", 30000, max_length=256),
            ModalitySpec("caption", "sequence", 30000, max_length=256))


def random_model(layers=(2, 2), **switches) -> FourM:
    """Every parameter random (the pixel placeholder row stays zero, as in every model we build)."""
    args = FourMArgs(specs(), *layers, dim=32, heads=2, **{"tie_embeddings": False, "context_bias": True,
                                                           "pixel_modality_embed": True, **switches})
    model = FourM(args)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.05 + (1.0 if "norm" in name else 0.0))
        model.enc_token_embed.weight[0].zero_()
    return model.eval()


def batch(model: FourM):
    """A small masked batch over the model's modalities (our masking, pixels included)."""
    import numpy as np

    from fourm_kfp.masking.dirichlet_masking import MixtureComponent
    from fourm_kfp.masking.multimodal_masking import MaskingArgs, collate, mask_sample

    model_specs = model.args.modalities
    ones = tuple(1.0 for _ in model_specs)
    masking = MaskingArgs(model_specs, 32, 32, (MixtureComponent(1.0, ones, ones),), tuple(range(4, 104)))
    rng = np.random.default_rng(0)
    samples = []
    for _ in range(3):
        tokens = {s.name: rng.integers(0, s.vocab_size, s.grid) if s.kind == "image"
                  else rng.integers(104, s.vocab_size, 12).tolist() for s in model_specs}
        samples.append(mask_sample(rng, masking, tokens, rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)))
    return collate(samples, masking)


def logits(model: FourM, b) -> torch.Tensor:
    with torch.no_grad():
        return model.decode(model.encode(b), b)


def test_export_then_import_gives_the_same_state_and_logits(tmp_path):
    model = random_model()
    export_ml4m(model, tmp_path)
    back, report = import_ml4m(tmp_path)
    assert back.args == model.args
    mine, theirs = model.state_dict(), back.state_dict()
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    b = batch(model)
    assert torch.equal(logits(model, b), logits(back, b))
    assert report.dropped == [] and report.missing == [] and report.dropped_domains == []


def test_a_model_with_our_defaults_comes_back_computing_the_same(tmp_path):
    """Tied heads, no context bias, one rgb embedding: ml-4m's layout holds them (untied, a zero bias, equal
    embeddings), so the imported model has the switches on and computes the same logits."""
    model = random_model(layers=(1, 1), tie_embeddings=True, context_bias=False, pixel_modality_embed=False)
    export_ml4m(model, tmp_path)
    back, _ = import_ml4m(tmp_path)
    assert back.args.context_bias and not back.args.tie_embeddings and not back.args.pixel_modality_embed
    b = batch(model)
    assert torch.equal(logits(model, b), logits(back, b))


def _saved_keys(state_keys: dict[str, list[int]]) -> dict[str, list[int]]:
    """What ml-4m's ``save_pretrained`` (safetensors' ``save_model``) writes of ``FM(config).state_dict()``: a
    domain both read and written shares one ``mod_emb`` parameter, which is saved once, under the name that sorts
    first: the decoder's."""
    shared = {k.replace("decoder_embeddings.", "encoder_embeddings.", 1) for k in state_keys
              if k.startswith("decoder_embeddings.") and k.endswith(".mod_emb")}
    return {k: v for k, v in state_keys.items() if k not in shared}


def test_safetensors_saves_a_shared_parameter_once_under_the_name_that_sorts_first(tmp_path):
    from safetensors.torch import save_model

    class Embeddings(torch.nn.Module):
        def __init__(self):
            super().__init__()
            shared = torch.nn.Parameter(torch.ones(1, 1, 4))
            self.encoder_embeddings = torch.nn.ModuleDict({"caption": torch.nn.Module()})
            self.decoder_embeddings = torch.nn.ModuleDict({"caption": torch.nn.Module()})
            self.encoder_embeddings["caption"].mod_emb = shared
            self.decoder_embeddings["caption"].mod_emb = shared

    save_model(Embeddings(), str(tmp_path / "m.safetensors"))
    with safe_open(str(tmp_path / "m.safetensors"), framework="pt") as f:
        assert list(f.keys()) == ["decoder_embeddings.caption.mod_emb"]


def test_export_has_ml4m_keys_and_shapes_and_config(tmp_path):
    """Against the list generated from ml-4m's ``FM(config).state_dict()`` for this config, less the shared
    embeddings' second names, as ml-4m's ``save_pretrained`` writes it (``FM.from_pretrained(strict=True)`` expects
    exactly that)."""
    config = export_ml4m(random_model(), tmp_path)
    assert config == KEYS["config"]
    assert json.loads((tmp_path / "config.json").read_text()) == KEYS["config"]
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
        metadata = f.metadata()
    assert shapes == _saved_keys(KEYS["keys"])
    assert {k: json.loads(v) for k, v in metadata.items()} == KEYS["config"]


@pytest.mark.parametrize("switches", [{}, {"tie_embeddings": True, "context_bias": False,
                                          "pixel_modality_embed": False}])
def test_the_key_map_places_each_row_of_ours_once_and_writes_what_ml4m_saves(switches):
    """The one table both directions read (``key_map``): every row of every tensor of ours is one ml-4m tensor's,
    none twice (two would leave import's result to their order; tied heads are written as both of ml-4m's, and read
    back untied), and the names export writes are those ml-4m's ``save_pretrained`` writes for this config."""
    from fourm_kfp.model.ml4m.key_map import Fixed, key_map

    model = random_model(**switches)
    mapping = key_map(model)
    pairs = [e for e in mapping.entries if not isinstance(e, Fixed)]
    placed = {name: torch.zeros(value.shape[0] if value.dim() else 1, dtype=torch.int64)
              for name, value in model.state_dict().items()}
    for pair in pairs:
        placed[pair.ours][pair.rows or slice(None)] += 1
    placed["enc_token_embed.weight"][model.enc_token_offset[model.pixel_index]] += 1  # the pixel placeholder row
    twice = {"dec_token_embed.weight"} if model.args.tie_embeddings else set()  # tied: to_logits is token_emb too
    assert {name: rows.unique().tolist() for name, rows in placed.items()} == {
        name: [2 if name in twice else 1] for name in placed}
    written = [name for pair in pairs for name in pair.names[:pair.written]]
    written += [fixed.name for fixed in mapping.entries if isinstance(fixed, Fixed)]
    assert len(written) == len(set(written)) and set(written) == set(_saved_keys(KEYS["keys"]))


def test_a_file_with_one_alias_of_a_shared_embedding_still_imports(tmp_path):
    """ml-4m's ``save_pretrained`` keeps one name of a shared tensor: either one is enough."""
    model = random_model(layers=(1, 1))
    export_ml4m(model, tmp_path)
    path = tmp_path / "model.safetensors"
    with safe_open(str(path), framework="pt") as f:
        tensors, metadata = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    assert "encoder_embeddings.tok_depth@224.mod_emb" not in tensors  # written once, as ml-4m writes it
    tensors["encoder_embeddings.caption.mod_emb"] = tensors.pop("decoder_embeddings.caption.mod_emb")  # the other
    save_file(tensors, str(path), metadata=metadata)
    back, report = import_ml4m(tmp_path)
    assert torch.equal(back.modality_embed.weight, model.modality_embed.weight)
    assert report.missing == []


def test_a_single_safetensors_file_carries_its_config(tmp_path):
    model = random_model(layers=(1, 1))
    export_ml4m(model, tmp_path / "folder")
    back, _ = import_ml4m(str(tmp_path / "folder" / "model.safetensors"))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), back.state_dict().values()))


def _rewrite(folder: Path, config_change=None, tensor_change=None) -> None:
    config = json.loads((folder / "config.json").read_text())
    if config_change:
        config.update(config_change)
        (folder / "config.json").write_text(json.dumps(config))
    if tensor_change:
        path = folder / "model.safetensors"
        with safe_open(str(path), framework="pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        tensor_change(tensors)
        save_file(tensors, str(path))


@pytest.mark.parametrize("change, named", [({"gated_mlp": False}, "gated_mlp"), ({"qkv_bias": True}, "qkv_bias"),
                                           ({"act_layer": "GELU"}, "act_layer"), ({"qk_norm": True}, "qk_norm"),
                                           ({"num_register_tokens": 4}, "num_register_tokens")])
def test_import_refuses_what_is_not_a_swiglu_nobias_trunk(tmp_path, change, named):
    export_ml4m(random_model(layers=(1, 1)), tmp_path)
    _rewrite(tmp_path, config_change=change)
    with pytest.raises(Ml4mError, match=named):
        import_ml4m(tmp_path)


def test_import_names_a_tensor_whose_shape_disagrees_and_a_norm_with_a_bias(tmp_path):
    export_ml4m(random_model(layers=(1, 1)), tmp_path)
    _rewrite(tmp_path, tensor_change=lambda t: t.update({"encoder.0.attn.qkv.weight": torch.zeros(96, 16)}))
    with pytest.raises(Ml4mError, match=r"encoder\.0\.attn\.qkv\.weight has shape \[96, 16\]"):
        import_ml4m(tmp_path)
    export_ml4m(random_model(layers=(1, 1)), tmp_path)
    _rewrite(tmp_path, tensor_change=lambda t: t.update({"encoder.0.norm1.bias": torch.ones(32)}))
    with pytest.raises(Ml4mError, match=r"encoder\.0\.norm1\.bias is not zero"):
        import_ml4m(tmp_path)


def test_domains_we_lack_are_dropped_by_name_and_a_subset_can_be_asked_for(tmp_path):
    export_ml4m(random_model(layers=(1, 1)), tmp_path)

    def add_imagebind(tensors):
        tensors["encoder_embeddings.tok_imagebind@224.token_emb.weight"] = torch.zeros(64, 32)
        tensors["encoder_embeddings.tok_imagebind@224.mod_emb"] = torch.zeros(1, 1, 32)

    _rewrite(tmp_path, tensor_change=add_imagebind)
    config = json.loads((tmp_path / "config.json").read_text())
    _rewrite(tmp_path, config_change={"domains_in": config["domains_in"] + ["tok_imagebind@224"]})
    model, report = import_ml4m(tmp_path, modalities=["rgb", "caption"], rgb_input="tokens")
    rgb = model.args.modalities[model.args.names.index("rgb")]
    assert set(model.args.names) == {"rgb", "caption"} and not rgb.pixel_input
    assert "tok_imagebind@224: no such modality in fourm-kfp" in report.dropped_domains
    assert any(d.startswith("rgb@224") for d in report.dropped_domains)
    assert any(d.startswith("encoder_embeddings.tok_imagebind@224.token_emb.weight") for d in report.dropped)
    assert any(d.startswith("decoder_embeddings.tok_depth@224") for d in report.dropped)
    assert "enc_token_embed[rgb]" in report.missing  # the source had rgb only as pixels


def test_export_refuses_what_ml4m_cannot_express_with_every_reason():
    small = FourMArgs((ModalitySpec("rgb", "image", 512, grid=(4, 4), pixel_input=True, patch_size=16),
                       ModalitySpec("caption", "sequence", 30000, max_length=300),
                       ModalitySpec("canny_edge", "image", 8192, grid=GRID)), 1, 1, 32, 2)
    reasons = ml4m_unexpressible(small)
    assert any("vocabulary 512" in r for r in reasons)
    assert any("token grid (4, 4)" in r for r in reasons)
    assert any("300 text positions" in r for r in reasons)
    assert any("normalised 'symmetric'" in r for r in reasons)
    assert not any("canny_edge" in r for r in reasons)
    with pytest.raises(Ml4mError, match="cannot be written in ml-4m's format"):
        export_ml4m(FourM(small), "/nonexistent/never-written")


def test_a_modality_without_an_ml4m_domain_is_refused_on_export_by_name_and_left_out_on_import(tmp_path,
                                                                                                 monkeypatch):
    """A SigLIP-like feature map whose record has no ml-4m domain (``ml4m=None``): export names it, says why and what
    to do, and writes nothing (the pretrain stage records the reason instead of a folder); import, asked for it beside
    modalities ml-4m has, leaves it out, and asked for it alone says that it has no domain."""
    from fourm_kfp.data.modalities import MODALITIES, feature_map

    monkeypatch.setitem(MODALITIES, "siglip", feature_map("siglip"))
    siglip = ModalitySpec("siglip", "image", 8192, grid=GRID)
    args = FourMArgs((ModalitySpec("rgb", "image", 16384, grid=GRID), siglip), 1, 1, 32, 2, tie_embeddings=False,
                     context_bias=True)
    [reason] = ml4m_unexpressible(args)
    assert reason.startswith("modality 'siglip' has no ml-4m domain") and "record's ml4m is None" in reason
    assert "leave it out of data.modalities" in reason
    with pytest.raises(Ml4mError, match="'siglip' has no ml-4m domain"):
        export_ml4m(FourM(args), tmp_path / "refused")
    assert not (tmp_path / "refused" / "model.safetensors").exists()
    from fourm_kfp.stages.pretrain import _export_ml4m
    from fourm_kfp.storage import open_store

    model = FourM(args)
    assert _export_ml4m(model.state_dict(), args, open_store(str(tmp_path / "out"), create=True), {}) == [reason]
    export_ml4m(random_model(layers=(1, 1)), tmp_path / "ml4m")
    back, report = import_ml4m(tmp_path / "ml4m", modalities=["rgb", "depth", "siglip"])
    assert back.args.names == ("rgb", "depth") and report.missing == []
    with pytest.raises(Ml4mError, match=r"among \['siglip'\] \(siglip: no ml-4m domain\)"):
        import_ml4m(tmp_path / "ml4m", modalities=["siglip"])


def test_feature_maps_are_exchanged_as_ml4m_s_clip_and_dinov2_tokens_at_their_own_grids(tmp_path):
    """tok_clip@224 is 14 x 14 (16-px patches), tok_dinov2@224 16 x 16 (DINOv2's 14-px patches)."""
    features = (ModalitySpec("rgb", "image", 16384, grid=GRID), ModalitySpec("clip", "image", 8192, grid=(14, 14)),
                ModalitySpec("dinov2", "image", 8192, grid=(16, 16)))
    args = FourMArgs(features, 1, 1, 32, 2, tie_embeddings=False, context_bias=True)
    assert ml4m_unexpressible(args) == []
    wrong = FourMArgs(features[:2] + (ModalitySpec("dinov2", "image", 8192, grid=GRID),), 1, 1, 32, 2)
    assert any("'dinov2': token grid (14, 14), ml-4m's tok_dinov2@224 is (16, 16)" in r
               for r in ml4m_unexpressible(wrong))
    config = export_ml4m(FourM(args), tmp_path)
    assert config["domains_out"] == ["tok_rgb@224", "tok_clip@224", "tok_dinov2@224"]
    back, _ = import_ml4m(tmp_path)
    assert [(s.name, tuple(s.grid)) for s in back.args.modalities] == [("rgb", GRID), ("clip", (14, 14)),
                                                                         ("dinov2", (16, 16))]


def _reference():
    from_env = __import__("os").environ.get("FOURM_REFERENCE")
    if not from_env:
        pytest.skip("FOURM_REFERENCE (an apple/ml-4m checkout) is not set")
    for module in ("einops", "huggingface_hub"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"ml-4m's model code needs {module}")
    sys.path.insert(0, str(BENCH))
    import ml4m_compare

    return ml4m_compare


def test_both_directions_against_ml4m_fm():
    """Ours -> ``FM.from_pretrained`` and the safetensors-metadata route, and ``FM.save_pretrained`` -> ours, on
    batches with and without padding (bench/ml4m_compare.py)."""
    compare = _reference()
    result = compare.main(["--output", "/dev/null"])
    assert result["summary"]["ours_to_ml4m_within"], result["summary"]
    assert result["summary"]["ml4m_to_ours_within"], result["summary"]
    for variant in result["ours_to_ml4m"].values():
        for route in variant.values():
            assert route["padded"]["padding"] and not route["full"]["padding"]
            assert all(b["loss_max_abs_diff"] <= 1e-4 for b in route.values())
    # ml-4m's CLIP feature tokens come in as our clip modality, compared with the rest
    assert not any(d.startswith("tok_clip@224") for d in result["ml4m_to_ours"]["import"]["dropped_domains"])


def _committed_model(uri: str, model: FourM) -> None:
    """``model`` as a committed pretrain output at ``uri``."""
    from fourm_kfp.contract.manifest import commit_manifest
    from fourm_kfp.model.saved_model import export_model
    from fourm_kfp.storage import open_store

    store = open_store(uri, create=True)
    export_model(model.state_dict(), model.args, store, tokenizers_uri=uri + "-tok", pretokenized_uri=uri + "-pre",
                 text_special_ids={}, step=7)
    commit_manifest(store, {"stage": "pretrain"})


def test_cli_export_writes_a_folder_import_reads_back(any_store_uri, capsys):
    """``fourm-kfp export --format ml4m MODEL_DIR OUT``, on local disk and on the S3 server."""
    from fourm_kfp.cli import main

    model = random_model(layers=(1, 1))
    _committed_model(any_store_uri + "/pretrain/abc", model)
    out = any_store_uri + "/ml4m-out"
    assert main(["export", "--format", "ml4m", any_store_uri + "/pretrain/abc", out]) == 0
    assert "FM.from_pretrained" in capsys.readouterr().out
    back, report = import_ml4m(out)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), back.state_dict().values()))
    assert report.missing == []


def test_cli_export_of_a_model_ml4m_cannot_hold_names_the_reasons(tmp_path, capsys):
    from fourm_kfp.cli import main

    model = FourM(FourMArgs((ModalitySpec("depth", "image", 64, grid=(4, 4)),), 1, 1, 32, 2))
    _committed_model(str(tmp_path / "pretrain"), model)
    assert main(["export", "--format", "ml4m", str(tmp_path / "pretrain"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "vocabulary 64" in err and "token grid (4, 4)" in err
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_the_pretrain_stage_writes_ml4m_beside_the_weights_and_records_it(tmp_path):
    """``ml4m/`` goes through the stage's recording store, so the manifest lists its files; a model ml-4m cannot
    hold gets the reasons instead."""
    from fourm_kfp.contract.manifest import RecordingStore
    from fourm_kfp.stages.pretrain import _export_ml4m
    from fourm_kfp.storage import open_store

    model = random_model(layers=(1, 1))
    output = RecordingStore(open_store(str(tmp_path / "out"), create=True))
    assert _export_ml4m(model.state_dict(), model.args, output, {"step": 3}) == "ml4m/"
    assert set(output.records) == {"ml4m/config.json", "ml4m/model.safetensors", "ml4m/fourm-kfp.json"}
    back, _ = import_ml4m(str(tmp_path / "out" / "ml4m"))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), back.state_dict().values()))
    small = FourM(FourMArgs((ModalitySpec("depth", "image", 64, grid=(4, 4)),), 1, 1, 32, 2))
    reasons = _export_ml4m(small.state_dict(), small.args, output, {})
    assert any("vocabulary 64" in r for r in reasons) and len(output.records) == 3


REFERENCE_FM = Path(__file__).parent / "ml4m_reference"
#: ml-4m's domain of each modality of ours (written out here, not read from the product: a modality mapped to the wrong
#: domain would give its tokens another domain's weights, and the converter would follow the product's mistake)
ML4M_DOMAIN = {"rgb": "tok_rgb@224", "depth": "tok_depth@224", "normal": "tok_normal@224", "semseg": "tok_semseg@224",
               "edge": "tok_sam_edge@224", "canny_edge": "tok_canny_edge@224", "clip": "tok_clip@224",
               "dinov2": "tok_dinov2@224", "caption": "caption", "det": "det", "metadata": "metadata",
               "color_palette": "color_palette"}
#: every modality of ours ml-4m's 4M-21 and 4M-7 have (4M-21 has them all)
REFERENCE_SHAPES = {"4m21": sorted(ML4M_DOMAIN), "4m7": ["caption", "clip", "depth", "det", "normal", "rgb", "semseg"]}


def _ml4m_reference(shape: str, tmp_path: Path):
    """The committed reference ``fm_<shape>`` (``bench/ml4m_fm_reference.py``): ml-4m's folder as its
    ``save_pretrained`` wrote it (checked against the manifest's digest), its ``UnifiedMasking`` batch (the image
    ImageNet-normalised, as the generator gave it to ml-4m) and the manifest and outputs of ml-4m's code."""
    import hashlib
    import lzma

    import numpy as np
    from safetensors.torch import load, load_file

    from fourm_kfp.batch import normalised_pixels

    source = REFERENCE_FM / f"fm_{shape}"
    manifest = json.loads((source / "manifest.json").read_text())
    folder = tmp_path / f"fm_{shape}"
    folder.mkdir()
    weights = lzma.decompress((source / "model.safetensors.xz").read_bytes())
    assert hashlib.sha256(weights).hexdigest() == manifest["model_safetensors_sha256"]
    (folder / "model.safetensors").write_bytes(weights)
    (folder / "config.json").write_bytes((source / "config.json").read_bytes())
    mod_dict: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in load(lzma.decompress((source / "batch.safetensors.xz").read_bytes())).items():
        domain, name = key.rsplit(".", 1)
        if name == "pixels":
            name, value = "tensor", torch.from_numpy(np.ascontiguousarray(normalised_pixels(value.numpy(), "imagenet")))
        mod_dict.setdefault(domain, {})[name] = value.double() if value.is_floating_point() else value
    return folder, manifest, mod_dict, load_file(str(source / "outputs.safetensors"))


def _ours_against_ml4m(model: FourM, mod_dict, outputs, manifest) -> dict[str, float]:
    """Per modality, the largest difference between our model's numbers on ml-4m's batch (converted by
    ``bench/ml4m_reference.py``'s ``ours_from_ml4m``) and ml-4m's: each target's first logits, log-sum-exp and
    target logit, and the modality's loss. Fails when the target tokens differ."""
    sys.path.insert(0, str(BENCH))
    from ml4m_reference import ours_from_ml4m

    specs = model.args.modalities
    domains = {s.name: ("rgb@224" if s.pixel_input else ML4M_DOMAIN[s.name], ML4M_DOMAIN[s.name]) for s in specs}
    batch, index = ours_from_ml4m(mod_dict, specs, domains)
    with torch.no_grad():
        hidden = model.decode(model.encode(batch), batch)
        losses = model(batch).modality_losses
        return _worst_by_modality(model, batch, index, hidden, losses, domains, outputs, manifest)


def _worst_by_modality(model, batch, index, hidden, losses, domains, outputs, manifest) -> dict[str, float]:
    specs = model.args.modalities
    worst = {}
    for m, spec in enumerate(specs):
        domain = domains[spec.name][1]
        slots = torch.nonzero(batch.dec_valid & (batch.dec_modality == m)).tolist()
        ours = {(b, int(index[b, j])): model.logits(hidden[b, j], m) for b, j in slots}
        keys = [tuple(k) for k in outputs[f"{domain}.keys"].tolist()]
        assert sorted(ours) == sorted(keys), f"{spec.name}: not ml-4m's target tokens"
        logits = torch.stack([ours[k] for k in keys])
        first = outputs[f"{domain}.first_logits"]
        targets = outputs[f"{domain}.targets"]
        worst[spec.name] = max(float((logits[:, :first.shape[1]] - first).abs().max()),
                               float((torch.logsumexp(logits, -1) - outputs[f"{domain}.logsumexp"]).abs().max()),
                               float((logits.gather(1, targets[:, None])[:, 0] - outputs[f"{domain}.target_logit"])
                                     .abs().max()),
                               abs(float(losses[spec.name]) - manifest["losses"][domain]))
    return worst


@pytest.mark.parametrize("shape", list(REFERENCE_SHAPES))
def test_ml4m_s_own_fm_at_4m21_and_4m7_shapes_imports_computing_ml4m_s_logits(tmp_path, shape):
    """Without a checkout: ml-4m's own FM at 4M-21's (4M-7's) domains, saved by its ``save_pretrained``, and what its
    code computed on a batch from its ``UnifiedMasking`` (tests/model/ml4m_reference/fm_<shape>, made by
    ``bench/ml4m_fm_reference.py``). Our import has every modality of ours the shape has and matches ml-4m's logits
    and losses on each within 1e-5 (both in float64). The check has teeth: a modality given another's embedding,
    and SwiGLU's gate and up halves swapped in one block (alike in our export and import: no round trip sees it),
    each lose ml-4m's numbers."""
    folder, manifest, mod_dict, outputs = _ml4m_reference(shape, tmp_path)
    assert manifest["reference_commit"] == "cda590f" and "bench/ml4m_fm_reference.py" in manifest["command"]
    model, report = import_ml4m(folder)
    assert sorted(model.args.names) == REFERENCE_SHAPES[shape]
    assert report.missing == [] and report.dropped_domains == []
    # rgb is read from rgb@224's pixels: tok_rgb@224's encoder embedding is all that is left out
    assert report.dropped and all(d.startswith("encoder_embeddings.tok_rgb@224.") for d in report.dropped)
    model = model.double()
    worst = _ours_against_ml4m(model, mod_dict, outputs, manifest)
    assert set(worst) == set(REFERENCE_SHAPES[shape])
    assert max(worst.values()) <= 1e-5, worst
    with torch.no_grad():
        rows = model.modality_embed.weight
        clip, other = model.args.names.index("clip"), model.args.names.index("det")
        rows[[clip, other]] = rows[[other, clip]]
    assert _ours_against_ml4m(model, mod_dict, outputs, manifest)["clip"] > 1e-2
    with torch.no_grad():
        rows[[clip, other]] = rows[[other, clip]]
        gate, up = model.encoder[0].mlp.gate_up.weight.chunk(2, dim=0)
        model.encoder[0].mlp.gate_up.weight.copy_(torch.cat([up, gate]))
    assert min(_ours_against_ml4m(model, mod_dict, outputs, manifest).values()) > 1e-2
