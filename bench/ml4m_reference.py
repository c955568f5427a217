"""apple/ml-4m's model code loaded from a checkout (``--reference PATH`` / ``$FOURM_REFERENCE``), never vendored, and
our masked batches written in its input format (:func:`ml4m_batch`) and ml-4m's read in ours (:func:`ours_from_ml4m`).
Shared by ``bench/reference_compare.py`` (train-step speed), ``bench/ml4m_compare.py`` (our converter against ml-4m's
``FM``), ``bench/ml4m_fm_reference.py`` and ``tests/model/test_ml4m.py`` (ml-4m's ``UnifiedMasking`` batches, which
:func:`ours_from_ml4m` reads without ml-4m).

ml-4m's package ``__init__`` files import its whole data pipeline (torchvision, OpenCV, albumentations, boto3,
webdataset, wandb, ...), none of which the model needs, so :func:`load_reference` registers the packages without
running those files and imports the real model modules (``fourm.models.fm``, ``fm_utils``,
``encoder_embeddings``, ``decoder_embeddings``, ``utils.timm.registry``, ``utils.optim_factory``). ``fm.py``'s
``from fourm.data.modality_info import MODALITY_INFO``: with ``modality_info="real"`` the real module runs (its
embedding partials are what ``FM(config)`` builds from; its ``id``s come from the real ``fourm.utils.misc``); the
data transforms it instantiates (``fourm.data.modality_transforms``: OpenCV, albumentations, torchvision) are
replaced by inert stand-ins when their imports fail, and so is ``torchvision.transforms.functional`` for
``misc.py`` when torchvision cannot load (a CUDA-only wheel on a CPU machine): :data:`STAND_INS` lists what was
replaced. With ``"stub"`` (the speed bench: the ``FourM`` class takes ``modality_info`` as an argument) it is an
empty dict. ``fm.py``'s ``random.sample(dict.items(), n)`` (a ``TypeError`` since Python 3.11) gets 3.10's
behaviour, the same shuffle of the modality order.
"""

from __future__ import annotations

import importlib
import os
import random
import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Sequence

import numpy as np
import torch

from fourm_kfp.batch import normalised_pixels

#: modules replaced by stand-ins in this process (empty: everything ml-4m's model code imports is its own)
STAND_INS: list[str] = []


def reference_path(given: str | None = None) -> Path | None:
    """The ml-4m checkout: ``given``, else ``$FOURM_REFERENCE``, else ``/tmp/ml-4m`` when present."""
    path = given or os.environ.get("FOURM_REFERENCE") or ("/tmp/ml-4m" if Path("/tmp/ml-4m/fourm").is_dir() else "")
    return Path(path) if path and (Path(path) / "fourm" / "models" / "fm.py").is_file() else None


def _stand_in(name: str, names: Sequence[str] = ()) -> types.ModuleType:
    """An inert module ``name`` whose ``names`` are classes that accept anything and do nothing."""
    module = types.ModuleType(name)
    for attr in names:
        setattr(module, attr, type(attr, (), {"__init__": lambda self, *a, **k: None}))
    sys.modules[name] = module
    STAND_INS.append(name)
    return module


def _package(name: str, path: Path) -> types.ModuleType:
    package = types.ModuleType(name)
    package.__path__ = [str(path / name.replace(".", "/"))]
    sys.modules[name] = package
    return package


def load_reference(path: Path, modality_info: str = "stub") -> SimpleNamespace:
    """``fourm.models.fm`` and its model submodules from an ml-4m checkout (see the module docstring)."""
    for name in ("fourm", "fourm.models", "fourm.utils", "fourm.utils.timm", "fourm.data"):
        _package(name, path)
    if modality_info == "real":
        try:
            import torchvision.transforms.functional  # noqa: F401
        except Exception:  # noqa: BLE001 - an import that fails for any reason gets the stand-in
            _stand_in("torchvision")
            _stand_in("torchvision.transforms")
            _stand_in("torchvision.transforms.functional")
        misc = importlib.import_module("fourm.utils.misc")
        utils = sys.modules["fourm.utils"]
        utils.to_2tuple, utils.generate_uint15_hash = misc.to_2tuple, misc.generate_uint15_hash
        try:
            if "torchvision" in STAND_INS:  # the transforms build torchvision pipelines when instantiated
                raise ImportError("torchvision is a stand-in")
            importlib.import_module("fourm.data.modality_transforms")
        except Exception:  # noqa: BLE001
            source = (path / "fourm/data/modality_info.py").read_text()
            start = source.index("from fourm.data.modality_transforms import (")
            names = source[start:source.index(")", start)].split("(", 1)[1].replace("\n", " ").split(",")
            sys.modules.pop("fourm.data.modality_transforms", None)
            _stand_in("fourm.data.modality_transforms", [n.strip() for n in names if n.strip()])
        importlib.import_module("fourm.data.modality_info")
    else:
        info = types.ModuleType("fourm.data.modality_info")
        info.MODALITY_INFO = {}  # imported at fm.py's top, never read by the FourM class
        sys.modules["fourm.data.modality_info"] = info
    fm = importlib.import_module("fourm.models.fm")
    # ml-4m's modules hold what they imported; a torchvision stand-in left in sys.modules would make the rest of the
    # process (transformers, diffusers: find_spec) take it for torchvision
    for name in [n for n in STAND_INS if n.split(".")[0] == "torchvision"]:
        sys.modules.pop(name, None)
    compat = types.ModuleType("random_sample_of_views")
    compat.__dict__.update(random.__dict__)
    compat.sample = lambda population, k, **kw: random.sample(tuple(population), k, **kw)
    fm.random = compat
    return SimpleNamespace(fm=fm, path=path,
                           enc=importlib.import_module("fourm.models.encoder_embeddings"),
                           dec=importlib.import_module("fourm.models.decoder_embeddings"),
                           optim=importlib.import_module("fourm.utils.optim_factory"),
                           checkpoint=_checkpoint_module(path) if modality_info == "real" else None)


