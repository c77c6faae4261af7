"""Scores of acyclic (top-sorted) FSAs, k2 semantics, jit-compiled and differentiable.

``get_forward_scores``, ``get_backward_scores``, ``get_tot_scores`` and ``get_arc_post`` mirror
``k2.Fsa.get_forward_scores`` etc. in both semirings (``log_semiring=True``: log-sum-exp;
``False``: tropical, i.e. max).  They take an :class:`fsa_ops.fsa.Fsa` (one FSA, or a batch with a
leading dim ``B``) and return padded arrays instead of k2's ragged ones:

- forward / backward scores: ``[B, max_states]`` (``[max_states]`` for one FSA); padding states
  (``>= num_states``) and unreachable states hold ``-inf``;
- total scores: ``[B]`` (a scalar for one FSA); ``-inf`` where no path reaches the final state
  (also for an empty FSA);
- arc posteriors: ``[B, A]`` (``[A]``) log-posteriors ``fwd[src] + score + bwd[dst] - tot``,
  ``-inf`` for padding arcs and for FSAs whose total score is ``-inf``.

Algorithm: a ``lax.scan`` over state index (states of a top-sorted FSA are numbered so that every
arc goes from a lower to a higher state), batched over FSAs.  The per-state step reads a padded
table of incoming (forward) / leaving (backward) arcs, ``[B, max_states, K]``; ``K`` is the largest
in/out degree, measured on the host when the arcs are concrete (rounded up to a few bucket sizes
so that similar FSAs share a compiled program) and ``A`` (the padded arc count) when the FSA's
structure is traced, i.e. passed as an argument of a user's ``jit`` (correct, but
``O(states x arcs)`` work: close over large FSAs instead, which keeps their structure concrete).  Lattices produced by :func:`fsa_ops.dense.intersect_dense` have a frame-synchronous
structure; their total scores are computed much faster by ``fsa_ops.dense.dense_tot_scores``.

Non-finite scores: an FSA with a NaN or +inf score on a real arc gets NaN for all its scores
(forward / backward scores of its real states, total score, arc posteriors and gradient on its
real arcs; the gradient is 0 where the FSA's cotangent is 0, i.e. masked out), wherever the arc
sits, instead of whatever value the recursions would make of it; the other FSAs of a batch are
unaffected.  ``-inf`` scores are legitimate (an arc that cannot be taken).

Gradients: ``get_tot_scores`` has an analytic ``custom_vjp``: the gradient w.r.t. arc scores is
``exp(arc_post)`` (log semiring) or the indicator of the best path (tropical, as k2's
``get_tot_scores_tropical_backward``).  Forward/backward scores and arc posteriors are
differentiated by JAX through the scan (memory O(arcs)).

Precision: ``use_double_scores=True`` (k2's default: double-precision accumulation) computes in
float64 when ``jax_enable_x64`` is on.  JAX cannot hold float64 arrays without x64, so otherwise
the scores are computed in float32 and the first such call of the process warns
(`Float32ScoresWarning`, saying how to turn x64 on: ``jax.config.update("jax_enable_x64", True)``
at startup); ``use_double_scores=False`` asks for float32 and does not warn.  A warning rather
than an error: code ported from k2 passes the default True everywhere, x64 changes JAX's default
dtypes for the whole program, and the recursions here keep float32's absolute precision by
shifting scores (see the modules), so float32 is a sound fallback once it is said.
"""
from __future__ import annotations

import functools
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

NEG_INF = float("-inf")

__all__ = [
    "get_forward_scores",
    "get_backward_scores",
    "get_tot_scores",
    "get_arc_post",
    "get_entering_arcs",
    "best_path_arcs",
    "score_dtype",
    "safe_logsumexp",
    "nonfinite_sum",
    "bad_fsas",
    "Float32ScoresWarning",
]


# --------------------------------------------------------------------------------------------
# small numerics helpers (shared with the dense, pruned, shortest-path and CTC modules)
# --------------------------------------------------------------------------------------------


class Float32ScoresWarning(UserWarning):
    """``use_double_scores=True`` was asked for while ``jax_enable_x64`` is off: float32 is used."""


_warned_float32 = False


