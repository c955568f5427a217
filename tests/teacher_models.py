"""Tiny random-weight teacher networks for the tests: the folders of :mod:`fourm_kfp.testing`
at its ``tiny`` size (64 px photos), and more families the built-in teachers read, each saved as the hub's
checkpoints of the family are laid out, to check transformers' other code paths: SegFormer (per-pixel semantic
logits), MaskFormer, DETR over a transformers ResNet given by its config (facebook/detr-resnet-50's ``no_timm``
revision), DETR and YOLOS with COCO's 91-id ``id2label`` (:data:`COCO_91_ID2LABEL`), a ViT+GPT2
VisionEncoderDecoder captioner with an image processor and a tokenizer but no processor (the layout of
nlpconnect/vit-gpt2-image-captioning), ZoeDepth and DepthPro (which ``hf_depth`` refuses), and the other families
of :data:`MORE_FAMILIES` (GLPN, Depth Anything, DPT-hybrid, UperNet, BEiT, Conditional/Deformable DETR, RT-DETR v2,
DAB-DETR, GIT, Pix2Struct, BLIP with the hub's processor files). Nothing is downloaded; backbones are config objects, never names; tokenizers are built in memory."""

from __future__ import annotations

from pathlib import Path

from fourm_kfp.testing import (CAPTION_WORDS, FAMILIES, TINY_DET_CLASSES, TINY_SEG_CLASSES, labels,
                               save_random_teacher, spread)

#: every transformers teacher of the registry (tests/labelers/test_teachers.py tests each)
TEACHER_LABELERS = (*FAMILIES, "normal_from_depth")
SEG_CLASSES = TINY_SEG_CLASSES
COCO_LIKE = TINY_DET_CLASSES

#: facebook/detr-resnet-50's id2label (config.json), the layout YOLOS and the DETR family ship: COCO's category
#: ids 0..90, the 11 that no category uses named "N/A"
COCO_91_ID2LABEL = (
    "N/A", "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat", "traffic light",
    "fire hydrant", "N/A", "stop sign", "parking meter", "bench", "bird", "cat", "dog", "horse", "sheep", "cow",
    "elephant", "bear", "zebra", "giraffe", "N/A", "backpack", "umbrella", "N/A", "N/A", "handbag", "tie",
    "suitcase", "frisbee", "skis", "snowboard", "sports ball", "kite", "baseball bat", "baseball glove",
    "skateboard", "surfboard", "tennis racket", "bottle", "N/A", "wine glass", "cup", "fork", "knife", "spoon",
    "bowl", "banana", "apple", "sandwich", "orange", "broccoli", "carrot", "hot dog", "pizza", "donut", "cake",
    "chair", "couch", "potted plant", "bed", "N/A", "dining table", "N/A", "N/A", "toilet", "N/A", "tv", "laptop",
    "mouse", "remote", "keyboard", "cell phone", "microwave", "oven", "toaster", "sink", "refrigerator", "N/A",
    "book", "clock", "vase", "scissors", "teddy bear", "hair drier", "toothbrush")


def teacher_photos(side: int = 64, count: int = 3):
    """A label batch of ``count`` of scikit-image's photos resized to ``side`` px."""
    import numpy as np
    from PIL import Image
    from skimage import data

    from fourm_kfp.labelers.base import LabelBatch

    names = ("astronaut", "chelsea", "coffee", "rocket", "motorcycle_left")[:count]
    images = tuple(np.asarray(Image.fromarray(getattr(data, n)()).convert("RGB").resize((side, side))) for n in names)
    return LabelBatch(tuple(f"photo-{i}" for i in range(len(images))), images)


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


