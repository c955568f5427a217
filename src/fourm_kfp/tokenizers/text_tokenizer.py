"""The WordPiece tokenizer shared by the sequence modalities (captions and det strings).

Built on Hugging Face ``tokenizers``: BERT normaliser (lower-casing), BERT pre-tokenizer (whitespace and
punctuation), WordPiece model and decoder. The vocabulary, in id order:

1. ``[PAD]`` = 0, ``[UNK]`` = 1, ``[SOS]`` = 2, ``[EOS]`` = 3, then the sentinels ``[S_0]`` .. ``[S_{n-1}]``
   (4M's span-masking markers) — all special tokens, dropped by :func:`decode` unless asked;
2. WordPiece tokens learned from the training texts, with coordinate tokens removed from them;
3. the coordinate tokens ``v0=0`` .. ``v0={coord_bins-1}``, ..., ``v3=...`` (``4 * coord_bins``), added tokens
   matched as whole words before pre-tokenization, so ``v0=123`` is one id (and decodes back verbatim);
4. any class name of the dataset's vocabularies (semseg's, then det's; :mod:`fourm_kfp.data.vocabularies`) the
   training did not already learn as a whole word, added the same way.

``vocab_size`` bounds parts 1 and 2 together (as ``WordPieceTrainer`` does); parts 3 and 4 come on top, so
the final size is ``tok.get_vocab_size()``.

Training is deterministic: the same texts give the same vocabulary, byte for byte, in every process.
``WordPieceTrainer`` on its own is not (huggingface/tokenizers#1794): it numbers the ``##`` continuation symbols
in the iteration order of a randomly seeded hash map, and those numbers break ties between equally frequent merge
candidates, so two runs can learn different vocabularies. We count the words ourselves (with the tokenizer's own
normaliser and pre-tokenizer), hand the trainer every continuation symbol the words need, in sorted order, as
reserved tokens (so none is numbered by the hash map), and feed it the words in sorted order. No post-processor is
set: :func:`encode` returns the bare ids and the caller adds ``[SOS]``/``[EOS]``. The tokenizer is saved as its
own JSON (:func:`save_text_tokenizer`).

A tokenizer JSON made elsewhere (ml-4m's WordPiece tokenizer) serves as well when it has the four base tokens and
the sentinels ``[S_0]``, ``[S_1]``, ... (:func:`read_text_tokenizer`, :func:`special_token_ids`). *Text
conventions* say how a model's texts are masked (:data:`TEXT_CONVENTIONS`): ``fourm-kfp`` masks a text's bare ids
with the sentinels from ``[S_0]`` on; ``ml4m`` appends ``[EOS]`` to the ids first and takes the sentinels from
``[S_1]`` on, as ml-4m trained its models (:func:`text_sentinels`, :func:`text_eos`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
from collections import Counter
from typing import Iterable, Iterator, Sequence

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from fourm_kfp.data.modalities import COORD_BINS
from fourm_kfp.data.vocabularies import DatasetMeta
from fourm_kfp.errors import UserError
from fourm_kfp.storage import file_store

PAD, UNK, SOS, EOS = "[PAD]", "[UNK]", "[SOS]", "[EOS]"
CONTINUATION = "##"  # WordPiece's prefix of a word's non-initial pieces
BASE_SPECIAL_TOKENS = (PAD, UNK, SOS, EOS)
_COORDINATE = re.compile(r"(?<!\S)v\d+=\d+(?!\S)")
_SPECIAL = re.compile(r"\[(PAD|UNK|SOS|EOS|S_\d+)\]")  # the tokens decode() drops
#: How a model's texts are masked (``train.model.text_conventions``; see the module docstring).
TEXT_CONVENTIONS = ("fourm-kfp", "ml4m")


class TextTokenizerError(UserError, ValueError):
    """A tokenizer JSON is missing, unreadable, or lacks a token our code needs; the message names the file."""


def sentinel_tokens(num_sentinels: int) -> list[str]:
    return [f"[S_{i}]" for i in range(num_sentinels)]


def coordinate_tokens(coord_bins: int = COORD_BINS) -> list[str]:
    return [f"v{axis}={value}" for axis in range(4) for value in range(coord_bins)]


def _empty_tokenizer(vocab: dict[str, int] | None = None) -> Tokenizer:
    """A WordPiece tokenizer with our normaliser, pre-tokenizer and decoder (``vocab`` None: untrained)."""
    tok = Tokenizer(models.WordPiece(vocab, unk_token=UNK) if vocab else models.WordPiece(unk_token=UNK))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    return tok


def count_words(tok: Tokenizer, texts: Iterable[str], chunk: int = 512) -> Counter[str]:
    """How often each word occurs in ``texts`` as ``tok`` normalises and pre-tokenizes them (coordinate tokens
    dropped). Texts are processed ``chunk`` at a time, one call each into the Rust normaliser."""
    counts: Counter[str] = Counter()
    for batch in _chunks((_COORDINATE.sub(" ", text) for text in texts), chunk):
        normalized = tok.normalizer.normalize_str("\n".join(batch))
        counts.update(word for word, _ in tok.pre_tokenizer.pre_tokenize_str(normalized))
    return counts


def _chunks(items: Iterable[str], size: int) -> Iterator[list[str]]:
    iterator = iter(items)
    while batch := list(itertools.islice(iterator, size)):
        yield batch


def _word_stream(counts: Counter[str], words_per_text: int = 4096) -> Iterator[str]:
    """The counted words again, in sorted order, as texts of at most ``words_per_text`` words."""
    for word in sorted(counts):
        remaining = counts[word]
        while remaining:
            n = min(remaining, words_per_text)
            yield " ".join([word] * n)
            remaining -= n


def train_text_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    num_sentinels: int = 100,
    coord_bins: int = COORD_BINS,
    class_names: Sequence[str] = DatasetMeta().text_class_names,
) -> Tokenizer:
    """Train the WordPiece tokenizer on ``texts`` (captions and det strings; streamed once), deterministically
    (see the module docstring)."""
    specials = [*BASE_SPECIAL_TOKENS, *sentinel_tokens(num_sentinels)]
    if vocab_size <= len(specials):
        raise ValueError(f"vocab_size {vocab_size} leaves no room after {len(specials)} special tokens")
    tok = _empty_tokenizer()
    counts = count_words(tok, texts)
    continuations = sorted({CONTINUATION + c for word in counts for c in word[1:]})
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=[*specials, *continuations],
                                        continuing_subword_prefix=CONTINUATION, show_progress=False)
    tok.train_from_iterator(_word_stream(counts), trainer)
    # The trainer numbers its tokens in hash-map order: sorted, the ids are a function of the learned token set.
    learned = sorted(set(tok.get_vocab(with_added_tokens=False)) - set(specials))
    tok = _empty_tokenizer({t: i for i, t in enumerate([*specials, *learned])})
    tok.add_special_tokens(specials)
    tok.add_tokens([AddedToken(t, single_word=True) for t in coordinate_tokens(coord_bins)])
    missing = [name for name in class_names if tok.token_to_id(name.lower()) is None]
    tok.add_tokens([AddedToken(name.lower(), single_word=True) for name in missing])
    return tok


def save_text_tokenizer(tok: Tokenizer, path: str | os.PathLike) -> None:
    """Write the tokenizer's own JSON to ``path``."""
    tok.save(str(path))


