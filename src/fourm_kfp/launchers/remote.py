"""One stage on other machines: the skeleton every remote launcher shares, with the backend as the part that varies.

:func:`launch_remote` does, for a Kubernetes job (:mod:`.kubernetes_job`) and a torchx app (:mod:`.torchx_job`)
alike:

1. **plan** — the stage's content address follows from the config; when that output is committed (and ``force`` is
   off) it is reported through the ordinary stage runner (an MLflow child run tagged as reused), from the plan's
   config, store and manifest as they are, and nothing is started;
2. **check** what the backend needs (e.g. a store the remote processes can reach) and open the inputs here, so a
   missing input fails once and not in every replica;
3. **start** the backend with the remote processes' command (:func:`stage_command`: the one ``fourm-kfp stage``
   entry point, never ``--force``, so a restarted replica resumes); the backend clears a forced output once, at
   the last moment before it starts anything, and follows what it started to its end;
4. **report** what the remote processes committed, read back from the manifest (:func:`.stage.committed_outcome`):
   the result is what is in the store, not what the scheduler says.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Sequence

from fourm_kfp.launchers.stage import LaunchPlan, RunContext, committed_outcome, launch_stage, plan_launch

if TYPE_CHECKING:
    from fourm_kfp.contract import StageOutcome


def stage_command(stage: str, run: RunContext, input_uris: dict[str, str], root: str) -> list[str]:
    """``fourm-kfp``'s arguments in a remote process (``root``: its local folder): the one stage entry point with the
    run's config and lineage. No ``--force``: a process restarted by its scheduler must resume, never clear (the
    launcher clears a forced output once, before it starts anything)."""
    args = ["stage", stage, "--preset", run.preset]
    for item in run.overrides:
        args += ["--set", item]
    args += ["--root", root, "--store", run.store_uri]
    if run.s3_endpoint:
        args += ["--s3-endpoint", run.s3_endpoint]
    if run.tracking_uri:
        args += ["--mlflow-tracking-uri", run.tracking_uri]
    if run.parent_run_id:
        args += ["--parent-run-id", run.parent_run_id]
    for name, uri in sorted(input_uris.items()):
        args += ["--input", f"{name}={uri}"]
    return args


class RemoteBackend:
    """Where a stage's processes run. ``prefix`` starts the launcher's lines, ``what`` names what it starts (for
    "creating no ..."), ``root`` is the remote processes' local folder; each backend sets all three."""

    prefix: str
    what: str
    root: str

    def check(self, plan: LaunchPlan) -> None:
        """Fail before anything starts when the plan cannot work with this backend."""

    def skipped(self, plan: LaunchPlan) -> None:
        """The output was committed already and nothing starts."""

    def start(self, plan: LaunchPlan, command: Sequence[str], clear_output: Callable[[], None]) -> str:
        """Start the processes with ``command`` (calling ``clear_output`` just before), follow them to their end and
        return what ran them (``"pytorchjob NAME"``); raise when they failed."""
        raise NotImplementedError

    def finished(self, plan: LaunchPlan, outcome: StageOutcome) -> None:
        """The committed outcome is read (e.g. attach the job spec to the stage's MLflow run)."""


def launch_remote(stage: str, run: RunContext, backend: RemoteBackend, *, force: bool = False,
                  input_uris: dict[str, str] | None = None, root: str | None = None,
                  out: Callable[[str], None] = print) -> StageOutcome:
    """Plan, start on ``backend``, follow and report stage ``stage``; see the module docstring. ``root``: this
    process's run folder (for the MLflow store when the output is already committed)."""
    from fourm_kfp.contract.runner import clear_output, open_inputs

    plan = plan_launch(stage, run)
    if not force and plan.committed:
        out(f"{backend.prefix} {stage} {plan.address} is committed at {plan.output.uri}: creating no {backend.what}")
        backend.skipped(plan)
        return launch_stage(stage, run, root=root, input_uris=input_uris, plan=plan)
    backend.check(plan)
    inputs = open_inputs(plan.spec, plan.config, plan.store, input_uris)
    command = stage_command(stage, replace(run, store_uri=plan.store.uri),
                            {name: item.uri for name, item in inputs.items()}, backend.root)

    def clear_forced_output() -> None:
        if force:
            removed = clear_output(stage, plan.output)
            out(f"{backend.prefix} --force: cleared {removed} objects at {plan.output.uri}")

    outcome = committed_outcome(plan, backend.start(plan, command, clear_forced_output))
    backend.finished(plan, outcome)
    return outcome