def save_detr(folder: Path, side: int = 64, seed: int = 0, classes: tuple[str, ...] = COCO_LIKE,
              std: float = 0.0) -> Path:
    """DETR over a transformers ResNet given by its config (not timm's, not by name), with ``classes``, its weights
    spread by ``std`` (:func:`~fourm_kfp.testing.spread`)."""
    from transformers import DetrConfig, DetrForObjectDetection, DetrImageProcessor, ResNetConfig

    _seeded(seed)
    resnet = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                          out_features=["stage4"])
    config = DetrConfig(use_timm_backbone=False, backbone_config=resnet, d_model=32, encoder_layers=1,
                        decoder_layers=1, encoder_ffn_dim=64, decoder_ffn_dim=64, encoder_attention_heads=2,
                        decoder_attention_heads=2, num_queries=12, num_labels=len(classes), **labels(classes))
    spread(DetrForObjectDetection(config), std).save_pretrained(folder)
    DetrImageProcessor(size={"height": side, "width": side}).save_pretrained(folder)
    return Path(folder)


def save_yolos(folder: Path, side: int = 64, seed: int = 0, classes: tuple[str, ...] = COCO_91_ID2LABEL) -> Path:
    """YOLOS (a ViT with detection tokens) with ``classes``, COCO's 91 ids as hustvl/yolos-small has them."""
    from transformers import YolosConfig, YolosForObjectDetection, YolosImageProcessor

    _seeded(seed)
    config = YolosConfig(image_size=[side, side], patch_size=16, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=2, intermediate_size=64, num_detection_tokens=12,
                         num_labels=len(classes), **labels(classes))
    spread(YolosForObjectDetection(config), 0.3).save_pretrained(folder)
    YolosImageProcessor(size={"shortest_edge": side, "longest_edge": side}).save_pretrained(folder)
    return Path(folder)


def save_maskformer(folder: Path, side: int = 64, seed: int = 0) -> Path:
    """MaskFormer over Swin (facebook/maskformer-swin-*'s layout): its ``decoder_config`` is a DETR config, which
    transformers writes with DETR's default backbone name though MaskFormer builds only its decoder."""
    from transformers import MaskFormerConfig, MaskFormerForInstanceSegmentation, MaskFormerImageProcessor, SwinConfig

    _seeded(seed)
    swin = SwinConfig(image_size=side, patch_size=4, embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 2, 2],
                      window_size=4, out_features=["stage1", "stage2", "stage3", "stage4"])
    decoder = dict(model_type="detr", d_model=32, decoder_layers=1, decoder_ffn_dim=64, decoder_attention_heads=2,
                   encoder_layers=1, encoder_ffn_dim=64, encoder_attention_heads=2)
    config = MaskFormerConfig(backbone_config=swin, decoder_config=decoder, fpn_feature_size=32,
                              mask_feature_size=32, num_queries=8, num_labels=len(SEG_CLASSES), **labels(SEG_CLASSES))
    spread(MaskFormerForInstanceSegmentation(config), 0.5).save_pretrained(folder)
    MaskFormerImageProcessor(size={"height": side, "width": side}, do_reduce_labels=False).save_pretrained(folder)
    return Path(folder)


def gpt2_tokenizer():
    """A byte-level BPE tokenizer of GPT-2's kind built in memory: the 256 byte symbols and ``<|endoftext|>``."""
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import GPT2Tokenizer

    vocab = {symbol: i for i, symbol in enumerate(sorted(ByteLevel.alphabet()))}
    vocab["<|endoftext|>"] = len(vocab)
    return GPT2Tokenizer(vocab=vocab, merges=[])


