"""Any-to-any with real data: a trained model and its tokenizers, loaded from the model's URI alone.

:class:`AnyToAny` turns modality values (an rgb ``uint8 [H, W, 3]`` array, a depth map in metres, a caption
string, ...) into tokens with the tokenizers the model was trained with, generates targets with
:class:`~fourm_kfp.model.generation.Generator` (one after another, each added to the inputs: a chain), and decodes
generated tokens back to arrays and text. :func:`read_input` and :func:`write_output` are the file side used by
``fourm-kfp generate --model URI --from rgb=photo.png --to depth,caption --out DIR``, whose ``generate.json`` names
the classes of a generated semseg map from the model's vocabulary (its tokenizer bundle's). A feature map (``clip``,
``dinov2``) is written as its shard member (``clip.npy``, float16 ``[grid, grid, channels]``) and a picture of its
principal components, and read back in that format.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from PIL import Image

from fourm_kfp.data.modalities import get_modality
from fourm_kfp.data.modality_visuals import visualize
from fourm_kfp.model.generation import Generated, Generator, SamplingArgs
from fourm_kfp.model.saved_model import load_model, read_weights, snapshot_steps, weights_key
from fourm_kfp.storage import open_store
from fourm_kfp.tokenizers.bundle import load_tokenizers
from fourm_kfp.tokenizers.text_tokenizer import text_eos, text_sentinels


class AnyToAny:
    """A model and its tokenizers. ``device`` defaults to CUDA when there is one."""

    def __init__(self, model_uri: str, device: str | None = None, tokenizers_uri: str | None = None):
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model_store = open_store(model_uri)
        self.model, self.card = load_model(self.model_store, self.device)
        self.tokenizers = load_tokenizers(tokenizers_uri or self.card["tokenizers_uri"], device=str(self.device))
        specials = self.card.get("text_special_ids") or {}
        conventions = self.card.get("text_conventions", "fourm-kfp")  # cards from before it was recorded: ours
        sentinels = text_sentinels(specials, conventions)[:2] if specials else ()
        #: appended to every text input before the cut, as the loader did in training (ml-4m's [EOS])
        self.text_eos = text_eos(specials, conventions) if specials else None
        #: images decoded per modality (:meth:`decode_budget`)
        self.decoded: Counter[str] = Counter()
        pixel_decoders = {s.name: self._counted_decoder(s.name) for s in self.model.args.modalities
                          if s.pixel_input and s.name in self.tokenizers.image}
        self.generator = Generator(self.model, sentinels, pixel_decoders)
        self.specs = self.generator.specs
        image = [n for n, s in self.specs.items() if s.kind == "image" and not get_modality(n).grid_sized]
        #: the side of the model's image-size maps (rgb, depth, ...; a feature map has its grid: :meth:`side`)
        self.image_size = self.tokenizers.image[image[0]].config.image_size if image else 0
        #: the class vocabularies the model's tokenizers were trained with (semseg ids, det names)
        self.vocabularies = self.tokenizers.vocabularies

    @property
    def modalities(self) -> list[str]:
        return list(self.specs)

    def side(self, modality: str) -> int:
        """The side of an image modality's values, its tokenizer's: the model's image size, a feature map's grid."""
        return self.tokenizers.image[modality].config.image_size

    def snapshot_steps(self) -> list[int]:
        """Steps of the model's weight snapshots (``train.snapshot_every``)."""
        return snapshot_steps(self.model_store)

    def use_weights(self, snapshot: int | None) -> None:
        """Generate with the weights of the snapshot at step ``snapshot`` from now on (``None``: the final ones)."""
        self.model.load_state_dict(read_weights(self.model_store, weights_key(snapshot)), strict=True)

    # -- values <-> tokens ---------------------------------------------------------------------------------------

    def tokenize(self, modality: str, values: Sequence[Any]) -> list[np.ndarray]:
        """Token ids of a batch of values of one modality (image grids flattened; text cut to the model's length)."""
        spec = self._spec(modality)
        if spec.kind == "image":
            return list(self.tokenizers.image[modality].encode(np.stack(values)).reshape(len(values), -1).cpu()
                        .numpy())
        if self.tokenizers.text is None:
            raise ValueError("the tokenizer bundle has no text tokenizer")
        ids = [self.tokenizers.text.encode(str(v)).ids for v in values]
        if self.text_eos is not None:
            ids = [t + [self.text_eos] if t else t for t in ids]
        return [np.asarray(t[: spec.max_length - 2], np.int64) for t in ids]

    def _counted_decoder(self, modality: str):
        decode = self.tokenizers.image[modality].decode

        def counted(grids):
            self.decoded[modality] += len(grids)
            return decode(grids)

        return counted

    def decode_budget(self) -> dict[str, dict[str, Any]]:
        """Per image modality decoded so far: images, the decoder's kind, its passes per image and their product."""
        budget = {}
        for modality, images in sorted(self.decoded.items()):
            tokenizer = self.tokenizers.image[modality]
            passes = int(getattr(tokenizer, "decoder_passes", 1))
            budget[modality] = {"images": images, "decoder": getattr(tokenizer, "decoder_kind", "VQ-VAE"),
                                "passes_per_image": passes, "decoder_passes": images * passes}
        return budget

    def detokenize(self, modality: str, tokens: Sequence[np.ndarray]) -> list[Any]:
        """Arrays (image modalities, through their tokenizer's decoder) or strings (text) from token ids."""
        spec = self._spec(modality)
        if spec.kind == "image":
            grids = torch.as_tensor(np.stack([np.asarray(t, dtype=np.int64).reshape(spec.grid) for t in tokens]))
            return list(self._counted_decoder(modality)(grids))
        return [self.tokenizers.text.decode([int(i) for i in t]) for t in tokens]

    def _spec(self, modality: str):
        if modality not in self.specs:
            raise ValueError(f"the model has no modality {modality!r}; it knows {sorted(self.specs)}")
        return self.specs[modality]

    # -- generation ----------------------------------------------------------------------------------------------

    def generate_tokens(self, inputs: Sequence[Mapping[str, np.ndarray]], target: str, sampling: SamplingArgs,
                        seed: int = 0, batch_size: int = 32) -> list[Generated]:
        """Generated tokens of ``target`` for token inputs, ``batch_size`` samples at a time."""
        out: list[Generated] = []
        for start in range(0, len(inputs), batch_size):
            out += self.generator.generate(list(inputs[start:start + batch_size]), target, sampling, seed + start)
        return out

    def generate(self, inputs: Sequence[Mapping[str, Any]], targets: Sequence[str],
                 sampling: SamplingArgs = SamplingArgs(temperature=0.0), seed: int = 0,
                 batch_size: int = 32) -> list[dict[str, Any]]:
        """Decoded ``targets`` for samples of values, generated in order (a chain: each joins the inputs)."""
        names = sorted({k for s in inputs for k in s})
        tokens: list[dict[str, np.ndarray]] = [{} for _ in inputs]
        for name in names:
            rows = [i for i, s in enumerate(inputs) if name in s]
            for i, t in zip(rows, self.tokenize(name, [inputs[i][name] for i in rows])):
                tokens[i][name] = t
                if self._spec(name).pixel_input:
                    tokens[i]["pixels"] = np.asarray(inputs[i][name])
        outputs: list[dict[str, Any]] = [{} for _ in inputs]
        for step, target in enumerate(targets):
            generated = self.generate_tokens(tokens, target, sampling, seed + 1000 * step, batch_size)
            for i, (g, value) in enumerate(zip(generated, self.detokenize(target, [g.tokens for g in generated]))):
                tokens[i][target] = g.tokens.reshape(-1)
                if self._spec(target).pixel_input:  # the next step reads the generated image as pixels
                    tokens[i]["pixels"] = value
                outputs[i][target] = value
        return outputs

    def token_inputs(self, modality: str, tokens: Sequence[np.ndarray], values: Sequence[Any] | None = None
                     ) -> list[dict[str, np.ndarray]]:
        """Generator inputs of one modality: its tokens, plus the pixels when the model reads it as pixels."""
        pixels = self._spec(modality).pixel_input and values is not None
        return [{modality: t, **({"pixels": np.asarray(v)} if pixels else {})}
                for t, v in zip(tokens, values if pixels else [None] * len(tokens))]


