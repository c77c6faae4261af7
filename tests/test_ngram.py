"""jasr.ngram / jasr.ngram_estimate against independent references.

- ARPA scores: KenLM 0.3.0's own numbers (tests/data/ngram/kenlm_scores.json, made by make_reference.py there),
  and a dict-based back-off scorer written here.
- Kneser-Ney: ARPA files written by KenLM's lmplz on the same corpora (tests/data/ngram/lmplz_*.arpa), and a
  direct implementation of the interpolated modified KN formulas written here (from counts defined on the text).
- The grammar FSA G: best-path scores through fsa_ops.intersect equal a brute force over back-off choices.
"""
import json
import math
import os
import random
from collections import defaultdict

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fsa_ops
from jasr.ngram import (NgramLM, advance_arrays, arpa_text, lm_grams, ngram_to_fsa, read_arpa,
                        write_arpa)
from jasr.ngram_estimate import estimate_kneser_ney, kneser_ney_discounts

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "ngram")
LN10 = math.log(10.0)
KENLM = json.load(open(os.path.join(DATA, "kenlm_scores.json")))


def data(name):
    return os.path.join(DATA, name)


def corpus(name):
    return open(data(name), encoding="utf-8").read().splitlines()


# ---------------------------------------------------------------------------------------------------------------
# an independent ARPA scorer: dicts of log10 values and the textbook back-off recursion


def parse_arpa_simple(text):
    probs, bows, order = {}, {}, 0
    section = 0
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("\\") and line.endswith("-grams:"):
            section = int(line[1:line.index("-")])
            order = max(order, section)
        elif line == "\\end\\":
            section = 0
        elif line and section:
            f = line.split()
            g = tuple(f[1:section + 1])
            probs[g] = float(f[0])
            if len(f) == section + 2:
                bows[g] = float(f[-1])
    return probs, bows, order


def backoff_log10(model, history, w):
    """log10 p(w | history): p(h w) if listed, else bow(h) + p(w | h[1:]); <unk> -100 if the model has none."""
    probs, bows, order = model
    h = tuple(history[-(order - 1):]) if order > 1 else ()
    acc = 0.0
    while True:
        if h + (w,) in probs:
            return acc + probs[h + (w,)]
        if not h:
            return acc + probs.get(("<unk>",), -100.0)
        acc += bows.get(h, 0.0)
        h = h[1:]


def simple_sentence_log10(model, words, vocab):
    words = [w if w in vocab else "<unk>" for w in words] + ["</s>"]
    hist, out = ["<s>"], []
    for w in words:
        out.append(backoff_log10(model, hist, w))
        hist.append(w)
    return out


# ---------------------------------------------------------------------------------------------------------------
# ARPA scoring against KenLM


@pytest.mark.parametrize("name", sorted(KENLM))
def test_arpa_scores_equal_kenlm(name):
    lm = read_arpa(data(name))
    for row in KENLM[name]:
        got = lm.score_words(row["sentence"].split()) / LN10
        np.testing.assert_allclose(got, row["full"], rtol=1e-6, atol=2e-6, err_msg=row["sentence"])
        plain = lm.score_sentence(row["sentence"], bos=False, eos=False) / LN10
        assert plain == pytest.approx(row["plain"], rel=1e-6, abs=2e-6), row["sentence"]


def test_advance_under_jit_batched_equals_kenlm():
    """All KenLM sentences of one model as a [B, T] batch, scored by a jitted scan over lm.advance."""
    lm = read_arpa(data("lmplz_o4.arpa"))
    rows = KENLM["lmplz_o4.arpa"]
    T = max(len(r["sentence"].split()) for r in rows) + 1
    ids = np.full((len(rows), T), lm.eos_id, np.int32)
    lengths = np.zeros(len(rows), np.int32)
    for b, r in enumerate(rows):
        w = lm.ids(r["sentence"].split())
        ids[b, :len(w)] = w
        lengths[b] = len(w)

    @jax.jit
    def score(lm, ids, lengths):
        def step(carry, x):
            states, total = carry
            t, w = x
            new, lp = lm.advance(states, w)
            live = t < lengths
            return (jnp.where(live, new, states), total + jnp.where(live, lp, 0.0)), lp
        init = (lm.start_state(lengths.shape), jnp.zeros(lengths.shape, jnp.float32))
        (states, total), per_word = jax.lax.scan(step, init, (jnp.arange(ids.shape[1]), ids.T))
        return total + lm.final(states), per_word.T

    total, per_word = score(lm, jnp.asarray(ids), jnp.asarray(lengths))
    for b, r in enumerate(rows):
        assert float(total[b]) / LN10 == pytest.approx(sum(r["full"]), rel=1e-5, abs=1e-5)
        np.testing.assert_allclose(np.asarray(per_word[b, :lengths[b]]) / LN10, r["full"][:-1], rtol=1e-6,
                                   atol=2e-6)


