"""The trained model as an MLflow model: a pyfunc that loads by ``models:/<name>@champion`` and generates.

:class:`FourMPyfunc` wraps :class:`~fourm_kfp.evaluation.any_to_any.AnyToAny`: ``load_context`` loads the model and
its tokenizer bundle from the MLflow model's artifacts, ``predict`` reads each row's image and generates its target
(one modality, or a comma-separated chain as ``fourm-kfp generate --to`` takes) through the same code as ``fourm-kfp
generate``, one row at a time with the seed of the params, so a row gives the bytes ``generate`` writes for the same
image, target and seed.

Input (a DataFrame or a dict of columns): ``image`` (binary, base64 in JSON: any picture file, read as the model's
``rgb`` as ``--from rgb=FILE`` reads it) and ``target`` (string). Params (MLflow's params schema, with generate's
defaults): ``seed``, ``steps``, ``order``, ``schedule``, ``temperature``, ``top_k``, ``top_p``, ``guidance``.
Output: one row per generated value: ``row`` (the input row), ``modality``, ``format`` (the file extension generate
writes), ``data`` (the bytes of generate's ``<modality>.<format>``: an image modality in its shard format, text as
UTF-8) and ``text`` (the text of a sequence modality, else empty).

The artifacts are copies: the model (card, weights, manifest; not its snapshots) and its tokenizer bundle are
copied out of the store into the MLflow model, so a registry user needs MLflow's tracking and artifact access
alone (no store credentials), and the registered version outlives a cleaned-up store. The cost is one more copy of
the weights in the MLflow artifact store, written once per evaluated model.
"""

from __future__ import annotations

import base64
import io
import re
import tempfile
from pathlib import Path
from typing import Any

import mlflow.pyfunc
import numpy as np

from fourm_kfp.storage import Store, open_store

#: The artifact names of the MLflow model: the pretrain output (its model/ and manifest) and the tokenizer bundle.
MODEL_ARTIFACT, TOKENIZERS_ARTIFACT = "fourm_model", "tokenizers"
#: What the MLflow model holds of a pretrain output (its weight snapshots stay in the store).
_MODEL_KEYS = ("_MANIFEST.json", "model/model.json", "model/model.safetensors")
#: generate's sampling options and defaults (``fourm-kfp generate --help``), the pyfunc's params.
DEFAULT_PARAMS: dict[str, Any] = {"seed": 0, "steps": 8, "order": "maskgit", "schedule": "cosine",
                                  "temperature": 0.0, "top_k": 0, "top_p": 1.0, "guidance": 1.0}
INPUT_MODALITY = "rgb"
_BASE64_TEXT = re.compile(rb"[A-Za-z0-9+/=\s]+")


class FourMPyfunc(mlflow.pyfunc.PythonModel):
    """A fourm-kfp model and its tokenizers, generating a target from an image (see the module docstring)."""

    def load_context(self, context) -> None:
        from fourm_kfp.evaluation.any_to_any import AnyToAny

        self.engine = AnyToAny(context.artifacts[MODEL_ARTIFACT], tokenizers_uri=context.artifacts[TOKENIZERS_ARTIFACT])

    def predict(self, context, model_input, params: dict[str, Any] | None = None):
        return generate_rows(self.engine, model_input, params)


def generate_rows(engine, model_input, params: dict[str, Any] | None = None):
    """The pyfunc's ``predict``: one output row per generated value (module docstring)."""
    import pandas as pd

    from fourm_kfp.evaluation.any_to_any import decode_input, encode_output
    from fourm_kfp.model.generation import SamplingArgs

    options = {**DEFAULT_PARAMS, **(params or {})}
    seed = int(options.pop("seed"))
    sampling = SamplingArgs(**options)
    frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
    missing = {"image", "target"} - set(frame.columns)
    if missing:
        raise ValueError(f"model input: no column {sorted(missing)}; it takes 'image' (a picture file's bytes) and "
                         f"'target' (a modality or a comma-separated chain of {engine.modalities})")
    rows = []
    for index, (image, target) in enumerate(zip(frame["image"], frame["target"])):
        targets = [t.strip() for t in str(target).split(",") if t.strip()]
        unknown = sorted(set(targets) - set(engine.modalities))
        if unknown or not targets:
            raise ValueError(f"model input row {index}: target {target!r}: the model generates "
                             f"{engine.modalities}")
        data = _file_bytes(image)
        sample = {INPUT_MODALITY: decode_input(INPUT_MODALITY, data, engine.side(INPUT_MODALITY),
                                               f"model input row {index}")}
        [generated] = engine.generate([sample], targets, sampling, seed)
        for modality, value in generated.items():
            ext, data = encode_output(modality, value)
            rows.append({"row": index, "modality": modality, "format": ext, "data": data,
                         "text": value if isinstance(value, str) else ""})
    return pd.DataFrame(rows, columns=["row", "modality", "format", "data", "text"])


