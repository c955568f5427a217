"""``train.init_from``: start pretraining from the weights of an earlier model instead of a fresh initialisation.

Only model weights are taken (no optimizer state, step or loader position: a new run, not a resumed one). The source
is one of:

* a pretrain output (``model/model.json``): its exported model;
* an ml-4m model (a folder with ``config.json`` naming ``domains_in`` and ``model.safetensors``, or a
  ``.safetensors`` file): converted by :func:`fourm_kfp.model.ml4m.import_ml4m` to a FourM of this model's modalities
  (what it found nothing for counts as not in the source; what it could not place is listed as dropped);
* a checkpoint (a ``step-NNNNNNNN`` folder, a run's ``checkpoints/`` folder or a pretrain output whose run has
  checkpoints but no model yet).

A source with its model (the first two) is mapped modality by modality. The embedding tables hold one block of rows
per modality (:mod:`fourm_kfp.model.fourm`), so two models with different modality sets have tables of different
sizes: each modality of this model that the source has takes its own rows of ``enc_token_embed``,
``dec_token_embed``, ``head`` and ``modality_embed`` when its vocabulary and the width agree. A tied head (the
decoder table) takes nothing of a source's separate head (listed as dropped); a separate head from a tied source
takes the source's decoder rows. The encoder row of a modality read as pixel patches is a placeholder that no step
reads: it is never imported. Every other tensor (encoder and decoder blocks, norms, ``context_proj``,
``mask_token``, ``patch_embed``, ``pixel_modality_embed``) is taken when its name and shape agree.

A checkpoint holds tensors without the modality list they were trained on, so it is read by name and shape alone,
tables whole or not at all.

Whatever is not taken stays as this model was initialised. :class:`InitReport` says what was imported, what is new
(with why) and what of the source was dropped (with why), and counts the scalars of each; given the run's tokenizer
bundle, its ``token_tables`` say per modality whether the token rows were imported *and* mean something here (the
tokenizer is the one they were trained against: :mod:`.token_tables`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from fourm_kfp.config.schema import ConfigError
from fourm_kfp.errors import UserError
from fourm_kfp.model import ml4m
from fourm_kfp.model.fourm import FourM
from fourm_kfp.contract.manifest import MANIFEST_NAME
from fourm_kfp.model.saved_model import MODEL_CARD, load_model
from fourm_kfp.storage import file_store, open_store
from fourm_kfp.train.checkpoint import Checkpoint, find_checkpoint, load_checkpoint

log = logging.getLogger("fourm_kfp.train")

#: The tables with one block of rows per modality, by their parameter; the head is only a parameter when untied.
TABLES = {"enc_token_embed.weight": "enc_token_embed", "dec_token_embed.weight": "dec_token_embed",
          "head.weight": "head", "modality_embed.weight": "modality_embed"}
_TIED = "this model's head is its dec_token_embed (tie_embeddings)"
#: What ``reports/init_report.json`` says; part of an init_from run's address (2: ``token_tables``).
REPORT_VERSION = 2
#: The tables whose rows are a modality's token ids (its tokenizer's codes).
TOKEN_ROWS = ("enc_token_embed", "dec_token_embed", "head")


@dataclass
class InitReport:
    """What ``train.init_from`` did. Entries name a parameter, per modality for the tables
    (``enc_token_embed[caption]``), and give the source's name when it differs (``head[rgb] (from
    dec_token_embed[rgb])``) or the reason (``enc_token_embed[semseg]: not in the source``). ``*_parameters``
    count scalars: ``imported + new`` is this model's size; ``dropped`` counts the source's tensors that have no
    place here (an ml-4m import's own dropped keys and domains are listed, not counted)."""

    source: str
    kind: str  # "pretrain output", "ml-4m", "checkpoint"
    imported: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    imported_parameters: int = 0
    new_parameters: int = 0
    dropped_parameters: int = 0
    #: per modality: its token rows imported, and whether they are meaningful here (:mod:`.token_tables`)
    token_tables: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: per modality of this model: the token tables whose rows were imported, the source's vocabulary, why not
    rows: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        report = asdict(self)
        del report["rows"]
        if not self.token_tables:
            del report["token_tables"]
        return report

    def counts(self) -> dict[str, int]:
        """The stage's manifest counts (and, as floats, its metrics)."""
        return {"init_imported_parameters": self.imported_parameters, "init_new_parameters": self.new_parameters,
                "init_dropped_parameters": self.dropped_parameters}

    def summary(self) -> str:
        return (f"init_from {self.source} ({self.kind}): {self.imported_parameters:,} parameters imported "
                f"({len(self.imported)} entries), {self.new_parameters:,} new ({len(self.new)}), "
                f"{self.dropped_parameters:,} of the source dropped ({len(self.dropped)})")

    def _import(self, name: str, target: torch.Tensor, source: torch.Tensor, source_name: str) -> None:
        with torch.no_grad():
            target.copy_(source)
        self.imported.append(name if source_name == name else f"{name} (from {source_name})")
        self.imported_parameters += target.numel()

    def _new(self, name: str, target: torch.Tensor, reason: str) -> None:
        self.new.append(f"{name}: {reason}")
        self.new_parameters += target.numel()

    def _drop(self, name: str, source: torch.Tensor, reason: str) -> None:
        self.dropped.append(f"{name}: {reason}")
        self.dropped_parameters += source.numel()


def load_initial_weights(model: FourM, uri: str, tokenizers_uri: str | None = None) -> InitReport:
    """``train.init_from``: copy into ``model`` what fits of the model at ``uri`` (see the module docstring);
    returns the report (also logged in one line). ``tokenizers_uri``: the run's tokenizer bundle, which the report's
    ``token_tables`` judge the imported rows against (none without it)."""
    source_tokenizers: str | None = None
    if uri.endswith(".safetensors"):
        report = _from_ml4m(model, uri)
    else:
        store = open_store(uri)
        if store.exists(MODEL_CARD):
            source, card = load_model(store)
            source_tokenizers = card.get("tokenizers_uri")
            report = map_weights(source, model, InitReport(uri, "pretrain output"))
        elif _is_ml4m(store):
            report = _from_ml4m(model, uri)
        else:
            ckpt = find_checkpoint(store) or find_checkpoint(store.child("checkpoints"))
            if ckpt is None:
                raise ConfigError(f"train.init_from: {uri} is neither a pretrain output ({MODEL_CARD}), an ml-4m "
                                  f"model ({ml4m.CONFIG} with domains_in, or a .safetensors file) nor a checkpoint")
            report = map_weights(_checkpoint_state(ckpt), model, InitReport(ckpt.uri, "checkpoint"))
    if tokenizers_uri is not None:
        report.token_tables = _token_tables(report, tokenizers_uri, source_tokenizers)
    log.info(report.summary())
    return report


def _token_tables(report: InitReport, tokenizers_uri: str, source_tokenizers: str | None) -> dict[str, Any]:
    from fourm_kfp.train.token_tables import bundle_tokenizers, judge

    source, error = None, "the source's model card names no tokenizers"
    if source_tokenizers:
        try:
            source = bundle_tokenizers(source_tokenizers)
        except (OSError, ValueError, KeyError, UserError) as exc:
            error = f"{source_tokenizers}: {exc}"
    return judge(report.rows, report.kind, bundle_tokenizers(tokenizers_uri), source, error)


def source_fingerprint(uri: str) -> str:
    """What the pretrain address covers of ``train.init_from`` beyond its URI: the listing (keys and sizes) of the
    source, plus its small descriptive files (a pretrain output's manifest, an ml-4m ``config.json``), so a folder
    whose contents changed under the same URI gets a new address without reading its weights. A source that is not
    there fails here, naming the field. It also holds :data:`REPORT_VERSION`: a run started from a source writes
    ``reports/init_report.json``, so a change of what that says moves those runs' addresses (and no others)."""
    digest = hashlib.sha256(f"init report {REPORT_VERSION}\n".encode())
    if uri.endswith(".safetensors"):
        store, name = file_store(uri)
        if not name or not store.exists(name):
            raise ConfigError(f"train.init_from: {uri} does not exist")
        digest.update(f"{name}\t{store.size(name)}\n".encode())
        return digest.hexdigest()
    store = open_store(uri)
    listing = sorted(store.list_sizes())
    if not listing:
        raise ConfigError(f"train.init_from: {uri} does not exist or is empty")
    for key, size in listing:
        digest.update(f"{key}\t{size}\n".encode())
    for key in (MANIFEST_NAME, ml4m.CONFIG):
        if store.exists(key):
            digest.update(store.get_bytes(key))
    return digest.hexdigest()


def map_weights(source: FourM | dict[str, torch.Tensor], target: FourM, report: InitReport,
                untrained: Collection[str] = ()) -> InitReport:
    """Copy into ``target`` what fits of ``source`` (a model: per modality; a bare state dict: by name and shape),
    recording every tensor in ``report``. ``untrained``: the source's entries (names as in the report) that hold
    only its own fresh initialisation (what an ml-4m import found nothing for): treated as not in the source."""
    own, untrained = target.state_dict(), set(untrained)
    report.rows = {spec.name: {"tables": [], "source_vocab": None, "reason": ""} for spec in target.args.modalities}
    if isinstance(source, FourM):
        _map_tables(source, target, report, untrained)
        state = source.state_dict()
        tensors = [key for key in own if key not in TABLES]
        others = [key for key in state if key not in TABLES]
    else:
        state, tensors, others = source, list(own), list(source)
    for key in tensors:
        from_key = "dec_token_embed.weight" if key == "head.weight" and key not in state else key
        if from_key not in state or from_key in untrained:
            reason = "not in the source"
            report._new(key, own[key], reason)
        elif state[from_key].shape != own[key].shape:
            shapes = list(state[from_key].shape), list(own[key].shape)
            reason = f"shape {shapes[0]} in the source, {shapes[1]} here"
            report._new(key, own[key], reason)
        else:
            reason = ""
            report._import(key, own[key], state[from_key], from_key)
        if TABLES.get(key) in TOKEN_ROWS:  # a bare state dict's table: every modality's rows or none
            for rows in report.rows.values():
                if reason:
                    rows["reason"] = rows["reason"] or f"{TABLES[key]}: {reason}"
                else:
                    rows["tables"].append(TABLES[key])
    for key in others:
        if key not in own and key not in untrained:
            report._drop(key, state[key], _TIED if key == "head.weight" else "not in this model")
    return report


def _map_tables(source: FourM, target: FourM, report: InitReport, untrained: set[str]) -> None:
    """The per-modality rows of the embedding tables and the head."""
    src, dst = _blocks(source), _blocks(target)
    for spec in source.args.modalities:
        if spec.name in report.rows:
            report.rows[spec.name]["source_vocab"] = spec.vocab_size
    src_pixel = {m.name for m in source.args.modalities if m.pixel_input}
    dst_pixel = {m.name for m in target.args.modalities if m.pixel_input}
    for role in dict.fromkeys(TABLES.values()):
        if role not in dst:
            for name, rows in src.get(role, {}).items():  # a separate head into a tied model
                if f"{role}[{name}]" in untrained:
                    continue
                reason = _TIED if name in dst["dec_token_embed"] else "not a modality here"
                report._drop(f"{role}[{name}]", rows, reason)
            continue
        from_role = role if role in src else "dec_token_embed"  # a separate head from a tied source
        for name, rows in dst[role].items():
            label, why = f"{role}[{name}]", ""
            if role == "enc_token_embed" and name in dst_pixel:
                report._new(label, rows, f"a placeholder row ({name} enters as pixel patches): never read, never "
                                         "imported")
            elif name not in src[from_role] or f"{from_role}[{name}]" in untrained:
                report._new(label, rows, why := "not in the source")
            elif role == "enc_token_embed" and name in src_pixel:
                report._new(label, rows, f"the source reads {name} as pixel patches: it has no token rows")
            elif why := _mismatch(src[from_role][name], rows, role != "modality_embed"):
                report._new(label, rows, why)
            else:
                report._import(label, rows, src[from_role][name], f"{from_role}[{name}]")
                if role in TOKEN_ROWS:
                    report.rows[name]["tables"].append(role)
            if why and role in TOKEN_ROWS and not report.rows[name]["reason"]:
                report.rows[name]["reason"] = f"{role}: {why}"
        for name, rows in src.get(role, {}).items():
            if f"{role}[{name}]" in untrained:
                continue
            if name not in dst[role]:
                report._drop(f"{role}[{name}]", rows, "not a modality here")
            elif role == "enc_token_embed" and name in dst_pixel and name not in src_pixel:
                report._drop(f"{role}[{name}]", rows, f"{name} enters this model as pixel patches")


def _blocks(model: FourM) -> dict[str, dict[str, torch.Tensor]]:
    """``{table: {modality: its rows}}`` (views of the parameters); no ``head`` when it is tied."""
    names = model.args.names
    tables = {"enc_token_embed": (model.enc_token_embed.weight, model.enc_token_offset),
              "dec_token_embed": (model.dec_token_embed.weight, model.token_offset),
              "modality_embed": (model.modality_embed.weight, torch.arange(len(names)))}
    if model.head is not None:
        tables["head"] = (model.head.weight, model.token_offset)
    blocks = {}
    for role, (weight, offsets) in tables.items():
        starts = offsets.tolist()
        stops = starts[1:] + [weight.shape[0]]
        blocks[role] = {name: weight.detach()[a:b] for name, a, b in zip(names, starts, stops)}
    return blocks


def _mismatch(source: torch.Tensor, target: torch.Tensor, vocab: bool) -> str:
    """Why ``source``'s rows cannot be ``target``'s (empty: they can)."""
    reasons = []
    if vocab and source.shape[0] != target.shape[0]:
        reasons.append(f"vocab {source.shape[0]} in the source, {target.shape[0]} here")
    if source.shape[1] != target.shape[1]:
        reasons.append(f"width {source.shape[1]} in the source, {target.shape[1]} here")
    return "; ".join(reasons)


def _is_ml4m(store) -> bool:
    if not store.exists(ml4m.CONFIG):
        return False
    try:
        config = json.loads(store.get_bytes(ml4m.CONFIG))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"train.init_from: {store.uri_of(ml4m.CONFIG)} is not JSON: {exc}") from None
    return isinstance(config, dict) and "domains_in" in config


def _from_ml4m(target: FourM, uri: str) -> InitReport:
    try:
        source, imported = ml4m.import_ml4m(uri, modalities=target.args.names)
    except ml4m.Ml4mError as exc:
        raise ConfigError(f"train.init_from: {exc}") from None
    report = map_weights(source, target, InitReport(uri, "ml-4m"), untrained=imported.missing)
    report.dropped += imported.dropped_domains + imported.dropped
    report.dropped_parameters += imported.dropped_parameters
    return report


def _checkpoint_state(ckpt: Checkpoint) -> dict[str, torch.Tensor]:
    """Every model tensor of ``ckpt`` in the shape it was saved in (its DCP metadata says which)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    with tempfile.TemporaryDirectory(prefix="fourm-init-") as tmp:
        ckpt.store.get_file(".metadata", Path(tmp) / ".metadata")
        metadata = FileSystemReader(tmp).read_metadata()
    state = {key.removeprefix("model."): torch.empty(tuple(m.size), dtype=m.properties.dtype)
             for key, m in metadata.state_dict_metadata.items()
             if key.startswith("model.") and isinstance(m, TensorStorageMetadata)}
    load_checkpoint(ckpt, {"model": state})
    return state
