"""FLOPs per image of 4M-21's teachers and of ml-4m's tokenizer encoders, counted by torch's FLOP counter on networks
built from their configurations (random weights): what docs/scale.md turns into GPU-hours for CC12M and COYO-700M.

    .venv/bin/python bench/teacher_flops.py [--output bench/results/teacher_flops-cpu-<date>.json]

A FLOP is a multiply or an add (torch.utils.flop_counter counts 2 per multiply-accumulate). Counted: the networks'
forward passes at the resolutions 4M runs them (CLIP-B/16 and DINOv2-B/14 at 224 px, as ml-4m's
``save_vq_tokens.py``; DPT-Hybrid and Mask2Former Swin-B at 384 px, the size their transformers processors resize to),
and a ViT-B/16 at 224 px, the shape of ml-4m's VQ encoders (pretokenize runs one per image modality). Not
counted: pre- and post-processing, and DETR-family or ViTDet detectors (4M-21 uses ViTDet-H).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys

import torch
from torch.utils.flop_counter import FlopCounterMode

from bench_output import emit


def gflops(model: torch.nn.Module, *inputs: torch.Tensor, **kwargs) -> float:
    model.eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(*inputs, **kwargs)
    return counter.get_total_flops() / 1e9


def networks() -> dict[str, tuple]:
    import transformers as hf

    swin = hf.SwinConfig(embed_dim=128, depths=[2, 2, 18, 2], num_heads=[4, 8, 16, 32], window_size=12,
                         image_size=384, out_features=["stage1", "stage2", "stage3", "stage4"])
    return {
        "clip_b16_224": (lambda: hf.CLIPVisionModel(hf.CLIPVisionConfig(patch_size=16, image_size=224)), 224),
        "dinov2_b14_224": (lambda: hf.Dinov2Model(hf.Dinov2Config(image_size=224, patch_size=14)), 224),
        # the shape of ml-4m's ViT-B/16 VQ encoders (12 blocks of width 768 over 14 x 14 patches; vit_b_enc)
        "vq_encoder_vit_b16_224": (lambda: hf.ViTModel(hf.ViTConfig(image_size=224, patch_size=16),
                                                       add_pooling_layer=False), 224),
        "dpt_hybrid_384": (lambda: hf.DPTForDepthEstimation(hf.DPTConfig(
            is_hybrid=True, image_size=384, backbone_featmap_shape=[1, 1024, 24, 24],
            neck_hidden_sizes=[256, 512, 768, 768])), 384),
        "mask2former_swin_b_384": (lambda: hf.Mask2FormerForUniversalSegmentation(hf.Mask2FormerConfig(
            backbone_config=swin, num_labels=133, use_timm_backbone=False)), 384),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    out = {}
    for name, (build, side) in networks().items():
        out[name] = round(gflops(build(), pixel_values=torch.zeros(1, 3, side, side)), 1)
        print(f"[teacher_flops] {name}: {out[name]} GFLOPs", file=sys.stderr, flush=True)
    emit({"benchmark": "teacher_flops", "date": dt.date.today().isoformat(),
          "command": "python bench/teacher_flops.py " + " ".join(sys.argv[1:]),
          "gflops_per_image": out}, args.output)


if __name__ == "__main__":
    main()
