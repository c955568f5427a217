"""fourm-kfp: pre-train 4M-style massively multimodal masked models with Kubeflow Pipelines."""

__version__ = "0.1.0"