def score_dtype(use_double_scores: bool, warn: bool = True):
    """float64 if requested and x64 is enabled, else float32; a request that x64 cannot honour
    warns once per process (`Float32ScoresWarning`) unless `warn` is False (internal callers
    whose precision is not a user's option)."""
    global _warned_float32
    if use_double_scores and jax.config.jax_enable_x64:
        return jnp.float64
    if use_double_scores and warn and not _warned_float32:
        _warned_float32 = True
        warnings.warn(
            "fsa_ops: use_double_scores=True (the k2 default) but jax_enable_x64 is off, so the scores are "
            "computed in float32. For float64, call jax.config.update('jax_enable_x64', True) at startup; "
            "pass use_double_scores=False to ask for float32 without this warning (shown once).",
            Float32ScoresWarning, stacklevel=4)
    return jnp.float32


def safe_logsumexp(x, axis=-1):
    """log-sum-exp that returns -inf (value) and 0 (gradient) where all inputs are -inf."""
    m = lax.stop_gradient(jnp.max(x, axis=axis, keepdims=True))
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    s = jnp.sum(jnp.exp(x - m), axis=axis)
    pos = s > 0
    out = jnp.log(jnp.where(pos, s, 1.0)) + jnp.squeeze(m, axis)
    return jnp.where(pos, out, NEG_INF)


def nonfinite_sum(x, axis):
    """bool: whether x holds a NaN or +inf along `axis`, read off a plain sum (NaN or +inf exactly
    then; -inf entries are legitimate scores). A sum, not a max: XLA's CPU max reduction does not
    propagate NaN."""
    return ~(jnp.sum(x, axis=axis) < jnp.inf)


def bad_fsas(arcs):
    """[B] bool: FSAs with a NaN or +inf score on a real arc (their scores are all NaN)."""
    return nonfinite_sum(jnp.where(valid_arcs(arcs), arcs.score, 0.0), axis=1)


def _poison_states(x, arcs):
    """x [B, S] with NaN on the real states of the FSAs that `bad_fsas` flags."""
    real = jnp.arange(x.shape[1])[None, :] < arcs.num_states[:, None]
    return jnp.where(bad_fsas(arcs)[:, None] & real, jnp.nan, x)


def semiring_reduce(x, axis, log_semiring: bool):
    """log-sum-exp (`safe_logsumexp`) or max over `axis`."""
    return safe_logsumexp(x, axis=axis) if log_semiring else jnp.max(x, axis=axis)


def is_traced(*xs) -> bool:
    """Whether any of `xs` is a JAX tracer (its values are unknown on the host)."""
    return any(isinstance(x, jax.core.Tracer) for x in xs)


# exp(x) of arguments below this is flushed to exactly 0 (see `exp_flushed`).
EXP_FLOOR = -80.0


def exp_flushed(x):
    """exp(x) for x <= 0, with results below exp(EXP_FLOOR) ~ 1.8e-35 flushed to 0 instead of a
    float32 subnormal: XLA does not flush subnormals and their arithmetic is slow on x86 CPUs, and
    terms this small cannot change a sum that contains exp(0) = 1."""
    return jnp.where(x > EXP_FLOOR, jnp.exp(jnp.maximum(x, EXP_FLOOR)), 0.0)


def shift_states(x, by: int, fill=NEG_INF):
    """x[..., s - by] along the last axis with `fill` shifted in (`by` static, either sign; all
    `fill` when |by| >= the axis length)."""
    if by == 0:
        return x
    n = x.shape[-1]
    if abs(by) >= n:
        return jnp.full_like(x, fill)
    pad = jnp.full(x.shape[:-1] + (abs(by),), fill, x.dtype)
    if by > 0:
        return jnp.concatenate([pad, x[..., :n - by]], axis=-1)
    return jnp.concatenate([x[..., -by:], pad], axis=-1)


def bucket(n: int) -> int:
    """Round up to 1, 2, 3, 4, 6, 8, 12, 16, 24, ... so that similar sizes share compiled programs
    (steps of at most 1.5x: padding wastes at most a third of the per-step work)."""
    n = max(int(n), 1)
    if n <= 4:
        return n
    p = 1 << (n - 1).bit_length()          # power of two >= n
    return p * 3 // 4 if p * 3 // 4 >= n else p


# --------------------------------------------------------------------------------------------
# access to the agreed Fsa layout
# --------------------------------------------------------------------------------------------


class Arcs(NamedTuple):
    """The arcs of a batch of FSAs as padded arrays (what `fsa_arrays` returns)."""
    src: jax.Array        # int32 [B, A]
    dst: jax.Array        # int32 [B, A]
    label: jax.Array      # int32 [B, A]
    score: jax.Array      # float [B, A]
    num_states: jax.Array  # int32 [B]
    num_arcs: jax.Array   # int32 [B]


