"""k2/icefall-style graph decoding of CTC log-probs with a `jasr.hlg.DecodingGraph` (HLG / TLG).

The search is fsa_ops' jit-compiled `intersect_dense_pruned` (beams and active-state bounds are arguments) on
log-probs [B, T, V] with paddings [B, T] (1.0 on padded frames, after the valid ones); then, as icefall's
``icefall/decode.py``:

- `one_best`: the lattice's best path (tropical semiring; `frame_shortest_path`, equal to `fsa_ops.shortest_path`
  but a scan over frames on the device);
- `nbest`: `fsa_ops.Nbest.from_lattice` (random paths, explicit PRNG key, scores scaled by `nbest_scale`), one
  path per distinct word sequence (its best path in the lattice, `Nbest.intersect`), sorted by total score;
- `nbest_rescoring`: those paths' words re-scored with a (larger) `jasr.ngram.NgramLM`, for several ``lm_scale``s;
- `whole_lattice_rescoring`: the lattice (as a word acceptor, acoustic scores only) intersected with a bigger G
  (host-side `fsa_ops.intersect`), best path per ``lm_scale``;
- `attention_rescoring`: n-best token sequences scored by a callable (an attention decoder).

Scores are natural-log: ``am_score`` the acoustic (log-prob) part of a path, ``lm_score`` the graph's part (G and
the lexicon's pronunciation scores) or the rescoring LM's, ``total_score`` = am + lm_scale * lm (icefall ranks by
am / lm_scale + lm: the same order for lm_scale > 0). Rescoring methods return a dict keyed as icefall's
(``"lm_scale_0.5"``, ``"ngram_lm_scale_0.5_attention_scale_1.0"``) of one hypothesis per utterance.
Word timestamps: ``word_frames[i] = (first, last)`` output frames of word i: the frame of the arc that carries it
(its first token) and the last non-blank frame before the next word.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fsa_ops import (DenseFsaVec, Fsa, Nbest, Ragged, arc_sort, connect, create_fsa_vec, intersect,
                     intersect_dense_pruned, shortest_path, top_sort)
from jasr.hlg import DecodingGraph, grammar_fsa
from jasr.ngram import NgramLM

__all__ = ["GraphHypothesis", "empty_hypothesis", "get_lattice", "one_best", "nbest", "nbest_rescoring",
           "whole_lattice_rescoring", "attention_rescoring", "lattice_lengths", "compact_lattice",
           "frame_shortest_path", "canonical_tokens"]


@dataclasses.dataclass(frozen=True)
class GraphHypothesis:
    """One decoded path: words.txt ids and strings, the tokens it emits (CTC-collapsed ids), (first, last) frame
    per word, and its scores (see the module docstring); `attention_score` from `attention_rescoring`."""
    word_ids: tuple
    words: tuple
    tokens: tuple
    word_frames: tuple
    am_score: float
    lm_score: float
    total_score: float
    attention_score: Optional[float] = None

    @property
    def text(self) -> str:
        return " ".join(self.words)


def empty_hypothesis() -> GraphHypothesis:
    """No words, scores -inf (no path survived)."""
    return GraphHypothesis((), (), (), (), -math.inf, -math.inf, -math.inf)


def _check_graph(graph) -> DecodingGraph:
    if not isinstance(graph, DecodingGraph):
        raise TypeError(f"graph: expected a jasr.hlg.DecodingGraph (compile_hlg), got {type(graph).__name__}")
    return graph


def lattice_lengths(log_probs, paddings, num_tokens: int) -> np.ndarray:
    """Checks log_probs [B, T, V] / paddings [B, T] against the graph's `num_tokens`; int32 [B] valid frames."""
    shape = tuple(np.shape(log_probs))
    if len(shape) != 3:
        raise ValueError(f"log_probs: expected [B, T, V], got shape {shape}")
    if shape[2] != num_tokens:
        raise ValueError(f"log_probs: vocab size {shape[2]} != the graph's {num_tokens} tokens (tokens.txt without "
                         f"disambiguation symbols, blank 0 included)")
    pads = np.asarray(paddings)
    if pads.shape != shape[:2]:
        raise ValueError(f"paddings: expected shape {shape[:2]} (log_probs' [B, T]), got {pads.shape}")
    pad = pads >= 0.5
    if np.any(pad[:, :-1] & ~pad[:, 1:]):
        raise ValueError("paddings: padded frames (1.0) must come after the valid frames of each utterance")
    lengths = (shape[1] - pad.sum(axis=1)).astype(np.int32)
    if np.any(lengths == 0):
        raise ValueError(f"paddings: utterance {int(np.argmin(lengths))} has no valid frame (decode only utterances "
                         f"with at least one frame)")
    return lengths


