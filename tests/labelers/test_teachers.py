"""The transformers teachers (fourm_kfp.labelers.teachers) on tiny random-weight networks built offline from configs:
each one's predictions equal transformers' own pipeline or post-processing for the same network and photos, its
labels are valid values of its modality, a batch gives what its photos give one by one, and the labels move when the
photo or the weights move."""

from __future__ import annotations

import shutil
import socket

import numpy as np
import pytest
from PIL import Image

from fourm_kfp.data.label_checks import CheckSettings, check_value
from fourm_kfp.data.modalities import parse_det
from fourm_kfp.labelers.base import LabelBatch, LabelerError, label_one_by_one
from fourm_kfp.labelers.registry import build_labeler
from fourm_kfp.labelers.teachers.boxes import det_name
from fourm_kfp.labelers.teachers.depth import RELATIVE_DEPTH_TOP, depth_from_prediction
from fourm_kfp.labelers.teachers.normals import normals_from_depth
from tests.teacher_models import COCO_LIKE, SEG_CLASSES, save_detr, save_segformer, save_teacher, teacher_photos

SIDE = 64
PARAMS = {"hf_depth": {"depth": "relative", "inverse": True}, "hf_det": {"threshold": 0.3, "max_boxes": 4}}


@pytest.fixture(scope="module")
def photos() -> LabelBatch:
    return teacher_photos(SIDE)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("teachers")
    made = {name: str(save_teacher(name, root / name, SIDE)) for name in
            ("hf_depth", "hf_semseg", "hf_det", "hf_caption", "hf_normal", "hf_clip", "hf_dinov2")}
    made["segformer"] = str(save_segformer(root / "segformer", SIDE))
    made["detr"] = str(save_detr(root / "detr", SIDE))
    return made


def _teacher(folders, name: str, folder: str | None = None, **params):
    return build_labeler(name, {**PARAMS.get(name, {}), **params}, folders[folder or name])


def _pil(batch: LabelBatch) -> list[Image.Image]:
    return [Image.fromarray(image) for image in batch.images]


def test_depth_equals_the_transformers_depth_pipeline(folders, photos):
    from transformers import pipeline

    teacher = _teacher(folders, "hf_depth")
    pipe = pipeline("depth-estimation", model=folders["hf_depth"], device="cpu")
    ours = teacher.predict(photos)
    for mine, image in zip(ours, _pil(photos)):
        theirs = pipe(image)["predicted_depth"].numpy()
        assert mine.shape == theirs.shape == (SIDE, SIDE)
        np.testing.assert_allclose(mine, theirs, rtol=0, atol=1e-4 * max(1.0, float(np.abs(theirs).max())))
    labels = teacher.label(photos)
    for prediction, depth in zip(ours, labels):
        np.testing.assert_array_equal(depth, depth_from_prediction(prediction, relative=True, inverse=True))
        assert check_value("depth", depth, CheckSettings(SIDE, relative_depth=True)) is None
    assert teacher.relative_depth and teacher.modality_settings == {"relative": True}


def test_relative_inverse_depth_becomes_depth_scaled_per_image():
    disparity = np.array([[4.0, 2.0], [1.0, 0.0]], np.float32)
    depth = depth_from_prediction(disparity, relative=True, inverse=True)
    # 1/4, 1/2, 1 scaled so the farthest is RELATIVE_DEPTH_TOP; no disparity: invalid.
    np.testing.assert_allclose(depth, [[RELATIVE_DEPTH_TOP / 4, RELATIVE_DEPTH_TOP / 2], [RELATIVE_DEPTH_TOP, 0]])
    tiny = depth_from_prediction(np.array([[1000.0, 1e-9]], np.float32), relative=False, inverse=True)
    np.testing.assert_allclose(tiny, [[1e-3, 1.0]], rtol=1e-6)  # the far end floored at 1000x the nearest
    metric = depth_from_prediction(np.array([[2.5, -1.0, np.nan]], np.float32), relative=False, inverse=False)
    assert metric[0, 0] == 2.5 and metric[0, 1] == 0 and np.isnan(metric[0, 2])  # NaN left for the gate


