"""Back-off n-gram language models: ARPA files, jit-compiled scoring for search, and the grammar FSA G.

An :class:`NgramLM` holds an ARPA model as arrays (all log-probabilities and backoffs in natural log, float32):

- unigrams: ``unigram_logp`` [V] = ln p(w), ``unigram_next`` [V] = the state after w from the empty context;
- states (KenLM style): a state is an int32 id of the longest context kept. The kept contexts are the empty
  context (state 0) and every n-gram of order < N that the model extends (it is the context of a higher n-gram)
  or whose backoff is not 0; other words of the history cannot change any later score and are dropped.
  ``state_backoff`` [S] (ln backoff), ``state_parent`` [S] (the longest proper suffix that is a state),
  ``state_words`` [S, N-1] (the context's words, -1 padded) and ``state_len`` [S];
- n-grams of order >= 2 as arcs of their context state, CSR style: ``row_start`` [S+1], and per arc (sorted by
  state, then word) ``arc_word``, ``arc_logp`` (ln p(w | context)) and ``arc_next`` (the state after w).

``lm.advance(states, word_ids)`` looks a word up by binary search in its context's row (a fixed number of steps)
and backs off along ``state_parent`` in a fixed loop over the orders, adding backoffs, so that it runs under jit on
int32 arrays of any shape. A model with at most ``DENSE_MAX_ENTRIES`` (state, word) pairs also carries the result
of that lookup for every pair (``dense``: next state and ln p, [S, V] each, computed by the same function on the
host), and advances by one gather. Word ids are the LM's own (``lm.ids(words)``); ids outside [0, V) and unknown words
score as <unk>. A model without <unk> gets one with log10 probability ``unk_log10_prob`` (default -100, as KenLM;
``None`` gives -inf, so that an unknown word makes the sentence impossible).

:func:`ngram_to_fsa` turns the model into a back-off acceptor G for :mod:`fsa_ops` (k2 / icefall conventions).
Estimation from text (modified Kneser-Ney, as KenLM's lmplz) is in :mod:`jasr.ngram_estimate`.
"""
from __future__ import annotations

import gzip
import math
import os
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util

from fsa_ops.fsa import Fsa
from fsa_ops.sort import arc_sort
from fsa_ops.symbol_table import SymbolTable

__all__ = ["NgramLM", "Vocabulary", "read_arpa", "write_arpa", "arpa_text", "ngram_lm_from_grams", "lm_grams",
           "advance_arrays", "with_dense_table", "ngram_to_fsa"]

LN10 = math.log(10.0)
BOS, EOS, UNK = "<s>", "</s>", "<unk>"

# per order n (index n - 1): n-gram (tuple of word ids) -> (ln prob, ln backoff or None)
Grams = List[Dict[Tuple[int, ...], Tuple[float, Optional[float]]]]


class Vocabulary:
    """The LM's words (id -> word) and the inverse map. Compared by identity, so that it is cheap static aux data
    of the NgramLM pytree (jit caches one program per LM object)."""

    def __init__(self, words: Sequence[str]):
        self.words = tuple(words)
        self.index = {w: i for i, w in enumerate(self.words)}
        if len(self.index) != len(self.words):
            raise ValueError("Vocabulary: duplicate words")

    def __len__(self):
        return len(self.words)

    def __contains__(self, word):
        return word in self.index


DENSE_MAX_ENTRIES = 1 << 20   # (state, word) pairs up to which a model carries its dense lookup table (8 MB)
_CHILDREN = ("unigram_logp", "unigram_next", "state_backoff", "state_parent", "state_words", "state_len",
             "row_start", "arc_word", "arc_logp", "arc_next")