def _file_bytes(value) -> bytes:
    """A picture file's bytes from an ``image`` cell: the bytes themselves, or their base64 text (how MLflow's JSON
    carries binary, as ``str`` or as the text's bytes, in lines; a picture file is never base64 text alone: its
    format's signature is not ASCII)."""
    data = value.encode() if isinstance(value, str) else bytes(value)
    return base64.b64decode(data) if _BASE64_TEXT.fullmatch(data) else data


def _copy_keys(store: Store, keys, folder: Path) -> None:
    for key in keys:
        store.get_file(key, folder / key)


def _stage_artifacts(model_uri: str, tokenizers_uri: str, folder: Path) -> dict[str, str]:
    """Copy the model and its tokenizer bundle out of the store into ``folder``; the pyfunc's artifacts."""
    model_dir, tokenizers_dir = folder / MODEL_ARTIFACT, folder / TOKENIZERS_ARTIFACT
    _copy_keys(open_store(model_uri), _MODEL_KEYS, model_dir)
    tokenizers = open_store(tokenizers_uri)
    _copy_keys(tokenizers, [k for k in tokenizers.list() if not k.startswith("reports/")], tokenizers_dir)
    return {MODEL_ARTIFACT: str(model_dir), TOKENIZERS_ARTIFACT: str(tokenizers_dir)}


def example_image(side: int) -> bytes:
    """A PNG picture of ``side`` x ``side`` (a colour ramp): the MLflow model's input example."""
    from PIL import Image

    ramp = np.linspace(0, 255, side, dtype=np.uint8)
    pixels = np.stack([np.tile(ramp, (side, 1)), np.tile(ramp[:, None], (1, side)),
                       np.full((side, side), 128, np.uint8)], -1)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def signature():
    """The pyfunc's signature: the input and output columns, and generate's sampling options as params."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema

    inputs = Schema([ColSpec("binary", "image"), ColSpec("string", "target")])
    outputs = Schema([ColSpec("long", "row"), ColSpec("string", "modality"), ColSpec("string", "format"),
                      ColSpec("binary", "data"), ColSpec("string", "text")])
    kinds = {int: "long", float: "double", str: "string"}
    params = ParamSchema([ParamSpec(name, kinds[type(value)], value) for name, value in DEFAULT_PARAMS.items()])
    return ModelSignature(inputs=inputs, outputs=outputs, params=params)


def log_pyfunc(tracking_uri: str, run_id: str, *, model_uri: str, tokenizers_uri: str, image_size: int,
               target: str, name: str = "model") -> str:
    """Log the pretrain output at ``model_uri`` as an MLflow model of run ``run_id`` (a LoggedModel in the run's
    experiment, with its signature and an input example generating ``target``); returns its model id."""
    import mlflow
    from mlflow.entities import LoggedModelStatus
    from mlflow.models import Model
    from mlflow.tracking._tracking_service.utils import _use_tracking_uri

    from fourm_kfp import __version__
    from fourm_kfp.contract.lineage import _client, _quiet_warnings

    client = _client(tracking_uri)
    with tempfile.TemporaryDirectory(prefix="fourm-mlflow-model-") as tmp, _quiet_warnings(), \
            _use_tracking_uri(tracking_uri):
        artifacts = _stage_artifacts(model_uri, tokenizers_uri, Path(tmp))
        run = client.get_run(run_id)
        logged = client.create_logged_model(run.info.experiment_id, name=name, source_run_id=run_id,
                                            tags={"fourm.source": model_uri})
        info = Model.log(  # pyfunc's log_model, for a run that is not the active one (run_id)
            artifact_path=None, name=name, flavor=mlflow.pyfunc, python_model=FourMPyfunc(), artifacts=artifacts,
            signature=signature(),
            input_example=({"image": [example_image(image_size)], "target": [target]}, DEFAULT_PARAMS),
            pip_requirements=[f"fourm-kfp=={__version__}", f"mlflow-skinny=={mlflow.__version__}", "pandas"],
            run_id=run_id, model_id=logged.model_id)
        client.finalize_logged_model(info.model_id, LoggedModelStatus.READY)  # Model.log leaves it PENDING
    return info.model_id
