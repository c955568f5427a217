"""The cluster path of pre-training: render a PyTorchJob or TrainJob from the shipped templates
(:mod:`.job_spec`), talk to the Kubernetes API (:mod:`.kube`), and create, follow and delete the job
(:mod:`.job_launcher`, with :mod:`.job_kinds`, :mod:`.job_adoption`, :mod:`.job_watch`, :mod:`.log_follower`,
:mod:`.job_events` and :mod:`.pod_start`); the run's exit handler deletes what a run left (:mod:`.stop_jobs`)."""
