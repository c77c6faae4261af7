"""AED beam search (models.aed_search) against brute force on a tiny random model: every token sequence up to a small
length scored independently (attention by teacher forcing, CTC by jasr.losses.ctc_loss), length-normalised and
ranked; beam 1 equals greedy; the CTC prefix scores equal prefix sums of CTC alignments."""
import itertools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jasr.losses import ctc_loss
from jasr.tasks.base import SearchOptions
from jasr.tasks.conformer import ConformerAEDTask
from models.aed import AEDConfig, AEDModel, greedy_search
from models.aed_search import beam_search, ctc_log_probs, ctc_prefix_extend, ctc_prefix_init

V = 5                       # blank 0, tokens 1..3, sos/eos 4


def _variables(model, x, pad, seed=0):
    shapes = nn.unbox(jax.eval_shape(model.init, jax.random.PRNGKey(0), x, pad, jnp.zeros((2, 2), jnp.int32),
                                     jnp.zeros((2, 2), jnp.float32)))
    rng = np.random.default_rng(seed)

    def fill(path, s):
        name = jax.tree_util.keystr(path)
        if name.endswith("['scale']") or name.endswith("['var']"):
            return jnp.ones(s.shape, s.dtype)
        fan_in = int(np.prod(s.shape[:-1])) if len(s.shape) > 1 else 16
        scale = 4.0 if ("output" in name or "ctc_head" in name) else 1.0   # sharper distributions
        return jnp.asarray(scale * rng.standard_normal(s.shape) / np.sqrt(fan_in), s.dtype)

    return jax.tree_util.tree_map_with_path(fill, shapes)


@pytest.fixture(scope="module")
def aed():
    cfg = AEDConfig.tiny(V, ctc_weight=0.3)
    model = AEDModel(cfg)
    rng = np.random.default_rng(1)
    lengths = [40, 29]
    x = rng.standard_normal((2, 40, cfg.encoder.input_dim)).astype(np.float32)
    pad = (np.arange(40)[None] >= np.asarray(lengths)[:, None]).astype(np.float32)
    return cfg, model, _variables(model, x, pad), x, pad


def _brute(aed, tokens, max_len):
    """Every sequence over `tokens` of length <= max_len (each followed by eos) per utterance, with its attention
    log-probability (teacher forcing) and CTC log-probability (-ctc_loss)."""
    cfg, model, variables, x, pad = aed
    eos = cfg.eos_token
    hyps = [list(h) for n in range(max_len + 1) for h in itertools.product(tokens, repeat=n)]
    inp = jnp.asarray([[cfg.sos_token] + h + [eos] * (max_len - len(h)) for h in hyps], jnp.int32)
    labels = jnp.asarray([h + [1] * (max_len - len(h)) for h in hyps], jnp.int32)
    lpad = jnp.asarray([[0.0] * len(h) + [1.0] * (max_len - len(h)) for h in hyps], jnp.float32)
    enc, enc_pad, ctc_logits = model.apply(variables, x, pad, method=AEDModel.encode)
    out = []
    for i in range(x.shape[0]):
        rep = lambda a: jnp.repeat(a[i:i + 1], len(hyps), 0)  # noqa: E731
        logp = np.asarray(jax.nn.log_softmax(model.apply(variables, inp, rep(enc), rep(enc_pad),
                                                         method=AEDModel.decode)))
        att = np.array([sum(logp[r, j, t] for j, t in enumerate(h + [eos])) for r, h in enumerate(hyps)])
        ctc = (None if cfg.blank_id in tokens else
               -np.asarray(ctc_loss(rep(ctc_logits), rep(enc_pad), labels, lpad, cfg.blank_id)))
        out.append((att, ctc))
    return hyps, out


def _check(res, hyps, scores, top, atol=2e-4):
    """The n-best of `res` row i equal the `top` best of the brute-force `scores` (hyps and values)."""
    for i, sc in enumerate(scores):
        order = np.argsort(-sc, kind="stable")[:top]
        got = np.asarray(res["scores"][i, :top])
        np.testing.assert_allclose(got, sc[order], rtol=1e-4, atol=atol)
        n = int((1 - np.asarray(res["token_paddings"][i, 0])).sum())
        best = list(np.asarray(res["tokens"][i, 0, :n]))
        assert np.isclose(sc[hyps.index(best)], sc[order[0]], atol=atol)


