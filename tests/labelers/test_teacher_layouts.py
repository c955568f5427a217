"""The transformers teachers on more of each family's common checkpoint layouts, each a tiny random-weight folder
saved as the hub's checkpoints of the family are laid out (tests/teacher_models.py): COCO detectors in DETR's 91-id
layout (DETR, YOLOS), a ViT+GPT2 VisionEncoderDecoder captioner with no processor, MaskFormer; ZoeDepth and
DepthPro refused; and every wrong pairing of a folder and a teacher refused when the labeler is built, naming the
labeler once, the folder, the model type and what the labeler reads."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from fourm_kfp.data.label_checks import CheckSettings, check_value
from fourm_kfp.data.modalities import format_det
from fourm_kfp.labelers.base import LabelerError, label_one_by_one
from fourm_kfp.labelers.registry import build_labeler, located
from fourm_kfp.labelers.teachers import loading
from fourm_kfp.labelers.teachers.boxes import det_name
from tests.teacher_models import (COCO_91_ID2LABEL, SEG_CLASSES, save_depth_pro, save_detr, save_maskformer,
                                  save_segformer, save_teacher, save_vit_gpt2, save_yolos, save_zoedepth,
                                  teacher_photos)

SIDE = 64


@pytest.fixture(scope="module")
def photos():
    return teacher_photos(SIDE)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("layouts")
    made = {"detr-coco91": save_detr(root / "detr-coco91", SIDE, seed=1, classes=COCO_91_ID2LABEL, std=0.5),
            "yolos-coco91": save_yolos(root / "yolos-coco91", SIDE),
            "vit-gpt2": save_vit_gpt2(root / "vit-gpt2", SIDE),
            "maskformer": save_maskformer(root / "maskformer", SIDE)}
    return {name: str(folder) for name, folder in made.items()}


def _pil(batch) -> list[Image.Image]:
    return [Image.fromarray(image) for image in batch.images]


@pytest.mark.parametrize("folder", ["detr-coco91", "yolos-coco91"])
def test_coco_detectors_in_detrs_91_id_layout_never_write_the_placeholder_ids(folders, photos, folder):
    import torch
    from transformers import AutoImageProcessor, AutoModelForObjectDetection

    teacher = build_labeler("hf_det", {"threshold": 0.0, "max_boxes": 5}, folders[folder])
    assert teacher.classes == tuple(det_name(n) for n in COCO_91_ID2LABEL if n != "N/A")
    assert len(teacher.classes) == 80 and "traffic_light" in teacher.classes
    processor = AutoImageProcessor.from_pretrained(folders[folder])
    model = AutoModelForObjectDetection.from_pretrained(folders[folder]).eval()
    with torch.no_grad():
        outputs = model(**processor(images=_pil(photos), return_tensors="pt"))
    theirs = processor.post_process_object_detection(outputs, threshold=0.0, target_sizes=[(SIDE, SIDE)] * 3)
    ours = teacher.predict(photos)
    for found, reference in zip(ours, theirs):
        np.testing.assert_allclose(found["boxes"], reference["boxes"].numpy(), atol=1e-4)
        np.testing.assert_array_equal(found["labels"], reference["labels"].numpy())
        np.testing.assert_allclose(found["scores"], reference["scores"].numpy(), atol=1e-4)
    id2label = model.config.id2label
    predicted = [id2label[int(i)] for reference in theirs for i in reference["labels"]]
    assert "N/A" in predicted and set(predicted) - {"N/A"}  # the network predicts both, so the filter is seen
    for text, reference in zip(teacher.label(photos), theirs):
        scores, labels, boxes = (reference[k].numpy() for k in ("scores", "labels", "boxes"))
        kept = [i for i in np.argsort(-scores, kind="stable") if id2label[int(labels[i])] != "N/A"][:5]
        expected = format_det([tuple(map(float, boxes[i])) for i in kept],
                              [det_name(id2label[int(labels[i])]) for i in kept], SIDE, SIDE) or None
        assert text == expected
        assert text is None or check_value("det", text, CheckSettings(SIDE, classes=teacher.classes)) is None


def test_class_names_shared_by_two_ids_are_refused_naming_them_and_the_folder(tmp_path):
    classes = ("N/A", "person", "traffic light", "N/A", "traffic_light", "car", "car")
    folder = save_detr(tmp_path / "shared-names", SIDE, classes=classes)
    with pytest.raises(LabelerError) as refused:
        build_labeler("hf_det", {}, str(folder))
    message = str(refused.value)
    assert message.count("labeler 'hf_det'") == 1 and str(folder) in message
    assert "'car' (ids 5 'car', 6 'car')" in message
    assert "'traffic_light' (ids 2 'traffic light', 4 'traffic_light')" in message
    assert "'N/A' (ids" not in message and "'person'" not in message  # the placeholder may repeat


def test_a_vit_gpt2_captioner_with_no_processor_captions_as_generate_and_decode_do(folders, photos):
    import torch
    from transformers import AutoImageProcessor, AutoTokenizer, VisionEncoderDecoderModel

    folder = folders["vit-gpt2"]
    teacher = build_labeler("hf_caption", {"max_new_tokens": 6}, folder)
    captions = teacher.label(photos)
    model = VisionEncoderDecoderModel.from_pretrained(folder).eval()
    images, tokenizer = AutoImageProcessor.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():
        ids = model.generate(**images(images=_pil(photos), return_tensors="pt"), max_new_tokens=6, do_sample=False)
    expected = [text.strip() for text in tokenizer.batch_decode(ids, skip_special_tokens=True)]
    assert captions == expected and all(captions) and len(set(captions)) > 1
    assert label_one_by_one(teacher, photos) == captions
    with pytest.raises(LabelerError, match=r"'hf_caption'.*vit-gpt2 holds an image processor and a tokenizer.*"
                                           r"no 'prompt'"):
        build_labeler("hf_caption", {"prompt": "a photo of"}, folder)


def test_maskformer_semseg_equals_transformers_post_processing_and_pipeline(folders, photos):
    import torch
    from transformers import AutoImageProcessor, MaskFormerForInstanceSegmentation, pipeline

    folder = folders["maskformer"]
    config = json.loads(open(f"{folder}/config.json").read())
    assert "resnet50" in json.dumps(config["decoder_config"])  # DETR's default backbone name, never built
    teacher = build_labeler("hf_semseg", {}, folder)
    assert teacher.classes == SEG_CLASSES
    labels = teacher.label(photos)
    processor = AutoImageProcessor.from_pretrained(folder)
    model = MaskFormerForInstanceSegmentation.from_pretrained(folder).eval()
    with torch.no_grad():
        outputs = model(**processor(images=_pil(photos), return_tensors="pt"))
    theirs = processor.post_process_semantic_segmentation(outputs, target_sizes=[(SIDE, SIDE)] * 3)
    for ids, reference in zip(labels, theirs):
        assert ids.dtype == np.uint8 and ids.shape == (SIDE, SIDE)
        np.testing.assert_array_equal(ids, reference.numpy())
        assert check_value("semseg", ids, CheckSettings(SIDE, classes=teacher.classes)) is None
    assert len(np.unique(np.stack(labels))) > 1
    pipe = pipeline("image-segmentation", model=folder, device="cpu")  # transformers loads the folder offline too
    for ids, image in zip(labels, _pil(photos)):
        from_pipeline = np.full((SIDE, SIDE), -1)
        for segment in pipe(image, subtask="semantic"):
            from_pipeline[np.asarray(segment["mask"]) > 0] = SEG_CLASSES.index(segment["label"])
        np.testing.assert_array_equal(ids, from_pipeline)


def test_a_backbone_named_where_the_model_builds_it_is_still_refused(tmp_path, folders):
    config = json.loads(open(f"{folders['maskformer']}/config.json").read())
    config["backbone"], config["backbone_config"] = "microsoft/swin-tiny-patch4-window7-224", None
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(LabelerError, match=r"config\.backbone = 'microsoft/swin-tiny[^']*'\) with no backbone_config"):
        build_labeler("hf_semseg", {}, str(tmp_path))


def test_zoedepth_and_depth_pro_are_refused_at_build_as_their_processors_need_torchvision(tmp_path, monkeypatch):
    monkeypatch.setattr(loading, "torchvision_available", lambda: False)  # as in the environment and the images
    for model_type, folder in (("zoedepth", save_zoedepth(tmp_path / "zoedepth", SIDE)),
                               ("depth_pro", save_depth_pro(tmp_path / "depth-pro"))):
        with pytest.raises(LabelerError) as refused:
            build_labeler("hf_depth", {"depth": "metric"}, str(folder))
        message = str(refused.value)
        assert message.startswith("labeler 'hf_depth': ") and message.count("labeler 'hf_depth'") == 1
        assert f"{folder} holds a {model_type!r} model" in message and "needs torchvision" in message
        accepted = message.rpartition("of the types ")[2].split(", ")
        assert {"dpt", "glpn", "depth_anything"} <= set(accepted) and model_type not in accepted


@pytest.fixture(scope="module")
def family_folders(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("families")
    made = {family: save_teacher(labeler, root / family, SIDE) for labeler, family in
            (("hf_depth", "dpt"), ("hf_semseg", "mask2former"), ("hf_det", "rt_detr"), ("hf_caption", "blip"))}
    made["segformer"] = save_segformer(root / "segformer", SIDE)
    made["detr"] = save_detr(root / "detr", SIDE)
    return {family: str(folder) for family, folder in made.items()}


WRONG_PAIRINGS = [  # (labeler, params, folder, its model type, a model type the labeler reads)
    ("hf_depth", {"depth": "relative"}, "detr", "detr", "dpt"),
    ("hf_depth", {"depth": "relative"}, "mask2former", "mask2former", "glpn"),
    ("hf_det", {}, "segformer", "segformer", "yolos"),
    ("hf_det", {}, "dpt", "dpt", "rt_detr"),
    ("hf_caption", {}, "dpt", "dpt", "vision-encoder-decoder"),
    ("hf_caption", {}, "rt_detr", "rt_detr", "blip"),
    ("hf_semseg", {}, "blip", "blip", "maskformer"),
    ("hf_semseg", {}, "detr", "detr", "segformer"),
    ("hf_normal", {}, "segformer", "segformer", "dpt"),
]


@pytest.mark.parametrize("labeler, params, folder, model_type, accepted", WRONG_PAIRINGS)
def test_a_folder_of_another_family_is_refused_at_build_naming_everything_once(family_folders, labeler, params,
                                                                                folder, model_type, accepted):
    path = family_folders[folder]
    with pytest.raises(LabelerError) as refused:
        build_labeler(labeler, params, path)
    message = str(refused.value)
    assert message.startswith(f"labeler {labeler!r}: ") and message.count(f"labeler {labeler!r}") == 1
    assert f"{path} holds a {model_type!r} model" in message and f"which {labeler} does not read" in message
    assert accepted in message.rpartition("of the types ")[2].split(", ")
    with pytest.raises(LabelerError) as located:  # behind the config entry, still once
        build_labeler(labeler, params, path, where="label.labelers[3]")
    assert str(located.value) == f"label.labelers[3]: {message}"


def test_errors_at_build_name_the_labeler_once(family_folders):
    for params, pattern in (({}, "relative or metric"), ({"bf16": "yes"}, "bf16"), ({"nope": 1}, "unknown params")):
        with pytest.raises(LabelerError, match=pattern) as refused:
            build_labeler("hf_depth", params, family_folders["dpt"])
        assert str(refused.value).count("labeler 'hf_depth'") == 1
    # a plug-in's error that does not name its labeler gets the name, once, behind the config entry
    assert located("no such file", "my_depth", None) == "labeler 'my_depth': no such file"
    assert located("labeler 'my_depth': bad", "my_depth", "label.labelers[1]") == \
        "label.labelers[1]: labeler 'my_depth': bad"


def test_a_model_of_another_family_is_refused_as_such_even_where_torchvision_is_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(loading, "torchvision_available", lambda: False)
    folder = save_depth_pro(tmp_path / "depth-pro")
    with pytest.raises(LabelerError, match=r"holds a 'depth_pro' model \(its config.json's model_type\), which "
                                           r"hf_det does not read: it reads object-detection models"):
        build_labeler("hf_det", {}, str(folder))