@pytest.mark.parametrize("name", ["handmade_nounk.arpa", "lmplz_o3.arpa", "lmplz_tiny_o3.arpa"])
def test_advance_equals_dict_backoff_on_random_text(name):
    text = open(data(name)).read()
    model = parse_arpa_simple(text)
    lm = read_arpa(text)
    vocab = set(lm.vocab.words)
    words = [w for w in lm.vocab.words if w not in ("<s>",)] + ["oov1"]
    rng = random.Random(0)
    host = lm.on_host()
    for _ in range(40):
        sent = [rng.choice(words) for _ in range(rng.randint(0, 9))]
        want = simple_sentence_log10(model, sent, vocab)
        np.testing.assert_allclose(lm.score_words(sent) / LN10, want, rtol=1e-6, atol=2e-6, err_msg=str(sent))
    # [B, K] shapes: every state against every word, on the host and under jit
    S, V = lm.num_states, lm.vocab_size
    states = np.repeat(np.arange(S, dtype=np.int32)[:, None], V, 1)
    wids = np.repeat(np.arange(V, dtype=np.int32)[None], S, 0)
    nh, lh = advance_arrays(host, states, wids, np)
    nj, lj = lm.advance(states, wids)
    np.testing.assert_array_equal(nh, np.asarray(nj))
    np.testing.assert_allclose(lh, np.asarray(lj), rtol=1e-6)
    assert nh.shape == lh.shape == (S, V) and nh.dtype == np.int32 and lh.dtype == np.float32


@pytest.mark.parametrize("name", ["handmade_nounk.arpa", "lmplz_o3.arpa", "lmplz_o4.arpa"])
def test_dense_table_equals_binary_search(name, monkeypatch):
    """Small models advance by their dense table; it holds exactly what the binary search computes (next state and
    ln p of every (state, word) pair, ids out of range as <unk>); above DENSE_MAX_ENTRIES a model has no table."""
    lm = read_arpa(data(name))
    assert lm.dense is not None and lm.dense[0].shape == (lm.num_states, lm.vocab_size)
    leaves, treedef = jax.tree_util.tree_flatten(lm)
    assert jax.tree_util.tree_unflatten(treedef, leaves).dense is not None
    monkeypatch.setattr("jasr.ngram.DENSE_MAX_ENTRIES", 0)
    plain = read_arpa(data(name))
    assert plain.dense is None
    S, V = lm.num_states, lm.vocab_size
    states = jnp.asarray(np.repeat(np.arange(S, dtype=np.int32)[:, None], V + 2, 1))
    wids = jnp.asarray(np.repeat(np.arange(-1, V + 1, dtype=np.int32)[None], S, 0))   # -1 and V: out of range
    step = jax.jit(lambda lm, s, w: lm.advance(s, w))
    nd, ld = step(lm, states, wids)
    nb, lb = step(plain, states, wids)
    np.testing.assert_array_equal(np.asarray(nd), np.asarray(nb))
    np.testing.assert_array_equal(np.asarray(ld), np.asarray(lb))
    np.testing.assert_array_equal(np.asarray(lm.final(states[:, 0])), np.asarray(plain.final(states[:, 0])))


