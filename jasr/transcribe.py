"""The decode pipeline behind decode.py: which audio, which search, batched decoding, writers and error reports.

:func:`collect_utterances` turns a split, a manifest or files/folders into utterances (input order kept; files
that cannot be read become records with a reason). :func:`transcribe` decodes them with a loaded run
(:func:`jasr.training.load_run`) in the run's length-bucketed batch shapes (a handful of compiled programs) and
returns one result per input, in input order. :func:`make_searcher` turns decoding settings (a config's ``decode``
section, see :func:`settings_from_config`, with decode.py's flags on top) into the search of a CTC model:

* ``greedy``: best path (every family; AED and Whisper use their own decoders);
* ``beam``: CTC prefix beam search (:func:`jasr.ctc_beam.ctc_prefix_beam_search`), with a word n-gram LM (ARPA;
  the words the LM knows, or ``lexicon``, spell the words it scores) and hotwords when given; for a family
  without a CTC head, its attention decoder's beam search (:meth:`jasr.tasks.Task.beam_decode`: AED with length
  normalisation and optional joint CTC prefix scores, Whisper with the KV cache over its first 30 s window);
* ``lexicon``: the same search constrained to the words of ``lexicon``, with ``lm`` (or ``grammar``) fused;
* ``graph``: HLG decoding (:func:`jasr.hlg.compile_hlg` of ``lexicon`` and ``grammar`` or ``lm``;
  :func:`jasr.graph_decoding.one_best` over ``intersect_dense_pruned``, ``lm_weight`` as the graph's scale).

Results are dicts: ``id``, ``ref``, ``hyp``, ``tokens``, ``score``, ``duration``, ``nbest`` ([{"text", "score"}]
with n-best > 1), ``words`` ([{"word", "start", "end"}] where the method gives token frames), or ``error``.
Writers: JSONL, plain text, SRT / WebVTT, CTM (:func:`write_results`).
"""
from __future__ import annotations

import dataclasses
import inspect
import json
import os
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from tqdm.auto import tqdm

from jasr.audio import AudioError, audio_info
from jasr.config import apply_override, check_decode, load_config_file
from jasr.ctc_beam import ctc_prefix_beam_search, word_timestamps
from jasr.errors import ConfigError
from jasr.graph_decoding import one_best
from jasr.hlg import compile_hlg, lang_from_tokenizer
from jasr.lexicon import lexicon_from_tokenizer, make_hotwords, word_boundaries
from jasr.manifests import AUDIO_EXTENSIONS, ManifestError, Utterance, check_utterances, read_folder, read_manifest
from jasr.ngram import read_arpa
from jasr.run_data import (feature_config, make_eval_loader, reference_texts, resolve, split_utterances,
                           with_placeholder_transcripts)
from jasr.steps import AUDIO_KEYS, TrainState
from jasr.tasks import Task, build_task, family
from jasr.tasks.base import SearchOptions
from jasr.tokenizers import TokenizerError, load_tokenizer
from jasr.training import RunInfo, decode_function, score_results
from models.hf_io import load_state_dict
from models.wav2vec2_hf import params_from_hf_state_dict

__all__ = ["FORMATS", "HFCTCTokenizer", "Searcher", "alignment", "collect_utterances", "ctc_log_probs",
           "error_report", "format_from_path", "load_hf_model", "make_searcher", "settings_from_config",
           "transcribe", "write_results"]

FORMATS = ("jsonl", "txt", "srt", "vtt", "ctm")
SETTING_KEYS = ("method", "beam", "nbest", "lm", "lm_weight", "word_bonus", "lexicon", "grammar", "hotwords",
                "hotword_boost", "token_min_logp", "length_penalty", "ctc_weight")


# ------------------------------------------------------------------------------------------------------------
# inputs

