"""k2's ``random_paths``: sample paths through acyclic FSAs in proportion to their probability (log semiring).

From state ``s`` the arc ``a`` is taken with probability ``exp(score[a] + beta[dst[a]] - beta[s])`` (``beta``:
backward scores, `fsa_ops.scores`), so a whole path ``pi`` is drawn with probability ``exp(score(pi) - tot)``.
Per state, the arcs' probabilities form a cumulative table ``[lo, hi)`` in arc order (arcs with probability 0
get empty intervals and are never taken); a position ``p`` in ``[0, 1)`` picks the arc whose interval holds it.

Two ways to give the positions (exactly one):

- ``key`` (a JAX PRNG key): a fresh uniform position per path and step, i.e. exact ancestral sampling whatever
  the path length (no precision runs out).
- ``positions`` (``[B, num_paths]`` numbers in ``[0, 1)``): one position per path, rescaled into the chosen
  interval at every step (``p <- (p - lo) / (hi - lo)``), k2's deterministic "arithmetic coding" scheme; k2
  itself uses ``k2_path_positions`` = ``(i + 0.5) / num_paths``, which reproduces k2's outputs (ties at interval
  boundaries go to the later arc, as in k2). A uniform random ``p`` gives exact samples too, but long paths
  exhaust its float precision.

Result (jit-compiled, fixed shapes): ``paths`` int32 ``[B, num_paths, L]``, the arc indices of each path within
its FSA (k2 returns idx012 over the whole FsaVec; see `paths_to_lists`), ``-1`` padded, with
``L = max(max_states - 1, 1)`` (the longest path of a top-sorted FSA), and ``lengths`` int32 ``[B, num_paths]``.
An FSA without a successful path (total score ``-inf`` or NaN) gets ``lengths == 0`` (k2 returns no paths for
it). Not differentiable (as in k2).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fsa_ops.scores import arc_table, get_backward_scores, prepare_fsas, safe_logsumexp, valid_arcs

__all__ = ["random_paths", "k2_path_positions", "paths_to_lists"]


def k2_path_positions(num_fsas: int, num_paths: int) -> np.ndarray:
    """k2's fixed positions ``(i + 0.5) / num_paths`` for path i, as float64 ``[num_fsas, num_paths]``."""
    row = (np.arange(num_paths, dtype=np.float64) + 0.5) / num_paths
    return np.broadcast_to(row, (int(num_fsas), int(num_paths))).copy()


def _cdf_tables(arcs, beta, S: int, K: int, dtype):
    """Leaving-arc table [B, S, K] (-1 = none) and each entry's interval start `lo` and end `hi` in [0, 1]
    (2.0 for empty table slots, so that no position selects them)."""
    valid = valid_arcs(arcs) & ~jnp.isneginf(arcs.score)
    table = arc_table(arcs.src, valid, S, K)                                  # [B, S, K]
    score = arcs.score.astype(dtype)
    b_src = jnp.take_along_axis(beta, arcs.src, axis=1)
    b_dst = jnp.take_along_axis(beta, arcs.dst, axis=1)
    logp = jnp.where(valid & jnp.isfinite(b_src), score + b_dst - jnp.where(jnp.isfinite(b_src), b_src, 0.0),
                     -jnp.inf)
    B = table.shape[0]
    flat = jnp.maximum(table, 0).reshape(B, -1)
    lp = jnp.where(table >= 0, jnp.take_along_axis(logp, flat, axis=1).reshape(table.shape), -jnp.inf)
    lse = safe_logsumexp(lp, axis=-1)                                         # renormalise against roundoff
    ok = jnp.isfinite(lse)[..., None]
    pdf = jnp.where(ok & jnp.isfinite(lp), jnp.exp(lp - jnp.where(ok, lse[..., None], 0.0)), 0.0)
    incl = jnp.cumsum(pdf, axis=-1)
    tot = incl[..., -1:]
    lo = jnp.clip((incl - pdf) / jnp.where(tot > 0, tot, 1.0), 0.0, 1.0)
    lo = jnp.where(table >= 0, lo, 2.0)
    lo = lax.cummin(lo, axis=lo.ndim - 1, reverse=True)                       # nondecreasing (k2's fix-up)
    hi = jnp.minimum(jnp.concatenate([lo[..., 1:], jnp.full_like(lo[..., :1], 2.0)], axis=-1), 1.0)
    return table, lo, hi


