"""What a pipeline run on a KFP server is asked and what it answers: :class:`SubmitRequest` (``fourm-kfp submit``'s
arguments), :class:`SubmitResult` (the run, its stages, the model gate's verdict), the exit codes that result maps
to (:data:`EXIT_CODES`) and the closing summary (:func:`describe`).

Exit codes: 0 the run succeeded (the model was promoted or the gate kept the champion without refusing), 1 the run
failed or was cancelled, 2 a user error (bad arguments, or the KFP API unreachable or refusing the request: one
line, no traceback), 3 the run succeeded but the gate refused the model, 4 the run succeeded but the gate's verdict
could not be read (no tracking URI, no evaluate run, an artifact store this machine cannot read: the reason is
printed, or it is neither a decision nor a reason the gate was skipped, e.g. ``{}``), 5 following stopped after the
run was created and before it ended, for whatever reason (the run goes on: ``--attach RUN_ID`` follows it again).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

EXIT_SUCCEEDED, EXIT_FAILED, EXIT_USER_ERROR, EXIT_GATE_REFUSED = 0, 1, 2, 3
EXIT_GATE_UNREAD, EXIT_NOT_FOLLOWED = 4, 5
EXIT_CODES = {EXIT_SUCCEEDED: "the run was created (with --wait: it succeeded and the gate did not refuse the model)",
              EXIT_FAILED: "the run failed or was cancelled",
              EXIT_USER_ERROR: "a user error: bad arguments or parameters, or the KFP API unreachable or refusing "
                               "a request (before the run is created: nothing was started)",
              EXIT_GATE_REFUSED: "the run succeeded but the model gate refused the model (--wait)",
              EXIT_GATE_UNREAD: "the run succeeded but the model gate's verdict could not be read (--wait; the "
                                "reason is printed): the model was not checked",
              EXIT_NOT_FOLLOWED: "following stopped before the run ended (--timeout, interrupted, the KFP API "
                                 "failed too many times in a row, or an error that is not retried, e.g. an expired "
                                 "token or a TLS failure); the run goes on: --attach RUN_ID follows it"}


def error_line(exc: BaseException) -> str:
    """An exception in one line: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def verdict_problem(gate: Any) -> str | None:
    """Why ``gate`` (a parsed ``gate.json``) is not a verdict, else None. A verdict is the gate's decision
    (``promoted``: true or false) or the reason it did not run (``skipped``: a non-empty text)."""
    if not isinstance(gate, dict):
        return "it is not a JSON object"
    if isinstance(gate.get("promoted"), bool) or (isinstance(gate.get("skipped"), str) and gate["skipped"].strip()):
        return None
    return ("it has neither a decision (promoted: true or false) nor the reason the gate was skipped (skipped), "
            f"found {sorted(gate) or 'no fields'}")


@dataclass
class SubmitRequest:
    host: str
    preset: str
    overrides: Sequence[str] = ()
    parameters: dict[str, Any] = field(default_factory=dict)  # other pipeline parameters (stage parameters)
    namespace: str = ""
    experiment: str = "fourm-pretrain"
    pipeline_name: str = "fourm-pretrain"
    package: str = ""  # a compiled pipeline YAML; "" = the committed one
    image_tag: str = ""  # compile for the images of this tag (e.g. a commit); "" = the package's version
    run_name: str = ""
    schedule: str = ""  # a cron expression: create a recurring run instead
    wait: bool = False
    timeout_s: float = 7 * 24 * 3600
    poll_s: float = 10.0
    max_poll_errors: int = 8  # consecutive transient API errors tolerated while following (backoff in between)
    tracking_uri: str = ""


@dataclass
class SubmitResult:
    run_id: str
    url: str
    state: str = ""
    stages: list[dict[str, Any]] = field(default_factory=list)
    gate: dict[str, Any] | None = None
    mlflow_parent_run_id: str = ""
    recurring_run_id: str = ""
    pipeline_id: str = ""
    version_id: str = ""
    stopped: str = ""  # why following stopped before the run ended ("" = it was followed to its end, or not at all)
    gate_error: str = ""  # why the gate's verdict of a succeeded run could not be read

    @property
    def exit_code(self) -> int:
        if self.stopped:
            return EXIT_NOT_FOLLOWED
        if self.recurring_run_id or not self.state:
            return EXIT_SUCCEEDED
        if self.state != "SUCCEEDED":
            return EXIT_FAILED
        if self.gate_error or verdict_problem(self.gate):
            return EXIT_GATE_UNREAD
        if self.gate and not self.gate.get("skipped") and not self.gate.get("promoted"):
            return EXIT_GATE_REFUSED
        return EXIT_SUCCEEDED



def describe(result: SubmitResult) -> str:
    """The job summary: the run's state, the stage table, the gate's verdict, and what the exit status means."""
    state = result.state.lower() + (f" (not followed to its end: {result.stopped})" if result.stopped else "")
    lines = [f"run {result.run_id}: {state}", f"{'stage':18s} {'state':10s} seconds"]
    for stage in result.stages:
        state = stage["state"].lower().replace("_", " ")
        lines.append(f"{stage['name']:18s} {state:10s} {stage['seconds'] if stage['seconds'] is not None else '-'}")
    gate = result.gate
    if result.gate_error:
        lines.append(f"model gate: verdict not read: {result.gate_error}")
    elif gate is None:
        lines.append("model gate: not reached")
    elif gate.get("skipped"):
        lines.append(f"model gate: skipped ({gate['skipped']})")
    else:
        verdict = "promoted to champion" if gate.get("promoted") else "refused"
        lines.append(f"model gate: {verdict}: {gate.get('reason', '')}".rstrip(": "))
    lines.append(f"exit status {result.exit_code}: {EXIT_CODES[result.exit_code]}")
    return "\n".join(lines)

