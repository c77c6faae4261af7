"""k2's ``OnlineDenseIntersecter``: the beam search of ``intersect_dense_pruned``, fed chunk by chunk.

``decode(dense_fsas, decode_states)`` runs the frame-synchronous search of :mod:`fsa_ops.pruned`
(same frame step, same fixed-size active set, same beams) over each stream's next chunk of frames,
starting from that stream's carried :class:`DecodeStateInfo`, and returns the lattice of every frame
decoded so far together with the new states.  Streams in one call may be at different frames and
bring chunks of different lengths (``dense_fsas.duration``); a stream that starts gets ``None`` (or
``DecodeStateInfo()``) as its state.

Each returned lattice ends with a final frame as if the stream ended there: the active states' arcs
with label ``-1`` (log-prob 0) enter the final state.  With ``allow_partial`` (k2's default), a
stream none of whose active states has a ``-1`` arc instead gets every arc leaving its active
states redirected into the final state, scored by the graph alone, labelled ``-1``, attributes 0
(k2's partial results).  The lattice is pruned with ``output_beam`` against its own best path, so
after a stream's last chunk it equals ``intersect_dense_pruned`` over the whole utterance (same
static layout: state ``t * K + k`` is slot ``k`` at frame ``t``, arc ``(t * K + k) * kout + j``),
and after any chunk ``intersect_dense_pruned`` over the frames so far (always with
``allow_partial=False``; with it, whenever an active state has a ``-1`` arc).  States are values:
``decode`` returns new ones and never modifies its arguments.

The state keeps the search's per-frame records (unpruned by ``output_beam``), in arrays whose frame
capacity grows in steps (`fsa_ops.scores.bucket`, at least 16), so that the jitted chunk step
compiles once per (capacity, chunk length).  Memory is ``O(frames x K x kout)`` per stream, as for
``intersect_dense_pruned``.  A stream with a NaN or +inf log-prob in any of its chunks gets
lattices whose arcs all score NaN from then on.

Unlike k2: k2 prunes the carried history in place (with the backward score of each state on the
newest frame taken as minus its forward score, which never removes an arc the final lattice would
keep) and does not prune the final arcs, so its partial lattices hold more arcs than these (best
paths agree); there is no dynamic beam (as in ``intersect_dense_pruned``), hence no ``beam`` in
the state; ``decode`` is meant for decoding, not for gradients (k2's online version keeps no map
from lattice arcs to the log-probs either).
"""
from __future__ import annotations

import functools
from typing import NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fsa_ops.dense import DenseFsaVec, bad_segments, broadcast_attrs
from fsa_ops.fsa import Fsa
from fsa_ops.pruned import (PrunedConfig, check_search_args, final_frame_arcs, pruned_frame_step, pruned_lattice,
                            pruned_tables)
from fsa_ops.scores import NEG_INF, bucket, fsa_arrays, is_traced, max_degree, score_dtype, valid_arcs

__all__ = ["OnlineDenseIntersecter", "DecodeStateInfo"]

MIN_CAPACITY = 16


class DecodeStateInfo(NamedTuple):
    """One stream's decoding state between chunks (a pytree); ``DecodeStateInfo()`` is a new stream.

    states int32[K]: the active graph states (-1: empty slot); scores [K]: their Viterbi forward scores;
    num_frames int32[]: frames decoded so far (F); frame_scores [Cap, K]: the slots' forward scores on each
    frame t < F; arc_scores [Cap, K, kout]: score (graph + log-prob) of the j-th arc leaving slot k on frame t
    (-inf: not taken); dest_slots int32[Cap, K, kout]: the slot it enters on frame t + 1 (-1: none);
    arc_map int32[Cap, K, kout]: the graph arc (-1: none); bad bool[]: a NaN or +inf log-prob was seen.
    Cap >= F is the frame capacity; rows t >= F are unused.
    """
    states: Optional[jax.Array] = None
    scores: Optional[jax.Array] = None
    num_frames: Optional[jax.Array] = None
    frame_scores: Optional[jax.Array] = None
    arc_scores: Optional[jax.Array] = None
    dest_slots: Optional[jax.Array] = None
    arc_map: Optional[jax.Array] = None
    bad: Optional[jax.Array] = None