def collect_utterances(cfg: ml_collections.ConfigDict, root: str, *, split: str | None = None,
                       manifest: str | None = None, paths: tuple = ()) -> tuple[str, list[Utterance], list[dict]]:
    """(name, utterances, unreadable records {"id", "audio", "reason"}) of a run's split, a JSONL manifest, or
    audio files and folders (a folder's transcripts from <stem>.txt / *.trans.txt where every file has one).
    Utterances without a transcript carry jasr.run_data's placeholder."""
    bad: list[dict] = []
    if split:
        return split, split_utterances(cfg, split, root, bad=bad), bad
    if manifest:
        if not os.path.exists(manifest):
            raise FileNotFoundError(f"--manifest: {manifest} does not exist")
        utts = read_manifest(manifest, allow_empty_text=True, bad=bad)
        return os.path.splitext(os.path.basename(manifest))[0], with_placeholder_transcripts(utts), bad
    utts: list[Utterance] = []
    for p in paths:
        if os.path.isdir(p):
            try:
                utts += read_folder(p, bad=bad)
                continue
            except ManifestError:        # not every file has a transcript: decode them all, unlabelled
                files = sorted(os.path.join(d, n) for d, _, names in os.walk(p) for n in names
                               if os.path.splitext(n)[1].lower() in AUDIO_EXTENSIONS)
        elif not os.path.exists(p):
            raise FileNotFoundError(f"audio file {p!r} does not exist")
        else:
            files = [p]
        for f in files:
            uid = os.path.splitext(os.path.basename(f))[0]
            try:
                info = audio_info(f)
            except AudioError as e:
                bad.append({"id": uid, "audio": os.path.abspath(f), "reason": str(e)})
                continue
            utts.append(Utterance(id=uid, audio_path=os.path.abspath(f), text="", duration=info.duration,
                                  sample_rate=info.sample_rate))
    return "files", with_placeholder_transcripts(utts), bad


# ------------------------------------------------------------------------------------------------------------
# Hugging Face models, decoded directly

class HFCTCTokenizer:
    """The vocabulary of a transformers Wav2Vec2CTCTokenizer (``vocab.json``: token -> id) as a character tokenizer:
    single-character tokens spell text, the word delimiter ("|") is the space, multi-character tokens (<pad>,
    <s>, </s>, <unk>) decode to nothing. ``chars[i]`` is the character of id i + 1 (jasr.lexicon's convention)."""
    type_name = "hf_ctc"

    def __init__(self, vocab: dict, vocab_size: int = 0, word_delimiter: str = "|"):
        self.vocab_size = max([vocab_size, *[i + 1 for i in vocab.values()]])
        piece = {i: t for t, i in vocab.items()}
        self.chars = [(" " if piece.get(i) == word_delimiter else piece.get(i, "")) for i in range(1, self.vocab_size)]
        self.chars = [c if len(c) == 1 else "" for c in self.chars]
        self._index = {c: i + 1 for i, c in enumerate(self.chars) if c}

    def encode(self, text: str) -> list[int]:
        missing = sorted({c for c in text if c not in self._index})
        if missing:
            raise TokenizerError(f"characters not in the model's vocabulary: {missing[:10]}")
        return [self._index[c] for c in text]

    def decode(self, ids) -> str:
        return "".join(self.chars[i - 1] for i in ids if 0 < i < self.vocab_size)


