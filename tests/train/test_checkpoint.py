"""Checkpoints: a saved state loads back exactly; only complete checkpoints count; retention keeps the newest K
plus every M-th step; local disk and S3 alike."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from fourm_kfp.storage import open_store
from fourm_kfp.train.checkpoint import (MARKER, CheckpointManager, complete_checkpoints, find_checkpoint,
                                        load_checkpoint, step_dir)


def _trained(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(3):
        model(torch.randn(5, 4)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def _app_state(model, opt):
    model_sd, optim_sd = get_state_dict(model, opt)
    return {"model": model_sd, "optim": optim_sd}


def test_save_then_load_restores_model_optimizer_rng_and_loader_state(any_store_uri):
    store = open_store(any_store_uri, create=True).child("checkpoints")
    model, opt = _trained(0)
    manager = CheckpointManager(store, keep_last=2)
    torch.manual_seed(123)
    expected_draw = torch.rand(3)
    torch.manual_seed(123)
    manager.save(7, _app_state(model, opt), {"loader": {"epoch": 1, "consumed": 40}}, {"tokens": 99})
    torch.rand(10)  # move the RNG on

    fresh, fresh_opt = _trained(1)
    state = _app_state(fresh, fresh_opt)
    ckpt = find_checkpoint(store)
    assert ckpt is not None and ckpt.step == 7
    train_state, rank_state = load_checkpoint(ckpt, state)
    set_state_dict(fresh, fresh_opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values()):
        assert torch.equal(a, b)
    assert torch.equal(opt.state_dict()["state"][0]["exp_avg"], fresh_opt.state_dict()["state"][0]["exp_avg"])
    assert train_state == {"step": 7, "tokens": 99} and rank_state["loader"] == {"epoch": 1, "consumed": 40}
    from fourm_kfp.train.checkpoint import set_rng_state

    set_rng_state(rank_state["rng"])
    assert torch.equal(torch.rand(3), expected_draw)


def test_incomplete_checkpoints_are_ignored_and_retention_prunes(tmp_path):
    store = open_store(str(tmp_path / "ckpt"), create=True)
    model, opt = _trained(0)
    manager = CheckpointManager(store, keep_last=2, keep_every=20)
    for step in (10, 20, 30, 40, 50):
        manager.save(step, _app_state(model, opt), {}, {})
    assert [c.step for c in complete_checkpoints(store)] == [20, 40, 50]  # last two + every 20th
    store.put_bytes(f"{step_dir(60)}/.metadata", b"half written")  # killed while saving step 60
    assert manager.latest().step == 50
    assert not store.exists(f"{step_dir(60)}/{MARKER}")
    manager.save(60, _app_state(model, opt), {}, {})
    assert manager.latest().step == 60
