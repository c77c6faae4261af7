"""Decoding settings and the CTC searches they name (decode.py's ``--method`` and the run config's ``decode``
section, see :func:`settings_from_config`):

* ``greedy``: best path;
* ``beam``: CTC prefix beam search (:func:`jasr.ctc_beam.ctc_prefix_beam_search`), with a word n-gram LM (ARPA;
  the words the LM knows, or ``lexicon``, spell the words it scores) and hotwords when given;
* ``lexicon``: the same search constrained to the words of ``lexicon``, with ``lm`` (or ``grammar``) fused;
* ``graph``: HLG decoding (:func:`jasr.hlg.compile_hlg` of ``lexicon`` and ``grammar`` or ``lm``;
  :func:`jasr.graph_decoding.one_best` over ``intersect_dense_pruned``, ``lm_weight`` as the graph's scale).

:func:`make_searcher` returns a :class:`Searcher`: a callable over [B, T, V] CTC log-probs and how its tokens
split into words.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

import jax
import ml_collections
import numpy as np

from jasr.config import check_decode
from jasr.ctc_beam import ctc_prefix_beam_search
from jasr.errors import ConfigError
from jasr.graph_decoding import (GraphHypothesis, attention_rescoring, empty_hypothesis, nbest, nbest_rescoring,
                                  one_best, whole_lattice_rescoring)
from jasr.hlg import compile_hlg, lang_from_tokenizer
from jasr.lexicon import lexicon_from_tokenizer, make_hotwords, make_lm_lookahead, word_boundaries
from jasr.ngram import read_arpa
from jasr.run_data import resolve

__all__ = ["GRAPH_DEFAULTS", "GRAPH_METHODS", "LONG_AUDIO_DEFAULTS", "MESH_DEFAULTS", "OPTIONAL_DEFAULTS",
           "GraphResult", "SETTING_KEYS", "Searcher", "check_graph_settings",
           "graph_searcher", "make_searcher", "read_word_list", "settings_from_config",
           "spelled_words", "unspellable_note"]

SETTING_KEYS = ("method", "beam", "nbest", "lm", "lm_weight", "word_bonus", "lexicon", "grammar", "hotwords",
                "hotword_boost", "token_min_logp", "length_penalty", "ctc_weight")
GRAPH_METHODS = ("one_best", "nbest", "nbest_rescoring", "whole_lattice_rescoring", "attention_rescoring")
# method 'graph' settings: read from a config's decode section where it has them, else these defaults
GRAPH_DEFAULTS = {"graph_decoding": "one_best", "num_paths": 100, "nbest_scale": 0.5, "rescore_lm": "",
                  "lm_scales": (), "attention_scales": (1.0,)}
# files longer than long_file_seconds: CTC heads run over chunk_seconds windows with context_seconds each side
# (jasr.long_audio); attention decoders decode pieces of at most segment_seconds cut in silence
LONG_AUDIO_DEFAULTS = {"long_file_seconds": 60.0, "chunk_seconds": 10.0, "context_seconds": 2.0,
                       "segment_seconds": 20.0}
# devices: the parameters sharded over mesh_tensor x mesh_fsdp local devices (1 x 1: replicated), batches over
# the devices left over (jasr.transcribe.decode_mesh)
MESH_DEFAULTS = {"mesh_tensor": 1, "mesh_fsdp": 1}
OPTIONAL_DEFAULTS = {**GRAPH_DEFAULTS, **LONG_AUDIO_DEFAULTS, **MESH_DEFAULTS, "lm_lookahead": False}


def settings_from_config(cfg: ml_collections.ConfigDict, overrides: dict | None = None, *,
                         root: str = ".") -> ml_collections.ConfigDict:
    """The run config's decode section (defaults of jasr.config.base_config for a run saved without one) with
    `overrides` (decode.py's flags: key -> value, None = not given) on top; config paths resolve against `root`
    (the repo), flag paths as given. Raises ConfigError naming the bad setting."""
    dc = ml_collections.ConfigDict({k: cfg.decode[k] for k in SETTING_KEYS})
    for k, v in OPTIONAL_DEFAULTS.items():       # keys a run saved before they existed lacks
        dc[k] = cfg.decode.get(k, v)
    for k in ("lm", "lexicon", "grammar", "rescore_lm"):
        if dc[k]:
            dc[k] = resolve(dc[k], root)
    for k, v in (overrides or {}).items():
        if v is not None:
            dc[k] = tuple(v) if isinstance(v, list) else v
    check_decode(dc, prefix="decode setting '")
    check_graph_settings(dc)
    for k in ("lm", "lexicon", "grammar", "rescore_lm"):
        if dc[k] and not os.path.isfile(dc[k]):
            raise ConfigError(f"decode setting '{k}': {dc[k]!r} does not exist")
    return dc


def check_graph_settings(dc: ml_collections.ConfigDict) -> None:
    """Checks the settings of method 'graph', of long files and of the decode mesh (GRAPH_DEFAULTS',
    LONG_AUDIO_DEFAULTS', MESH_DEFAULTS' keys); ConfigError naming the setting."""
    def req(cond, key, msg):
        if not cond:
            raise ConfigError(f"decode setting '{key}' {msg}")
    req(dc.graph_decoding in GRAPH_METHODS, "graph_decoding", f"must be one of {GRAPH_METHODS}, got "
                                                              f"{dc.graph_decoding!r}")
    req(dc.num_paths >= 1, "num_paths", f"must be >= 1, got {dc.num_paths}")
    req(dc.nbest_scale > 0, "nbest_scale", f"must be > 0, got {dc.nbest_scale}")
    for k in ("lm_scales", "attention_scales"):
        req(all(float(x) > 0 for x in dc[k]), k, f"must be values > 0, got {tuple(dc[k])}")
    req(len(dc.attention_scales) >= 1, "attention_scales", "needs at least one value")
    for k in ("long_file_seconds", "chunk_seconds", "segment_seconds"):
        req(dc[k] > 0, k, f"must be > 0, got {dc[k]}")
    req(dc.context_seconds >= 0, "context_seconds", f"must be >= 0, got {dc.context_seconds}")
    for k in MESH_DEFAULTS:
        req(isinstance(dc[k], int) and dc[k] >= 1, k, f"must be an int >= 1, got {dc[k]!r}")


def read_word_list(path: str) -> list[str]:
    """The words of a lexicon file: the first column of each non-empty line (a k2 lexicon.txt's token columns are
    ignored: words are spelled with the run's tokenizer), duplicates removed, order kept."""
    with open(path, encoding="utf-8") as f:
        words = [line.split()[0] for line in f if line.strip() and not line.startswith("#")]
    return list(dict.fromkeys(words))


@dataclasses.dataclass
class Searcher:
    """A CTC search over [B, T, V] log-probs: the prefix beam search with its lexicon / LM / hotwords, or the
    greedy best path (``search is None``); ``boundary_ids`` / ``word_start_ids`` split tokens into words."""
    settings: Any
    blank_id: int
    boundary_ids: tuple
    word_start_ids: tuple
    search: Callable | None = None
    description: str = "greedy (CTC best path)"
    graph: bool = False                # search returns GraphResults
    needs_attention: bool = False      # graph search with an attention decoder's score_fn (attention_rescoring)
    keys: tuple = ()                   # rescoring methods: the scale keys of GraphResult.by_key


def spelled_words(words, tokenizer) -> tuple[list[str], list[str]]:
    """(words the tokenizer can spell, words it cannot)."""
    ok, bad = [], []
    for w in words:
        try:
            ids = tokenizer.encode(w)
            (ok if len(ids) else bad).append(w)
        except ValueError:
            bad.append(w)
    return ok, bad


def unspellable_note(words: list[str]) -> str:
    """The description's note on lexicon words the tokenizer cannot spell ("" when there are none)."""
    return f" ({len(words)} that the run's tokenizer cannot spell left out, e.g. {words[:3]})" if words else ""


def make_searcher(settings: ml_collections.ConfigDict, tokenizer, blank_id: int) -> Searcher:
    """The CTC search of `settings` (see the module docstring) for a run's tokenizer. Raises ConfigError for a
    lexicon or LM that does not fit the tokenizer."""
    s = settings
    try:
        boundary, start = word_boundaries(tokenizer)
    except ValueError:
        boundary, start = [], []
    base = Searcher(s, blank_id, tuple(boundary), tuple(start))
    if s.method == "greedy":
        return base
    if s.method == "graph":
        return graph_searcher(base, s, tokenizer)
    lm_path = s.lm or (s.grammar if s.method == "lexicon" else "")
    try:
        lm = read_arpa(lm_path) if lm_path else None
    except (ValueError, OSError) as e:
        raise ConfigError(f"decode: cannot read the ARPA LM {lm_path}: {e}") from e
    words = read_word_list(s.lexicon) if s.lexicon else []
    if not words and lm is not None:            # the LM's words spell the words it scores (as pyctcdecode)
        words = [w for w in lm.vocab.words if w not in ("<s>", "</s>", "<unk>")]
    lexicon = None
    if words:
        words, unspellable = spelled_words(words, tokenizer)
        if not words:
            raise ConfigError("decode: no word of the lexicon / LM can be spelled with the run's tokenizer")
        if not boundary and not start:
            raise ConfigError("decode: the run's tokenizer has no word boundaries: a lexicon or word LM needs them")
        ids = [int(lm.ids([w])[0]) for w in words] if lm is not None else list(range(len(words)))
        lexicon = lexicon_from_tokenizer(words, tokenizer, word_ids=ids,
                                         unk_id=lm.unk_id if lm is not None else len(words))
    hot = None
    if s.hotwords:
        hot = make_hotwords([tokenizer.encode(h) for h in s.hotwords], tokenizer.vocab_size, s.hotword_boost)
    kw = dict(beam=int(s.beam), nbest=int(s.nbest), blank_id=blank_id, token_min_logp=float(s.token_min_logp),
              lm=lm, lm_weight=float(s.lm_weight) if lm is not None else 0.0, lm_level="word",
              word_bonus=float(s.word_bonus), lexicon=lexicon, constrain_to_lexicon=s.method == "lexicon",
              hotwords=hot)
    if s.lm_lookahead:
        if lm is None or lexicon is None:
            raise ConfigError("decode setting 'lm_lookahead' needs a word LM (--lm, or --grammar with --method "
                              "lexicon): it scores partial words by the best LM word below them in the lexicon")
        kw["lm_lookahead"] = make_lm_lookahead(lexicon, lm)
    desc = f"{s.method} (CTC prefix beam search, beam {s.beam}"
    if lexicon is not None:
        desc += f", {'constrained to ' if s.method == 'lexicon' else ''}{len(words)} lexicon words"
        desc += unspellable_note(unspellable)
    if lm is not None:
        desc += f", word {lm.order}-gram LM {os.path.basename(lm_path)} x {s.lm_weight}"
        desc += ", LM look-ahead" if s.lm_lookahead else ""
    desc += f"{', word bonus %g' % s.word_bonus if s.word_bonus else ''}{', hotwords' if hot else ''})"
    return dataclasses.replace(base, search=lambda lp, pads: ctc_prefix_beam_search(lp, pads, **kw),
                               description=desc)


@dataclasses.dataclass(frozen=True)
class GraphResult:
    """One utterance's graph decoding: the hypothesis written (`best`), the n-best list where the method gives one
    (best first) and, for rescoring methods, the best hypothesis per scale key (icefall's keys, e.g.
    ``"lm_scale_0.5"``)."""
    best: GraphHypothesis
    nbest: tuple = ()
    by_key: tuple = ()          # ((key, GraphHypothesis), ...) in the order of the scales given


def _scale_key(method: str, lm_scale: float, att_scale: float = 1.0) -> str:
    return (f"ngram_lm_scale_{lm_scale}_attention_scale_{att_scale}" if method == "attention_rescoring"
            else f"lm_scale_{lm_scale}")


def graph_searcher(base: Searcher, s, tokenizer) -> Searcher:
    """HLG of the lexicon's words and the grammar (or LM) ARPA, searched with graph scale ``lm_weight`` and decoded
    by ``s.graph_decoding`` (jasr.graph_decoding: one_best, nbest, nbest_rescoring, whole_lattice_rescoring,
    attention_rescoring). The search is ``search(log_probs, paddings, score_fn=None) -> [GraphResult]``;
    attention_rescoring needs ``score_fn(token_seqs, utt) -> [N]`` (the attention decoder on the batch's audio)."""
    words, unspellable = spelled_words(read_word_list(s.lexicon), tokenizer)
    if not words:
        raise ConfigError("decode: no word of the lexicon can be spelled with the run's tokenizer")
    path = s.grammar or s.lm
    try:
        graph = compile_hlg(lang_from_tokenizer(words, tokenizer), read_arpa(path))
    except (ValueError, OSError) as e:
        raise ConfigError(f"decode: cannot build HLG from {s.lexicon} and {path}: {e}") from e
    if not s.lm_weight > 0:
        raise ConfigError("decode setting 'lm_weight' must be > 0 for method 'graph' (the graph's scale)")
    how = s.graph_decoding
    scale = float(s.lm_weight)
    lm_scales = tuple(float(x) for x in s.lm_scales) or (scale,)
    att_scales = tuple(float(x) for x in s.attention_scales)
    rescore_path = s.rescore_lm or path
    rescore_lm = None
    if how in ("nbest_rescoring", "whole_lattice_rescoring"):
        try:
            rescore_lm = read_arpa(rescore_path)
        except (ValueError, OSError) as e:
            raise ConfigError(f"decode: cannot read the rescoring LM {rescore_path}: {e}") from e
    paths = dict(num_paths=int(s.num_paths), nbest_scale=float(s.nbest_scale))
    keys = ([_scale_key(how, a, b) for a in lm_scales for b in att_scales] if how == "attention_rescoring"
            else [_scale_key(how, a) for a in lm_scales] if how.endswith("_rescoring") else [])

    def search(lp, pads, score_fn=None):
        key = jax.random.PRNGKey(0)
        if how == "one_best":
            return [GraphResult(h) for h in one_best(graph, lp, pads, lm_scale=scale)]
        if how == "nbest":
            lists = nbest(graph, lp, pads, key, lm_scale=scale, **paths)
            return [GraphResult(hs[0] if hs else empty_hypothesis(), tuple(hs)) for hs in lists]
        if how == "whole_lattice_rescoring":
            out = whole_lattice_rescoring(graph, lp, pads, rescore_lm, lm_scales=lm_scales, lm_scale=scale)
            return [GraphResult(out[keys[0]][u], (), tuple((k, out[k][u]) for k in keys)) for u in range(len(lp))]
        if how == "nbest_rescoring":
            out = nbest_rescoring(graph, lp, pads, rescore_lm, key, lm_scales=lm_scales, lm_scale=scale,
                                  keep_all=True, **paths)
        else:
            if score_fn is None:
                raise ValueError("attention_rescoring needs score_fn (the attention decoder)")
            out = attention_rescoring(graph, lp, pads, score_fn, key, ngram_lm_scales=lm_scales,
                                      attention_scales=att_scales, lm_scale=scale, keep_all=True,
                                      token_seq_fn=lambda h: tokenizer.encode(h.text), **paths)
        first = out[keys[0]]
        return [GraphResult(first[u][0] if first[u] else empty_hypothesis(), tuple(first[u]),
                            tuple((k, out[k][u][0] if out[k][u] else empty_hypothesis()) for k in keys))
                for u in range(len(lp))]

    arcs = int(np.asarray(graph.fsa.num_arcs))
    what = {"one_best": "one best",
            "nbest": f"n-best of {s.num_paths} sampled paths (nbest scale {s.nbest_scale})",
            "nbest_rescoring": f"n-best of {s.num_paths} paths rescored by {os.path.basename(rescore_path)} at lm "
                               f"scale {', '.join(map(str, lm_scales))}",
            "whole_lattice_rescoring": f"whole lattice rescored by {os.path.basename(rescore_path)} at lm scale "
                                       f"{', '.join(map(str, lm_scales))}",
            "attention_rescoring": f"n-best of {s.num_paths} paths rescored by the attention decoder (lm scale "
                                   f"{', '.join(map(str, lm_scales))}; attention scale "
                                   f"{', '.join(map(str, att_scales))})"}[how]
    desc = (f"graph (HLG of {len(words)} lexicon words{unspellable_note(unspellable)} and "
            f"{os.path.basename(path)}, {arcs} arcs, {what} over intersect_dense_pruned, graph scale {s.lm_weight})")
    return dataclasses.replace(base, search=search, description=desc, graph=True,
                               needs_attention=how == "attention_rescoring", keys=tuple(keys))