def fsa_arrays(fsa, name: str = "fsas"):
    """Return (Arcs with a batch dim, max_states, was_batch) for an Fsa or FsaVec."""
    for f in ("src", "dst", "label", "score", "num_states", "num_arcs"):
        if not hasattr(fsa, f):
            raise TypeError(f"{name}: expected an fsa_ops Fsa/FsaVec, got {type(fsa).__name__} "
                            f"(no attribute {f!r})")
    src = _structural(fsa.src)
    batch = src.ndim == 2
    if src.ndim not in (1, 2):
        raise ValueError(f"{name}: arc arrays must be [A] or [B, A], got shape {src.shape}")
    dst, label = _structural(fsa.dst), _structural(fsa.label)
    score = jnp.asarray(fsa.score)
    ns, na = _structural(fsa.num_states), _structural(fsa.num_arcs)
    if not batch:
        src, dst, label, score = (a[None] for a in (src, dst, label, score))
        ns, na = ns.reshape(1), na.reshape(1)
    return Arcs(src, dst, label, score, ns, na), int(fsa.max_states), batch


def _structural(x):
    """int32 arc structure: numpy when concrete, so that it stays concrete (host-inspectable, e.g.
    for the degree tables) when an op runs inside a user's ``jit``; jnp when traced."""
    if is_traced(x):
        return jnp.asarray(x).astype(jnp.int32)
    return np.asarray(x).astype(np.int32)


def valid_arcs(arcs: Arcs):
    """[B, A] bool: arc slot < num_arcs (numpy when num_arcs is concrete)."""
    A = arcs.src.shape[1]
    xp = jnp if is_traced(arcs.num_arcs) else np
    return xp.arange(A, dtype=np.int32)[None, :] < xp.asarray(arcs.num_arcs)[:, None]


def max_degree(key, valid, num_keys: int, traced_default: int) -> int:
    """Largest number of valid arcs sharing a key (in/out degree); host-side if concrete."""
    if is_traced(key, valid):
        return bucket(traced_default)
    k = np.asarray(key)
    v = np.asarray(valid)
    if not v.any():
        return 1
    b_idx = np.broadcast_to(np.arange(k.shape[0])[:, None], k.shape)[v]
    flat = b_idx.astype(np.int64) * (num_keys + 1) + np.clip(k[v], 0, num_keys)
    return bucket(np.bincount(flat).max())


def arc_table(key, valid, num_keys: int, K: int):
    """Padded table [B, num_keys, K] of arc indices grouped by key (-1 = none), arcs in order.

    jnp-only (works on traced arrays); arcs beyond K per key are dropped (K must be >= degree).
    """
    B, A = key.shape
    k = jnp.where(valid, key, num_keys)
    order = jnp.argsort(k, axis=1, stable=True).astype(jnp.int32)
    sk = jnp.take_along_axis(k, order, axis=1)
    first = jax.vmap(lambda r: jnp.searchsorted(r, r, side="left"))(sk).astype(jnp.int32)
    rank = jnp.arange(A, dtype=jnp.int32)[None, :] - first
    b_idx = jnp.broadcast_to(jnp.arange(B, dtype=jnp.int32)[:, None], (B, A))
    table = jnp.full((B, num_keys + 1, K), -1, jnp.int32)
    table = table.at[b_idx, sk, rank].set(order, mode="drop")
    return table[:, :num_keys]


def _gather_arcs(table, values, fill):
    """values[b, table[b, s, k]] with `fill` where table == -1."""
    B, S, K = table.shape
    t = table.reshape(B, S * K)
    g = jnp.take_along_axis(values, jnp.maximum(t, 0), axis=1)
    return jnp.where(t >= 0, g, fill).reshape(B, S, K)


# --------------------------------------------------------------------------------------------
# per-state steps (kept separate: a GPU kernel may replace them)
# --------------------------------------------------------------------------------------------


def forward_state_step(alpha, in_src, in_score, log_semiring: bool):
    """alpha: [B, S]; in_src/in_score: [B, K] incoming arcs of the current state -> [B], argmax."""
    vals = jnp.take_along_axis(alpha, in_src, axis=1) + in_score
    return semiring_reduce(vals, -1, log_semiring), jnp.argmax(vals, axis=-1)


