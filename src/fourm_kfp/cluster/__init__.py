"""The cluster path of pre-training: render a PyTorchJob or TrainJob from the shipped templates
(:mod:`.job_spec`), talk to the Kubernetes API (:mod:`.kube`), and create, follow and delete the job
(:mod:`.job_launcher`)."""
