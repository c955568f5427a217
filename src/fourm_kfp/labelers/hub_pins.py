"""Where each hub commit that a preset pins was seen in public, so a user whose ``hf download`` of a pinned commit
fails can see that the commit exists, and where else it is named.

A preset names a teacher's hub folder as ``hf://<repo>@<40-hex commit>`` (a ``label.labelers[]`` entry's ``source``,
or its ``weights``). The machine the presets were written on could not reach the hub, so a preset pins a commit only
where public material names that repository at that commit: a file of a public repository (a config, a script, a
document), or a public mirror of the hub repository at that commit. :data:`PIN_SOURCES` is that record, keyed by
``<repo>@<commit>``; ``fourm-kfp teachers`` prints it under each pinned entry (a commit of a user's own config
without a record is printed as such), and a test checks that every preset's hub address is a full commit with a
record here. Read 2026-12-02 in the public code and page indexes searched.
"""

from __future__ import annotations

from dataclasses import dataclass

from fourm_kfp.labelers.weights import HF_PREFIX, parse_hf_uri


@dataclass(frozen=True)
class PinSource:
    """One public trace of a pinned commit: ``where`` it was seen (``owner/repo path @ commit`` for a file of a
    public repository, or a page's address) and ``what`` it says there."""

    where: str
    what: str


#: every commit a preset pins, ``<repo>@<commit>`` → where it was seen
PIN_SOURCES: dict[str, PinSource] = {
    "Intel/dpt-hybrid-midas@530c4509f775419d716ca24ad1e7c6095e8ac2b4": PinSource(
        "data_augmentation.py of a public DrQ-v2 fork: a later version of the one on the lyf branch of "
        "Jianshu-Hu/drqv2 (the code index holds the file without naming its repository)",
        "its DPT augmentation loads models--Intel--dpt-hybrid-midas/snapshots/<this commit> from the hub cache"),
    "facebook/mask2former-swin-base-coco-panoptic@d14773b92666b4f3a984edbf34a86ce724b06dc8": PinSource(
        "http://repo.model.xfyun.cn/facebook/mask2former-swin-base-coco-panoptic/blame/commit/"
        "d14773b92666b4f3a984edbf34a86ce724b06dc8/README.md",
        "a public mirror of the hub repository shows its README at this commit (no public code names it)"),
    "PekingU/rtdetr_r50vd@df939e661d8c52e80608d1ec566561aabd25a4e7": PinSource(
        "kurtvalcorza/rtdetr-detection-pipeline docs/WEIGHTS.md @ 9d8b57e8f45f7573529d3ee6b000f47d2df04ef5",
        "the immutable revision its weights are pinned to (the hub's main on 2026-09-14)"),
    "openai/clip-vit-base-patch16@57c216476eefef5ab752ec549e440a49ae4ae5f3": PinSource(
        "embeddings-benchmark/mteb mteb/models/clip_models.py @ 0f6c1b30cb6e5e360c05d7a3a84fe15dc9ffaa6b",
        "the revision of its openai/clip-vit-base-patch16 ModelMeta"),
    "facebook/dinov2-base@f9e44c814b77203eaa57a6bdbbd535f21ede1415": PinSource(
        "embeddings-benchmark/mteb mteb/models/dino_models.py @ 10ba68d9683b4412a7bce116f9f9d9c6fb7e6e24",
        "the revision of its facebook/dinov2-base ModelMeta"),
    "Salesforce/blip-image-captioning-base@82a37760796d32b1411fe092ab5d4e227313294b": PinSource(
        "yashimwong/penampakan examples/03_ask_with_local_models.py @ 12925ad6a8f57cbf88872a22c4f1716be7c4c083",
        "CAPTION_REVISION of its TransformersCaptionBackend, whose default model is this repository"),
}


def hub_addresses(*values: str) -> list[str]:
    """The ``hf://`` addresses among a labeler entry's ``weights`` and ``source``."""
    return [v for v in values if v.startswith(HF_PREFIX)]


def pin_source(uri: str, where: str) -> PinSource | None:
    """Where the commit of ``hf://<repo>@<commit>`` was seen in public (None: no trace recorded); a branch, a tag
    or a short hash is an error naming ``where``."""
    repo, commit = parse_hf_uri(uri, where)
    return PIN_SOURCES.get(f"{repo}@{commit}")