def load_hf_model(directory: str, root: str) -> RunInfo:
    """A Hugging Face Whisper (WhisperForConditionalGeneration) or Wav2Vec2-CTC (Wav2Vec2ForCTC, with its vocab.json)
    directory as a RunInfo for :func:`transcribe`, with the settings of configs/whisper_finetune.py or
    configs/wav2vec2_ctc.py (features, batching) and the model's own tokenizer and output layer."""
    path = os.path.join(directory, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--hf-model: {directory} is not a Hugging Face model directory (no config.json)")
    with open(path) as f:
        hf = json.load(f)
    kind, archs = hf.get("model_type"), hf.get("architectures") or []
    if kind == "whisper":
        cfg = load_config_file(os.path.join(root, "configs", "whisper_finetune.py"))
        vocab = int(hf.get("vocab_size", 51865))
        spec = "whisper:gpt2" if vocab < 51865 else ("whisper:multilingual:100" if vocab > 51865
                                                     else "whisper:multilingual")
        apply_override(cfg, "data.tokenizer", spec)
        apply_override(cfg, "data.num_mel_bins", str(int(hf.get("num_mel_bins", 80))))
        tok = load_tokenizer(spec)
        task = build_task(cfg, tok.vocab_size, feature_config(cfg), tokenizer=tok, hf_dir=directory)
        params = task.load_pretrained(directory, jax.random.PRNGKey(0))
    elif kind == "wav2vec2" and any(a.endswith("ForCTC") for a in archs):
        vpath = os.path.join(directory, "vocab.json")
        if not os.path.isfile(vpath):
            raise FileNotFoundError(f"--hf-model: {directory} has no vocab.json (the CTC tokenizer's vocabulary)")
        if int(hf.get("pad_token_id", 0)) != 0:
            raise ConfigError(f"--hf-model: jasr's CTC blank is id 0, the model's pad (blank) id is "
                              f"{hf['pad_token_id']}")
        with open(vpath) as f:
            tok = HFCTCTokenizer(json.load(f), int(hf.get("vocab_size", 0)))
        cfg = load_config_file(os.path.join(root, "configs", "wav2vec2_ctc.py"))
        for k in ("mask_time_prob", "mask_feature_prob"):     # as the checkpoint (masked_spec_embed or not)
            with cfg.model.unlocked():
                cfg.model[k] = float(hf.get(k, 0.0))
        task = build_task(cfg, tok.vocab_size, feature_config(cfg), tokenizer=tok, hf_dir=directory)
        params = params_from_hf_state_dict(load_state_dict(directory), task.model.config, "ctc")
    else:
        raise ConfigError(f"--hf-model: {directory} holds a {kind!r} model {archs}; decode.py reads Whisper "
                          f"(WhisperForConditionalGeneration) and Wav2Vec2ForCTC directories")
    apply_override(cfg, "train.init_from", directory)
    state = TrainState(step=jnp.zeros((), jnp.int32), params=params, model_state={}, opt_state=(),
                       rng=jax.random.PRNGKey(0), skipped=jnp.zeros((), jnp.int32))
    return RunInfo(cfg, tok, task, state, 0, None)


# ------------------------------------------------------------------------------------------------------------
# settings and search

def settings_from_config(cfg: ml_collections.ConfigDict, overrides: dict | None = None, *,
                         root: str = ".") -> ml_collections.ConfigDict:
    """The run config's decode section (defaults of jasr.config.base_config for a run saved without one) with
    `overrides` (decode.py's flags: key -> value, None = not given) on top; config paths resolve against `root`
    (the repo), flag paths as given. Raises ConfigError naming the bad setting."""
    dc = ml_collections.ConfigDict({k: cfg.decode[k] for k in SETTING_KEYS})
    for k in ("lm", "lexicon", "grammar"):
        if dc[k]:
            dc[k] = resolve(dc[k], root)
    for k, v in (overrides or {}).items():
        if v is not None:
            dc[k] = tuple(v) if isinstance(v, list) else v
    check_decode(dc, prefix="decode setting '")
    for k in ("lm", "lexicon", "grammar"):
        if dc[k] and not os.path.isfile(dc[k]):
            raise ConfigError(f"decode setting '{k}': {dc[k]!r} does not exist")
    return dc


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
    graph: bool = False                # search returns jasr.graph_decoding hypotheses


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
    desc = f"{s.method} (CTC prefix beam search, beam {s.beam}"
    if lexicon is not None:
        desc += f", {'constrained to ' if s.method == 'lexicon' else ''}{len(words)} lexicon words"
        desc += unspellable_note(unspellable)
    if lm is not None:
        desc += f", word {lm.order}-gram LM {os.path.basename(lm_path)} x {s.lm_weight}"
    desc += f"{', word bonus %g' % s.word_bonus if s.word_bonus else ''}{', hotwords' if hot else ''})"
    return dataclasses.replace(base, search=lambda lp, pads: ctc_prefix_beam_search(lp, pads, **kw),
                               description=desc)


def graph_searcher(base: Searcher, s, tokenizer) -> Searcher:
    """HLG of the lexicon's words and the grammar (or LM) ARPA, decoded by one_best with lm_scale = lm_weight."""
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
    arcs = int(np.asarray(graph.fsa.num_arcs))
    desc = (f"graph (HLG of {len(words)} lexicon words{unspellable_note(unspellable)} and "
            f"{os.path.basename(path)}, {arcs} arcs, one best over "
            f"intersect_dense_pruned, graph scale {s.lm_weight})")
    return dataclasses.replace(base, search=lambda lp, pads: one_best(graph, lp, pads, lm_scale=float(s.lm_weight)),
                               description=desc, graph=True)


def ctc_log_probs(task, state, batch: dict) -> tuple[jax.Array, jax.Array] | None:
    """(log_probs [B, T', V] float32, paddings [B, T']) of a CTC task's head, from the audio keys of `batch`; None
    for a family without a CTC head (``ctc_logits``)."""
    fn = getattr(task, "ctc_logits", None)
    if fn is None:
        return None
    if "model_state" in inspect.signature(fn).parameters:
        (logits, pads), _ = fn(state.params, state.model_state, batch)
    else:
        logits, pads = fn(state.params, batch)
    return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1), pads


