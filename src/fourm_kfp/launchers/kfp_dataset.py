"""The ``dataset`` parameter the dataset stages' steps pass on: their layers' store URIs by stage, as one JSON
string, so a step downstream takes one parameter whatever the layers."""

from __future__ import annotations

import json

def dataset_uris(dataset: str) -> dict[str, str]:
    """The URIs of the dataset's layers by stage name, from the ``dataset`` parameter that every dataset stage's
    step passes on to the next (a JSON object: prepare-data's output, then the label stage's when it ran). The
    downstream steps take it whole, so a new dataset layer changes none of their parameters."""
    layers = json.loads(dataset or "{}")
    if not isinstance(layers, dict) or not all(isinstance(v, str) for v in layers.values()):
        raise ValueError(f"dataset {dataset!r}: expected a JSON object of stage name -> output URI")
    return layers


def with_dataset_layer(dataset: str, stage: str, uri: str) -> str:
    """``dataset`` with ``stage``'s output as its top layer (unchanged when the stage is off: ``uri`` empty)."""
    layers = dataset_uris(dataset)
    if uri:
        layers[stage] = uri
    return json.dumps(layers)