def read_input(modality: str, value: str, image_size: int) -> Any:
    """A ``--from`` value: a text file or the text itself for a sequence modality; for an image modality a file,
    any picture resized to ``image_size`` for a camera image (``camera_image`` in the modality table), else the
    modality's shard format with sides of ``image_size`` (:meth:`AnyToAny.side`: the model's image size, a feature
    map's grid)."""
    info = get_modality(modality)
    path = Path(value)
    if info.kind == "sequence":
        return path.read_text().strip() if path.is_file() else value
    if not path.is_file():
        raise FileNotFoundError(f"--from {modality}={value}: no such file")
    return decode_input(modality, path.read_bytes(), image_size, f"--from {modality}={value}")


def decode_input(modality: str, data: bytes, image_size: int, where: str) -> Any:
    """An input value from the bytes of its file (:func:`read_input`'s reading; ``where`` names the input in
    errors): UTF-8 text for a sequence modality, any picture for a camera image (resized to ``image_size``), else
    the modality's shard format with sides of ``image_size``."""
    info = get_modality(modality)
    if info.kind == "sequence":
        return data.decode().strip()
    if info.camera_image:
        image = Image.open(io.BytesIO(data)).convert("RGB")
        if image.size != (image_size, image_size):
            image = image.resize((image_size, image_size), Image.BICUBIC)
        return np.asarray(image)
    array = info.decode(data)
    if array.shape[:2] != (image_size, image_size):
        unit = "cells" if info.grid_sized else "px"
        raise ValueError(f"{where}: {array.shape[0]} x {array.shape[1]} {unit}, the model needs "
                         f"{image_size} x {image_size} {unit}")
    return array


