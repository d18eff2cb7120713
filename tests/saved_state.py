"""Read a checkpoint step written by ``jaxrl_frag.checkpoints`` back as plain numpy arrays,
whatever devices and processes wrote it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp


def read_state(step: Path) -> Any:
    """The ``state`` item of checkpoint directory ``step``, as numpy arrays."""
    checkpointer = ocp.PyTreeCheckpointer()
    tree = checkpointer.metadata(step / "state").item_metadata.tree
    return checkpointer.restore(step / "state",
                                restore_args=jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree))
