"""Loading a transformers teacher from its model folder, and running a batch of photos through it.

:class:`TransformersTeacher` is the base of the built-in teachers. Its weights are a folder as ``save_pretrained``
writes it (the config, safetensors weights, the pre-processor's and tokenizer's files), fetched and hashed by
:mod:`fourm_kfp.labelers.weights`; the network and its pre-processor are built from that folder alone
(``local_files_only``: nothing is looked up on a hub), once per process and device (:func:`load_model`), shared by
every labeler that reads the same folder. Building a teacher checks the folder first, so a folder it cannot read
fails there, once, naming the labeler, the folder and its model type (:func:`read_config`,
:meth:`TransformersTeacher.check_model_type`):

* its ``model_type`` must be one the teacher reads (:meth:`TransformersTeacher.accepted_model_types`: the model
  types of the transformers auto class it loads, e.g. depth estimation for ``hf_depth``);
* a model type whose image processor needs torchvision is refused where torchvision is not installed (the
  project's environment and images have none: PyPI's torchvision wheel is built for CUDA and cannot load beside the
  CPU torch; :func:`needs_torchvision`), e.g. ZoeDepth and DepthPro;
* a config that names a backbone by name instead of holding its config is refused (:func:`check_backbones`):
  transformers would resolve the name on the hub or through timm. A sub-config the model never builds a backbone
  from is not read (:data:`UNBUILT_SUBCONFIGS`: MaskFormer's ``decoder_config``, a DETR config of which MaskFormer
  builds only the decoder, where transformers writes DETR's default backbone name).

A batch is pre-processed by the folder's own processor in one call, run through one forward on the device (bf16
autocast on a GPU unless ``bf16: false``), post-processed on the device by the processor's own post-processing, and
moved to the host once per batch: each teacher's :meth:`~TransformersTeacher.predict` equals transformers' own
pipeline for the same network and images (the tests check it), and :meth:`~fourm_kfp.labelers.base.Labeler.label`
turns those predictions into the modality's values.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
from pathlib import Path
from typing import Any, ClassVar, Iterator, Mapping

import numpy as np

from fourm_kfp.labelers.base import LabelBatch, Labeler, LabelerError, LabelerSetup


#: model type -> the keys of its config that hold a sub-config the model never builds a backbone from
UNBUILT_SUBCONFIGS: dict[str, tuple[str, ...]] = {"maskformer": ("decoder_config",)}

#: model types whose PIL image processor still calls torchvision (ZoeDepth's post-processing resizes with it)
PIL_PROCESSORS_NEEDING_TORCHVISION = frozenset({"zoedepth"})


def _backbone_by_name(config: Any, path: str = "config", skip: tuple[str, ...] = ()) -> str | None:
    """Where in a config dict a backbone is named (``backbone: <name>``) with no ``backbone_config``, else None;
    the keys in ``skip`` are not read."""
    if isinstance(config, Mapping):
        named = config.get("backbone")
        if isinstance(named, str) and named and not config.get("backbone_config"):
            return f"{path}.backbone = {named!r}"
        for key, value in config.items():
            found = None if key in skip else _backbone_by_name(value, f"{path}.{key}")
            if found:
                return found
    return None


def read_config(folder: str, where: str) -> dict[str, Any]:
    """The folder's ``config.json``, with a ``model_type``."""
    config_file = Path(folder) / "config.json"
    if not config_file.is_file():
        raise LabelerError(f"{where}: {folder} holds no config.json: not a model folder as save_pretrained writes it")
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as exc:
        raise LabelerError(f"{where}: {config_file} is not JSON: {exc}") from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise LabelerError(f"{where}: {config_file} has no model_type: not a transformers model config")
    return config


def check_backbones(config: Mapping[str, Any], folder: str, where: str) -> None:
    """Refuse a config that names a backbone by name with no ``backbone_config`` where the model builds it."""
    named = _backbone_by_name(config, skip=UNBUILT_SUBCONFIGS.get(config["model_type"], ()))
    if named:
        raise LabelerError(f"{where}: {Path(folder) / 'config.json'} names its backbone by name ({named}) with no "
                           "backbone_config: transformers would look that name up on a hub or in timm; save the "
                           "model with its backbone's config object (backbone_config=...) instead")


