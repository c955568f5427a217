"""Data: the modality registry, sample sources (synthetic scenes, real images), shards and dataset reports."""