def has_ctc_head(task) -> bool:
    return hasattr(task, "ctc_logits")


# ------------------------------------------------------------------------------------------------------------
# decoding

def _greedy_rows(lp: np.ndarray, pads: np.ndarray, blank_id: int) -> list[dict]:
    out = []
    for r in range(lp.shape[0]):
        n = int(np.sum(pads[r] < 0.5))
        best = lp[r, :n].argmax(-1)
        prev = np.concatenate([[-1], best[:-1]])
        keep = (best != blank_id) & (best != prev)
        out.append({"tokens": best[keep].tolist(), "frames": np.nonzero(keep)[0].tolist(),
                    "score": float(lp[r, np.arange(n), best].sum()), "nbest": [], "num_frames": n})
    return out


def _beam_rows(res, pads: np.ndarray) -> list[dict]:
    toks, lens, scores, frames = (np.asarray(a) for a in
                                  jax.device_get((res.tokens, res.lengths, res.scores, res.token_frames)))
    out = []
    for r in range(toks.shape[0]):
        hyps = [(toks[r, k, :lens[r, k]].tolist(), frames[r, k, :lens[r, k]].tolist(), float(scores[r, k]))
                for k in range(toks.shape[1]) if scores[r, k] > -np.inf]
        t, f, sc = hyps[0] if hyps else ([], [], float("-inf"))
        out.append({"tokens": t, "frames": f, "score": sc, "nbest": [(h[0], h[2]) for h in hyps],
                    "num_frames": int(np.sum(pads[r] < 0.5))})
    return out


def _attention_row(out: dict, r: int) -> dict:
    hyps = [(out["ids"][r, k, :int(out["lengths"][r, k])].tolist(), float(out["scores"][r, k]))
            for k in range(out["ids"].shape[1]) if out["scores"][r, k] > -np.inf]
    return {"tokens": hyps[0][0] if hyps else [], "score": hyps[0][1] if hyps else float("-inf"), "nbest": hyps}


def _graph_rows(search: Callable, lp: np.ndarray, pads: np.ndarray) -> list[dict]:
    """Graph hypotheses of the rows with frames (the loader's padding rows have none)."""
    frames = np.sum(pads < 0.5, axis=1)
    live = np.nonzero(frames > 0)[0]
    hyps = dict(zip(live.tolist(), search(lp[live], pads[live]))) if len(live) else {}
    rows = []
    for r in range(lp.shape[0]):
        h = hyps.get(r)
        rows.append({"tokens": [], "text": "", "score": float("-inf"), "nbest": [], "word_frames": [],
                     "num_frames": 0} if h is None else
                    {"tokens": list(h.tokens), "text": h.text, "score": float(h.total_score), "nbest": [],
                     "word_frames": [(w, int(a), int(b)) for w, (a, b) in zip(h.words, h.word_frames)],
                     "num_frames": int(frames[r])})
    return rows


