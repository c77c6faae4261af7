"""Beam search for attention encoder-decoder models (:class:`models.aed.AEDModel`) with length normalisation and
joint CTC/attention prefix scoring (ESPnet's ``CTCPrefixScore``, written here in JAX), jit-able with fixed shapes.

The model is used only through ``model.apply(..., method="encode" | "init_state" | "step")``: the decoder's own
incremental state is reused (the Transformer decoder's self-attention KV cache, the LSTM's recurrent state), reordered
along the batch axis when beams are re-ranked; nothing is recomputed from the prefix.

Search (ESPnet's ``BeamSearch`` with a fixed-size running set):
- ``K`` running hypotheses per utterance; each step scores every running hypothesis' extensions (all tokens, or the
  ``ctc_candidates`` best by attention when CTC scoring is on, ESPnet's pre-beam) and keeps the ``K`` best by
  the weighted score ``(1 - ctc_weight) * attention + ctc_weight * CTC prefix score`` (plus ``length_bonus`` per
  token); a kept extension by eos is moved to the finished pool (``K`` best by normalised score), so the running set
  shrinks, and with ``K = 1`` the search is greedy search;
- after ``max_len`` tokens only eos may follow (so every hypothesis ends with eos and its probability);
- a finished hypothesis of ``n`` tokens (eos excluded) is ranked by ``score / lp(n + 1)``, ``lp(m) = m ** alpha``
  ("plain") or GNMT's ``((5 + m) / 6) ** alpha``; ``alpha = 0`` ranks by the score itself;
- the search stops when no hypothesis runs, after the forced eos, or when no running hypothesis can beat the worst of
  a full finished pool (exact: scores never rise without a length bonus, and ``lp`` grows with the length).

CTC prefix scores (Watanabe et al. 2017, ESPnet / icefall ``CTCPrefixScore``): for a prefix ``g`` the forward
variables ``r_n[t]``, ``r_b[t]`` (``g`` ends at frame ``t`` in a non-blank / blank); the score of ``h = g + c`` is
``log sum_t phi[t - 1] * p_t(c)`` with ``phi = r_n + r_b`` (``r_b`` only when ``c`` repeats ``g``'s last token);
the score of ``g + eos`` is the full-sequence CTC probability ``r_n[T] + r_b[T]``. Padded frames act as frames
of certain blank, so one padded length serves a batch. Blank is never a hypothesis token when CTC scoring is on.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from models.transformer import paddings_from_lengths

NEG = -jnp.inf


def length_norm(lengths, alpha: float, kind: str = "plain"):
    """``lp(m)`` for ``lengths`` (tokens incl. eos): ``m ** alpha`` or GNMT's ``((5 + m) / 6) ** alpha``."""
    m = jnp.asarray(lengths, jnp.float32)
    if kind == "plain":
        return m ** alpha
    if kind == "gnmt":
        return ((5.0 + m) / 6.0) ** alpha
    raise ValueError(f"length_norm must be 'plain' or 'gnmt', got {kind!r}")


def ctc_log_probs(ctc_logits, enc_paddings, blank_id: int):
    """``[B, T, V]`` log-softmax in float32; padded frames become certain blanks (log 1 for blank, -inf else)."""
    x = jax.nn.log_softmax(ctc_logits.astype(jnp.float32), axis=-1)
    pad_row = jnp.where(jnp.arange(x.shape[-1]) == blank_id, 0.0, NEG)
    return jnp.where(enc_paddings[..., None] > 0.5, pad_row, x)


def ctc_prefix_init(x, blank_id: int):
    """Forward variables of the empty prefix: ``r [B, T, 2]`` (non-blank -inf, blank cumulative)."""
    rb = jnp.cumsum(x[:, :, blank_id], axis=1)
    return jnp.stack([jnp.full_like(rb, NEG), rb], axis=-1)


