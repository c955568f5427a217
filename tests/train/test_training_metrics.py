"""What the trainer measures about itself: tokens/s and MFU right after a resume count only the tokens trained
since the resume, the time each step waited on the loader, and metric names reaching MLflow with their ``/``."""

from __future__ import annotations

import time

import torch

from fourm_kfp.config.fourm_config import OptimizerConfig
from fourm_kfp.contract import lineage
from fourm_kfp.model.fourm import FourM, FourMArgs
from fourm_kfp.storage import open_store
from fourm_kfp.train.checkpoint import CheckpointManager
from fourm_kfp.train.metrics import MetricWriter, TrackerSink
from fourm_kfp.train.optimizer import Schedule, build_optimizer
from fourm_kfp.train.step import StepSettings
from fourm_kfp.train.trainer import Loader, LoopSettings, Trainer

from tests.model.test_fourm import SPECS, random_batch


class Recording:
    """A metric sink keeping every line it is given."""

    def __init__(self):
        self.lines: list[tuple[int, dict[str, float]]] = []

    def write(self, step, values):
        self.lines.append((step, dict(values)))

    def close(self):
        pass


class CountingLoader:
    """Micro-batches from a position it can save and restore; each one takes ``delay_s`` to arrive."""

    def __init__(self, delay_s: float = 0.0):
        self.position, self.delay_s = 0, delay_s

    def batches(self):
        while True:
            time.sleep(self.delay_s)
            self.position += 1
            yield random_batch(seed=self.position)

    def as_loader(self) -> Loader:
        return Loader(self.batches, lambda: {"position": self.position},
                      lambda state: setattr(self, "position", state["position"]))


def _trainer(root, total_steps: int, sinks: list, loader: CountingLoader) -> Trainer:
    torch.manual_seed(0)
    model = FourM(FourMArgs(SPECS, dim=32, heads=4))
    optimizer = build_optimizer(model, OptimizerConfig(), 1e-3)
    loop = LoopSettings(total_steps=total_steps, accum=1, log_every=2, val_every=0, checkpoint_every=4,
                        nonfinite="skip", max_skipped_steps=10, flops_per_token=1e6, peak_flops=1e12)
    return Trainer(model=model, optimizer=optimizer, schedule=Schedule(1e-3, 1, 8), loader=loader.as_loader(),
                   validate=lambda m: {"val/loss": 1.0}, checkpoints=CheckpointManager(open_store(str(root))),
                   metrics=MetricWriter(sinks), loop=loop,
                   step_settings=StepSettings(None, 1.0, tuple(s.name for s in SPECS)), device=torch.device("cpu"))


def _train_lines(sink: Recording) -> list[tuple[int, dict[str, float]]]:
    return [(step, values) for step, values in sink.lines if "tokens_per_s" in values]


def test_the_first_rates_after_a_resume_count_only_the_tokens_since_the_resume(tmp_path):
    first = _trainer(tmp_path, 4, [Recording()], CountingLoader())
    first.fit()  # checkpoint at step 4
    sink = Recording()
    resumed = _trainer(tmp_path, 8, [sink], CountingLoader())
    assert resumed.restore()
    tokens_at_resume = resumed.state.tokens
    assert resumed.state.step == 4 and tokens_at_resume > 0
    resumed.fit()
    step, values = _train_lines(sink)[0]
    assert step == 6
    seconds = values["step_s"] * (step - 4)  # the interval the rate was measured over
    trained = values["tokens"] - tokens_at_resume
    assert abs(values["tokens_per_s"] * seconds - trained) <= 1e-6 * trained
    assert abs(values["mfu"] - values["tokens_per_s"] * 1e6 / 1e12) <= 1e-12


def test_the_loader_wait_is_measured_per_log_interval(tmp_path):
    sink = Recording()
    _trainer(tmp_path, 4, [sink], CountingLoader(delay_s=0.05)).fit()
    lines = _train_lines(sink)
    assert [step for step, _ in lines] == [2, 4]
    for _, values in lines:  # two steps per interval, one micro-batch each, 50 ms apiece
        assert 0.1 <= values["data_wait_s"] < values["step_s"] * 2
        assert "gpu_memory_max_gib" not in values  # a CPU run has no accelerator memory to report


def test_metric_names_reach_mlflow_with_their_slash(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = lineage.default_tracking_uri(tmp_path)
    with lineage.stage_run(uri, None, "pretrain") as tracker:
        TrackerSink(tracker).write(2, {"loss/rgb": 4.5, "val/loss/depth": 3.25, "loss": float("nan")})
    logged = MlflowClient(tracking_uri=uri).get_run(tracker.run_id).data.metrics
    assert logged == {"loss/rgb": 4.5, "val/loss/depth": 3.25}