@functools.partial(jax.jit, static_argnums=(4, 5, 6, 7))
def _sample(arcs, beta, positions, uniforms, S: int, K: int, L: int, dtype):
    """positions [B, P] (k2 mode, uniforms None) or uniforms [L, B, P] (key mode) -> (paths, lengths)."""
    B = arcs.src.shape[0]
    P = positions.shape[1] if positions is not None else uniforms.shape[2]
    table, lo, hi = _cdf_tables(arcs, beta, S, K, dtype)
    final = arcs.num_states - 1
    tot = beta[:, 0]
    ok = jnp.isfinite(tot) & (arcs.num_states > 1)
    below_one = jnp.asarray(np.nextafter(np.array(1.0, dtype), np.array(0.0, dtype)), dtype)
    b_idx = jnp.arange(B)[:, None]

    def step(carry, u):
        cur, p, done = carry
        if u is not None:
            p = u
        rows_lo, rows_hi, rows_arc = lo[b_idx, cur], hi[b_idx, cur], table[b_idx, cur]      # [B, P, K]
        k = jnp.sum(rows_lo[..., 1:] <= p[..., None], axis=-1)                              # last lo <= p
        arc, a_lo, a_hi = (jnp.take_along_axis(x, k[..., None], axis=-1)[..., 0] for x in (rows_arc, rows_lo, rows_hi))
        active = ~done & (arc >= 0)
        width = a_hi - a_lo
        p_next = jnp.clip((p - a_lo) / jnp.where(width > 0, width, 1.0), 0.0, below_one)
        nxt = jnp.take_along_axis(arcs.dst, jnp.maximum(arc, 0), axis=1)
        cur = jnp.where(active, nxt, cur)
        done = done | ~active | (cur == final[:, None])
        return (cur, jnp.where(active, p_next, p), done), jnp.where(active, arc, -1)

    cur0 = jnp.zeros((B, P), jnp.int32)
    done0 = jnp.broadcast_to(~ok[:, None], (B, P))
    if uniforms is None:
        p0 = jnp.clip(positions.astype(dtype), 0.0, below_one)
        _, out = lax.scan(lambda c, _: step(c, None), (cur0, p0, done0), None, length=L)
    else:
        _, out = lax.scan(step, (cur0, uniforms[0], done0), uniforms)
    paths = jnp.moveaxis(out, 0, -1).astype(jnp.int32)                                      # [B, P, L]
    lengths = jnp.sum(paths >= 0, axis=-1).astype(jnp.int32)
    return paths, lengths


def random_paths(fsas, use_double_scores: bool = True, num_paths: int = 1, key=None, positions=None):
    """Sample `num_paths` paths through each FSA (k2's ``random_paths``; see the module docstring).

    `fsas`: an FsaVec (or one Fsa) of top-sorted FSAs. Give exactly one of `key` (a ``jax.random`` key) and
    `positions` (``[B, num_paths]`` in ``[0, 1)``, e.g. `k2_path_positions`). Returns ``(paths [B, num_paths,
    L] int32, lengths [B, num_paths] int32)`` (no leading B for a single Fsa); arcs are indices within each FSA,
    -1 padded; FSAs without a successful path have length-0 paths. ``use_double_scores``: float64 when
    ``jax_enable_x64`` is on, float32 otherwise (warned once, as everywhere in fsa_ops).
    """
    if isinstance(num_paths, bool) or not isinstance(num_paths, (int, np.integer)) or num_paths < 1:
        raise ValueError(f"num_paths: expected an int >= 1, got {num_paths!r}")
    if (key is None) == (positions is None):
        raise ValueError("random_paths: give exactly one of key= (a jax.random PRNG key: random sampling) and "
                         "positions= ([num_fsas, num_paths] in [0, 1), e.g. k2_path_positions: k2's scheme)")
    arcs, S, _, kout, batch, dtype = prepare_fsas(fsas, use_double_scores)
    beta = get_backward_scores(fsas, use_double_scores=use_double_scores)
    beta = beta if batch else beta[None]
    B = arcs.src.shape[0]
    L = max(S - 1, 1)
    num_paths = int(num_paths)
    if positions is not None:
        pos = jnp.asarray(positions)
        if pos.shape != (B, num_paths):
            raise ValueError(f"positions: expected shape {(B, num_paths)} ([num_fsas, num_paths]), got {pos.shape}")
        if not jnp.issubdtype(pos.dtype, jnp.floating):
            raise ValueError(f"positions: expected floats in [0, 1), got dtype {pos.dtype}")
        paths, lengths = _sample(arcs, beta, pos, None, S, kout, L, dtype)
    else:
        try:
            uniforms = jax.random.uniform(key, (L, B, num_paths), dtype)
        except (TypeError, ValueError) as e:
            raise ValueError(f"key: expected a jax.random PRNG key, got {type(key).__name__} ({e})") from None
        paths, lengths = _sample(arcs, beta, None, uniforms, S, kout, L, dtype)
    return (paths, lengths) if batch else (paths[0], lengths[0])


def paths_to_lists(paths, lengths, num_arcs=None) -> list:
    """k2's nested lists ``[fsa][path][arc]`` from `random_paths`' output (host): FSAs without a successful
    path get no paths, as in k2. With `num_arcs` (the FsaVec's ``num_arcs``, [B]) the arc indices are k2's
    idx012 (offset by the arcs of the earlier FSAs); without, indices within each FSA."""
    paths, lengths = np.asarray(paths), np.asarray(lengths)
    if paths.ndim == 2:
        paths, lengths = paths[None], lengths[None]
    off = np.zeros(paths.shape[0], np.int64)
    if num_arcs is not None:
        off = np.concatenate([[0], np.cumsum(np.asarray(num_arcs, np.int64).reshape(-1))[:-1]])
        if off.shape[0] != paths.shape[0]:
            raise ValueError(f"num_arcs: expected {paths.shape[0]} entries (one per FSA), got {off.shape[0]}")
    return [[(paths[b, i, :n] + off[b]).tolist() for i, n in enumerate(lengths[b]) if n > 0]
            for b in range(paths.shape[0])]