def test_unknown_words():
    lm = read_arpa(data("handmade_nounk.arpa"))
    assert not lm.unk_in_model
    assert lm.ids(["a", "zzz"]).tolist() == [lm.vocab.index["a"], lm.unk_id]
    # KenLM's default: <unk> with log10 -100 when the model has none
    assert lm.score_words(["zzz"], eos=False)[0] / LN10 == pytest.approx(-100.0 + -0.5)  # bo(<s>) + p(<unk>)
    strict = read_arpa(data("handmade_nounk.arpa"), unk_log10_prob=None)
    assert strict.score_sentence("a zzz") == -np.inf
    assert np.isfinite(strict.score_sentence("a b"))
    # ids out of range score as <unk>
    _, lp = lm.advance(lm.start_state((2,)), jnp.array([-1, lm.vocab_size + 3]))
    _, lu = lm.advance(lm.start_state(()), lm.unk_id)
    np.testing.assert_allclose(np.asarray(lp), float(lu))
    # a model with <unk> uses its probability
    lm3 = read_arpa(data("lmplz_o3.arpa"))
    assert lm3.unk_in_model
    assert lm3.score_words(["zzz"], bos=False, eos=False)[0] == pytest.approx(
        float(np.asarray(lm3.unigram_logp)[lm3.unk_id]))


def test_start_state_final_and_pytree():
    lm = read_arpa(data("lmplz_o3.arpa"))
    s = lm.start_state((3, 2))
    assert s.shape == (3, 2) and s.dtype == jnp.int32
    sent = "one two three".split()
    st_ = lm.start_state(())
    total = 0.0
    for w in lm.ids(sent):
        st_, lp = lm.advance(st_, w)
        total += float(lp)
    total += float(lm.final(st_))
    assert total == pytest.approx(lm.score_sentence(sent), rel=1e-6)
    leaves, treedef = jax.tree_util.tree_flatten(lm)
    again = jax.tree_util.tree_unflatten(treedef, leaves)
    assert isinstance(again, NgramLM) and again.vocab is lm.vocab and again.start_id == lm.start_id


# ---------------------------------------------------------------------------------------------------------------
# ARPA reading / writing


@pytest.mark.parametrize("name", ["handmade_nounk.arpa", "lmplz_o4.arpa"])
def test_arpa_round_trip(tmp_path, name):
    lm = read_arpa(data(name))
    for out in (tmp_path / "lm.arpa", tmp_path / "lm.arpa.gz"):
        write_arpa(lm, out)
        again = read_arpa(out)
        assert again.counts() == lm.counts() and again.vocab.words == lm.vocab.words
        for k in ("unigram_logp", "state_backoff", "arc_logp"):
            np.testing.assert_allclose(np.asarray(getattr(again, k)), np.asarray(getattr(lm, k)), rtol=1e-6,
                                       err_msg=k)
        for k in ("unigram_next", "state_parent", "row_start", "arc_word", "arc_next"):
            np.testing.assert_array_equal(np.asarray(getattr(again, k)), np.asarray(getattr(lm, k)), err_msg=k)
    # same scores as the original file's (a written <unk> is not added)
    model = parse_arpa_simple(open(data(name)).read())
    text = arpa_text(lm)
    assert ("<unk>" in text) == lm.unk_in_model
    mine = parse_arpa_simple(text)
    assert set(mine[0]) == set(model[0])
    for g, p in model[0].items():
        assert mine[0][g] == pytest.approx(p, rel=1e-6, abs=1e-6)
        assert mine[1].get(g, 0.0) == pytest.approx(model[1].get(g, 0.0), rel=1e-6, abs=1e-6)


GOOD = open(data("handmade_nounk.arpa")).read()


@pytest.mark.parametrize("old, new, message", [
    ("\\data\\", "\\dada\\", "no \\data\\ line"),
    ("ngram 2=6", "ngram 2=x", "line 3: expected 'ngram N=COUNT'"),
    ("ngram 2=6", "ngram 3=6", "line 3: 'ngram 3=6'"),
    ("ngram 2=6", "ngram 2=7", "line 14: \\2-grams: has 6 entries, \\data\\ says ngram 2=7"),
    ("-0.6\ta b\t-0.05", "-0.6\ta b\t-0.05\t1", "line 17: a 2-gram line needs 3 or 4 fields"),
    ("-0.2\t<s> a b", "-0.2\t<s> a b\t-0.1", "line 23: a 3-gram line needs 4 fields"),
    ("-0.6\ta b", "-0.6x\ta b", "line 17: bad number"),
    ("-0.6\ta b", "nan\ta b", "line 17: log10 probability"),
    ("-0.4\tb a", "-0.4\ta b", "line 18: duplicate 2-gram 'a b'"),
    ("-0.4\tb a", "-0.4\tb e", "line 18: word 'e' is not a unigram"),
    ("-0.35\ta b c", "-0.35\tc a b", "line 24: the context 'c a' of this 3-gram is not a 2-gram"),
    ("\\end\\", "", "expected \\end\\"),
    ("\\3-grams:", "\\4-grams:", "line 22: expected \\3-grams:"),
    ("-1.3\td\t-0.3", "-1.3\tc\t-0.3", "line 12: duplicate unigram 'c'"),
])
def test_malformed_arpa_names_the_line(old, new, message):
    assert old in GOOD
    with pytest.raises(ValueError) as e:
        read_arpa(GOOD.replace(old, new, 1))
    assert message in str(e.value)


