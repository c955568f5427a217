"""Whether the token tables ``train.init_from`` imported *mean* anything here: the ``token_tables`` section of
``reports/init_report.json``.

A modality's rows of the embedding tables and the head are one vector per token id of its tokenizer. Importing them
(:mod:`.initial_weights`) only needs the vocabulary and the width to agree; what a row means depends on the tokenizer
the source was trained against. So, per modality of the model, the section says::

    {"imported": true, "tables": ["dec_token_embed", "enc_token_embed", "head"], "source_vocab": 4096,
     "tokenizer": "ml4m:<folder digest>", "tokenizer_source": "<its folder>", "tokenizer_vocab": 4096,
     "meaningful": true}

``meaningful`` is true only when the rows were imported *and* this run's tokenizer of the modality is the one the
rows were trained against:

* an ml-4m source (4M-7, 4M-21): an image modality's tokenizer is an ml-4m tokenizer folder
  (``train_tokenizers.from_ml4m``, named with its digest in the tokenizer bundle) of the source domain's vocabulary;
  a text modality's is ml-4m's own WordPiece file (``text_tokenizer_4m_wordpiece_30k.json``, known by its digest,
  :data:`ML4M_WORDPIECE`). A tokenizer trained here gives ``false``: the imported rows index this pipeline's own
  codes. (The folder is taken for what ``from_ml4m`` names: a depth folder given as edge, both one-channel 8192-code
  tokenizers, is not told apart.)
* a pretrain output of this pipeline: the same tokenizer as the one its card names (the same ml-4m folder digest,
  the same trained files, the same text tokenizer);
* a checkpoint: ``null``; a checkpoint does not record the tokenizers it was trained with.

Rows not imported are ``false`` with the reason they were not. The tokenizer's identity (``tokenizer``) is
``ml4m:<folder digest>`` (an ml-4m image tokenizer folder) or ``ml4m:<sha256>`` (ml-4m's WordPiece file),
``file:<sha256>`` (another text tokenizer read as it is) or ``fourm-kfp:<sha256>`` (trained by this pipeline: a
digest of its files in the bundle).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from fourm_kfp.contract.manifest import read_manifest
from fourm_kfp.storage import open_store
from fourm_kfp.tokenizers.bundle import INDEX_FILE, TEXT_FILE
from fourm_kfp.tokenizers.ml4m.adapter import KIND as ML4M_KIND

#: ml-4m's WordPiece (``fourm/utils/tokenizer/trained/text_tokenizer_4m_wordpiece_30k.json``) by the sha256 of its
#: published versions: the same 30000 ids and words; 4M-21's release renamed the coordinate tokens.
ML4M_WORDPIECE = {
    "8666c196b04e21f96db9d2590ccbe2aaa1245e614c46eccadc41dbc00551066a": "ml-4m 43558d1 (4M-7's release: xmin=...)",
    "8e684e9a0673e39f70702a698869f909ba697f871a0c6b2a07b5f61e91b3526e": "ml-4m 4600165 (4M-21's release: v0=...)",
}
#: The train-tokenizers manifest's record of ``train_tokenizers.text_tokenizer_from``.
TEXT_SOURCE = "text_tokenizer"
OWN_CODES = "imported rows index this pipeline's own codes"


def bundle_tokenizers(uri: str) -> dict[str, dict[str, Any]]:
    """``{modality: {"kind", "tokenizer", "vocab"[, "source"]}}`` of the committed tokenizer bundle at ``uri``:
    ``kind`` is ``"ml4m"`` (an ml-4m folder, or ml-4m's WordPiece), ``"file"`` (another text tokenizer read as it
    is) or ``"fourm-kfp"`` (trained by this pipeline)."""
    store = open_store(uri)
    index = json.loads(store.get_bytes(INDEX_FILE))
    found = read_manifest(store)
    manifest = found[0] if found else {}
    files = {f["key"]: f["sha256"] for f in manifest.get("files", ())}
    out: dict[str, dict[str, Any]] = {}
    for modality, entry in sorted((index.get("image") or {}).items()):
        if entry.get("kind") == ML4M_KIND:
            out[modality] = {"kind": "ml4m", "tokenizer": f"ml4m:{entry['digest']}", "source": entry["source"]}
        else:
            prefix = f"image/{modality}/"
            own = {key: sha for key, sha in files.items() if key.startswith(prefix)} or {
                key: hashlib.sha256(store.get_bytes(key)).hexdigest() for key in store.list(prefix)}
            out[modality] = {"kind": "fourm-kfp", "tokenizer": f"fourm-kfp:{_digest(own, prefix)}"}
        out[modality]["vocab"] = int(entry["codebook_size"])
    text = index.get("text")
    if text:
        source = next((s for s in manifest.get("sources", ()) if s.get("name") == TEXT_SOURCE), None)
        if source is not None:
            sha = str(source["digest"]).removeprefix("sha256:")
            described = {"kind": "ml4m" if sha in ML4M_WORDPIECE else "file", "source": source["uri"]}
            described["tokenizer"] = f"{described['kind']}:{sha}"
        else:
            sha = files.get(TEXT_FILE) or hashlib.sha256(store.get_bytes(TEXT_FILE)).hexdigest()
            described = {"kind": "fourm-kfp", "tokenizer": f"fourm-kfp:{sha}"}
        for modality in text["modalities"]:
            out[modality] = {**described, "vocab": int(text["vocab_size"])}
    return out


def _digest(files: dict[str, str], prefix: str) -> str:
    text = "".join(f"{key.removeprefix(prefix)}:{sha}\n" for key, sha in sorted(files.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def judge(rows: dict[str, dict[str, Any]], kind: str, own: dict[str, dict[str, Any]],
          source: dict[str, dict[str, Any]] | None, source_error: str = "") -> dict[str, dict[str, Any]]:
    """The ``token_tables`` section (module docstring). ``rows``: per modality of the model, ``{"tables": [the
    tables whose rows were imported], "source_vocab": int | None, "reason": why not imported}``; ``kind``: the
    source's (``"ml-4m"``, ``"pretrain output"``, ``"checkpoint"``); ``own``: :func:`bundle_tokenizers` of this
    run's bundle; ``source``: of the bundle a pretrain output was trained with (``None`` when unknown, with
    ``source_error`` saying why)."""
    section = {}
    for modality, got in rows.items():
        mine = own.get(modality, {})
        entry: dict[str, Any] = {"imported": bool(got["tables"])}
        if got["tables"]:
            entry["tables"] = sorted(got["tables"])
        if got.get("source_vocab") is not None:
            entry["source_vocab"] = got["source_vocab"]
        entry["tokenizer"] = mine.get("tokenizer")
        if mine.get("source"):
            entry["tokenizer_source"] = mine["source"]
        if mine.get("vocab") is not None:
            entry["tokenizer_vocab"] = mine["vocab"]
        if not got["tables"]:
            entry.update(meaningful=False, reason=f"not imported: {got.get('reason') or 'not in the source'}")
        else:
            meaningful, reason = _meaningful(modality, got, kind, mine, source, source_error)
            entry["meaningful"] = meaningful
            if reason:
                entry["reason"] = reason
        section[modality] = entry
    return section


def _meaningful(modality: str, got: dict[str, Any], kind: str, mine: dict[str, Any],
                source: dict[str, dict[str, Any]] | None, source_error: str) -> tuple[bool | None, str]:
    if not mine:
        return False, f"no tokenizer of {modality} in this run's bundle"
    if kind == "ml-4m":
        if mine["kind"] == "fourm-kfp":
            return False, f"{OWN_CODES} (its tokenizer was trained here, not ml-4m's)"
        if mine["kind"] == "file":  # a text tokenizer read as it is, not ml-4m's
            return False, (f"the text tokenizer {mine['source']} is not ml-4m's text_tokenizer_4m_wordpiece_30k.json "
                           f"(its sha256 is none of ml-4m's published ones): its ids need not be ml-4m's words")
        if mine["vocab"] != got.get("source_vocab"):
            return False, (f"ml-4m's tokenizer at {mine['source']} has {mine['vocab']} codes, the source domain "
                           f"{got.get('source_vocab')}")
        return True, ""
    if kind == "pretrain output":
        if source is None:
            return None, f"the source's tokenizers cannot be read ({source_error})"
        theirs = source.get(modality)
        if theirs is None:
            return False, f"the source's tokenizer bundle has no {modality} tokenizer"
        if theirs["tokenizer"] != mine["tokenizer"]:
            return False, (f"the source was trained with {theirs['tokenizer']}, this run's tokenizer is "
                           f"{mine['tokenizer']}: the rows index other codes")
        return True, ""
    return None, "a checkpoint does not record the tokenizers it was trained with"
