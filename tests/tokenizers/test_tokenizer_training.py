"""Training a VQ-VAE tokenizer: the single-process loop, a 2-process DDP run on gloo that keeps ranks in step, and a
run stopped after a checkpoint that resumes to the uninterrupted run's weights and records."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file

from fourm_kfp.storage import open_store
from fourm_kfp.tokenizers import VQVAEConfig, save_image_tokenizer, train_vqvae
from fourm_kfp.tokenizers.training import Checkpointing
from fourm_kfp.train.checkpoint import CheckpointManager, load_checkpoint, set_rng_state

CONFIG = VQVAEConfig.for_modality(
    "semseg", image_size=16, patch_size=4, hidden_dim=16, depth=1, codebook_size=16, code_dim=8, ema_decay=0.9
)


def batches(seed: int):
    """Step → a batch of random blocky class maps, different per ``seed``."""
    rng = np.random.default_rng(seed)
    return lambda step: {"semseg": rng.integers(0, 6, (4, 4, 4)).repeat(4, 1).repeat(4, 2).astype(np.uint8)}


def test_single_process_training_logs_and_returns_an_eval_model(caplog):
    with caplog.at_level(logging.INFO, logger="fourm_kfp.tokenizers.training"):
        model, records = train_vqvae(CONFIG, batches(0), steps=4, lr=1e-2, log_every=2, warmup_steps=1)
    assert not model.training
    assert [r["step"] for r in records] == [2, 4]
    assert {"loss", "recon", "usage", "perplexity", "samples_per_s", "eta_s"} <= set(records[-1])
    assert "train-tokenizer semseg: step 4/4" in caplog.text and "ETA" in caplog.text


def test_training_is_deterministic_given_the_seed():
    a, _ = train_vqvae(CONFIG, batches(0), steps=2, seed=3)
    b, _ = train_vqvae(CONFIG, batches(0), steps=2, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def _ddp_worker(rank: int, world_size: int, directory: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{directory}/rendezvous", rank=rank, world_size=world_size)
    try:
        model, _ = train_vqvae(CONFIG, batches(100 + rank), steps=3, lr=1e-2, log_every=1, warmup_steps=1)
        save_image_tokenizer(model, f"{directory}/rank{rank}")
    finally:
        dist.destroy_process_group()


def test_two_process_ddp_run_keeps_identical_weights(tmp_path):
    # fork: the children inherit the imported modules, which keeps this test fast.
    mp.start_processes(_ddp_worker, args=(2, str(tmp_path)), nprocs=2, join=True, start_method="fork")
    rank0, rank1 = (load_file(str(tmp_path / f"rank{r}" / "model.safetensors")) for r in (0, 1))
    assert rank0.keys() == rank1.keys()
    for name in rank0:
        assert torch.equal(rank0[name], rank1[name]), name
    assert int(rank0["quantizer.ema_steps"]) == 3
    # Each rank saw different data: the shared codebook statistics count both ranks' tokens.
    single, _ = train_vqvae(CONFIG, batches(100), steps=3, lr=1e-2, warmup_steps=1)
    assert not torch.equal(single.quantizer.ema_cluster_size, rank0["quantizer.ema_cluster_size"])


class _NumberedBatches:
    """Batch ``i`` drawn from a generator seeded ``i``, with the position a checkpoint holds."""

    def __init__(self):
        self.drawn = 0

    def __iter__(self):
        return self

    def __next__(self):
        rng = np.random.default_rng(self.drawn)
        self.drawn += 1
        return {"semseg": rng.integers(0, 6, (4, 4, 4)).repeat(4, 1).repeat(4, 2).astype(np.uint8)}

    def state_dict(self):
        return {"drawn": self.drawn}

    def load_state_dict(self, state):
        self.drawn = state["drawn"]


class _Killed(Exception):
    """The process died just after a checkpoint."""


def _checkpointing(path, every: int, killed_after: int | None = None) -> Checkpointing:
    manager = CheckpointManager(open_store(str(path), create=True), keep_last=1)

    def save(step, *state):
        manager.save(step, *state)
        if step == killed_after:
            raise _Killed

    return Checkpointing(every, save, manager.latest, load_checkpoint, set_rng_state)


def _state(model) -> dict[str, torch.Tensor]:
    """Every parameter and buffer, the quantizer's ring of recent inputs included."""
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


