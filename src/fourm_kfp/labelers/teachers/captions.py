"""Captions from transformers' image-to-text networks (BLIP, GIT, Pix2Struct, VisionEncoderDecoder such as
ViT+GPT2, ...), for the photos that came without text.

4M-21 trains on a dataset's own alt-text; a teacher fills in only the photos that have none. Config:
``name: hf_caption``, ``weights``: the model folder (with its processor and tokenizer), ``params``: ``prompt``
(default none: text the caption starts from, as BLIP's conditional captioning takes; it stays in the caption),
``max_new_tokens`` (default 30), ``num_beams`` (default 1: greedy), ``bf16`` (default true). Decoding is greedy or
beam search, never sampled, so captions are deterministic. The labeler runs even where the prepared data holds
captions (:attr:`~fourm_kfp.labelers.base.Labeler.fills_gaps`): a photo with its own caption gets that text back,
unchanged (the label layer's captions of a shard replace the prepared data's when the dataset is read as one, so they
must hold every photo's), and only the others are captioned.

A folder with a processor (``processor_config.json``, or a processor named in its pre-processor's config) is read
through it. A folder with only an image processor and a tokenizer, the common layout of VisionEncoderDecoder
captioners (ViT+GPT2), is read through the two: the image processor makes the network's inputs and the tokenizer
decodes the captions, as transformers' own ``generate`` and ``batch_decode`` do; such a folder takes no ``prompt``.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from fourm_kfp.labelers.base import LabelBatch, LabelerError, LabelerSetup, check_labels
from fourm_kfp.labelers.teachers.loading import TransformersTeacher, auto_model_types, load_processor


def is_tokenizer(processor: Any) -> bool:
    """Whether what AutoProcessor loaded is a tokenizer alone (a folder with no processor)."""
    from transformers import PreTrainedTokenizerBase

    return isinstance(processor, PreTrainedTokenizerBase)


class CaptionTeacher(TransformersTeacher):
    name: ClassVar[str] = "hf_caption"
    version: ClassVar[str] = "1"
    modality = "caption"
    fills_gaps: ClassVar[bool] = True
    model_class: ClassVar[str] = "AutoModelForImageTextToText"
    processor_class: ClassVar[str] = "AutoProcessor"
    reads_models: ClassVar[str] = "image-text-to-text models"
    defaults: ClassVar[Mapping[str, Any]] = {"prompt": "", "max_new_tokens": 30, "num_beams": 1, "bf16": True}

    def __init__(self, setup: LabelerSetup) -> None:
        super().__init__(setup)
        self.check_number("max_new_tokens", 1, 512, integer=True)
        self.check_number("num_beams", 1, 16, integer=True)
        if not isinstance(self.params["prompt"], str):
            raise LabelerError(f"labeler {self.name!r}: param 'prompt' must be a string")
        #: what decodes the generated ids: the processor, or a tokenizer-only folder's tokenizer
        self.decoder = self.processor
        if is_tokenizer(self.processor):  # no processor in the folder: AutoProcessor gave its tokenizer
            with self._loading("AutoImageProcessor"):
                self.processor = load_processor(self.folder, setup.weights_digest, "AutoImageProcessor")
            if self.params["prompt"]:
                raise LabelerError(f"labeler {self.name!r}: {self.folder} holds an image processor and a tokenizer, "
                                   "no processor: its captions start from the model's own first token, so it "
                                   "takes no 'prompt'")

    def accepted_model_types(self) -> frozenset[str]:
        return auto_model_types("MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES")

    def predict(self, batch: LabelBatch) -> list[str]:
        """The generated caption of every photo of the batch (decoded, special tokens removed, stripped)."""
        prompt = self.params["prompt"]
        extra = {"text": [prompt] * len(batch)} if prompt else {}
        with self.running():
            ids = self.model.generate(**self.inputs(batch, **extra), max_new_tokens=int(self.params["max_new_tokens"]),
                                      num_beams=int(self.params["num_beams"]), do_sample=False)
        return [text.strip() for text in self.decoder.batch_decode(ids.cpu(), skip_special_tokens=True)]

    def label(self, batch: LabelBatch) -> list[Any]:
        lacking = [i for i, caption in enumerate(batch.captions) if not caption]
        values: list[Any] = list(batch.captions)
        if lacking:
            made = self.predict(LabelBatch(tuple(batch.keys[i] for i in lacking),
                                           tuple(batch.images[i] for i in lacking)))
            for i, text in zip(lacking, made):
                values[i] = text or None
        return check_labels(self, batch, values)