@tree_util.register_pytree_node_class
class NgramLM:
    """A back-off n-gram LM as arrays (see the module docstring); a pytree, so it can be a jit argument.

    Static fields: ``order`` (N), ``vocab`` (:class:`Vocabulary`), ``bos_id`` / ``eos_id`` / ``unk_id``,
    ``unk_in_model`` (False when <unk> was added on reading), ``search_steps`` (binary-search steps per row),
    ``start_id`` (the state of the <s> context). Child ``dense``: None, or (next state int32 [S, V], ln p float32
    [S, V]) of every (state, word) pair (see the module docstring).
    """

    def __init__(self, arrays: Mapping[str, object], order: int, vocab: Vocabulary, bos_id: int, eos_id: int,
                 unk_id: int, unk_in_model: bool, search_steps: int, start_id: int, dense=None):
        for name in _CHILDREN:
            setattr(self, name, arrays[name])
        self.order = int(order)
        self.vocab = vocab
        self.bos_id, self.eos_id, self.unk_id = int(bos_id), int(eos_id), int(unk_id)
        self.unk_in_model = bool(unk_in_model)
        self.search_steps = int(search_steps)
        self.start_id = int(start_id)
        self.dense = dense
        self._host = None

    # ---- pytree ----
    def tree_flatten(self):
        aux = (self.order, self.vocab, self.bos_id, self.eos_id, self.unk_id, self.unk_in_model, self.search_steps,
               self.start_id)
        return tuple(getattr(self, n) for n in _CHILDREN) + (self.dense,), aux

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(dict(zip(_CHILDREN, children[:-1])), *aux, dense=children[-1])

    def on_host(self) -> "NgramLM":
        """The same model with numpy arrays (for host loops; made once per object)."""
        if getattr(self, "_host", None) is None:
            self._host = NgramLM({n: np.asarray(getattr(self, n)) for n in _CHILDREN}, self.order, self.vocab,
                                 self.bos_id, self.eos_id, self.unk_id, self.unk_in_model, self.search_steps,
                                 self.start_id)
            self._host._host = self._host
        return self._host

    # ---- sizes and words ----
    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @property
    def num_states(self) -> int:
        return int(np.shape(self.state_backoff)[0])

    def __repr__(self):
        counts = ", ".join(f"{n + 1}-grams={c}" for n, c in enumerate(self.counts()))
        return f"NgramLM(order={self.order}, vocab={self.vocab_size}, states={self.num_states}, {counts})"

    def counts(self) -> List[int]:
        """Number of n-grams per order (as an ARPA file's \\data\\ section)."""
        state_len = np.asarray(self.state_len)
        arc_ctx_len = state_len[_arc_states(np.asarray(self.row_start))]
        return [self.vocab_size] + [int(np.sum(arc_ctx_len == n - 1)) for n in range(2, self.order + 1)]

    def ids(self, words: Iterable[str]) -> np.ndarray:
        """Word strings -> LM ids (int32 [L]); words not in the vocabulary map to <unk>."""
        return np.array([self.vocab.index.get(w, self.unk_id) for w in words], np.int32).reshape(-1)

    def symbol_table(self) -> SymbolTable:
        """An fsa_ops SymbolTable of the LM's words: <eps> is 0 and LM word i has id i + 1 (a words.txt for
        :func:`ngram_to_fsa` when no lexicon's table is given)."""
        table = SymbolTable()
        for i, w in enumerate(self.vocab.words):
            table.add(w, i + 1)
        return table

    # ---- search interface (jit-able) ----
    def start_state(self, shape: Sequence[int] = ()) -> jax.Array:
        """The <s> context, int32 of `shape`."""
        return jnp.full(tuple(shape), self.start_id, jnp.int32)

    def advance(self, states, word_ids) -> Tuple[jax.Array, jax.Array]:
        """(states, word ids) int32 of broadcastable shapes -> (new states int32, ln p(word | state) float32)."""
        if self.dense is not None:
            return _advance_dense(self, jnp.asarray(states, jnp.int32), jnp.asarray(word_ids, jnp.int32))
        return _advance_jit(self, jnp.asarray(states, jnp.int32), jnp.asarray(word_ids, jnp.int32))

    def final(self, states) -> jax.Array:
        """ln p(</s> | state), float32 of the states' shape."""
        states = jnp.asarray(states, jnp.int32)
        return self.advance(states, jnp.full(states.shape, self.eos_id, jnp.int32))[1]

    # ---- host scoring ----
    def score_words(self, words: Sequence[Union[str, int]], bos: bool = True, eos: bool = True) -> np.ndarray:
        """Per-word ln probabilities (float32 [L (+1 for </s>)]) of a sentence, on the host with numpy (as
        KenLM's full_scores, but natural log). Words are strings or LM ids; `bos`: start from <s> (else from
        the empty context); `eos`: also score </s>."""
        ids = [self.vocab.index.get(w, self.unk_id) if isinstance(w, str) else int(w) for w in words]
        if eos:
            ids.append(self.eos_id)
        host = self.on_host()
        state = np.array(self.start_id if bos else 0, np.int32)
        out = np.zeros(len(ids), np.float32)
        for i, w in enumerate(ids):
            state, out[i] = advance_arrays(host, state, np.array(w, np.int32), np)
        return out

    def score_sentence(self, words: Union[str, Sequence[Union[str, int]]], bos: bool = True,
                       eos: bool = True) -> float:
        """Total ln probability of a sentence (a string is split on whitespace); see :meth:`score_words`."""
        if isinstance(words, str):
            words = words.split()
        return float(np.sum(self.score_words(words, bos, eos), dtype=np.float64))


