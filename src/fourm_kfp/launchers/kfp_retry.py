"""How long a job stage's KFP step is retried, and the check that a job's queue time and deadline fit in it."""

from __future__ import annotations

from fourm_kfp.cluster.job_spec import ClusterParams, JobParams, param_prefix
from fourm_kfp.config.schema import ConfigError

#: How long KFP retries a job stage's step, from its first attempt's start (the compiled retry policy's
#: backoffMaxDuration, which KFP hands Argo as the retry strategy's maxDuration; a retried pod is also killed at the
#: first attempt's start plus this). A job's queue time and deadline must fit in it (:func:`check_retry_window`).
RETRY_WINDOW_S = 30 * 86400


def check_retry_window(stage: str, job: JobParams, cluster: ClusterParams) -> None:
    """Refuse a job whose queue time and deadline (with the launcher's grace past it) outlast the step's retry window
    (:data:`RETRY_WINDOW_S`): past it Argo retries nothing, and kills a retried launcher pod, so the job would train
    on unfollowed."""
    from fourm_kfp.cluster.job_launcher import FollowSettings

    grace_s = int(FollowSettings.grace_s)
    needed = job.deadline_s + cluster.queue_timeout_s + grace_s
    if needed > RETRY_WINDOW_S:
        raise ConfigError(f"{param_prefix(stage)}_deadline_s={job.deadline_s} + queue_timeout_s="
                          f"{cluster.queue_timeout_s} (+{grace_s}s) exceed the step's retry window of "
                          f"{RETRY_WINDOW_S}s ({RETRY_WINDOW_S // 86400} days), after which KFP neither retries nor "
                          "keeps a retried launcher: shorten them, or train in stages from the newest checkpoint")
