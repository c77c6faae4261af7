"""Word and hotword tries over token ids, stored as arrays that a jitted search reads.

:class:`Lexicon` maps token prefixes to words (for word-level LM fusion, word counting and the lexicon constraint of
:func:`jasr.ctc_beam.ctc_prefix_beam_search`); :class:`Hotwords` is an Aho-Corasick automaton over token ids whose
states carry a boost (context biasing, as icefall's ContextGraph). Both are NamedTuples of arrays, hence pytrees
that jit carries as arguments. Built on the host with numpy; looked up on device with jax.numpy.

Word boundaries: a *boundary* token (a character tokenizer's space, SentencePiece's bare "▁") ends the current word
and belongs to none; a *word-start* token (a SentencePiece piece "▁xyz") ends the current word and begins the next.
Every other token continues the current word.

:class:`LmLookahead` is a table of word-LM look-ahead scores per (LM state, trie node): the best LM log-probability of
any word spelled below the node (flashlight's "smearing" with max), so that a search can score partial words.
"""
from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Lexicon", "Hotwords", "LmLookahead", "make_lexicon", "lexicon_from_tokenizer", "make_hotwords",
           "make_lm_lookahead", "word_boundaries", "lexicon_child", "hotword_step", "lookahead_score"]

_MAX_KEY = np.iinfo(np.int32).max


class Lexicon(NamedTuple):
    """A trie of words over token ids. Node 0 is the root (no partial word); node -1 stands for "left the lexicon".

    keys: [A + 1] int32, sorted ``node * V + token`` of the trie arcs (a sentinel int32-max last).
    dest: [A + 1] int32, child node of each arc.
    child: [num_nodes, V] int32 dense child table (-1: no arc) where num_nodes * V <= `dense_limit` (one gather
      per lookup), else [0, V] (binary search in `keys`).
    word: [num_nodes] int32, LM word id of the word that ends at a node, -1 where none ends.
    boundary: [V] bool, tokens that end a word and belong to none. word_start: [V] bool, tokens that begin a word.
    unk_id: [] int32, the LM word id given to a word not in the lexicon.
    """
    keys: jax.Array
    dest: jax.Array
    child: jax.Array
    word: jax.Array
    boundary: jax.Array
    word_start: jax.Array
    unk_id: jax.Array

    @property
    def vocab_size(self) -> int:
        return self.boundary.shape[0]


class Hotwords(NamedTuple):
    """Aho-Corasick automaton over token ids (node 0 = root).

    goto: [num_nodes, V] int32, the next node after a token (failure links resolved).
    score: [num_nodes] float32, the bonus a partial match at this node holds (sum of the per-token boosts).
    is_end: [num_nodes] bool, a hotword ends here: its bonus is kept and the match restarts at the root.
    """
    goto: jax.Array
    score: jax.Array
    is_end: jax.Array


class LmLookahead(NamedTuple):
    """Look-ahead scores of a word LM over a lexicon trie.

    table: [S, num_nodes + 1] float32 (natural log). Column n > 0: max over the words spelled at or below trie node n
      of ln p(word | LM state s); column 0 (the root, no partial word): 0; the last column (node -1, a partial word
      that left the lexicon): ln p(<unk> | s). S = the LM's number of states (conditioned on the context), or 1
      (unigram: every state reads row 0, the LM's state 0, an NgramLM's empty context).
    """
    table: jax.Array

    @property
    def conditioned(self) -> bool:
        return self.table.shape[0] > 1


def _check_tokens(name: str, seqs: Sequence[Sequence[int]], vocab_size: int) -> list[tuple[int, ...]]:
    out = []
    for i, s in enumerate(seqs):
        s = tuple(int(t) for t in s)
        if not s:
            raise ValueError(f"{name}[{i}] is empty")
        if any(not 0 < t < vocab_size for t in s):
            raise ValueError(f"{name}[{i}] = {s} has token ids outside [1, {vocab_size}) (0 is the blank)")
        out.append(s)
    return out


