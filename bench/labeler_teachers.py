"""Small but real-shaped random-weight teacher networks for ``bench/labelers.py``, built offline from transformers
configs and saved with ``save_pretrained`` as the model folders the label stage's teachers read.

The test suite's tiny teachers (64 px, a few thousand weights) time mostly pre-processing; these are the real
architectures at 224 px with fewer or narrower layers, sized so that one forward of a 16-image batch takes about
1 s on a 2-core Zen 4 (~200 GFLOP/s fp32), Mask2Former about 4.5 s:

* ``hf_depth`` / ``hf_normal``: DPT over a ViT-S/16 (hidden 384, 12 layers, 6 heads), neck 48-96-192-384, fusion
  128 (DPT-Large: ViT-L, neck 256-512-1024-1024, fusion 256); ``hf_normal`` with Omnidata's 3-channel head;
* ``hf_semseg``: Mask2Former over Swin-T (embed 96, depths 2-2-6-2, window 7), 133 classes (COCO panoptic), 100
  queries, 256 wide, 6 encoder and 6 decoder layers (Swin-B: 10 decoder layers);
* ``hf_det``: RT-DETR over a ResNet-18 (basic blocks 2-2-2-2, 64-128-256-512), 256 wide, 3 decoder layers, 300
  queries, 80 classes (COCO);
* ``hf_caption``: BLIP over a ViT-S/16 (384, 12 layers) with a 4-layer, 384-wide BERT text decoder and a
  30524-token WordPiece vocabulary (BLIP-base: ViT-B/16 and a 12-layer, 768-wide decoder);
* ``hf_clip``: a CLIP ViT-B/16 vision tower (768 wide, 12 heads) with 6 of its 12 layers, projection 512;
* ``hf_dinov2``: DINOv2-S/14 (384 wide, 12 layers, 6 heads), its processor resizing to 256 and centre-cropping 224.

The processors resize to 224 px (the photos' side), as the folders of the real networks are configured for their own
resolution. Nothing is downloaded; backbones are config objects. Weights get a little noise where a freshly
initialised network would give one class or box everywhere.
"""

from __future__ import annotations

from pathlib import Path

#: labeler -> builder below
BUILDERS = {
    "hf_depth": "save_dpt",
    "hf_semseg": "save_mask2former",
    "hf_det": "save_rt_detr",
    "hf_caption": "save_blip",
    "hf_normal": "save_dpt_normal",
    "hf_clip": "save_clip",
    "hf_dinov2": "save_dinov2",
}
SEG_CLASSES = tuple(f"stuff{i}" for i in range(133))
DET_CLASSES = tuple(f"thing{i}" for i in range(80))


def _seeded(seed: int) -> None:
    import torch

    torch.manual_seed(seed)


def _spread(model, std: float):
    import torch

    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * std)
    return model


def _labels(names: tuple[str, ...]) -> dict:
    return {"id2label": dict(enumerate(names)), "label2id": {n: i for i, n in enumerate(names)}}


def _dpt(side: int):
    from transformers import DPTConfig, DPTImageProcessor

    config = DPTConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=6, intermediate_size=1536,
                       image_size=side, patch_size=16, backbone_out_indices=[1, 3, 4, 5],
                       neck_hidden_sizes=[48, 96, 192, 384], fusion_hidden_size=128,
                       reassemble_factors=[4, 2, 1, 0.5])
    return config, DPTImageProcessor(size={"height": side, "width": side}, keep_aspect_ratio=False)


def save_dpt(folder: Path, side: int = 224, seed: int = 0) -> Path:
    from transformers import DPTForDepthEstimation

    _seeded(seed)
    config, processor = _dpt(side)
    DPTForDepthEstimation(config).save_pretrained(folder)
    processor.save_pretrained(folder)
    return Path(folder)


def save_dpt_normal(folder: Path, side: int = 224, seed: int = 0) -> Path:
    from fourm_kfp.labelers.teachers.normals import DPTForNormalEstimation

    _seeded(seed)
    config, processor = _dpt(side)
    DPTForNormalEstimation(config).save_pretrained(folder)
    processor.save_pretrained(folder)
    return Path(folder)


