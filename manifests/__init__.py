"""The Kubernetes manifests; as a package (fourm_kfp.manifests) it ships the job templates
(base/*-template.yaml) that the pretrain launcher renders. Nothing to import."""
