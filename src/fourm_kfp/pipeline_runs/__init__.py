"""Whole-pipeline runs: the floor above the pipeline definition (``fourm_kfp.pipelines``), which it imports.

* :mod:`.compile` — ``fourm-kfp compile``: the pipeline as KFP IR YAML, for the images of one tag;
* :mod:`.local` — ``fourm-kfp run``: the whole pipeline on this machine through ``kfp.local``;
* :mod:`.kfp_api` — the KFP API server as submit meets it: client, credentials, errors and retries, and its rules
  (parameter types, cron, namespaces, paged lists) checked before anything is sent;
* :mod:`.submit` — ``fourm-kfp submit``: upload, run or schedule the compiled pipeline, ``--attach`` to a run;
* :mod:`.follow` — following a run to its end and its stage table;
* :mod:`.gate_verdict` — the model gate's verdict of a finished run, read from MLflow;
* :mod:`.run_report` — ``submit --report HOURS``: every run that ended in a window;
* :mod:`.run_outcome` — the request, the result and the exit codes they map to.
"""
