"""jasr.ctc_beam with LM look-ahead (jasr.lexicon.make_lm_lookahead): the table against a max over the words of
each prefix, wide-beam search against brute force (look-ahead leaves final scores unchanged), and a narrow beam
where look-ahead keeps the word that the LM prefers."""
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jasr.ctc_beam import ctc_prefix_beam_search, nbest_lists
from jasr.lexicon import lookahead_score, make_lexicon, make_lm_lookahead
from tests.test_ctc_beam import (SPACE, UNK, V_BF, WIDE, WORDS, brute_force, check_nbest,
                                 draw_inputs, lm_score, random_lm, word_reference)


def node_of(lex, seq):
    """The trie node of a token prefix, walked on the host through the dense child table."""
    child, node = np.asarray(lex.child), 0
    for t in seq:
        node = int(child[node, t])
    return node


def test_table_is_the_max_over_the_words_below_each_node():
    rng = np.random.default_rng(0)
    words = [(1, 2), (1, 2, 2), (2, 1), (1, 1, 2), (2,)]
    lm = random_lm(rng, len(words) + 1)       # ids 0..4 the words, 5 = <unk>
    lex = make_lexicon(words, V_BF, boundary_ids=[SPACE], unk_id=5)
    look = make_lm_lookahead(lex, lm)
    uni = make_lm_lookahead(lex, lm, max_entries=1)
    table = np.asarray(lm.table)              # [states, words]: ln p(word | state)
    assert look.conditioned and not uni.conditioned and uni.table.shape[0] == 1
    prefixes = sorted({w[:i] for w in words for i in range(1, len(w) + 1)})
    nodes = jnp.asarray([node_of(lex, p) for p in prefixes] + [0, -1])[None]       # [1, P + 2]
    states = jnp.arange(table.shape[0])[:, None]                                  # [S, 1]
    best = np.array([[max(table[s, i] for i, w in enumerate(words) if w[:len(p)] == p) for p in prefixes]
                     + [0.0, table[s, 5]] for s in range(table.shape[0])])         # root: 0; outside: <unk>
    np.testing.assert_allclose(np.asarray(lookahead_score(look, states, nodes)), best, atol=1e-6)
    best_uni = np.broadcast_to(np.concatenate([best[0, :-1], [table[0, 5]]]), best.shape)
    np.testing.assert_allclose(np.asarray(lookahead_score(uni, states, nodes)), best_uni, atol=1e-6)


@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 2 ** 31), scale=st.sampled_from([0.5, 2.0, 5.0]), constrained=st.booleans())
def test_wide_beam_with_lookahead_equals_brute_force(seed, scale, constrained):
    rng, lp, pad, n_frames = draw_inputs(seed, scale)
    lm, alpha, beta, oov = random_lm(rng, len(WORDS) + 1), 0.8, 0.5, -1.5
    lex = make_lexicon(WORDS, V_BF, boundary_ids=[SPACE], unk_id=UNK)
    res = ctc_prefix_beam_search(lp, pad, WIDE, nbest=6, lm=lm, lm_weight=alpha, lm_level="word", word_bonus=beta,
                                 lexicon=lex, constrain_to_lexicon=constrained, oov_penalty=oov,
                                 lm_lookahead=make_lm_lookahead(lex, lm))
    for b in range(2):
        ref = word_reference(brute_force(lp[b], n_frames[b]), lm, alpha, beta, oov, constrained)
        check_nbest(res, b, ref, min(6, len(ref)))


def test_lookahead_keeps_the_word_the_lm_prefers_at_a_narrow_beam():
    """Frames: "a" 0.35 vs "b" 0.64, a (near-certain) blank, then "b". The acoustics prefer the partial word "b"
    (of "bb") over "a" (of "ab"); the LM prefers "ab" by far. Beam 1 without look-ahead keeps only "b" and ends
    with "bb"; with look-ahead, "a" carries the LM score of "ab" and survives. Scores are the brute-force totals
    either way."""
    p = np.array([[1e-4, 0.35, 0.64, 0.0099], [1 - 3e-6, 1e-6, 1e-6, 1e-6], [0.04, 0.01, 0.94, 0.01]], np.float32)
    lp = jnp.log(jnp.asarray(p))[None]
    pad = np.zeros((1, 3), np.float32)
    words = [(1, 2), (2, 2)]                                   # "ab" (id 0), "bb" (id 1); <unk> = 2
    table = np.full((4, 3), -6.0, np.float32)
    table[:, 0] = -0.05                                        # "ab" is likely after any word
    lm = random_lm(np.random.default_rng(0), 3)._replace(table=jnp.asarray(table), end=jnp.full((4,), -1.0))
    lex = make_lexicon(words, V_BF, boundary_ids=[SPACE], unk_id=2)
    kw = dict(lm=lm, lm_weight=1.0, lm_level="word", lexicon=lex, constrain_to_lexicon=True)
    plain = nbest_lists(ctc_prefix_beam_search(lp, pad, 1, **kw))[0]
    look = nbest_lists(ctc_prefix_beam_search(lp, pad, 1, lm_lookahead=make_lm_lookahead(lex, lm), **kw))[0]
    ac = brute_force(lp[0], 3)
    assert plain[0][0] == [2, 2] and look[0][0] == [1, 2]
    for seq, score in (plain[0], look[0]):
        ids = [words.index(w) for w in [tuple(seq)]]
        assert score == pytest.approx(ac[tuple(seq)] + lm_score(lm, ids), abs=1e-4)
    assert look[0][1] > plain[0][1]                            # the better total under the fused objective


def test_lookahead_bad_input():
    lp, pad = jnp.zeros((1, 3, V_BF)), jnp.zeros((1, 3))
    lm = random_lm(np.random.default_rng(0), len(WORDS) + 1)
    lex = make_lexicon(WORDS, V_BF, boundary_ids=[SPACE], unk_id=UNK)
    look = make_lm_lookahead(lex, lm)
    with pytest.raises(ValueError, match="lm_lookahead"):
        ctc_prefix_beam_search(lp, pad, 2, lm=lm, lm_level="token", lm_lookahead=look)
    other = make_lexicon([(1,)], V_BF, boundary_ids=[SPACE], unk_id=UNK)
    with pytest.raises(ValueError, match="lm_lookahead"):
        ctc_prefix_beam_search(lp, pad, 2, lm=lm, lm_level="word", lexicon=other, lm_lookahead=look)
    with pytest.raises(TypeError, match="num_states"):
        make_lm_lookahead(lex, object())
