"""Same address, same bytes: two fresh smoke runs of the whole pipeline commit byte-identical payloads, one on local
disk with one worker per fan-out stage, the other on the S3 server with two, and ``fourm-kfp verify`` recomputes a
committed stage and finds it the same (or names what is not).

Each run is a new process with its own hash seeds, in its own empty run folder on this machine, as a new user would
try it (under ``make test`` the two may run at the same time, on two workers). The payload is every committed file
but the stage's run records and the manifest (timings, run ids and where the store is live there).
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from fourm_kfp.contract.manifest import payload_differences, payload_files
from fourm_kfp.stages import PIPELINE
from fourm_kfp.storage import open_store
from tests.smoke_runs import CLI

pytestmark = pytest.mark.slow


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=600, env=dict(os.environ))


@pytest.fixture
def two_runs(second_smoke_run, fresh_smoke_run, s3_env) -> tuple[dict, dict]:
    """The session's two fresh smoke runs, each from an empty folder: the local one every test reads, and the one
    on the S3 server that the S3 end-to-end test reruns after this module (made first: another worker may be making
    the first meanwhile); with this process's S3 credentials set."""
    return fresh_smoke_run, second_smoke_run


def _manifest(uri: str) -> dict:
    return json.loads(open_store(uri).get_bytes("_MANIFEST.json"))


def test_two_fresh_runs_commit_the_same_bytes(two_runs):
    first, second = two_runs
    assert [s["name"] for s in first["stages"]] == [spec.name for spec in PIPELINE if spec.name != "label"]  # off
    for a, b in zip(first["stages"], second["stages"]):
        assert a["status"] == b["status"] == "ran"
        assert a["output_uri"] != b["output_uri"]  # two stores...
        assert a["output_uri"].rsplit("/", 2)[1:] == b["output_uri"].rsplit("/", 2)[1:]  # ...one address
        ma, mb = _manifest(a["output_uri"]), _manifest(b["output_uri"])
        differences = payload_differences(ma, mb)
        assert not differences, (f"{a['name']}: {len(differences)} payload files differ between two fresh runs, "
                                 f"first {differences[0]} ({a['output_uri']} vs {b['output_uri']})")
        assert ma["payload_digest"] == mb["payload_digest"]
        assert ma["deterministic"] is True and ma["nondeterminism"] == []  # CPU
        assert ma["timings"] != mb["timings"] or ma["mlflow_run_id"] != mb["mlflow_run_id"]  # run records do differ
        # Nothing in the payload names where its store is.
        for key in payload_files(ma):
            if key.endswith((".json", ".jsonl", ".md", ".html", ".txt")):
                text = open_store(a["output_uri"]).get_text(key)
                assert first["root"] not in text, f"{a['name']}/{key} names its run folder {first['root']}"
                bucket = second["store"].split("/")[2]
                assert bucket not in open_store(b["output_uri"]).get_text(key), f"{b['name']}/{key} names {bucket}"


def test_the_evaluate_payload_leaves_the_gate_decision_to_run_records(two_runs):
    first, _ = two_runs
    evaluate = _manifest(first["stages"][-1]["output_uri"])
    assert "gate.json" in evaluate["run_records"]
    assert "gate.json" not in payload_files(evaluate)
    assert "evaluation.json" in payload_files(evaluate)


def test_verify_recomputes_a_committed_stage_and_finds_the_same_bytes(two_runs, tmp_path):
    first, _ = two_runs
    out = tmp_path / "verify.json"
    proc = _cli("verify", "train-tokenizers", "--preset", "smoke", "--root", first["root"], "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert result["matches"] and result["differences"] == [] and result["files"] > 5
    assert result["payload_digest"] == result["recomputed_payload_digest"]
    assert "verified: the same bytes" in proc.stdout
    # Nothing was registered or logged by the recomputation, and the committed output is untouched.
    assert _manifest(first["stages"][1]["output_uri"])["payload_digest"] == result["payload_digest"]


def test_verify_names_a_corrupt_file_and_fails(two_runs, tmp_path):
    _, second = two_runs
    pretokenize = next(s for s in second["stages"] if s["name"] == "pretokenize")
    store = open_store(pretokenize["output_uri"])
    victim = "val/tok_depth/shard-000000.tar"
    original = store.get_bytes(victim)
    store.put_bytes(victim, original[:-1] + bytes([original[-1] ^ 1]))
    try:
        proc = _cli("verify", "pretokenize", "--preset", "smoke", "--root", second["root"], "--store",
                    second["store"], "--s3-endpoint", second["endpoint"], "--scratch", str(tmp_path / "scratch"))
    finally:
        store.put_bytes(victim, original)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"corrupt  {victim}" in proc.stdout
    assert f"(first: {victim})" in proc.stdout
    # --scratch keeps the recomputed output where asked: its payload is the committed one.
    recomputed = next((tmp_path / "scratch" / "pretokenize").iterdir())
    assert payload_differences(_manifest(pretokenize["output_uri"]), _manifest(str(recomputed))) == []
