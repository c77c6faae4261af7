"""jasr.ctc_beam: CTC prefix beam search against a brute force over all alignments, greedy decoding and a plain
dict-based prefix beam search; LM fusion, lexicon constraint, hotwords, padding and batching."""
import itertools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jasr.ctc_beam import ctc_prefix_beam_search, nbest_lists, word_timestamps
from jasr.decoding import ctc_greedy_ids
from jasr.lexicon import lexicon_child, lexicon_from_tokenizer, make_hotwords, make_lexicon, make_lm_lookahead
from jasr.ngram import read_arpa
from jasr.tokenizers import CharTokenizer, SentencePieceTokenizer

T_BF, V_BF = 5, 4            # brute force: blank, "a" (1), "b" (2), " " (3)
WIDE = sum(3 ** n for n in range(T_BF + 1))   # every prefix of <= T_BF tokens fits: the search prunes nothing
SPACE = 3
WORDS = [(1,), (2, 1), (1, 2, 2)]             # lexicon spellings; word ids 0..2, unk 3
UNK = 3


class BigramLM(NamedTuple):
    """Test LM over ids 0..W-1: state 0 = sentence start, state i + 1 = after id i (natural-log tables)."""
    table: jax.Array   # [W + 1, W]
    end: jax.Array     # [W + 1]

    @property
    def num_states(self):
        return self.table.shape[0]

    def start_state(self):
        return jnp.int32(0)

    def advance(self, states, ids):
        return (ids + 1).astype(jnp.int32), self.table[states, ids]

    def final(self, states):
        return self.end[states]


def random_lm(rng, n):
    logits = rng.normal(size=(n + 1, n + 1)) * 1.5
    p = np.asarray(jax.nn.log_softmax(jnp.asarray(logits), axis=-1), np.float32)
    return BigramLM(jnp.asarray(p[:, :n]), jnp.asarray(p[:, n]))


def lm_score(lm, ids):
    table, end = np.asarray(lm.table, np.float64), np.asarray(lm.end, np.float64)
    s, total = 0, 0.0
    for i in ids:
        total += table[s, i]
        s = i + 1
    return total + end[s]


def split_words(seq):
    words, cur = [], []
    for t in seq:
        if t == SPACE:
            if cur:
                words.append(tuple(cur))
            cur = []
        else:
            cur.append(t)
    return words + ([tuple(cur)] if cur else [])


def brute_force(lp, n_frames):
    """Every frame-level path of the first n_frames, collapsed: {label sequence: log P (logsumexp over paths)}."""
    lp = np.asarray(lp, np.float64)[:n_frames]
    out = {}
    for path in itertools.product(range(lp.shape[1]), repeat=n_frames):
        seq, prev = [], 0
        for s in path:
            if s != 0 and s != prev:
                seq.append(s)
            prev = s
        score = lp[np.arange(n_frames), list(path)].sum()
        out[tuple(seq)] = np.logaddexp(out.get(tuple(seq), -np.inf), score)
    return out


def check_nbest(result, b, expected, n):
    """The first n hypotheses of row b equal the n best of `expected` {seq: score}, in order."""
    best = sorted(expected.items(), key=lambda kv: -kv[1])[:n]
    got = nbest_lists(result)[b][:n]
    assert [g[0] for g in got] == [list(s) for s, _ in best]
    np.testing.assert_allclose([g[1] for g in got], [v for _, v in best], rtol=1e-4, atol=1e-4)