def _text(tokenizer, ids) -> str:
    return " ".join(tokenizer.decode(ids).split())


def transcribe(run: RunInfo, utts: list[Utterance], settings: ml_collections.ConfigDict, *,
               bad: list[dict] = (), progress: bool = True) -> tuple[dict, list[dict]]:
    """Decodes `utts` with `run` and `settings`; returns (metrics, results in input order: `utts` first, then the
    records of `bad`). Metrics: utterances, failed, audio_s, seconds, rtf, wer/cer/scored (see
    jasr.training.score_results: a failed file counts as all deletions), method."""
    task, tok = run.task, run.tokenizer
    ctc = has_ctc_head(task)
    att_beam = settings.method == "beam" and not ctc
    if settings.method != "greedy" and not ctc and not att_beam:
        raise ConfigError(f"decode method {settings.method!r} needs a CTC model; a {run.config.model.name} run "
                          f"(loss.type {run.config.loss.type!r}) decodes with its own decoder: use --method greedy "
                          f"or beam")
    if att_beam and type(task).beam_decode is Task.beam_decode:
        raise ConfigError(f"a {run.config.model.name} run has no beam search: use --method greedy")
    searcher = make_searcher(settings, tok, task.blank_id) if ctc else None
    texts = reference_texts(utts)
    by_id = {u.id: u for u in utts}
    ok, unreadable = check_utterances(utts)
    results: dict[str, dict] = {}
    for r in [*bad, *unreadable]:
        results[r["id"]] = {"id": r["id"], "ref": texts.get(r["id"]) or "", "error": r["reason"]}
    shift = 0.01 * family(run.config.model.name).subsampling(run.config)
    t0 = time.time()
    if ok:
        loader = make_eval_loader(run.config, ok, tok, edges=run.bucket_edges, task=task,
                                  whole_files=task.transcribes_whole_files and not att_beam)
        for r in loader.skipped:
            results[r["id"]] = {"id": r["id"], "ref": texts.get(r["id"]) or "", "error": r["reason"]}
        if ctc:
            fn = jax.jit(lambda state, batch: ctc_log_probs(task, state, batch))
        elif att_beam:
            try:
                opts = SearchOptions(beam_size=int(settings.beam), nbest=int(settings.nbest),
                                     length_penalty=float(settings.length_penalty),
                                     length_norm="gnmt" if run.config.model.name == "conformer_aed" else "plain",
                                     ctc_weight=float(settings.ctc_weight))
            except ValueError as e:
                raise ConfigError(f"decode: {e}") from e
            fn = jax.jit(lambda state, batch: task.beam_decode(state.params, state.model_state, batch, opts))
        else:
            fn = decode_function(task)
        bar = tqdm(total=len(ok), disable=not progress, desc="decode", unit="utt", dynamic_ncols=True)
        for batch in loader:
            audio = {k: batch[k] for k in AUDIO_KEYS if k in batch}
            ids = [str(x) for x in batch["ids"]]
            errors = batch.get("errors")
            if ctc:
                lp, pads = fn(run.state, audio)
                pads_np = np.asarray(pads)
                if searcher.search is None:
                    rows = _greedy_rows(np.asarray(lp), pads_np, task.blank_id)
                elif searcher.graph:
                    rows = _graph_rows(searcher.search, np.asarray(lp), pads_np)
                else:
                    rows = _beam_rows(searcher.search(lp, pads), pads_np)
            elif att_beam:
                out = jax.device_get(fn(run.state, audio))
                rows = [_attention_row(out, r) for r in range(len(ids))]
            else:
                out = jax.device_get(fn(run.state, audio))
                rows = [{"tokens": out["ids"][r, :int(out["lengths"][r])].tolist(), "nbest": []}
                        for r in range(len(ids))]
            for r, uid in enumerate(ids):
                if not uid:
                    continue
                if errors is not None and errors[r]:
                    results[uid] = {"id": uid, "ref": texts.get(uid) or "", "error": str(errors[r])}
                    continue
                results[uid] = _result(uid, texts.get(uid) or "", by_id[uid].duration, rows[r], tok, searcher,
                                       shift)
            bar.update(sum(1 for u in ids if u))
        bar.close()
    dt = time.time() - t0
    order = [u.id for u in utts] + [r["id"] for r in bad]
    out = [results[i] for i in order if i in results]
    failed = [r for r in out if "error" in r]
    audio_s = sum(u.duration for u in ok)
    method = (searcher.description if searcher else f"beam ({run.config.model.name}'s attention beam search, beam "
              f"{settings.beam})" if att_beam else f"greedy ({run.config.model.name}'s decoder)")
    m = {"utterances": len(out) - len(failed), "failed": len(failed), "audio_s": audio_s, "seconds": dt,
         "rtf": dt / audio_s if audio_s else float("nan"), "method": method}
    m.update(score_results(out))
    return m, out