def ctc_prefix_extend(x, r, last, cand, blank_id: int, eos_id: int):
    """Score the extensions ``g + c`` of prefixes ``g``.

    ``x [B, T, V]`` CTC log-probs (:func:`ctc_log_probs`); ``r [B, K, T, 2]`` the prefixes' forward variables;
    ``last [B, K]`` their last token (-1 when empty); ``cand [B, K, C]`` candidate tokens. Returns ``psi [B, K, C]``
    (prefix log-probability of ``g + c``, the full-sequence log-probability for ``c = eos``) and ``r_new
    [B, K, C, T, 2]``."""
    xc = jnp.take_along_axis(x[:, None], cand.reshape(cand.shape[:2] + (-1,))[:, :, None, :], axis=3)
    xc = jnp.moveaxis(xc, 2, 3)                                          # [B, K, C, T]
    rn, rb = r[..., 0], r[..., 1]                                        # [B, K, T]
    rsum = jnp.logaddexp(rn, rb)
    phi = jnp.where((cand == last[..., None])[..., None], rb[:, :, None, :], rsum[:, :, None, :])  # [B, K, C, T]
    empty = (last < 0)[..., None]
    start_n = jnp.where(empty, xc[..., 0], NEG)                          # [B, K, C]
    xb = x[:, :, blank_id]                                               # [B, T]

    def body(carry, inp):
        rn_prev, rb_prev = carry
        phi_prev, xc_t, xb_t = inp
        rn_t = jnp.logaddexp(rn_prev, phi_prev) + xc_t
        rb_t = jnp.logaddexp(rn_prev, rb_prev) + xb_t[:, None, None]
        return (rn_t, rb_t), (rn_t, rb_t)

    t_first = (jnp.moveaxis(phi, 3, 0)[:-1], jnp.moveaxis(xc, 3, 0)[1:], jnp.moveaxis(xb, 1, 0)[1:])
    init = (start_n, jnp.full_like(start_n, NEG))
    _, (rn_all, rb_all) = jax.lax.scan(body, init, t_first)
    rn_new = jnp.concatenate([start_n[None], rn_all], 0)
    rb_new = jnp.concatenate([init[1][None], rb_all], 0)
    r_new = jnp.moveaxis(jnp.stack([rn_new, rb_new], -1), 0, 3)          # [B, K, C, T, 2]
    psi = jnp.logaddexp(start_n, jax.nn.logsumexp(phi[..., :-1] + xc[..., 1:], axis=-1))
    psi = jnp.where(cand == eos_id, rsum[..., -1][..., None], psi)
    return psi, r_new