def draw_inputs(seed, scale):
    rng = np.random.default_rng(seed)
    lp = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(2, T_BF, V_BF)) * scale, jnp.float32), axis=-1)
    n_frames = [T_BF, int(rng.integers(1, T_BF + 1))]
    pad = (np.arange(T_BF)[None] >= np.array(n_frames)[:, None]).astype(np.float32)
    return rng, lp, pad, n_frames


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2 ** 31), scale=st.sampled_from([0.5, 2.0, 5.0]))
def test_wide_beam_token_lm_equals_brute_force(seed, scale):
    rng, lp, pad, n_frames = draw_inputs(seed, scale)
    lm, alpha, beta = random_lm(rng, V_BF), 0.7, 0.3
    res = ctc_prefix_beam_search(lp, pad, WIDE, nbest=8, lm=lm, lm_weight=alpha, word_bonus=beta)
    for b in range(2):
        ac = brute_force(lp[b], n_frames[b])
        total = {s: a + alpha * lm_score(lm, s) + beta * len(s) for s, a in ac.items()}
        check_nbest(res, b, total, 8)
        # the parts: acoustic and LM of the best hypothesis
        seq = tuple(nbest_lists(res)[b][0][0])
        np.testing.assert_allclose(float(res.acoustic[b, 0]), ac[seq], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(float(res.lm[b, 0]), lm_score(lm, seq), rtol=1e-4, atol=1e-4)


def word_reference(ac, lm, alpha, beta, oov, constrained):
    lex = {w: i for i, w in enumerate(WORDS)}
    out = {}
    for s, a in ac.items():
        words = split_words(s)
        if constrained and any(w not in lex for w in words):
            continue
        ids = [lex.get(w, UNK) for w in words]
        out[s] = a + alpha * lm_score(lm, ids) + beta * len(words) + oov * sum(w not in lex for w in words)
    return out


@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 2 ** 31), scale=st.sampled_from([0.5, 2.0, 5.0]), constrained=st.booleans())
def test_wide_beam_word_lm_and_lexicon_equal_brute_force(seed, scale, constrained):
    rng, lp, pad, n_frames = draw_inputs(seed, scale)
    lm, alpha, beta, oov = random_lm(rng, len(WORDS) + 1), 0.8, 0.5, -1.5
    lex = make_lexicon(WORDS, V_BF, boundary_ids=[SPACE], unk_id=UNK)
    res = ctc_prefix_beam_search(lp, pad, WIDE, nbest=6, lm=lm, lm_weight=alpha, lm_level="word", word_bonus=beta,
                                 lexicon=lex, constrain_to_lexicon=constrained, oov_penalty=oov)
    for b in range(2):
        ref = word_reference(brute_force(lp[b], n_frames[b]), lm, alpha, beta, oov, constrained)
        n = min(6, len(ref))
        check_nbest(res, b, ref, n)
        if constrained:   # nothing outside the lexicon comes out
            got = nbest_lists(res)[b]
            assert len(got) == n
            assert all(w in WORDS for seq, _ in got for w in split_words(seq))


# word pieces (SentencePiece style): 1 = "▁a" and 3 = "▁b" begin a word, 2 = "b" continues one; no boundary token
PIECE_WORDS = {"a": (1,), "ab": (1, 2), "bb": (3, 2)}
PIECE_ARPA = """\\data\\
ngram 1=6
ngram 2=5

\\1-grams:
-1.5\t<unk>\t-0.3
-99\t<s>\t-0.3
-0.8\t</s>
-0.5\ta\t-0.2
-0.9\tab\t-0.1
-1.2\tbb\t-0.4

\\2-grams:
-0.2\t<s> a
-0.4\ta ab
-0.3\tab </s>
-0.6\tbb a
-0.7\t<unk> bb

\\end\\
"""


def split_pieces(seq):
    words = []
    for t in seq:
        if t in (1, 3) or not words:
            words.append([t])
        else:
            words[-1].append(t)
    return [tuple(w) for w in words]