def test_arpa_preamble_and_counts_of_empty_order():
    text = "made by hand\n\n" + GOOD
    assert read_arpa(text).counts() == [7, 6, 3]  # 6 unigrams + the <unk> added
    with pytest.raises(ValueError, match="no </s> unigram"):
        read_arpa("\\data\\\nngram 1=2\n\n\\1-grams:\n-1\t<s>\n-1\ta\n\n\\end\\\n")
    with pytest.raises(FileNotFoundError):
        read_arpa(os.path.join(DATA, "no_such.arpa"))


# ---------------------------------------------------------------------------------------------------------------
# Kneser-Ney against lmplz


def words_of(lm):
    W = lm.vocab.words
    return {tuple(W[i] for i in g): v for table in lm_grams(lm) for g, v in table.items()}


@pytest.mark.parametrize("arpa, text, order, fallback", [
    ("lmplz_o2.arpa", "corpus.txt", 2, None), ("lmplz_o3.arpa", "corpus.txt", 3, None),
    ("lmplz_o4.arpa", "corpus.txt", 4, None), ("lmplz_tiny_o3.arpa", "tiny.txt", 3, (0.5, 1.0, 1.5))])
def test_kneser_ney_equals_lmplz(arpa, text, order, fallback):
    ref = words_of(read_arpa(data(arpa)))
    lm = estimate_kneser_ney(corpus(text), order, discount_fallback=fallback)
    mine = words_of(lm)
    assert set(mine) == set(ref)
    for g, (p, bo) in ref.items():
        assert mine[g][0] == pytest.approx(p, rel=2e-6, abs=1e-6), g
        assert (mine[g][1] or 0.0) == pytest.approx(bo or 0.0, abs=5e-5), g
    # and so the written ARPA scores as KenLM scores lmplz's file
    again = read_arpa(arpa_text(lm))
    for row in KENLM[arpa]:
        np.testing.assert_allclose(again.score_words(row["sentence"].split()) / LN10, row["full"], rtol=1e-5,
                                   atol=1e-5)


def test_kneser_ney_by_hand():
    """Corpus "a b", "a"; order 2; discounts (0.5, 1, 1.5) for both orders. Padded: <s> a b </s>, <s> a </s>.
    Bigrams (raw): <s> a 2, a b 1, a </s> 1, b </s> 1. Unigrams (distinct left words): a 1, b 1, </s> 2,
    <s> 0, <unk> 0: denominator 4, gamma() = (0.5 * 2 + 1 * 1) / 4 = 0.5, uniform 1 / (5 - 1).
    p(a) = p(b) = 0.5 / 4 + 0.5 / 4 = 0.25; p(</s>) = 1 / 4 + 0.125 = 0.375; p(<unk>) = 0.125.
    <s>: den 2, gamma 1 * 1 / 2 = 0.5: p(a | <s>) = (2 - 1) / 2 + 0.5 * 0.25 = 0.625.
    a: den 2, gamma (0.5 + 0.5) / 2 = 0.5: p(b | a) = 0.25 + 0.5 * 0.25 = 0.375, p(</s> | a) = 0.25 + 0.5 * 0.375.
    b: den 1, gamma 0.5: p(</s> | b) = 0.5 + 0.5 * 0.375 = 0.6875. Backoffs 0.5 for <s>, a, b; 1 for </s>."""
    lm = estimate_kneser_ney(["a b", "a"], 2, discounts=[(0.5, 1.0, 1.5)] * 2)
    got = words_of(lm)
    want = {("<unk>",): (0.125, 1.0), ("<s>",): (1.0, 0.5), ("</s>",): (0.375, 1.0), ("a",): (0.25, 0.5),
            ("b",): (0.25, 0.5), ("<s>", "a"): (0.625, None), ("a", "b"): (0.375, None),
            ("a", "</s>"): (0.4375, None), ("b", "</s>"): (0.6875, None)}
    assert set(got) == set(want)
    for g, (p, bo) in want.items():
        assert got[g][0] == pytest.approx(math.log(p), abs=1e-6), g
        assert got[g][1] == (None if bo is None else pytest.approx(math.log(bo), abs=1e-6)), g
    assert lm.score_sentence("a b") == pytest.approx(math.log(0.625 * 0.375 * 0.6875), abs=1e-6)
    assert lm.score_sentence("b") == pytest.approx(math.log(0.5 * 0.25 * 0.6875), abs=1e-6)  # unseen <s> b


