"""Loading a transformers teacher from its model folder, and running a batch of photos through it.

:class:`TransformersTeacher` is the base of the built-in teachers. Its weights are a folder as ``save_pretrained``
writes it (the config, safetensors weights, the pre-processor's and tokenizer's files), fetched and hashed by
:mod:`fourm_kfp.labelers.weights`; the network and its pre-processor are built from that folder alone
(``local_files_only``: nothing is looked up on a hub), once per process and device (:func:`load_model`), shared by
every labeler that reads the same folder. A folder whose config names a backbone by name instead of holding its
config is refused (:func:`check_folder`): transformers would resolve the name on the hub or through timm.

A batch is pre-processed by the folder's own processor in one call, run through one forward on the device (bf16
autocast on a GPU unless ``bf16: false``), post-processed on the device by the processor's own post-processing, and
moved to the host once per batch: each teacher's :meth:`~TransformersTeacher.predict` equals transformers' own
pipeline for the same network and images (the tests check it), and :meth:`~fourm_kfp.labelers.base.Labeler.label`
turns those predictions into the modality's values.
"""

from __future__ import annotations

import contextlib
import functools
import json
from pathlib import Path
from typing import Any, ClassVar, Iterator, Mapping

import numpy as np

from fourm_kfp.labelers.base import LabelBatch, Labeler, LabelerError, LabelerSetup


def _backbone_by_name(config: Any, path: str = "config") -> str | None:
    """Where in a config dict a backbone is named (``backbone: <name>``) with no ``backbone_config``, else None."""
    if isinstance(config, Mapping):
        named = config.get("backbone")
        if isinstance(named, str) and named and not config.get("backbone_config"):
            return f"{path}.backbone = {named!r}"
        for key, value in config.items():
            found = _backbone_by_name(value, f"{path}.{key}")
            if found:
                return found
    return None


def check_folder(folder: str, where: str) -> dict[str, Any]:
    """The folder's ``config.json``, after checking the folder is a transformers model that builds offline."""
    config_file = Path(folder) / "config.json"
    if not config_file.is_file():
        raise LabelerError(f"{where}: {folder} holds no config.json: not a model folder as save_pretrained writes it")
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as exc:
        raise LabelerError(f"{where}: {config_file} is not JSON: {exc}") from None
    named = _backbone_by_name(config)
    if named:
        raise LabelerError(f"{where}: {config_file} names its backbone by name ({named}) with no backbone_config: "
                           "transformers would look that name up on a hub or in timm; save the model with its "
                           "backbone's config object (backbone_config=...) instead")
    return config


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

    def __init__(self, setup: LabelerSetup) -> None:
        super().__init__(setup)
        if not isinstance(self.params["bf16"], bool):
            raise LabelerError(f"labeler {self.name!r}: param 'bf16' must be true or false, got {self.params['bf16']!r}")
        self.folder = str(setup.weights_path)
        self.config = check_folder(self.folder, f"labeler {self.name!r}")
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