@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 2 ** 31), scale=st.sampled_from([0.5, 2.0, 5.0]), lookahead=st.booleans())
def test_wide_beam_ngram_lm_over_word_pieces_equals_brute_force(seed, scale, lookahead):
    """jasr.ngram.NgramLM (read from ARPA text) fused at word level with word-start pieces instead of a space; with
    the LM look-ahead a piece that starts a word completes the previous one and opens a new partial word whose
    look-ahead is read in the LM state after the completed word (final scores unchanged)."""
    rng, lp, pad, n_frames = draw_inputs(seed, scale)
    lm = read_arpa(PIECE_ARPA)
    names = list(PIECE_WORDS)
    lex = make_lexicon([PIECE_WORDS[w] for w in names], V_BF, word_ids=lm.ids(names).tolist(),
                       word_start_ids=[1, 3], unk_id=lm.unk_id)
    alpha, beta, oov = 0.9, 0.4, -2.0
    res = ctc_prefix_beam_search(lp, pad, WIDE, nbest=6, lm=lm, lm_weight=alpha, lm_level="word", word_bonus=beta,
                                 lexicon=lex, oov_penalty=oov,
                                 lm_lookahead=make_lm_lookahead(lex, lm) if lookahead else None)
    by_spelling = {v: k for k, v in PIECE_WORDS.items()}
    for b in range(2):
        ref = {}
        for seq, a in brute_force(lp[b], n_frames[b]).items():
            words = [by_spelling.get(w, "<unk>") for w in split_pieces(seq)]
            ref[seq] = (a + alpha * lm.score_sentence(words) + beta * len(words)
                        + oov * sum(w == "<unk>" for w in words))
        check_nbest(res, b, ref, 6)


def peaky(rng, B, T, V, blank_frac=0.6, peak=8.0):
    labels = np.where(rng.random((B, T)) < blank_frac, 0, rng.integers(1, V, (B, T)))
    logits = rng.normal(size=(B, T, V)) * 0.5 + peak * np.eye(V)[labels]
    return jax.nn.log_softmax(jnp.asarray(logits, jnp.float32), axis=-1)


def reference_beam(lp, beam, min_logp=None):
    """Textbook prefix beam search with dicts: [(seq, log P)] best first. min_logp: a prefix grows only by tokens
    at or above it or the frame's best (mass still flows into an extension already in the beam)."""
    lp = np.asarray(lp, np.float64)
    beams = {(): (0.0, -np.inf)}
    for row in lp:
        nxt = {}
        tried = [min_logp is None or row[c] >= min_logp or c == row.argmax() for c in range(len(row))]

        def add(p, pb, pnb):
            ob, onb = nxt.get(p, (-np.inf, -np.inf))
            nxt[p] = (np.logaddexp(ob, pb), np.logaddexp(onb, pnb))
        for p, (pb, pnb) in beams.items():
            ab = np.logaddexp(pb, pnb)
            add(p, ab + row[0], pnb + row[p[-1]] if p else -np.inf)
            for c in range(1, len(row)):
                if tried[c] or p + (c,) in beams:
                    add(p + (c,), -np.inf, (pb if p and p[-1] == c else ab) + row[c])
        beams = dict(sorted(nxt.items(), key=lambda kv: -np.logaddexp(*kv[1]))[:beam])
    return sorted(((s, np.logaddexp(*v)) for s, v in beams.items()), key=lambda kv: -kv[1])


@pytest.mark.parametrize("beam", [1, 4, 8])
def test_pruned_beam_equals_dict_reference_and_greedy(beam):
    """Beam 8 also runs the search's narrow steps (half the beam where no more entries live, only the tried
    candidates with token pruning): the same n-best as the dict reference."""
    rng = np.random.default_rng(beam)
    three = rng.normal(size=(3, 30, 6)) * 0.3 + 6.0 * (rng.random((3, 30, 6)).argsort(-1) < 3)   # 3 close tokens
    inputs = [jax.nn.log_softmax(jnp.asarray(rng.normal(size=(3, 30, 6)) * 2, jnp.float32), axis=-1),
              peaky(rng, 3, 30, 6), jax.nn.log_softmax(jnp.asarray(three, jnp.float32), axis=-1)]
    pad = np.zeros((3, 30), np.float32)
    pruned = dict(token_topk=5, token_min_logp=-3.5, blank_frames="full")
    for lp in inputs:
        for kw, min_logp in [({}, None)] + ([(pruned, -3.5)] if beam == 8 else []):
            got = nbest_lists(ctc_prefix_beam_search(lp, pad, beam, **kw))
            for b in range(3):
                ref = reference_beam(lp[b], beam, min_logp)
                assert [g[0] for g in got[b]] == [list(s) for s, _ in ref]
                np.testing.assert_allclose([g[1] for g in got[b]], [v for _, v in ref], rtol=1e-4, atol=1e-4)
    # beam 1 on peaky logits (as a trained CTC model's) is the greedy path; on flat logits it need not be
    if beam == 1:
        lp = inputs[1]
        assert [g[0][0] for g in nbest_lists(ctc_prefix_beam_search(lp, pad, 1))] == ctc_greedy_ids(lp, pad)