def get_lattice(graph: DecodingGraph, log_probs, paddings, *, search_beam: float = 20.0, output_beam: float = 8.0,
                min_active_states: int = 30, max_active_states: int = 10000, lm_scale: float = 1.0) -> Fsa:
    """The pruned lattice (an FsaVec, one per utterance; k2's intersect_dense_pruned, jit-compiled) with the
    graph's attributes and ``frame``. `lm_scale` scales the graph's scores (and ``lm_scores``) for the search."""
    graph = _check_graph(graph)
    lengths = lattice_lengths(log_probs, paddings, graph.num_tokens)
    B = lengths.shape[0]
    segments = np.stack([np.arange(B), np.zeros(B, np.int64), lengths], 1).astype(np.int32)
    dense = DenseFsaVec(jnp.asarray(log_probs, jnp.float32), segments)
    fsa = graph.fsa
    if lm_scale != 1.0:
        if not lm_scale > 0:
            raise ValueError(f"lm_scale: expected > 0, got {lm_scale}")
        fsa = fsa.replace(score=np.asarray(fsa.score) * np.float32(lm_scale),
                          lm_scores=np.asarray(fsa.attrs["lm_scores"]) * np.float32(lm_scale))
    return intersect_dense_pruned(fsa, dense, search_beam=search_beam, output_beam=output_beam,
                                  min_active_states=min_active_states, max_active_states=max_active_states,
                                  frame_idx_name="frame")


# ------------------------------------------------------------------ paths -> hypotheses
def _spellings(lang) -> dict:
    """word id -> its spellings (token id tuples), from the lexicon."""
    out: dict = {}
    for w, toks, _ in lang.entries:
        out.setdefault(lang.words[w], []).append(tuple(lang.tokens[t] for t in toks))
    return out


def _segment(ids, spell, emitted, boundary):
    """Token positions (first, last index into `emitted`) of each word, following the lexicon's spellings with
    word-boundary tokens skipped between words (a depth-first search; None if no segmentation exists)."""
    def go(j, pos):
        if j == len(ids):
            return [] if all(emitted[k] in boundary for k in range(pos, len(emitted))) else None
        while pos < len(emitted) and emitted[pos] in boundary:
            pos += 1
        for sp in spell.get(ids[j], ()):
            if tuple(emitted[pos:pos + len(sp)]) == sp:
                rest = go(j + 1, pos + len(sp))
                if rest is not None:
                    return [(pos, pos + len(sp) - 1)] + rest
        return None
    return go(0, 0)


def _hypothesis(lang, spell, words_per_arc, label, token, frame, am, lm, lm_scale=1.0) -> GraphHypothesis:
    """A hypothesis from one path's arcs in order: words (lists), frame labels (-1 on the final arc, 0 blank),
    emitted tokens (0: none), frames (-1: no frame), acoustic and LM scores. Word frames come from the emitted
    tokens' frames, split into words by the lexicon's spellings (words may sit on later arcs than their tokens)."""
    ids = [int(w) for ws in words_per_arc for w in ws if w > 0]
    emitted, first, last = [], [], []
    for i in range(len(label)):
        if token[i] > 0:
            emitted.append(int(token[i]))
            first.append(int(frame[i]))
            last.append(int(frame[i]))
        elif label[i] > 0 and emitted and frame[i] >= 0:
            last[-1] = max(last[-1], int(frame[i]))        # a repeat of the last token (no blank between)
    seg = _segment(ids, spell, emitted, set(lang.boundary_ids))
    spans = tuple((first[a], last[b]) for a, b in seg) if seg is not None else tuple((-1, -1) for _ in ids)
    am_s, lm_s = float(np.sum(am, dtype=np.float64)), float(np.sum(lm, dtype=np.float64))
    return GraphHypothesis(tuple(ids), tuple(lang.words[w] for w in ids), tuple(emitted), spans, am_s, lm_s,
                           am_s + lm_scale * lm_s)