def _result(uid: str, ref: str, duration: float, row: dict, tok, searcher: Searcher | None, shift: float) -> dict:
    res = {"id": uid, "ref": ref, "hyp": row["text"] if "text" in row else _text(tok, row["tokens"]),
           "tokens": row["tokens"], "duration": round(duration, 3)}
    if "score" in row:
        res["score"] = row["score"]
    if len(row["nbest"]) > 1:
        res["nbest"] = [{"text": _text(tok, t), "score": s} for t, s in row["nbest"]]
    if "word_frames" in row:
        res["words"] = [{"word": w, "start": round(a * shift, 3), "end": round(min((b + 1) * shift, duration), 3)}
                        for w, a, b in row["word_frames"]]
    elif searcher is not None:
        words = word_timestamps(row["tokens"], row["frames"], searcher.boundary_ids, searcher.word_start_ids,
                                frame_shift=shift, num_frames=row["num_frames"]) if row["tokens"] else []
        res["words"] = [{"word": _text(tok, w), "start": round(s, 3), "end": round(min(e, duration), 3)}
                        for w, s, e in words if _text(tok, w)]
    return res


# ------------------------------------------------------------------------------------------------------------
# error report

def alignment(ref: list[str], hyp: list[str]) -> list[tuple[str, str, str]]:
    """Levenshtein alignment of two word lists: [(op, ref word, hyp word)], op one of "=", "S", "D", "I"."""
    n, m = len(ref), len(hyp)
    d = np.zeros((n + 1, m + 1), np.int64)
    d[:, 0], d[0, :] = np.arange(n + 1), np.arange(m + 1)
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            d[i, j] = min(d[i - 1, j] + 1, d[i, j - 1] + 1, d[i - 1, j - 1] + (ref[i - 1] != hyp[j - 1]))
    ops, i, j = [], n, m
    while i or j:
        if i and j and d[i, j] == d[i - 1, j - 1] + (ref[i - 1] != hyp[j - 1]):
            ops.append(("=" if ref[i - 1] == hyp[j - 1] else "S", ref[i - 1], hyp[j - 1]))
            i, j = i - 1, j - 1
        elif i and d[i, j] == d[i - 1, j] + 1:
            ops.append(("D", ref[i - 1], ""))
            i -= 1
        else:
            ops.append(("I", "", hyp[j - 1]))
            j -= 1
    return ops[::-1]


def error_report(results: list[dict], worst: int = 10) -> str:
    """The `worst` utterances by word errors (ties: more reference words first), each with its aligned ref/hyp
    (errors in capitals markers: S substitution, D deletion, I insertion); "" without references."""
    rows = []
    for r in results:
        if not r.get("ref"):
            continue
        ops = alignment(r["ref"].split(), r.get("hyp", "").split())
        errs = sum(op != "=" for op, _, _ in ops)
        if errs:
            rows.append((errs, len(r["ref"].split()), r, ops))
    rows.sort(key=lambda x: (-x[0] / max(x[1], 1), -x[0]))
    lines = []
    for errs, n, r, ops in rows[:worst]:
        width = [max(len(a), len(b), 1) for _, a, b in ops]
        lines.append(f"{r['id']}: {errs} errors / {n} words" + (f" ({r['error']})" if "error" in r else ""))
        lines.append("  REF: " + " ".join((a or "*" * w).ljust(w) for (_, a, _), w in zip(ops, width)))
        lines.append("  HYP: " + " ".join((b or "*" * w).ljust(w) for (_, _, b), w in zip(ops, width)))
        lines.append("       " + " ".join((op if op != "=" else "").ljust(w) for (op, _, _), w in zip(ops, width)))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------------