def test_padding_and_batching_change_nothing():
    rng = np.random.default_rng(7)
    lp = np.array(peaky(rng, 3, 30, 6, peak=3.0))
    lens = [30, 17, 5]
    pad = (np.arange(30)[None] >= np.array(lens)[:, None]).astype(np.float32)
    garbage = lambda: rng.normal(size=lp.shape).astype(np.float32) * 5  # noqa: E731
    res = ctc_prefix_beam_search(np.where(pad[..., None] > 0, garbage(), lp), pad, 4)
    for b in range(3):   # each row alone, with other garbage in its padded frames
        alone = ctc_prefix_beam_search(np.where(pad[b:b + 1, :, None] > 0, garbage()[:1], lp[b:b + 1]),
                                       pad[b:b + 1], 4)
        assert [g[0] for g in nbest_lists(res)[b]] == [g[0] for g in nbest_lists(alone)[0]]
        np.testing.assert_allclose(np.asarray(res.scores[b]), np.asarray(alone.scores[0]), rtol=1e-5)
        n = int(res.lengths[b, 0])
        np.testing.assert_array_equal(res.token_frames[b, 0, :n], alone.token_frames[0, 0, :n])
        assert np.all(np.asarray(res.token_frames[b, 0, :n]) < lens[b])


def test_hotword_boost_lifts_the_second_best():
    # frames: "a", blank, then "b" slightly over "a": "ab" wins, "aa" is second
    p = np.array([[0.05, 0.9, 0.03, 0.02], [0.9, 0.05, 0.03, 0.02], [0.05, 0.4, 0.5, 0.05]], np.float32)
    lp = jnp.log(jnp.asarray(p))[None]
    pad = np.zeros((1, 3), np.float32)
    plain = nbest_lists(ctc_prefix_beam_search(lp, pad, 8))[0]
    assert plain[0][0] == [1, 2] and plain[1][0] == [1, 1]
    acoustic = dict((tuple(s), v) for s, v in plain)
    hot = make_hotwords([[1, 1]], V_BF, boost=1.0)
    boosted = nbest_lists(ctc_prefix_beam_search(lp, pad, 8, hotwords=hot))[0]
    assert boosted[0][0] == [1, 1]
    got = dict((tuple(s), v) for s, v in boosted)
    assert got[(1, 1)] == pytest.approx(acoustic[(1, 1)] + 2.0, abs=1e-5)   # completed: bonus kept
    assert got[(1, 2)] == pytest.approx(acoustic[(1, 2)], abs=1e-5)         # broken off: bonus removed
    assert got[(1,)] == pytest.approx(acoustic[(1,)], abs=1e-5)             # unfinished at the end: removed


def hotword_bonus(seq, hotwords, boost):
    """Reference context bonus: the current match is the longest suffix of the tokens since the last completed
    hotword that is a prefix of a hotword; it holds boost * its length; a completed hotword banks its bonus."""
    prefixes = {tuple(h[:i]) for h in hotwords for i in range(len(h) + 1)}
    banked, match = 0.0, ()
    for t in seq:
        cand = match + (t,)
        match = next(cand[i:] for i in range(len(cand) + 1) if cand[i:] in prefixes)
        if match in {tuple(h) for h in hotwords}:
            banked, match = banked + boost * len(match), ()
    return banked


@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2 ** 31), scale=st.sampled_from([0.5, 2.0]))
def test_wide_beam_hotwords_equal_brute_force(seed, scale):
    rng, lp, pad, n_frames = draw_inputs(seed, scale)
    hotwords, boost = [(1, 2, 1), (2, 2), (1, 1, 2)], 0.8
    res = ctc_prefix_beam_search(lp, pad, WIDE, nbest=6, hotwords=make_hotwords(hotwords, V_BF, boost))
    for b in range(2):
        ref = {s: a + hotword_bonus(s, hotwords, boost) for s, a in brute_force(lp[b], n_frames[b]).items()}
        check_nbest(res, b, ref, 6)