def save_vit_gpt2(folder: Path, side: int = 64, seed: int = 0) -> Path:
    """A ViT+GPT2 VisionEncoderDecoder captioner as nlpconnect/vit-gpt2-image-captioning is laid out: the model, a
    ViT image processor and GPT-2's tokenizer, no processor; generation starts from, pads with and ends at
    ``<|endoftext|>``."""
    from transformers import GPT2Config, ViTConfig, ViTImageProcessor, VisionEncoderDecoderConfig, \
        VisionEncoderDecoderModel

    _seeded(seed)
    tokenizer = gpt2_tokenizer()
    end = tokenizer.eos_token_id
    encoder = ViTConfig(image_size=side, patch_size=16, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64)
    decoder = GPT2Config(vocab_size=len(tokenizer), n_positions=64, n_embd=32, n_layer=1, n_head=2,
                         bos_token_id=end, eos_token_id=end)
    config = VisionEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    config.decoder_start_token_id = config.pad_token_id = config.eos_token_id = end
    spread(VisionEncoderDecoderModel(config), 0.5).save_pretrained(folder)
    ViTImageProcessor(size={"height": side, "width": side}).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return Path(folder)


def save_zoedepth(folder: Path, side: int = 64, seed: int = 0) -> Path:
    """ZoeDepth over a BEiT backbone (Intel/zoedepth-nyu-kitti's layout), with its image processor."""
    from transformers import BeitConfig, ZoeDepthConfig, ZoeDepthForDepthEstimation, ZoeDepthImageProcessor

    _seeded(seed)
    beit = BeitConfig(image_size=side, patch_size=16, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                      intermediate_size=64, use_relative_position_bias=True, reshape_hidden_states=False,
                      out_features=["stage1", "stage2", "stage3", "stage4"])
    config = ZoeDepthConfig(backbone_config=beit, neck_hidden_sizes=[8, 16, 32, 32], fusion_hidden_size=16,
                            bottleneck_features=16, bin_embedding_dim=16, num_relative_features=8,
                            num_patch_transformer_layers=1, patch_transformer_hidden_size=16,
                            patch_transformer_intermediate_size=32, patch_transformer_num_attention_heads=2)
    ZoeDepthForDepthEstimation(config).save_pretrained(folder)
    ZoeDepthImageProcessor(size={"height": side, "width": side}).save_pretrained(folder)
    return Path(folder)


def save_depth_pro(folder: Path, seed: int = 0) -> Path:
    """DepthPro over DINOv2 image, patch and field-of-view encoders (apple/DepthPro-hf's layout). Its image
    processor needs torchvision even to be built, so its ``preprocessor_config.json`` is written as the hub's
    is."""
    import json

    from transformers import DepthProConfig, DepthProForDepthEstimation, Dinov2Config

    _seeded(seed)
    dinov2 = Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                          image_size=32, patch_size=8)
    config = DepthProConfig(fusion_hidden_size=16, patch_size=32, intermediate_hook_ids=[1, 0],
                            intermediate_feature_dims=[16, 16], scaled_images_feature_dims=[32, 32, 16],
                            image_model_config=dinov2, patch_model_config=dinov2, fov_model_config=dinov2,
                            use_fov_model=True)
    DepthProForDepthEstimation(config).save_pretrained(folder)
    processor = {"image_processor_type": "DepthProImageProcessorFast", "do_resize": True, "do_rescale": True,
                 "do_normalize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                 "rescale_factor": 1 / 255, "resample": 2, "size": {"height": 128, "width": 128}}
    (Path(folder) / "preprocessor_config.json").write_text(json.dumps(processor, indent=2))
    return Path(folder)


def save_with_hub_processor_files(processor, folder: Path) -> None:
    """A processor saved as the hub's captioners have it: the image processor's ``preprocessor_config.json`` and the
    tokenizer's files, each naming the processor class (``processor_class``), and no ``processor_config.json``."""
    import json

    processor.image_processor.save_pretrained(folder)
    processor.tokenizer.save_pretrained(folder)
    for name in ("preprocessor_config.json", "tokenizer_config.json"):
        settings = json.loads((Path(folder) / name).read_text())
        (Path(folder) / name).write_text(json.dumps({**settings, "processor_class": type(processor).__name__}))


def _resnet(*stages: str):
    from transformers import ResNetConfig

    return ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                        out_features=list(stages))