def _arc_states(row_start: np.ndarray) -> np.ndarray:
    """The context state of each arc, from the CSR row starts."""
    counts = np.diff(row_start)
    return np.repeat(np.arange(len(counts), dtype=np.int32), counts)


def _repeat(n: int, body, carry, xp):
    """`carry = body(carry)` n times: a Python loop for numpy, lax.fori_loop (a small program) for jax."""
    if xp is np:
        for _ in range(n):
            carry = body(carry)
        return carry
    return jax.lax.fori_loop(0, n, lambda _, c: body(c), carry)


def advance_arrays(lm: NgramLM, states, words, xp=jnp):
    """:meth:`NgramLM.advance` with array module `xp` (jax.numpy under jit, numpy on the host).

    Per backoff level (N - 1 fixed steps): binary search of the word in the row of the current state; on a miss,
    add the state's backoff and go to its parent. Words never found above fall back to the unigram table.
    """
    states, words = xp.broadcast_arrays(xp.asarray(states, xp.int32), xp.asarray(words, xp.int32))
    w = _known_words(lm, words, xp)
    arc_word, arc_logp, arc_next = lm.arc_word, lm.arc_logp, lm.arc_next
    last = arc_word.shape[0] - 1

    def search(lo_hi):  # one step of the lower bound of w in arc_word[lo:hi]
        lo, hi = lo_hi
        mid = (lo + hi) // 2
        less = arc_word[xp.minimum(mid, last)] < w
        active = lo < hi
        return xp.where(active & less, mid + 1, lo), xp.where(active & ~less, mid, hi)

    def level(carry):
        cur, done, acc, logp, nxt = carry
        end = lm.row_start[cur + 1]
        lo, _ = _repeat(lm.search_steps, search, (lm.row_start[cur], end), xp)
        idx = xp.minimum(lo, last)
        found = ~done & (lo < end) & (arc_word[idx] == w)
        logp = xp.where(found, acc + arc_logp[idx], logp)
        nxt = xp.where(found, arc_next[idx], nxt)
        done = done | found
        acc = xp.where(done, acc, acc + lm.state_backoff[cur])
        cur = xp.where(done, cur, lm.state_parent[cur])
        return cur, done, acc, logp, nxt

    zeros = xp.zeros(w.shape, xp.float32)
    carry = (states, xp.zeros(w.shape, bool), zeros, zeros, xp.zeros(w.shape, xp.int32))
    _, done, acc, logp, nxt = _repeat(lm.order - 1, level, carry, xp)
    logp = xp.where(done, logp, acc + lm.unigram_logp[w])
    nxt = xp.where(done, nxt, lm.unigram_next[w])
    return nxt.astype(xp.int32), logp.astype(xp.float32)


