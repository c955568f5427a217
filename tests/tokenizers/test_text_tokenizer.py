"""The WordPiece tokenizer of captions and det strings: special ids, coordinate and class tokens, metrics, JSON."""

from __future__ import annotations

import pytest

from fourm_kfp.data.modalities import CLASS_NAMES, OBJECT_CLASSES
from fourm_kfp.tokenizers.text_tokenizer import (
    decode,
    encode,
    load_text_tokenizer,
    mean_tokens_per_text,
    save_text_tokenizer,
    special_token_ids,
    train_text_tokenizer,
    unknown_token_rate,
)

CAPTIONS = [
    f"a {size} {colour} {shape} {relation} a {colour} {other}"
    for size in ("small", "large", "medium")
    for colour in ("red", "blue", "green")
    for shape, other in zip(OBJECT_CLASSES, reversed(OBJECT_CLASSES))
    for relation in ("left of", "right of", "behind")
]
DETS = [f"v0={i} v1={2 * i} v2={3 * i} v3={4 * i} {name}" for i, name in enumerate(OBJECT_CLASSES * 20)]


@pytest.fixture(scope="module")
def tok():
    return train_text_tokenizer(CAPTIONS + DETS, vocab_size=200, num_sentinels=10, coord_bins=1000)


def test_special_token_ids(tok):
    ids = special_token_ids(tok)
    assert ids == {"[PAD]": 0, "[UNK]": 1, "[SOS]": 2, "[EOS]": 3, **{f"[S_{i}]": 4 + i for i in range(10)}}
    assert decode(tok, [2, *encode(tok, "a red cube"), 3, 0, 0]) == "a red cube"  # specials are skipped


def test_coordinate_tokens_are_single_ids_and_round_trip(tok):
    for axis in range(4):
        for value in (0, 7, 123, 500, 999):
            token = f"v{axis}={value}"
            ids = encode(tok, token)
            assert len(ids) == 1 and tok.id_to_token(ids[0]) == token
    det = "v0=12 v1=40 v2=88 v3=120 sphere v0=0 v1=999 v2=5 v3=6 cone"
    ids = encode(tok, det)
    assert len(ids) == 10 and decode(tok, ids) == det
    assert len({tok.token_to_id(f"v{a}={v}") for a in range(4) for v in range(1000)}) == 4000


def test_class_names_are_single_tokens(tok):
    for name in CLASS_NAMES:  # "background" and "ground" never occur in the training texts
        ids = encode(tok, name)
        assert len(ids) == 1 and tok.id_to_token(ids[0]) == name
    assert encode(tok, "Sphere") == encode(tok, "sphere")  # lower-cased


def test_unknown_rate_and_length_metrics(tok):
    assert unknown_token_rate(tok, CAPTIONS[:10] + DETS[:10]) == 0.0
    assert unknown_token_rate(tok, ["a red ☃ cube"]) > 0
    assert mean_tokens_per_text(tok, DETS[:3]) == 5.0


def test_json_save_load_round_trip(tok, tmp_path):
    save_text_tokenizer(tok, tmp_path / "text_tokenizer.json")
    loaded = load_text_tokenizer(tmp_path / "text_tokenizer.json")
    assert loaded.get_vocab() == tok.get_vocab()
    assert encode(loaded, CAPTIONS[5] + " " + DETS[7]) == encode(tok, CAPTIONS[5] + " " + DETS[7])


def test_vocab_size_must_leave_room_for_learned_tokens():
    with pytest.raises(ValueError, match="vocab_size"):
        train_text_tokenizer(CAPTIONS, vocab_size=10, num_sentinels=10)


# Words that tie in count, so the trainer's choice among equally frequent merges decides the vocabulary.
TIED_TEXTS = ["Wel come to the Tok en izers libr ary.", "Welcome to the tokenizers library, café naïve",
              "a small red sphere left of a large blue cube"] * 3
TRAIN_IN_A_FRESH_PROCESS = """
import hashlib, json, sys
from fourm_kfp.tokenizers.text_tokenizer import train_text_tokenizer
tok = train_text_tokenizer(json.loads(sys.argv[1]), vocab_size=120, num_sentinels=4)
print(hashlib.sha256(tok.to_str().encode()).hexdigest())
"""


def test_training_gives_the_same_bytes_in_every_process():
    """``WordPieceTrainer`` alone numbers its ``##`` symbols in a randomly seeded hash map's order and breaks
    merge ties by those numbers (huggingface/tokenizers#1794): each fresh process could learn another vocabulary.
    Ours must not: five fresh processes (each with its own hash seeds), one tokenizer."""
    import json
    import subprocess
    import sys

    digests = {subprocess.run([sys.executable, "-c", TRAIN_IN_A_FRESH_PROCESS, json.dumps(TIED_TEXTS)],
                              capture_output=True, text=True, check=True).stdout.strip() for _ in range(5)}
    assert len(digests) == 1, f"{len(digests)} different tokenizers from 5 processes"


def test_every_continuation_piece_a_word_needs_is_in_the_vocabulary():
    tok = train_text_tokenizer(TIED_TEXTS, vocab_size=120, num_sentinels=4)
    vocab = tok.get_vocab()
    assert {"##" + c for c in "elcomkniazrsby"} <= set(vocab)  # accents are stripped by the normaliser
    assert not [t for t in vocab if t.startswith("##") and tok.token_to_id(t) < 8]  # no continuation is special
    assert "[UNK]" not in encode_tokens(tok, "welcome café naïve libraries")


def encode_tokens(tok, text: str) -> list[str]:
    return tok.encode(text).tokens
