"""The WordPiece tokenizer shared by the sequence modalities (captions and det strings).

Built on Hugging Face ``tokenizers``: BERT normaliser (lower-casing), BERT pre-tokenizer (whitespace and
punctuation), WordPiece model and decoder. The vocabulary, in id order:

1. ``[PAD]`` = 0, ``[UNK]`` = 1, ``[SOS]`` = 2, ``[EOS]`` = 3, then the sentinels ``[S_0]`` .. ``[S_{n-1}]``
   (4M's span-masking markers) — all special tokens, dropped by :func:`decode` unless asked;
2. WordPiece tokens learned from the training texts, with coordinate tokens removed from them;
3. the coordinate tokens ``v0=0`` .. ``v0={coord_bins-1}``, ..., ``v3=...`` (``4 * coord_bins``), added tokens
   matched as whole words before pre-tokenization, so ``v0=123`` is one id (and decodes back verbatim);
4. any class name the training did not already learn as a whole word, added the same way.

``vocab_size`` bounds parts 1 and 2 together (as ``WordPieceTrainer`` does); parts 3 and 4 come on top, so
the final size is ``tok.get_vocab_size()``. No post-processor is set: :func:`encode` returns the bare ids and
the caller adds ``[SOS]``/``[EOS]``. The tokenizer is saved as its own JSON (:func:`save_text_tokenizer`).
"""

from __future__ import annotations

import itertools
import os
import re
from typing import Iterable, Sequence

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from fourm_kfp.data.modalities import CLASS_NAMES, COORD_BINS

PAD, UNK, SOS, EOS = "[PAD]", "[UNK]", "[SOS]", "[EOS]"
BASE_SPECIAL_TOKENS = (PAD, UNK, SOS, EOS)
_COORDINATE = re.compile(r"(?<!\S)v\d+=\d+(?!\S)")


def sentinel_tokens(num_sentinels: int) -> list[str]:
    return [f"[S_{i}]" for i in range(num_sentinels)]


def coordinate_tokens(coord_bins: int = COORD_BINS) -> list[str]:
    return [f"v{axis}={value}" for axis in range(4) for value in range(coord_bins)]


def train_text_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    num_sentinels: int = 100,
    coord_bins: int = COORD_BINS,
    class_names: Sequence[str] = CLASS_NAMES,
) -> Tokenizer:
    """Train the WordPiece tokenizer on ``texts`` (captions and det strings; streamed once)."""
    specials = [*BASE_SPECIAL_TOKENS, *sentinel_tokens(num_sentinels)]
    if vocab_size <= len(specials):
        raise ValueError(f"vocab_size {vocab_size} leaves no room after {len(specials)} special tokens")
    tok = Tokenizer(models.WordPiece(unk_token=UNK))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False)
    tok.train_from_iterator((_COORDINATE.sub(" ", text) for text in texts), trainer)
    # The trainer numbers tokens in hash-map order; sorting makes the ids a function of the learned token set.
    # (That set itself can still vary between runs on count ties: huggingface/tokenizers#1794.)
    learned = sorted(set(tok.get_vocab(with_added_tokens=False)) - set(specials))
    tok.model = models.WordPiece({t: i for i, t in enumerate([*specials, *learned])}, unk_token=UNK)
    tok.add_tokens([AddedToken(t, single_word=True) for t in coordinate_tokens(coord_bins)])
    missing = [name for name in class_names if tok.token_to_id(name.lower()) is None]
    tok.add_tokens([AddedToken(name.lower(), single_word=True) for name in missing])
    return tok


def save_text_tokenizer(tok: Tokenizer, path: str | os.PathLike) -> None:
    """Write the tokenizer's own JSON to ``path``."""
    tok.save(str(path))


def load_text_tokenizer(path: str | os.PathLike) -> Tokenizer:
    return Tokenizer.from_file(str(path))


def encode(tok: Tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` (no ``[SOS]``/``[EOS]`` added)."""
    return tok.encode(text).ids


def decode(tok: Tokenizer, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    """Text of ``ids``; lower-cased as normalised, WordPiece ``##`` continuations joined."""
    return tok.decode(list(ids), skip_special_tokens=skip_special_tokens)


def special_token_ids(tok: Tokenizer) -> dict[str, int]:
    """``{token: id}`` for ``[PAD]`` (0), ``[UNK]``, ``[SOS]``, ``[EOS]`` and the sentinels ``[S_i]``, in id order."""
    ids = {t: tok.token_to_id(t) for t in BASE_SPECIAL_TOKENS}
    for i in itertools.count():
        token_id = tok.token_to_id(f"[S_{i}]")
        if token_id is None:
            break
        ids[f"[S_{i}]"] = token_id
    return ids


def unknown_token_rate(tok: Tokenizer, texts: Iterable[str]) -> float:
    """Fraction of all tokens of ``texts`` that are ``[UNK]``."""
    unk = tok.token_to_id(UNK)
    total = unknown = 0
    for encoding in tok.encode_batch(list(texts)):
        total += len(encoding.ids)
        unknown += sum(1 for i in encoding.ids if i == unk)
    return unknown / max(total, 1)


def mean_tokens_per_text(tok: Tokenizer, texts: Iterable[str]) -> float:
    encodings = tok.encode_batch(list(texts))
    return sum(len(e.ids) for e in encodings) / max(len(encodings), 1)