def test_beam_one_is_not_greedy_on_flat_frames():
    """Why beam 1 equals greedy only on peaky frames: it keeps the prefix with the most probability summed over
    alignments, and "a" (stay: blank or "a" again) can outweigh "aa" although the best single path reads "aa"."""
    p = np.array([[0.05, 0.6, 0.35], [0.51, 0.49, 0.0], [0.2, 0.6, 0.2]], np.float32)
    lp = jnp.log(jnp.clip(jnp.asarray(p), 1e-9))[None]
    pad = np.zeros((1, 3), np.float32)
    assert ctc_greedy_ids(lp, pad) == [[1, 1]]
    assert nbest_lists(ctc_prefix_beam_search(lp, pad, 1))[0][0][0] == [1]
    assert nbest_lists(ctc_prefix_beam_search(lp, pad, 8))[0][0][0] == [1]   # also the most probable labelling


def test_token_pruning_keeps_the_best_on_peaky_logits():
    rng = np.random.default_rng(3)
    lp = peaky(rng, 3, 30, 6)
    pad = np.zeros((3, 30), np.float32)
    full = ctc_prefix_beam_search(lp, pad, 4, nbest=1)
    pruned = ctc_prefix_beam_search(lp, pad, 4, nbest=1, token_topk=2, token_min_logp=-5.0, beam_prune_logp=-10.0)
    # token_min_logp alone tries only as many tokens as the fullest frame has above it: exactly as trying all
    capped = ctc_prefix_beam_search(lp, pad, 4, nbest=2, token_topk=5, token_min_logp=-5.0)
    auto = ctc_prefix_beam_search(lp, pad, 4, nbest=2, token_min_logp=-5.0)
    assert nbest_lists(auto) == nbest_lists(capped)
    # same best paths; pruning changes which alignments are summed a little
    assert [h[0][0] for h in nbest_lists(full)] == [h[0][0] for h in nbest_lists(pruned)]
    np.testing.assert_allclose(np.asarray(pruned.scores), np.asarray(full.scores), atol=0.01)


def test_frames_with_many_candidates_searched_in_chunks_equal_one_step():
    """Automatic token_topk: a few frames with more candidates than a chunk (8) are searched in several steps
    (each growing the frame-start beam by a chunk of candidates); the n-best, scores and token frames equal one
    step over every candidate (token_topk = V - 1), with a word LM, a lexicon and look-ahead as well."""
    rng = np.random.default_rng(0)
    B, T, V = 3, 25, 20
    labels = np.where(rng.random((B, T)) < 0.6, 0, rng.integers(1, V, (B, T)))
    logits = rng.normal(size=(B, T, V)) + 7.0 * np.eye(V)[labels]
    logits[:, [4, 11]] = rng.normal(size=(B, 2, V)) * 0.3        # two flat frames: (nearly) every token a candidate
    lp = jax.nn.log_softmax(jnp.asarray(logits, jnp.float32), axis=-1)
    counts = np.asarray(((lp >= -4.0) & (jnp.arange(V) != 0)).sum(-1).max(0))
    assert counts.max() > 16 and np.sum(counts > 8) == 2          # three chunks of 8 in two frames
    pad = (np.arange(T)[None] >= np.array([25, 18, 9])[:, None]).astype(np.float32)
    words = [[t for t in rng.integers(1, V, rng.integers(1, 4)).tolist() if t != SPACE] or [1] for _ in range(12)]
    lex = make_lexicon(words, V, boundary_ids=[SPACE], unk_id=12)
    lm = random_lm(rng, 13)
    for kw in ({}, dict(lm=lm, lm_weight=0.7, lm_level="word", word_bonus=0.3, lexicon=lex, oov_penalty=-1.0,
                        lm_lookahead=make_lm_lookahead(lex, lm))):
        chunked = ctc_prefix_beam_search(lp, pad, 4, token_min_logp=-4.0, beam_prune_logp=-8.0, **kw)
        whole = ctc_prefix_beam_search(lp, pad, 4, token_min_logp=-4.0, beam_prune_logp=-8.0, token_topk=V - 1, **kw)
        assert nbest_lists(chunked) == nbest_lists(whole)
        np.testing.assert_array_equal(np.asarray(chunked.token_frames), np.asarray(whole.token_frames))
        np.testing.assert_allclose(np.asarray(chunked.lm), np.asarray(whole.lm), rtol=1e-6)