def make_lexicon(words: Sequence[Sequence[int]], vocab_size: int, *, word_ids: Sequence[int] | None = None,
                 boundary_ids: Sequence[int] = (), word_start_ids: Sequence[int] = (), unk_id: int = 0,
                 dense_limit: int = 1 << 22) -> Lexicon:
    """Builds the trie of `words` (token id sequences, without boundary tokens).

    word_ids: the LM word id of each word (default: its index). A word spelled twice keeps its first id.
    boundary_ids / word_start_ids: see the module docstring. unk_id: LM id of out-of-lexicon words.
    dense_limit: largest num_nodes * V stored as a dense child table (faster lookups, 4 bytes per entry).
    """
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
    words = _check_tokens("words", words, vocab_size)
    if word_ids is None:
        word_ids = range(len(words))
    word_ids = [int(w) for w in word_ids]
    if len(word_ids) != len(words):
        raise ValueError(f"word_ids has {len(word_ids)} entries for {len(words)} words")
    if any(w < 0 for w in word_ids) or unk_id < 0:
        raise ValueError("word_ids and unk_id must be >= 0")
    flags = []
    for name, ids in (("boundary_ids", boundary_ids), ("word_start_ids", word_start_ids)):
        f = np.zeros(vocab_size, bool)
        for t in ids:
            if not 0 < int(t) < vocab_size:
                raise ValueError(f"{name} holds {t}, outside [1, {vocab_size})")
            f[int(t)] = True
        flags.append(f)
    boundary, word_start = flags
    if (boundary & word_start).any():
        raise ValueError("a token cannot be both in boundary_ids and word_start_ids")
    children: list[dict[int, int]] = [{}]
    word = [-1]
    for w, wid in zip(words, word_ids):
        if boundary[list(w)].any() or word_start[list(w[1:])].any():
            raise ValueError(f"word {w} contains a boundary token or a word-start token after its first token")
        node = 0
        for t in w:
            if t not in children[node]:
                children[node][t] = len(children)
                children.append({})
                word.append(-1)
            node = children[node][t]
        if word[node] < 0:
            word[node] = wid
    if len(children) * vocab_size >= _MAX_KEY:
        raise ValueError(f"lexicon too large: {len(children)} trie nodes x {vocab_size} tokens overflow int32 keys")
    arcs = sorted((n * vocab_size + t, d) for n, ch in enumerate(children) for t, d in ch.items())
    keys = np.array([k for k, _ in arcs] + [_MAX_KEY], np.int32)
    dest = np.array([d for _, d in arcs] + [-1], np.int32)
    dense = len(children) * vocab_size <= dense_limit
    child = np.full((len(children) if dense else 0, vocab_size), -1, np.int32)
    if dense:
        for n, ch in enumerate(children):
            for t, d in ch.items():
                child[n, t] = d
    return Lexicon(jnp.asarray(keys), jnp.asarray(dest), jnp.asarray(child), jnp.asarray(np.array(word, np.int32)),
                   jnp.asarray(boundary), jnp.asarray(word_start), jnp.asarray(np.int32(unk_id)))


def word_boundaries(tokenizer: Any) -> tuple[list[int], list[int]]:
    """(boundary ids, word-start ids) of a CharTokenizer (space) or SentencePieceTokenizer ("▁", "▁xyz")."""
    if hasattr(tokenizer, "id_to_piece"):
        pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
        boundary = [i for i, p in enumerate(pieces) if i and p == "▁"]
        start = [i for i, p in enumerate(pieces) if i and p.startswith("▁") and p != "▁"]
        return boundary, start
    if hasattr(tokenizer, "chars"):
        return [i + 1 for i, c in enumerate(tokenizer.chars) if c == " "], []
    raise ValueError(f"tokenizer {tokenizer!r}: word boundaries are known for CharTokenizer and "
                     f"SentencePieceTokenizer only")


def lexicon_from_tokenizer(words: Sequence[str], tokenizer: Any, *,
                           word_ids: Mapping[str, int] | Sequence[int] | None = None, unk_id: int = 0,
                           dense_limit: int = 1 << 22) -> Lexicon:
    """A Lexicon of `words` spelled by `tokenizer` (CharTokenizer or SentencePieceTokenizer).

    word_ids: LM word ids, a mapping word -> id or a sequence aligned with `words` (default: the index).
    """
    boundary, start = word_boundaries(tokenizer)
    bset = set(boundary)
    spelled = []
    for w in words:
        if not w or len(w.split()) != 1:
            raise ValueError(f"words must be single non-empty words without spaces, got {w!r}")
        ids = list(tokenizer.encode(w))
        while ids and ids[0] in bset:
            ids = ids[1:]
        spelled.append(ids)
    if isinstance(word_ids, Mapping):
        missing = [w for w in words if w not in word_ids]
        if missing:
            raise ValueError(f"word_ids has no id for {missing[:5]}")
        word_ids = [word_ids[w] for w in words]
    return make_lexicon(spelled, tokenizer.vocab_size, word_ids=word_ids, boundary_ids=boundary,
                        word_start_ids=start, unk_id=unk_id, dense_limit=dense_limit)


def lexicon_child(lexicon: Lexicon, node: jax.Array, token: jax.Array) -> jax.Array:
    """The trie node after `token` from `node` (broadcast int32 arrays); -1 where there is no such arc or node < 0."""
    if lexicon.child.shape[0]:
        return jnp.where(node >= 0, lexicon.child[jnp.maximum(node, 0), token], -1)
    v = lexicon.vocab_size
    key = jnp.where(node >= 0, node * v + token, -1).astype(jnp.int32)
    i = jnp.clip(jnp.searchsorted(lexicon.keys, key, method="scan_unrolled"), 0, lexicon.keys.shape[0] - 1)
    return jnp.where((node >= 0) & (lexicon.keys[i] == key), lexicon.dest[i], -1)