def encode_output(modality: str, value: Any) -> tuple[str, bytes]:
    """``(extension, bytes)`` of a generated value as :func:`write_output` writes its ``<modality>.<extension>``:
    text as UTF-8 with a final newline (``txt``), an image modality in its shard format."""
    info = get_modality(modality)
    if info.kind == "sequence":
        return "txt", (str(value) + "\n").encode()
    return info.ext, info.encode(value)


def write_output(out_dir: Path, modality: str, value: Any, size: int = 256) -> list[Path]:
    """Write one generated value: text as ``<modality>.txt``; an image modality in its shard format
    (``<modality>.<ext>``) and as a picture (``<modality>_view.png``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    ext, data = encode_output(modality, value)
    path = out_dir / f"{modality}.{ext}"
    path.write_bytes(data)
    if get_modality(modality).kind == "sequence":
        return [path]
    view = out_dir / f"{modality}_view.png"
    Image.fromarray(visualize(modality, value, size)).save(view)
    return [path, view]


def class_legend(ids: np.ndarray, vocabulary: Sequence[str]) -> dict[str, str]:
    """``{id: class name}`` of the ids a class map holds (the model's vocabulary; ``class_<id>`` beyond it)."""
    return {str(i): vocabulary[i] if i < len(vocabulary) else f"class_{i}" for i in np.unique(ids).tolist()}


def run_generate(model_uri: str, inputs: Mapping[str, str], targets: Sequence[str], out_dir: str,
                 sampling: SamplingArgs, seed: int = 0, device: str | None = None) -> dict[str, Any]:
    """The ``generate`` command: read the inputs, generate the chain of targets, write them; returns a summary."""
    engine = AnyToAny(model_uri, device)
    unknown = sorted((set(inputs) | set(targets)) - set(engine.modalities))
    if unknown:
        raise ValueError(f"the model at {model_uri} has no modality {unknown}; it knows {engine.modalities}")
    sample = {name: read_input(name, value, engine.side(name) if name in engine.tokenizers.image else 0)
              for name, value in inputs.items()}
    [generated] = engine.generate([sample], targets, sampling, seed)
    written = {name: [str(p) for p in write_output(Path(out_dir), name, value)] for name, value in generated.items()}
    summary = {"model": model_uri, "inputs": dict(inputs), "targets": list(targets), "written": written,
               "text": {k: v for k, v in generated.items() if isinstance(v, str)}}
    legends = {name: class_legend(value, engine.vocabularies[name]) for name, value in generated.items()
               if name in engine.vocabularies and not isinstance(value, str)}
    if legends:
        summary["classes"] = legends
    (Path(out_dir) / "generate.json").write_text(json.dumps(summary, indent=2))
    return summary