def torchvision_available() -> bool:
    """Whether torchvision can be imported here."""
    return importlib.util.find_spec("torchvision") is not None


def needs_torchvision(model_type: str) -> bool:
    """Whether the image processor of ``model_type`` needs torchvision and it is not installed: transformers has
    only a torchvision processor for it, or its PIL processor calls torchvision
    (:data:`PIL_PROCESSORS_NEEDING_TORCHVISION`)."""
    if torchvision_available():
        return False
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES

    backends = IMAGE_PROCESSOR_MAPPING_NAMES.get(model_type)
    no_pil_processor = isinstance(backends, Mapping) and "pil" not in backends
    return no_pil_processor or model_type in PIL_PROCESSORS_NEEDING_TORCHVISION


def auto_model_types(*mappings: str) -> frozenset[str]:
    """The model types of transformers' auto mappings named (``modeling_auto``'s ``*_MAPPING_NAMES``)."""
    from transformers.models.auto import modeling_auto

    return frozenset(t for name in mappings for t in getattr(modeling_auto, name))


def _quiet_transformers() -> Any:
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return transformers


def _model_class(model_class: str | type) -> Any:
    return getattr(_quiet_transformers(), model_class) if isinstance(model_class, str) else model_class


@functools.lru_cache(maxsize=8)
def load_processor(folder: str, digest: str | None, processor_class: str) -> Any:
    """The folder's pre-processor (and tokenizer), one per process (``digest`` keys the cache)."""
    return getattr(_quiet_transformers(), processor_class).from_pretrained(folder, local_files_only=True)


@functools.lru_cache(maxsize=8)
def load_model_config(folder: str, digest: str | None, model_class: str | type) -> Any:
    """The config object the model class builds from the folder (no weights read): for a vision tower inside a
    whole CLIP folder, the tower's."""
    transformers = _quiet_transformers()
    config_class = getattr(_model_class(model_class), "config_class", None) or transformers.AutoConfig
    return config_class.from_pretrained(folder, local_files_only=True)


@functools.lru_cache(maxsize=8)
def load_model(folder: str, digest: str | None, model_class: str | type, device: str) -> Any:
    """The folder's network in eval mode on ``device``, one per process and device (``digest`` keys the cache, so
    changed weights load again). ``model_class`` is a transformers class's name, or a class."""
    model = _model_class(model_class).from_pretrained(folder, local_files_only=True)
    return model.eval().to(device)


