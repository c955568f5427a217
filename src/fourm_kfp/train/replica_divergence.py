"""The check that DDP replicas ended identical: after training, every rank's parameters must be bit-equal.

DDP keeps replicas in step by averaging gradients; a divergence means a bug (a rank that skipped an update, a
non-deterministic collective, a parameter outside the all-reduce), so it fails the run rather than exporting one
rank's weights as if they were everyone's.
"""

from __future__ import annotations

import torch

from fourm_kfp import distributed
from fourm_kfp.model.parallelize import unwrap


def replica_divergence(model: torch.nn.Module) -> float:
    """Largest difference between the ranks' parameter checksums (0 when the DDP replicas are identical, as they
    must be); a divergence is a bug, so it fails the run."""
    if distributed.world_size() == 1:
        return 0.0
    checksum = torch.stack([p.detach().double().sum() for p in unwrap(model).parameters()]).sum().reshape(1)
    gathered = [torch.zeros_like(checksum) for _ in range(distributed.world_size())]
    torch.distributed.all_gather(gathered, checksum)
    spread = float((torch.cat(gathered).max() - torch.cat(gathered).min()).abs())
    if spread != 0.0:
        raise RuntimeError(f"DDP replicas diverged: parameter checksums differ by {spread:g} across ranks")
    return spread
