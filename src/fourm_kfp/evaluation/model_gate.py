"""The model gate: register an evaluated model in the MLflow model registry and promote it when it is better.

Every evaluated model becomes a new version of a registered model (created on first use) whose source is the
pretrain output URI (the exported ``model/`` folder with its card; a path or ``s3://`` URI, not an MLflow-format
model). The version carries its lineage as tags (``fourm.<key>``: data, tokenizers, pretokenized data, model URIs,
content addresses, manifest digests, pipeline and evaluate run ids) and every metric as ``metric.<name>``, so a
later gate reads the champion's score from the registry alone. The version gets the alias ``candidate``; it takes
the alias ``champion`` when there is no champion, when the champion lacks the primary metric, or when it beats the
champion's primary metric by the relative ``margin`` (strictly better and by at least ``margin * |old|``; a
champion scoring exactly 0 is beaten by any strict improvement). A non-finite
score is never promoted. Aliases only move after the version exists, so ``champion`` never names a missing version.
Works the same on the embedded SQLite store and on a tracking server.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from fourm_kfp.contract.lineage import _client, _quiet_warnings

CANDIDATE, CHAMPION = "candidate", "champion"
METRIC_TAG = "metric."


@dataclass(frozen=True)
class GateDecision:
    model_name: str
    version: str
    promoted: bool
    reason: str
    primary_metric: str
    value: float
    champion_version: str | None
    champion_value: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _beats(new: float, old: float, higher: bool, margin: float) -> bool:
    """Strictly better, and by at least ``margin`` of the champion's magnitude."""
    if higher:
        return new > old and new >= old + margin * abs(old)
    return new < old and new <= old - margin * abs(old)


def _champion(client, model_name: str):
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(model_name, CHAMPION)
    except MlflowException:
        return None


def _decide(name: str, metrics: dict[str, float], champion, higher: bool, margin: float
            ) -> tuple[bool, str, float | None]:
    value = metrics[name]
    if not math.isfinite(value):
        return False, f"{name} is {value}, which is never promoted", None
    if champion is None:
        return True, f"no champion yet; {name} {value:.4g}", None
    raw = champion.tags.get(METRIC_TAG + name)
    old = float(raw) if raw is not None else math.nan
    if not math.isfinite(old):
        return True, f"champion v{champion.version} has no {name}; {name} {value:.4g}", None
    change = (value - old) / abs(old) if old else math.inf
    direction = "higher" if higher else "lower"
    if _beats(value, old, higher, margin):
        return True, (f"{name} {value:.4g} beats champion v{champion.version} ({old:.4g}) by {abs(change):.1%} "
                      f"({direction} is better, margin {margin:.0%})"), old
    return False, (f"{name} {value:.4g} does not beat champion v{champion.version} ({old:.4g}) by the "
                   f"{margin:.0%} margin ({direction} is better)"), old


def register_and_gate(tracking_uri: str, *, model_name: str, model_uri: str, run_id: str | None,
                      metrics: dict[str, float], primary_metric: str, higher_is_better: bool, margin: float,
                      lineage: dict[str, str]) -> GateDecision:
    """Register ``model_uri`` as a new version of ``model_name`` and apply the gate (see the module docstring)."""
    if primary_metric not in metrics:
        raise ValueError(f"evaluate.gate.metric: {primary_metric!r} is not among the evaluation's metrics "
                         f"({', '.join(sorted(metrics))})")
    from mlflow.exceptions import MlflowException

    client = _client(tracking_uri)
    with _quiet_warnings():
        try:
            client.get_registered_model(model_name)
        except MlflowException:
            client.create_registered_model(model_name, description="4M models pre-trained by fourm-kfp")
        tags = {f"fourm.{k}": str(v) for k, v in lineage.items()}
        tags |= {METRIC_TAG + k: repr(float(v)) for k, v in metrics.items()}
        version = client.create_model_version(model_name, model_uri, run_id=run_id, tags=tags,
                                              description=f"fourm-kfp model from {model_uri}")
        champion = _champion(client, model_name)
        promoted, reason, old = _decide(primary_metric, metrics, champion, higher_is_better, margin)
        client.set_registered_model_alias(model_name, CANDIDATE, version.version)
        if promoted:
            client.set_registered_model_alias(model_name, CHAMPION, version.version)
        client.set_model_version_tag(model_name, version.version, "fourm.gate", "promoted" if promoted else "refused")
        client.set_model_version_tag(model_name, version.version, "fourm.gate_reason", reason)
    return GateDecision(model_name, str(version.version), promoted, reason, primary_metric,
                        float(metrics[primary_metric]), None if champion is None else str(champion.version), old)


def champion_info(tracking_uri: str, model_name: str) -> dict[str, Any] | None:
    """The current champion: version, source, metrics (from its tags) and lineage tags; ``None`` if none."""
    champion = _champion(_client(tracking_uri), model_name)
    if champion is None:
        return None
    metrics = {k[len(METRIC_TAG):]: float(v) for k, v in champion.tags.items() if k.startswith(METRIC_TAG)}
    return {"version": str(champion.version), "source": champion.source, "metrics": metrics,
            "tags": {k: v for k, v in champion.tags.items() if not k.startswith(METRIC_TAG)}}