def _checkpoint_module(path: Path):
    """``fourm.utils.checkpoint`` (``load_safetensors``); its ``dist``/``timm.model``/``s3_utils`` imports pull in
    boto3 and more, which loading a file does not use: stand-ins when they fail to import."""
    for name in ("fourm.utils.dist", "fourm.utils.timm.model", "fourm.utils.s3_utils"):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001
            sys.modules.pop(name, None)
            module = _stand_in(name)
            for attr in ("save_on_main", "is_main_process", "get_state_dict", "save_on_s3"):
                setattr(module, attr, lambda *a, **k: None)
    return importlib.import_module("fourm.utils.checkpoint")


def ml4m_batch(samples, raw: Sequence[dict], specs, domains: dict[str, tuple[str | None, str | None]],
               seq_len: int) -> dict[str, dict[str, torch.Tensor]]:
    """Our masked samples (:func:`fourm_kfp.masking.multimodal_masking.mask_sample`) in ml-4m's
    ``UnifiedMasking`` output format (``True`` in a mask = not used), collated: per domain ``tensor`` /
    ``input_mask`` / ``target_mask`` / ``decoder_attention_mask``. ``raw[i]`` holds sample ``i``'s token grids;
    ``domains[name] = (encoder domain, decoder domain)`` (a pixel modality: ``rgb@224`` and ``tok_rgb@224``, the
    pixels from ``sample.pixels``); ``seq_len``: the length of a text domain's tensor (ml-4m: ``(max_tokens + 1) *
    2``). A text's input ids come first, then its target sequence (``n`` decoder slots are ``n + 1`` ids, as ml-4m's
    decoder shifts it)."""
    out: dict[str, dict[str, list]] = {}
    index = {s.name: i for i, s in enumerate(specs)}

    def add(domain: str, *values) -> None:
        entry = out.setdefault(domain, {"tensor": [], "input_mask": [], "target_mask": [],
                                        "decoder_attention_mask": []})
        for key, value in zip(("tensor", "input_mask", "target_mask", "decoder_attention_mask"), values):
            entry[key].append(value)

    for sample, tokens in zip(samples, raw):
        enc = {name: [(t, p) for t, m, p in sample.enc.tolist() if m == i] for name, i in index.items()}
        dec = {name: [(x, y, p) for x, y, m, p in sample.dec.tolist() if m == i] for name, i in index.items()}
        for spec in specs:
            enc_domain, dec_domain = domains[spec.name]
            if spec.kind == "image":
                n = spec.grid[0] * spec.grid[1]
                grid = torch.from_numpy(np.asarray(tokens[spec.name]).reshape(-1))

                def image(values, inputs, targets):
                    input_mask, target_mask = torch.ones(n, dtype=torch.bool), torch.ones(n, dtype=torch.bool)
                    input_mask[list(inputs)] = False
                    target_mask[list(targets)] = False
                    attention = torch.zeros(n, dtype=torch.int)
                    if targets:
                        attention[int(torch.nonzero(~target_mask)[0])] = len(targets)
                    return values, input_mask, target_mask, attention

                inputs = [p for _, p in enc[spec.name]]
                targets = [p for _, _, p in dec[spec.name]]
                if spec.pixel_input:
                    pixels = torch.from_numpy(np.ascontiguousarray(
                        normalised_pixels(sample.pixels, spec.pixel_normalisation)))
                    add(enc_domain, *image(pixels, inputs, []))
                    if dec_domain:
                        add(dec_domain, *image(grid, [], targets))
                else:
                    add(enc_domain or dec_domain, *image(grid, inputs, targets))
                continue
            tensor = torch.zeros(seq_len, dtype=torch.int)
            input_mask, target_mask = torch.ones(seq_len, dtype=torch.bool), torch.ones(seq_len, dtype=torch.bool)
            attention = torch.zeros(seq_len, dtype=torch.int)
            ids = [t for t, _ in sorted(enc[spec.name], key=lambda e: e[1])]
            tensor[:len(ids)] = torch.tensor(ids, dtype=torch.int)
            input_mask[:len(ids)] = False
            slots = sorted(dec[spec.name], key=lambda d: d[2])
            if slots:
                target = [slots[0][0]] + [y for _, y, _ in slots]
                start = len(ids)
                tensor[start:start + len(target)] = torch.tensor(target, dtype=torch.int)
                target_mask[start:start + len(target)] = False
                attention[start:start + len(target)] = 1
            add(enc_domain or dec_domain, tensor, input_mask, target_mask, attention)
    return {domain: {key: torch.stack(v) for key, v in d.items()} for domain, d in out.items()}