def _known_words(lm: NgramLM, words, xp):
    """Word ids outside [0, V) as <unk>."""
    return xp.where((words >= 0) & (words < lm.vocab_size), words, lm.unk_id)


@jax.jit
def _advance_jit(lm: NgramLM, states, words):
    return advance_arrays(lm, states, words, jnp)


@jax.jit
def _advance_dense(lm: NgramLM, states, words):
    states, words = jnp.broadcast_arrays(states, words)
    w = _known_words(lm, words, jnp)
    next_state, logp = lm.dense
    return next_state[states, w], logp[states, w]


def with_dense_table(lm: NgramLM) -> NgramLM:
    """The same model carrying its dense lookup table (module docstring), computed by `advance_arrays` on the host
    for every (state, word) pair, so that both lookups give the same numbers."""
    S, V = lm.num_states, lm.vocab_size
    host = lm.on_host()
    next_state, logp = advance_arrays(host, np.arange(S, dtype=np.int32)[:, None], np.arange(V, dtype=np.int32)[None],
                                      np)
    return NgramLM({n: getattr(lm, n) for n in _CHILDREN}, lm.order, lm.vocab, lm.bos_id, lm.eos_id, lm.unk_id,
                   lm.unk_in_model, lm.search_steps, lm.start_id, dense=(jnp.asarray(next_state), jnp.asarray(logp)))


# ---------------------------------------------------------------------------------------------------------------
# building from n-grams