class TransformersTeacher(Labeler):
    """A built-in teacher read from a transformers model folder (see the module docstring). Subclasses set
    ``model_class`` / ``processor_class`` (transformers' names), or choose them from the folder's config in
    :meth:`classes_for` (which may give a model class of its own), and implement :meth:`predict` and
    :meth:`label`. Every teacher takes the param ``bf16`` (default true: bf16 autocast on a GPU; fp32 on the CPU
    always). Building one reads the folder's configs and pre-processor only; the network loads when it is first
    used, so a step that only needs a teacher's vocabulary or settings (the label stage's collect step) never
    loads it."""

    needs_weights: ClassVar[bool] = True
    wants_accelerator: ClassVar[bool] = True
    weights_kind: ClassVar[str] = "folder"
    model_class: ClassVar[str] = ""
    processor_class: ClassVar[str] = "AutoImageProcessor"
    #: what the teacher reads, in words, for errors ("depth-estimation models")
    reads_models: ClassVar[str] = "transformers models"

    def __init__(self, setup: LabelerSetup) -> None:
        super().__init__(setup)
        if not isinstance(self.params["bf16"], bool):
            raise LabelerError(f"labeler {self.name!r}: param 'bf16' must be true or false, got {self.params['bf16']!r}")
        self.folder = str(setup.weights_path)
        where = f"labeler {self.name!r}"
        self.config = read_config(self.folder, where)
        self.check_model_type(self.config["model_type"])
        check_backbones(self.config, self.folder, where)
        self._model_class, processor_class = self.classes_for(self.config)
        self.device = setup.device
        with self._loading(processor_class):
            self.processor = load_processor(self.folder, setup.weights_digest, processor_class)
            self.model_config = load_model_config(self.folder, setup.weights_digest, self._model_class)

    @contextlib.contextmanager
    def _loading(self, what: Any) -> Iterator[None]:
        try:
            yield
        except (OSError, ValueError, KeyError, ImportError, AttributeError) as exc:
            name = getattr(what, "__name__", what)
            raise LabelerError(f"labeler {self.name!r}: cannot load {name} from {self.folder}: "
                               f"{type(exc).__name__}: {exc}") from None

    @property
    def model(self) -> Any:
        """The network, loaded on first use."""
        with self._loading(self._model_class):
            return load_model(self.folder, self.setup.weights_digest, self._model_class, self.device)

    def accepted_model_types(self) -> frozenset[str] | None:
        """The config model types this teacher reads, before :func:`needs_torchvision` removes some; None: any."""
        return None

    def check_model_type(self, model_type: str) -> None:
        """Refuse, naming the labeler, the folder and what it reads, a model type it does not read or whose
        image processor needs the torchvision this environment lacks."""
        accepted = self.accepted_model_types()
        if accepted is None:
            return
        refused = {t for t in accepted if needs_torchvision(t)}
        reads = ", ".join(sorted(accepted - refused))
        if model_type not in accepted:
            raise LabelerError(f"labeler {self.name!r}: {self.folder} holds a {model_type!r} model (its config.json's "
                               f"model_type), which {self.name} does not read: it reads {self.reads_models} of the "
                               f"types {reads}")
        if model_type in refused:
            raise LabelerError(f"labeler {self.name!r}: {self.folder} holds a {model_type!r} model, whose image "
                               "processor needs torchvision, which this environment does not have (PyPI's "
                               "torchvision wheel is built for CUDA and cannot load beside the CPU torch of the "
                               f"teachers extra); {self.name} reads {self.reads_models} of the types {reads}")

    def classes_for(self, config: Mapping[str, Any]) -> tuple[str | type, str]:
        """The model class (a transformers name, or a class) and processor class name that read this folder."""
        return self.model_class, self.processor_class

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """No gradients, and bf16 autocast on a GPU (``bf16`` param)."""
        import torch

        autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if self.device.startswith("cuda")
                    and self.params["bf16"] else contextlib.nullcontext())
        with torch.inference_mode(), autocast:
            yield

    def inputs(self, batch: LabelBatch, **extra: Any) -> dict[str, Any]:
        """The batch pre-processed by the folder's processor in one call, on the device."""
        encoded = self.processor(images=list(batch.images), return_tensors="pt", **extra)
        return {k: v.to(self.device, non_blocking=True) if hasattr(v, "to") else v for k, v in encoded.items()}

    def forward(self, batch: LabelBatch) -> Any:
        """The network's outputs for the batch (one forward)."""
        with self.running():
            return self.model(**self.inputs(batch))

    @staticmethod
    def target_sizes(batch: LabelBatch) -> list[tuple[int, int]]:
        """``(height, width)`` of each photo: what post-processing resizes back to."""
        return [tuple(image.shape[:2]) for image in batch.images]

    def predict(self, batch: LabelBatch) -> Any:
        """transformers' own post-processed predictions for the batch, on the host."""
        raise NotImplementedError


def host(tensors: list[Any]) -> list[np.ndarray]:
    """Tensors of one batch moved to the host with one transfer (float32 for floating point)."""
    import torch

    if not tensors:
        return []
    sizes = [t.numel() for t in tensors]
    shapes = [tuple(t.shape) for t in tensors]
    floating = tensors[0].is_floating_point()
    flat = torch.cat([(t.float() if floating else t).reshape(-1) for t in tensors]).cpu().numpy()
    out, start = [], 0
    for size, shape in zip(sizes, shapes):
        out.append(flat[start:start + size].reshape(shape))
        start += size
    return out