def backward_state_step(beta, out_dst, out_score, log_semiring: bool):
    vals = jnp.take_along_axis(beta, out_dst, axis=1) + out_score
    return semiring_reduce(vals, -1, log_semiring)


# --------------------------------------------------------------------------------------------
# core (jitted) computations on arrays
# --------------------------------------------------------------------------------------------


def _table_arcs(arcs: Arcs):
    """Arcs that enter the in/out tables: real arcs whose score is not -inf (a -inf arc adds nothing
    to any score; leaving them out keeps the tables of lattices with masked arcs narrow)."""
    return valid_arcs(arcs) & ~jnp.isneginf(arcs.score)


def forward_core(arcs: Arcs, S: int, K: int, log_semiring: bool, dtype):
    """Forward scores [B, S] and entering arcs [B, S] (argmax arc, -1 if none) of top-sorted FSAs:
    a `lax.scan` over states reading the [B, S, K] table of incoming arcs (K >= in-degree)."""
    B, A = arcs.src.shape
    valid = _table_arcs(arcs)
    score = jnp.where(valid, arcs.score.astype(dtype), NEG_INF)
    table = arc_table(arcs.dst, valid, S, K)                      # [B, S, K]
    in_src = _gather_arcs(table, arcs.src, 0)
    in_score = _gather_arcs(table, score, NEG_INF)
    start = jnp.where(arcs.num_states > 0, 0.0, NEG_INF).astype(dtype)
    alpha0 = jnp.full((B, S), NEG_INF, dtype).at[:, 0].set(start)

    def step(alpha, xs):
        s, src_s, score_s = xs
        new, k = forward_state_step(alpha, src_s, score_s, log_semiring)
        new = jnp.where(s == 0, alpha[:, 0], new)
        alpha = lax.dynamic_update_slice(alpha, new[:, None], (jnp.zeros_like(s), s))
        return alpha, k

    xs = (jnp.arange(S, dtype=jnp.int32), jnp.moveaxis(in_src, 1, 0), jnp.moveaxis(in_score, 1, 0))
    alpha, kbest = lax.scan(step, alpha0, xs)
    kbest = kbest.T                                                # [B, S]
    entering = jnp.take_along_axis(table, kbest[..., None], axis=2)[..., 0]
    alpha = _poison_states(alpha, arcs)
    entering = jnp.where(jnp.isfinite(alpha) & (jnp.arange(S)[None] > 0), entering, -1)
    return alpha, entering


def _backward_core(arcs: Arcs, S: int, K: int, log_semiring: bool, dtype):
    B, A = arcs.src.shape
    valid = _table_arcs(arcs)
    score = jnp.where(valid, arcs.score.astype(dtype), NEG_INF)
    table = arc_table(arcs.src, valid, S, K)
    out_dst = _gather_arcs(table, arcs.dst, 0)
    out_score = _gather_arcs(table, score, NEG_INF)
    final = arcs.num_states - 1                                    # -1 for empty FSAs
    beta0 = jnp.full((B, S), NEG_INF, dtype)

    def step(beta, xs):
        s, dst_s, score_s = xs
        new = backward_state_step(beta, dst_s, score_s, log_semiring)
        new = jnp.where(s == final, 0.0, new).astype(dtype)
        beta = lax.dynamic_update_slice(beta, new[:, None], (jnp.zeros_like(s), s))
        return beta, None

    xs = (jnp.arange(S, dtype=jnp.int32), jnp.moveaxis(out_dst, 1, 0),
          jnp.moveaxis(out_score, 1, 0))
    beta, _ = lax.scan(step, beta0, xs, reverse=True)
    return _poison_states(beta, arcs)


def tot_from_alpha(alpha, num_states):
    """Total scores [B] from forward scores [B, S]: the final state's score (-inf for empty FSAs)."""
    final = jnp.maximum(num_states - 1, 0)
    tot = jnp.take_along_axis(alpha, final[:, None], axis=1)[:, 0]
    return jnp.where(num_states > 0, tot, NEG_INF)


def _arc_post_core(arcs: Arcs, alpha, beta, tot, dtype):
    valid = valid_arcs(arcs)
    fa = jnp.take_along_axis(alpha, arcs.src, axis=1)
    bb = jnp.take_along_axis(beta, arcs.dst, axis=1)
    ok = jnp.isfinite(tot)
    tot_safe = jnp.where(ok, tot, 0.0)
    post = fa + arcs.score.astype(dtype) + bb - tot_safe[:, None]
    post = jnp.where(valid & ok[:, None], post, NEG_INF)
    return jnp.where(valid & jnp.isnan(tot)[:, None], jnp.nan, post)


