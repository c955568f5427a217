"""The launch layer: everything that starts stages somewhere, around the one function that runs a stage in this
process (:func:`.stage.launch_stage`).

* :mod:`.stage` — one stage (or one fan-out part) in this process: config, store, distributed group, lineage;
  and the plan a launcher on other machines makes before it starts anything;
* :mod:`.local` — ``fourm-kfp run``: the whole pipeline on this machine through ``kfp.local``;
* :mod:`.kfp_runtime` — what the KFP components call, in a cluster pod or under ``kfp.local``;
* :mod:`.kfp_submit` — ``fourm-kfp submit``: upload, run or schedule the compiled pipeline on a KFP server,
  follow a run (``--attach``) or report the runs that ended (``--report``);
* :mod:`.kfp_api` — the KFP API server as submit meets it: client, credentials, errors and retries, and its rules
  (parameter types, cron, namespaces, paged lists) checked before anything is sent;
* :mod:`.compile` — ``fourm-kfp compile``: the pipeline as KFP IR YAML;
* :mod:`.kubernetes_job` — a job stage (pretrain, train-tokenizers) as a PyTorchJob / TrainJob (rendering, the API
  and following the job live in :mod:`fourm_kfp.cluster`);
* :mod:`.torchx_job` — ``fourm-kfp launch``: a stage as a torchx job (local processes, Kubernetes, Slurm, ...).

The launcher kinds of the job stages are named in :mod:`fourm_kfp.cluster.job_spec` (``IN_POD``,
``PYTORCHJOB``, ``TRAINJOB``), with the stages that may run as a job (``JOB_STAGES``).
"""