def load_text_tokenizer(path: str | os.PathLike) -> Tokenizer:
    return Tokenizer.from_file(str(path))


def read_text_tokenizer(uri: str) -> tuple[Tokenizer, str]:
    """The tokenizer JSON at ``uri`` (a local path or ``s3://`` URI), checked to hold the special tokens our code
    needs (:func:`special_token_ids`), and the file's ``sha256:`` digest.

    Its ids are the file's. Only the base tokens and the sentinels stay marked special: ml-4m's file marks its
    coordinate tokens and class names special too, which decoding would drop (a det text would lose its boxes)."""
    store, name = file_store(uri)
    if not name or not store.exists(name):
        raise TextTokenizerError(f"text tokenizer {uri}: no such file")
    data = store.get_bytes(name)
    try:
        spec = json.loads(data)
        for added in spec.get("added_tokens") or ():
            added["special"] = bool(_SPECIAL.fullmatch(added["content"]))
        tok = Tokenizer.from_str(json.dumps(spec))
    except Exception as exc:  # tokenizers raises a bare Exception on a malformed JSON
        raise TextTokenizerError(f"text tokenizer {uri}: not a tokenizers JSON ({exc})") from None
    special_token_ids(tok, uri)
    return tok, "sha256:" + hashlib.sha256(data).hexdigest()


def encode(tok: Tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` (no ``[SOS]``/``[EOS]`` added)."""
    return tok.encode(text).ids


def decode(tok: Tokenizer, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    """Text of ``ids``; lower-cased as normalised, WordPiece ``##`` continuations joined."""
    return tok.decode(list(ids), skip_special_tokens=skip_special_tokens)


def special_token_ids(tok: Tokenizer, source: str = "the text tokenizer") -> dict[str, int]:
    """``{token: id}`` for ``[PAD]``, ``[UNK]``, ``[SOS]``, ``[EOS]`` and the sentinels ``[S_0]``, ``[S_1]``, ... (up
    to the first one missing). A base token or one of the first two sentinels missing is an error naming
    ``source`` (the file)."""
    ids = {t: tok.token_to_id(t) for t in BASE_SPECIAL_TOKENS}
    for i in itertools.count():
        token_id = tok.token_to_id(f"[S_{i}]")
        if token_id is None:
            break
        ids[f"[S_{i}]"] = token_id
    missing = [t for t in (*BASE_SPECIAL_TOKENS, *sentinel_tokens(2)) if ids.get(t) is None]
    if missing:
        raise TextTokenizerError(f"{source}: the tokenizer has no {', '.join(missing)} (a text tokenizer needs "
                                 f"{', '.join(BASE_SPECIAL_TOKENS)} and the sentinels [S_0], [S_1], ...)")
    return ids


def text_sentinels(special_ids: dict[str, int], conventions: str = "fourm-kfp") -> tuple[int, ...]:
    """The sentinel ids in the order span masking uses them: from ``[S_0]`` on, or from ``[S_1]`` on (``ml4m``)."""
    if conventions not in TEXT_CONVENTIONS:
        raise ValueError(f"text conventions {conventions!r}: expected one of {list(TEXT_CONVENTIONS)}")
    sentinels = tuple(special_ids[f"[S_{i}]"] for i in range(len(special_ids)) if f"[S_{i}]" in special_ids)
    return sentinels[1:] if conventions == "ml4m" else sentinels


def text_eos(special_ids: dict[str, int], conventions: str = "fourm-kfp") -> int | None:
    """The id appended to every text before masking: ``[EOS]`` under ``ml4m``, none otherwise."""
    if conventions not in TEXT_CONVENTIONS:
        raise ValueError(f"text conventions {conventions!r}: expected one of {list(TEXT_CONVENTIONS)}")
    return special_ids[EOS] if conventions == "ml4m" else None


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