#: the tiny transformer blocks of the DETR family's encoders and decoders
DETR_BLOCKS = dict(encoder_layers=1, encoder_ffn_dim=64, decoder_ffn_dim=64, encoder_attention_heads=2,
                   decoder_attention_heads=2, num_queries=12)


def save_glpn(folder: Path, side: int = 64) -> None:
    from transformers import GLPNConfig, GLPNForDepthEstimation, GLPNImageProcessor

    config = GLPNConfig(depths=[1, 1, 1, 1], sr_ratios=[4, 2, 1, 1], hidden_sizes=[8, 16, 16, 32],
                        num_attention_heads=[1, 1, 1, 2], mlp_ratios=[2, 2, 2, 2], decoder_hidden_size=16)
    GLPNForDepthEstimation(config).save_pretrained(folder)
    GLPNImageProcessor(size_divisor=32).save_pretrained(folder)


def save_depth_anything(folder: Path, side: int = 64, metric: bool = False) -> None:
    """Depth Anything over DINOv2 (v1 and v2 share the architecture; v2's metric models end in a sigmoid scaled to
    ``max_depth``), behind DPT's processor keeping the aspect ratio in multiples of 14 px."""
    from transformers import Dinov2Config, DepthAnythingConfig, DepthAnythingForDepthEstimation, DPTImageProcessor

    dinov2 = Dinov2Config(hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=64,
                          image_size=56, patch_size=14, out_indices=[1, 2, 3, 4], reshape_hidden_states=False)
    kind = dict(depth_estimation_type="metric", max_depth=20) if metric else {}
    config = DepthAnythingConfig(backbone_config=dinov2, reassemble_hidden_size=32, neck_hidden_sizes=[8, 16, 32, 32],
                                 fusion_hidden_size=16, head_hidden_size=8, **kind)
    DepthAnythingForDepthEstimation(config).save_pretrained(folder)
    DPTImageProcessor(size={"height": 56, "width": 56}, keep_aspect_ratio=True, ensure_multiple_of=14,
                      image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225]).save_pretrained(folder)


