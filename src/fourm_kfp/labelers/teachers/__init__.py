"""Teacher networks built on Hugging Face transformers (the ``teachers`` extra): 4M-21's pseudo-labellers.

Each module is one family, a built-in labeler read from a model folder (:mod:`fourm_kfp.labelers.weights`): depth
(:mod:`.depth`), semantic segmentation (:mod:`.segmentation`), boxes (:mod:`.boxes`), captions (:mod:`.captions`),
surface normals (:mod:`.normals`: a DPT with a 3-channel head, and normals derived from a depth teacher's labels),
and CLIP and DINOv2 feature maps (:mod:`.features`). :mod:`.loading` loads a folder and runs a batch through it.
"""