def _fresh_state(cfg: PrunedConfig, cap: int) -> DecodeStateInfo:
    K, Ko = cfg.K, cfg.kout
    return DecodeStateInfo(
        states=jnp.full((K,), -1, jnp.int32).at[0].set(0),
        scores=jnp.full((K,), NEG_INF, cfg.dtype).at[0].set(0.0),
        num_frames=jnp.zeros((), jnp.int32),
        frame_scores=jnp.full((cap, K), NEG_INF, cfg.dtype),
        arc_scores=jnp.full((cap, K, Ko), NEG_INF, cfg.dtype),
        dest_slots=jnp.full((cap, K, Ko), -1, jnp.int32),
        arc_map=jnp.full((cap, K, Ko), -1, jnp.int32),
        bad=jnp.zeros((), bool))


def _grow(state: DecodeStateInfo, cap: int, dtype) -> DecodeStateInfo:
    """The same state as jax arrays of the search's dtypes, with frame capacity `cap` (rows appended)."""
    types = dict(states=jnp.int32, scores=dtype, num_frames=jnp.int32, frame_scores=dtype, arc_scores=dtype,
                 dest_slots=jnp.int32, arc_map=jnp.int32, bad=bool)
    state = DecodeStateInfo(**{k: jnp.asarray(getattr(state, k), t) for k, t in types.items()})
    extra = cap - state.frame_scores.shape[0]
    if extra == 0:
        return state

    def pad(x, fill):
        return jnp.concatenate([x, jnp.full((extra,) + x.shape[1:], fill, x.dtype)], axis=0)
    return state._replace(frame_scores=pad(state.frame_scores, NEG_INF), arc_scores=pad(state.arc_scores, NEG_INF),
                          dest_slots=pad(state.dest_slots, -1), arc_map=pad(state.arc_map, -1))


@functools.partial(jax.jit, static_argnums=(0, 1))
def _online_core(cfg: PrunedConfig, allow_partial: bool, graph, attrs, states, lp, dur):
    """One chunk for N streams: states (N DecodeStateInfo of one capacity), lp [N, T, C], dur [N]."""
    N, T, _ = lp.shape
    arcs = jax.tree.map(lambda x: jnp.broadcast_to(x, (N,) + x.shape[1:]), graph)
    tab = pruned_tables(cfg, arcs)
    stk = jax.tree.map(lambda *xs: jnp.stack(xs, axis=0), *states)
    nf = stk.num_frames
    cap = stk.frame_scores.shape[1]

    def step(carry, xs):
        act, sc = carry
        t, lp_t = xs
        nact, nsc, w, ds, ca, _ = pruned_frame_step(act, sc, lp_t, jnp.zeros((N,), bool), tab, cfg)
        live = (t < dur)[:, None]
        return (jnp.where(live, nact, act), jnp.where(live, nsc, sc)), (sc, w, ds, ca)

    lpT = jnp.moveaxis(lp.astype(cfg.dtype), 1, 0)
    (act, sc), (F, W, DS, CA) = lax.scan(step, (stk.states, stk.scores), (jnp.arange(T, dtype=jnp.int32), lpT))
    # append the chunk's frames t < dur[n] at rows nf[n] + t of each stream's records (frame-major)
    n_idx = jnp.arange(N)[None, :]
    rows = jnp.where(jnp.arange(T)[:, None] < dur[None, :], nf[None, :] + jnp.arange(T)[:, None], cap)
    hist = [jnp.moveaxis(x, 0, 1).at[rows, n_idx].set(r, mode="drop")
            for x, r in zip((stk.frame_scores, stk.arc_scores, stk.dest_slots, stk.arc_map), (F, W, DS, CA))]
    nf_new = nf + dur
    bad = stk.bad | bad_segments(arcs, lp, dur)

    # the lattice: the records plus the final frame at row nf_new[n]
    Wf, DSf, CAf, CLf = final_frame_arcs(act, sc, tab, allow_partial)
    fills = (NEG_INF, NEG_INF, -1, -1)
    full = [jnp.concatenate([h, jnp.full((1,) + h.shape[1:], f, h.dtype)], axis=0).at[nf_new, n_idx[0]].set(r)
            for h, f, r in zip(hist, fills, (sc, Wf, DSf, CAf))]
    fwd, Wl, DSl, CAl = full
    CL = jnp.where(CAl >= 0, graph.label[0][jnp.maximum(CAl, 0)], -1)
    CL = CL.at[nf_new, n_idx[0]].set(CLf)
    attrs_b = jax.tree.map(lambda x: jnp.broadcast_to(x, (N,) + x.shape[1:]), attrs)
    lat = pruned_lattice(cfg, (fwd, Wl, DSl, CAl, CL), nf_new, jnp.ones((N,), bool), bad, attrs_b)

    new_states = tuple(DecodeStateInfo(act[n], sc[n], nf_new[n], hist[0][:, n], hist[1][:, n], hist[2][:, n],
                                       hist[3][:, n], bad[n]) for n in range(N))
    return lat, new_states