# writers

def format_from_path(path: str) -> str:
    """The output format an extension names (.jsonl/.json, .txt, .srt, .vtt, .ctm); "jsonl" otherwise."""
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    return {"json": "jsonl"}.get(ext, ext) if ext in FORMATS + ("json",) else "jsonl"


def _stamp(t: float, sep: str) -> str:
    ms = int(round(t * 1000))
    return f"{ms // 3600000:02d}:{ms // 60000 % 60:02d}:{ms // 1000 % 60:02d}{sep}{ms % 1000:03d}"


def cues(result: dict, max_words: int = 10, max_seconds: float = 6.0) -> list[tuple[float, float, str]]:
    """Subtitle cues (start, end, text) of one result: its words grouped (at most `max_words` words and
    `max_seconds` per cue) where it has word times, else one cue over the whole file."""
    words = result.get("words")
    if not words:
        return [(0.0, float(result.get("duration", 0.0)), result.get("hyp", ""))] if result.get("hyp") else []
    out, cur = [], []
    for w in words:
        if cur and (len(cur) >= max_words or w["end"] - cur[0]["start"] > max_seconds):
            out.append((cur[0]["start"], cur[-1]["end"], " ".join(x["word"] for x in cur)))
            cur = []
        cur.append(w)
    out.append((cur[0]["start"], cur[-1]["end"], " ".join(x["word"] for x in cur)))
    return out


def subtitles(result: dict, fmt: str) -> str:
    """SRT or WebVTT text of one result."""
    sep = "," if fmt == "srt" else "."
    blocks = [] if fmt == "srt" else ["WEBVTT", ""]
    for i, (s, e, text) in enumerate(cues(result), 1):
        blocks += ([str(i)] if fmt == "srt" else []) + [f"{_stamp(s, sep)} --> {_stamp(e, sep)}", text, ""]
    return "\n".join(blocks)


def ctm_lines(result: dict) -> list[str]:
    """CTM lines (``<id> 1 <start> <duration> <word>``) of a result's word times."""
    return [f"{result['id']} 1 {w['start']:.3f} {max(w['end'] - w['start'], 0.0):.3f} {w['word']}"
            for w in result.get("words", [])]


def write_results(results: list[dict], path: str, fmt: str) -> list[str]:
    """Writes `results` as `fmt`; returns the paths written. jsonl / txt (``id<TAB>hyp``) / ctm: one file;
    srt / vtt: `path` itself for one result whose `path` ends in .srt / .vtt, else one file per result in the
    folder `path` (<id>.srt). CTM needs word times (a CTC model): ConfigError otherwise."""
    if fmt not in FORMATS:
        raise ConfigError(f"--format must be one of {FORMATS}, got {fmt!r}")
    if fmt == "ctm" and any("hyp" in r and r["hyp"] and "words" not in r for r in results):
        raise ConfigError("CTM needs word times, which only CTC models give (use --format jsonl, txt, srt or vtt)")
    if fmt in ("srt", "vtt"):
        single = len(results) == 1 and path.lower().endswith("." + fmt)
        if not single:
            os.makedirs(path, exist_ok=True)
        paths = []
        for r in results:
            p = path if single else os.path.join(path, f"{r['id']}.{fmt}")
            with open(p, "w", encoding="utf-8") as f:
                f.write(subtitles(r, fmt))
            paths.append(p)
        return paths
    with open(path, "w", encoding="utf-8") as f:
        for r in results:
            if fmt == "jsonl":
                f.write(json.dumps(r) + "\n")
            elif fmt == "txt":
                f.write(f"{r['id']}\t{r.get('hyp', '')}\n")
            else:
                f.write("".join(line + "\n" for line in ctm_lines(r)))
    return [path]
