"""jasr.ctc_beam's blank frames (token_min_logp): the compacted search (each row's frames with candidates
gathered and scanned, blank runs folded in between) equals the search over every frame with the same rule
("fold"), on peaky inputs with repeated tokens around blank runs, with padding, with a word LM and lexicon, and
under jit; where blank frames are exactly blank the rule drops nothing and both equal the plain search ("full")."""
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from jasr.ctc_beam import ctc_prefix_beam_search, nbest_lists
from jasr.ctc_beam_plan import top_rows
from jasr.lexicon import make_lexicon, make_lm_lookahead
from tests.test_ctc_beam import SPACE, random_lm

B, T, V = 3, 24, 6


def peaky_runs(rng, lengths, noise=0.5, peak=9.0, exact_blank=False):
    """Mostly-blank log-probs [B, T, V]: tokens in runs of 1-3 frames, the same token often again after a blank
    run (CTC's repeat rule), blank runs of 0-5 frames; exact_blank: blank frames put -1e4 on every other token."""
    labels = np.zeros((B, T), np.int64)
    for b in range(B):
        t, tok = 0, int(rng.integers(1, V))
        while t < T:
            t += int(rng.integers(0, 6))                                   # a blank run
            tok = tok if rng.random() < 0.4 else int(rng.integers(1, V))   # repeat the last token, or a new one
            n = int(rng.integers(1, 4))
            labels[b, t:t + n] = tok
            t += n
    logits = rng.normal(size=(B, T, V)) * noise + peak * np.eye(V)[labels]
    if exact_blank:
        logits = np.where((labels == 0)[..., None] & (np.arange(V) > 0), -1e4, logits)
    pad = (np.arange(T)[None] >= np.asarray(lengths)[:, None]).astype(np.float32)
    return jax.nn.log_softmax(jnp.asarray(logits, jnp.float32), axis=-1), pad


def assert_same(a, b, atol=1e-4):
    la, lb = nbest_lists(a), nbest_lists(b)
    assert [[h for h, _ in r] for r in la] == [[h for h, _ in r] for r in lb]
    np.testing.assert_allclose(np.asarray(a.scores), np.asarray(b.scores), atol=atol)
    np.testing.assert_array_equal(np.asarray(a.token_frames), np.asarray(b.token_frames))
    np.testing.assert_array_equal(np.asarray(a.lengths), np.asarray(b.lengths))


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2 ** 31 - 1), lengths=st.lists(st.integers(1, T), min_size=B, max_size=B),
       noise=st.sampled_from([0.3, 1.5]))
def test_compacted_equals_every_frame(seed, lengths, noise):
    lp, pad = peaky_runs(np.random.default_rng(seed), lengths, noise)
    kw = dict(nbest=3, token_min_logp=-4.0, beam_prune_logp=-8.0, token_topk=4)
    assert_same(ctc_prefix_beam_search(lp, pad, 4, blank_frames="compact", **kw),
                ctc_prefix_beam_search(lp, pad, 4, blank_frames="fold", **kw))


def test_compacted_with_word_lm_lookahead_and_chunks():
    rng = np.random.default_rng(1)
    lp, pad = peaky_runs(rng, [24, 17, 6], noise=1.2)
    lp = lp.at[0, 3].set(jax.nn.log_softmax(jnp.zeros(V)))           # one flat frame: every token a candidate
    words = [[1, 2], [2, 2], [4], [4, 4, 1], [5, 1], [2]]
    lex = make_lexicon(words, V, boundary_ids=[SPACE], unk_id=len(words))
    lm = random_lm(rng, len(words) + 1)
    kw = dict(nbest=3, token_min_logp=-4.0, beam_prune_logp=-8.0, lm=lm, lm_weight=0.8, lm_level="word",
              word_bonus=0.5, lexicon=lex, oov_penalty=-2.0, lm_lookahead=make_lm_lookahead(lex, lm))
    a = ctc_prefix_beam_search(lp, pad, 4, blank_frames="compact", **kw)
    assert_same(a, ctc_prefix_beam_search(lp, pad, 4, blank_frames="fold", **kw))
    np.testing.assert_allclose(np.asarray(a.lm), np.asarray(
        ctc_prefix_beam_search(lp, pad, 4, blank_frames="fold", **kw).lm), atol=1e-5)


def test_exact_blank_frames_lose_nothing_and_jit_folds_on_device():
    lp, pad = peaky_runs(np.random.default_rng(2), [24, 20, 9], noise=0.8, exact_blank=True)
    kw = dict(nbest=3, token_min_logp=-6.0)
    full = ctc_prefix_beam_search(lp, pad, 4, blank_frames="full", **kw)
    compact = ctc_prefix_beam_search(lp, pad, 4, **kw)
    assert_same(compact, full)
    jitted = jax.jit(lambda x, p: ctc_prefix_beam_search(x, p, 4, token_topk=V - 1, **kw))(lp, pad)
    assert_same(jitted, compact)


def test_top_rows_equals_lax_top_k_with_ties_and_minus_inf():
    """The search's rank-based top-k (short rows) picks as jax.lax.top_k: ties and -inf entries by lower index."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(4, 3, 17)).astype(np.float32)
    x[..., ::4] = -np.inf
    x[..., 5] = x[..., 2]                                           # ties
    x[0, 0] = -np.inf                                               # a row of -inf only
    for k in (1, 8, 17):
        for got, want in zip(top_rows(jnp.asarray(x), k), jax.lax.top_k(jnp.asarray(x), k)):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
