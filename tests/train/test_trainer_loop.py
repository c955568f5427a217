"""The training loop's guards and schedule: non-finite steps skipped (parameters untouched) or failing with the
step range, warmup-then-cosine, weight decay only on matrices, and the step's gradient clipping."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fourm_kfp.config.fourm_config import OptimizerConfig
from fourm_kfp.model.fourm import FourM, FourMArgs
from fourm_kfp.storage import open_store
from fourm_kfp.train.checkpoint import CheckpointManager
from fourm_kfp.train.metrics import MetricWriter
from fourm_kfp.train.optimizer import Schedule, build_optimizer, parameter_groups
from fourm_kfp.train.step import StepSettings, train_step
from fourm_kfp.train.trainer import Loader, LoopSettings, NonFiniteLossError, Trainer

from tests.model.test_fourm import SPECS, random_batch


class PoisonedAt(nn.Module):
    """The model, with a non-finite loss at the given (1-based) calls."""

    def __init__(self, model: FourM, poisoned: set[int]):
        super().__init__()
        self.model, self.poisoned, self.calls = model, poisoned, 0

    def forward(self, batch, with_accuracy: bool = False):
        self.calls += 1
        out = self.model(batch, with_accuracy)
        if self.calls in self.poisoned:
            out.loss = out.loss * float("nan")
        return out


def _trainer(tmp_path, poisoned: set[int], nonfinite: str, steps: int = 6, max_skipped: int = 10) -> Trainer:
    torch.manual_seed(0)
    model = PoisonedAt(FourM(FourMArgs(SPECS, dim=32, heads=4)), poisoned)
    optimizer = build_optimizer(model, OptimizerConfig(), 1e-3)
    batches = lambda: iter([random_batch(seed=i) for i in range(100)])  # noqa: E731
    loop = LoopSettings(total_steps=steps, accum=1, log_every=2, val_every=0, checkpoint_every=100,
                        nonfinite=nonfinite, max_skipped_steps=max_skipped)
    return Trainer(model=model, optimizer=optimizer, schedule=Schedule(1e-3, 1, steps),
                   loader=Loader(batches, lambda: {}, lambda s: None), validate=lambda m: {"val/loss": 1.0},
                   checkpoints=CheckpointManager(open_store(str(tmp_path))), metrics=MetricWriter([]), loop=loop,
                   step_settings=StepSettings(None, 1.0, tuple(s.name for s in SPECS)), device=torch.device("cpu"))


def test_a_non_finite_step_is_skipped_and_leaves_the_parameters_alone(tmp_path):
    trainer = _trainer(tmp_path, {3}, "skip")
    snapshots = []
    original_step = trainer.optimizer.step

    def recording_step(*a, **k):
        snapshots.append(trainer.state.step)
        return original_step(*a, **k)

    trainer.optimizer.step = recording_step
    state = trainer.fit()
    assert state.step == 6 and state.skipped == 1
    assert snapshots == [0, 1, 3, 4, 5]  # no update at step index 2 (the third call)
    logged = [h for h in trainer.metrics.history if "skipped" in h]
    assert [h["skipped"] for h in logged] == [0.0, 1.0, 1.0] and all(math.isfinite(h["loss"]) for h in logged)


def test_nonfinite_fail_names_the_step_range(tmp_path):
    with pytest.raises(NonFiniteLossError, match="between steps 3 and 4"):
        _trainer(tmp_path, {3}, "fail").fit()


def test_too_many_skipped_steps_fail(tmp_path):
    with pytest.raises(NonFiniteLossError, match="max_skipped_steps=1"):
        _trainer(tmp_path, {1, 2, 3}, "skip", max_skipped=1).fit()


def test_schedule_warms_up_linearly_then_decays_by_cosine():
    schedule = Schedule(peak_lr=1.0, warmup_steps=4, total_steps=14, min_lr_ratio=0.1)
    assert [schedule.lr(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert schedule.lr(4) == pytest.approx(1.0) and schedule.lr(9) == pytest.approx(0.55)
    assert schedule.lr(14) == pytest.approx(0.1) and schedule.lr(100) == pytest.approx(0.1)
    values = [schedule.lr(s) for s in range(4, 15)]
    assert values == sorted(values, reverse=True)


def test_weight_decay_only_on_matrices_not_norms_embeddings_or_tokens():
    model = FourM(FourMArgs(SPECS, dim=32, heads=4))
    decayed, plain = parameter_groups(model, 0.05)
    assert decayed["weight_decay"] == 0.05 and plain["weight_decay"] == 0.0
    assert "encoder.0.attn.qkv.weight" in decayed["names"] and "decoder.1.mlp.down.weight" in decayed["names"]
    assert {"mask_token", "encoder.0.norm1.weight", "enc_token_embed.weight", "modality_embed.weight"} <= set(
        plain["names"])
    with_embeddings, _ = parameter_groups(model, 0.05, decay_embeddings=True)
    assert "enc_token_embed.weight" in with_embeddings["names"]
    assert len(decayed["names"]) + len(plain["names"]) == len(list(model.parameters()))


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("grad_clip", [0.05, 0.0])
def test_the_step_clips_like_clip_grad_norm(fused, grad_clip):
    """The fused AdamW clips through its grad_scale input: three updates are clip_grad_norm_'s then AdamW's, up to
    rounding, and the reported norm is the norm before clipping."""
    def build():
        torch.manual_seed(0)
        model = FourM(FourMArgs(SPECS, dim=32, heads=4))
        return model, torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused)

    model, optimizer = build()
    reference, reference_optimizer = build()
    settings = StepSettings(None, grad_clip, tuple(s.name for s in SPECS))
    for seed in range(3):  # Adam's first update hardly depends on the gradient's scale; later ones do
        batch = random_batch(seed=seed)
        out = train_step(model, optimizer, [batch], settings, torch.device("cpu"))
        reference(batch).loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(list(reference.parameters()), grad_clip or float("inf"))
        reference_optimizer.step()
        reference_optimizer.zero_grad()
        assert grad_clip == 0 or norm > 2 * grad_clip  # the clip took effect
        assert torch.allclose(out["grad_norm"], norm)
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(ours, theirs, atol=1e-5)  # Adam magnifies rounding on near-zero gradients
    assert optimizer.grad_scale is None and all(p.grad is None for p in model.parameters())
