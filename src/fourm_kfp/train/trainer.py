"""The 4M trainer: restore, then a short loop around the pure step; logging, validation, checkpoints around it.

Everything the loop needs is built elsewhere (:mod:`fourm_kfp.train.build`) and handed in, so the loop reads as the
algorithm: take ``accum`` micro-batches, step, and at interval boundaries log (one host read of the accumulated
device values), validate, snapshot the weights, checkpoint. A restarted run resumes from the newest complete
checkpoint by itself and continues bit-for-bit: model, optimizer, step, RNG and the loader's position all come back.
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import nn

from fourm_kfp import distributed
from fourm_kfp.batch import MaskedBatch
from fourm_kfp.train.checkpoint import CheckpointManager, find_checkpoint, load_checkpoint, set_rng_state
from fourm_kfp.train.metrics import MetricWriter, Throughput
from fourm_kfp.train.optimizer import Schedule, set_learning_rate
from fourm_kfp.train.step import (StepSettings, global_norm, optimized_parameters, parameter_snapshot, to_host,
                                  train_step, update_norm)
from fourm_kfp.train.system_metrics import node_system_metrics

log = logging.getLogger("fourm_kfp.train")


class NonFiniteLossError(RuntimeError):
    """Training produced non-finite losses or gradients (``nonfinite: fail``, or too many skipped steps)."""


@dataclass
class TrainState:
    """Counters that a checkpoint carries besides model, optimizer, RNG and loader."""

    step: int = 0
    tokens: int = 0
    samples: int = 0
    skipped: int = 0


@dataclass(frozen=True, kw_only=True)
class LoopSettings:
    total_steps: int
    accum: int  # micro-batches per optimizer step on each rank
    log_every: int
    val_every: int  # 0: only at the start and the end
    checkpoint_every: int
    nonfinite: str  # "skip" | "fail"
    max_skipped_steps: int
    profile_steps: int = 0
    snapshot_every: int = 0  # 0: no weight snapshots
    flops_per_token: float = 0.0
    peak_flops: float = 0.0


@dataclass
class Loader:
    """What the trainer needs of a data loader: micro-batches, and a position it can save and restore."""

    batches: Callable[[], Iterator[MaskedBatch]]  # a fresh iterator from the current position
    state_dict: Callable[[], dict[str, Any]]  # position after the batches consumed so far
    load_state_dict: Callable[[dict[str, Any]], None]
    metrics: Callable[[], dict[str, float]] = dict  # e.g. examples seen and epoch per dataset


@dataclass(kw_only=True)
class Trainer:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    schedule: Schedule
    loader: Loader
    validate: Callable[[nn.Module], dict[str, float]]  # fixed-seed val metrics ("val/loss/<modality>", ...)
    checkpoints: CheckpointManager
    metrics: MetricWriter
    loop: LoopSettings
    step_settings: StepSettings
    device: torch.device
    profile_dir: Path | None = None
    snapshot: Callable[[int], None] | None = None  # export the weights at this step (called on every rank)
    state: TrainState = field(default_factory=TrainState)
    val_history: list[dict[str, float]] = field(default_factory=list)

    # -- restore -----------------------------------------------------------------------------------------------

    def app_state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def restore(self, resume_from: str | None = None) -> bool:
        """Resume from this run's newest complete checkpoint (else ``resume_from``, a cool-down start); returns
        whether anything was restored."""
        from torch.distributed.checkpoint.state_dict import set_state_dict

        from fourm_kfp.storage import open_store

        ckpt = self.checkpoints.latest()
        own = ckpt is not None
        if ckpt is None and resume_from:
            ckpt = find_checkpoint(open_store(resume_from))
            if ckpt is None:
                from fourm_kfp.config.schema import ConfigError

                raise ConfigError(f"train.resume_from: no complete checkpoint at {resume_from}")
        if ckpt is None:
            return False
        state = self.app_state()
        train_state, rank_state = load_checkpoint(ckpt, state)
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        if own:  # a restart of this run: continue exactly where it stopped
            self.state = TrainState(**{k: train_state[k] for k in asdict(TrainState()) if k in train_state})
            self.metrics.restore(train_state.get("metrics_history", []))  # the output's metrics from step 0
            self.val_history = [dict(v) for v in train_state.get("val_history", [])]
            if rank_state is not None:
                self.loader.load_state_dict(rank_state["loader"])
                set_rng_state(rank_state["rng"])
        log.info("resumed from %s (step %d)%s", ckpt.uri, ckpt.step, "" if own else " as a cool-down start")
        return True

    # -- the loop ----------------------------------------------------------------------------------------------

    def fit(self) -> TrainState:
        """Train to ``loop.total_steps`` (with each node's system metrics in the stage's MLflow run, when MLflow's
        ``MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING`` is on)."""
        with node_system_metrics(*self.metrics.tracker_run()):
            return self._fit()

    def _fit(self) -> TrainState:
        loop = self.loop
        if self.state.step == 0:
            self._validate()
        batches = self.loader.batches()
        throughput = Throughput(loop.flops_per_token, loop.peak_flops, loop.total_steps, self.state.step,
                                self.state.tokens)
        interval = _Interval(self.device)
        profiler = self._profiler()
        while self.state.step < loop.total_steps:
            step = self.state.step
            waiting_since = time.monotonic()  # the loader's wait, timed on the host: no device sync
            micro = [next(batches) for _ in range(loop.accum)]
            interval.data_wait_s += time.monotonic() - waiting_since
            self.state.samples += sum(b.batch_size for b in micro) * distributed.world_size()
            self.state.tokens += _tokens(micro) * distributed.world_size()
            set_learning_rate(self.optimizer, self.schedule.lr(step))
            logging_now = (step + 1) % loop.log_every == 0 or step + 1 == loop.total_steps
            before = parameter_snapshot(self.optimizer) if logging_now else None
            values = train_step(self.model, self.optimizer, [b.to(self.device) for b in micro],
                                self.step_settings, self.device)
            interval.add(values)
            self.state.step = step + 1
            if profiler is not None:
                profiler.step()
                if self.state.step >= loop.profile_steps + 1:  # one wait step, then the active ones
                    profiler.stop()
                    profiler = None
            if logging_now:
                self._log(interval, before, throughput, step)
                interval = _Interval(self.device)
            if loop.val_every and self.state.step % loop.val_every == 0 and self.state.step < loop.total_steps:
                self._validate()
            if (self.snapshot and loop.snapshot_every and self.state.step % loop.snapshot_every == 0
                    and self.state.step < loop.total_steps):  # the last step's weights are the exported model
                self.snapshot(self.state.step)
            if self.state.step % loop.checkpoint_every == 0 or self.state.step == loop.total_steps:
                self._checkpoint()
        if not self.val_history or self.val_history[-1]["step"] != self.state.step:
            self._validate()
        self.checkpoints.wait()  # the last checkpoint's upload, which the validation above overlapped
        self.metrics.close()
        return self.state

    def _log(self, interval: "_Interval", before: list[torch.Tensor] | None, throughput: Throughput,
             step: int) -> None:
        extra = {"param_norm": global_norm(optimized_parameters(self.optimizer))}
        if before is not None:
            extra["update_norm"] = update_norm(self.optimizer, before)
        host = to_host({**interval.means(), **extra})
        skipped_now = int(host.pop("skipped"))
        self.state.skipped += skipped_now
        first = step + 2 - interval.steps
        if skipped_now and self.loop.nonfinite == "fail":
            raise NonFiniteLossError(f"non-finite loss or gradient between steps {first} and {step + 1} "
                                     "(train.nonfinite: fail)")
        if skipped_now:
            log.warning("skipped %d non-finite step(s) between steps %d and %d", skipped_now, first, step + 1)
        if self.state.skipped > self.loop.max_skipped_steps:
            raise NonFiniteLossError(f"{self.state.skipped} steps skipped as non-finite (last between steps "
                                     f"{first} and {step + 1}), more than train.max_skipped_steps="
                                     f"{self.loop.max_skipped_steps}")
        host.update(lr=self.schedule.lr(step), skipped=float(self.state.skipped),
                    tokens=float(self.state.tokens), samples=float(self.state.samples))
        host.update(throughput.measure(self.state.step, self.state.tokens))
        host.update(data_wait_s=interval.data_wait_s, **_accelerator_memory(self.device))
        host.update(self.loader.metrics())
        self.metrics.write(self.state.step, host)

    def _validate(self) -> None:
        self.model.eval()
        with torch.no_grad():
            values = self.validate(self.model)
        self.model.train()
        self.val_history.append({"step": float(self.state.step), **values})
        self.metrics.write(self.state.step, values)
        shown = " ".join(f"{k.split('/', 2)[-1]} {v:.3f}" for k, v in values.items() if k.startswith("val/loss/"))
        log.info("validation at step %d: loss %.4f [%s]", self.state.step, values.get("val/loss", math.nan), shown)

    def _checkpoint(self) -> None:
        counters = {k: v for k, v in asdict(self.state).items() if k != "step"}
        self.checkpoints.save(self.state.step, self.app_state(), {"loader": self.loader.state_dict()},
                              {**counters, "metrics_history": self.metrics.saved_history(), "val_history": self.val_history})
        log.info("checkpoint: step %d staged in %.2fs", self.state.step,
                 self.checkpoints.last_stall_s)

    def _profiler(self):
        if not self.loop.profile_steps or not distributed.is_primary() or self.state.step > 0:
            return None
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        target = self.profile_dir or Path(tempfile.mkdtemp(prefix="fourm-profile-"))
        profiler = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=1, warmup=0, active=self.loop.profile_steps, repeat=1),
            on_trace_ready=lambda prof: prof.export_chrome_trace(str(target / "trace.json")))
        profiler.start()
        return profiler


def _accelerator_memory(device: torch.device) -> dict[str, float]:
    """The peak memory the CUDA caching allocator handed out since the last log step (``gpu_memory_max_gib``), then
    the peak is reset. The allocator's counters live on the host: reading them waits on nothing on the device."""
    if device.type != "cuda":
        return {}
    peak = torch.cuda.max_memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    return {"gpu_memory_max_gib": peak / 2**30}