@pytest.mark.parametrize("folder", ["hf_semseg", "segformer"])
def test_semseg_equals_the_transformers_segmentation_pipeline(folders, photos, folder):
    from transformers import pipeline

    teacher = _teacher(folders, "hf_semseg", folder)
    assert teacher.classes == SEG_CLASSES
    pipe = pipeline("image-segmentation", model=folders[folder], device="cpu")
    labels = teacher.label(photos)
    seen = set()
    for ids, image in zip(labels, _pil(photos)):
        theirs = np.full((SIDE, SIDE), -1)
        for segment in pipe(image, subtask="semantic"):
            theirs[np.asarray(segment["mask"]) > 0] = SEG_CLASSES.index(segment["label"])
        assert ids.dtype == np.uint8 and ids.shape == (SIDE, SIDE)
        np.testing.assert_array_equal(ids, theirs)
        seen |= set(np.unique(ids).tolist())
        assert check_value("semseg", ids, CheckSettings(SIDE, classes=teacher.classes)) is None
    assert len(seen) > 1  # the networks tell classes apart, so an equal map is a real check


@pytest.mark.parametrize("folder", ["hf_det", "detr"])
def test_boxes_equal_transformers_post_processing_in_4ms_det_format(folders, photos, folder):
    import torch
    from transformers import AutoImageProcessor, AutoModelForObjectDetection, pipeline

    teacher = _teacher(folders, "hf_det", folder, threshold=0.0, max_boxes=100)
    assert teacher.classes == tuple(det_name(n) for n in COCO_LIKE) and "traffic_light" in teacher.classes
    processor = AutoImageProcessor.from_pretrained(folders[folder])
    model = AutoModelForObjectDetection.from_pretrained(folders[folder]).eval()
    with torch.no_grad():
        outputs = model(**processor(images=_pil(photos), return_tensors="pt"))
    found_all = teacher.predict(photos)
    every = processor.post_process_object_detection(outputs, threshold=0.0, target_sizes=[(SIDE, SIDE)] * 3)
    for found, theirs in zip(found_all, every):
        np.testing.assert_allclose(found["boxes"], theirs["boxes"].numpy(), atol=1e-4)
        np.testing.assert_array_equal(found["labels"], theirs["labels"].numpy())
        np.testing.assert_allclose(found["scores"], theirs["scores"].numpy(), atol=1e-4)
    pipe = pipeline("object-detection", model=folders[folder], device="cpu")
    for i, image in enumerate(_pil(photos)):  # the pipeline takes one photo and rounds boxes to whole pixels
        [found] = teacher.predict(photos.item(i))
        listed = pipe(image, threshold=0.0)
        assert sorted(d["label"] for d in listed) == sorted(COCO_LIKE[i] for i in found["labels"])
        np.testing.assert_allclose(sorted(d["score"] for d in listed), sorted(found["scores"]), atol=1e-4)
    for text, found in zip(teacher.label(photos), teacher.predict(photos)):
        boxes = parse_det(text)
        assert len(boxes) == len(found["scores"]) and text.split() and len(text.split()) == 5 * len(boxes)
        best = int(np.argmax(found["scores"]))
        assert boxes[0][1] == teacher.classes[int(found["labels"][best])]  # highest score first
        assert check_value("det", text, CheckSettings(SIDE, classes=teacher.classes)) is None


def test_boxes_below_the_threshold_leave_a_photo_without_a_det_label(folders, photos):
    strict = _teacher(folders, "hf_det", threshold=1.0)
    assert strict.label(photos) == [None] * len(photos)
    top = _teacher(folders, "hf_det", threshold=0.0, max_boxes=1).label(photos)
    assert all(len(parse_det(t)) == 1 for t in top)