def ngram_lm_from_grams(words: Sequence[str], grams: Grams, unk_log10_prob: Optional[float] = -100.0) -> NgramLM:
    """Builds an :class:`NgramLM` from per-order dicts {n-gram (tuple of ids into `words`): (ln p, ln backoff or
    None)}. Every word must have a unigram; <s> and </s> must be words; <unk> is added with `unk_log10_prob`
    (None: -inf) when missing. Every n-gram's context (all but its last word) must be an n-gram."""
    words = list(words)
    grams = [dict(g) for g in grams]
    order = len(grams)
    if order < 1:
        raise ValueError("ngram_lm_from_grams: no n-grams (order 0)")
    for name in (BOS, EOS):
        if name not in words:
            raise ValueError(f"the model has no {name} unigram (a sentence marker it needs)")
    unk_in_model = UNK in words
    if not unk_in_model:
        words.append(UNK)
        lp = -math.inf if unk_log10_prob is None else float(unk_log10_prob) * LN10
        grams[0][(len(words) - 1,)] = (lp, None)
    vocab = Vocabulary(words)
    V = len(vocab)
    missing = [w for i, w in enumerate(words) if (i,) not in grams[0]]
    if missing:
        raise ValueError(f"words without a unigram: {missing[:5]}")
    # kept contexts: extended by a higher n-gram, or with a backoff that is not 0
    extended = set()
    for n in range(1, order):
        for g in grams[n]:
            extended.add(g[:-1])
    for n in range(1, order):
        for g in grams[n]:
            if g[:-1] not in grams[n - 1]:
                raise ValueError(f"the {n + 1}-gram {_words(vocab, g)} has no {n}-gram context "
                                 f"{_words(vocab, g[:-1])}")
    kept = [()]
    for n in range(order - 1):
        kept += sorted(g for g, (_, bo) in grams[n].items() if g in extended or (bo is not None and bo != 0.0))
    state_id = {g: i for i, g in enumerate(kept)}
    S = len(kept)

    def longest_state(g):
        for k in range(len(g) + 1):
            s = state_id.get(g[k:])
            if s is not None:
                return s
        return 0

    state_backoff = np.zeros(S, np.float32)
    state_parent = np.zeros(S, np.int32)
    state_words = np.full((S, max(order - 1, 1)), -1, np.int32)
    state_len = np.zeros(S, np.int32)
    for i, g in enumerate(kept):
        if g:
            bo = grams[len(g) - 1][g][1]
            state_backoff[i] = 0.0 if bo is None else bo
            state_parent[i] = longest_state(g[1:])
            state_words[i, :len(g)] = g
            state_len[i] = len(g)
    unigram_logp = np.zeros(V, np.float32)
    unigram_next = np.zeros(V, np.int32)
    for (w,), (lp, _) in grams[0].items():
        unigram_logp[w] = lp
        unigram_next[w] = longest_state((w,))
    ctx, arc_word, arc_logp, arc_next = [], [], [], []
    for n in range(1, order):
        for g, (lp, _) in grams[n].items():
            ctx.append(state_id[g[:-1]])
            arc_word.append(g[-1])
            arc_logp.append(lp)
            arc_next.append(longest_state(g))
    ctx = np.asarray(ctx, np.int64)
    arc_word = np.asarray(arc_word, np.int64)
    perm = np.lexsort((arc_word, ctx))
    row_counts = np.bincount(ctx, minlength=S) if len(ctx) else np.zeros(S, np.int64)
    row_start = np.concatenate([[0], np.cumsum(row_counts)]).astype(np.int32)
    max_row = int(row_counts.max()) if S else 0
    if not len(ctx):  # one dummy arc, so that gathers have something to index (no row covers it)
        perm, arc_word, arc_logp, arc_next = np.zeros(1, np.int64), np.array([V]), [0.0], [0]
    arrays = dict(
        unigram_logp=unigram_logp, unigram_next=unigram_next, state_backoff=state_backoff,
        state_parent=state_parent, state_words=state_words, state_len=state_len, row_start=row_start,
        arc_word=np.asarray(arc_word, np.int32)[perm], arc_logp=np.asarray(arc_logp, np.float32)[perm],
        arc_next=np.asarray(arc_next, np.int32)[perm])
    arrays = {k: jnp.asarray(v) for k, v in arrays.items()}
    lm = NgramLM(arrays, order, vocab, vocab.index[BOS], vocab.index[EOS], vocab.index[UNK], unk_in_model,
                 max(1, math.ceil(math.log2(max_row + 1))), int(unigram_next[vocab.index[BOS]]))
    return with_dense_table(lm) if S * V <= DENSE_MAX_ENTRIES else lm


def _words(vocab: Vocabulary, g) -> str:
    return repr(" ".join(vocab.words[i] for i in g))


def lm_grams(lm: NgramLM) -> Grams:
    """The model's n-grams back as per-order dicts {tuple of ids: (ln p, ln backoff or None)} (backoffs of the
    kept contexts; None for the highest order)."""
    st = {k: np.asarray(getattr(lm, k)) for k in _CHILDREN}
    state_len, state_words = st["state_len"], st["state_words"]
    backoff_of = {}
    for s in range(1, len(state_len)):
        backoff_of[tuple(int(x) for x in state_words[s, :state_len[s]])] = float(st["state_backoff"][s])
    grams: Grams = [dict() for _ in range(lm.order)]
    for w in range(lm.vocab_size):
        if w == lm.unk_id and not lm.unk_in_model:
            continue
        grams[0][(w,)] = (float(st["unigram_logp"][w]), backoff_of.get((w,), 0.0) if lm.order > 1 else None)
    arc_ctx = _arc_states(st["row_start"])
    for a, s in enumerate(arc_ctx):
        g = tuple(int(x) for x in state_words[s, :state_len[s]]) + (int(st["arc_word"][a]),)
        n = len(g)
        grams[n - 1][g] = (float(st["arc_logp"][a]), backoff_of.get(g, 0.0) if n < lm.order else None)
    return grams


