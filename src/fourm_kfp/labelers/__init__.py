"""Labelers: what turns a team's photos into 4M training data (the ``label`` stage's teachers).

A labeler takes a batch of RGB images and returns one modality's values for them (:mod:`.base`). The built-ins
compute their labels with well-kept libraries and download nothing; a team's own teacher (a depth or segmentation
network it already runs) is a plug-in found through the ``fourm_kfp.labelers`` entry-point group, its weights read
from a local path or an ``s3://`` URI named in the config (:mod:`.registry`).
"""
