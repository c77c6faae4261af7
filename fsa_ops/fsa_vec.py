"""FsaVec ops of k2 on the padded batch layout: `cat` (concatenate FsaVecs) and `index_fsa` (select FSAs).

Both work on numpy or jax arrays; with jax arrays they run under jit and gradients flow to the input scores.
"""
from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp
import numpy as np
from jax import tree_util

from fsa_ops.fsa import Fsa, is_jax
from fsa_ops.ragged import Ragged, is_ragged

__all__ = ["cat", "index_fsa"]


def cat(fsas: Sequence[Fsa]) -> Fsa:
    """Concatenate FsaVecs along the FSA axis (k2's `k2.cat`): arcs padded to the widest, max_states the
    largest; only the attributes that every input has are kept (k2 keeps the common ones). Numpy or jax
    inputs (all of one kind); jax arrays give a jax result (usable under jit)."""
    fsas = list(fsas)
    if not fsas:
        raise ValueError("cat: fsas is empty")
    for i, f in enumerate(fsas):
        if not isinstance(f, Fsa):
            raise TypeError(f"cat: fsas[{i}]: expected an Fsa, got {type(f).__name__}")
        if not f.is_batch:
            raise ValueError(f"cat: fsas[{i}] is a single Fsa; k2's cat takes FsaVecs (use create_fsa_vec)")
    xp = jnp if any(is_jax(f.label) for f in fsas) else np
    names = sorted(set.intersection(*[set(f.attrs) for f in fsas]))
    A = max(f.label.shape[1] for f in fsas)
    S = max(f.max_states for f in fsas)

    def pad(x, fill, axis_len=A):
        extra = [(0, 0)] * x.ndim
        extra[1] = (0, axis_len - x.shape[1])
        return xp.pad(x, extra, constant_values=fill)

    def join(parts, fill):
        return xp.concatenate([pad(p, fill) for p in parts], axis=0)

    core = {k: join([getattr(f, k) for f in fsas], fill) for k, fill in
            (("src", 0), ("dst", 0), ("label", 0), ("score", -np.inf))}
    attrs = {}
    for k in names:
        vs = [f.attrs[k] for f in fsas]
        if any(is_ragged(v) for v in vs):
            if not all(is_ragged(v) for v in vs):
                raise ValueError(f"cat: attribute {k!r} is a Ragged in some inputs and an array in others")
            w = max(v.width for v in vs)
            vals = [xp.pad(v.values, [(0, 0), (0, A - v.values.shape[1]), (0, w - v.width)]) for v in vs]
            attrs[k] = Ragged(xp.concatenate(vals), join([v.lengths for v in vs], 0))
        else:
            trail = [max(np.shape(v)[d] for v in vs) for d in range(2, np.ndim(vs[0]))]
            vs = [xp.pad(v, [(0, 0), (0, A - np.shape(v)[1])] + [(0, t - np.shape(v)[2 + j])
                                                                 for j, t in enumerate(trail)]) for v in vs]
            attrs[k] = xp.concatenate(vs)
    return Fsa(core["src"], core["dst"], core["label"], core["score"],
               xp.concatenate([f.num_states for f in fsas]), xp.concatenate([f.num_arcs for f in fsas]), attrs,
               max_states=S)


def index_fsa(src: Fsa, indexes) -> Fsa:
    """The FsaVec of FSAs `src[indexes[i]]` (k2's `k2.index_fsa`): int[N] indexes into the batch (repeats
    allowed). Keeps `src`'s padding (arcs A, max_states), so that with jax arrays it runs under jit and
    gradients flow back to `src`'s scores; see `Fsa.__getitem__` for a trimmed host copy."""
    if not isinstance(src, Fsa) or not src.is_batch:
        raise ValueError("index_fsa: src must be an FsaVec (a batch Fsa)")
    if not is_jax(indexes):
        idx = np.asarray(indexes)
        if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
            raise ValueError(f"index_fsa: indexes must be a 1-D integer array, got shape {idx.shape} {idx.dtype}")
        B = len(src)
        if idx.size and (idx.min() < 0 or idx.max() >= B):
            raise ValueError(f"index_fsa: indexes must lie in [0, {B}), got {idx.min()}..{idx.max()}")
        indexes = idx.astype(np.int64)
    return tree_util.tree_map(lambda x: x[indexes], src)