def test_captions_are_generated_only_for_photos_without_text(folders, photos):
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    teacher = _teacher(folders, "hf_caption", max_new_tokens=6)
    assert teacher.fills_gaps
    batch = LabelBatch(photos.keys, photos.images, ("a caption of its own", None, None))
    labels = teacher.label(batch)
    assert labels[0] == "a caption of its own"  # its own text stands
    processor = AutoProcessor.from_pretrained(folders["hf_caption"])
    model = AutoModelForImageTextToText.from_pretrained(folders["hf_caption"]).eval()
    for text, image in zip(labels[1:], _pil(photos)[1:]):
        with torch.no_grad():
            ids = model.generate(**processor(images=image, return_tensors="pt"), max_new_tokens=6, do_sample=False)
        assert text == processor.batch_decode(ids, skip_special_tokens=True)[0].strip() != ""
        assert check_value("caption", text, CheckSettings(SIDE)) is None


def test_clip_map_is_the_projected_normed_patch_tokens_as_clip_pools_its_class_token(folders, photos):
    import torch
    from transformers import CLIPImageProcessor, CLIPVisionModelWithProjection

    teacher = _teacher(folders, "hf_clip", preprocess="processor")  # ml-4m's input: test_feature_teachers.py
    maps = teacher.label(photos)
    assert teacher.modality_settings == {"channels": 24, "grid": SIDE // 16}
    model = CLIPVisionModelWithProjection.from_pretrained(folders["hf_clip"]).eval()
    inputs = CLIPImageProcessor.from_pretrained(folders["hf_clip"])(images=_pil(photos), return_tensors="pt")
    with torch.no_grad():
        out = model(**inputs)
        # ml-4m's map, ln_post(x[:, 1:]) @ proj: the same two layers CLIP applies to the class token for its
        # image embedding, so applied to the class token they must give transformers' image_embeds.
        tower = model.vision_model
        cls = model.visual_projection(tower.post_layernorm(out.last_hidden_state[:, :1]))[:, 0]
        patches = model.visual_projection(tower.post_layernorm(out.last_hidden_state[:, 1:]))
    np.testing.assert_allclose(cls.numpy(), out.image_embeds.numpy(), atol=1e-5)
    for mine, theirs in zip(maps, patches.numpy()):
        assert mine.shape == (4, 4, 24) and mine.dtype == np.float32
        np.testing.assert_allclose(mine.reshape(16, 24), theirs, atol=1e-5)


def test_dinov2_map_is_the_normed_patch_tokens(folders, photos):
    import torch
    from transformers import AutoImageProcessor, Dinov2Model

    teacher = _teacher(folders, "hf_dinov2", preprocess="processor")  # ml-4m's input: test_feature_teachers.py
    maps = teacher.label(photos)
    assert teacher.modality_settings == {"channels": 32, "grid": 4}  # a 56 px centre crop of 14 px patches
    model = Dinov2Model.from_pretrained(folders["hf_dinov2"]).eval()
    inputs = AutoImageProcessor.from_pretrained(folders["hf_dinov2"])(images=_pil(photos), return_tensors="pt")
    with torch.no_grad():
        out = model(**inputs, output_hidden_states=True)
        normed = model.layernorm(out.hidden_states[-1])  # x_norm_patchtokens: the last block's tokens, normed
    for mine, theirs in zip(maps, normed[:, 1:].numpy()):
        np.testing.assert_allclose(mine.reshape(16, 32), theirs, atol=1e-5)


def test_dpt_normal_head_is_read_as_omnidata_encodes_normals(folders, photos, tmp_path):
    import torch

    from fourm_kfp.labelers.teachers.normals import DPTForNormalEstimation

    model = DPTForNormalEstimation.from_pretrained(folders["hf_normal"])
    assert model.head.head[-2].out_channels == 3
    with torch.no_grad():  # a constant output: Omnidata's (0.5, 0.25, 0.9) is x 0, y down 0.5, z 0.8 to the camera
        model.head.head[-2].weight.zero_()
        model.head.head[-2].bias.copy_(torch.tensor([0.5, 0.25, 0.9]))
    model.save_pretrained(tmp_path / "constant")
    shutil.copy(f"{folders['hf_normal']}/preprocessor_config.json", tmp_path / "constant")
    normals = build_labeler("hf_normal", {}, str(tmp_path / "constant")).label(photos)
    expected = np.array([0.0, 0.5, 0.8]) / np.linalg.norm([0.0, 0.5, 0.8])  # y up in our frame
    for normal in normals:
        np.testing.assert_allclose(normal, np.broadcast_to(expected, normal.shape), atol=1e-5)
    random = build_labeler("hf_normal", {}, folders["hf_normal"]).label(photos)
    assert all(check_value("normal", n, CheckSettings(SIDE, max_invalid_fraction=1.0)) is None for n in random)


def _plane_depth(normal: np.ndarray, distance: float, side: int, fov_deg: float) -> np.ndarray:
    """Depth of the plane ``n . p = -distance`` (our frame: y up, z towards the camera) along each pixel's ray."""
    focal = (side / 2) / np.tan(np.radians(fov_deg) / 2)
    v, u = np.mgrid[0:side, 0:side].astype(np.float64)
    rays = np.stack([(u - (side - 1) / 2) / focal, -(v - (side - 1) / 2) / focal, -np.ones_like(u)], -1)
    return (-distance / (rays @ normal)).astype(np.float32)  # p = depth * ray, depth along the optical axis


def test_normals_from_depth_recover_a_tilted_plane_at_any_scale():
    normal = np.array([0.3, 0.5, 0.8])
    normal /= np.linalg.norm(normal)
    depth = _plane_depth(normal, 5.0, 48, 60.0)
    for scale in (1.0, 7.0, 1e-4):  # a relative depth's unknown scale changes nothing
        found = normals_from_depth(depth * scale, 60.0)
        np.testing.assert_allclose(found[2:-2, 2:-2], np.broadcast_to(normal, (44, 44, 3)), atol=1e-4)
    holed = depth.copy()
    holed[10, 10] = 0
    found = normals_from_depth(holed, 60.0)
    assert not found[9:12, 10].any() and not found[10, 9:12].any() and found[20, 20].any()


def test_normal_from_depth_reads_the_depth_labels_of_the_batch(folders, photos):
    labeler = build_labeler("normal_from_depth", {"fov_deg": 50})
    assert labeler.reads == ("depth",) and labeler.setup.weights_path is None
    depth = _teacher(folders, "hf_depth").label(photos)
    made = labeler.label(LabelBatch(photos.keys, photos.images, labels={"depth": tuple(depth)}))
    for normal, d in zip(made, depth):
        np.testing.assert_array_equal(normal, normals_from_depth(d, 50))
    with pytest.raises(LabelerError, match="no depth labels"):
        labeler.label(photos)


@pytest.mark.parametrize("name", ["hf_depth", "hf_semseg", "hf_det", "hf_caption", "hf_normal", "hf_clip",
                                  "hf_dinov2"])
def test_a_batch_gives_what_its_photos_give_one_by_one_and_moves_with_the_photo(folders, photos, name):
    teacher = _teacher(folders, name, **({"max_new_tokens": 5} if name == "hf_caption" else {}))
    together, alone = teacher.label(photos), label_one_by_one(teacher, photos)
    for a, b in zip(together, alone):
        if isinstance(a, np.ndarray):
            # batched kernels sum in another order; inverting a small disparity magnifies that (relative 1e-3)
            np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=1e-3, atol=1e-4)
        elif name == "hf_det":  # a box a float rounding away from a bin edge may land in the next bin
            assert [n for _, n in parse_det(a)] == [n for _, n in parse_det(b)]
            assert np.abs(np.subtract([q for q, _ in parse_det(a)], [q for q, _ in parse_det(b)])).max() <= 1
        else:
            assert a == b
    flipped = LabelBatch(photos.keys, tuple(np.ascontiguousarray(i[::-1]) for i in photos.images))
    moved = teacher.label(flipped)
    assert any(not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(together, moved))