# ---------------------------------------------------------------------------------------------------------------
# ARPA


def _read_text(path_or_text) -> Tuple[str, str]:
    """(text, name for messages): ARPA text itself (a str with a newline) or a file path (.gz read with gzip)."""
    if isinstance(path_or_text, str) and ("\n" in path_or_text or "\\data\\" in path_or_text):
        return path_or_text, "ARPA text"
    path = os.fspath(path_or_text)
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return f.read(), str(path)


def read_arpa(path_or_text, unk_log10_prob: Optional[float] = -100.0) -> NgramLM:
    """Reads an ARPA back-off model (any order; log10 probabilities and backoffs) into an :class:`NgramLM`.

    `path_or_text`: a path (``.gz`` read with gzip) or the ARPA text itself (a str with a newline). Lines
    before ``\\data\\`` and after ``\\end\\`` are ignored. The \\data\\ counts must match the sections; every
    n-gram's words must be unigrams and its context an (n-1)-gram; <s> and </s> must be unigrams. A model without
    <unk> gets one with `unk_log10_prob` (default -100 as KenLM; None: -inf). Malformed input raises ValueError
    naming the line.
    """
    text, name = _read_text(path_or_text)
    lines = text.splitlines()
    i = 0

    def err(lineno, msg):
        return ValueError(f"{name}, line {lineno}: {msg}")

    while i < len(lines) and lines[i].strip() != "\\data\\":
        i += 1
    if i == len(lines):
        raise ValueError(f"{name}: no \\data\\ line (not an ARPA file)")
    i += 1
    declared: Dict[int, int] = {}
    while i < len(lines):
        line = lines[i].strip()
        if line.startswith("\\"):
            break
        if line:
            head, _, rest = line.partition("=")
            parts = head.split()
            try:
                if len(parts) != 2 or parts[0] != "ngram":
                    raise ValueError
                n, c = int(parts[1]), int(rest)
            except ValueError:
                raise err(i + 1, f"expected 'ngram N=COUNT' in \\data\\, got {line!r}") from None
            if n != len(declared) + 1 or c < 0:
                raise err(i + 1, f"'ngram {n}={c}': orders must be 1, 2, ... in turn, counts >= 0")
            declared[n] = c
        i += 1
    if not declared:
        raise err(i + 1, "\\data\\ declares no 'ngram N=COUNT' lines")
    order = len(declared)
    word_ids: Dict[str, int] = {}
    words: List[str] = []
    grams: Grams = [dict() for _ in range(order)]
    for n in range(1, order + 1):
        while i < len(lines) and not lines[i].strip():
            i += 1
        header = f"\\{n}-grams:"
        if i == len(lines) or lines[i].strip() != header:
            got = lines[i].strip() if i < len(lines) else "the end of the file"
            raise err(i + 1, f"expected {header}, got {got!r}")
        header_line = i + 1
        i += 1
        table = grams[n - 1]
        while i < len(lines):
            line = lines[i].strip()
            if line.startswith("\\"):
                break
            if line:
                fields = line.split()
                if len(fields) not in (n + 1, n + 2) or (n == order and len(fields) == n + 2):
                    want = f"{n + 1}" if n == order else f"{n + 1} or {n + 2}"
                    raise err(i + 1, f"a {n}-gram line needs {want} fields (log10 prob, {n} words"
                                     f"{'' if n == order else ', optional backoff'}), got {len(fields)}: {line!r}")
                try:
                    lp = float(fields[0])
                    bo = float(fields[n + 1]) if len(fields) == n + 2 else None
                except ValueError:
                    raise err(i + 1, f"bad number in {line!r}") from None
                if math.isnan(lp) or lp == math.inf or (bo is not None and not math.isfinite(bo) and bo != -math.inf):
                    raise err(i + 1, f"log10 probability / backoff must be <= +finite numbers: {line!r}")
                ws = fields[1:n + 1]
                if n == 1:
                    if ws[0] in word_ids:
                        raise err(i + 1, f"duplicate unigram {ws[0]!r}")
                    word_ids[ws[0]] = len(words)
                    words.append(ws[0])
                    g = (word_ids[ws[0]],)
                else:
                    try:
                        g = tuple(word_ids[w] for w in ws)
                    except KeyError as e:
                        raise err(i + 1, f"word {e.args[0]!r} is not a unigram") from None
                    if g in table:
                        raise err(i + 1, f"duplicate {n}-gram {' '.join(ws)!r}")
                    if g[:-1] not in grams[n - 2]:
                        raise err(i + 1, f"the context {' '.join(ws[:-1])!r} of this {n}-gram is not a "
                                         f"{n - 1}-gram")
                table[g] = (lp * LN10, None if bo is None else bo * LN10)
            i += 1
        if len(table) != declared[n]:
            raise err(header_line, f"{header} has {len(table)} entries, \\data\\ says ngram {n}={declared[n]}")
    while i < len(lines) and not lines[i].strip():
        i += 1
    if i == len(lines) or lines[i].strip() != "\\end\\":
        got = lines[i].strip() if i < len(lines) else "the end of the file"
        raise err(i + 1, f"expected \\end\\ after the {order}-grams, got {got!r}")
    for marker in (BOS, EOS):
        if marker not in word_ids:
            raise ValueError(f"{name}: no {marker} unigram (the sentence markers are required, as in KenLM)")
    return ngram_lm_from_grams(words, grams, unk_log10_prob)


