"""A Python target's checkpoints: the JSON state a long run saves as it goes
(``ctx.checkpoint``), kept with the run under its claim, and handed to a later
execution of the same logical run (same idempotency key) as
``ctx.checkpoint_state``: one that took the run over from a worker that died,
or a retry after a failure."""

from __future__ import annotations

import json
from typing import Any

# Checkpoints are progress markers (an offset, a page token, a counter), not
# data: a bound keeps a claim row small on every engine.
MAX_CHECKPOINT_BYTES = 64 * 1024


class CheckpointError(Exception):
    """A checkpoint was not saved; raised in the job that asked."""


class CheckpointTooLarge(CheckpointError):
    """The state encodes to more than MAX_CHECKPOINT_BYTES."""


class CheckpointRefused(CheckpointError):
    """The run's claim is no longer this execution's: its lease ran out and
    another execution took the run over. ``ctx.cancelled`` is set too; the
    job should stop."""


def encode_checkpoint(state: Any) -> str:
    """``state`` as compact JSON text; raises CheckpointError when it cannot
    be (not JSON, or too large)."""
    try:
        text = json.dumps(state, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint state must be JSON-serializable: {exc}") from None
    size = len(text.encode())
    if size > MAX_CHECKPOINT_BYTES:
        raise CheckpointTooLarge(
            f"checkpoint state is {size:,} bytes as JSON; the limit is {MAX_CHECKPOINT_BYTES:,}:"
            " save where the work got to (an offset, a key), not the data"
        )
    return text


def decode_checkpoint(text: str | None) -> Any:
    """The state saved, or None when there is none."""
    return None if text is None else json.loads(text)