def _hyps_from_paths(paths: Fsa, lang, lm_scale: float = 1.0) -> List[GraphHypothesis]:
    """Linear paths from an HLG lattice (arcs in path order, attributes aux_labels / tokens / frame / lm_scores,
    the latter scaled by `lm_scale` in the search: reported unscaled)."""
    na, ns = np.asarray(paths.num_arcs), np.asarray(paths.num_states)
    W = max(int(na.max(initial=0)), 1)           # (a path batch is as wide as its lattice's states: trim first)
    cut = lambda x, dt=None: np.asarray(x[:, :W], dt)    # noqa: E731
    label, score = cut(paths.label), cut(jax.lax.stop_gradient(paths.score), np.float64)
    aux = paths.attrs["aux_labels"]
    rows = Ragged(cut(aux.values), cut(aux.lengths)).tolist()
    tok, frame = cut(paths.attrs["tokens"]), cut(paths.attrs["frame"])
    lm = cut(paths.attrs["lm_scores"], np.float64)
    out, spell = [], _spellings(lang)
    for b in range(label.shape[0]):
        n = int(na[b])
        if ns[b] == 0:
            out.append(empty_hypothesis())
            continue
        fr = np.where(label[b, :n] >= 0, frame[b, :n], -1)
        out.append(_hypothesis(lang, spell, rows[b][:n], label[b, :n], tok[b, :n], fr, score[b, :n] - lm[b, :n],
                               lm[b, :n] / lm_scale, lm_scale))
    return out


