"""jasr.hlg / jasr.graph_decoding: lang building and HLG decoding against brute force over all frame labellings."""
import itertools
import math

import jax
import numpy as np
import pytest

from fsa_ops import (SymbolTable, arc_sort, connect, create_fsa_vec, get_tot_scores, intersect, linear_fsa,
                     shortest_path, top_sort)
from jasr import graph_decoding as gd
from jasr import hlg
from jasr.ngram import read_arpa
from jasr.tokenizers import CharTokenizer

TOKENS = "<blk> 0\na 1\nb 2\nc 3\n"
# a homophone (C / SEA on "c"), shared prefixes (a < a b, c < c a), two spellings of SEA with probabilities
LEXICONP = "A 1.0 a\nAB 1.0 a b\nC 1.0 c\nSEA 0.6 c\nSEA 0.4 c a\nBC 1.0 b c\n"
ARPA = """\\data\\
ngram 1=7
ngram 2=4

\\1-grams:
-1.0 </s>
-99 <s> -0.3
-0.7 A -0.2
-0.8 AB -0.25
-0.9 C -0.3
-0.9 SEA -0.2
-1.1 BC -0.1

\\2-grams:
-0.2 <s> A
-0.3 A BC
-0.25 C </s>
-0.4 AB SEA

\\end\\
"""
# the rescoring LM: other words preferred (no backoff path beats an n-gram in either model)
ARPA2 = """\\data\\
ngram 1=7
ngram 2=5

\\1-grams:
-0.8 </s>
-99 <s> -0.2
-1.2 A -0.3
-0.6 AB -0.1
-1.3 C -0.2
-0.5 SEA -0.3
-0.9 BC -0.2

\\2-grams:
-0.3 <s> SEA
-0.2 SEA </s>
-0.3 AB BC
-0.4 BC </s>
-0.5 <s> C

\\end\\
"""
B, T, V = 3, 5, 4
SEARCH = dict(search_beam=50.0, output_beam=50.0, min_active_states=100, max_active_states=1000)


@pytest.fixture(scope="module")
def lang():
    return hlg.make_lang(hlg.read_lexicon(LEXICONP, with_probs=True), SymbolTable.from_str(TOKENS))


@pytest.fixture(scope="module")
def lms():
    return read_arpa(ARPA), read_arpa(ARPA2)


@pytest.fixture(scope="module")
def graph(lang, lms):
    return hlg.compile_hlg(lang, lms[0])


@pytest.fixture(scope="module")
def inputs():
    rng = np.random.default_rng(3)
    lp = np.log(rng.dirichlet(np.ones(V) * 0.5, size=(B, T))).astype(np.float32)
    pads = np.zeros((B, T), np.float32)
    pads[1, 4:] = 1.0
    pads[2, 3:] = 1.0
    return lp, pads


def segmentations(lang, toks):
    """(words, pron score) for every way the lexicon spells the token sequence."""
    if not toks:
        yield (), 0.0
        return
    for w, spelled, sc in lang.entries:
        ids = tuple(lang.tokens[t] for t in spelled)
        if toks[:len(ids)] == ids:
            for rest, s in segmentations(lang, toks[len(ids):]):
                yield (w,) + rest, sc + s


def brute_force(lang, lp, n, lm, star=False):
    """words -> (best am + pron + LM score, am, pron, labelling) over every labelling of the first n frames.

    `star`: each token sequence read only as its best words (by pron + LM score): the pairs that a tropical LG is
    sure to keep (k2's remove_epsilon may drop a homophone reading that loses to another on the same token
    sequence, so a lattice's best path for words W lies between the `star` and the full reference)."""
    out, lm_cache = {}, {}
    for seq in itertools.product(range(lp.shape[1]), repeat=n):
        toks = tuple(k for i, k in enumerate(seq) if k and (i == 0 or seq[i - 1] != k))
        am = float(sum(lp[t, k] for t, k in enumerate(seq)))
        reads = []
        for words, pron in segmentations(lang, toks):
            if words not in lm_cache:
                lm_cache[words] = lm.score_sentence(list(words))
            reads.append((pron + lm_cache[words], words, pron))
        for g, words, pron in ([max(reads)] if star and reads else reads):      # (no words: G's <s> </s> path)
            if am + g > out.get(words, (-math.inf,))[0]:
                out[words] = (am + g, am, pron, seq)
    return out