def ours_from_ml4m(mod_dict: dict[str, dict[str, torch.Tensor]], specs,
                   domains: dict[str, tuple[str | None, str | None]]):
    """ml-4m's collated ``UnifiedMasking`` output (``True`` in a mask = not used) as our ``MaskedBatch``, and per
    decoder slot the index into its ml-4m domain's ``tensor`` (``-1`` on padding), which is how ml-4m's logits are
    keyed. ``domains[name] = (encoder domain, decoder domain)`` for each of ``specs``; the pixel domain's ``tensor``
    is the normalised image, which becomes ``pixels``.

    As ml-4m's embeddings read them: an input image token sits at its grid index; an input text token at its rank
    among the sample's unmasked inputs; a text target ``tensor[i + 1]`` is predicted from ``tensor[i]`` (both in
    the target span), at ``i``'s rank in that span. A rank past the modality's positions is refused (ml-4m's
    decoder would fold it to position 0)."""
    from fourm_kfp.batch import IGNORE_INDEX, MaskedBatch

    batch_size = next(iter(mod_dict.values()))["tensor"].shape[0]
    enc = [[] for _ in range(batch_size)]
    dec = [[] for _ in range(batch_size)]
    pixels = None
    for m, spec in enumerate(specs):
        enc_domain, dec_domain = domains[spec.name]
        for b in range(batch_size):
            if enc_domain in mod_dict:
                d = mod_dict[enc_domain]
                used = torch.nonzero(~d["input_mask"][b])[:, 0].tolist()
                if spec.pixel_input:
                    pixels = d["tensor"]
                    enc[b] += [(0, m, i) for i in used]
                elif spec.kind == "image":
                    enc[b] += [(int(d["tensor"][b, i]), m, i) for i in used]
                else:
                    enc[b] += [(int(d["tensor"][b, i]), m, rank) for rank, i in enumerate(used)]
            if dec_domain in mod_dict:
                d = mod_dict[dec_domain]
                target, tensor = ~d["target_mask"][b], d["tensor"][b]
                if spec.kind == "image":
                    dec[b] += [(0, int(tensor[i]), m, i, i) for i in torch.nonzero(target)[:, 0].tolist()]
                    continue
                rank = target.int().cumsum(0) - 1
                for i in torch.nonzero(target[1:] & target[:-1])[:, 0].tolist():
                    if int(rank[i]) >= spec.max_length:
                        raise ValueError(f"{dec_domain}: sample {b}'s target position {int(rank[i])} is past its "
                                         f"{spec.max_length} positions")
                    dec[b].append((int(tensor[i]), int(tensor[i + 1]), m, int(rank[i]), i))
    e, d = max(1, max(map(len, enc))), max(1, max(map(len, dec)))
    enc_t = torch.zeros(3, batch_size, e, dtype=torch.long)
    dec_t = torch.zeros(5, batch_size, d, dtype=torch.long)
    dec_t[1], dec_t[4] = IGNORE_INDEX, -1
    enc_valid = torch.zeros(batch_size, e, dtype=torch.bool)
    dec_valid = torch.zeros(batch_size, d, dtype=torch.bool)
    for b in range(batch_size):
        if enc[b]:
            enc_t[:, b, :len(enc[b])] = torch.tensor(enc[b]).T
            enc_valid[b, :len(enc[b])] = True
        if dec[b]:
            dec_t[:, b, :len(dec[b])] = torch.tensor(dec[b]).T
            dec_valid[b, :len(dec[b])] = True
    flat = torch.where(dec_valid, dec_t[2], len(specs)).reshape(-1)
    order = torch.argsort(flat, stable=True)[:int(dec_valid.sum())]
    counts = torch.bincount(flat, minlength=len(specs) + 1)[:len(specs)].tolist()
    batch = MaskedBatch(enc_t[0], enc_t[1], enc_t[2], enc_valid, dec_t[0], dec_t[1], dec_t[2], dec_t[3], dec_valid,
                        order, counts, pixels, enc_all_valid=bool(enc_valid.all()))
    return batch, dec_t[4]
