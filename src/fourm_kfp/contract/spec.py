"""What a stage is: a :class:`StageSpec` (name, body, declared config, upstream specs) and what it returns.

The pipeline's specs are one table, :mod:`fourm_kfp.stages` (``stages/__init__.py``), each naming its body by
module, so reading the table imports no body::

    TRAIN_TOKENIZERS = StageSpec(name="train-tokenizers", run=_body("train_tokenizers"),
                                 config_keys=("data.image_size", "train_tokenizers"), upstream=DATASET, ...)

A stage reads only the declared config keys (see :mod:`.guarded_config`) and the committed outputs of its
upstream stages, and writes into its own content-addressed output. A stage that fans out (``run_part``) is run
as ``parts`` workers, each writing its own share, then ``run`` collects; such a stage is usually ``resumable``:
its output prefix is not cleared before it runs, so a restarted worker keeps what was already committed
(:mod:`.shard_jobs` for a stage whose share is output shards). :func:`param_prefix` names a stage's pipeline
parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from fourm_kfp.config.fourm_config import FourMConfig
    from fourm_kfp.contract.context import StageContext


def param_prefix(stage: str) -> str:
    """The prefix of a stage's pipeline parameters (``<prefix>_width``, ``<prefix>_force``, ``<prefix>_launcher``,
    ...): ``train_tokenizers`` for ``train-tokenizers``."""
    return stage.replace("-", "_")


@dataclass(frozen=True)
class ExternalSource:
    """Data a stage read from outside the pipeline (a user's image folder), recorded in its lineage."""

    name: str
    uri: str
    digest: str


@dataclass
class StageResult:
    """What a stage function returns: counts for the manifest, metrics for MLflow (and the manifest), the
    external sources it read, and what (if anything) keeps its bytes from being reproducible."""

    counts: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    sources: list[ExternalSource] = field(default_factory=list)
    #: why this run's payload may not be reproducible byte for byte (e.g. CUDA training kernels); empty = it is
    nondeterminism: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class StageSpec:
    """What the runner needs to know about a stage."""

    name: str
    run: Callable[["StageContext"], StageResult]  # the stage (or, with run_part, its collect step)
    config_keys: tuple[str, ...]  # dotted config keys the stage reads; their versioned fields address the output
    upstream: tuple["StageSpec", ...] = ()  # stages whose committed outputs this stage reads
    code_version: int = 1  # bump when the stage's code changes what it writes
    #: config -> digest of data read from outside the pipeline (None = none); part of the address, so a changed
    #: source folder is not mistaken for the old one.
    source_fingerprint: Callable[["FourMConfig"], str | None] | None = None
    #: ``run_part(ctx, part, parts)``: one fan-out worker; ``run`` then collects the parts.
    run_part: Callable[["StageContext", int, int], StageResult] | None = None
    #: keep what an interrupted run committed (the stage skips its committed pieces itself)
    resumable: bool = False
    #: output keys that record what this run did outside its output (e.g. the model gate's registry decision):
    #: listed in the manifest like every file, but not part of the payload, which is a function of the config and
    #: the inputs alone (the determinism check and ``fourm-kfp verify`` compare the payload)
    run_records: tuple[str, ...] = ()
    #: config -> ``{declared key: the part of its value the stage uses}``, for the address: prepare-data reads
    #: ``data.modalities`` but writes only those its source has, so a modality that a later stage adds (a label)
    #: does not move it
    narrow_config: Callable[["FourMConfig"], dict[str, Any]] | None = None
    #: config -> whether the stage has anything to do (the label stage with no labelers: False). A stage that is off
    #: runs nothing, has no output, and is left out of every downstream stage's address and inputs, so switching it
    #: off gives exactly the addresses the pipeline had without it.
    enabled: Callable[["FourMConfig"], bool] | None = None
    #: when it is off, in words (for messages): e.g. "label.labelers is empty"
    off_when: str = ""
    #: its output is a layer of the dataset: a downstream stage reads the dataset as every enabled upstream layer
    #: in pipeline order, a later layer's files over an earlier one's (:attr:`StageContext.dataset`)
    dataset_layer: bool = False
    #: config -> whether its work wants an accelerator (the label stage with a teacher network): the pipeline then
    #: runs its fan-out workers in GPU pods, else in CPU pods
    wants_accelerator: Callable[["FourMConfig"], bool] | None = None
    #: CPU and memory limits (Kubernetes quantities) of the stage's pod when it does the work itself: its fan-out
    #: workers, training in its own pod, evaluate (a job stage's step that only launches and follows its job is a
    #: light pod: :data:`fourm_kfp.launchers.kfp_placement.LAUNCHER_RESOURCES`)
    step_resources: tuple[str, str] = ("8", "16Gi")
    #: A stage that can run as a multi-node cluster job: its ``<stage>_launcher`` default, ``"in-pod"`` (its own pod)
    #: or a job kind (:data:`fourm_kfp.cluster.job_kinds.JOB_KINDS`); None: it never runs as a job
    job_launcher: str | None = None

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(up.name for up in self.upstream)

    def is_enabled(self, config: "FourMConfig") -> bool:
        return self.enabled is None or bool(self.enabled(config))

    def active_upstream(self, config: "FourMConfig") -> tuple["StageSpec", ...]:
        """The upstream stages that are on under ``config``: those whose outputs this stage reads."""
        return tuple(up for up in self.upstream if up.is_enabled(config))
