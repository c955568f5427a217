"""Tiny random-weight teacher networks for the tests, built offline from transformers configs and saved with
``save_pretrained`` as a model folder (config, safetensors weights, the processor's and tokenizer's files): one per
family of :mod:`fourm_kfp.labelers.teachers`, with noise added to the weights where a fresh network would give one
answer everywhere. Nothing is downloaded; backbones are config objects, never names.

Each builder takes the folder and the photos' side (the processor resizes to it) and returns the folder. ``seed``
fixes the random weights, so two folders built with different seeds hold different networks.
"""

from __future__ import annotations

from pathlib import Path

#: labeler name -> builder name below: the folders the label stage's teachers read.
BUILDERS = {
    "hf_depth": "save_dpt",
    "hf_semseg": "save_mask2former",
    "hf_det": "save_rt_detr",
    "hf_caption": "save_blip",
    "hf_normal": "save_dpt_normal",
    "hf_clip": "save_clip",
    "hf_dinov2": "save_dinov2",
}
#: every transformers teacher of the registry (tests/labelers/test_teachers.py tests each)
TEACHER_LABELERS = (*BUILDERS, "normal_from_depth")
COCO_LIKE = ("person", "traffic light", "car", "dog", "potted plant")
SEG_CLASSES = ("wall", "floor", "sky", "tree", "person")


def _seeded(seed: int):
    import torch

    torch.manual_seed(seed)


def _spread(model, std: float):
    """The model with noise of ``std`` added to every weight: a freshly initialised Mask2Former or RT-DETR gives
    the same class or box everywhere, which could not tell a right reading of its outputs from a wrong one."""
    import torch

    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * std)
    return model


def _dpt_config(side: int):
    from transformers import DPTConfig

    return DPTConfig(hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=64,
                     image_size=side, patch_size=16, backbone_out_indices=[0, 1, 2, 3],
                     neck_hidden_sizes=[8, 16, 32, 32], fusion_hidden_size=16, reassemble_factors=[4, 2, 1, 0.5])


def _dpt_processor(side: int):
    from transformers import DPTImageProcessor

    return DPTImageProcessor(size={"height": side, "width": side}, keep_aspect_ratio=False)


def save_dpt(folder: Path, side: int = 64, seed: int = 0) -> Path:
    """A DPT depth network (``DPTForDepthEstimation``)."""
    from transformers import DPTForDepthEstimation

    _seeded(seed)
    DPTForDepthEstimation(_dpt_config(side)).save_pretrained(folder)
    _dpt_processor(side).save_pretrained(folder)
    return Path(folder)


def save_dpt_normal(folder: Path, side: int = 64, seed: int = 0) -> Path:
    """A DPT with Omnidata's 3-channel normals head (:class:`~fourm_kfp.labelers.teachers.normals`)."""
    from fourm_kfp.labelers.teachers.normals import DPTForNormalEstimation

    _seeded(seed)
    _spread(DPTForNormalEstimation(_dpt_config(side)), 0.3).save_pretrained(folder)
    _dpt_processor(side).save_pretrained(folder)
    return Path(folder)


def save_mask2former(folder: Path, side: int = 64, seed: int = 0) -> Path:
    """Mask2Former over a Swin backbone given by its config, with the classes of :data:`SEG_CLASSES`."""
    from transformers import Mask2FormerConfig, Mask2FormerForUniversalSegmentation, Mask2FormerImageProcessor, \
        SwinConfig

    _seeded(seed)
    swin = SwinConfig(image_size=side, patch_size=4, embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 2, 2],
                      window_size=4, out_features=["stage1", "stage2", "stage3", "stage4"])
    config = Mask2FormerConfig(backbone_config=swin, num_labels=len(SEG_CLASSES), hidden_dim=32,
                               encoder_feedforward_dim=64, dim_feedforward=64, num_queries=8, encoder_layers=1,
                               decoder_layers=2, num_attention_heads=2, mask_feature_size=32, feature_size=32,
                               common_stride=4, id2label=dict(enumerate(SEG_CLASSES)),
                               label2id={n: i for i, n in enumerate(SEG_CLASSES)})
    _spread(Mask2FormerForUniversalSegmentation(config), 1.0).save_pretrained(folder)
    Mask2FormerImageProcessor(size={"height": side, "width": side}, do_reduce_labels=False).save_pretrained(folder)
    return Path(folder)


def save_segformer(folder: Path, side: int = 64, seed: int = 0) -> Path:
    """A SegFormer (per-pixel logits: transformers' semantic segmentation path)."""
    from transformers import SegformerConfig, SegformerForSemanticSegmentation, SegformerImageProcessor

    _seeded(seed)
    config = SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
                             patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
                             decoder_hidden_size=32, num_labels=len(SEG_CLASSES),
                             id2label=dict(enumerate(SEG_CLASSES)), label2id={n: i for i, n in enumerate(SEG_CLASSES)})
    SegformerForSemanticSegmentation(config).save_pretrained(folder)
    SegformerImageProcessor(size={"height": side, "width": side}, do_reduce_labels=False).save_pretrained(folder)
    return Path(folder)