def save_mask2former(folder: Path, side: int = 224, seed: int = 0) -> Path:
    from transformers import Mask2FormerConfig, Mask2FormerForUniversalSegmentation, Mask2FormerImageProcessor, \
        SwinConfig

    _seeded(seed)
    swin = SwinConfig(image_size=side, patch_size=4, embed_dim=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24],
                      window_size=7, out_features=["stage1", "stage2", "stage3", "stage4"])
    config = Mask2FormerConfig(backbone_config=swin, num_labels=len(SEG_CLASSES), hidden_dim=256, feature_size=256,
                               mask_feature_size=256, encoder_feedforward_dim=1024, dim_feedforward=2048,
                               num_queries=100, encoder_layers=6, decoder_layers=6, num_attention_heads=8,
                               **_labels(SEG_CLASSES))
    _spread(Mask2FormerForUniversalSegmentation(config), 0.5).save_pretrained(folder)
    Mask2FormerImageProcessor(size={"height": side, "width": side}, do_reduce_labels=False).save_pretrained(folder)
    return Path(folder)


def save_rt_detr(folder: Path, side: int = 224, seed: int = 0) -> Path:
    from transformers import RTDetrConfig, RTDetrForObjectDetection, RTDetrImageProcessor, RTDetrResNetConfig

    _seeded(seed)
    backbone = RTDetrResNetConfig(embedding_size=64, hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2],
                                  layer_type="basic", out_features=["stage2", "stage3", "stage4"])
    config = RTDetrConfig(backbone_config=backbone, encoder_in_channels=[128, 256, 512], encoder_hidden_dim=256,
                          d_model=256, encoder_layers=1, decoder_layers=3, num_queries=300, encoder_ffn_dim=1024,
                          decoder_ffn_dim=1024, decoder_in_channels=[256, 256, 256], num_labels=len(DET_CLASSES),
                          **_labels(DET_CLASSES))
    _spread(RTDetrForObjectDetection(config), 0.05).save_pretrained(folder)
    RTDetrImageProcessor(size={"height": side, "width": side}).save_pretrained(folder)
    return Path(folder)


def save_blip(folder: Path, side: int = 224, seed: int = 0) -> Path:
    from transformers import BertTokenizer, BlipConfig, BlipForConditionalGeneration, BlipImageProcessor, \
        BlipProcessor

    _seeded(seed)
    words = "a photo of the cat dog on sofa red blue car rocket coffee cup man in space".split()
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[DEC]", *words]
    vocab += [f"w{i}" for i in range(30524 - len(vocab))]
    tokenizer = BertTokenizer(vocab={t: i for i, t in enumerate(vocab)}, bos_token="[DEC]")
    config = BlipConfig(
        text_config=dict(vocab_size=len(vocab), hidden_size=384, intermediate_size=1536, num_hidden_layers=4,
                         num_attention_heads=6, encoder_hidden_size=384, bos_token_id=5, pad_token_id=0,
                         sep_token_id=3, eos_token_id=3),
        vision_config=dict(hidden_size=384, intermediate_size=1536, num_hidden_layers=6, num_attention_heads=6,
                           image_size=side, patch_size=16), projection_dim=256)
    BlipForConditionalGeneration(config).save_pretrained(folder)
    BlipProcessor(image_processor=BlipImageProcessor(size={"height": side, "width": side}),
                  tokenizer=tokenizer).save_pretrained(folder)
    return Path(folder)


def save_clip(folder: Path, side: int = 224, seed: int = 0) -> Path:
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModelWithProjection

    _seeded(seed)
    config = CLIPVisionConfig(hidden_size=768, intermediate_size=3072, num_hidden_layers=4, num_attention_heads=12,
                              image_size=side, patch_size=16, projection_dim=512)
    CLIPVisionModelWithProjection(config).save_pretrained(folder)
    CLIPImageProcessor(size={"shortest_edge": side}, crop_size={"height": side, "width": side}).save_pretrained(folder)
    return Path(folder)


def save_dinov2(folder: Path, side: int = 224, seed: int = 0) -> Path:
    from transformers import BitImageProcessor, Dinov2Config, Dinov2Model

    _seeded(seed)
    config = Dinov2Config(hidden_size=384, intermediate_size=1536, num_hidden_layers=12, num_attention_heads=6,
                          image_size=518, patch_size=14)
    Dinov2Model(config).save_pretrained(folder)
    BitImageProcessor(size={"shortest_edge": side * 8 // 7}, crop_size={"height": side, "width": side},
                      image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225]).save_pretrained(folder)
    return Path(folder)


def save_teacher(labeler: str, folder: Path, side: int = 224, seed: int = 0) -> Path:
    """The bench's model folder for the teacher ``labeler`` (:data:`BUILDERS`)."""
    return globals()[BUILDERS[labeler]](Path(folder), side, seed)
