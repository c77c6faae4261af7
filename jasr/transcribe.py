"""The decode pipeline behind decode.py: which audio, then batched decoding with a loaded run.

:func:`collect_utterances` turns a split, a manifest or files/folders into utterances (input order kept; files
that cannot be read become records with a reason). :func:`transcribe` decodes them with a loaded run
(:func:`jasr.training.load_run`, or :func:`jasr.hf_runs.load_hf_model`) in the run's length-bucketed batch shapes
(a handful of compiled programs) with the search of its settings (:mod:`jasr.searchers`: greedy, CTC prefix beam
search with LM / lexicon / hotwords, HLG graph decoding; for a family without a CTC head its attention decoder's
beam search, :meth:`jasr.tasks.Task.beam_decode`: AED with length normalisation and optional joint CTC prefix
scores, Whisper with the KV cache over its first 30 s window), and returns one result per input, in input order.

Results are dicts: ``id``, ``ref``, ``hyp``, ``tokens``, ``score``, ``duration``, ``nbest`` ([{"text", "score"}]
with n-best > 1), ``words`` ([{"word", "start", "end"}] where the method gives token frames), or ``error``.
Writers and the error report: :mod:`jasr.outputs`.
"""
from __future__ import annotations

import inspect
import os
import time
from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from tqdm.auto import tqdm

from jasr.audio import AudioError, audio_info
from jasr.ctc_beam import word_timestamps
from jasr.errors import ConfigError
from jasr.hf_runs import HFCTCTokenizer, load_hf_model
from jasr.manifests import AUDIO_EXTENSIONS, ManifestError, Utterance, check_utterances, read_folder, read_manifest
from jasr.outputs import FORMATS, alignment, error_report, format_from_path, write_results
from jasr.run_data import make_eval_loader, reference_texts, split_utterances, with_placeholder_transcripts
from jasr.searchers import Searcher, make_searcher, settings_from_config
from jasr.steps import AUDIO_KEYS
from jasr.tasks import Task, family
from jasr.tasks.base import SearchOptions
from jasr.training import RunInfo, decode_function, score_results

# the pipeline's own names, then those of the modules split from it (decode.py and bench/ use them from here)
__all__ = ["collect_utterances", "ctc_log_probs", "has_ctc_head", "transcribe",
           "FORMATS", "HFCTCTokenizer", "Searcher", "alignment", "error_report", "format_from_path", "load_hf_model",
           "make_searcher", "settings_from_config", "write_results"]


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
