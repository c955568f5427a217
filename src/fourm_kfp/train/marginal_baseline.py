"""The marginal baseline of pretraining: per modality, the loss of a model that ignores its inputs and positions
and predicts the training targets' token distribution.

The pretrain report sets each modality's validation loss against it (a model that has learned anything from its
inputs ends below it), and the training curves draw it as a dashed line.
"""

from __future__ import annotations

import numpy as np


def marginal_losses(train_batches: list, val_batches: list, names: tuple[str, ...],
                    vocab: list[int]) -> dict[str, float]:
    """Per modality: the cross-entropy on the val targets of predicting the train targets' marginal distribution
    (add-one smoothed) — the loss a model reaches that ignores its inputs and positions."""
    out = {}
    for i, name in enumerate(names):
        counts = np.ones(vocab[i])
        for b in train_batches:
            t = b.dec_targets[(b.dec_modality == i) & b.dec_valid].numpy()
            counts += np.bincount(t, minlength=vocab[i])[: vocab[i]]
        logp = np.log(counts / counts.sum())
        targets = np.concatenate([b.dec_targets[(b.dec_modality == i) & b.dec_valid].numpy() for b in val_batches])
        if targets.size:
            out[name] = float(-logp[targets].mean())
    return out
