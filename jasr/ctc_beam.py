"""CTC prefix beam search on device: jit-compiled, batched, fixed shapes, with optional LM fusion, a lexicon
constraint and hotword boosting.

Every hypothesis is a label sequence (prefix) with two log-probabilities (log semiring, float32): `pb` of the
alignments of the frames so far that collapse to it and end in a blank, `pnb` of those that end in its last token.
Per frame each prefix either stays (blank, or its last token again) or grows by one token (a repeat of its last
token only after a blank); a grown prefix equal to a prefix already in the beam is merged into it (logaddexp), so the
scores are sums over alignments. The `beam` best prefixes by total score survive each frame.

The beam is a set of arrays: last token, length, a 64-bit rolling hash of the prefix and of its parent (prefix minus
last token) for merging, the fused scores and the LM / lexicon / hotword states. The token history is not copied per
frame: each frame records for every beam slot its parent slot and the token it added (-1: none), and the n-best
are traced back at the end. Hypothesis lengths are bounded by the number of frames (L = T).

Blank frames (with token_min_logp: no candidate token, the blank the frame's best) only add the blank to every
prefix; each row's other frames are gathered to the front and scanned, and each run of blank frames is folded into
the beam before the next scanned frame (pb = logaddexp(pb, pnb) + the run's blank log-probs, pnb = -inf: a token
equal to the last one then starts a new one), so peaky logits cost about their non-blank frames. The whole search
(plan, scan, back-trace) is one jitted call; the scan runs as many steps as the batch's row with the most scanned
frames needs (a traced count: no program per batch), and a step where every row has at most half the beam alive
and at most 2 or 4 tried candidates runs a narrower program on those only (exact: the other entries are dead and
the other candidates untried; jasr.ctc_beam_plan and _step_shapes).

Score of a hypothesis (what ranks the beam and the n-best):
    total = acoustic + lm_weight * lm + word_bonus * words + hotword bonus + oov_penalty * (out-of-lexicon words)
with `acoustic` = log of the summed probability of all its alignments, `lm` = the LM log-probability (natural log)
of its tokens (lm_level="token") or words (lm_level="word", needs a lexicon), including the end of sentence, and
`words` = completed words (with a lexicon) or emitted tokens (without one).

LM look-ahead (word LM with a lexicon and a jasr.lexicon.LmLookahead table): a partial word at trie node n also
holds lm_weight * (the best LM score of a word below n, given the LM state), which ranks and prunes the beam; it is
removed when the word completes and its real LM score is added (or at the end), so final scores are those without
look-ahead: only which prefixes survive pruning changes.

LM interface (a pytree, so it is a jit argument): ``start_state() -> state``, ``advance(states, ids) -> (states,
log_probs)`` elementwise over broadcast arrays of int32 states and ids, ``final(states) -> log_probs`` of the end of
sentence. Token-level ids are CTC token ids; word-level ids come from the lexicon (its `unk_id` for other words).
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jasr.ctc_beam_plan import (FoldPlan, chunk_schedule, compaction, first_argmax, fold_plan, frame_counts,
                                 host_fold_plan, pow2, top_rows)
from jasr.lexicon import Hotwords, Lexicon, LmLookahead, hotword_step, lexicon_child, lookahead_score

__all__ = ["BeamSearchResult", "ctc_prefix_beam_search", "nbest_lists", "word_timestamps"]

_NEG = -jnp.inf
_H1, _H2 = np.uint32(1000003), np.uint32(0x5BD1E995)   # odd multipliers of the two hash lanes


class BeamSearchResult(NamedTuple):
    """n-best hypotheses, best first. tokens / token_frames: [B, N, T] int32 (padded with -1; the frame at which each
    token entered the hypothesis); lengths [B, N] int32; scores, acoustic, lm: [B, N] float32 (-inf: no hypothesis);
    words: [B, N] int32 (what word_bonus counted)."""
    tokens: jax.Array
    lengths: jax.Array
    scores: jax.Array
    acoustic: jax.Array
    lm: jax.Array
    words: jax.Array
    token_frames: jax.Array


class _Beam(NamedTuple):
    pb: jax.Array        # [K] log P(alignments ending in blank)
    pnb: jax.Array       # [K] log P(alignments ending in the last token)
    fus: jax.Array       # [K] non-acoustic part of the total score
    lm: jax.Array        # [K] unweighted LM log-prob so far
    words: jax.Array     # [K] int32
    last: jax.Array      # [K] int32, -1 for the empty prefix
    length: jax.Array    # [K] int32
    h: jax.Array         # [K, 2] uint32 hash of the prefix
    ph: jax.Array        # [K, 2] uint32 hash of the parent prefix
    node: jax.Array      # [K] int32 lexicon trie node (0: between words, -1: outside the lexicon)
    ctx: jax.Array       # [K] int32 hotword automaton node
    la: jax.Array        # [K] unweighted LM look-ahead of the partial word, included in fus (0 without look-ahead)
    lm_state: Any        # pytree of [K, ...] arrays


_F32, _I32 = ("pb", "pnb", "fus", "lm", "la"), ("words", "last", "length", "node", "ctx")


def _pack(s: _Beam):
    """The beam [B, K] as four arrays: float32 [5, B, K], int32 [5, B, K], uint32 [4, B, K] (h, ph), lm_state."""
    return (jnp.stack([getattr(s, f) for f in _F32]), jnp.stack([getattr(s, f) for f in _I32]),
            jnp.concatenate([jnp.moveaxis(s.h, -1, 0), jnp.moveaxis(s.ph, -1, 0)]), s.lm_state)


def _unpack(p) -> _Beam:
    f, i, u, lm_state = p
    return _Beam(**{n: f[j] for j, n in enumerate(_F32)}, **{n: i[j] for j, n in enumerate(_I32)},
                 h=jnp.moveaxis(u[:2], 0, -1), ph=jnp.moveaxis(u[2:], 0, -1), lm_state=lm_state)


def _hash(h: jax.Array, tok: jax.Array) -> jax.Array:
    t = (tok.astype(jnp.uint32) + jnp.uint32(1))[..., None]
    return h * jnp.array([_H1, _H2]) + t * jnp.array([1, 0x9E3779B9], jnp.uint32)


def _take(tree, idx):
    return jax.tree.map(lambda a: a[idx], tree)


class _Opts(NamedTuple):
    beam: int
    nbest: int
    blank_id: int
    topk: int
    lm_level: str | None
    constrain: bool
    chunk: int = 0        # > 0: frames with more candidates are searched in chunks of this many (chunk_schedule)
    blank_frames: str = "full"   # "compact" / "fold": blank frames folded (jasr.ctc_beam_plan), "full": searched


class _Weights(NamedTuple):
    lm_weight: jax.Array
    word_bonus: jax.Array
    oov_penalty: jax.Array
    token_min_logp: jax.Array
    beam_prune_logp: jax.Array


def _word_id(lex: Lexicon, node):
    wid = jnp.where(node > 0, lex.word[jnp.maximum(node, 0)], -1)
    return wid, jnp.where(wid >= 0, wid, lex.unk_id)


def _frame(o: _Opts, w: _Weights, lm, lex: Lexicon | None, hot: Hotwords | None, look: LmLookahead | None, s: _Beam,
           lp, c_lp, c_tok, pad, orig=None, first=None, links=None, full=None, completing=None):
    """One frame (or one chunk of a frame's candidates) for one utterance: beam [K_in] -> beam [K] and (parent
    slot [K], added token [K]). K_in < K: s holds the first K_in entries of the beam `full` (the others dead: the
    search keeps the live entries first), which a padding frame returns unchanged. completing: an unbatched bool,
    False where no live entry of the batch completes a word this step (the word LM is then not queried).

    lp: [V] log-probs; c_lp, c_tok: [C] the candidate tokens and their log-probs (-inf: not tried). Chunked
    frames (orig, first, links given): the first chunk updates the beam's prefixes (stays) and grows them by its
    candidates; a later chunk grows the frame-start beam `orig` by its candidates and competes with the entries
    kept so far, which stay as they are; links: the frame's (parent, added) of the current entries."""
    K, K_in = o.beam, s.pb.shape[0]
    full = s if full is None else full
    b = s if first is None else jax.tree.map(lambda x, y: jnp.where(first, x, y), s, orig)   # frame-start beam
    ab = jnp.logaddexp(b.pb, b.pnb)
    alive = ab > _NEG
    lp_last = lp[jnp.maximum(b.last, 0)]
    # stay: blank, or the last token again
    st_pb = ab + lp[o.blank_id]
    st_pnb = jnp.where(b.length > 0, b.pnb + lp_last, _NEG)
    # a beam prefix whose parent is in the beam also grows out of it this frame: merge
    match = (alive[:, None] & alive[None, :] & jnp.all(b.ph[:, None] == b.h[None, :], -1)
             & (b.length[:, None] == b.length[None, :] + 1))                                   # [k', k]
    has_par = match.any(1)
    par = jnp.min(jnp.where(match, jnp.arange(K_in, dtype=jnp.int32), K_in - 1), 1)   # the first match (argmax)
    into = jnp.where(b.last == b.last[par], b.pb[par], ab[par]) + lp_last
    st_pnb = jnp.logaddexp(st_pnb, jnp.where(has_par, into, _NEG))
    if first is not None:   # a later chunk: the entries kept so far were updated by the first chunk
        st_pb, st_pnb = jnp.where(first, st_pb, s.pb), jnp.where(first, st_pnb, s.pnb)
    st_total = jnp.logaddexp(st_pb, st_pnb) + s.fus
    # grow by the candidate tokens of this frame
    C = c_tok.shape[0]
    e_pnb = jnp.where(c_tok[None] == b.last[:, None], b.pb[:, None], ab[:, None]) + c_lp[None]      # [K, C]
    # (k, c) is already in the beam as k' when k' = k + c: drop it (its mass went into k' above)
    eq = (b.last[:, None] == c_tok[None, :]) & has_par[:, None]                                       # [k', C]
    dup = jnp.any((par[None, :, None] == jnp.arange(K_in)[:, None, None]) & eq[None], 1)             # [K_in, C]
    e_ok = alive[:, None] & ~dup & (c_lp[None] > _NEG)
    tok = jnp.broadcast_to(c_tok[None], (K_in, C))
    zero = jnp.zeros((K_in, C), jnp.float32)
    d_lm, d_words, d_fus = zero, jnp.ones((K_in, C), jnp.int32), zero
    node = jnp.broadcast_to(b.node[:, None], (K_in, C))
    la = jnp.broadcast_to(b.la[:, None], (K_in, C))

    def lm_pick(k, j, grown):   # the LM state of the new beam entries
        return jax.tree.map(lambda a, c: jnp.where(grown.reshape((K,) + (1,) * (a.ndim - 1)), a[k], c[k]),
                            b.lm_state, s.lm_state)
    if lex is not None:
        bnd, ws = lex.boundary[c_tok][None], lex.word_start[c_tok][None]                         # [1, C]
        starts = bnd | ws
        completes = starts & (b.node[:, None] != 0)                                                 # [K, C]
        node = jnp.where(bnd, 0, lexicon_child(lex, jnp.where(ws, 0, b.node[:, None]), c_tok[None]))
        wid, lm_wid = _word_id(lex, b.node)
        d_words = completes.astype(jnp.int32)
        in_word = (b.node[:, None] > 0) & (wid[:, None] < 0)     # completing a partial word that is no word
        new_oov = (node < 0) & ((b.node[:, None] >= 0) | starts)
        if o.constrain:
            e_ok &= (node >= 0) & ~(completes & in_word)
        else:
            d_fus += w.oov_penalty * ((completes & in_word).astype(jnp.float32) + new_oov)
        if o.lm_level == "word":
            if completing is None:
                adv_state, adv_lp = lm.advance(b.lm_state, lm_wid)
            else:
                adv_state, adv_lp = jax.lax.cond(completing, lm.advance, lambda st, _: (
                    st, jnp.zeros(jnp.shape(st), jnp.float32)), b.lm_state, lm_wid)
            d_lm = jnp.where(completes, adv_lp[:, None], 0.0)
            if look is not None:   # the new partial word's look-ahead replaces the old one
                la = jnp.where(node == 0, 0.0, lookahead_score(
                    look, jnp.where(completes, adv_state[:, None], b.lm_state[:, None]), node))
                d_fus += w.lm_weight * (la - b.la[:, None])

            def lm_pick(k, j, grown):
                done = grown & completes[k, j]
                return jax.tree.map(
                    lambda a, c, d: jnp.where(done.reshape((K,) + (1,) * (a.ndim - 1)), a[k],
                                              jnp.where(grown.reshape((K,) + (1,) * (a.ndim - 1)), c[k], d[k])),
                    adv_state, b.lm_state, s.lm_state)
    if o.lm_level == "token":
        lm_state = jax.tree.map(lambda a: jnp.broadcast_to(a[:, None], (K_in, C) + a.shape[1:]), b.lm_state)
        lm_state, d_lm = lm.advance(lm_state, tok)

        def lm_pick(k, j, grown):
            return jax.tree.map(lambda a, c: jnp.where(grown.reshape((K,) + (1,) * (a.ndim - 1)), c[k, j], a[k]),
                                s.lm_state, lm_state)
    ctx = jnp.broadcast_to(b.ctx[:, None], (K_in, C))
    if hot is not None:
        ctx, d_hot = hotword_step(hot, ctx, tok)
        d_fus += d_hot
    e_fus = b.fus[:, None] + d_fus + w.lm_weight * d_lm + w.word_bonus * d_words
    e_total = jnp.where(e_ok, e_pnb + e_fus, _NEG)
    # prune: the beam best of stay + grow candidates, none below best + beam_prune_logp
    total = jnp.concatenate([st_total, e_total.reshape(-1)])
    total = jnp.where(total >= total.max() + w.beam_prune_logp, total, _NEG)
    kept, idx = jax.lax.top_k(total, K)
    grown = idx >= K_in
    k = jnp.where(grown, (idx - K_in) // C, idx)
    j = jnp.where(grown, (idx - K_in) % C, 0)
    gtok = c_tok[j]
    new = _Beam(
        pb=jnp.where(grown, _NEG, st_pb[k]), pnb=jnp.where(grown, e_pnb[k, j], st_pnb[k]),
        fus=jnp.where(grown, e_fus[k, j], s.fus[k]),
        lm=jnp.where(grown, b.lm[k] + d_lm[k, j], s.lm[k]) if lm is not None else full.lm,
        words=jnp.where(grown, b.words[k] + d_words[k, j], s.words[k]), last=jnp.where(grown, gtok, s.last[k]),
        length=jnp.where(grown, b.length[k] + 1, s.length[k]),
        h=jnp.where(grown[:, None], _hash(b.h[k], gtok), s.h[k]), ph=jnp.where(grown[:, None], b.h[k], s.ph[k]),
        node=jnp.where(grown, node[k, j], s.node[k]) if lex is not None else full.node,
        ctx=jnp.where(grown, ctx[k, j], s.ctx[k]) if hot is not None else full.ctx,
        la=jnp.where(grown, la[k, j], s.la[k]) if look is not None else full.la,
        lm_state=lm_pick(k, j, grown) if lm is not None else full.lm_state)
    # entries that lost all their probability stay dead
    dead = kept == _NEG
    new = new._replace(pb=jnp.where(dead, _NEG, new.pb), pnb=jnp.where(dead, _NEG, new.pnb))
    keep = pad >= 0.5
    new = jax.tree.map(lambda a, c: jnp.where(keep, a, c), full, new)
    parent = jnp.where(keep, jnp.arange(K, dtype=jnp.int32), k.astype(jnp.int32))
    added = jnp.where(keep | ~grown, -1, gtok).astype(jnp.int32)
    if first is not None:   # links to the frame-start beam: kept entries keep theirs
        spar, sadd = links
        parent = jnp.where(first, parent, jnp.where(keep, spar, jnp.where(grown, k.astype(jnp.int32), spar[k])))
        added = jnp.where(first, added, jnp.where(keep, sadd, jnp.where(grown, gtok, sadd[k]).astype(jnp.int32)))
    return new, (parent, added)


def _fold(s: _Beam, g, has) -> _Beam:
    """Blank frames folded in: where has, every prefix takes the blank on each of them (g: their summed blank
    log-probs), so all its mass ends in a blank (pb = logaddexp(pb, pnb) + g, pnb = -inf). s: [B, K]; g, has: [B]."""
    ab = jnp.logaddexp(s.pb, s.pnb)
    return s._replace(pb=jnp.where(has[:, None], ab + g[:, None], s.pb), pnb=jnp.where(has[:, None], _NEG, s.pnb))


def _finish(o: _Opts, w: _Weights, lm, lex: Lexicon | None, hot: Hotwords | None, look: LmLookahead | None,
            s: _Beam):
    """End of utterance: the open word (its look-ahead out, its LM score in), the LM's end of sentence, unfinished
    hotwords. -> (total, acoustic, lm, words), each [K]."""
    fus, lm_total, words = s.fus, s.lm, s.words
    if look is not None:
        fus = fus - w.lm_weight * s.la
    ok = (s.pb > _NEG) | (s.pnb > _NEG)
    lm_state = s.lm_state
    if lex is not None:
        open_word = s.node != 0
        wid, lm_wid = _word_id(lex, s.node)
        words = words + open_word
        fus = fus + w.word_bonus * open_word
        not_word = (s.node > 0) & (wid < 0)
        if o.constrain:
            ok &= (s.node == 0) | (wid >= 0)
        else:
            fus = fus + w.oov_penalty * not_word
        if o.lm_level == "word":
            adv_state, adv_lp = lm.advance(s.lm_state, lm_wid)
            lm_total = lm_total + jnp.where(open_word, adv_lp, 0.0)
            fus = fus + w.lm_weight * jnp.where(open_word, adv_lp, 0.0)
            lm_state = jax.tree.map(
                lambda a, b: jnp.where(open_word.reshape(open_word.shape + (1,) * (a.ndim - 1)), a, b),
                adv_state, s.lm_state)
    if lm is not None:
        end = lm.final(lm_state)
        lm_total = lm_total + end
        fus = fus + w.lm_weight * end
    if hot is not None:
        fus = fus - hot.score[s.ctx]
    acoustic = jnp.logaddexp(s.pb, s.pnb)
    total = jnp.where(ok, acoustic + fus, _NEG)
    return total, jnp.where(ok, acoustic, _NEG), lm_total, words


def _step_shapes(o: _Opts, V: int) -> list[tuple[int, int]]:
    """(live entries, candidate columns) of the step programs a column may run, cheapest first, the full step
    last: a step where every row has at most k_in live entries and c_in tried candidates runs on those only
    (exact: the rest cannot add anything). Halving the beam needs beam >= 8; narrowing the candidates needs them
    ranked (token_topk < V), so that the tried ones come first."""
    K, C = o.beam, min(o.topk, V)
    ks = [K // 2, K] if K >= 8 else [K]
    cs = [c for c in (2, 4) if c < C] + [C] if o.topk < V else [C]
    return [(k, c) for k in ks for c in cs]


def _candidates(o: _Opts, w: _Weights, lp):
    """The tokens a frame grows prefixes by: lp [..., V] -> (c_lp, c_tok) [..., C] best first (-inf: not tried):
    the topk best non-blank tokens at or above token_min_logp, and the frame's best token whatever its log-prob."""
    V = lp.shape[-1]
    lp_nb = lp.at[..., o.blank_id].set(_NEG)
    if o.topk < V or o.chunk:   # chunks take the candidates best first
        c_lp, c_tok = top_rows(lp_nb, min(o.topk, V))
    else:
        c_lp, c_tok = lp_nb, jnp.broadcast_to(jnp.arange(V, dtype=jnp.int32), lp.shape)
    c_lp = jnp.where((c_lp >= w.token_min_logp) | (c_tok == first_argmax(lp)[..., None]), c_lp, _NEG)
    return c_lp, c_tok.astype(jnp.int32)


@functools.partial(jax.jit, static_argnums=(0,))
def _search(o: _Opts, w: _Weights, lm, lex, hot, look, log_probs, paddings, sched=None, comp=None
            ) -> BeamSearchResult:
    """The whole search on device: plan (blank frames), steps, back-trace. sched, comp: a host plan (chunked
    search); without them the plan is traced here and the scan runs as many steps as the fullest row needs."""
    B, T_out, V = log_probs.shape
    lp = log_probs.astype(jnp.float32)
    paddings = paddings.astype(jnp.float32)
    if o.blank_frames == "full":   # every frame searched
        ts = jnp.broadcast_to(jnp.arange(T_out, dtype=jnp.int32), (B, T_out))
        plan = FoldPlan(ts, paddings, jnp.zeros((B, T_out + 1)), jnp.zeros((B, T_out + 1), bool), jnp.int32(T_out))
    elif comp is not None:
        plan = host_fold_plan(comp, lp[..., o.blank_id])
    else:
        counts = frame_counts(lp, paddings, o.blank_id, w.token_min_logp)
        plan = fold_plan(counts, lp[..., o.blank_id], o.blank_frames == "compact")
    if o.blank_frames == "compact":   # each row's columns gathered to the front
        lp = jnp.take_along_axis(lp, plan.orig_t[..., None], 1)
    T = plan.orig_t.shape[1]
    lp = jnp.moveaxis(lp, 1, 0)                                                             # [T, B, V]
    pads = jnp.moveaxis(plan.cpad, 1, 0)
    gap_t, has_t = jnp.moveaxis(plan.gap[:, :T], 1, 0), jnp.moveaxis(plan.has[:, :T], 1, 0)   # [T, B]
    K, N = o.beam, o.nbest
    first = jnp.arange(K) == 0
    start = lm.start_state() if lm is not None else jnp.zeros((), jnp.int32)
    if look is not None and jnp.ndim(start) != 0:
        raise ValueError("lm_lookahead needs an LM whose states are int32 scalars")
    lm_state = jax.tree.map(lambda a: jnp.broadcast_to(a, (B, K) + jnp.shape(a)), start)
    zi = jnp.zeros((B, K), jnp.int32)
    beam = _Beam(pb=jnp.broadcast_to(jnp.where(first, 0.0, _NEG), (B, K)), pnb=jnp.full((B, K), _NEG),
                 fus=jnp.zeros((B, K)), lm=jnp.zeros((B, K)), words=zi, last=zi - 1, length=zi,
                 h=jnp.zeros((B, K, 2), jnp.uint32), ph=jnp.ones((B, K, 2), jnp.uint32), node=zi, ctx=zi,
                 la=jnp.zeros((B, K)), lm_state=lm_state)
    frame = jax.vmap(functools.partial(_frame, o, w, lm, lex, hot, look))
    if sched is None:   # one step per column, the candidates chosen in the step
        steps = plan.steps

        shapes = _step_shapes(o, V)

        def step(i, carry):   # the beam travels packed (_pack): fewer loop buffers, fewer fused loops per step
            packed, links = carry
            c_lp, c_tok = _candidates(o, w, lp[i])
            s = _unpack(packed)   # read only by reductions here; each branch unpacks its own slice
            alive = jnp.logaddexp(s.pb, s.pnb) > _NEG                                                # [B, K]
            completing = None
            if lex is not None and o.lm_level == "word":   # some live entry in a word and a word-ending candidate
                ends = (lex.boundary[c_tok] | lex.word_start[c_tok]) & (c_lp > _NEG)                      # [B, C]
                completing = (ends.any(1) & ((s.node != 0) & alive).any(1) & (pads[i] < 0.5)).any()

            def branch(k_in, c_in):   # the live entries (first) and the tried candidates (best first) fit
                def run(packed):
                    s = _fold(_unpack(packed), gap_t[i], has_t[i])
                    sub = jax.tree.map(lambda a: a[:, :k_in], s) if k_in < K else s
                    new, (par, add) = jax.vmap(functools.partial(
                        _frame, o, w, lm, lex, hot, look, completing=completing))(
                        sub, lp[i], c_lp[:, :c_in], c_tok[:, :c_in], pads[i], full=s)
                    return _pack(new), jnp.stack([par, add], -1)
                return run
            if len(shapes) == 1:
                packed, link = branch(*shapes[0])(packed)
            else:
                live, tried = alive.sum(1).max(), (c_lp > _NEG).sum(1).max()
                fits = jnp.stack([(live <= k_in) & (tried <= c_in) for k_in, c_in in shapes])
                packed, link = jax.lax.switch(jnp.argmax(fits), [branch(*sh) for sh in shapes], packed)
            return packed, links.at[i].set(link)

        packed, links = jax.lax.fori_loop(0, steps, step, (_pack(beam), jnp.zeros((T, B, K, 2), jnp.int32)))
        beam = _unpack(packed)
        frame_of, last_of = jnp.arange(T), jnp.ones((T,), bool)
    else:   # steps = chunks of columns (chunk_schedule): candidate columns [c * C, (c + 1) * C) of column f
        c_lp, c_tok = _candidates(o, w, lp)                                                 # [T, B, cols]
        frame_of, chunk_of, first_of, last_of, valid = sched
        C, cols = o.chunk, c_lp.shape[-1]
        if cols % C:
            c_lp = jnp.pad(c_lp, ((0, 0), (0, 0), (0, C - cols % C)), constant_values=_NEG)
            c_tok = jnp.pad(c_tok, ((0, 0), (0, 0), (0, C - cols % C)))
        cols = jnp.arange(C)[None, None] + (chunk_of * C)[:, None, None]                      # [S, 1, C]
        xs = (lp[frame_of], jnp.take_along_axis(c_lp[frame_of], cols, -1),
              jnp.take_along_axis(c_tok[frame_of], cols, -1), jnp.where(valid[:, None], pads[frame_of], 1.0),
              jnp.broadcast_to(first_of[:, None], (first_of.shape[0], B)),
              gap_t[frame_of], has_t[frame_of] & first_of[:, None])

        def chunk_step(carry, x):
            s, orig, links = carry
            s = _fold(s, x[5], x[6])
            new, links = frame(s, *x[:4], orig, x[4], links)
            orig = jax.tree.map(lambda a, c: jnp.where(x[4].reshape((B,) + (1,) * (a.ndim - 1)), a, c), s, orig)
            return (new, orig, links), links

        links = (jnp.broadcast_to(jnp.arange(K, dtype=jnp.int32), (B, K)), jnp.full((B, K), -1, jnp.int32))
        (beam, _, _), (parents, added) = jax.lax.scan(chunk_step, (beam, beam, links), xs)   # [S, B, K]
        links, steps = jnp.stack([parents, added], -1), jnp.int32(parents.shape[0])
    beam = _fold(beam, plan.gap[:, T], plan.has[:, T])   # blank frames after a row's last column
    total, acoustic, lm_total, words = jax.vmap(functools.partial(_finish, o, w, lm, lex, hot, look))(beam)
    scores, sel = top_rows(total, N)                                                        # [B, N]
    take = jax.vmap(lambda a, i: a[i])
    lengths = jnp.where(scores > _NEG, take(beam.length, sel), 0)
    S = links.shape[0]

    def back(j, carry):   # the beam slot of every n-best hypothesis at each step, from the last step back
        slot, slots = carry
        i = steps - 1 - j
        slots = slots.at[i].set(slot)
        return jnp.where(last_of[i], take(links[i], slot)[..., 0], slot), slots

    _, slots = jax.lax.fori_loop(0, steps, back, (sel, jnp.zeros((S, B, N), jnp.int32)))     # [S, B, N]
    # the token each step added to the hypothesis (a column's: its last chunk), its frame and its position
    tk = jnp.take_along_axis(links[..., 1], slots, 2)
    tk = jnp.where((last_of & (jnp.arange(S) < steps))[:, None, None], tk, -1)
    got = (tk >= 0).astype(jnp.int32)
    pos = jnp.cumsum(got, 0) - got
    at = jnp.broadcast_to(plan.orig_t[:, frame_of].T[:, :, None], tk.shape)
    out = jnp.stack([tk, at, jnp.where(got > 0, pos, T_out)], -1)                         # [S, B, N, 3]
    bi, ni = jnp.meshgrid(jnp.arange(B), jnp.arange(N), indexing="ij")
    bi, ni = jnp.broadcast_to(bi, (S, B, N)), jnp.broadcast_to(ni, (S, B, N))
    dead = scores == _NEG
    out = jnp.full((B, N, T_out, 2), -1, jnp.int32).at[bi, ni, out[..., 2]].set(out[..., :2], mode="drop")
    out = jnp.where(dead[..., None, None], -1, out)                   # no hypothesis: no tokens
    tokens, token_frames = out[..., 0], out[..., 1]
    return BeamSearchResult(tokens, lengths, scores, take(acoustic, sel), jnp.where(dead, 0.0, take(lm_total, sel)),
                            jnp.where(dead, 0, take(words, sel)), token_frames)


_CHUNK = 8   # candidates per step when a frame has more than this many (auto token_topk)
_STEP_COST = 25   # the cost of a search step beside its candidate columns, in columns (measured on CPU)
_frame_counts = jax.jit(frame_counts, static_argnums=(2,))


def ctc_prefix_beam_search(log_probs, paddings, beam: int = 16, *, nbest: int | None = None, blank_id: int = 0,
                           token_topk: int | None = None, token_min_logp: float | None = None,
                           beam_prune_logp: float | None = None, lm: Any = None, lm_weight: float = 0.0,
                           lm_level: str = "token", word_bonus: float = 0.0, lexicon: Lexicon | None = None,
                           constrain_to_lexicon: bool = False, oov_penalty: float = 0.0,
                           hotwords: Hotwords | None = None, lm_lookahead: LmLookahead | None = None,
                           blank_frames: str = "compact") -> BeamSearchResult:
    """CTC prefix beam search over a batch (see the module docstring for the score).

    Args:
      log_probs: [B, T, V] float log-softmax outputs (log semiring; float32 inside). paddings: [B, T], 1.0 = padded
        frame (leaves the beam unchanged).
      beam: prefixes kept per frame (static). nbest: hypotheses returned (<= beam; default: beam).
      token_topk: grow prefixes by at most this many tokens per frame (static: no device-to-host read; steps
        where no frame has that many candidates try fewer, exact). Default: all tokens, or, with
        token_min_logp and concrete inputs, as many as any frame has at or above it, rounded up to a power of two
        (exact; one small device-to-host read, and one compiled program per power of two); where fewer frames
        have many, those are searched in several steps of 8 candidates each (exact as well: each step grows the
        frame-start beam by its chunk and competes with the entries kept so far).
      token_min_logp: grow only by tokens with log-prob >= this (the frame's best token always).
      beam_prune_logp: drop candidates scoring below the frame's best + this (a negative number).
      lm, lm_weight, lm_level: LM fusion ("token": each emitted token, "word": each completed word, needs
        `lexicon`). word_bonus: per completed word with a lexicon, per emitted token without one.
      lexicon: word trie (jasr.lexicon); constrain_to_lexicon: only prefixes spelling lexicon words survive;
        oov_penalty: added per out-of-lexicon word (when it leaves the lexicon) where not constrained.
      hotwords: context-biasing automaton (jasr.lexicon.make_hotwords).
      lm_lookahead: LM look-ahead of partial words (jasr.lexicon.make_lm_lookahead of the same lexicon and LM);
        needs lm_level="word". Changes pruning only (module docstring).
      blank_frames: with token_min_logp, a blank frame (no candidate token: the blank is its best token and no
        other reaches token_min_logp) only adds the blank to every prefix (pyctcdecode's rule: the alignments that
        repeat the last token there, or grow by a token below token_min_logp, are dropped). "compact" (default,
        also under jit): each row's other frames are gathered to the front on device and scanned (as many steps as
        the fullest row needs), runs of blank frames folded in between (pb = logaddexp(pb, pnb) + their blank
        log-probs, pnb = -inf); "fold": the same rule scanning every frame (same results); "full": blank frames
        searched as any other frame.
    Returns:
      BeamSearchResult, [B, N, ...], best first; tokens padded to T with -1 (all -1 where the score is -inf).
    """
    log_probs = log_probs if isinstance(log_probs, jax.Array) else jnp.asarray(log_probs)
    paddings = paddings if isinstance(paddings, jax.Array) else jnp.asarray(paddings)
    if log_probs.ndim != 3 or not jnp.issubdtype(log_probs.dtype, jnp.floating):
        raise ValueError(f"log_probs must be a float [B, T, V] array, got {log_probs.dtype} {log_probs.shape}")
    if paddings.shape != log_probs.shape[:2]:
        raise ValueError(f"paddings {paddings.shape} must be [B, T] = {log_probs.shape[:2]}")
    V = log_probs.shape[2]
    if not isinstance(beam, (int, np.integer)) or beam < 1:
        raise ValueError(f"beam must be an int >= 1, got {beam!r}")
    nbest = beam if nbest is None else nbest
    if not 1 <= nbest <= beam:
        raise ValueError(f"nbest must be in [1, beam={beam}], got {nbest}")
    if not 0 <= blank_id < V:
        raise ValueError(f"blank_id {blank_id} outside [0, {V})")
    if token_topk is not None and not 1 <= token_topk:
        raise ValueError(f"token_topk must be >= 1, got {token_topk}")
    topk = V if token_topk is None else min(int(token_topk), V - 1)
    if blank_frames not in ("compact", "fold", "full"):
        raise ValueError(f"blank_frames must be 'compact', 'fold' or 'full', got {blank_frames!r}")
    sched, chunk, comp = None, 0, None
    mode = "full" if token_min_logp is None else blank_frames
    concrete = not isinstance(log_probs, jax.core.Tracer) and not isinstance(paddings, jax.core.Tracer)
    if token_topk is None and token_min_logp is not None and concrete:   # auto: the fullest frame sets the width
        counts = np.asarray(_frame_counts(log_probs, paddings, blank_id, np.float32(token_min_logp)))
        whole = min(pow2(counts.max(initial=0)), topk)
        if whole > _CHUNK:   # chunk where fewer, narrower steps cost less (a step ~ _STEP_COST + its columns)
            host_comp, cols = compaction(counts) if mode == "compact" else (None, np.maximum(counts.max(0), 0))
            steps, width = chunk_schedule(cols, _CHUNK)
            if steps[0].shape[0] * (_STEP_COST + _CHUNK) < len(cols) * (_STEP_COST + whole):
                sched, chunk, whole, comp = steps, _CHUNK, min(width, topk), host_comp
        topk = whole
    if lm_level not in ("token", "word"):
        raise ValueError(f"lm_level must be 'token' or 'word', got {lm_level!r}")
    if lm is not None and not all(hasattr(lm, a) for a in ("start_state", "advance", "final")):
        raise ValueError("lm must have start_state(), advance(states, ids) and final(states)")
    if lm is not None and lm_level == "word" and lexicon is None:
        raise ValueError("lm_level='word' needs a lexicon (token prefix -> word id)")
    if constrain_to_lexicon and lexicon is None:
        raise ValueError("constrain_to_lexicon=True needs a lexicon")
    for name, table in (("lexicon", lexicon and lexicon.boundary), ("hotwords", hotwords and hotwords.goto)):
        if table is not None and table.shape[-1] != V:
            raise ValueError(f"{name} is built for {table.shape[-1]} tokens, log_probs has V={V}")
    if (lexicon is not None and not isinstance(lexicon.boundary, jax.core.Tracer)
            and bool(np.asarray(lexicon.boundary)[blank_id] | np.asarray(lexicon.word_start)[blank_id])):
        raise ValueError("lexicon: the blank cannot be a boundary or word-start token")
    if lm_lookahead is not None:
        if lm is None or lm_level != "word" or lexicon is None:
            raise ValueError("lm_lookahead needs a word LM (lm, lm_level='word') and its lexicon")
        if not isinstance(lm_lookahead, LmLookahead) or lm_lookahead.table.shape[-1] != lexicon.word.shape[0] + 1:
            raise ValueError(f"lm_lookahead must be a LmLookahead of this lexicon ({lexicon.word.shape[0]} trie "
                             f"nodes + 1 columns), got {getattr(lm_lookahead, 'table', lm_lookahead)!r:.80}")
    for name, val in (("token_min_logp", token_min_logp), ("beam_prune_logp", beam_prune_logp)):
        if val is not None and val > 0:
            raise ValueError(f"{name} must be <= 0 (a log-probability offset), got {val}")
    o = _Opts(int(beam), int(nbest), int(blank_id), topk, lm_level if lm is not None else None,
              bool(constrain_to_lexicon), chunk, mode)
    f32 = lambda x, d: np.float32(d if x is None else x)  # noqa: E731
    w = _Weights(f32(lm_weight, 0.0), f32(word_bonus, 0.0), f32(oov_penalty, 0.0), f32(token_min_logp, -np.inf),
                 f32(beam_prune_logp, -np.inf))
    return _search(o, w, lm, lexicon, hotwords, lm_lookahead, log_probs, paddings, sched, comp)


def nbest_lists(result: BeamSearchResult) -> list[list[tuple[list[int], float]]]:
    """Host view: per utterance, [(token ids, total score), ...] best first, without empty slots."""
    toks, lens, scores = (np.asarray(a) for a in jax.device_get((result.tokens, result.lengths, result.scores)))
    return [[(toks[b, n, :lens[b, n]].tolist(), float(scores[b, n])) for n in range(toks.shape[1])
             if scores[b, n] > -np.inf] for b in range(toks.shape[0])]


def word_timestamps(tokens: Sequence[int], token_frames: Sequence[int], boundary_ids: Sequence[int] = (),
                    word_start_ids: Sequence[int] = (), frame_shift: float = 0.01, num_frames: int | None = None
                    ) -> list[tuple[list[int], float, float]]:
    """Words of one hypothesis with times: [(token ids, start s, end s)]. A word starts at its first token's frame
    and ends where the next token starts (the last word: one frame after its last token, or at num_frames)."""
    bset, sset = set(int(t) for t in boundary_ids), set(int(t) for t in word_start_ids)
    tokens, frames = [int(t) for t in tokens], [int(f) for f in token_frames][:len(tokens)]
    words, cur = [], None
    for i, (t, f) in enumerate(zip(tokens, frames)):
        if t in bset or t in sset:
            if cur is not None:
                words.append((cur[0], cur[1], f))
            cur = ([t], f) if t in sset else None
        elif cur is None:
            cur = ([t], f)
        else:
            cur[0].append(t)
    if cur is not None:
        words.append((cur[0], cur[1], num_frames if num_frames is not None else frames[-1] + 1))
    return [(w, s * frame_shift, e * frame_shift) for w, s, e in words]
