"""Components that open and close the MLflow parent run of a pipeline run."""

from kfp import dsl

from fourm_kfp.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def open_lineage_run(run_label: str, kfp_run_id: str, preset: str, config_overrides: list, store_uri: str,
                     mlflow_tracking_uri: str, mlflow_parent_run_id: str) -> str:
    """Validate the config and open the MLflow parent run (or pass the launcher's through); returns its id."""
    from fourm_kfp.launchers.kfp_lineage import open_lineage_step

    return open_lineage_step(run_label, kfp_run_id, preset, config_overrides, store_uri, mlflow_tracking_uri,
                             mlflow_parent_run_id)


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def close_lineage_run(run_label: str, kfp_run_id: str, mlflow_tracking_uri: str, mlflow_parent_run_id: str,
                      status: dsl.PipelineTaskFinalStatus):
    """Exit handler (runs on success, failure and stop): report each of the run's training jobs still running (a
    stopped run's, or one a lost launcher left) and delete the run's jobs unless ``<stage>_delete_job=false`` kept
    them, then mark the parent run FINISHED or FAILED by the run's outcome (the final state, else each stage's
    latest MLflow run)."""
    from fourm_kfp.cluster import stop_jobs
    from fourm_kfp.launchers import kfp_lineage

    try:
        stop_jobs.stop_run_jobs(kfp_run_id)
    finally:
        kfp_lineage.close_lineage_step(run_label, kfp_run_id, mlflow_tracking_uri, mlflow_parent_run_id,
                                       status.state)