def test_other_weights_give_other_labels_and_another_identity(folders, photos, tmp_path):
    other = save_teacher("hf_depth", tmp_path / "other", SIDE, seed=1)
    first, second = _teacher(folders, "hf_depth"), build_labeler("hf_depth", PARAMS["hf_depth"], str(other))
    assert first.identity()["weights"] != second.identity()["weights"]
    assert not np.allclose(first.label(photos)[0], second.label(photos)[0])


def test_teachers_are_built_with_no_network(folders, photos, monkeypatch):
    from fourm_kfp.labelers.teachers import loading

    for cache in (loading.load_processor, loading.load_model_config, loading.load_model):
        cache.cache_clear()

    def refuse(*args, **kwargs):
        raise AssertionError(f"a network connection was attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    for name in ("hf_depth", "hf_semseg", "hf_det", "hf_caption", "hf_normal", "hf_clip", "hf_dinov2"):
        assert _teacher(folders, name).label(photos)


def test_building_a_teacher_reads_its_configs_and_loads_the_network_only_when_it_labels(folders, photos):
    from fourm_kfp.labelers.teachers import loading

    loading.load_model.cache_clear()
    teacher = _teacher(folders, "hf_clip")
    assert teacher.modality_settings == {"channels": 24, "grid": 4}  # from the configs alone
    assert loading.load_model.cache_info().currsize == 0
    teacher.label(photos)
    assert loading.load_model.cache_info().currsize == 1


def test_params_are_checked_naming_the_labeler(folders):
    with pytest.raises(LabelerError, match="'hf_depth'.*relative or metric"):
        build_labeler("hf_depth", {}, folders["hf_depth"])
    with pytest.raises(LabelerError, match="'hf_det'.*threshold"):
        build_labeler("hf_det", {"threshold": 2}, folders["hf_det"])
    with pytest.raises(LabelerError, match="unknown params"):
        build_labeler("hf_semseg", {"threshold": 0.5}, folders["hf_semseg"])
    with pytest.raises(LabelerError, match="needs a model folder"):
        build_labeler("hf_clip", {}, "")


def test_a_folder_naming_its_backbone_by_name_is_refused(tmp_path):
    import json

    folder = tmp_path / "detr-by-name"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "detr", "backbone": "resnet50",
                                                    "use_timm_backbone": True, "backbone_config": None}))
    with pytest.raises(LabelerError, match=r"config\.backbone = 'resnet50'.*backbone_config"):
        build_labeler("hf_det", {}, str(folder))
    with pytest.raises(LabelerError, match="holds no config.json"):
        build_labeler("hf_det", {}, str(tmp_path))


def test_mask2former_maps_in_fewer_operations_equal_transformers_post_processing():
    """On outputs with many classes and boundaries (random logits), not only the tiny network's."""
    import types

    import torch
    from transformers import Mask2FormerImageProcessor

    from fourm_kfp.labelers.teachers.segmentation import mask2former_semantic_maps

    generator = torch.Generator().manual_seed(0)
    outputs = types.SimpleNamespace(class_queries_logits=torch.randn(2, 20, 134, generator=generator) * 3,
                                    masks_queries_logits=torch.randn(2, 20, 16, 16, generator=generator) * 4)
    theirs = Mask2FormerImageProcessor().post_process_semantic_segmentation(outputs, target_sizes=[(56, 56)] * 2)
    ours = mask2former_semantic_maps(outputs, (56, 56))
    for mine, reference in zip(ours, theirs):
        assert len(reference.unique()) > 5
        assert torch.equal(mine, reference)
