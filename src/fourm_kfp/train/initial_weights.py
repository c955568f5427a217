"""``train.init_from``: start pretraining from the weights of an earlier model instead of a fresh initialisation.

The source is a pretrain output (its exported model) or a checkpoint folder. Only model weights are taken (no
optimizer state, step or loader position: a new run, not a resumed one), and only the tensors whose name and shape
match; the rest stays freshly initialised, so a model with new modalities can be fine-tuned from one without them.
"""

from __future__ import annotations

import logging

from torch.distributed.checkpoint.state_dict import get_model_state_dict

from fourm_kfp.config.schema import ConfigError
from fourm_kfp.model.fourm import FourM
from fourm_kfp.model.saved_model import load_model
from fourm_kfp.storage import open_store
from fourm_kfp.train.checkpoint import find_checkpoint, load_checkpoint

log = logging.getLogger("fourm_kfp.train")


def load_initial_weights(model: FourM, uri: str) -> None:
    """``train.init_from``: model weights only, from a pretrain output or a checkpoint; what is missing stays
    freshly initialised (fine-tuning with new modalities)."""
    store = open_store(uri)
    if store.exists("model/model.json"):
        source, _ = load_model(store)
        state = source.state_dict()
    else:
        ckpt = find_checkpoint(store)
        if ckpt is None:
            raise ConfigError(f"train.init_from: {uri} is neither a pretrain output nor a checkpoint")
        app = {"model": get_model_state_dict(model)}
        load_checkpoint(ckpt, app)
        state = app["model"]
    own = model.state_dict()
    usable = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    model.load_state_dict(usable, strict=False)
    log.info("init_from %s: %d of %d tensors loaded, %d initialised fresh", uri, len(usable), len(own),
             len(own) - len(usable))