def spans(lang, words, seq):
    """(first, last) frame of each word in a labelling (tokens split by the lexicon, blanks excluded)."""
    emis = []
    for t, k in enumerate(seq):
        if k and (t == 0 or seq[t - 1] != k):
            emis.append([k, t, t])
        elif k:
            emis[-1][2] = t
    out, pos = [], 0
    for w in words:
        sp = next(tuple(lang.tokens[x] for x in s) for ww, s, _ in lang.entries if ww == w and tuple(
            lang.tokens[x] for x in s) == tuple(e[0] for e in emis[pos:pos + len(s)]))
        out.append((emis[pos][1], emis[pos + len(sp) - 1][2]))
        pos += len(sp)
    return tuple(out)


@pytest.fixture(scope="module")
def references(lang, inputs, lms):
    lp, pads = inputs
    return [(brute_force(lang, lp[b], int(T - pads[b].sum()), lms[0]),
             brute_force(lang, lp[b], int(T - pads[b].sum()), lms[0], star=True)) for b in range(B)]


def test_lang_tables_and_disambiguation(lang, tmp_path):
    assert lang.disambig_entries == (("A", ("a", "#1"), 0.0), ("AB", ("a", "b"), 0.0),
                                     ("C", ("c", "#1"), 0.0), ("SEA", ("c", "#2"), pytest.approx(math.log(0.6))),
                                     ("SEA", ("c", "a"), pytest.approx(math.log(0.4))), ("BC", ("b", "c"), 0.0))
    assert lang.num_tokens == 4 and lang.max_disambig == 2
    assert [lang.tokens[f"#{k}"] for k in range(3)] == [4, 5, 6]
    assert lang.words.to_str().split() == "<eps> 0 A 1 AB 2 C 3 SEA 4 BC 5 #0 6 <s> 7 </s> 8".split()
    assert hlg.read_lexicon(hlg.lexicon_text(lang.entries, with_probs=True), with_probs=True)[3][2] == \
        pytest.approx(math.log(0.6), abs=1e-5)
    L = hlg.lexicon_fst(lang)
    assert sorted(np.asarray(L.aux_labels)[np.asarray(L.label) == 4].tolist()) == [6]     # the #0:#0 loop
    tok = CharTokenizer.from_texts(["one two"])
    char = hlg.lang_from_tokenizer(["one", "two", "on"], tok)
    assert char.boundary_ids == (tok.chars.index(" ") + 1,) and char.tokens[char.boundary_ids[0]] == hlg.SPACE
    assert char.disambig_entries[2] == ("on", ("o", "n", "#1"), 0.0)
    # the lang directory round trip (icefall's files plus word_boundary.txt)
    for lg in (lang, hlg.lang_from_tokenizer(["one", "two", "on"], tok, word_boundary="required")):
        d = tmp_path / str(len(lg.entries))
        hlg.save_lang(lg, d)
        assert {p.name for p in d.iterdir()} >= {"lexicon.txt", "lexicon_disambig.txt", "tokens.txt", "words.txt"}
        back = hlg.load_lang(d)
        assert [e[:2] for e in back.disambig_entries] == [e[:2] for e in lg.disambig_entries]
        assert [e[2] for e in back.entries] == pytest.approx([e[2] for e in lg.entries], abs=1e-12)
        assert back.tokens == lg.tokens
        assert back.words == lg.words and back.boundary_ids == lg.boundary_ids
        assert back.word_boundary == lg.word_boundary


def test_ngram_grammar_scores_equal_lm(lang, lms):
    """G's best path for a sentence (backoff #0 read as epsilon) equals lm.score_sentence, for the test LMs and for
    an LM that lacks lexicon words (they take its <unk> arcs)."""
    unk_lm = read_arpa("\\data\\\nngram 1=5\nngram 2=1\n\n\\1-grams:\n-1 </s>\n-99 <s> -0.5\n-0.7 A -0.2\n"
                       "-1.5 <unk> -0.1\n-0.4 C -0.3\n\n\\2-grams:\n-0.2 A <unk>\n\n\\end\\\n")
    sents = [[], ["A"], ["A", "BC"], ["AB", "SEA"], ["C", "C", "SEA"], ["BC", "AB", "A"]]
    paths, exp = [], []
    for lm in (*lms, unk_lm):
        G = hlg.grammar_fsa(lang, lm)
        lab = np.asarray(G.label).copy()
        lab[lab == lang.first_word_disambig_id] = 0
        G = arc_sort(G.replace(label=lab))
        for sent in sents:
            paths.append(top_sort(connect(intersect(G, linear_fsa([lang.words[w] for w in sent])))))
            exp.append(lm.score_sentence(sent))
    best = get_tot_scores(create_fsa_vec(paths), log_semiring=False, use_double_scores=False)
    np.testing.assert_allclose(np.asarray(best), exp, atol=1e-4)