def best_path_arcs(arcs: Arcs, entering, tot):
    """Backtrack entering arcs from the final state.

    Returns (path [B, S] arc indices in path order padded with -1, length [B]).
    """
    B, S = entering.shape
    cur0 = jnp.where(jnp.isfinite(tot), arcs.num_states - 1, -1)

    def step(cur, s):
        on = (s == cur) & (s > 0)
        arc = jnp.where(on, entering[:, s], -1)
        prev = jnp.take_along_axis(arcs.src, jnp.maximum(arc, 0)[:, None], axis=1)[:, 0]
        cur = jnp.where(on, prev, cur)
        return cur, arc

    _, arcs_rev = lax.scan(step, cur0, jnp.arange(S - 1, -1, -1, dtype=jnp.int32))
    by_state = arcs_rev[::-1].T                                  # [B, S], ascending dst state
    order = jnp.argsort(by_state < 0, axis=1, stable=True)
    path = jnp.take_along_axis(by_state, order, axis=1)
    length = jnp.sum(by_state >= 0, axis=1).astype(jnp.int32)
    return path, length


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def _forward_jit(arcs, S, K, log_semiring, dtype):
    return forward_core(arcs, S, K, log_semiring, dtype)[0]


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def _entering_jit(arcs, S, K, log_semiring, dtype):
    return forward_core(arcs, S, K, log_semiring, dtype)


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def _backward_jit(arcs, S, K, log_semiring, dtype):
    return _backward_core(arcs, S, K, log_semiring, dtype)


# total scores with an analytic VJP ------------------------------------------------------------


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3, 4))
def _tot_scores(S, Kin, Kout, log_semiring, dtype, arcs):
    alpha, _ = forward_core(arcs, S, Kin, log_semiring, dtype)
    return tot_from_alpha(alpha, arcs.num_states)


def _tot_scores_fwd(S, Kin, Kout, log_semiring, dtype, arcs):
    alpha, entering = forward_core(arcs, S, Kin, log_semiring, dtype)
    tot = tot_from_alpha(alpha, arcs.num_states)
    return tot, (arcs, alpha, entering, tot)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4))
def _tot_scores_grad(S, Kin, Kout, log_semiring, dtype, arcs, alpha, entering, tot, g):
    B, A = arcs.src.shape
    if log_semiring:
        beta = _backward_core(arcs, S, Kout, True, dtype)
        post = _arc_post_core(arcs, alpha, beta, tot, dtype)
        grad = jnp.exp(post) * g[:, None]
    else:
        path, length = best_path_arcs(arcs, entering, tot)
        idx = jnp.where(path >= 0, path, A)
        b_idx = jnp.broadcast_to(jnp.arange(B)[:, None], idx.shape)
        grad = jnp.zeros((B, A), dtype).at[b_idx, idx].add(
            jnp.broadcast_to(g[:, None], idx.shape).astype(dtype), mode="drop")
    # FSAs with a NaN total: NaN on their real arcs, 0 where the cotangent is 0 (masked out)
    grad = jnp.where(valid_arcs(arcs) & jnp.isnan(tot)[:, None], jnp.where(g != 0, jnp.nan, 0.0)[:, None], grad)
    return grad.astype(arcs.score.dtype)


def _tot_scores_bwd(S, Kin, Kout, log_semiring, dtype, res, g):
    arcs, alpha, entering, tot = res
    grad = _tot_scores_grad(S, Kin, Kout, log_semiring, dtype, arcs, alpha, entering, tot, g)
    zeros_int = jax.tree.map(lambda x: None, arcs._replace(score=None))
    return (zeros_int._replace(score=grad),)


_tot_scores.defvjp(_tot_scores_fwd, _tot_scores_bwd)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4))
def _tot_jit(S, Kin, Kout, log_semiring, dtype, arcs):
    return _tot_scores(S, Kin, Kout, log_semiring, dtype, arcs)


# --------------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------------