def beam_search(model, variables, features, feature_paddings, max_len: int, beam_size: int, *,
                length_penalty: float = 0.0, length_norm_kind: str = "plain", ctc_weight: float = 0.0,
                ctc_candidates: int = 0, length_bonus: float = 0.0):
    """Batched beam search (see the module docstring). ``features [B, T, F]``, ``feature_paddings [B, T]``;
    ``max_len`` (static) the most tokens before eos, e.g. from the encoder frames; ``ctc_weight`` in [0, 1] needs
    the model's CTC head; ``ctc_candidates`` (0: every token) the tokens per hypothesis scored by CTC.

    Returns a dict: ``tokens [B, K, max_len]`` (best first; eos excluded, padded positions hold eos),
    ``token_paddings [B, K, max_len]``, ``scores [B, K]`` (normalised, -inf for an empty slot), ``raw_scores
    [B, K]`` (the weighted score before normalisation), ``att_scores`` and ``ctc_scores [B, K]`` (attention log-prob
    incl. eos; CTC full-sequence log-prob, 0 without CTC)."""
    cfg = model.config
    eos, blank, k, v = cfg.eos_token, cfg.blank_id, beam_size, cfg.vocab_size
    if k < 1 or max_len < 1:
        raise ValueError(f"beam_size and max_len must be >= 1, got {beam_size}, {max_len}")
    if not 0.0 <= ctc_weight <= 1.0:
        raise ValueError(f"ctc_weight must be in [0, 1], got {ctc_weight}")
    use_ctc = ctc_weight > 0.0
    if use_ctc and not cfg.use_ctc:
        raise ValueError("ctc_weight > 0 needs a model with a CTC head (AEDConfig.ctc_weight > 0)")
    c = v if (not use_ctc or ctc_candidates <= 0) else min(ctc_candidates, v)
    enc, enc_pad, ctc_logits = model.apply(variables, features, feature_paddings, False, method="encode")
    b = enc.shape[0]
    rep = lambda a: jnp.repeat(a, k, axis=0)  # noqa: E731
    state = model.apply(variables, rep(enc), rep(enc_pad), max_len + 1, method="init_state")
    first = jnp.tile(jnp.array([0.0] + [NEG] * (k - 1), jnp.float32), (b, 1))
    zeros = jnp.zeros((b, k), jnp.float32)
    if use_ctc:
        x = ctc_log_probs(ctc_logits, enc_pad, blank)
        r0 = jnp.broadcast_to(ctc_prefix_init(x, blank)[:, None], (b, k) + x.shape[1:2] + (2,))
    else:
        x = jnp.zeros((b, 1, 1), jnp.float32)
        r0 = jnp.zeros((b, k, 1, 2), jnp.float32)
    vocab = jnp.arange(v)
    lp_max = length_norm(max_len + 1, length_penalty, length_norm_kind)
    gather_rows = lambda tree, idx: jax.tree_util.tree_map(  # noqa: E731
        lambda a: a[(jnp.arange(b)[:, None] * k + idx).reshape(-1)], tree)
    take = lambda a, idx: jnp.take_along_axis(a, idx.reshape(idx.shape + (1,) * (a.ndim - 2)), axis=1)  # noqa: E731

    carry = dict(t=jnp.int32(0), last=jnp.full((b * k,), cfg.sos_token, jnp.int32), st=state,
                 tok=jnp.full((b, k, max_len), eos, jnp.int32), score=first, att=zeros, ctc=zeros, r=r0,
                 lasttok=jnp.full((b, k), -1, jnp.int32), fin_tok=jnp.full((b, k, max_len), eos, jnp.int32),
                 fin_score=jnp.full((b, k), NEG, jnp.float32), fin_raw=jnp.full((b, k), NEG, jnp.float32),
                 fin_att=zeros, fin_ctc=zeros, go=jnp.bool_(True))

    def body(s):
        t = s["t"]
        logits, st = model.apply(variables, s["last"], t, s["st"], method="step")
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1).reshape(b, k, v)
        allowed = jnp.where(t >= max_len, vocab == eos, True)
        if use_ctc:
            allowed = allowed & (vocab != blank)
        logp = jnp.where(allowed, logp, NEG)
        if c == v:
            cand = jnp.broadcast_to(vocab, (b, k, v)).astype(jnp.int32)
            att_c = logp
        else:
            att_c, cand = jax.lax.top_k(logp, c)
            cand = cand.astype(jnp.int32)
        att_c = s["att"][..., None] + att_c
        if use_ctc:
            psi, r_new = ctc_prefix_extend(x, s["r"], s["lasttok"], cand, blank, eos)
        else:
            psi, r_new = jnp.zeros_like(att_c), None
        bonus = jnp.where(cand == eos, 0.0, length_bonus)
        total = (1.0 - ctc_weight) * att_c + ctc_weight * psi + bonus + (s["score"] - (
            (1.0 - ctc_weight) * s["att"] + ctc_weight * s["ctc"]))[..., None]  # carries the earlier bonuses
        total = jnp.where(jnp.isfinite(att_c) & jnp.isfinite(psi) & jnp.isfinite(s["score"])[..., None], total, NEG)
        sel, flat = jax.lax.top_k(total.reshape(b, k * c), k)
        beam = flat // c
        tok = jnp.take_along_axis(cand.reshape(b, k * c), flat, axis=1)
        valid = jnp.isfinite(sel)
        is_eos = tok == eos
        sel_att = jnp.take_along_axis(att_c.reshape(b, k * c), flat, axis=1)
        sel_ctc = jnp.take_along_axis(psi.reshape(b, k * c), flat, axis=1)
        prev_tok = take(s["tok"], beam)
        # finished pool: the K best by normalised score among the old pool and the new eos extensions
        new_fin = valid & is_eos
        norm = sel / length_norm(t + 1, length_penalty, length_norm_kind)
        m_score = jnp.concatenate([s["fin_score"], jnp.where(new_fin, norm, NEG)], 1)
        fin_score, m_idx = jax.lax.top_k(m_score, k)
        merge = lambda old, new: take(jnp.concatenate([old, new], 1), m_idx)  # noqa: E731
        fin_tok = merge(s["fin_tok"], prev_tok)
        fin_raw = merge(s["fin_raw"], jnp.where(new_fin, sel, NEG))
        fin_att, fin_ctc = merge(s["fin_att"], sel_att), merge(s["fin_ctc"], sel_ctc)
        # running set: the kept non-eos extensions
        run = valid & ~is_eos
        score = jnp.where(run, sel, NEG)
        tok_buf = jnp.where(run[..., None] & (jnp.arange(max_len) == t), tok[..., None], prev_tok)
        st = gather_rows(st, beam)
        r = take(r_new.reshape((b, k * c) + r_new.shape[3:]), flat) if use_ctc else s["r"]
        best_run = jnp.max(score, axis=1)
        bound = jnp.where(best_run < 0, best_run / lp_max, best_run)
        can_stop = jnp.isfinite(fin_score[:, -1]) & (bound <= fin_score[:, -1]) & (length_bonus <= 0)
        go = (t < max_len) & jnp.any(jnp.isfinite(best_run) & ~can_stop)
        return dict(t=t + 1, last=jnp.where(run, tok, eos).reshape(-1), st=st, tok=tok_buf, score=score,
                    att=sel_att, ctc=sel_ctc, r=r, lasttok=jnp.where(run, tok, -1), fin_tok=fin_tok,
                    fin_score=fin_score, fin_raw=fin_raw, fin_att=fin_att, fin_ctc=fin_ctc, go=go)

    s = jax.lax.while_loop(lambda s: s["go"], body, carry)
    toks = s["fin_tok"]
    lengths = jnp.argmax(jnp.concatenate([toks, jnp.full((b, k, 1), eos, jnp.int32)], 2) == eos, axis=2)
    return {"tokens": toks, "token_paddings": paddings_from_lengths(lengths.reshape(-1), max_len).reshape(b, k, -1),
            "scores": s["fin_score"], "raw_scores": s["fin_raw"], "att_scores": s["fin_att"],
            "ctc_scores": s["fin_ctc"]}