def test_discounts_by_hand():
    # Chen & Goodman eq. 26: Y = 6 / (6 + 2 * 4) = 3/7; D1 = 1 - 2 Y 4/6, D2 = 2 - 3 Y 3/4, D3+ = 3 - 4 Y 1/3
    y = 3 / 7
    assert kneser_ney_discounts([6, 4, 3, 1], 2) == pytest.approx((1 - 2 * y * 4 / 6, 2 - 3 * y * 3 / 4,
                                                                   3 - 4 * y / 3))
    with pytest.raises(ValueError, match="no 1-gram has adjusted count 2"):
        kneser_ney_discounts([3, 0, 1, 1], 1)
    assert kneser_ney_discounts([3, 0, 1, 1], 1, fallback=(0.5, 1, 1.5)) == (0.5, 1.0, 1.5)
    with pytest.raises(ValueError, match="out of range"):
        kneser_ney_discounts([1, 1, 9, 0], 2)


def test_estimate_bad_input():
    with pytest.raises(ValueError, match="sentence 1: the special word <s>"):
        estimate_kneser_ney(["a b", "<s> a"], 2, discount_fallback=(0.5, 1, 1.5))
    lm = estimate_kneser_ney(["a b", "<s> a"], 2, discount_fallback=(0.5, 1, 1.5), skip_symbols=True)
    assert lm.vocab.words == ("<unk>", "<s>", "</s>", "a", "b")
    with pytest.raises(ValueError, match="order must be"):
        estimate_kneser_ney(["a"], 0)
    with pytest.raises(ValueError, match="no sentences"):
        estimate_kneser_ney([], 2)


# ---------------------------------------------------------------------------------------------------------------
# Kneser-Ney against a direct implementation of the formulas


class DirectKN:
    """Interpolated modified KN from its definition on the text <s> w_1 .. w_L </s> (one <s>), with given
    discounts: raw counts for order N and for n-grams starting with <s>, else the number of distinct left
    neighbours; p(w | h) = (a(h w) - D) / sum_x a(h x) + gamma(h) p(w | h[1:]), uniform 1 / (|V| - 1) below
    the unigrams; an unseen context backs off with weight 1."""

    def __init__(self, sentences, order, discounts):
        self.N, self.D = order, discounts
        self.sents = [["<s>"] + s.split() + ["</s>"] for s in sentences]
        self.vocab = ["<unk>", "<s>", "</s>"] + sorted({w for s in self.sents for w in s[1:-1]})
        self.raw, self.left = defaultdict(int), defaultdict(set)
        for s in self.sents:
            for n in range(1, order + 1):
                for i in range(len(s) - n + 1):
                    g = tuple(s[i:i + n])
                    self.raw[g] += 1
                    if i > 0:
                        self.left[g].add(s[i - 1])

    def a(self, g):
        if len(g) == self.N or g[0] == "<s>":
            return self.raw.get(g, 0) if g != ("<s>",) else 0
        return len(self.left.get(g, ()))

    def disc(self, n, c):
        return 0.0 if c == 0 else self.D[n - 1][min(c, 3) - 1]

    def p(self, h, w):
        n = len(h) + 1
        if n == 1 and w == "<s>":
            return 1.0
        counts = [self.a(h + (x,)) for x in self.vocab if not (n == 1 and x == "<s>")]
        den = sum(counts)
        lower = 1.0 / (len(self.vocab) - 1) if n == 1 else self.p(h[1:], w)
        if den == 0:
            return lower
        gamma = sum(self.disc(n, c) for c in counts) / den
        c = self.a(h + (w,))
        return (c - self.disc(n, c)) / den + gamma * lower

    def sentence_ln(self, words):
        hist = ["<s>"]
        total = 0.0
        for w in [w if w in self.vocab else "<unk>" for w in words] + ["</s>"]:
            h = tuple(hist[-(self.N - 1):]) if self.N > 1 else ()
            total += math.log(self.p(h, w))
            hist.append(w)
        return total


