"""k2/icefall-style decoding graphs on fsa_ops (host-side): lexicons, the lang directory, G, L, LG and HLG / TLG.

The recipe is icefall's ``local/prepare_lang.py`` and ``local/compile_hlg.py``:

- a lexicon is a list of entries ``(word, tokens, score)``: a word (a word may have several spellings), its token
  symbols and a log-probability (natural log, 0 for a plain ``lexicon.txt``);
- `add_disambig_symbols` appends ``#1, #2, ...`` to a spelling that is a proper prefix of another or that several
  entries share (homophones), so that L o G can be determinized; ``#0`` is kept for G's backoff arcs;
- `make_lang` gives the tables (``tokens.txt`` with ``#0..#K`` after the real tokens, ``words.txt`` with
  ``<eps>`` 0, the words, ``#0``, ``<s>``, ``</s>``, both `fsa_ops.SymbolTable`) and `lexicon_fst` the lexicon
  transducer L (tokens -> words; the first arc of a spelling carries the word and the entry's score);
- `grammar_fsa` makes G (an acceptor on word ids) from an `jasr.ngram.NgramLM` (backoff arcs labelled ``#0``), an
  `Fsa`, an OpenFst-style text with word symbols, a list of allowed sentences, or None (a free word loop);
- `compile_lg`: LG = arc_sort(remove_epsilon(determinize(L o G)) with disambiguation symbols removed): tokens in,
  a `fsa_ops.Ragged` row of words per arc out; `compile_hlg`: HLG = ctc_topo o LG (``inner_labels="tokens"``), with
  ``lm_scores`` = its scores (icefall's ``HLG.lm_scores``). All scores are log-probabilities (tropical semiring,
  as k2's determinize and remove_epsilon).

Word boundaries (a character model's space token, SentencePiece's bare "▁"): the boundary tokens are no part of a
word's spelling; L lets them appear between words (`word_boundary="optional"`: anywhere between and around words,
any number, score 0; ``"required"``: at least one between two words).
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np

from fsa_ops import (Fsa, SymbolTable, arc_sort, compose, connect, ctc_topo, determinize, remove_epsilon)
from jasr.lexicon import word_boundaries
from jasr.ngram import NgramLM, ngram_to_fsa

__all__ = ["LexiconEntry", "Lang", "DecodingGraph", "read_lexicon", "lexicon_text", "lexicon_from_words",
           "tokens_from_tokenizer", "add_disambig_symbols", "make_lang", "lang_from_tokenizer", "save_lang",
           "load_lang", "lexicon_fst", "grammar_fsa", "compile_lg", "compile_hlg", "compile_tlg", "SPACE"]

LexiconEntry = Tuple[str, Tuple[str, ...], float]
SPACE = "<space>"          # tokens.txt symbol of a character tokenizer's space (symbols cannot hold whitespace)
BLANK = "<blk>"
SPECIAL_WORDS = ("<eps>", "#0", "<s>", "</s>")
_DISAMBIG = re.compile(r"#[0-9]+")


def _text(path_or_text: Union[str, os.PathLike]) -> str:
    """A str with a newline is the text itself (as jasr.ngram.read_arpa); anything else is a path."""
    s = os.fspath(path_or_text)
    if isinstance(s, str) and "\n" in s:
        return s
    if not os.path.exists(s):
        raise FileNotFoundError(f"no such file: {s!r} (pass a path, or the text itself with a newline)")
    with open(s, encoding="utf-8") as f:
        return f.read()


def read_lexicon(path_or_text: Union[str, os.PathLike], with_probs: bool = False) -> list:
    """icefall's ``lexicon.txt`` (``word tok1 tok2 ...`` per line) or, `with_probs`, ``lexiconp.txt`` (``word
    prob tok1 ...``, prob in (0, 1]) -> [(word, tokens, ln prob)]. A path, or the text itself (with a newline)."""
    out = []
    for n, line in enumerate(_text(path_or_text).splitlines(), 1):
        f = line.split()
        if not f:
            continue
        score = 0.0
        if with_probs:
            try:
                p = float(f[1]) if len(f) > 1 else float("nan")
            except ValueError:
                raise ValueError(f"lexicon line {n}: the probability {f[1]!r} is not a number: {line!r}") from None
            if not 0 < p <= 1:
                raise ValueError(f"lexicon line {n}: the probability must be in (0, 1], got {f[1]!r}")
            score = float(np.log(p))
            f = f[:1] + f[2:]
        if len(f) < 2:
            raise ValueError(f"lexicon line {n}: expected a word and at least one token, got {line!r}")
        out.append((f[0], tuple(f[1:]), score))
    return out


def lexicon_text(entries: Sequence[LexiconEntry], with_probs: bool = False) -> str:
    """The lexicon as ``lexicon.txt`` (or ``lexiconp.txt``) text."""
    lines = []
    for w, toks, sc in entries:
        lines.append(" ".join([w] + ([f"{float(np.exp(sc)):.17g}"] if with_probs else []) + list(toks)))
    return "".join(line + "\n" for line in lines)


def tokens_from_tokenizer(tokenizer: Any) -> SymbolTable:
    """``tokens.txt`` of a CharTokenizer or SentencePieceTokenizer: id i -> its symbol (id 0 the blank
    ``<blk>``; a character tokenizer's space is ``<space>``)."""
    if hasattr(tokenizer, "chars"):
        syms = [BLANK] + [SPACE if c == " " else c for c in tokenizer.chars]
    elif hasattr(tokenizer, "id_to_piece"):
        syms = [BLANK] + [tokenizer.id_to_piece(i) for i in range(1, tokenizer.vocab_size)]
    else:
        raise ValueError(f"tokenizer {tokenizer!r}: tokens.txt is known for CharTokenizer and SentencePieceTokenizer")
    table = SymbolTable(eps=BLANK)
    for i, s in enumerate(syms[1:], 1):
        if not s or any(c.isspace() for c in s):
            raise ValueError(f"tokenizer token {i} ({s!r}) cannot be a tokens.txt symbol (empty or has whitespace)")
        table.add(s, i)
    return table


def lexicon_from_words(words: Sequence[str], tokenizer: Any) -> list:
    """[(word, token symbols, 0.0)]: each word spelled by `tokenizer`, its leading boundary tokens dropped."""
    table = tokens_from_tokenizer(tokenizer)
    boundary = set(word_boundaries(tokenizer)[0])
    out = []
    for w in words:
        if not isinstance(w, str) or not w or len(w.split()) != 1:
            raise ValueError(f"words: expected single non-empty words without spaces, got {w!r}")
        ids = list(tokenizer.encode(w))
        while ids and ids[0] in boundary:
            ids = ids[1:]
        if not ids or any(i in boundary for i in ids):
            raise ValueError(f"words: {w!r} spells as {ids} with the tokenizer's word-boundary tokens "
                             f"{sorted(boundary)}")
        out.append((w, tuple(table[i] for i in ids), 0.0))
    return out


def add_disambig_symbols(entries: Sequence[LexiconEntry]) -> Tuple[list, int]:
    """icefall's add_disambig_symbols: spellings that are a proper prefix of another or shared by several entries
    get ``#1, #2, ...`` appended (each entry of a shared spelling its own). Returns (entries, largest k used)."""
    count: dict = {}
    prefixes = set()
    for _, toks, _ in entries:
        count[toks] = count.get(toks, 0) + 1
        for k in range(1, len(toks)):
            prefixes.add(toks[:k])
    last: dict = {}
    out, max_k = [], 0
    for w, toks, sc in entries:
        if toks not in prefixes and count[toks] == 1:
            out.append((w, toks, sc))
            continue
        k = last.get(toks, 0) + 1
        last[toks] = k
        max_k = max(max_k, k)
        out.append((w, toks + (f"#{k}",), sc))
    return out, max_k


@dataclasses.dataclass(frozen=True, eq=False)
class Lang:
    """icefall's lang directory: the lexicon, tables and disambiguation settings.

    entries: [(word, token symbols, ln prob)] without disambiguation symbols; disambig_entries: with them.
    tokens: tokens.txt (ids < num_tokens are the model's outputs, blank 0; ``#0..#max_disambig`` follow);
    words: words.txt (``<eps>`` 0, the lexicon's words, ``#0``, ``<s>``, ``</s>``); boundary_ids: word-boundary
    token ids; word_boundary: "optional" or "required" (see the module docstring).
    """
    entries: tuple
    disambig_entries: tuple
    tokens: SymbolTable
    words: SymbolTable
    num_tokens: int
    max_disambig: int
    boundary_ids: tuple
    word_boundary: str

    @property
    def first_token_disambig_id(self) -> int:
        return self.tokens["#0"]

    @property
    def first_word_disambig_id(self) -> int:
        return self.words["#0"]

    @property
    def word_list(self) -> list:
        """The lexicon's words in words.txt order."""
        return [self.words[i] for i in range(1, self.first_word_disambig_id)]


def make_lang(entries: Sequence[LexiconEntry], tokens: SymbolTable, *, boundary_tokens: Sequence[str] = (),
              word_boundary: str = "optional", words: Optional[SymbolTable] = None) -> Lang:
    """The lang of `entries` (as `read_lexicon` gives) over `tokens` (tokens.txt: id 0 the blank; any ``#k``
    symbols already there are kept and missing ones appended). `boundary_tokens`: symbols of word-boundary tokens
    (e.g. ``<space>``), never part of a spelling. `words`: a words.txt to keep (every lexicon word below ``#0``,
    which is added after the largest id with ``<s>`` and ``</s>`` when absent); default: the words in order."""
    if word_boundary not in ("optional", "required"):
        raise ValueError(f"word_boundary: expected 'optional' or 'required', got {word_boundary!r}")
    if not isinstance(tokens, SymbolTable):
        raise TypeError(f"tokens: expected an fsa_ops.SymbolTable (tokens.txt), got {type(tokens).__name__}")
    entries = [(str(w), tuple(str(t) for t in toks), float(sc)) for w, toks, sc in entries]
    if not entries:
        raise ValueError("entries: the lexicon is empty")
    real = [i for i in tokens.ids if not _DISAMBIG.fullmatch(tokens[i])]
    num_tokens = max(real) + 1
    table = SymbolTable.from_str(tokens.to_str())      # a copy: the caller's table is left as it is
    boundary_ids = []
    for b in boundary_tokens:
        if b not in table:
            raise ValueError(f"boundary_tokens: {b!r} is not in tokens")
        boundary_ids.append(table[b])
    for n, (w, toks, sc) in enumerate(entries):
        if w in SPECIAL_WORDS or _DISAMBIG.fullmatch(w):
            raise ValueError(f"entries[{n}]: the word {w!r} is reserved (words.txt's {SPECIAL_WORDS} and #k)")
        if not toks:
            raise ValueError(f"entries[{n}]: the word {w!r} has no tokens")
        for t in toks:
            if t not in table:
                raise ValueError(f"entries[{n}]: token {t!r} of {w!r} is not in tokens")
            if table[t] == 0 or table[t] >= num_tokens or table[t] in boundary_ids:
                raise ValueError(f"entries[{n}]: token {t!r} of {w!r} is the blank, a disambiguation symbol or a "
                                 f"word-boundary token")
        if not np.isfinite(sc) or sc > 0:
            raise ValueError(f"entries[{n}]: the score of {w!r} must be a log-probability <= 0, got {sc}")
    dis, max_k = add_disambig_symbols(entries)
    for k in range(max_k + 1):
        s = f"#{k}"
        if s in table:
            if table[s] < num_tokens:
                raise ValueError(f"tokens: {s} has id {table[s]}, below a real token's id")
        else:
            table.add(s, max(table.ids) + 1)
    if words is None:
        words = SymbolTable()
        for w, _, _ in entries:
            if w not in words:
                words.add(w)
    else:
        if not isinstance(words, SymbolTable):
            raise TypeError(f"words: expected an fsa_ops.SymbolTable (words.txt), got {type(words).__name__}")
        words = SymbolTable.from_str(words.to_str())
    for s in SPECIAL_WORDS[1:]:
        if s not in words:
            words.add(s, max(words.ids) + 1)
    for w, _, _ in entries:
        if w not in words or words[w] >= words["#0"]:
            raise ValueError(f"words: the lexicon word {w!r} is {'absent' if w not in words else 'not below #0'}")
    return Lang(tuple(entries), tuple(dis), table, words, num_tokens, max_k, tuple(boundary_ids), word_boundary)


def lang_from_tokenizer(words_or_entries: Sequence, tokenizer: Any, *, word_boundary: str = "optional") -> Lang:
    """`make_lang` for a CharTokenizer / SentencePieceTokenizer: words (spelled by the tokenizer) or lexicon entries
    over its symbols; its word-boundary tokens (a space, a bare "▁") become `boundary_tokens`."""
    table = tokens_from_tokenizer(tokenizer)
    items = list(words_or_entries)
    entries = lexicon_from_words(items, tokenizer) if all(isinstance(w, str) for w in items) else items
    bounds = [table[i] for i in word_boundaries(tokenizer)[0]]
    return make_lang(entries, table, boundary_tokens=bounds, word_boundary=word_boundary)


def save_lang(lang: Lang, directory: Union[str, os.PathLike]) -> None:
    """Write icefall's lang directory: lexicon.txt, lexiconp.txt, lexicon_disambig.txt, tokens.txt, words.txt, and
    word_boundary.txt (the mode and the boundary token symbols, one line) that `load_lang` reads back."""
    d = os.fspath(directory)
    os.makedirs(d, exist_ok=True)
    files = {"lexicon.txt": lexicon_text(lang.entries), "lexiconp.txt": lexicon_text(lang.entries, True),
             "lexicon_disambig.txt": lexicon_text(lang.disambig_entries), "tokens.txt": lang.tokens.to_str(),
             "words.txt": lang.words.to_str(),
             "word_boundary.txt": " ".join([lang.word_boundary] + [lang.tokens[i] for i in lang.boundary_ids]) + "\n"}
    for name, text in files.items():
        with open(os.path.join(d, name), "w", encoding="utf-8") as f:
            f.write(text)


def load_lang(directory: Union[str, os.PathLike]) -> Lang:
    """A lang directory (icefall's or `save_lang`'s): lexiconp.txt (else lexicon.txt), tokens.txt, words.txt if
    present, word_boundary.txt if present (else no boundary tokens)."""
    d = os.fspath(directory)
    path = lambda name: os.path.join(d, name)     # noqa: E731
    probs = os.path.exists(path("lexiconp.txt"))
    entries = read_lexicon(path("lexiconp.txt" if probs else "lexicon.txt"), with_probs=probs)
    tokens = SymbolTable.from_file(path("tokens.txt"))
    words = SymbolTable.from_file(path("words.txt")) if os.path.exists(path("words.txt")) else None
    mode, bounds = "optional", []
    if os.path.exists(path("word_boundary.txt")):
        with open(path("word_boundary.txt"), encoding="utf-8") as f:
            fields = f.read().split()
        mode, bounds = (fields[0], fields[1:]) if fields else (mode, bounds)
    return make_lang(entries, tokens, boundary_tokens=bounds, word_boundary=mode, words=words)


def lexicon_fst(lang: Lang, disambig: bool = True) -> Fsa:
    """L: tokens -> words (aux_labels), as icefall's lexicon_to_fst_no_sil plus word-boundary loops.

    State 0 is the loop state (start); in "required" mode state 1 follows a word and a boundary token leads back
    to 0. Each spelling is a chain from 0 (to 1 when required) whose first arc carries the word and the entry's
    score; `disambig`: spellings end in their ``#k`` and the loop states get a ``#0:#0`` self-loop (G's backoff)."""
    tok, words = lang.tokens, lang.words
    req = lang.word_boundary == "required" and len(lang.boundary_ids) > 0
    end = 1 if req else 0
    nxt = 2 if req else 1
    arcs = []
    for w, toks, sc in (lang.disambig_entries if disambig else lang.entries):
        ids = [tok[t] for t in toks]
        cur = 0
        for i, t in enumerate(ids):
            dst = end if i == len(ids) - 1 else nxt
            if dst == nxt:
                nxt += 1
            arcs.append((cur, dst, t, words[w] if i == 0 else 0, sc if i == 0 else 0.0))
            cur = dst
    loops = (0, 1) if req else (0,)
    for b in lang.boundary_ids:
        arcs.append((0, 0, b, 0, 0.0))
        if req:
            arcs.append((1, 0, b, 0, 0.0))
    if disambig:
        for s in loops:
            arcs.append((s, s, lang.first_token_disambig_id, lang.first_word_disambig_id, 0.0))
    for s in loops:
        arcs.append((s, nxt, -1, -1, 0.0))
    a = np.array([x[:4] for x in arcs], np.int64)
    return Fsa.from_arcs(a[:, 0], a[:, 1], a[:, 2], np.array([x[4] for x in arcs], np.float32), num_states=nxt + 1,
                         aux_labels=a[:, 3].astype(np.int32))


def _word_id(lang: Lang, w: str, what: str) -> int:
    if w == "<eps>":
        return 0
    if w not in lang.words or lang.words[w] >= lang.first_word_disambig_id:
        raise ValueError(f"{what}: the word {w!r} is not in the lexicon")
    return lang.words[w]


def _sentences_fsa(lang: Lang, sentences) -> Fsa:
    children, final = [{}], [False]
    for n, s in enumerate(sentences):
        ws = s.split() if isinstance(s, str) else list(s)
        node = 0
        for w in ws:
            i = _word_id(lang, w, f"grammar[{n}]")
            if i == 0:
                continue
            if i not in children[node]:
                children[node][i] = len(children)
                children.append({})
                final.append(False)
            node = children[node][i]
        final[node] = True
    F = len(children)
    arcs = [(s, d, w) for s, ch in enumerate(children) for w, d in ch.items()] + \
           [(s, F, -1) for s in range(F) if final[s]]
    a = np.array(arcs, np.int64).reshape(-1, 3)
    return Fsa.from_arcs(a[:, 0], a[:, 1], a[:, 2], np.zeros(len(a), np.float32), num_states=F + 1)


def _text_fsa(lang: Lang, text: str) -> Fsa:
    """OpenFst acceptor text with word symbols (``src dst word [cost]``, ``state [cost]``; costs = -ln p)."""
    lines = []
    for n, line in enumerate(text.splitlines(), 1):
        f = line.split()
        if len(f) in (3, 4):
            f[2] = str(_word_id(lang, f[2], f"grammar line {n}"))
        elif len(f) not in (0, 1, 2):
            raise ValueError(f"grammar line {n}: expected 'src dst word [cost]' or 'state [cost]', got {line!r}")
        lines.append(" ".join(f))
    return Fsa.from_openfst("\n".join(lines) + "\n", acceptor=True)


def _ngram_fsa(lang: Lang, lm: NgramLM) -> Fsa:
    """ngram_to_fsa on words.txt ids (#0 on backoff arcs); lexicon words the LM lacks get copies of its <unk> arcs
    when <unk> is in the model (so that G scores them as ``lm.score_words`` does)."""
    d0 = lang.first_word_disambig_id
    unk = lm.vocab.words[lm.unk_id]
    missing = [i for i in range(1, d0) if lang.words[i] not in lm.vocab]
    if not missing or not lm.unk_in_model or unk in lang.words:
        return ngram_to_fsa(lm, word_table=lang.words, backoff_label=d0)
    table = SymbolTable.from_str(lang.words.to_str())
    tmp = table.add(unk, max(table.ids) + 1)
    g = ngram_to_fsa(lm, word_table=table, backoff_label=d0)
    lab = np.asarray(g.label)
    is_unk = lab == tmp
    rep = np.flatnonzero(is_unk)
    keep = np.flatnonzero(~is_unk)
    idx = np.concatenate([keep, np.repeat(rep, len(missing))])
    new_lab = np.concatenate([lab[keep], np.tile(np.asarray(missing, np.int32), len(rep))])
    return arc_sort(Fsa.from_arcs(np.asarray(g.src)[idx], np.asarray(g.dst)[idx], new_lab, np.asarray(g.score)[idx],
                                  num_states=int(g.num_states)))


def grammar_fsa(lang: Lang, grammar: Union[None, NgramLM, Fsa, str, Sequence] = None) -> Fsa:
    """G: an arc-sorted acceptor on words.txt ids, log-probability scores, epsilons (backoff) labelled ``#0``.

    grammar: None (every word sequence, score 0: a free word loop); an `NgramLM` (`jasr.ngram.ngram_to_fsa`;
    LM words outside the lexicon are skipped, lexicon words outside the LM take its <unk> arcs if it has any); an
    `Fsa` on word ids; OpenFst acceptor text with word symbols (``src dst word [cost]`` lines, final states
    ``state [cost]``, ``<eps>`` allowed; costs are -ln p, as OpenFst); or a list of allowed sentences (strings or word
    lists; ``[[w] for w in words]``: one word)."""
    d0 = lang.first_word_disambig_id
    if grammar is None:
        n = d0 - 1
        src = np.zeros(n + 1, np.int64)
        dst = np.append(np.zeros(n, np.int64), 1)
        g = Fsa.from_arcs(src, dst, np.append(np.arange(1, n + 1), -1), np.zeros(n + 1, np.float32), num_states=2)
    elif isinstance(grammar, NgramLM):
        g = _ngram_fsa(lang, grammar)
    elif isinstance(grammar, Fsa):
        if grammar.is_batch:
            raise ValueError("grammar: expected a single Fsa, got a batch")
        g = grammar.replace(aux_labels=None)
    elif isinstance(grammar, str):
        g = _text_fsa(lang, grammar)
    elif isinstance(grammar, (list, tuple)):
        g = _sentences_fsa(lang, grammar)
    else:
        raise TypeError(f"grammar: expected None, an NgramLM, an Fsa, FSA text or a list of sentences, got "
                        f"{type(grammar).__name__}")
    lab = np.asarray(g.label).copy()
    if lab.size and (lab.max() > d0 or lab.min() < -1):
        raise ValueError(f"grammar: word labels must be lexicon word ids in [1, {d0}) (or 0 / #0 = {d0} on backoff "
                         f"arcs, -1 on final arcs), got [{lab.min()}, {lab.max()}]")
    lab[lab == 0] = d0
    return arc_sort(g.replace(label=lab.astype(np.int32), attrs={}))


def compile_lg(lang: Lang, grammar: Union[None, NgramLM, Fsa, str, Sequence] = None) -> Fsa:
    """LG as icefall's compile_LG: connect(L o G), determinize, disambiguation symbols to epsilon, remove_epsilon,
    connect, arc_sort. Labels: tokens (no epsilon); aux_labels: a `Ragged` row of words per arc ([-1] on final
    arcs). ValueError if no sentence of the grammar can be spelled with the lexicon."""
    L = arc_sort(lexicon_fst(lang, disambig=True))
    G = grammar_fsa(lang, grammar)
    LG = connect(compose(L, G))
    if int(LG.num_states) == 0:
        raise ValueError("compile_lg: L o G is empty: no sentence of the grammar uses only lexicon words")
    LG = connect(determinize(LG))
    labels = np.asarray(LG.label).copy()
    labels[labels >= lang.first_token_disambig_id] = 0
    aux = LG.attrs["aux_labels"]
    vals = np.asarray(aux.values).copy()
    vals[vals >= lang.first_word_disambig_id] = 0
    LG = LG.replace(label=labels, aux_labels=type(aux)(vals, np.asarray(aux.lengths)))
    LG = connect(remove_epsilon(LG))
    LG = LG.replace(aux_labels=LG.attrs["aux_labels"].remove_values_eq(0))
    return arc_sort(LG)


@dataclasses.dataclass(frozen=True, eq=False)
class DecodingGraph:
    """A decoding graph and its lang: `fsa` (HLG / TLG: labels = frame labels 0..num_tokens-1, aux_labels =
    Ragged words, ``tokens`` = the token each arc emits (0: none), ``lm_scores`` = the graph score)."""
    fsa: Fsa
    lang: Lang
    kind: str = "HLG"

    @property
    def num_tokens(self) -> int:
        return self.lang.num_tokens


def compile_hlg(lang: Lang, grammar: Union[None, NgramLM, Fsa, str, Sequence] = None, *,
                modified: bool = False) -> DecodingGraph:
    """HLG (icefall's compile_HLG): H = fsa_ops.ctc_topo(num_tokens - 1, `modified`), HLG = arc_sort(connect(
    H o LG)) with ``tokens`` (H's output) and ``lm_scores`` (= scores) attributes. See `grammar_fsa` for `grammar`."""
    LG = compile_lg(lang, grammar)
    H = ctc_topo(lang.num_tokens - 1, modified=bool(modified))
    HLG = arc_sort(connect(compose(H, LG, inner_labels="tokens")))
    HLG = HLG.replace(lm_scores=np.asarray(HLG.score, np.float32).copy())
    return DecodingGraph(HLG, lang, "HLG")


def compile_tlg(lang: Lang, grammar: Union[None, NgramLM, Fsa, str, Sequence] = None, *,
                modified: bool = False) -> DecodingGraph:
    """`compile_hlg` under its name for token (BPE / character) lexicons: T is the CTC topology."""
    g = compile_hlg(lang, grammar, modified=modified)
    return DecodingGraph(g.fsa, g.lang, "TLG")