def save_rt_detr(folder: Path, side: int = 64, seed: int = 0) -> Path:
    """RT-DETR over a ResNet backbone given by its config, with the classes of :data:`COCO_LIKE`."""
    from transformers import RTDetrConfig, RTDetrForObjectDetection, RTDetrImageProcessor, RTDetrResNetConfig

    _seeded(seed)
    backbone = RTDetrResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                                  out_features=["stage2", "stage3", "stage4"])
    config = RTDetrConfig(backbone_config=backbone, encoder_hidden_dim=32, encoder_in_channels=[32, 64, 128],
                          d_model=32, decoder_layers=1, encoder_layers=1, num_queries=12, decoder_ffn_dim=64,
                          encoder_ffn_dim=64, decoder_attention_heads=2, encoder_attention_heads=2,
                          decoder_in_channels=[32, 32, 32], num_labels=len(COCO_LIKE),
                          id2label=dict(enumerate(COCO_LIKE)), label2id={n: i for i, n in enumerate(COCO_LIKE)})
    _spread(RTDetrForObjectDetection(config), 0.5).save_pretrained(folder)
    RTDetrImageProcessor(size={"height": side, "width": side}).save_pretrained(folder)
    return Path(folder)


def save_detr(folder: Path, side: int = 64, seed: int = 0) -> Path:
    """DETR over a transformers ResNet given by its config (not timm's, not by name)."""
    from transformers import DetrConfig, DetrForObjectDetection, DetrImageProcessor, ResNetConfig

    _seeded(seed)
    resnet = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                          out_features=["stage4"])
    config = DetrConfig(use_timm_backbone=False, backbone_config=resnet, d_model=32, encoder_layers=1,
                        decoder_layers=1, encoder_ffn_dim=64, decoder_ffn_dim=64, encoder_attention_heads=2,
                        decoder_attention_heads=2, num_queries=12, num_labels=len(COCO_LIKE),
                        id2label=dict(enumerate(COCO_LIKE)), label2id={n: i for i, n in enumerate(COCO_LIKE)})
    DetrForObjectDetection(config).save_pretrained(folder)
    DetrImageProcessor(size={"height": side, "width": side}).save_pretrained(folder)
    return Path(folder)


CAPTION_WORDS = "a photo of the cat dog on sofa red blue car rocket coffee cup man in space".split()


def save_blip(folder: Path, side: int = 64, seed: int = 0) -> Path:
    """BLIP captioning with a WordPiece tokenizer built in memory from :data:`CAPTION_WORDS`."""
    from transformers import BertTokenizer, BlipConfig, BlipForConditionalGeneration, BlipImageProcessor, \
        BlipProcessor

    _seeded(seed)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[DEC]", *CAPTION_WORDS]
    tokenizer = BertTokenizer(vocab={t: i for i, t in enumerate(vocab)}, bos_token="[DEC]")
    config = BlipConfig(
        text_config=dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, encoder_hidden_size=32, bos_token_id=5, pad_token_id=0,
                         sep_token_id=3),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=side, patch_size=16), projection_dim=32)
    _spread(BlipForConditionalGeneration(config), 0.5).save_pretrained(folder)
    BlipProcessor(image_processor=BlipImageProcessor(size={"height": side, "width": side}),
                  tokenizer=tokenizer).save_pretrained(folder)
    return Path(folder)


def save_clip(folder: Path, side: int = 64, seed: int = 0) -> Path:
    """A CLIP vision tower with its projection (16 px patches, 24 output channels)."""
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModelWithProjection

    _seeded(seed)
    config = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                              image_size=side, patch_size=16, projection_dim=24)
    CLIPVisionModelWithProjection(config).save_pretrained(folder)
    CLIPImageProcessor(size={"shortest_edge": side}, crop_size={"height": side, "width": side}).save_pretrained(folder)
    return Path(folder)


def save_dinov2(folder: Path, side: int = 64, seed: int = 0) -> Path:
    """DINOv2 (14 px patches) behind its processor: resize to ``side``, centre crop to 56 px (a 4 x 4 grid)."""
    from transformers import BitImageProcessor, Dinov2Config, Dinov2Model

    _seeded(seed)
    config = Dinov2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                          image_size=56, patch_size=14)
    Dinov2Model(config).save_pretrained(folder)
    BitImageProcessor(size={"shortest_edge": side}, crop_size={"height": 56, "width": 56},
                      image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225]).save_pretrained(folder)
    return Path(folder)


def save_teacher(labeler: str, folder: Path, side: int = 64, seed: int = 0) -> Path:
    """The tiny model folder the labeler ``labeler`` reads (:data:`BUILDERS`)."""
    return globals()[BUILDERS[labeler]](Path(folder), side, seed)
