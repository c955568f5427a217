"""Tiny random-weight teacher networks for the tests: the folders of :mod:`fourm_kfp.labelers.teachers.random_folders`
at its ``tiny`` size (64 px photos), and two more families the built-in teachers read, to check transformers'
other code paths: SegFormer (per-pixel semantic logits) and DETR over a transformers ResNet given by its config.
Nothing is downloaded; backbones are config objects, never names."""

from __future__ import annotations

from pathlib import Path

from fourm_kfp.labelers.teachers.random_folders import (FAMILIES, TINY_DET_CLASSES, TINY_SEG_CLASSES, labels,
                                                         save_random_teacher)

#: every transformers teacher of the registry (tests/labelers/test_teachers.py tests each)
TEACHER_LABELERS = (*FAMILIES, "normal_from_depth")
SEG_CLASSES = TINY_SEG_CLASSES
COCO_LIKE = TINY_DET_CLASSES


def _seeded(seed: int):
    import torch

    torch.manual_seed(seed)


def save_teacher(labeler: str, folder: Path, side: int = 64, seed: int = 0) -> Path:
    """The tiny model folder the labeler ``labeler`` reads."""
    return save_random_teacher(labeler, folder, side, "tiny", seed)


def save_segformer(folder: Path, side: int = 64, seed: int = 0) -> Path:
    """A SegFormer (per-pixel logits: transformers' semantic segmentation path)."""
    from transformers import SegformerConfig, SegformerForSemanticSegmentation, SegformerImageProcessor

    _seeded(seed)
    config = SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
                             patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
                             decoder_hidden_size=32, num_labels=len(SEG_CLASSES),
                             **labels(SEG_CLASSES))
    SegformerForSemanticSegmentation(config).save_pretrained(folder)
    SegformerImageProcessor(size={"height": side, "width": side}, do_reduce_labels=False).save_pretrained(folder)
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
                        **labels(COCO_LIKE))
    DetrForObjectDetection(config).save_pretrained(folder)
    DetrImageProcessor(size={"height": side, "width": side}).save_pretrained(folder)
    return Path(folder)