def _fmt(x: float) -> str:
    """ln value -> the shortest log10 text that reads back to the same float32 log10."""
    if x == -math.inf:
        return "-inf"
    return np.format_float_positional(np.float32(x / LN10), trim="-")


def arpa_text(lm: NgramLM) -> str:
    """The model as ARPA text (log10; n-grams sorted by word ids; backoffs written for every n-gram below the
    highest order; an <unk> that the reader added is not written)."""
    grams = lm_grams(lm)
    words = lm.vocab.words
    out = ["\\data\\"] + [f"ngram {n + 1}={len(g)}" for n, g in enumerate(grams)] + [""]
    for n, table in enumerate(grams):
        out.append(f"\\{n + 1}-grams:")
        for g in sorted(table):
            lp, bo = table[g]
            line = f"{_fmt(lp)}\t{' '.join(words[w] for w in g)}"
            out.append(line if bo is None else f"{line}\t{_fmt(bo)}")
        out.append("")
    out.append("\\end\\")
    return "\n".join(out) + "\n"


def write_arpa(lm: NgramLM, path) -> None:
    """Writes the model as an ARPA file (``.gz``: gzip); see :func:`arpa_text`."""
    path = os.fspath(path)
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as f:
        f.write(arpa_text(lm))


# ---------------------------------------------------------------------------------------------------------------
# grammar FSA