class OnlineDenseIntersecter:
    """Chunk-by-chunk pruned intersection of one decoding graph with ``num_streams`` streams (k2's
    ``OnlineDenseIntersecter``); see the module docstring.

    ``decoding_graph``: one Fsa, or an FsaVec holding one (concrete, non-empty).  The beams and active-state
    bounds are those of ``intersect_dense_pruned`` (``max_active_states`` is the fixed size K of the active
    set, capped at the graph's number of states).
    """

    def __init__(self, decoding_graph: Fsa, num_streams: int, search_beam: float, output_beam: float,
                 min_active_states: int, max_active_states: int, allow_partial: bool = True) -> None:
        if not isinstance(decoding_graph, Fsa):
            raise TypeError(f"decoding_graph: expected an Fsa, got {type(decoding_graph).__name__}")
        if isinstance(num_streams, bool) or not isinstance(num_streams, (int, np.integer)) or num_streams < 1:
            raise ValueError(f"num_streams: expected an int >= 1, got {num_streams!r}")
        check_search_args(search_beam, output_beam, min_active_states, max_active_states, allow_partial)
        arcs, S, _ = fsa_arrays(decoding_graph, "decoding_graph")
        if is_traced(arcs.src, arcs.dst, arcs.label, arcs.num_arcs, arcs.num_states):
            raise ValueError("decoding_graph: must be concrete (built on the host), not traced")
        if arcs.src.shape[0] != 1:
            raise ValueError(f"decoding_graph: expected one FSA (an Fsa or an FsaVec of one), got an FsaVec of "
                             f"{arcs.src.shape[0]}")
        if int(np.asarray(arcs.num_states)[0]) < 1:
            raise ValueError("decoding_graph: the graph is empty (0 states)")
        S = max(S, 1)
        valid = np.asarray(valid_arcs(arcs))
        kout = max_degree(arcs.src, valid, S, arcs.src.shape[1])
        K = min(int(max_active_states), S)
        self._cfg = PrunedConfig(S, kout, K, float(search_beam), float(output_beam),
                                 min(int(min_active_states), K), score_dtype(True, warn=False))
        self._graph = jax.tree.map(jnp.asarray, arcs)
        a_batch = np.ndim(decoding_graph.src) == 2
        self._attrs = broadcast_attrs(decoding_graph.attrs, a_batch, 1)
        lab = np.asarray(arcs.label)[valid]
        self._max_label = int(lab.max()) if lab.size else -1
        self.num_streams_ = int(num_streams)
        self.allow_partial = bool(allow_partial)
        self.decoding_graph = decoding_graph

    @property
    def num_streams(self) -> int:
        return self.num_streams_

    def _check_state(self, i: int, s) -> None:
        if not isinstance(s, DecodeStateInfo):
            raise TypeError(f"decode_states[{i}]: expected a DecodeStateInfo or None, got {type(s).__name__}")
        if s.states is None:
            return
        K, Ko = self._cfg.K, self._cfg.kout
        shapes = {"states": (K,), "scores": (K,), "num_frames": (), "bad": ()}
        for name, shape in shapes.items():
            if getattr(s, name) is None or np.shape(getattr(s, name)) != shape:
                raise ValueError(f"decode_states[{i}].{name}: expected shape {shape}, got "
                                 f"{None if getattr(s, name) is None else np.shape(getattr(s, name))} "
                                 "(a state from another intersecter?)")
        cap = np.shape(s.frame_scores)[0] if s.frame_scores is not None and np.ndim(s.frame_scores) == 2 else None
        for name, shape in (("frame_scores", (cap, K)), ("arc_scores", (cap, K, Ko)),
                            ("dest_slots", (cap, K, Ko)), ("arc_map", (cap, K, Ko))):
            if cap is None or getattr(s, name) is None or np.shape(getattr(s, name)) != shape:
                raise ValueError(f"decode_states[{i}].{name}: expected shape {shape} (Cap frames, K={K} slots, "
                                 f"kout={Ko}), got {None if getattr(s, name) is None else np.shape(getattr(s, name))}"
                                 " (a state from another intersecter?)")

    def decode(self, dense_fsas: DenseFsaVec, decode_states: Sequence[Optional[DecodeStateInfo]]):
        """Decode the next chunk of each stream.

        dense_fsas: ``num_streams`` segments, segment n holding stream n's next ``duration[n]`` frames.
        decode_states: ``num_streams`` states (``None`` or ``DecodeStateInfo()`` for a new stream) from
        earlier calls.  Returns (lattice, new_decode_states): a batch of ``num_streams`` lattices over
        each stream's frames so far (see the module docstring) and a list of the new states.
        """
        if not isinstance(dense_fsas, DenseFsaVec):
            raise TypeError(f"dense_fsas: expected a DenseFsaVec, got {type(dense_fsas).__name__}")
        N = self.num_streams_
        if dense_fsas.dim0() != N:
            raise ValueError(f"dense_fsas: expected {N} segments (num_streams), got {dense_fsas.dim0()}")
        if isinstance(decode_states, DecodeStateInfo) or not isinstance(decode_states, (list, tuple)):
            raise TypeError(f"decode_states: expected a list of {N} DecodeStateInfo or None, "
                            f"got {type(decode_states).__name__}")
        if len(decode_states) != N:
            raise ValueError(f"decode_states: expected {N} entries (num_streams), got {len(decode_states)}")
        if self._max_label >= dense_fsas.num_symbols:
            raise ValueError(f"decoding_graph: labels must be < {dense_fsas.num_symbols} for log_probs with "
                             f"{dense_fsas.num_symbols} symbols, got label {self._max_label}")
        if is_traced(dense_fsas.duration):
            raise ValueError("dense_fsas: the durations must be concrete (decode runs on the host, not under jit)")
        states = [DecodeStateInfo() if s is None else s for s in decode_states]
        for i, s in enumerate(states):
            self._check_state(i, s)
        dur = np.asarray(dense_fsas.duration, np.int64)
        done = np.array([0 if s.states is None else int(s.num_frames) for s in states], np.int64)
        cap = max([bucket(int((done + dur).max())), MIN_CAPACITY]
                  + [s.frame_scores.shape[0] for s in states if s.states is not None])
        states = tuple(_fresh_state(self._cfg, cap) if s.states is None else _grow(s, cap, self._cfg.dtype)
                       for s in states)
        out, new = _online_core(self._cfg, self.allow_partial, self._graph, self._attrs, states, dense_fsas.scores,
                                jnp.asarray(dense_fsas.duration, jnp.int32))
        (src, dst, label, score), attrs, _, ns, na = out
        lat = Fsa(src, dst, label, score, ns, na, attrs, max_states=(cap + 1) * self._cfg.K + 1)
        return lat, list(new)
