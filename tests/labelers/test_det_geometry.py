"""hf_det writes each box's corners on their own axes: a DETR whose every query predicts one tall, off-centre box at a
known place (its box head's bias) labels photos, square as the pipeline's and wide, and the det text has
``v0 = xmin``, ``v1 = ymin``, ``v2 = xmax``, ``v3 = ymax``, each the fraction of the photo's width (x) or height (y)
in 4M's coordinate bins. The reference is transformers' own ``post_process_object_detection`` on the same network's
outputs, and the known box it must agree with."""

from __future__ import annotations

import numpy as np
import pytest

from fourm_kfp.data.modalities import COORD_BINS, parse_det
from fourm_kfp.labelers.base import LabelBatch
from fourm_kfp.labelers.registry import build_labeler
from tests.teacher_models import COCO_LIKE, save_detr

#: the box every query predicts, as DETR writes boxes: centre x, centre y, width, height, fractions of the photo;
#: it is twice as tall as wide and nowhere symmetric, so any swap of axes or corners moves it
CX, CY, W, H = 0.30, 0.60, 0.20, 0.40
KNOWN = (CX - W / 2, CY - H / 2, CX + W / 2, CY + H / 2)  # xmin, ymin, xmax, ymax as fractions
CLASS = 1


@pytest.fixture(scope="module")
def detr(tmp_path_factory):
    import torch
    from transformers import DetrForObjectDetection

    folder = save_detr(tmp_path_factory.mktemp("detr") / "detr")
    model = DetrForObjectDetection.from_pretrained(folder)
    with torch.no_grad():
        box = model.bbox_predictor.layers[-1]
        box.weight.zero_()
        box.bias.copy_(torch.logit(torch.tensor([CX, CY, W, H])))
        classes = model.class_labels_classifier
        classes.weight.zero_()
        classes.bias.zero_()
        classes.bias[CLASS] = 10.0  # one class, far above "no object"
    model.save_pretrained(folder)
    return folder


def _transformers_boxes(folder, photo: np.ndarray) -> np.ndarray:
    """xmin, ymin, xmax, ymax in pixels of the photo, of the best detection, by transformers' own code."""
    import torch
    from transformers import AutoImageProcessor, DetrForObjectDetection

    processor = AutoImageProcessor.from_pretrained(folder)
    model = DetrForObjectDetection.from_pretrained(folder).eval()
    with torch.no_grad():
        outputs = model(**processor(images=[photo], return_tensors="pt"))
    [found] = processor.post_process_object_detection(outputs, threshold=0.5, target_sizes=[photo.shape[:2]])
    best = int(found["scores"].argmax())
    assert int(found["labels"][best]) == CLASS
    return found["boxes"][best].numpy()


@pytest.mark.parametrize(("height", "width"), [(64, 64), (48, 96), (96, 40)])
def test_each_corner_of_a_tall_box_is_written_on_its_own_axis(detr, height, width):
    photo = np.random.default_rng(0).integers(0, 255, (height, width, 3), dtype=np.uint8)
    labeler = build_labeler("hf_det", {"threshold": 0.5, "max_boxes": 1}, str(detr))
    [text] = labeler.label(LabelBatch(("k",), (photo,)))
    [(bins, name)] = parse_det(text)
    assert name == "_".join(COCO_LIKE[CLASS].split())

    written = np.asarray(bins, np.float64) / COORD_BINS  # fractions: xmin, ymin, xmax, ymax
    reference = _transformers_boxes(detr, photo) / np.array([width, height, width, height])
    np.testing.assert_allclose(reference, KNOWN, atol=1e-4)  # transformers places the box where the head put it
    np.testing.assert_allclose(written, reference, atol=1.5 / COORD_BINS)  # within a bin, whatever the rounding
    assert written[2] - written[0] < written[3] - written[1]  # the box stays tall