def prepare_fsas(fsas, use_double_scores):
    """Batched arcs and static sizes for the scoring functions: (Arcs, S, kin, kout, was_batch, dtype).

    kin / kout: bucketed in/out degree of the arc tables (measured on the host when the structure
    is concrete); checks that concrete FSAs are top-sorted."""
    arcs, S, batch = fsa_arrays(fsas)
    if S < 1:
        S = 1
    valid = valid_arcs(arcs)
    if not is_traced(arcs.score):
        valid = valid & ~np.isneginf(np.asarray(arcs.score))   # as _table_arcs; else a structural bound
    A = arcs.src.shape[1]
    kin = max_degree(arcs.dst, valid, S, A)
    kout = max_degree(arcs.src, valid, S, A)
    if not is_traced(arcs.src, arcs.dst, arcs.num_arcs):
        _check_top_sorted(arcs)
    return arcs, S, kin, kout, batch, score_dtype(use_double_scores)


def _check_top_sorted(arcs: Arcs):
    src, dst, na = np.asarray(arcs.src), np.asarray(arcs.dst), np.asarray(arcs.num_arcs)
    ns = np.asarray(arcs.num_states)
    valid = np.arange(src.shape[1])[None, :] < na[:, None]
    bad = valid & (dst <= src)
    if bad.any():
        b, i = np.argwhere(bad)[0]
        raise ValueError(f"fsas: FSA {b} is not top-sorted (arc {i}: {src[b, i]} -> {dst[b, i]}); "
                         "forward/backward scores need acyclic FSAs with arcs from lower to "
                         "higher states (use top_sort / connect first)")
    over = valid & (dst >= ns[:, None])
    if over.any():
        b, i = np.argwhere(over)[0]
        raise ValueError(f"fsas: FSA {b} arc {i} enters state {dst[b, i]} >= num_states "
                         f"{ns[b]}")


def _unbatch(x, batch):
    return x if batch else x[0]


def get_forward_scores(fsas, use_double_scores: bool = True, log_semiring: bool = True):
    """Forward scores of each state: ``[B, max_states]`` (``[max_states]`` for one FSA).

    ``use_double_scores``: float64 when ``jax_enable_x64`` is on; float32 otherwise (warned once).
    """
    arcs, S, kin, _, batch, dtype = prepare_fsas(fsas, use_double_scores)
    return _unbatch(_forward_jit(arcs, S, kin, bool(log_semiring), dtype), batch)


def get_backward_scores(fsas, use_double_scores: bool = True, log_semiring: bool = True):
    """Backward scores of each state (0 at the final state), padded like the forward scores.

    ``use_double_scores``: float64 when ``jax_enable_x64`` is on; float32 otherwise (warned once).
    """
    arcs, S, _, kout, batch, dtype = prepare_fsas(fsas, use_double_scores)
    return _unbatch(_backward_jit(arcs, S, kout, bool(log_semiring), dtype), batch)


def get_tot_scores(fsas, use_double_scores: bool = True, log_semiring: bool = True):
    """Total score of each FSA (``[B]`` or a scalar); ``-inf`` if the final state is unreachable,
    NaN if a real arc scores NaN or +inf (see the module docstring).

    Differentiable w.r.t. ``fsas.score`` with an analytic backward (arc posteriors / best path).

    ``use_double_scores``: float64 when ``jax_enable_x64`` is on; float32 otherwise (warned once).
    """
    arcs, S, kin, kout, batch, dtype = prepare_fsas(fsas, use_double_scores)
    return _unbatch(_tot_jit(S, kin, kout, bool(log_semiring), dtype, arcs), batch)


def get_arc_post(fsas, use_double_scores: bool = True, log_semiring: bool = True):
    """Arc log-posteriors ``fwd[src] + score + bwd[dst] - tot`` (``[B, A]`` or ``[A]``).

    ``use_double_scores``: float64 when ``jax_enable_x64`` is on; float32 otherwise (warned once).
    """
    arcs, S, kin, kout, batch, dtype = prepare_fsas(fsas, use_double_scores)
    alpha = _forward_jit(arcs, S, kin, bool(log_semiring), dtype)
    beta = _backward_jit(arcs, S, kout, bool(log_semiring), dtype)
    tot = tot_from_alpha(alpha, arcs.num_states)
    return _unbatch(_arc_post_core(arcs, alpha, beta, tot, dtype), batch)


def get_entering_arcs(fsas, use_double_scores: bool = True):
    """Best (tropical) entering arc of each state, ``-1`` for the start / unreachable states.

    ``use_double_scores``: float64 when ``jax_enable_x64`` is on; float32 otherwise (warned once).
    """
    arcs, S, kin, _, batch, dtype = prepare_fsas(fsas, use_double_scores)
    return _unbatch(_entering_jit(arcs, S, kin, False, dtype)[1], batch)
