"""k2's ``shortest_path``: the best (tropical) path of each FSA as a linear FSA, attributes kept.

The best path is found with a tropical forward pass that records the best entering arc of every
state (``fsa_ops.scores``), then backtracked from the final state; both are ``lax.scan`` s inside one
jitted program.  The answer is a batch of linear FSAs (states ``0..L``, ``L`` arcs, the last one with
label -1) carrying the arcs' original scores and every per-arc attribute (``aux_labels`` ...; a
``Ragged`` attribute keeps its rows: values [B, L, W] and lengths [B, L] are gathered like the arcs).
An FSA without a successful path gives an empty FSA (``num_states == 0``), as in k2; so does an FSA
with a NaN or +inf arc score (whose ``get_tot_scores`` is NaN: check that to tell them apart).

Shapes: input ``[B, A]`` arcs and ``max_states = S`` give ``[B, max(S - 1, 1)]`` output arcs,
``max_states = S`` (a path visits each state at most once).  A single (non-batch) concrete input
gives a single trimmed Fsa; a traced single input gives a batch of one (shapes must stay static).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from fsa_ops.fsa import Fsa
from fsa_ops.scores import best_path_arcs, forward_core, is_traced, prepare_fsas, tot_from_alpha

__all__ = ["shortest_path"]


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def _shortest_path_core(arcs, attrs, S, K, dtype):
    B, A = arcs.src.shape
    alpha, entering = forward_core(arcs, S, K, False, dtype)
    tot = tot_from_alpha(alpha, arcs.num_states)
    path, length = best_path_arcs(arcs, entering, tot)          # [B, S], [B]
    L = max(S - 1, 1)
    path = path[:, :L]
    real = path >= 0
    idx = jnp.maximum(path, 0)
    pos = jnp.arange(L, dtype=jnp.int32)[None, :]

    def take(x, fill):
        g = jnp.take_along_axis(x, idx.reshape(B, L, *([1] * (x.ndim - 2))), axis=1)
        m = real.reshape(B, L, *([1] * (x.ndim - 2)))
        return jnp.where(m, g, jnp.asarray(fill, x.dtype))

    src = jnp.where(real, pos, 0).astype(jnp.int32)
    dst = jnp.where(real, pos + 1, 0).astype(jnp.int32)
    label = take(arcs.label, 0)
    score = take(arcs.score, -jnp.inf)
    out_attrs = {k: jax.tree_util.tree_map(lambda x: take(x, 0), v) for k, v in attrs.items()}
    num_states = jnp.where(jnp.isfinite(tot), length + 1, 0).astype(jnp.int32)
    return src, dst, label, score, num_states, length, out_attrs


def shortest_path(fsa, use_double_scores: bool = True):
    """Best path of each FSA in ``fsa`` (an Fsa or a batch), as linear FSA(s) with attributes.

    ``use_double_scores`` selects float64 comparisons when x64 is enabled (float32 otherwise,
    warned once: `fsa_ops.scores.Float32ScoresWarning`).
    The FSAs must be top-sorted (acyclic with arcs from lower to higher states), as in k2.
    """
    arcs, S, kin, _, batch, dtype = prepare_fsas(fsa, use_double_scores)
    attrs = {k: jax.tree_util.tree_map(lambda x: jnp.asarray(x) if batch else jnp.asarray(x)[None], v)
             for k, v in fsa.attrs.items()}
    src, dst, label, score, ns, na, out_attrs = _shortest_path_core(arcs, attrs, S, kin, dtype)
    out = Fsa(src, dst, label, score, ns, na, out_attrs, max_states=S)
    if batch:
        return out
    if is_traced(src):
        return out
    return out.to_numpy()[0].to_jax()
