"""Training a VQ-VAE tokenizer: the single-process loop, and a 2-process DDP run on gloo that keeps ranks in step."""

from __future__ import annotations

import logging

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file

from fourm_kfp.tokenizers import VQVAEConfig, save_image_tokenizer, train_vqvae

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