def test_one_best_equals_brute_force(lang, graph, inputs, references):
    lp, pads = inputs
    hyps = gd.one_best(graph, lp, pads, **SEARCH)
    assert len(hyps) == B
    for h, (ref, _) in zip(hyps, references):
        words, (score, am, pron, seq) = max(ref.items(), key=lambda kv: kv[1][0])
        assert h.words == words and h.text == " ".join(words)
        assert h.word_ids == tuple(lang.words[w] for w in words)
        assert h.total_score == pytest.approx(score, abs=1e-4)
        assert h.am_score == pytest.approx(am, abs=1e-4)
        assert h.lm_score == pytest.approx(score - am, abs=1e-4)
        assert h.tokens == tuple(k for i, k in enumerate(seq) if k and (i == 0 or seq[i - 1] != k))
        assert h.word_frames == spans(lang, words, seq)
    # the frame-synchronous best path equals fsa_ops.shortest_path on the same lattice
    lat = gd.get_lattice(graph, lp, pads, **SEARCH)
    fast, slow = gd.frame_shortest_path(lat, T), shortest_path(lat, use_double_scores=False)
    for name in ("num_arcs", "num_states"):
        np.testing.assert_array_equal(getattr(fast, name), getattr(slow, name))
    n = int(np.max(fast.num_arcs))
    for name in ("label", "score"):
        np.testing.assert_array_equal(np.asarray(getattr(fast, name))[:, :n], np.asarray(getattr(slow, name))[:, :n])
    for name in ("tokens", "frame", "lm_scores"):
        np.testing.assert_array_equal(np.asarray(fast.attrs[name])[:, :n], np.asarray(slow.attrs[name])[:, :n])
    assert fast.aux_labels.tolist() == [r[:n] for r in slow.aux_labels.tolist()]
    # the graph scaled in the search (lm_scale): the best of am + 0.5 (pron + LM); a token sequence's best
    # reading does not depend on the scale
    for h, (_, star) in zip(gd.one_best(graph, lp, pads, lm_scale=0.5, **SEARCH), references):
        words, (score, am, _, _) = max(star.items(), key=lambda kv: kv[1][1] + 0.5 * (kv[1][0] - kv[1][1]))
        assert h.words == words and h.am_score == pytest.approx(am, abs=1e-4)
        assert h.lm_score == pytest.approx(score - am, abs=1e-4)
        assert h.total_score == pytest.approx(am + 0.5 * (score - am), abs=1e-4)


@pytest.mark.parametrize("modified", [False, True])
def test_peaky_alignment_words_and_frames(lang, lms, modified):
    """Near one-hot log-probs for the labelling a _ b b c: standard and modified CTC topologies give the
    brute-force best reading of the tokens a b c and the frames of its words."""
    seq = (1, 0, 2, 2, 3)
    lp = np.full((B, T, V), np.log(0.01 / (V - 1)), np.float32)
    lp[:, np.arange(T), seq] = np.log(0.99)
    g = hlg.compile_hlg(lang, lms[0], modified=modified)
    hyps = gd.one_best(g, lp, np.zeros((B, T), np.float32), **SEARCH)
    ref = brute_force(lang, lp[0], T, lms[0], star=True)
    words, (score, _, _, best_seq) = max(ref.items(), key=lambda kv: kv[1][0])
    assert best_seq == seq and hyps[0] == hyps[1] == hyps[2]
    assert hyps[0].words == words and hyps[0].tokens == (1, 2, 3)
    assert hyps[0].total_score == pytest.approx(score, abs=1e-4)
    assert hyps[0].word_frames == spans(lang, words, seq)