def make_hotwords(hotwords: Sequence[Sequence[int]], vocab_size: int, boost: float | Sequence[float] = 2.0
                  ) -> Hotwords:
    """Aho-Corasick automaton of `hotwords` (token id sequences); each matched token earns `boost` (per hotword or
    one for all). A partial match that fails falls back to its longest matching suffix (failure link) and loses the
    difference; the search removes a match left unfinished at the end. Memory: num_nodes x V int32.
    """
    hotwords = _check_tokens("hotwords", hotwords, vocab_size)
    boosts = [float(boost)] * len(hotwords) if np.ndim(boost) == 0 else [float(b) for b in boost]
    if len(boosts) != len(hotwords):
        raise ValueError(f"boost has {len(boosts)} entries for {len(hotwords)} hotwords")
    children: list[dict[int, int]] = [{}]
    score, is_end, depth = [0.0], [False], [0]
    for w, b in zip(hotwords, boosts):
        node = 0
        for t in w:
            if t not in children[node]:
                children[node][t] = len(children)
                children.append({})
                score.append(score[node] + b)
                is_end.append(False)
                depth.append(depth[node] + 1)
            else:
                score[children[node][t]] = max(score[children[node][t]], score[node] + b)
            node = children[node][t]
        is_end[node] = True
    n = len(children)
    goto = np.zeros((n, vocab_size), np.int32)
    fail = np.zeros(n, np.int64)
    order = sorted(range(n), key=lambda i: depth[i])   # breadth first: a node's failure target is shallower
    for u in order:
        if u:
            goto[u] = goto[fail[u]]
        for t, c in children[u].items():
            fail[c] = goto[fail[u], t] if u else 0
        for t, c in children[u].items():
            goto[u, t] = c
    return Hotwords(jnp.asarray(goto), jnp.asarray(np.array(score, np.float32)), jnp.asarray(np.array(is_end)))


def hotword_step(hotwords: Hotwords, node: jax.Array, token: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(next node, score change) after `token` from `node` (broadcast int32 arrays); a completed hotword keeps its
    bonus and returns to the root."""
    nxt = hotwords.goto[node, token]
    delta = hotwords.score[nxt] - hotwords.score[node]
    return jnp.where(hotwords.is_end[nxt], 0, nxt), delta


def make_lm_lookahead(lexicon: Lexicon, lm: Any, *, max_entries: int = 1 << 22) -> LmLookahead:
    """The look-ahead table of `lm` over `lexicon` (see :class:`LmLookahead`), built once on the host.

    lm: a word LM with int32 scalar states ``0 .. lm.num_states - 1`` and ``advance(states, ids)`` (as
    jasr.ngram.NgramLM; word ids are the lexicon's). Conditioned on the LM state where num_states * (num_nodes + 1)
    <= max_entries (float32 entries), else one unigram row (LM state 0).
    """
    num_states = getattr(lm, "num_states", None)
    if not isinstance(num_states, (int, np.integer)) or num_states < 1 or not hasattr(lm, "advance"):
        raise TypeError(f"lm must have an int num_states >= 1 and advance(states, ids), got {type(lm).__name__}")
    if np.ndim(np.asarray(lm.start_state())) != 0:
        raise ValueError("lm states must be int32 scalars for a look-ahead table")
    word = np.asarray(lexicon.word)
    n = word.shape[0]
    rows = num_states if num_states * (n + 1) <= max_entries else 1
    ids = np.unique(np.concatenate([word[word >= 0], [int(lexicon.unk_id)]])).astype(np.int32)
    # ln p(w | s) for every state row and every word id the lexicon uses (one batched call)
    _, lp = lm.advance(jnp.arange(rows, dtype=jnp.int32)[:, None], jnp.asarray(ids)[None, :])
    lp = np.asarray(lp, np.float32)                                               # [rows, W']
    has = word >= 0
    by_node = np.full((n + 1, rows), -np.inf, np.float32)                        # transposed: rows contiguous
    by_node[:n][has] = lp[:, np.searchsorted(ids, word[has])].T
    # children have larger ids than their parents (make_lexicon appends them): one pass from the leaves up
    keys, dest = np.asarray(lexicon.keys)[:-1], np.asarray(lexicon.dest)[:-1]
    parent = np.zeros(n, np.int64)
    parent[dest] = keys // lexicon.vocab_size
    for node in range(n - 1, 0, -1):
        np.maximum(by_node[parent[node]], by_node[node], out=by_node[parent[node]])
    by_node[0] = 0.0
    by_node[n] = lp[:, np.searchsorted(ids, int(lexicon.unk_id))]
    np.maximum(by_node, np.float32(-1e30), out=by_node)   # finite: look-ahead differences stay free of NaN
    return LmLookahead(jnp.asarray(np.ascontiguousarray(by_node.T)))


@jax.jit
def lookahead_score(lookahead: LmLookahead, states: jax.Array, node: jax.Array) -> jax.Array:
    """Look-ahead scores (float32) of trie nodes (int32, -1: outside the lexicon) in LM states (int32), broadcast."""
    n = lookahead.table.shape[1] - 1
    row = states if lookahead.conditioned else jnp.zeros_like(states)
    return lookahead.table[row, jnp.where(node < 0, n, node)]