def save_dpt_hybrid(folder: Path, side: int = 64) -> None:
    """DPT-hybrid: a ViT over BiT's first stages (Intel/dpt-hybrid-midas's layout)."""
    from transformers import BitConfig, DPTConfig, DPTForDepthEstimation, DPTImageProcessor

    bit = BitConfig(global_padding="same", layer_type="bottleneck", depths=[1, 1, 1], hidden_sizes=[8, 16, 32],
                    embedding_size=8, num_groups=4, out_features=["stage1", "stage2", "stage3"],
                    embedding_dynamic_padding=True)
    config = DPTConfig(is_hybrid=True, backbone_config=bit, image_size=side, patch_size=16, hidden_size=32,
                       num_hidden_layers=4, num_attention_heads=2, intermediate_size=64,
                       backbone_out_indices=[0, 1, 2, 3], neck_hidden_sizes=[8, 16, 32, 32], fusion_hidden_size=16,
                       reassemble_factors=[1, 1, 1, 0.5], backbone_featmap_shape=[1, 32, side // 16, side // 16])
    DPTForDepthEstimation(config).save_pretrained(folder)
    DPTImageProcessor(size={"height": side, "width": side}, keep_aspect_ratio=False).save_pretrained(folder)


def save_upernet(folder: Path, side: int = 64) -> None:
    """UperNet over ConvNeXt (openmmlab/upernet-convnext-*'s layout)."""
    from transformers import ConvNextConfig, SegformerImageProcessor, UperNetConfig, UperNetForSemanticSegmentation

    convnext = ConvNextConfig(hidden_sizes=[8, 16, 32, 32], depths=[1, 1, 1, 1],
                              out_features=["stage1", "stage2", "stage3", "stage4"])
    config = UperNetConfig(backbone_config=convnext, hidden_size=16, auxiliary_channels=8, auxiliary_in_channels=32,
                           num_labels=len(SEG_CLASSES), **labels(SEG_CLASSES))
    spread(UperNetForSemanticSegmentation(config), 0.3).save_pretrained(folder)
    SegformerImageProcessor(size={"height": side, "width": side}, do_reduce_labels=False).save_pretrained(folder)


def save_beit(folder: Path, side: int = 64) -> None:
    from transformers import BeitConfig, BeitForSemanticSegmentation, BeitImageProcessor

    config = BeitConfig(image_size=side, patch_size=16, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                        intermediate_size=64, out_indices=[0, 1, 2, 3], use_relative_position_bias=True,
                        pool_scales=[1, 2], auxiliary_channels=8, num_labels=len(SEG_CLASSES), **labels(SEG_CLASSES))
    spread(BeitForSemanticSegmentation(config), 0.1).save_pretrained(folder)
    BeitImageProcessor(size={"height": side, "width": side}, do_center_crop=False,
                       do_reduce_labels=False).save_pretrained(folder)


def save_conditional_detr(folder: Path, side: int = 64) -> None:
    from transformers import ConditionalDetrConfig, ConditionalDetrForObjectDetection, ConditionalDetrImageProcessor

    config = ConditionalDetrConfig(use_timm_backbone=False, backbone_config=_resnet("stage4"), d_model=32,
                                   decoder_layers=1, num_labels=len(COCO_LIKE), **DETR_BLOCKS, **labels(COCO_LIKE))
    spread(ConditionalDetrForObjectDetection(config), 0.3).save_pretrained(folder)
    ConditionalDetrImageProcessor(size={"height": side, "width": side}).save_pretrained(folder)


def save_deformable_detr(folder: Path, side: int = 64) -> None:
    from transformers import DeformableDetrConfig, DeformableDetrForObjectDetection, DeformableDetrImageProcessor

    config = DeformableDetrConfig(use_timm_backbone=False, backbone_config=_resnet("stage2", "stage3", "stage4"),
                                  d_model=32, decoder_layers=2, num_feature_levels=3, encoder_n_points=2,
                                  decoder_n_points=2, num_labels=len(COCO_LIKE), **DETR_BLOCKS, **labels(COCO_LIKE))
    spread(DeformableDetrForObjectDetection(config), 0.3).save_pretrained(folder)
    DeformableDetrImageProcessor(size={"height": side, "width": side}).save_pretrained(folder)


def save_rt_detr_v2(folder: Path, side: int = 64) -> None:
    from transformers import RTDetrImageProcessor, RTDetrResNetConfig, RTDetrV2Config, RTDetrV2ForObjectDetection

    backbone = RTDetrResNetConfig(out_features=["stage2", "stage3", "stage4"], embedding_size=16,
                                  hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1])
    config = RTDetrV2Config(backbone_config=backbone, encoder_hidden_dim=32, encoder_in_channels=[32, 64, 128],
                            d_model=32, decoder_layers=2, decoder_in_channels=[32, 32, 32],
                            num_labels=len(COCO_LIKE), **DETR_BLOCKS, **labels(COCO_LIKE))
    spread(RTDetrV2ForObjectDetection(config), 0.5).save_pretrained(folder)
    RTDetrImageProcessor(size={"height": side, "width": side}).save_pretrained(folder)


def save_dab_detr(folder: Path, side: int = 64) -> None:
    from transformers import ConditionalDetrImageProcessor, DabDetrConfig, DabDetrForObjectDetection

    config = DabDetrConfig(use_timm_backbone=False, backbone_config=_resnet("stage4"), hidden_size=32,
                           decoder_layers=1, num_labels=len(COCO_LIKE), **DETR_BLOCKS, **labels(COCO_LIKE))
    spread(DabDetrForObjectDetection(config), 0.3).save_pretrained(folder)
    ConditionalDetrImageProcessor(size={"height": side, "width": side}).save_pretrained(folder)


def save_git(folder: Path, side: int = 64) -> None:
    """GIT with a WordPiece tokenizer built in memory, its processor files as microsoft/git-base has them."""
    from transformers import BertTokenizer, CLIPImageProcessor, GitConfig, GitForCausalLM, GitProcessor

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *CAPTION_WORDS]
    tokenizer = BertTokenizer(vocab={token: i for i, token in enumerate(vocab)})
    vision = dict(image_size=side, patch_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2)
    config = GitConfig(vision_config=vision, vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1,
                       num_attention_heads=2, intermediate_size=64, bos_token_id=2, eos_token_id=3, pad_token_id=0)
    spread(GitForCausalLM(config), 0.5).save_pretrained(folder)
    images = CLIPImageProcessor(size={"shortest_edge": side}, crop_size={"height": side, "width": side})
    save_with_hub_processor_files(GitProcessor(image_processor=images, tokenizer=tokenizer), folder)