def test_nbest_lists_equal_brute_force(graph, inputs, references):
    lp, pads = inputs
    lists = gd.nbest(graph, lp, pads, jax.random.PRNGKey(0), num_paths=300, nbest_scale=0.2, **SEARCH)
    for hs, (ref, star) in zip(lists, references):
        got = {h.words: h.total_score for h in hs}
        # a set of real word sequences that holds the best ones (sequences with a single alignment among ~10^3
        # may be missed by sampling), each with its best lattice score
        assert set(got) <= set(ref) and len(got) >= 10
        assert set(sorted(star, key=lambda w: -star[w][0])[:5]) <= set(got)
        for w, s in got.items():
            assert star.get(w, (-math.inf,))[0] - 1e-4 <= s <= ref[w][0] + 1e-4
        exact = [w for w in got if w in star and star[w][0] == pytest.approx(ref[w][0], abs=1e-6)]
        assert len(exact) >= 5 and all(got[w] == pytest.approx(ref[w][0], abs=1e-4) for w in exact)
        assert [h.total_score for h in hs] == sorted(got.values(), reverse=True)


def test_rescoring_equals_brute_force(lang, graph, inputs, references, lms):
    lp, pads = inputs
    lm2 = lms[1]
    scales = [1.0, 0.5]
    nb = gd.nbest_rescoring(graph, lp, pads, lm2, jax.random.PRNGKey(1), lm_scales=scales, num_paths=300,
                            nbest_scale=0.2, **SEARCH)
    wl = gd.whole_lattice_rescoring(graph, lp, pads, lm2, lm_scales=scales, **SEARCH)
    # the n-best list rescored is the one `nbest` samples with the same key (checked against brute force above)
    sampled = [hs for hs in gd.nbest(graph, lp, pads, jax.random.PRNGKey(1), num_paths=300,
                                                        nbest_scale=0.2, **SEARCH)]
    assert sorted(nb) == sorted(wl) == ["lm_scale_0.5", "lm_scale_1.0"]
    exact = 0
    for s in scales:
        for b in range(B):
            n = int(T - pads[b].sum())
            # n-best: each sampled word sequence keeps the acoustic score of its best lattice path
            exp_nb = max((h.am_score + s * lm2.score_sentence(list(h.words)), h.words) for h in sampled[b])
            h = nb[f"lm_scale_{s}"][b]
            assert h.words == exp_nb[1] and h.total_score == pytest.approx(exp_nb[0], abs=1e-4)
            assert h.lm_score == pytest.approx(lm2.score_sentence(list(h.words)), abs=1e-4)
            # whole lattice: the best acoustic path of any word sequence plus the new LM (between the readings
            # the LG is sure to keep and all readings)
            full, star = brute_force(lang, lp[b], n, lm2), brute_force(lang, lp[b], n, lms[0], star=True)
            lo = max(am + s * lm2.score_sentence(list(w)) for w, (_, am, _, _) in star.items())
            hi = max(am + s * lm2.score_sentence(list(w)) for w, (_, am, _, _) in full.items())
            h = wl[f"lm_scale_{s}"][b]
            assert lo - 1e-4 <= h.total_score <= hi + 1e-4
            assert h.total_score == pytest.approx(h.am_score + s * lm2.score_sentence(list(h.words)), abs=1e-4)
            assert h.am_score <= full[h.words][1] + 1e-4
            if lo == pytest.approx(hi, abs=1e-6):
                assert h.words == max(full, key=lambda w: full[w][1] + s * lm2.score_sentence(list(w)))
                exact += 1
    assert exact >= 1


def test_attention_rescoring_equals_brute_force(graph, inputs, references):
    lp, pads = inputs
    bonus = {(3,): 2.0, (1, 2): 1.5}          # the "decoder" likes "c" and "a b"

    def score_fn(token_seqs, utt):
        assert len(utt) == len(token_seqs)
        return np.array([bonus.get(tuple(s), -1.0) for s in token_seqs])
    out = gd.attention_rescoring(graph, lp, pads, score_fn, jax.random.PRNGKey(2), num_paths=300, nbest_scale=0.2,
                                 ngram_lm_scales=[0.5], attention_scales=[1.0, 3.0], **SEARCH)
    assert sorted(out) == ["ngram_lm_scale_0.5_attention_scale_1.0", "ngram_lm_scale_0.5_attention_scale_3.0"]
    lists = gd.nbest(graph, lp, pads, jax.random.PRNGKey(2), num_paths=300, nbest_scale=0.2, **SEARCH)
    for a_s in (1.0, 3.0):
        for b, (ref, _) in enumerate(references):
            # over the same n-best list (checked against brute force above): am + 0.5 graph lm + a_s attention
            exp = max((h.am_score + 0.5 * h.lm_score + a_s * bonus.get(h.tokens, -1.0), h.words) for h in lists[b])
            h = out[f"ngram_lm_scale_0.5_attention_scale_{a_s}"][b]
            assert h.words == exp[1] and h.total_score == pytest.approx(exp[0], abs=1e-4)
            assert h.attention_score == bonus.get(h.tokens, -1.0) and h.am_score <= ref[h.words][1] + 1e-4
    # the sequences given to score_fn: token_seq_fn's (here the words' lengths), by default canonical tokens
    seen = []
    gd.attention_rescoring(graph, lp, pads, lambda seqs, utt: seen.extend(seqs) or np.zeros(len(seqs)),
                           jax.random.PRNGKey(2), num_paths=300, nbest_scale=0.2, ngram_lm_scales=[1.0],
                           attention_scales=[1.0], token_seq_fn=lambda h: [len(w) for w in h.words], **SEARCH)
    assert sorted(map(tuple, seen)) == sorted(tuple(len(w) for w in h.words) for hs in lists for h in hs)
    assert gd.canonical_tokens([1, 1, 5, 1, 1, 6, 1], {1}) == [5, 1, 6] and gd.canonical_tokens([1], {1}) == []