def test_lexicon_from_tokenizer_and_word_timestamps():
    tok = CharTokenizer.from_texts(["ab ba"])
    lex = lexicon_from_tokenizer(["ab", "ba"], tok, word_ids={"ab": 5, "ba": 6}, unk_id=0)
    space = tok.chars.index(" ") + 1
    assert np.flatnonzero(np.asarray(lex.boundary)).tolist() == [space]
    assert sorted(np.asarray(lex.word)[np.asarray(lex.word) >= 0].tolist()) == [5, 6]
    ids = tok.encode("ab ba")
    words = word_timestamps(ids, [2, 4, 7, 9, 12], boundary_ids=[space], frame_shift=0.04)
    assert [(tok.decode(w), s, e) for w, s, e in words] == [("ab", 0.08, 0.28), ("ba", 0.36, 0.52)]


def test_lexicon_from_sentencepiece_marks_word_starts():
    tok = SentencePieceTokenizer.train(["the cat sat on the mat", "a cat and a hat", "the hat sat"] * 5, 24)
    words = ["cat", "mat", "a", "the"]
    lex = lexicon_from_tokenizer(words, tok, unk_id=9)
    pieces = [tok.id_to_piece(i) for i in range(tok.vocab_size)]
    assert [pieces[i] for i in np.flatnonzero(np.asarray(lex.boundary))] == ["▁"]
    assert all(pieces[i].startswith("▁") and len(pieces[i]) > 1 for i in np.flatnonzero(np.asarray(lex.word_start)))
    for wid, w in enumerate(words):   # each spelling (after a bare "▁") leads from the root to its word id
        node = jnp.int32(0)
        for t in tok.encode(w):
            node = jnp.int32(0) if pieces[t] == "▁" else lexicon_child(lex, node, jnp.int32(t))
        assert int(lex.word[node]) == wid


def test_lexicon_dense_and_sparse_lookups_agree():
    rng = np.random.default_rng(0)
    words = [rng.integers(1, 7, rng.integers(1, 6)).tolist() for _ in range(40)]
    dense, sparse = (make_lexicon(words, 7, dense_limit=lim) for lim in (1 << 20, 0))
    assert dense.child.shape[0] > 0 and sparse.child.shape[0] == 0
    nodes = jnp.arange(-1, dense.word.shape[0])[:, None]
    toks = jnp.arange(7)[None]
    got_d, got_s = lexicon_child(dense, nodes, toks), lexicon_child(sparse, nodes, toks)
    np.testing.assert_array_equal(got_d, got_s)
    # walking each word from the root ends at a node that carries its id
    for i, w in enumerate(words):
        node = jnp.int32(0)
        for t in w:
            node = lexicon_child(sparse, node, jnp.int32(t))
        assert int(sparse.word[node]) == min(j for j, v in enumerate(words) if v == w)


def test_bad_input_names_the_argument():
    lp = jnp.zeros((1, 3, 4))
    for kwargs, name in [({"beam": 0}, "beam"), ({"nbest": 9, "beam": 2}, "nbest"), ({"blank_id": 4}, "blank_id"),
                         ({"lm_level": "char"}, "lm_level"), ({"constrain_to_lexicon": True}, "lexicon"),
                         ({"token_min_logp": 1.0}, "token_min_logp")]:
        with pytest.raises(ValueError, match=name):
            ctc_prefix_beam_search(lp, jnp.zeros((1, 3)), **kwargs)
    with pytest.raises(ValueError, match="paddings"):
        ctc_prefix_beam_search(lp, jnp.zeros((1, 2)))
    with pytest.raises(ValueError, match="words"):
        make_lexicon([[1, 9]], 4)