def test_kneser_ney_equals_direct_formulas_tiny():
    sents = corpus("tiny.txt")
    D = [(0.5, 1.0, 1.5), (0.4, 0.9, 1.3), (0.7, 1.3, 2.0)]
    lm = estimate_kneser_ney(sents, 3, discounts=D)
    ref = DirectKN(sents, 3, D)
    for s in ["a b c", "", "c c c c", "b a d a b", "a b c a b", "c b a a b c a"]:
        assert lm.score_sentence(s) == pytest.approx(ref.sentence_ln(s.split()), rel=1e-5, abs=1e-5), s


sentence_st = st.lists(st.sampled_from("abcde"), min_size=0, max_size=6).map(" ".join)


@settings(max_examples=25, deadline=None)
@given(sents=st.lists(sentence_st, min_size=1, max_size=8), order=st.integers(1, 4), seed=st.integers(0, 99))
def test_kneser_ney_property_sums_to_one_and_equals_direct(sents, order, seed):
    rng = random.Random(seed)
    D = [tuple(sorted(rng.uniform(0.1, 0.95) * k for k in (1, 2, 3))) for _ in range(order)]
    D = [(min(d[0], 1.0), min(d[1], 2.0), d[2]) for d in D]
    lm = estimate_kneser_ney(sents, order, discounts=D)
    host = lm.on_host()
    # every state's distribution over the vocabulary without <s> (</s> and <unk> included) sums to 1
    S, V = lm.num_states, lm.vocab_size
    _, lp = advance_arrays(host, np.arange(S, dtype=np.int32)[:, None], np.arange(V, dtype=np.int32)[None], np)
    lp = np.delete(lp.astype(np.float64), lm.bos_id, axis=1)
    np.testing.assert_allclose(np.exp(lp).sum(axis=1), 1.0, atol=2e-5)
    # sentences (also unseen ones) score as the direct formulas say
    ref = DirectKN(sents, order, D)
    for s in sents[:3] + [" ".join(rng.choice("abcdef") for _ in range(rng.randint(0, 5)))]:
        assert lm.score_sentence(s) == pytest.approx(ref.sentence_ln(s.split()), rel=1e-5, abs=1e-5), s


@settings(max_examples=15, deadline=None)
@given(sents=st.lists(sentence_st, min_size=1, max_size=10), order=st.integers(2, 3))
def test_kneser_ney_closed_form_or_fallback_sums_to_one(sents, order):
    lm = estimate_kneser_ney(sents, order, discount_fallback=(0.5, 1.0, 1.5))
    _, lp = advance_arrays(lm.on_host(), np.arange(lm.num_states, dtype=np.int32)[:, None],
                           np.arange(lm.vocab_size, dtype=np.int32)[None], np)
    lp = np.delete(lp.astype(np.float64), lm.bos_id, axis=1)
    np.testing.assert_allclose(np.exp(lp).sum(axis=1), 1.0, atol=2e-5)


# ---------------------------------------------------------------------------------------------------------------
# the grammar FSA


def best_backoff_path_log10(model, words):
    """Max over all back-off choices (the paths of a back-off acceptor) of the sentence's log10 score, and
    whether the LM's own choice (the longest existing n-gram at each word) is among the best."""
    probs, bows, order = model
    words = list(words) + ["</s>"]

    def go(hist, i):
        if i == len(words):
            return 0.0
        w = words[i]
        best, acc = -math.inf, 0.0
        h = tuple(hist[-(order - 1):]) if order > 1 else ()
        while True:
            if h + (w,) in probs:
                best = max(best, acc + probs[h + (w,)] + go(list(h + (w,)), i + 1))
            if not h:
                break
            acc += bows.get(h, 0.0)
            h = h[1:]
        return best

    return go(["<s>"], 0)