def test_batch_equals_single_and_padding_ignored(graph, inputs):
    lp, pads = inputs
    noisy = lp.copy()
    noisy[pads > 0.5] = np.log(np.full(V, 1.0 / V))[None] * 0 - 50.0   # garbage in padded frames
    batch = gd.one_best(graph, noisy, pads, **SEARCH)
    assert batch == gd.one_best(graph, lp, pads, **SEARCH)
    for b in range(B):
        single = gd.one_best(graph, lp[b:b + 1], pads[b:b + 1], **SEARCH)
        assert single == [batch[b]]
    # an utterance without frames is an error naming it (k2's DenseFsaVec needs a frame per segment)
    empty = pads.copy()
    empty[2] = 1.0
    with pytest.raises(ValueError, match="paddings: utterance 2 has no valid frame"):
        gd.one_best(graph, lp, empty, **SEARCH)


def test_one_word_grammar_char_model():
    """FSDD style: a character tokenizer with a space token, a grammar of exactly one word per utterance."""
    words = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "zero", "oh"]
    tok = CharTokenizer.from_texts([" ".join(words)])
    rng = np.random.default_rng(0)
    lp = np.log(rng.dirichlet(np.ones(tok.vocab_size) * 0.3, size=(4, 12))).astype(np.float32)
    pads = np.zeros((4, 12), np.float32)
    pads[2, 9:] = 1.0
    pads[3, 1:] = 1.0            # one frame: no word fits (an empty hypothesis, scores -inf)
    search = dict(search_beam=20.0, output_beam=8.0, min_active_states=10, max_active_states=40)
    # the grammar as a list of sentences (boundaries required between words) and as OpenFst text with word
    # symbols (optional boundaries)
    text = "".join(f"0 1 {w}\n" for w in words) + "1\n"
    for mode, grammar in (("required", [[w] for w in words]), ("optional", text)):
        lang = hlg.lang_from_tokenizer(words, tok, word_boundary=mode)
        g = hlg.compile_hlg(lang, grammar)
        hyps = gd.one_best(g, lp, pads, **search)
        assert hyps[3].words == () and hyps[3].total_score == -math.inf
        for h, n in zip(hyps[:3], (12, 12, 9)):
            assert len(h.words) == 1 and h.words[0] in words
            spelled = tuple(i for i in h.tokens if i not in lang.boundary_ids)
            assert tok.decode(list(spelled)) == h.words[0]
            assert 0 <= h.word_frames[0][0] <= h.word_frames[0][1] < n
    # a free word loop with required boundaries: any number of words, a space between two words
    lang = hlg.lang_from_tokenizer(words, tok, word_boundary="required")
    hyps = gd.one_best(hlg.compile_hlg(lang, None), lp, pads, **search)[:3]
    assert max(len(h.words) for h in hyps) >= 2
    for h in hyps:
        assert h.words and all(w in words for w in h.words)
        assert tok.decode(gd.canonical_tokens(h.tokens, set(lang.boundary_ids))) == h.text


