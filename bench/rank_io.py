"""Training I/O at rank scale, simulated on the CPU: 8 gloo ranks of the pretrain stage (FSDP2) save, are killed and
resume, over a pretokenized dataset of 2,000 shards on a local S3 server.

    .venv/bin/python bench/rank_io.py [--ranks 8] [--shards 2000] [--steps 12] [--kill-after 6] [--output x.json]

It prints one JSON object:

* ``resume``: the bytes each rank read from the store when it resumed (its log line ``checkpoint: rank R read B
  bytes``, which counts ``.metadata``, the byte ranges of its own load plan, its rank state and the train state),
  against the checkpoint's size: under FSDP a rank's share is about ``1/ranks`` of it plus the metadata.
* ``save``: the seconds each save held a rank (``staged in``: serialising the state locally, and waiting for the
  save before it), against the seconds its upload took in the background (``uploaded ... in``); ``_COMPLETE`` is
  written by rank 0 after every rank's files (checked: every rank's JSON precedes it in the listing's times).
* ``loader``: a rank's token loader over the 2,000 shards: the S3 requests of its start-up and of the shard draws
  after it, by kind (a draw lists nothing).
* ``bit_identical``: the payload digest of the killed-and-resumed run equals the uninterrupted run's.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fourm_kfp import storage
from fourm_kfp.distributed import free_port
from fourm_kfp.hardware import cpu_matmul_rate
from fourm_kfp.testing import serve_s3

from bench_output import emit
from process_tree import descendants

BIN = Path(sys.executable).parent
READ = re.compile(r"checkpoint: rank (\d+) read (\d+) bytes of step (\d+)")
STAGED = re.compile(r"\[default(\d+)\]:.*checkpoint: step (\d+) staged in ([\d.]+)s")
UPLOADED = re.compile(r"checkpoint: rank (\d+) uploaded (\d+) bytes of step (\d+) in ([\d.]+)s")


def data_settings(shards: int) -> list[str]:
    return [f"prepare_data.num_train={shards}", "prepare_data.num_val=8", "prepare_data.samples_per_shard=1"]


def train_settings(steps: int, every: int, ranks: int) -> list[str]:
    return ["train.parallelism=fsdp", f"train.steps={steps}", f"train.checkpoint_every={every}",
            f"train.global_batch_size={2 * ranks}", "train.loader_workers=0", "train.val_every=0",
            "train.model.dim=128", "train.model.heads=4", "train.keep_last=4"]


def cli(stage: str, store: str, endpoint: str, settings: list[str], extra: list[str] = ()) -> list[str]:
    command = ["stage", stage, "--preset", "smoke", "--store", store, "--s3-endpoint", endpoint, *extra]
    for setting in settings:
        command += ["--set", setting]
    return command


def run(command: list[str], env: dict, log: Path, wait: bool = True) -> subprocess.Popen:
    with open(log, "ab") as fh:
        proc = subprocess.Popen(command, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    if wait and proc.wait() != 0:
        raise SystemExit(f"{' '.join(command)} exited {proc.returncode}; see {log}")
    return proc


def torchrun(ranks: int, args: list[str], root: Path) -> list[str]:
    return [str(BIN / "torchrun"), "--nproc-per-node", str(ranks), "--master-port", str(free_port()),
            "--tee", "3", "--log-dir", str(root / "torchrun-logs"), "-m", "fourm_kfp.cli", *args, "--root", str(root)]


def loader_requests(pretokenized: str, tokenizers: str, settings: list[str], ranks: int, batches: int) -> dict:
    """One rank's token loader over the dataset: requests of its start-up, then of ``batches`` batches."""
    import torch

    from fourm_kfp.config.loader import load_config
    from fourm_kfp.masking.token_loader import TokenLoader
    from fourm_kfp.storage import metering
    from fourm_kfp.train.build import TrainingInputs, loader_args, masking_args, modality_specs

    config = load_config("smoke", overrides=settings)
    inputs = TrainingInputs.read(pretokenized, tokenizers)
    specs = modality_specs(config, inputs)
    args = loader_args(config, inputs, masking_args(config, specs, inputs), 2, 3, ranks, torch.device("cpu"))
    loader = TokenLoader(args)
    before = metering.snapshot()
    stream = loader.batches()
    next(stream)
    start_up = metering.since(before)
    before = metering.snapshot()
    list(itertools.islice(stream, batches))
    draws = loader.positions[0][0]
    used = metering.since(before)
    return {"start_up": start_up.to_dict(), "batches": batches, "shards_drawn": draws, "after": used.to_dict(),
            "list_requests_per_draw": used.requests.get("list", 0) / max(draws, 1),
            "requests_per_draw": used.total_requests / max(draws, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--shards", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--kill-after", type=int, default=6, help="the checkpoint step after which the job is killed")
    parser.add_argument("--work", default=None)
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="fourm-rank-io-"))
    work.mkdir(parents=True, exist_ok=True)
    log = work / "bench.log"
    rate = cpu_matmul_rate()
    with serve_s3(work / "s3", "rankiobenchkey", "rankiobenchsecret") as server:
        env = {**os.environ, **server.env(), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        os.environ.update(server.env())
        storage._CLIENTS.clear()
        data = data_settings(args.shards)
        data_root, data_store = work / "data", "s3://rank-io/data"
        outcomes = {}
        for stage in ("prepare-data", "train-tokenizers", "pretokenize"):
            print(f"[rank_io] {stage} ...", file=sys.stderr, flush=True)
            out = data_root / f"{stage}.json"
            run([str(BIN / "fourm-kfp"), *cli(stage, data_store, server.endpoint, data,
                                              ["--json", str(out)]), "--root", str(data_root)], env, log)
            outcomes[stage] = json.loads(out.read_text())["output_uri"]
        inputs = ["--input", f"pretokenize={outcomes['pretokenize']}",
                  "--input", f"train-tokenizers={outcomes['train-tokenizers']}"]
        train = data + train_settings(args.steps, args.kill_after, args.ranks)
        print("[rank_io] loader over the shards ...", file=sys.stderr, flush=True)
        loader = loader_requests(outcomes["pretokenize"], outcomes["train-tokenizers"], train, args.ranks, 40)

        print("[rank_io] uninterrupted run ...", file=sys.stderr, flush=True)
        full_root = work / "full"
        run(torchrun(args.ranks, cli("pretrain", "s3://rank-io/full", server.endpoint, train, inputs), full_root),
            env, log)
        print("[rank_io] run killed after a checkpoint ...", file=sys.stderr, flush=True)
        killed_root, killed_store = work / "killed", "s3://rank-io/killed"
        proc = run(torchrun(args.ranks, cli("pretrain", killed_store, server.endpoint, train, inputs), killed_root),
                   env, log, wait=False)
        marker = None
        while proc.poll() is None and marker is None:
            found = [k for k in storage.open_store(killed_store).list("pretrain")
                     if k.endswith(f"checkpoints/step-{args.kill_after:08d}/_COMPLETE")]
            marker = found[0] if found else None
            time.sleep(0.2)
        if marker is None:
            raise SystemExit(f"the run ended before its step-{args.kill_after} checkpoint; see {log}")
        _kill_tree(proc.pid)  # the ranks start sessions of their own: the process group is not enough
        proc.wait()
        killed_log_end = log.stat().st_size
        print("[rank_io] resumed run ...", file=sys.stderr, flush=True)
        run(torchrun(args.ranks, cli("pretrain", killed_store, server.endpoint, train, inputs), killed_root),
            env, log)
        full = _manifest(storage.open_store("s3://rank-io/full"))
        resumed = _manifest(storage.open_store(killed_store))
        checkpoint = storage.open_store(killed_store).child(marker.rsplit("/", 1)[0])
        sizes = dict(checkpoint.list_sizes())

    text = log.read_text()
    resume_lines = [m for m in READ.finditer(text[killed_log_end:]) if int(m.group(3)) == args.kill_after]
    read = {int(m.group(1)): int(m.group(2)) for m in resume_lines}
    state_bytes = sum(size for key, size in sizes.items() if key.endswith(".distcp"))
    metadata_bytes = sizes.get(".metadata", 0)
    staged = [float(m.group(3)) for m in STAGED.finditer(text)]
    uploaded = [float(m.group(4)) for m in UPLOADED.finditer(text)]
    result = {
        "benchmark": "rank_io", "date": dt.date.today().isoformat(),
        "command": "python bench/rank_io.py " + " ".join(sys.argv[1:]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), **rate},
        "ranks": args.ranks, "shards": args.shards, "parallelism": "fsdp", "steps": args.steps,
        "checkpoint": {"step": args.kill_after, "state_bytes": state_bytes, "metadata_bytes": metadata_bytes,
                       "files": len(sizes), "bytes_total": sum(sizes.values())},
        "resume": {"bytes_read_per_rank": read,
                   "max_over_state": max(read.values()) / state_bytes if read else None,
                   "max_over_share": (max(read.values()) / (state_bytes / args.ranks + metadata_bytes)
                                      if read else None),
                   "all_ranks_over_state": sum(read.values()) / state_bytes if read else None},
        "save": {"stall_seconds": _spread(staged), "upload_seconds": _spread(uploaded)},
        "loader": loader,
        "bit_identical": full["payload_digest"] == resumed["payload_digest"],
        "payload_digests": {"uninterrupted": full["payload_digest"], "resumed": resumed["payload_digest"]},
    }
    emit(result, args.output)
    if len(read) != args.ranks or not result["bit_identical"]:
        raise SystemExit("a rank did not log its resume, or the resumed run is not bit-identical")


def _kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it, as a node's loss would."""
    for process in [pid, *descendants(pid)]:
        try:
            os.kill(process, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _manifest(root) -> dict:
    keys = [k for k in root.list("pretrain") if k.endswith("/_MANIFEST.json") and k.count("/") == 2]
    return json.loads(root.get_bytes(keys[0]))


def _spread(values: list[float]) -> dict:
    values = sorted(values)
    if not values:
        return {"count": 0}
    return {"count": len(values), "median": values[len(values) // 2], "max": values[-1], "min": values[0]}


if __name__ == "__main__":
    main()