def _tokens(micro: list[MaskedBatch]) -> int:
    """Input + target tokens of CPU-side batches (counted before they move to the device: no sync)."""
    return sum(int(b.enc_valid.sum()) + int(b.dec_valid.sum()) for b in micro)


class _Interval:
    """Device-side sums over a log interval; read back once, at the log step."""

    def __init__(self, device: torch.device):
        self.sums: dict[str, torch.Tensor] = {}
        self.counts: dict[str, torch.Tensor] = {}
        self.skipped = torch.zeros((), device=device)
        self.steps = 0
        self.data_wait_s = 0.0  # host seconds the loop waited for the loader's micro-batches

    def add(self, values: dict[str, torch.Tensor]) -> None:
        finite = values["finite"]
        self.skipped = self.skipped + (~finite).float()
        self.steps += 1
        for key, value in values.items():
            if key == "finite":
                continue
            ok = finite & torch.isfinite(value)
            self.sums[key] = self.sums.get(key, 0) + torch.where(ok, value.float(), 0.0)
            self.counts[key] = self.counts.get(key, 0) + ok.float()

    def means(self) -> dict[str, torch.Tensor]:
        out = {k: self.sums[k] / self.counts[k] for k in self.sums}  # NaN where never finite/present
        out["skipped"] = self.skipped
        return out