def test_errors_name_the_argument(lang, graph, inputs):
    lp, pads = inputs
    with pytest.raises(ValueError, match="log_probs: vocab size 5"):
        gd.one_best(graph, np.zeros((B, T, 5), np.float32), pads)
    with pytest.raises(ValueError, match="paddings"):
        gd.one_best(graph, lp, pads[:, :3])
    with pytest.raises(ValueError, match="paddings: padded frames"):
        gd.one_best(graph, lp, np.array([[1, 0, 0, 0, 0]] * B, np.float32))
    with pytest.raises(ValueError, match="grammar\\[0\\].*'D' is not in the lexicon"):
        hlg.compile_hlg(lang, [["A", "D"]])
    with pytest.raises(ValueError, match="key"):
        gd.nbest(graph, lp, pads, None)
    with pytest.raises(TypeError, match="graph"):
        gd.one_best(object(), lp, pads)
    with pytest.raises(ValueError, match="entries\\[0\\]: token 'z'"):
        hlg.make_lang([("X", ("z",), 0.0)], SymbolTable.from_str(TOKENS))
    with pytest.raises(ValueError, match="lexicon line 2: the probability must be in"):
        hlg.read_lexicon("A 1.0 a\nB 1.5 b\n", with_probs=True)
    with pytest.raises(ValueError, match="lexicon line 1: expected a word and at least one token"):
        hlg.read_lexicon("A\n")
    with pytest.raises(FileNotFoundError, match="no such file"):
        hlg.read_lexicon("missing/lexicon.txt")
    with pytest.raises(ValueError, match="L o G is empty"):
        hlg.compile_lg(lang, "0 1 A 0\n")            # no final state: no sentence
    with pytest.raises(ValueError, match="lm_scales"):
        gd.whole_lattice_rescoring(graph, lp, pads, read_arpa(ARPA2), lm_scales=[0.0])


ARPA3 = """\\data\\
ngram 1=6
ngram 2=3

\\1-grams:
-0.9 </s>
-99 <s> -0.2
-0.8 A -0.3
-1.0 BA -0.2
-0.7 CA -0.1
-1.2 CB -0.3

\\2-grams:
-0.3 <s> CB
-0.2 CB A
-0.4 A </s>

\\end\\
"""


def test_word_loop_and_rescoring_exact():
    """A prefix-free lexicon (one reading per token sequence): the free word loop's one-best is the best acoustic
    labelling that spells words, and both rescorings equal brute force exactly."""
    lang = hlg.make_lang(hlg.read_lexicon("A a\nBA b a\nCA c a\nCB c b\n"), SymbolTable.from_str(TOKENS))
    assert lang.max_disambig == 0
    g = hlg.compile_hlg(lang, None)
    lm = read_arpa(ARPA3)
    flat = read_arpa("\\data\\\nngram 1=6\n\n\\1-grams:\n0 </s>\n-99 <s>\n0 A\n0 BA\n0 CA\n0 CB\n\n\\end\\\n")
    rng = np.random.default_rng(5)
    lp = np.log(rng.dirichlet(np.ones(V) * 0.5, size=(B, T))).astype(np.float32)
    pads = np.zeros((B, T), np.float32)
    pads[0, 4:] = 1.0
    first = gd.one_best(g, lp, pads, **SEARCH)
    wl = gd.whole_lattice_rescoring(g, lp, pads, lm, lm_scales=[0.7], **SEARCH)["lm_scale_0.7"]
    nb = gd.nbest_rescoring(g, lp, pads, lm, jax.random.PRNGKey(4), lm_scales=[0.7], num_paths=300, nbest_scale=0.2,
                            **SEARCH)["lm_scale_0.7"]
    lists = gd.nbest(g, lp, pads, jax.random.PRNGKey(4), num_paths=300, nbest_scale=0.2, **SEARCH)
    for b in range(B):
        ref = brute_force(lang, lp[b], int(T - pads[b].sum()), flat)       # LM score 0: acoustic only
        words, (am, *_) = max(ref.items(), key=lambda kv: kv[1][0])
        assert first[b].words == words and first[b].total_score == pytest.approx(am, abs=1e-4)
        assert first[b].lm_score == 0.0
        exp = max((a + 0.7 * lm.score_sentence(list(w)), w) for w, (a, *_) in ref.items())
        assert wl[b].words == exp[1] and wl[b].total_score == pytest.approx(exp[0], abs=1e-4)
        assert wl[b].lm_score == pytest.approx(lm.score_sentence(list(exp[1])), abs=1e-4)
        assert {h.words: h.am_score for h in lists[b]} == pytest.approx({w: ref[w][0] for w in
                                                                          {h.words for h in lists[b]}}, abs=1e-4)
        exp = max((ref[h.words][0] + 0.7 * lm.score_sentence(list(h.words)), h.words) for h in lists[b])
        assert nb[b].words == exp[1] and nb[b].total_score == pytest.approx(exp[0], abs=1e-4)
