"""Greedy CTC decoding: logits + paddings -> token id lists -> text.

The device part (:func:`ctc_greedy_decode`) is jittable and shape-static: it returns the collapsed ids left-aligned
in a [B, T] array with their lengths. :func:`ctc_greedy_ids` turns that into Python lists and
:func:`ids_to_text` applies a tokenizer.
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np


def ctc_greedy_decode(logits: jax.Array, paddings: jax.Array, blank_id: int = 0) -> tuple[jax.Array, jax.Array]:
    """Best path: argmax per frame, merge repeats, drop blanks and padded frames.

    Args:
      logits: [B, T, K] scores (logits or log-probs; only the argmax matters).
      paddings: [B, T], 1.0 on padded frames.
    Returns:
      (ids [B, T] int32, left-aligned, padded with -1; lengths [B] int32).
    """
    if logits.ndim != 3 or paddings.shape != logits.shape[:2]:
        raise ValueError(f"ctc_greedy_decode: logits {logits.shape} and paddings {paddings.shape} do not match")
    best = jnp.argmax(logits, axis=-1).astype(jnp.int32)  # [B, T]
    valid = paddings < 0.5
    prev = jnp.concatenate([jnp.full_like(best[:, :1], -1), best[:, :-1]], axis=1)
    # a frame emits if it is not blank, not padding, and differs from the previous frame (blank breaks repeats)
    keep = valid & (best != blank_id) & (best != prev)
    pos = jnp.cumsum(keep, axis=1) - 1  # target slot of each kept frame
    T = best.shape[1]
    slot = jnp.where(keep, pos, T)  # dropped frames go to an out-of-range slot
    out = jnp.full(best.shape, -1, jnp.int32)
    out = jax.vmap(lambda o, s, b: o.at[s].set(b, mode="drop"))(out, slot, best)
    return out, keep.sum(axis=1).astype(jnp.int32)


def ctc_greedy_ids(logits, paddings, blank_id: int = 0) -> list[list[int]]:
    """Greedy CTC decode to Python lists of token ids (one list per utterance)."""
    ids, lengths = jax.device_get(ctc_greedy_decode(jnp.asarray(logits), jnp.asarray(paddings), blank_id))
    return [row[:n].tolist() for row, n in zip(np.asarray(ids), np.asarray(lengths))]


def ids_to_text(tokenizer: Any, id_lists: Sequence[Sequence[int]]) -> list[str]:
    """Applies ``tokenizer.decode`` to each id list and normalises whitespace."""
    return [" ".join(tokenizer.decode(list(ids)).split()) for ids in id_lists]
