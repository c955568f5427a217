"""Training metrics: one line per log interval on rank 0, and the same values to every sink.

Sinks sit behind one small interface (:class:`MetricSink`): the console line, MLflow (through the stage's
tracker), a JSON-lines file in the run's output, and a no-op on the other ranks. :class:`Throughput` turns
counters into tokens/s, MFU and ETA. Values come in as Python floats: the trainer reads device tensors only at log
steps, in one transfer.
"""

from __future__ import annotations

import json
import logging
import math
import time
from typing import Any, Mapping, Protocol, Sequence

from fourm_kfp.progress import format_seconds

log = logging.getLogger("fourm_kfp.train")


class MetricSink(Protocol):
    def write(self, step: int, values: Mapping[str, float]) -> None: ...
    def close(self) -> None: ...


class ConsoleSink:
    """``pretrain step 120/600 (20%) loss 4.123 [rgb 4.5 depth 3.9 ...] lr 1.0e-03 ... ETA 0:03:10``."""

    HEAD = ("loss", "lr", "grad_norm", "param_norm", "update_norm", "tokens_per_s", "mfu", "skipped")

    def __init__(self, total_steps: int):
        self.total_steps = total_steps

    def write(self, step: int, values: Mapping[str, float]) -> None:
        if "loss" not in values:
            return  # validation values: the trainer logs its own line for them
        parts = [f"pretrain step {step}/{self.total_steps} ({100 * step / max(self.total_steps, 1):.0f}%)"]
        if "loss" in values:
            parts.append(f"loss {values['loss']:.4f}")
        per_modality = [f"{k.split('/', 1)[1]} {v:.3f}" for k, v in values.items() if k.startswith("loss/")]
        if per_modality:
            parts.append("[" + " ".join(per_modality) + "]")
        for key, fmt in (("lr", "lr {:.2e}"), ("grad_norm", "gnorm {:.3f}"), ("param_norm", "pnorm {:.1f}"),
                         ("update_norm", "unorm {:.2e}"), ("tokens_per_s", "{:.0f} tok/s"),
                         ("mfu", "MFU {:.1%}"), ("skipped", "skipped {:.0f}")):
            if key in values:
                parts.append(fmt.format(values[key]))
        for key, value in values.items():
            if key.startswith("data/") and key.endswith("/epoch"):
                parts.append(f"data {key.split('/')[1]}: {values[key.replace('/epoch', '/seen')]:.0f} seen, "
                             f"epoch {value:.2f}")
        if "eta_s" in values:
            parts.append(f"ETA {format_seconds(values['eta_s'])}")
        log.info(" ".join(parts))

    def close(self) -> None:
        pass


class TrackerSink:
    """The stage's MLflow run (any :class:`fourm_kfp.contract.lineage.Tracker`)."""

    def __init__(self, tracker: Any):
        self.tracker = tracker

    def write(self, step: int, values: Mapping[str, float]) -> None:
        # names keep their "/" (MLflow 3 accepts it and groups the charts by prefix: loss/rgb, val/loss/depth)
        self.tracker.log_metrics({k: v for k, v in values.items() if math.isfinite(v)}, step=step)

    def close(self) -> None:
        pass


#: What the machine measures rather than the training computes (wall-clock rates, the time the step waited on the
#: loader, the accelerator's peak memory): never written into a content-addressed output.
TIMING_KEYS = frozenset({"tokens_per_s", "step_s", "eta_s", "mfu", "data_wait_s", "gpu_memory_max_gib"})


class JsonLinesSink:
    """Lines ``{"step": s, ...}`` kept in memory and written to ``store/key`` on :meth:`flush` and :meth:`close`
    (small: one line per log step). The file is part of the stage's output, so wall-clock measures
    (:data:`TIMING_KEYS`) stay out of it: they go to the console and MLflow."""

    def __init__(self, store: Any, key: str):
        self.store, self.key = store, key
        self.lines: list[str] = []

    def write(self, step: int, values: Mapping[str, float]) -> None:
        kept = {k: v for k, v in values.items() if k not in TIMING_KEYS}
        self.lines.append(json.dumps({"step": step, **kept}, sort_keys=True))

    def replay(self, step: int, values: Mapping[str, float]) -> None:
        """A line an earlier attempt of the run wrote before its checkpoint (a resumed run's history)."""
        self.write(step, values)

    def flush(self) -> None:
        self.store.put_text(self.key, "\n".join(self.lines) + ("\n" if self.lines else ""))

    def close(self) -> None:
        self.flush()


class MetricWriter:
    """Fans values out to sinks; keeps the history for the report's curves."""

    def __init__(self, sinks: Sequence[MetricSink]):
        self.sinks = list(sinks)
        self.history: list[dict[str, float]] = []

    def write(self, step: int, values: Mapping[str, float]) -> None:
        self.history.append({"step": float(step), **values})
        for sink in self.sinks:
            sink.write(step, values)

    def tracker_run(self) -> tuple[str | None, str | None]:
        """The tracking URI and run id of the MLflow run a :class:`TrackerSink` writes to (``None``s without one:
        the other ranks, lineage off)."""
        for sink in self.sinks:
            if isinstance(sink, TrackerSink) and sink.tracker.run_id:
                return sink.tracker.tracking_uri, sink.tracker.run_id
        return None, None

    def saved_history(self) -> list[dict[str, float]]:
        """The history as a checkpoint keeps it: without the wall-clock measures (:data:`TIMING_KEYS`), so that a
        checkpoint's bytes follow from the training alone."""
        return [{k: v for k, v in entry.items() if k not in TIMING_KEYS} for entry in self.history]

    def restore(self, history: Sequence[Mapping[str, float]]) -> None:
        """Take back the history a checkpoint saved (a resumed run): the sinks that keep what they are given
        (``replay``: the JSON lines of the output) get it again; the console and MLflow already had it."""
        self.history = [dict(entry) for entry in history]
        for sink in self.sinks:
            if hasattr(sink, "replay"):
                for entry in self.history:
                    sink.replay(int(entry["step"]), {k: v for k, v in entry.items() if k != "step"})

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


class Throughput:
    """Rates over the interval since the last call: tokens/s, MFU (model FLOPs / peak FLOPs), ETA.

    ``start_step`` and ``start_tokens`` are the counters where this process began (a resumed run: the checkpoint's),
    so the first rates after a resume count only what this process trained."""

    def __init__(self, flops_per_token: float, peak_flops: float, total_steps: int, start_step: int = 0,
                 start_tokens: int = 0):
        self.flops_per_token, self.peak_flops, self.total_steps = flops_per_token, peak_flops, total_steps
        self.last_time, self.last_step, self.last_tokens = time.monotonic(), start_step, start_tokens

    def measure(self, step: int, tokens: int) -> dict[str, float]:
        now = time.monotonic()
        seconds = max(now - self.last_time, 1e-9)
        steps = max(step - self.last_step, 1)
        tokens_per_s = (tokens - self.last_tokens) / seconds
        out = {"tokens_per_s": tokens_per_s, "step_s": seconds / steps,
               "eta_s": (self.total_steps - step) * seconds / steps}
        if self.peak_flops > 0:
            out["mfu"] = tokens_per_s * self.flops_per_token / self.peak_flops
        self.last_time, self.last_step, self.last_tokens = now, step, tokens
        return out
