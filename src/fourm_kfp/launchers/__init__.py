"""The launch layer of one stage: everything that starts a stage somewhere, around the one function that runs a stage
in this process (:func:`.stage.launch_stage`). Whole-pipeline runs (compile, ``kfp.local``, a KFP server) are a floor
above, in :mod:`fourm_kfp.pipeline_runs`, since they import the pipeline, whose components call this floor.

* :mod:`.stage` — one stage (or one fan-out part) in this process: config, store, distributed group, lineage;
  and the plan a launcher on other machines makes before it starts anything;
* :mod:`.remote` — the skeleton of a launch on other machines (plan, check, start, report), one backend varying;
* what the KFP components call, in a cluster pod or under ``kfp.local``, one concern a module: :mod:`.kfp_steps`
  (a stage's step and its outputs), :mod:`.kfp_artifacts` (its output as a typed KFP artifact), :mod:`.kfp_lineage`
  (the parent MLflow run, opened and closed), :mod:`.kfp_placement` (fan-out items, where a step's pod runs),
  :mod:`.kfp_dataset` (the ``dataset`` parameter) and :mod:`.kfp_retry` (a job step's retry window);
* :mod:`.kubernetes_job` — a job stage (pretrain, train-tokenizers) as a PyTorchJob / TrainJob (rendering, the API
  and following the job live in :mod:`fourm_kfp.cluster`);
* :mod:`.torchx_job` — ``fourm-kfp launch``: a stage as a torchx job (local processes, Kubernetes, Slurm, ...).

The launcher kinds of the job stages are ``IN_POD`` (:mod:`fourm_kfp.cluster.job_spec`, with the stages that may run
as a job, ``JOB_STAGES``) and the job kinds, one record each (:data:`fourm_kfp.cluster.job_kinds.JOB_KINDS`).
"""
