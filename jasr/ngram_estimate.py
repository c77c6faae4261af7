"""Interpolated modified Kneser-Ney estimation of an n-gram LM from text, as KenLM's ``lmplz`` computes it.

Counting (lmplz's corpus_count + adjust_counts): each sentence is padded to ``<s>^(N-1) w_1 ... w_L </s>``
and every N-gram ending at w_1 ... </s> is counted.

- Order N keeps raw counts; a padded N-gram whose second word is <s> is not an N-gram, but gives the shorter
  n-gram that starts at its last <s> ("<s> w ..."), which keeps the raw count (nothing can precede <s>).
- Below order N, other n-grams get adjusted counts: the number of distinct words that precede them (<s> included).
- <unk> and <s> are unigrams with count 0.

Discounts per order n from the count-of-counts t_k of the (adjusted) counts of order n (Chen & Goodman eq. 26):
Y = t_1 / (t_1 + 2 t_2), D_k = k - (k + 1) Y t_{k+1} / t_k for k = 1, 2, 3 (D_3 applies to counts >= 3).
Probabilities, for a context h with n-grams h w of adjusted counts a:

    u(w | h) = (a(h w) - D(a(h w))) / sum_x a(h x)
    gamma(h) = (D_1 N_1(h) + D_2 N_2(h) + D_3 N_3+(h)) / sum_x a(h x)
    p(w | h) = u(w | h) + gamma(h) p(w | h minus its first word)
    p(w)     = u(w) + gamma() / (|V| - 1)      (uniform over the vocabulary without <s>, <unk> included)

so p(<unk>) = gamma() / (|V| - 1); p(<s>) = 1 (log10 0, as lmplz writes it; <s> is never predicted). The ARPA
backoff of an n-gram is gamma of it as a context (1 when it is not one, or ends in <unk> or </s>).
One lmplz quirk is kept so that the discounts are lmplz's: the n-grams still open when its adjust_counts loop ends
(the suffixes of the last padded N-gram in suffix order of word ids) enter the count-of-counts with their raw
count. lmplz computes in float32; this computes in float64 and stores float32 (differences ~1e-6 in ln).
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

from jasr.ngram import BOS, EOS, UNK, NgramLM, ngram_lm_from_grams

__all__ = ["estimate_kneser_ney", "kneser_ney_discounts"]

Sentence = Union[str, Sequence[str]]


def kneser_ney_discounts(count_of_counts: Sequence[int], order: int,
                         fallback: Optional[Sequence[float]] = None) -> Tuple[float, float, float]:
    """(D_1, D_2, D_3+) from the count-of-counts t_1..t_4 of one order (lmplz's closed form; see the module
    docstring). A zero t_1..t_3 or a discount outside [0, k] raises ValueError, or gives `fallback` if set
    (lmplz's --discount_fallback, e.g. (0.5, 1.0, 1.5))."""
    t = [0] + [int(c) for c in count_of_counts[:4]] + [0] * (4 - len(count_of_counts[:4]))
    try:
        for k in (1, 2, 3):
            if t[k] == 0:
                raise ValueError(f"could not compute Kneser-Ney discounts for {order}-grams: no {order}-gram has "
                                 f"adjusted count {k} (small or artificial data; deduplicate it, or pass "
                                 f"discount_fallback)")
        y = t[1] / (t[1] + 2.0 * t[2])
        ds = tuple(k - (k + 1) * y * t[k + 1] / t[k] for k in (1, 2, 3))
        for k, d in zip((1, 2, 3), ds):
            if not 0.0 <= d <= k:
                raise ValueError(f"the {order}-gram discount for adjusted count {k} is out of range: {d} "
                                 f"(count-of-counts {t[1:]}; pass discount_fallback to override)")
        return ds
    except ValueError:
        if fallback is None:
            raise
        fb = tuple(float(x) for x in fallback)
        if len(fb) != 3:
            raise ValueError(f"discount_fallback must be three discounts (D1, D2, D3+), got {fallback!r}") from None
        return fb


def _tokens(s: Sentence, index: int, skip_symbols: bool) -> List[str]:
    words = s.split() if isinstance(s, str) else list(s)
    out = []
    for w in words:
        if not isinstance(w, str) or not w or any(c.isspace() for c in w):
            raise ValueError(f"sentence {index}: words must be non-empty strings without blanks, got {w!r}")
        if w in (BOS, EOS, UNK):
            if skip_symbols:
                continue
            raise ValueError(f"sentence {index}: the special word {w} is not allowed in the text (as lmplz; pass "
                             f"skip_symbols=True to drop it)")
        out.append(w)
    return out


def estimate_kneser_ney(sentences: Iterable[Sentence], order: int,
                        discount_fallback: Optional[Sequence[float]] = None,
                        skip_symbols: bool = False,
                        discounts: Optional[Sequence[Sequence[float]]] = None) -> NgramLM:
    """Estimates an interpolated modified Kneser-Ney LM of `order` from `sentences` (strings split on whitespace,
    or word lists), as ``lmplz -o ORDER`` (see the module docstring); write it with ``jasr.ngram.write_arpa``.

    Vocabulary ids: <unk> 0, <s> 1, </s> 2, then words in order of first appearance (as lmplz). `skip_symbols`:
    drop <s>, </s>, <unk> in the text instead of raising ValueError. `discount_fallback`: (D1, D2, D3+) for an
    order whose closed-form discounts fail (lmplz's --discount_fallback). `discounts`: one (D1, D2, D3+) per
    order instead of the closed form. Runs on the host in Python (a corpus of up to a few million words).
    """
    if discounts is not None:
        discounts = [tuple(float(x) for x in d) for d in discounts]
        if len(discounts) != order or any(len(d) != 3 for d in discounts):
            raise ValueError(f"estimate_kneser_ney: discounts must be {order} triples (D1, D2, D3+), got "
                             f"{discounts!r}")
    if not isinstance(order, int) or order < 1:
        raise ValueError(f"estimate_kneser_ney: order must be an int >= 1, got {order!r}")
    words = [UNK, BOS, EOS]
    ids: Dict[str, int] = {w: i for i, w in enumerate(words)}
    unk, bos, eos = 0, 1, 2
    N = order
    full: Dict[Tuple[int, ...], int] = defaultdict(int)  # padded N-grams -> raw count
    num_sentences = 0
    for k, s in enumerate(sentences):
        toks = _tokens(s, k, skip_symbols)
        seq = [bos] * (N - 1)
        for w in toks:
            if w not in ids:
                ids[w] = len(words)
                words.append(w)
            seq.append(ids[w])
        seq.append(eos)
        for i in range(N - 1, len(seq)):
            full[tuple(seq[i - N + 1:i + 1])] += 1
        num_sentences += 1
    if num_sentences == 0:
        raise ValueError("estimate_kneser_ney: no sentences")

    # adjusted counts per order (index n - 1)
    counts: List[Dict[Tuple[int, ...], int]] = [defaultdict(int) for _ in range(N)]
    counts[0][(unk,)] = 0
    counts[0][(bos,)] = 0
    for g, c in full.items():
        if N > 1 and g[1] == bos:  # padded: the n-gram from its last <s> keeps the raw count
            last = max(i for i, w in enumerate(g) if w == bos)
            counts[N - 1 - last][g[last:]] += c
        else:
            counts[N - 1][g] += c
    for n in range(N - 1, 0, -1):  # n-grams of order n not starting with <s>: distinct left extensions
        for t in {g[N - n - 1:] for g in full}:
            s = t[1:]
            if s[0] != bos:
                counts[n - 1][s] += 1
    if N == 1:
        for w in range(len(words)):
            counts[0].setdefault((w,), 0)

    # lmplz quirk (adjust_counts.cc, the loop after the main one): the lower n-grams still open at the end, the
    # suffixes of the last padded N-gram in suffix order, enter the count-of-counts with their raw counts
    stat_counts = [dict(c) for c in counts]
    if N > 1:
        last = max(full, key=lambda g: g[::-1])
        r = max(i for i, w in enumerate(last) if w == bos) if last[1] == bos else 0
        for n in range(1, (N - r if r else N - 1) + 1):
            s = last[N - n:]
            stat_counts[n - 1][s] = sum(c for g, c in full.items() if g[N - n:] == s)

    if discounts is None:
        discounts = []
        for n in range(N):
            tk = [0, 0, 0, 0]
            for c in stat_counts[n].values():
                if 1 <= c <= 4:
                    tk[c - 1] += 1
            discounts.append(kneser_ney_discounts(tk, n + 1, discount_fallback))

    def disc(n: int, c: int) -> float:
        return 0.0 if c == 0 else discounts[n][min(c, 3) - 1]

    # per context: denominator and gamma
    gammas: List[Dict[Tuple[int, ...], float]] = []
    denoms: List[Dict[Tuple[int, ...], float]] = []
    for n in range(N):
        den: Dict[Tuple[int, ...], float] = defaultdict(float)
        mass: Dict[Tuple[int, ...], float] = defaultdict(float)
        for g, c in counts[n].items():
            den[g[:-1]] += c
            mass[g[:-1]] += disc(n, c)
        denoms.append(den)
        gammas.append({h: mass[h] / den[h] for h in den})

    V = len(words)
    uniform = 1.0 / (V - 1)
    probs: List[Dict[Tuple[int, ...], float]] = [dict() for _ in range(N)]
    g0 = gammas[0][()]
    for (w,), c in counts[0].items():
        probs[0][(w,)] = 1.0 if w == bos else (c - disc(0, c)) / denoms[0][()] + g0 * uniform
    for n in range(1, N):
        for g, c in counts[n].items():
            h = g[:-1]
            probs[n][g] = (c - disc(n, c)) / denoms[n][h] + gammas[n][h] * probs[n - 1][g[1:]]

    grams = []
    for n in range(N):
        table = {}
        for g, p in probs[n].items():
            lp = min(0.0, math.log(p)) if p > 0 else -math.inf
            if n == N - 1:
                bo = None
            elif g[-1] in (unk, eos) or g not in gammas[n + 1]:
                bo = 0.0
            else:
                bo = math.log(gammas[n + 1][g])
            table[g] = (lp, bo)
        grams.append(table)
    return ngram_lm_from_grams(words, grams)