def test_wide_beam_equals_brute_force_with_length_normalisation(aed):
    cfg, model, variables, x, pad = aed
    max_len, alpha = 3, 0.7
    beam = (V - 1) ** 2 * V        # every candidate of every step survives
    res = jax.jit(lambda vv: beam_search(model, vv, x, pad, max_len, beam, length_penalty=alpha))(variables)
    hyps, bf = _brute(aed, range(V - 1), max_len)
    lens = np.array([len(h) + 1 for h in hyps], np.float32)
    _check(res, hyps, [att / lens ** alpha for att, _ in bf], top=10)
    for i, (att, _) in enumerate(bf):   # raw scores are the attention log-probs of the returned hypotheses
        for j in range(5):
            n = int((1 - np.asarray(res["token_paddings"][i, j])).sum())
            h = list(np.asarray(res["tokens"][i, j, :n]))
            np.testing.assert_allclose(res["raw_scores"][i, j], att[hyps.index(h)], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("lam,alpha,kind", [(1.0, 0.0, "plain"), (0.5, 1.0, "gnmt")])
def test_joint_ctc_wide_beam_equals_brute_force(aed, lam, alpha, kind):
    """lambda = 1 ranks by the CTC full-sequence probability (= -jasr ctc_loss); 0.5 mixes both, GNMT-normalised."""
    cfg, model, variables, x, pad = aed
    max_len = 4
    beam = (V - 2) ** 3 * (V - 1)  # blank is never a hypothesis token with CTC scoring
    res = jax.jit(lambda vv: beam_search(model, vv, x, pad, max_len, beam, ctc_weight=lam, length_penalty=alpha,
                                         length_norm_kind=kind))(variables)
    hyps, bf = _brute(aed, range(1, V - 1), max_len)
    lp = ((5.0 + np.array([len(h) + 1 for h in hyps])) / 6.0) ** alpha
    scores = [((1 - lam) * att + lam * ctc) / lp for att, ctc in bf]
    _check(res, hyps, [np.where(np.isfinite(s), s, -1e30) for s in scores], top=5)
    if lam == 1.0:
        for i, (_, ctc) in enumerate(bf):
            n = int((1 - np.asarray(res["token_paddings"][i, 0])).sum())
            np.testing.assert_allclose(res["ctc_scores"][i, 0], ctc[hyps.index(list(np.asarray(
                res["tokens"][i, 0, :n])))], rtol=1e-4, atol=1e-4)


def test_ctc_prefix_score_equals_alignment_sums(aed):
    """psi(g + c) = log of the total probability of the alignments whose collapsed output starts with g + c
    (enumerated over all alignments of a short random input); psi(g + eos) = the full-sequence probability."""
    t, blank, eos = 5, 0, V - 1
    rng = np.random.default_rng(3)
    logits = jnp.asarray(rng.standard_normal((1, t, V)), jnp.float32)
    x = ctc_log_probs(logits, jnp.zeros((1, t)), blank)
    xn = np.asarray(x[0])
    prefix_mass, full_mass = {}, {}
    for ali in itertools.product(range(V), repeat=t):            # every class of the CTC softmax
        out = [a for j, a in enumerate(ali) if a != blank and (j == 0 or ali[j - 1] != a)]
        p = np.exp(sum(xn[j, a] for j, a in enumerate(ali)))
        full_mass[tuple(out)] = full_mass.get(tuple(out), 0.0) + p
        for n in range(1, len(out) + 1):
            # prefix mass counts an alignment once per prefix, at the frame where the prefix's last token starts
            prefix_mass[tuple(out[:n])] = prefix_mass.get(tuple(out[:n]), 0.0) + p
    for g in [(), (1,), (2, 2), (1, 3)]:
        r = ctc_prefix_init(x, blank)[:, None]
        for j, tok in enumerate(g):
            last = jnp.asarray([[g[j - 1] if j else -1]])
            _, rn = ctc_prefix_extend(x, r, last, jnp.asarray([[[tok]]]), blank, eos)
            r = rn[:, :, 0]
        cand = jnp.asarray([[[1, 2, 3, eos]]])
        psi, _ = ctc_prefix_extend(x, r, jnp.asarray([[g[-1] if g else -1]]), cand, blank, eos)
        for col, c in enumerate([1, 2, 3]):
            want = prefix_mass.get(g + (c,), 0.0)
            np.testing.assert_allclose(np.exp(psi[0, 0, col]), want, rtol=1e-4, atol=1e-9)
        np.testing.assert_allclose(np.exp(psi[0, 0, 3]), full_mass.get(g, 0.0), rtol=1e-4, atol=1e-9)


def test_beam_one_is_greedy(aed):
    cfg, model, variables, x, pad = aed
    max_len = 6
    toks, tpad, scores = jax.jit(lambda vv: greedy_search(model, vv, x, pad, max_len))(variables)
    res = jax.jit(lambda vv: beam_search(model, vv, x, pad, max_len, 1))(variables)
    np.testing.assert_array_equal(res["tokens"][:, 0], toks)
    np.testing.assert_array_equal(res["token_paddings"][:, 0], tpad)
    ended = np.asarray(tpad).sum(1) > 0             # greedy's score includes eos only when it was emitted
    np.testing.assert_allclose(np.asarray(res["scores"][:, 0])[ended], np.asarray(scores)[ended], rtol=1e-5)


def test_pre_beam_and_errors(aed):
    """ctc_candidates = V scores every token (same result as 0); a model without a CTC head refuses ctc_weight."""
    cfg, model, variables, x, pad = aed
    run = lambda c: beam_search(model, variables, x, pad, 3, 4, ctc_weight=0.3, ctc_candidates=c)  # noqa: E731
    a, b = run(0), run(V)
    np.testing.assert_array_equal(a["tokens"], b["tokens"])
    np.testing.assert_allclose(a["scores"], b["scores"], rtol=1e-6)
    small = run(2)
    assert np.isfinite(np.asarray(small["scores"][:, 0])).all()
    with pytest.raises(ValueError, match="CTC head"):
        beam_search(AEDModel(cfg.replace(ctc_weight=0.0)), variables, x, pad, 3, 2, ctc_weight=0.5)


def test_task_beam_decode_hook(aed):
    """ConformerAEDTask.beam_decode (the hook decode.py calls): nbest rows from the audio alone; beam 1 = greedy."""
    cfg, model, variables, x, pad = aed
    task = ConformerAEDTask(model=model, joint=True, ctc_weight=0.3)
    batch = {"features": jnp.asarray(x), "feature_paddings": jnp.asarray(pad)}
    params = variables["params"]
    out = jax.jit(task.beam_decode, static_argnums=3)(params, {}, batch, SearchOptions(beam_size=4, nbest=2,
                                                                                        ctc_weight=0.5))
    assert out["ids"].shape[:2] == (2, 2) and out["ids"].shape[2] == task.max_tokens(x.shape[1])
    assert np.all(np.diff(np.asarray(out["scores"]), axis=1) <= 1e-6)
    one = task.beam_decode(params, {}, batch, SearchOptions(beam_size=1))
    toks, _, _ = greedy_search(model, variables, x, pad, task.max_tokens(x.shape[1]))
    np.testing.assert_array_equal(one["ids"][:, 0], toks)
    with pytest.raises(ValueError):
        SearchOptions(beam_size=2, nbest=3)


def test_greedy_early_stop_equals_a_full_length_scan(aed):
    """greedy_search (while_loop, stops when every row has emitted eos) gives the tokens, paddings and scores of a
    scan over all max_len steps written here (the former implementation), for a row that ends early too."""
    cfg, model, variables, x, pad = aed
    eos, max_len = cfg.eos_token, 12

    @jax.jit
    def scan_reference(vv):
        enc, enc_pad, _ = model.apply(vv, x, pad, method=AEDModel.encode)
        st = model.apply(vv, enc, enc_pad, max_len + 1, method=AEDModel.init_state)

        def body(carry, t):
            tok, st, done, score = carry
            logits, st = model.apply(vv, tok, t, st, method=AEDModel.step)
            logp = jax.nn.log_softmax(logits, -1)
            nxt = jnp.argmax(logp, -1).astype(jnp.int32)
            score = score + jnp.where(done, 0.0, jnp.take_along_axis(logp, nxt[:, None], -1)[:, 0])
            nxt = jnp.where(done, eos, nxt)
            return (nxt, st, done | (nxt == eos), score), nxt

        init = (jnp.full((2,), cfg.sos_token, jnp.int32), st, jnp.zeros((2,), bool), jnp.zeros((2,)))
        (_, _, _, score), toks = jax.lax.scan(body, init, jnp.arange(max_len))
        return toks.T, score

    for bias in (None, 3.0, 4.0):   # as initialised (no row ends); one row ends at once; both do
        vv = variables
        if bias:
            vv = jax.tree_util.tree_map(lambda a: a, variables)
            out = vv["params"]["decoder"]["output"]
            out["bias"] = out["bias"].at[eos].add(bias)
        ref_toks, ref_score = scan_reference(vv)
        toks, tpad, score = jax.jit(lambda v: greedy_search(model, v, x, pad, max_len))(vv)
        np.testing.assert_array_equal(toks, ref_toks)
        np.testing.assert_allclose(score, ref_score, rtol=1e-5, atol=1e-6)
        lengths = (1 - np.asarray(tpad)).sum(1)
        assert all(eos not in list(np.asarray(toks[i, :int(n)])) for i, n in enumerate(lengths))
        if bias:
            assert lengths.min() < max_len          # a row ended early
