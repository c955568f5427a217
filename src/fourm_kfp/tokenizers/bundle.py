"""A committed train-tokenizers output, loaded back from its URI alone.

Layout under the stage's output prefix::

    tokenizers.json                       index: modalities, token grids, vocabulary sizes, special token ids,
                                          and the dataset's class vocabularies where not the defaults
    image/<modality>/config.json          VQ-VAE config with normalisation statistics
    image/<modality>/model.safetensors    weights (no pickles)
                                          (an ml-4m tokenizer, ``train_tokenizers.from_ml4m``: its folder's two
                                          files as they are; the index's entry says ``"kind": "ml4m"`` and
                                          records the source, the digest and the config)
    text/tokenizer.json                   the WordPiece tokenizer's own JSON

:func:`load_tokenizers` rebuilds every tokenizer from that URI (local or S3); later stages use
``bundle.image["rgb"].encode(images)`` and ``bundle.text.encode(text).ids``; ``bundle.vocabularies`` are the class
vocabularies the tokenizers were trained with (:mod:`fourm_kfp.data.vocabularies`), what the evaluation scores
semseg and det over.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from fourm_kfp.contract.manifest import require_manifest
from fourm_kfp.data.vocabularies import DatasetMeta
from fourm_kfp.storage import Store, open_store
from fourm_kfp.tokenizers.ml4m.adapter import KIND as ML4M_KIND
from fourm_kfp.tokenizers.ml4m.adapter import Ml4mTokenizer, config_of_entry, load_ml4m_tokenizer
from fourm_kfp.tokenizers.ml4m.folder import TokenizerFolderError, read_folder
from fourm_kfp.tokenizers.saved_tokenizer import CONFIG_FILE, WEIGHTS_FILE, load_image_tokenizer
from fourm_kfp.tokenizers.text_tokenizer import load_text_tokenizer
from fourm_kfp.tokenizers.vqvae import VQVAE

INDEX_FILE = "tokenizers.json"
TEXT_FILE = "text/tokenizer.json"
#: The index's entry of the dataset's vocabularies that differ from the defaults (absent when none do).
VOCABULARIES = "vocabularies"


@dataclass
class TokenizerBundle:
    uri: str
    index: dict[str, Any]
    image: dict[str, VQVAE | Ml4mTokenizer]
    text: Tokenizer | None

    @property
    def vocabularies(self) -> dict[str, tuple[str, ...]]:
        """Every class vocabulary in force: the defaults, with the dataset's that the index records on top."""
        meta = DatasetMeta.from_json({VOCABULARIES: self.index.get(VOCABULARIES, {})},
                                     f"{self.uri}/{INDEX_FILE} ({VOCABULARIES!r})")
        return meta.all_vocabularies


def image_key(modality: str, name: str) -> str:
    return f"image/{modality}/{name}"


def _load_ml4m(store: Store, modality: str, entry: dict[str, Any], folder: Path, device: str) -> Ml4mTokenizer:
    """The ml-4m tokenizer copied under ``image/<modality>/``; its files must still have the recorded digest."""
    copied = read_folder(folder)
    if copied.digest != entry["digest"]:
        raise TokenizerFolderError(f"{store.uri_of(image_key(modality, ''))}: the ml-4m tokenizer's files have "
                                   f"digest {copied.digest}, {INDEX_FILE} records {entry['digest']}")
    return load_ml4m_tokenizer(copied, config_of_entry(modality, entry), device=device)


def load_tokenizers(uri: str | Store, device: str = "cpu") -> TokenizerBundle:
    """Every tokenizer of a committed train-tokenizers output, in eval mode on ``device``."""
    store = open_store(uri) if isinstance(uri, str) else uri
    require_manifest(store, "tokenizers")
    index = json.loads(store.get_bytes(INDEX_FILE))
    image = {}
    with tempfile.TemporaryDirectory(prefix="fourm-tokenizers-") as tmp:
        for modality in index["image"]:
            folder = Path(tmp) / modality
            for name in (CONFIG_FILE, WEIGHTS_FILE):
                store.get_file(image_key(modality, name), folder / name)
            entry = index["image"][modality]
            if entry.get("kind") == ML4M_KIND:  # ml-4m's folder, copied as it is
                image[modality] = _load_ml4m(store, modality, entry, folder, device)
            else:
                image[modality] = load_image_tokenizer(folder, device=device)
        text = None
        if index.get("text"):
            store.get_file(TEXT_FILE, Path(tmp) / "tokenizer.json")
            text = load_text_tokenizer(Path(tmp) / "tokenizer.json")
    return TokenizerBundle(store.uri, index, image, text)