@functools.partial(jax.jit, static_argnums=(0, 1))
def _frame_viterbi(K: int, Ko: int, score, dst, dur):
    """Tropical best path of pruned lattices in `intersect_dense_pruned`'s layout (arc ``(t * K + k) * Ko + j``
    leaves slot k of frame t; non-final arcs enter slot ``dst - (t + 1) * K`` of frame t + 1; the arcs of frame
    ``dur`` enter the final state): a scan over frames, [B, K * Ko] per step, then a backtrace.
    score / dst [B, (T+1) * K * Ko], dur [B] -> (arc index per frame [B, T+1] (-1 off the path), total [B])."""
    B, A = score.shape
    Tp1, P = A // (K * Ko), K * Ko
    sc = jnp.moveaxis(score.reshape(B, Tp1, P), 1, 0).astype(jnp.float32)
    ds = jnp.moveaxis(dst.reshape(B, Tp1, P), 1, 0)
    pos = jnp.arange(P, dtype=jnp.int32)
    rows = jnp.arange(B, dtype=jnp.int32)[:, None]
    ninf = jnp.float32(-jnp.inf)

    def step(alpha, xs):
        t, s, d = xs
        cand = alpha[:, pos // Ko] + s                                           # [B, P]
        slot = d - (t + 1) * K
        live = jnp.isfinite(cand) & (t < dur)[:, None] & (slot >= 0) & (slot < K)
        seg = jnp.where(live, rows * K + slot, B * K).reshape(-1)              # B * K: a discard bin
        new = jax.ops.segment_max(jnp.where(live, cand, ninf).reshape(-1), seg, num_segments=B * K + 1)
        hit = live.reshape(-1) & (cand.reshape(-1) == new[seg])
        first = jax.ops.segment_min(jnp.where(hit, jnp.tile(pos, B), P), seg, num_segments=B * K + 1)
        fin = jnp.where(jnp.isfinite(cand) & (t == dur)[:, None], cand, ninf)
        return new[:B * K].reshape(B, K), (first[:B * K].reshape(B, K), jnp.max(fin, 1), jnp.argmax(fin, 1))

    alpha0 = jnp.full((B, K), ninf).at[:, 0].set(0.0)
    t_all = jnp.arange(Tp1, dtype=jnp.int32)
    _, (bp, fbest, farg) = lax.scan(step, alpha0, (t_all, sc, ds))
    b_idx = jnp.arange(B)
    tot = fbest[jnp.clip(dur, 0, Tp1 - 1), b_idx]
    last = farg[jnp.clip(dur, 0, Tp1 - 1), b_idx].astype(jnp.int32)
    bp_prev = jnp.concatenate([jnp.zeros_like(bp[:1]), bp[:-1]], 0)             # entering position, frame t - 1

    def back(p, xs):
        t, bpt = xs
        p = jnp.where(t == dur, last, p)
        on = (t <= dur) & jnp.isfinite(tot)
        arc = jnp.where(on, t * P + p, -1)
        prev = jnp.take_along_axis(bpt, jnp.clip(p // Ko, 0, K - 1)[:, None], 1)[:, 0]
        return jnp.where(on, prev, 0), arc

    _, arcs = lax.scan(back, jnp.zeros(B, jnp.int32), (t_all, bp_prev), reverse=True)
    return arcs.T, tot


def frame_shortest_path(lattice: Fsa, num_frames: int) -> Fsa:
    """`fsa_ops.shortest_path` for the lattices of `get_lattice` (`num_frames` = log_probs' T), computed frame by
    frame on the device (T + 1 scan steps instead of one per lattice state): linear FsaVec [B, T + 1] with the
    lattice's attributes; an empty FSA where no path survives. Ties may pick another path than shortest_path."""
    Tp1 = int(num_frames) + 1
    A = int(lattice.label.shape[1])
    K = (int(lattice.max_states) - 1) // Tp1
    Ko = A // (Tp1 * K) if K else 0
    if K < 1 or Tp1 * K + 1 != int(lattice.max_states) or Tp1 * K * Ko != A:
        raise ValueError(f"lattice: not in intersect_dense_pruned's layout for {num_frames} frames "
                         f"({A} arcs, max_states {lattice.max_states})")
    na = jnp.asarray(lattice.num_arcs)
    dur = jnp.where(jnp.asarray(lattice.num_states) > 0, na // (K * Ko) - 1, -1).astype(jnp.int32)
    idx, tot = _frame_viterbi(K, Ko, jnp.asarray(lattice.score), jnp.asarray(lattice.dst), dur)
    on = idx >= 0
    ok = jnp.isfinite(tot)
    i0 = jnp.maximum(idx, 0)

    def take(x):
        x = jnp.asarray(x)
        g = jnp.take_along_axis(x, i0.reshape(i0.shape + (1,) * (x.ndim - 2)), 1)
        return jnp.where(on.reshape(on.shape + (1,) * (x.ndim - 2)), g, jnp.zeros((), x.dtype))
    attrs = {k: jax.tree_util.tree_map(take, v) for k, v in lattice.attrs.items()}
    pos = jnp.arange(Tp1, dtype=jnp.int32)[None]
    n = jnp.where(ok, dur + 1, 0).astype(jnp.int32)
    return Fsa(jnp.where(on, pos, 0), jnp.where(on, pos + 1, 0), take(lattice.label),
               jnp.where(on, take(lattice.score), -jnp.inf), jnp.where(ok, n + 1, 0).astype(jnp.int32), n, attrs,
               max_states=Tp1 + 1)


def one_best(graph: DecodingGraph, log_probs, paddings, *, search_beam: float = 20.0, output_beam: float = 8.0,
             min_active_states: int = 30, max_active_states: int = 10000,
             lm_scale: float = 1.0) -> List[GraphHypothesis]:
    """icefall's one_best_decoding: the best path of each utterance's lattice (an empty hypothesis, scores -inf,
    where no path survives). log_probs [B, T, V] (V = graph.num_tokens), paddings [B, T]."""
    lat = get_lattice(graph, log_probs, paddings, search_beam=search_beam, output_beam=output_beam,
                      min_active_states=min_active_states, max_active_states=max_active_states, lm_scale=lm_scale)
    return _hyps_from_paths(frame_shortest_path(lat, np.shape(log_probs)[1]), graph.lang, lm_scale)


# ------------------------------------------------------------------ n-best
def compact_lattice(lattice: Fsa) -> Fsa:
    """The lattice with its pruned (-inf) and padding arcs dropped, connected (still top-sorted): an FsaVec.
    Only the scores travel to the host whole; the kept arcs are gathered on the device first."""
    score = np.asarray(jax.lax.stop_gradient(lattice.score))
    B, A = score.shape
    na, ns = np.asarray(lattice.num_arcs), np.asarray(lattice.num_states)
    keep = np.isfinite(score) & (np.arange(A)[None] < na[:, None]) & (ns[:, None] > 0)
    flat = np.flatnonzero(keep)
    counts = keep.sum(1)
    splits = np.concatenate([[0], np.cumsum(counts)])
    idx = jnp.asarray(flat, jnp.int32)

    def pick(x):
        x = jnp.asarray(x)
        return np.asarray(x.reshape((B * A,) + x.shape[2:])[idx])
    src, dst, label = pick(lattice.src), pick(lattice.dst), pick(lattice.label)
    attrs = {k: (Ragged(pick(v.values), pick(v.lengths)) if isinstance(v, Ragged) else pick(v))
             for k, v in lattice.attrs.items()}
    out = []
    for b in range(B):
        sl = slice(int(splits[b]), int(splits[b + 1]))
        f = Fsa.from_arcs(src[sl], dst[sl], label[sl], score.reshape(-1)[flat[sl]],
                          num_states=int(ns[b]) if counts[b] else 0, sort=False,
                          attrs={k: (Ragged(v.values[sl], v.lengths[sl]) if isinstance(v, Ragged) else v[sl])
                                 for k, v in attrs.items()})
        out.append(connect(f))
    return create_fsa_vec(out)


def _nbest_paths(graph, log_probs, paddings, key, num_paths, nbest_scale, search):
    if key is None:
        raise ValueError("key: n-best sampling needs an explicit PRNG key (jax.random.PRNGKey(...))")
    if int(num_paths) < 1:
        raise ValueError(f"num_paths: expected >= 1, got {num_paths}")
    lat = compact_lattice(get_lattice(graph, log_probs, paddings, **search))
    nb = Nbest.from_lattice(lat, num_paths=int(num_paths), key=key, use_double_scores=False,
                            nbest_scale=float(nbest_scale))
    return lat, nb.intersect(lat, use_double_scores=False)


def _by_utt(nb: Nbest) -> List[List[int]]:
    rs = nb.shape.row_splits(1)
    return [list(range(rs[u], rs[u + 1])) for u in range(nb.shape.dim0)]


def nbest(graph: DecodingGraph, log_probs, paddings, key, *, num_paths: int = 100, nbest_scale: float = 0.5,
          search_beam: float = 20.0, output_beam: float = 8.0, min_active_states: int = 30,
          max_active_states: int = 10000, lm_scale: float = 1.0) -> List[List[GraphHypothesis]]:
    """n-best lists: `num_paths` paths sampled per lattice (`key`: a PRNG key), one per distinct word sequence
    (its best lattice path), sorted by total score (best first; icefall's nbest_decoding keeps the first).
    `lm_scale` scales the graph's scores in the search (as `one_best`'s)."""
    search = dict(search_beam=search_beam, output_beam=output_beam, min_active_states=min_active_states,
                  max_active_states=max_active_states, lm_scale=lm_scale)
    _, nb = _nbest_paths(graph, log_probs, paddings, key, num_paths, nbest_scale, search)
    hyps = _hyps_from_paths(nb.fsa, graph.lang, lm_scale)
    out = []
    for idx in _by_utt(nb):
        hs = [hyps[i] for i in idx if hyps[i].total_score > -math.inf]
        out.append(sorted(hs, key=lambda h: -h.total_score))
    return out


def _scales(scales, name) -> list:
    scales = [float(s) for s in (scales if isinstance(scales, (list, tuple)) else [scales])]
    if not scales or any(not s > 0 for s in scales):
        raise ValueError(f"{name}: expected one or more values > 0, got {scales}")
    return scales


def _best(hyps: Sequence[GraphHypothesis]) -> GraphHypothesis:
    return max(hyps, key=lambda h: h.total_score) if hyps else empty_hypothesis()


def _ranked(hyps: Sequence[GraphHypothesis]) -> List[GraphHypothesis]:
    return sorted(hyps, key=lambda h: -h.total_score)


def nbest_rescoring(graph: DecodingGraph, log_probs, paddings, lm: NgramLM, key, *,
                    lm_scales: Sequence[float] = (0.1, 0.3, 0.5, 0.7, 0.9, 1.0, 1.3, 1.5, 2.0),
                    num_paths: int = 100, nbest_scale: float = 0.5, search_beam: float = 20.0,
                    output_beam: float = 8.0, min_active_states: int = 30,
                    max_active_states: int = 10000, lm_scale: float = 1.0, keep_all: bool = False) -> dict:
    """icefall's rescore_with_n_best_list with an NgramLM: each n-best path's words (words.txt strings; words
    outside the LM score as its <unk>) get ``lm.score_sentence`` (with <s> / </s>), which replaces the graph's
    score; returns {"lm_scale_S": [best hypothesis per utterance]} ranked by am + S * lm (`keep_all`: every
    n-best hypothesis per utterance, best first). `lm_scale` scales the graph in the search that makes the
    lattice (as `one_best`'s)."""
    if not isinstance(lm, NgramLM):
        raise TypeError(f"lm: expected a jasr.ngram.NgramLM, got {type(lm).__name__}")
    scales = _scales(lm_scales, "lm_scales")
    search = dict(search_beam=search_beam, output_beam=output_beam, min_active_states=min_active_states,
                  max_active_states=max_active_states, lm_scale=lm_scale)
    _, nb = _nbest_paths(graph, log_probs, paddings, key, num_paths, nbest_scale, search)
    hyps = _hyps_from_paths(nb.fsa, graph.lang, lm_scale)
    lm_scores = [lm.score_sentence(list(h.words)) if h.am_score > -math.inf else -math.inf for h in hyps]
    out = {}
    for s in scales:
        res = []
        for idx in _by_utt(nb):
            cand = [dataclasses.replace(hyps[i], lm_score=lm_scores[i], total_score=hyps[i].am_score
                                        + s * lm_scores[i]) for i in idx if hyps[i].am_score > -math.inf]
            res.append(_ranked(cand) if keep_all else _best(cand))
        out[f"lm_scale_{s}"] = res
    return out


# ------------------------------------------------------------------ whole-lattice rescoring
def _word_acceptor(lat: Fsa) -> Fsa:
    """One compact lattice as an acceptor on words: label = its word (0: none; arcs with several words become
    chains), score = acoustic score; attributes ``am`` (float), ``frame1`` = frame + 1, ``flab1`` = frame label + 1
    and ``tok`` (the emitted token), 0 on added chain arcs."""
    n = len(lat.label)
    rows = lat.attrs["aux_labels"].tolist()
    am = (np.asarray(lat.score, np.float64) - np.asarray(lat.attrs["lm_scores"], np.float64)).astype(np.float32)
    ns = int(lat.num_states)
    final = ns - 1
    src, dst, lab, sc, fr, fl, tk = [], [], [], [], [], [], []
    extra = ns
    for i in range(n):
        ws = [w for w in rows[i] if w > 0]
        seq = ws + [-1] if lat.label[i] == -1 else (ws or [0])
        cur = int(lat.src[i])
        for j, w in enumerate(seq):
            last = j + 1 == len(seq)
            nxt = int(lat.dst[i]) if last else extra
            extra += 0 if last else 1
            src.append(cur), dst.append(nxt), lab.append(w), sc.append(am[i] if j == 0 else 0.0)
            fr.append(int(lat.attrs["frame"][i]) + 1 if j == 0 else 0)
            fl.append(int(lat.label[i]) + 1 if j == 0 else 0)
            tk.append(int(lat.attrs["tokens"][i]) if j == 0 else 0)
            cur = nxt
    # the final state must stay last: chain states (ns, ns + 1, ...) move before it
    src, dst = np.array(src, np.int64), np.array(dst, np.int64)
    k = extra - ns

    def renum(x):
        return np.where(x < final, x, np.where(x == final, final + k, x - 1))
    attrs = {"am": np.array(sc, np.float32), "frame1": np.array(fr, np.int32), "flab1": np.array(fl, np.int32),
             "tok": np.array(tk, np.int32)}
    return Fsa.from_arcs(renum(src), renum(dst), np.array(lab, np.int32), np.array(sc, np.float32),
                         num_states=ns + k, attrs=attrs)


def _rescoring_grammar(graph: DecodingGraph, lm) -> Fsa:
    """The rescoring G on words.txt ids with epsilon (0) backoff arcs and ``lm_scores`` = its scores."""
    if isinstance(lm, DecodingGraph):
        raise TypeError("lm: expected an NgramLM or a G Fsa, got a DecodingGraph")
    G = grammar_fsa(graph.lang, lm)
    lab = np.asarray(G.label).copy()
    lab[lab == graph.lang.first_word_disambig_id] = 0
    G = G.replace(label=lab)
    return arc_sort(G.replace(lm_scores=np.asarray(G.score, np.float32).copy()))


def whole_lattice_rescoring(graph: DecodingGraph, log_probs, paddings, lm, *,
                            lm_scales: Sequence[float] = (0.1, 0.3, 0.5, 0.7, 0.9, 1.0, 1.3, 1.5, 2.0),
                            search_beam: float = 20.0, output_beam: float = 8.0, min_active_states: int = 30,
                            max_active_states: int = 10000, lm_scale: float = 1.0) -> dict:
    """icefall's rescore_with_whole_lattice: each lattice's acoustic scores (graph scores removed) intersected with
    the G of `lm` (an NgramLM, or anything `jasr.hlg.grammar_fsa` takes, e.g. an Fsa) on the host, the best path per
    lm_scale by am + lm_scale * lm. Returns {"lm_scale_S": [hypothesis per utterance]}; an utterance whose
    lattice has no word sequence G accepts gets an empty hypothesis (scores -inf). `lm_scale` scales the graph
    in the search that makes the lattice (as `one_best`'s)."""
    graph = _check_graph(graph)
    scales = _scales(lm_scales, "lm_scales")
    G = _rescoring_grammar(graph, lm)
    lat = compact_lattice(get_lattice(graph, log_probs, paddings, search_beam=search_beam, output_beam=output_beam,
                                      min_active_states=min_active_states, max_active_states=max_active_states,
                                      lm_scale=lm_scale))
    res = []
    for b in range(len(lat)):
        one = lat[b]
        if int(one.num_states) == 0:
            res.append(None)
            continue
        r = top_sort(connect(intersect(arc_sort(_word_acceptor(one)), G, treat_epsilons_specially=True)))
        res.append(r if int(r.num_states) > 0 else None)
    out = {}
    for s in scales:
        live = [r.replace(score=(r.attrs["am"] + np.float32(s) * r.attrs["lm_scores"]).astype(np.float32))
                for r in res if r is not None]
        found = iter(_rescored_hyps(graph.lang, shortest_path(create_fsa_vec(live), use_double_scores=False), s)
                     if live else [])
        out[f"lm_scale_{s}"] = [empty_hypothesis() if r is None else next(found) for r in res]
    return out


def _rescored_hyps(lang, best: Fsa, scale: float) -> List[GraphHypothesis]:
    """Hypotheses from the best paths of rescored word lattices (`_word_acceptor` attributes plus lm_scores)."""
    ns, na = np.asarray(best.num_states), np.asarray(best.num_arcs)
    W = max(int(na.max(initial=0)), 1)
    label = np.asarray(best.label)[:, :W]
    at = {k: np.asarray(best.attrs[k])[:, :W] for k in ("flab1", "frame1", "tok", "am", "lm_scores")}
    spell, out = _spellings(lang), []
    for j in range(label.shape[0]):
        if ns[j] == 0:
            out.append(empty_hypothesis())
            continue
        n = int(na[j])
        flab = at["flab1"][j, :n] - 1
        frame = np.where(flab >= 0, at["frame1"][j, :n] - 1, -1)
        words = [[int(w)] if w > 0 else [] for w in label[j, :n]]
        out.append(_hypothesis(lang, spell, words, np.where(frame >= 0, flab, -1), at["tok"][j, :n], frame,
                               at["am"][j, :n].astype(np.float64), at["lm_scores"][j, :n].astype(np.float64), scale))
    return out


# ------------------------------------------------------------------ attention-decoder rescoring
def canonical_tokens(tokens: Sequence[int], boundary) -> List[int]:
    """`tokens` with each run of word-boundary tokens (ids in `boundary`) made one and those at both ends dropped."""
    out: List[int] = []
    for t in tokens:
        if t in boundary and (not out or out[-1] in boundary):
            continue
        out.append(int(t))
    while out and out[-1] in boundary:
        out.pop()
    return out


def attention_rescoring(graph: DecodingGraph, log_probs, paddings, score_fn: Callable, key, *,
                        num_paths: int = 100, nbest_scale: float = 0.5,
                        ngram_lm_scales: Sequence[float] = (0.01, 0.05, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0, 1.5, 2.0),
                        attention_scales: Sequence[float] = (0.01, 0.05, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0, 1.5, 2.0),
                        search_beam: float = 20.0, output_beam: float = 8.0, min_active_states: int = 30,
                        max_active_states: int = 10000,
                        token_seq_fn: Optional[Callable[[GraphHypothesis], Sequence[int]]] = None,
                        lm_scale: float = 1.0, keep_all: bool = False) -> dict:
    """icefall's rescore_with_attention_decoder: n-best paths (as `nbest`), each path's token sequence scored by
    ``score_fn(token_seqs: list[list[int]], utt: int32 [N]) -> [N]`` log-probs (e.g. an AED decoder on utterance
    utt's encoder output); the best per (a, b) by am + a * graph lm + b * attention. Returns
    {"ngram_lm_scale_A_attention_scale_B": [hypothesis per utterance]}. The token sequence of a hypothesis is
    ``token_seq_fn(hyp)`` (e.g. ``lambda h: tokenizer.encode(h.text)``), by default its emitted tokens with runs of
    word-boundary tokens made one and those at both ends dropped (a character model's transcript spelling).
    `lm_scale` scales the graph in the search that makes the lattice; `keep_all`: every n-best hypothesis per
    utterance, best first."""
    if not callable(score_fn):
        raise TypeError(f"score_fn: expected a callable (token_seqs, utt) -> scores, got {type(score_fn).__name__}")
    lm_s, att_s = _scales(ngram_lm_scales, "ngram_lm_scales"), _scales(attention_scales, "attention_scales")
    search = dict(search_beam=search_beam, output_beam=output_beam, min_active_states=min_active_states,
                  max_active_states=max_active_states, lm_scale=lm_scale)
    _, nb = _nbest_paths(graph, log_probs, paddings, key, num_paths, nbest_scale, search)
    hyps = _hyps_from_paths(nb.fsa, graph.lang, lm_scale)
    utt = nb.shape.row_ids(1)
    bound = set(graph.lang.boundary_ids)
    seq_of = token_seq_fn or (lambda h: canonical_tokens(h.tokens, bound))
    att = np.asarray(score_fn([list(seq_of(h)) for h in hyps], utt), np.float64).reshape(-1) if hyps else \
        np.zeros(0)
    if att.shape != (len(hyps),):
        raise ValueError(f"score_fn: returned {att.shape[0]} scores for {len(hyps)} token sequences")
    out = {}
    groups = _by_utt(nb)
    for a in lm_s:
        for b in att_s:
            res = []
            for idx in groups:
                cand = [dataclasses.replace(hyps[i], attention_score=float(att[i]),
                                            total_score=hyps[i].am_score + a * hyps[i].lm_score + b * float(att[i]))
                        for i in idx if hyps[i].am_score > -math.inf]
                res.append(_ranked(cand) if keep_all else _best(cand))
            out[f"ngram_lm_scale_{a}_attention_scale_{b}"] = res
    return out
