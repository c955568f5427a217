"""The init report's ``token_tables``: imported rows are meaningful only with the tokenizer they were trained
against, and every other case says why (the end-to-end cases: tests/stages/test_finetune_4m_e2e.py)."""

from __future__ import annotations

from fourm_kfp.train.token_tables import ML4M_WORDPIECE, OWN_CODES, judge

ROWS = {"semseg": {"tables": ["dec_token_embed", "head"], "source_vocab": 4096, "reason": ""},
        "caption": {"tables": ["dec_token_embed"], "source_vocab": 30000, "reason": ""},
        "depth": {"tables": [], "source_vocab": None, "reason": "dec_token_embed: not in the source"}}
ML4M_SEMSEG = {"kind": "ml4m", "tokenizer": "ml4m:abc", "source": "models/semseg", "vocab": 4096}
OWN_SEMSEG = {"kind": "fourm-kfp", "tokenizer": "fourm-kfp:def", "vocab": 4096}
ML4M_TEXT = {"kind": "ml4m", "tokenizer": f"ml4m:{next(iter(ML4M_WORDPIECE))}", "source": "wp.json", "vocab": 30000}
OTHER_TEXT = {"kind": "file", "tokenizer": "file:123", "source": "mine.json", "vocab": 30000}
DEPTH = {"kind": "fourm-kfp", "tokenizer": "fourm-kfp:0", "vocab": 8192}


def test_an_ml4m_source_is_meaningful_with_ml4m_tokenizers_only():
    section = judge(ROWS, "ml-4m", {"semseg": ML4M_SEMSEG, "caption": ML4M_TEXT, "depth": DEPTH}, None)
    assert section["semseg"] == {"imported": True, "tables": ["dec_token_embed", "head"], "source_vocab": 4096,
                                 "tokenizer": "ml4m:abc", "tokenizer_source": "models/semseg",
                                 "tokenizer_vocab": 4096, "meaningful": True}
    assert section["caption"]["meaningful"] is True
    assert section["depth"] == {"imported": False, "tokenizer": "fourm-kfp:0", "tokenizer_vocab": 8192,
                                "meaningful": False, "reason": "not imported: dec_token_embed: not in the source"}

    section = judge(ROWS, "ml-4m", {"semseg": OWN_SEMSEG, "caption": OTHER_TEXT, "depth": DEPTH}, None)
    assert section["semseg"]["imported"] and section["semseg"]["meaningful"] is False
    assert OWN_CODES in section["semseg"]["reason"]
    assert section["caption"]["meaningful"] is False and "not ml-4m's" in section["caption"]["reason"]

    smaller = {**ML4M_SEMSEG, "vocab": 1024}  # an ml-4m folder of another vocabulary (rows would not import)
    assert judge(ROWS, "ml-4m", {"semseg": smaller}, None)["semseg"]["meaningful"] is False


def test_a_pretrain_output_is_meaningful_with_its_own_tokenizers_and_a_checkpoint_cannot_say():
    own = {"semseg": OWN_SEMSEG, "caption": OTHER_TEXT, "depth": DEPTH}
    same = judge(ROWS, "pretrain output", own, dict(own))
    assert same["semseg"]["meaningful"] is True and same["caption"]["meaningful"] is True
    other = judge(ROWS, "pretrain output", own, {**own, "semseg": ML4M_SEMSEG})
    assert other["semseg"]["meaningful"] is False and "ml4m:abc" in other["semseg"]["reason"]
    unknown = judge(ROWS, "pretrain output", own, None, "s3://gone: no such key")
    assert unknown["semseg"]["meaningful"] is None and "s3://gone" in unknown["semseg"]["reason"]
    checkpoint = judge(ROWS, "checkpoint", own, None)
    assert checkpoint["semseg"]["meaningful"] is None and "checkpoint" in checkpoint["semseg"]["reason"]
    assert checkpoint["depth"]["meaningful"] is False  # not imported is not imported, whatever the source