def ngram_to_fsa(lm: NgramLM, word_table: Optional[Union[SymbolTable, Mapping[str, int]]] = None,
                 backoff_label: int = 0, oov: str = "skip", aux_labels: bool = False) -> Fsa:
    """The back-off acceptor G of the model (as Kaldi's arpa2fst + k2's ``Fsa.from_openfst``; icefall's G).

    States: the LM's states (0 is the <s> context, the k2 start state) plus a final state (last). Arcs (scores in
    natural log): from each context h, one per n-gram h w (w not <s>) with label ``word_table[w]`` to the state
    after w and score ln p(w | h); h </s> becomes an arc with label -1 into the final state; every context but
    the empty one has a backoff arc with `backoff_label` (0: epsilon, or e.g. the id of #0) to its parent state
    with score ln backoff(h). Arc-sorted, ready for ``fsa_ops.compose`` / ``intersect``.

    `word_table`: word -> label (an fsa_ops SymbolTable such as icefall's words.txt, or a dict); default
    ``lm.symbol_table()``. `oov`: what to do with an n-gram whose word is not in the table: 'skip' it (as
    arpa2fst with a symbol table) or 'error'. Arcs scoring -inf are left out. `aux_labels`: also give G
    ``aux_labels`` equal to its labels (as ``Fsa.from_openfst(G_txt, acceptor=False)`` in icefall).

    Unlike the LM, G also allows the backoff path where the n-gram exists: a path's score equals the LM's
    score when it takes every existing n-gram, which is its best path in the tropical semiring unless a backoff
    path scores higher (possible with Kneser-Ney); the log-semiring total sums both kinds of paths.
    """
    if oov not in ("skip", "error"):
        raise ValueError(f"ngram_to_fsa: oov must be 'skip' or 'error', got {oov!r}")
    if word_table is None:
        word_table = lm.symbol_table()

    def label_of(w: int) -> Optional[int]:
        word = lm.vocab.words[w]
        try:
            lab = word_table[word]
        except KeyError:
            if oov == "error":
                raise ValueError(f"ngram_to_fsa: word {word!r} of the LM is not in word_table") from None
            return None
        if not isinstance(lab, (int, np.integer)) or lab <= 0:
            raise ValueError(f"ngram_to_fsa: word_table gives {word!r} the label {lab!r}; labels must be ints > 0 "
                             f"(0 is epsilon, -1 final)")
        return int(lab)

    S = lm.num_states
    start = lm.start_id
    # LM state -> FSA state: the <s> context first (k2's start state), then the others in order
    perm = np.concatenate([[start], np.delete(np.arange(S), start)]).astype(np.int64)
    fsa_state = np.empty(S, np.int64)
    fsa_state[perm] = np.arange(S)
    final = S
    skip = {lm.bos_id, lm.eos_id} | (set() if lm.unk_in_model else {lm.unk_id})
    labels = [None if w in skip else label_of(w) for w in range(lm.vocab_size)]
    src, dst, lab, score = [], [], [], []

    def add_word_arc(s, w, lp, nxt):
        if w == lm.bos_id or lp == -np.inf:
            return
        if w == lm.eos_id:
            src.append(fsa_state[s]), dst.append(final), lab.append(-1), score.append(lp)
        elif labels[w] is not None:
            src.append(fsa_state[s]), dst.append(fsa_state[nxt]), lab.append(labels[w]), score.append(lp)

    uni_lp, uni_next = np.asarray(lm.unigram_logp), np.asarray(lm.unigram_next)
    for w in range(lm.vocab_size):
        if w == lm.unk_id and not lm.unk_in_model:
            continue
        add_word_arc(0, w, float(uni_lp[w]), int(uni_next[w]))
    arc_ctx = _arc_states(np.asarray(lm.row_start))
    arc_word, arc_logp, arc_next = (np.asarray(x) for x in (lm.arc_word, lm.arc_logp, lm.arc_next))
    for a, s in enumerate(arc_ctx):
        add_word_arc(int(s), int(arc_word[a]), float(arc_logp[a]), int(arc_next[a]))
    backoff, parent = np.asarray(lm.state_backoff), np.asarray(lm.state_parent)
    for s in range(1, S):
        if backoff[s] != -np.inf:
            src.append(fsa_state[s]), dst.append(fsa_state[parent[s]]), lab.append(backoff_label)
            score.append(float(backoff[s]))
    lab = np.asarray(lab, np.int32)
    fsa = Fsa.from_arcs(np.asarray(src, np.int32), np.asarray(dst, np.int32), lab, np.asarray(score, np.float32),
                        num_states=S + 1, aux_labels=lab.copy() if aux_labels else None)
    return arc_sort(fsa)