def _history(records) -> list[dict[str, float]]:
    return [{k: v for k, v in r.items() if k not in ("samples_per_s", "eta_s")} for r in records]


def test_a_run_stopped_after_a_checkpoint_resumes_to_the_uninterrupted_weights_and_records(tmp_path, caplog):
    settings = {"steps": 12, "lr": 1e-2, "log_every": 5, "warmup_steps": 2, "seed": 1}
    reference, expected = train_vqvae(CONFIG, _NumberedBatches(), **settings,
                                      checkpointing=_checkpointing(tmp_path / "reference", 4))
    with pytest.raises(_Killed):  # at step 8, in the middle of the log interval 6-10
        train_vqvae(CONFIG, _NumberedBatches(), **settings, checkpointing=_checkpointing(tmp_path / "run", 4, 8))
    caplog.clear()  # the runs above logged their steps too (caplog keeps what earlier tests' levels let through)
    with caplog.at_level(logging.INFO, logger="fourm_kfp.tokenizers.training"):
        resumed, records = train_vqvae(CONFIG, _NumberedBatches(), **settings,
                                       checkpointing=_checkpointing(tmp_path / "run", 4))
    assert "train-tokenizer semseg: resumed from step 8 of 12" in caplog.text
    assert "step 5/12" not in caplog.text and "step 10/12" in caplog.text  # no step before 8 trained again
    for name, tensor in _state(reference).items():
        assert torch.equal(tensor, _state(resumed)[name]), name
    assert _history(records) == _history(expected) and [r["step"] for r in records] == [5, 10, 12]

    caplog.clear()
    untouched = _NumberedBatches()
    with caplog.at_level(logging.INFO, logger="fourm_kfp.tokenizers.training"):
        finished, again = train_vqvae(CONFIG, untouched, **settings, checkpointing=_checkpointing(tmp_path / "run", 4))
    assert "already trained (checkpoint at its last step, 12); not trained again" in caplog.text
    assert untouched.drawn == 12 and _history(again) == _history(expected)  # its position restored, no batch drawn
    assert all(torch.equal(t, _state(finished)[n]) for n, t in _state(reference).items())


def test_a_checkpoint_of_another_world_size_resumes_its_weights_with_batches_from_the_start(tmp_path, caplog):
    settings = {"steps": 6, "lr": 1e-2, "warmup_steps": 1}
    with pytest.raises(_Killed):
        train_vqvae(CONFIG, _NumberedBatches(), **settings, checkpointing=_checkpointing(tmp_path, 3, 3))

    def written_by_two_ranks(ckpt, app_state):
        train_state, rank_state = load_checkpoint(ckpt, app_state)
        return {**train_state, "world": 2}, rank_state

    batches = _NumberedBatches()
    checkpointing = dataclasses.replace(_checkpointing(tmp_path, 3), load=written_by_two_ranks)
    with caplog.at_level(logging.INFO, logger="fourm_kfp.tokenizers.training"):
        train_vqvae(CONFIG, batches, **settings, checkpointing=checkpointing)
    assert "resumed at step 3 on 1 processes from a checkpoint of 2: the batches start again" in caplog.text
    assert batches.drawn == 3  # steps 4 to 6 drew batches 0 to 2


def test_checkpointing_needs_batches_with_a_position(tmp_path):
    with pytest.raises(TypeError, match="checkpointing needs batches with a position"):
        train_vqvae(CONFIG, batches(0), steps=2, checkpointing=_checkpointing(tmp_path, 1))