def save_pix2struct(folder: Path, side: int = 64) -> None:
    """Pix2Struct (variable-resolution patches) with a Unigram tokenizer built in memory, its processor files as
    google/pix2struct-textcaps-base has them."""
    from transformers import (Pix2StructConfig, Pix2StructForConditionalGeneration, Pix2StructImageProcessor,
                              Pix2StructProcessor, T5Tokenizer)

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), *(("\u2581" + word, -1.0) for word in CAPTION_WORDS)]
    tokenizer = T5Tokenizer(vocab=pieces, extra_ids=0)
    text = dict(vocab_size=len(pieces), hidden_size=32, d_kv=16, d_ff=64, num_layers=1, num_heads=2)
    vision = dict(hidden_size=32, patch_embed_hidden_size=16 * 16 * 3, d_ff=64, d_kv=16, num_hidden_layers=1,
                  num_attention_heads=2)
    spread(Pix2StructForConditionalGeneration(Pix2StructConfig(text_config=text, vision_config=vision)),
           0.5).save_pretrained(folder)
    images = Pix2StructImageProcessor(max_patches=16, patch_size={"height": 16, "width": 16})
    save_with_hub_processor_files(Pix2StructProcessor(image_processor=images, tokenizer=tokenizer), folder)


def save_blip_hub_layout(folder: Path, side: int = 64) -> None:
    """The tiny BLIP captioner with its processor files as Salesforce/blip-image-captioning-base has them."""
    from transformers import AutoProcessor

    save_random_teacher("hf_caption", folder, side, "tiny", seed=0)
    processor = AutoProcessor.from_pretrained(folder)
    (Path(folder) / "processor_config.json").unlink()
    save_with_hub_processor_files(processor, folder)


#: more families of each teacher, beyond :mod:`~fourm_kfp.testing`'s (tested by
#: tests/labelers/test_teacher_families.py): name -> (labeler, saver)
MORE_FAMILIES = {
    "glpn": ("hf_depth", save_glpn),
    "depth_anything": ("hf_depth", save_depth_anything),
    "depth_anything_metric": ("hf_depth", lambda folder, side: save_depth_anything(folder, side, metric=True)),
    "dpt_hybrid": ("hf_depth", save_dpt_hybrid),
    "upernet": ("hf_semseg", save_upernet),
    "beit": ("hf_semseg", save_beit),
    "conditional_detr": ("hf_det", save_conditional_detr),
    "deformable_detr": ("hf_det", save_deformable_detr),
    "rt_detr_v2": ("hf_det", save_rt_detr_v2),
    "dab_detr": ("hf_det", save_dab_detr),
    "git": ("hf_caption", save_git),
    "pix2struct": ("hf_caption", save_pix2struct),
    "blip_hub_layout": ("hf_caption", save_blip_hub_layout),
}


def save_family(name: str, folder: Path, side: int = 64, seed: int = 0) -> Path:
    """The tiny folder of the :data:`MORE_FAMILIES` family ``name``, its random weights drawn from ``seed``."""
    _seeded(seed)
    MORE_FAMILIES[name][1](Path(folder), side)
    return Path(folder)
