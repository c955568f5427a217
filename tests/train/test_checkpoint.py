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


def _sharded_save_and_load(rank: int, world: int, init_file: str, root: str, out: str) -> None:
    """One rank: an FSDP2-sharded model trained a step, checkpointed in the background, then loaded into a fresh
    model; writes what it read and whether the weights came back."""
    import json as json_
    import os

    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from torch.distributed.fsdp import fully_shard

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)

    def sharded(seed):
        torch.manual_seed(seed)
        model = nn.Sequential(*[nn.Linear(128, 128, bias=False) for _ in range(4)])
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-2)

    model, opt = sharded(0)
    model(torch.randn(4, 128)).square().mean().backward()
    opt.step()
    manager = CheckpointManager(open_store(root), upload_in_background=True)
    manager.save(1, _app_state(model, opt), {"loader": {"rank": rank}}, {"tokens": 1})
    manager.wait()
    dist.barrier()
    fresh, fresh_opt = sharded(1)
    state = _app_state(fresh, fresh_opt)
    stats = {}
    _, rank_state = load_checkpoint(find_checkpoint(open_store(root)), state, stats)
    set_state_dict(fresh, fresh_opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    same = all(torch.equal(a.full_tensor(), b.full_tensor()) for a, b in
               zip(get_model_state_dict(model).values(), get_model_state_dict(fresh).values()))
    with open(f"{out}/rank-{rank}.json", "w") as fh:
        json_.dump({"bytes_read": stats["bytes_read"], "same": same, "loader": rank_state["loader"]}, fh)
    dist.destroy_process_group()


def test_a_sharded_rank_reads_its_own_shard_of_a_checkpoint_not_every_rank_s(tmp_path):
    """Four FSDP2 ranks save a checkpoint in the background (the marker after every rank's files) and load it back:
    each rank reads the metadata, its own quarter of the state and its own loader state, not the whole checkpoint
    (every rank read every file before)."""
    import json as json_

    import torch.multiprocessing as mp

    world, root = 4, str(tmp_path / "ckpt")
    mp.spawn(_sharded_save_and_load, args=(world, str(tmp_path / "init"), root, str(tmp_path)), nprocs=world)
    store = open_store(root).child(step_dir(1))
    sizes = dict(store.list_sizes())
    state = sum(size for key, size in sizes.items() if key.endswith(".distcp"))
    # its quarter, the metadata, and what every rank holds whole: the optimizer's step counts and hyper-parameters
    # (about 30 KB of pickled scalars here); another rank's shard would add a whole quarter
    share = 1.5 * state / world + sizes[".metadata"]
    results = [json_.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(world)]
    assert all(r["same"] for r in results) and [r["loader"] for r in results] == [{"rank": r} for r in range(world)]
    assert all(r["bytes_read"] <= share for r in results), ([r["bytes_read"] for r in results], share, state)
    assert sum(r["bytes_read"] for r in results) < 1.25 * state + world * sizes[".metadata"]
    assert store.exists(MARKER) and len([k for k in sizes if k.startswith("ranks/")]) == world
