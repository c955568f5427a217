"""Each family a teacher reads, beyond the ones tests/labelers/test_teachers.py runs, on a tiny random-weight folder
(tests/teacher_models.py's :data:`~tests.teacher_models.MORE_FAMILIES`): its predictions equal transformers' own
pipeline (depth, semantic segmentation) or post-processing (boxes) or ``generate`` and ``batch_decode`` (captions)
for the same network and photos, and its labels are valid values of its modality."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from fourm_kfp.data.label_checks import CheckSettings, check_value
from fourm_kfp.labelers.registry import build_labeler
from tests.teacher_models import COCO_LIKE, MORE_FAMILIES, SEG_CLASSES, save_family, teacher_photos

SIDE = 64
PARAMS = {"hf_depth": {"depth": "relative", "inverse": True}, "depth_anything_metric": {"depth": "metric"},
          "hf_det": {"threshold": 0.0, "max_boxes": 100}, "hf_caption": {"max_new_tokens": 5}}


def _families(labeler: str) -> list[str]:
    return [name for name, (reads, _) in MORE_FAMILIES.items() if reads == labeler]


@pytest.fixture(scope="module")
def photos():
    return teacher_photos(SIDE)


@pytest.fixture
def family(request, tmp_path):
    """(name, folder, teacher) of the parametrized family."""
    name = request.param
    labeler = MORE_FAMILIES[name][0]
    folder = str(save_family(name, tmp_path / name, SIDE))
    return name, folder, build_labeler(labeler, PARAMS.get(name, PARAMS.get(labeler, {})), folder)


def _pil(batch) -> list[Image.Image]:
    return [Image.fromarray(image) for image in batch.images]


@pytest.mark.parametrize("family", _families("hf_depth"), indirect=True)
def test_depth_equals_the_transformers_depth_pipeline(family, photos):
    from transformers import pipeline

    name, folder, teacher = family
    pipe = pipeline("depth-estimation", model=folder, device="cpu")
    ours = teacher.predict(photos)
    for mine, image in zip(ours, _pil(photos)):
        theirs = pipe(image)["predicted_depth"].numpy()
        assert mine.shape == theirs.shape == (SIDE, SIDE) and np.ptp(theirs) > 0
        np.testing.assert_allclose(mine, theirs, rtol=0, atol=1e-4 * max(1e-6, float(np.abs(theirs).max())))
    for depth in teacher.label(photos):
        assert check_value("depth", depth, CheckSettings(SIDE, relative_depth=teacher.relative_depth)) is None


@pytest.mark.parametrize("family", _families("hf_semseg"), indirect=True)
def test_semseg_equals_the_transformers_segmentation_pipeline(family, photos):
    from transformers import pipeline

    name, folder, teacher = family
    assert teacher.classes == SEG_CLASSES
    pipe = pipeline("image-segmentation", model=folder, device="cpu")
    labels, seen = teacher.label(photos), set()
    for ids, image in zip(labels, _pil(photos)):
        theirs = np.full((SIDE, SIDE), -1)
        for segment in pipe(image, subtask="semantic"):
            theirs[np.asarray(segment["mask"]) > 0] = SEG_CLASSES.index(segment["label"])
        np.testing.assert_array_equal(ids, theirs)
        seen |= set(np.unique(ids).tolist())
        assert check_value("semseg", ids, CheckSettings(SIDE, classes=teacher.classes)) is None
    assert len(seen) > 1


@pytest.mark.parametrize("family", _families("hf_det"), indirect=True)
def test_boxes_equal_transformers_post_processing(family, photos):
    import torch
    from transformers import AutoImageProcessor, AutoModelForObjectDetection

    name, folder, teacher = family
    processor = AutoImageProcessor.from_pretrained(folder)
    model = AutoModelForObjectDetection.from_pretrained(folder).eval()
    with torch.no_grad():
        outputs = model(**processor(images=_pil(photos), return_tensors="pt"))
    theirs = processor.post_process_object_detection(outputs, threshold=0.0, target_sizes=[(SIDE, SIDE)] * 3)
    for found, reference in zip(teacher.predict(photos), theirs):
        assert len(reference["scores"]) > 0
        np.testing.assert_allclose(found["boxes"], reference["boxes"].numpy(), atol=1e-4)
        np.testing.assert_array_equal(found["labels"], reference["labels"].numpy())
        np.testing.assert_allclose(found["scores"], reference["scores"].numpy(), atol=1e-4)
    assert {int(i) for reference in theirs for i in reference["labels"]} <= set(range(len(COCO_LIKE)))
    for text in teacher.label(photos):
        assert check_value("det", text, CheckSettings(SIDE, classes=teacher.classes)) is None


@pytest.mark.parametrize("family", _families("hf_caption"), indirect=True)
def test_captions_equal_generate_and_decode(family, photos):
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    name, folder, teacher = family
    captions = teacher.label(photos)
    processor = AutoProcessor.from_pretrained(folder)
    model = AutoModelForImageTextToText.from_pretrained(folder).eval()
    with torch.no_grad():
        ids = model.generate(**processor(images=_pil(photos), return_tensors="pt"), max_new_tokens=5,
                             do_sample=False)
    assert captions == [text.strip() for text in processor.batch_decode(ids, skip_special_tokens=True)]
    assert all(captions) and all(check_value("caption", c, CheckSettings(SIDE)) is None for c in captions)