def g_scores(G, table, sentences):
    """Best-path (tropical) scores of word sequences through G: intersect with linear FSAs, one batched call."""
    paths = []
    for words in sentences:
        lin = fsa_ops.arc_sort(fsa_ops.linear_fsa([table[w] for w in words]))
        paths.append(fsa_ops.top_sort(fsa_ops.connect(fsa_ops.intersect(lin, G))))
    assert all(int(p.num_states) > 0 for p in paths)
    vec = fsa_ops.create_fsa_vec(paths)
    return np.asarray(fsa_ops.get_tot_scores(vec, use_double_scores=False, log_semiring=False)).reshape(-1)


@pytest.mark.parametrize("name", ["handmade_nounk.arpa", "lmplz_tiny_o3.arpa", "lmplz_o3.arpa"])
def test_grammar_fsa_best_paths(name):
    text = open(data(name)).read()
    model = parse_arpa_simple(text)
    lm = read_arpa(text)
    G = ngram_to_fsa(lm)
    table = lm.symbol_table()
    assert int(G.num_states) == lm.num_states + 1
    in_model = [w for w in lm.vocab.words if w not in ("<s>", "</s>") and (w != "<unk>" or lm.unk_in_model)]
    rng = random.Random(1)
    sentences = [[]] + [[rng.choice(in_model) for _ in range(rng.randint(1, 6))] for _ in range(25)]
    if name == "lmplz_o3.arpa":
        sentences += [r["sentence"].split() for r in KENLM[name] if all(w in lm.vocab for w in r["sentence"].split())]
    exact_best = 0
    for words, got in zip(sentences, g_scores(G, table, sentences) / LN10):
        best = best_backoff_path_log10(model, words)
        assert got == pytest.approx(best, rel=1e-5, abs=1e-5), words
        lm_score = lm.score_sentence(words) / LN10
        assert got >= lm_score - 1e-5
        if abs(best - sum(simple_sentence_log10(model, words, set(lm.vocab.words)))) < 1e-9:
            exact_best += 1
            assert got == pytest.approx(lm_score, rel=1e-5, abs=1e-5), words
    assert exact_best >= len(sentences) // 3


def test_grammar_fsa_word_table_backoff_label_and_compose():
    lm = read_arpa(data("handmade_nounk.arpa"))
    table = fsa_ops.SymbolTable.from_str("<eps> 0\na 1\nb 2\nc 3\n#0 4\n")  # no 'd': its n-grams are skipped
    G = ngram_to_fsa(lm, table, backoff_label=4, aux_labels=True)
    np.testing.assert_array_equal(np.asarray(G.attrs["aux_labels"]), np.asarray(G.label))
    labels = set(np.asarray(G.label).tolist())
    assert labels <= {-1, 1, 2, 3, 4} and 4 in labels and 0 not in labels
    with pytest.raises(ValueError, match="'d' of the LM is not in word_table"):
        ngram_to_fsa(lm, table, oov="error")
    # epsilon backoff; L maps tokens 10 + k to word k (a one-state lexicon), compose(L, G) scores as G
    G0 = ngram_to_fsa(lm, table)
    L = fsa_ops.Fsa.from_str("0 0 11 1 0\n0 0 12 2 0\n0 0 13 3 0\n0 1 -1 -1 0\n1", acceptor=False)
    LG = fsa_ops.compose(fsa_ops.arc_sort(L), G0)
    lin = fsa_ops.arc_sort(fsa_ops.linear_fsa([11, 12, 13]))
    path = fsa_ops.top_sort(fsa_ops.connect(fsa_ops.intersect(lin, fsa_ops.arc_sort(LG))))
    got = float(fsa_ops.get_tot_scores(path, use_double_scores=False, log_semiring=False))
    assert got == pytest.approx(g_scores(G0, {"a": 1, "b": 2, "c": 3}, [["a", "b", "c"]])[0], abs=1e-5)
    assert got == pytest.approx(lm.score_sentence("a b c"), abs=1e-5)
