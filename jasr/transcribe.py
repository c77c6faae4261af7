"""The decode pipeline behind decode.py: which audio, then batched decoding with a loaded run.

:func:`collect_utterances` turns a split, a manifest or files/folders into utterances (input order kept; files
that cannot be read become records with a reason). :func:`transcribe` decodes them with a loaded run
(:func:`jasr.training.load_run`, or :func:`jasr.hf_runs.load_hf_model`) in the run's length-bucketed batch shapes
(a handful of compiled programs) and returns one result per input, in input order. :func:`decode_mode` says how:
a search over the CTC head's log-probs (:meth:`jasr.tasks.Task.ctc_log_probs`; :mod:`jasr.searchers`: greedy,
CTC prefix beam search with LM / lexicon / hotwords, HLG graph decoding with icefall's n-best and rescoring
methods, attention-decoder rescoring through :meth:`jasr.tasks.Task.sequence_log_probs`), the attention decoder's
beam search (method "beam" of a family that has one: AED with length normalisation and optional joint CTC prefix
scores, :meth:`jasr.tasks.Task.beam_decode`; Whisper long-form with beam search in every 30 s window), or the
family's own greedy decoder (Whisper: long-form).

Results are dicts: ``id``, ``ref``, ``hyp``, ``tokens``, ``score``, ``duration``, ``nbest`` ([{"text", "score",
...}] with n-best > 1), ``rescored`` ({scale key: {"text", "score"}} for graph rescoring), ``words`` ([{"word",
"start", "end"}] where the method gives token frames), or ``error``. Writers and the error report:
:mod:`jasr.outputs`.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import json
import os
import tempfile
import time
from typing import Callable

import jax
import ml_collections
import numpy as np
from tqdm.auto import tqdm

from jasr.audio import AudioError, audio_info
from jasr.ctc_beam import word_timestamps
from jasr.errors import ConfigError
from jasr.hf_runs import HFCTCTokenizer, load_hf_model
from jasr.long_audio import (decode_segments, iter_audio_blocks, iter_chunked_log_probs, join_segments,
                             segment_reader, split_points, stream_energy_db, stream_features, task_log_probs_fn,
                             task_segment_decoder)
from jasr.manifests import AUDIO_EXTENSIONS, ManifestError, Utterance, check_utterances, read_folder, read_manifest
from jasr.outputs import FORMATS, alignment, error_report, format_from_path, write_results
from jasr.run_data import (dummy_batch, feature_config, make_eval_loader, mesh_batch_devices, raw_audio_batches,
                           reference_texts, split_utterances, with_placeholder_transcripts)
from jasr.sharding import (DEFAULT_RULES, logical_specs, make_mesh, mesh_context, per_device_mib, shard_batch,
                           state_shardings)
from jasr.searchers import Searcher, make_searcher, settings_from_config
from jasr.steps import AUDIO_KEYS, TrainState
from jasr.tasks import Task, family
from jasr.tasks.base import SearchOptions
from jasr.training import RunInfo, decode_function, score_results

# the pipeline's own names, then those of the modules split from it (decode.py and bench/ use them from here)
__all__ = ["attention_scorer", "collect_utterances", "decode_mesh", "decode_mode", "decode_state", "input_order",
           "long_file_decoder", "manifest_entries",
           "search_options", "transcribe", "whisper_beam_function",
           "FORMATS", "HFCTCTokenizer", "Searcher", "alignment", "error_report", "format_from_path", "load_hf_model",
           "make_searcher", "settings_from_config", "write_results"]


# ------------------------------------------------------------------------------------------------------------
# inputs

def manifest_entries(path: str) -> list[tuple[str, str]]:
    """(id, transcript) of every entry of a JSONL manifest in its order, as jasr.manifests.read_manifest reads them,
    without reading any audio header (a copy whose entries without a duration get a placeholder one is read)."""
    with open(path, encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    rows = []
    for line in lines:
        d = json.loads(line)
        if isinstance(d, dict) and d.get("duration") is None:
            d["duration"] = 1.0 + float(d.get("offset") or 0.0)
        rows.append(json.dumps(d))
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "manifest.jsonl")
        with open(copy, "w", encoding="utf-8") as f:
            f.write("".join(r + "\n" for r in rows))
        utts = read_manifest(copy, check_audio=False, allow_empty_text=True)
    return [(u.id, u.text) for u in utts]


def collect_utterances(cfg: ml_collections.ConfigDict, root: str, *, split: str | None = None,
                       manifest: str | None = None, paths: tuple = ()) -> tuple[str, list[Utterance], list[dict]]:
    """(name, utterances, unreadable records {"id", "audio", "reason"}) of a run's split, a JSONL manifest, or
    audio files and folders (a folder's transcripts from <stem>.txt / *.trans.txt where every file has one).
    Utterances without a transcript carry jasr.run_data's placeholder. A manifest's or a file list's unreadable
    records also carry ``position`` (their place among all the inputs) and, from a manifest, ``text``: the
    results of :func:`transcribe` then come back in input order, the unreadable ones scored as all deletions."""
    bad: list[dict] = []
    if split:
        return split, split_utterances(cfg, split, root, bad=bad), bad
    if manifest:
        if not os.path.exists(manifest):
            raise FileNotFoundError(f"--manifest: {manifest} does not exist")
        utts = read_manifest(manifest, allow_empty_text=True, bad=bad)
        if bad:
            entries = manifest_entries(manifest)
            where = {uid: (i, text) for i, (uid, text) in enumerate(entries)}
            for r in bad:
                if r["id"] in where:
                    r["position"], r["text"] = where[r["id"]]
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
                bad.append({"id": uid, "audio": os.path.abspath(f), "reason": str(e), "position": len(utts) + len(bad)})
                continue
            utts.append(Utterance(id=uid, audio_path=os.path.abspath(f), text="", duration=info.duration,
                                  sample_rate=info.sample_rate))
    return "files", with_placeholder_transcripts(utts), bad


def input_order(utts: list[Utterance], bad: list[dict]) -> list[str]:
    """The ids of `utts` and `bad` in input order: records with a ``position`` at that place, the others last."""
    order = [u.id for u in utts]
    placed = sorted((r for r in bad if "position" in r), key=lambda r: r["position"])
    for r in placed:
        order.insert(min(int(r["position"]), len(order)), r["id"])
    return order + [r["id"] for r in bad if "position" not in r]


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


def _bucket(n: int, least: int) -> int:
    return max(least, 1 << max(n - 1, 0).bit_length())


def attention_scorer(task: Task, state, audio: dict) -> Callable:
    """``score_fn(token_seqs, utt) -> [N]`` for jasr.graph_decoding.attention_rescoring: the task's attention
    decoder (:meth:`Task.sequence_log_probs`) on row ``utt`` of `audio`, in padded shapes (powers of two) so that
    few programs compile."""
    fn = _sequence_scores(task)

    def score(seqs, utt):
        n, width = _bucket(len(seqs), 8), _bucket(max([len(q) for q in seqs] + [1]), 8)
        toks = np.zeros((n, width), np.int32)
        pads = np.ones((n, width), np.float32)
        for i, q in enumerate(seqs):
            toks[i, :len(q)], pads[i, :len(q)] = q, 0.0
        rows = np.zeros(n, np.int32)
        rows[:len(seqs)] = np.asarray(utt, np.int32)
        return np.asarray(fn(state.params, state.model_state, audio, toks, pads, rows))[:len(seqs)]
    return score


@functools.lru_cache(maxsize=8)
def _sequence_scores(task: Task) -> Callable:
    return jax.jit(task.sequence_log_probs)


def _graph_rows(searcher: Searcher, lp: np.ndarray, pads: np.ndarray, score_fn=None) -> list[dict]:
    """Graph hypotheses of the rows with frames (the loader's padding rows have none)."""
    frames = np.sum(pads < 0.5, axis=1)
    live = np.nonzero(frames > 0)[0]
    if score_fn is not None:
        live_fn = lambda seqs, utt: score_fn(seqs, live[np.asarray(utt, np.int64)])  # noqa: E731
    else:
        live_fn = None
    found = dict(zip(live.tolist(), searcher.search(lp[live], pads[live], live_fn))) if len(live) else {}
    rows = []
    for r in range(lp.shape[0]):
        g = found.get(r)
        if g is None:
            rows.append({"tokens": [], "text": "", "score": float("-inf"), "nbest": [], "word_frames": [],
                         "num_frames": 0})
            continue
        h = g.best
        row = {"tokens": list(h.tokens), "text": h.text, "score": float(h.total_score),
               "word_frames": [(w, int(a), int(b)) for w, (a, b) in zip(h.words, h.word_frames)],
               "num_frames": int(frames[r]),
               "nbest": [{"text": x.text, "score": float(x.total_score), "am_score": float(x.am_score),
                          "lm_score": float(x.lm_score),
                          **({} if x.attention_score is None else {"attention_score": float(x.attention_score)})}
                         for x in g.nbest[:int(searcher.settings.nbest)]]}
        if g.by_key:
            row["rescored"] = {k: {"text": x.text, "score": float(x.total_score)} for k, x in g.by_key}
        rows.append(row)
    return rows


def _text(tokenizer, ids) -> str:
    return " ".join(tokenizer.decode(ids).split())


def decode_mode(task: Task, method: str) -> str:
    """How a run decodes `method`: "ctc" (a search over the CTC head's log-probs), "attention_beam" (the attention
    decoder's beam search, Task.beam_decode) or "own" (the family's greedy decoder, Whisper long-form). ConfigError
    where the run cannot."""
    attention = type(task).beam_decode is not Task.beam_decode
    if method == "greedy":
        return "ctc" if task.has_ctc_head and not attention else "own"
    if method == "beam":
        return "attention_beam" if attention else "ctc"
    if not task.has_ctc_head:
        raise ConfigError(f"decode method {method!r} needs a CTC model (conformer_ctc, wav2vec2_ctc, or "
                          f"conformer_aed trained with loss.type 'joint'); a {task.name} run without a CTC head "
                          f"decodes with its own decoder: use --method greedy or beam")
    return "ctc"


def transcribe(run: RunInfo, utts: list[Utterance], settings: ml_collections.ConfigDict, *,
               bad: list[dict] = (), progress: bool = True) -> tuple[dict, list[dict]]:
    """Decodes `utts` with `run` and `settings`; returns (metrics, results in input order: see
    :func:`input_order`). Metrics: utterances, failed, audio_s, seconds, rtf, wer/cer/scored (see
    jasr.training.score_results: a failed file counts as all deletions), method, and for graph rescoring methods
    ``wer_by_key`` (WER of each scale key's hypotheses, where references exist)."""
    task, tok = run.task, run.tokenizer
    mode = decode_mode(task, settings.method)
    ctc, att_beam = mode == "ctc", mode == "attention_beam"
    searcher = make_searcher(settings, tok, task.blank_id) if ctc else None
    if searcher is not None and searcher.needs_attention and \
            type(task).sequence_log_probs is Task.sequence_log_probs:
        raise ConfigError(f"graph decoding 'attention_rescoring' needs an attention decoder (a conformer_aed run "
                          f"trained with loss.type 'joint'); a {task.name} run has none")
    whole = task.transcribes_whole_files and not ctc
    texts = reference_texts(utts)
    by_id = {u.id: u for u in utts}
    ok, unreadable = check_utterances(utts)
    results: dict[str, dict] = {}
    for r in [*bad, *unreadable]:
        results[r["id"]] = {"id": r["id"], "ref": texts.get(r["id"]) or r.get("text") or "", "error": r["reason"]}
    shift = 0.01 * family(run.config.model.name).subsampling(run.config)
    # batches split over data x fsdp of the local devices; params sharded over fsdp x tensor (replicated over data)
    mesh, loader_cfg = decode_mesh(run.config, settings)
    state = decode_state(run, mesh) if mesh is not None else run.state
    t0 = time.time()
    long_files = [] if task.transcribes_whole_files and not ctc else \
        [u for u in ok if u.duration > settings.long_file_seconds]
    ok = [u for u in ok if u.duration <= settings.long_file_seconds] if long_files else ok
    with mesh_context(mesh, getattr(task, "logical_axis_rules", DEFAULT_RULES)):
        if long_files:
            decode_long = long_file_decoder(dataclasses.replace(run, state=state), settings, searcher, mode)
            for u in tqdm(long_files, disable=not progress, desc="decode long files", unit="file",
                          dynamic_ncols=True):
                try:
                    results[u.id] = decode_long(u, texts.get(u.id) or "", shift)
                except AudioError as e:
                    results[u.id] = {"id": u.id, "ref": texts.get(u.id) or "", "error": str(e)}
        if ok:
            loader = make_eval_loader(loader_cfg, ok, tok, edges=run.bucket_edges, task=task, whole_files=whole)
            for r in loader.skipped:
                results[r["id"]] = {"id": r["id"], "ref": texts.get(r["id"]) or "", "error": r["reason"]}
            bar = tqdm(total=len(ok), disable=not progress, desc="decode", unit="utt", dynamic_ncols=True)
            for ids, errors, rows in _decoded_batches(run, settings, state, loader, mesh, searcher, mode):
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
    out = [results[i] for i in input_order(utts, list(bad)) if i in results]
    failed = [r for r in out if "error" in r]
    audio_s = sum(u.duration for u in ok) + sum(u.duration for u in long_files)
    name = run.config.model.name
    method = (searcher.description if searcher else
              f"beam ({name}'s attention beam search, beam {settings.beam}"
              f"{', long-form over 30 s windows' if whole else ''})" if att_beam else f"greedy ({name}'s decoder)")
    m = {"utterances": len(out) - len(failed), "failed": len(failed), "audio_s": audio_s, "seconds": dt,
         "rtf": dt / audio_s if audio_s else float("nan"), "method": method,
         "mesh": {k: int(v) for k, v in mesh.shape.items()} if mesh is not None else {},
         "param_mib_per_device": per_device_mib(state.params)}
    m.update(score_results(out))
    if searcher is not None and searcher.keys and "wer" in m:
        m["wer_by_key"] = {k: score_results([{**r, "hyp": r["rescored"][k]["text"]} if "rescored" in r else r
                                             for r in out])["wer"] for k in searcher.keys}
    return m, out


def _decoded_batches(run: RunInfo, settings, state, loader, mesh, searcher: Searcher | None, mode: str):
    """Yields (ids, errors or None, one row dict per batch row: tokens, n-best, ...) for each batch of `loader`,
    decoded by `mode` ("ctc": greedy / beam / graph by `searcher`; "attention_beam"; else the family's greedy)."""
    task = run.task
    whole = task.transcribes_whole_files and mode != "ctc"
    if mode == "ctc":
        fn = jax.jit(lambda state, batch: task.ctc_log_probs(state.params, state.model_state, batch))
    elif mode == "attention_beam":
        opts = search_options(run, settings)
        fn = (whisper_beam_function(task, opts) if whole else
              jax.jit(lambda state, batch: task.beam_decode(state.params, state.model_state, batch, opts)))
    else:
        fn = decode_function(task)
    for batch in loader:
        audio = {k: batch[k] for k in AUDIO_KEYS if k in batch}
        if mesh is not None and not whole:
            audio = shard_batch(audio, mesh)
        ids = [str(x) for x in batch["ids"]]
        if mode == "ctc":
            lp, pads = fn(state, audio)
            pads_np = np.asarray(pads)
            if searcher.search is None:
                rows = _greedy_rows(np.asarray(lp), pads_np, task.blank_id)
            elif searcher.graph:
                score_fn = attention_scorer(task, state, audio) if searcher.needs_attention else None
                rows = _graph_rows(searcher, np.asarray(lp), pads_np, score_fn)
            else:
                rows = _beam_rows(searcher.search(lp, pads), pads_np)
        elif mode == "attention_beam":
            out = jax.device_get(fn(state, audio))
            rows = [_attention_row(out, r) for r in range(len(ids))]
        else:
            out = jax.device_get(fn(state, audio))
            rows = [{"tokens": out["ids"][r, :int(out["lengths"][r])].tolist(), "nbest": []}
                    for r in range(len(ids))]
        yield ids, batch.get("errors"), rows


def decode_mesh(cfg: ml_collections.ConfigDict, settings) -> tuple:
    """(mesh or None, the config the loader batches with) for decoding on this process's devices: ``tensor`` =
    settings ``mesh_tensor``, ``fsdp`` = ``mesh_fsdp`` (both shard the parameters, so that a model too large for
    one device decodes), ``data`` = the config's ``mesh.data`` (-1: the local devices left over), batches split
    over data x fsdp (the loader rounds batch sizes to multiples of it). None (and `cfg`) when that is one device.
    ConfigError when the local devices do not divide by tensor x fsdp."""
    t, f = int(settings.get("mesh_tensor", 1)), int(settings.get("mesh_fsdp", 1))
    local = jax.local_device_count()
    if local % (t * f):
        raise ConfigError(f"decode setting 'mesh_tensor'={t} x 'mesh_fsdp'={f}: {local} local devices do not "
                          f"divide by {t * f}")
    if t * f == 1:
        data = min(mesh_batch_devices(cfg), local)
    else:
        want = int(cfg.mesh.get("data", -1)) if cfg.get("mesh") is not None else 1
        data = local // (t * f) if want == -1 else max(min(want, local // (t * f)), 1)
    if data * f * t == 1:
        return None, cfg
    out = copy.deepcopy(cfg)
    for k, v in {"pipeline": 1, "data": data, "fsdp": f, "tensor": t}.items():
        out.mesh[k] = v
    return make_mesh(dict(out.mesh), jax.local_devices()), out


def decode_state(run: RunInfo, mesh) -> TrainState:
    """The run's state for decoding on `mesh`: without the optimiser state, the parameters sharded by the family's
    logical axis rules (over fsdp along ``embed``, over tensor along ``mlp`` / ``heads`` / ``vocab``; dimensions
    the mesh does not divide stay whole), everything else replicated."""
    cfg, task = run.config, run.task
    raw = raw_audio_batches(cfg)
    batch = dummy_batch((1, family(cfg.model.name).init_length(raw), 8), feature_config(cfg), raw)
    boxed = jax.eval_shape(task.init_boxed, jax.random.PRNGKey(0), batch)["params"]
    state = run.state.replace(opt_state=())
    rules = getattr(task, "logical_axis_rules", DEFAULT_RULES)
    return jax.device_put(state, state_shardings(state, logical_specs(boxed), mesh, rules))


def long_file_decoder(run: RunInfo, settings, searcher: Searcher | None, mode: str) -> Callable:
    """decode(utterance, ref, frame_shift) -> result of one file longer than ``settings.long_file_seconds``, in
    bounded memory (jasr.long_audio). A CTC head ("ctc" mode): streamed features (or samples), log-probs of windows
    of ``chunk_seconds`` with ``context_seconds`` on each side, then the same search as short files over the
    whole file's log-probs. An attention decoder: pieces of at most ``segment_seconds`` cut at quiet points,
    decoded greedily or by beam search, their texts joined (result ``segments`` with times)."""
    task, tok, cfg = run.task, run.tokenizer, run.config
    fc = feature_config(cfg)
    sr, raw = fc.sample_rate, cfg.data.feature == "raw"
    if mode == "ctc":
        # input rows (feature frames, or samples) per second and per output frame
        per_s = sr if raw else 100
        sub = family(cfg.model.name).subsampling(cfg) * (sr // 100 if raw else 1)
        chunk = max(int(round(settings.chunk_seconds * per_s)) // sub, 1) * sub
        context = int(round(settings.context_seconds * per_s)) // sub * sub
        fn = task_log_probs_fn(task, run.state, raw_audio=raw)

        def decode_ctc(u: Utterance, ref: str, shift: float) -> dict:
            def blocks():
                return iter_audio_blocks(u.audio_path, sr)
            parts = iter_chunked_log_probs(fn, blocks() if raw else stream_features(blocks, fc), chunk_frames=chunk,
                                           left_context=context, right_context=context, subsampling=sub)
            lp = np.concatenate(list(parts))[None]
            pads = np.zeros(lp.shape[:2], np.float32)
            if searcher.search is None:
                row = _greedy_rows(lp, pads, task.blank_id)[0]
            elif searcher.graph:
                row = _graph_rows(searcher, lp, pads)[0]
            else:
                row = _beam_rows(searcher.search(lp, pads), pads)[0]
            return _result(u.id, ref, u.duration, row, tok, searcher, shift)
        return decode_ctc

    opts = search_options(run, settings) if mode == "attention_beam" else None
    seg = float(settings.segment_seconds)
    dec = task_segment_decoder(task, run.state, None if raw else fc, options=opts)
    frame = max(sr // 100, 1)

    def decode_segmented(u: Utterance, ref: str, shift: float) -> dict:
        energy, n = stream_energy_db(iter_audio_blocks(u.audio_path, sr), frame)
        segs = split_points(energy, frame, n, max_samples=int(seg * sr), search_samples=int(seg * sr / 2))
        pieces = decode_segments(dec, segment_reader(u.audio_path, sr), segs, sample_rate=sr,
                                 pad_samples=int(seg * sr))
        joined = join_segments(pieces, tok.decode)
        return {"id": u.id, "ref": ref, "hyp": joined["text"], "tokens": [t for p in pieces for t in p["tokens"]],
                "duration": round(u.duration, 3), "segments": joined["segments"]}
    return decode_segmented


def search_options(run: RunInfo, settings) -> SearchOptions:
    """The attention beam search options of `settings` (AED: GNMT length normalisation)."""
    try:
        return SearchOptions(beam_size=int(settings.beam), nbest=int(settings.nbest),
                             length_penalty=float(settings.length_penalty),
                             length_norm="gnmt" if run.config.model.name == "conformer_aed" else "plain",
                             ctc_weight=float(settings.ctc_weight))
    except ValueError as e:
        raise ConfigError(f"decode: {e}") from e


def whisper_beam_function(task: Task, opts: SearchOptions) -> Callable:
    """(state, batch of whole files) -> beam_decode's dict, by the task's long-form transcription with beam search
    in every 30 s window (Task.beam_transcribe)."""
    def run(state, batch):
        rows = task.beam_transcribe(state.params, state.model_state, {k: batch[k] for k in AUDIO_KEYS if k in batch},
                                    opts)
        n = max(len(r) for r in rows)
        width = max([len(t) for r in rows for t, _ in r] + [1])
        ids = np.zeros((len(rows), n, width), np.int32)
        lengths = np.zeros((len(rows), n), np.int32)
        scores = np.full((len(rows), n), -np.inf, np.float32)
        for i, r in enumerate(rows):
            for k, (t, sc) in enumerate(r):
                ids[i, k, :len(t)], lengths[i, k], scores[i, k] = t, len(t), sc
        return {"ids": ids, "lengths": lengths, "scores": scores}
    return run


def _result(uid: str, ref: str, duration: float, row: dict, tok, searcher: Searcher | None, shift: float) -> dict:
    res = {"id": uid, "ref": ref, "hyp": row["text"] if "text" in row else _text(tok, row["tokens"]),
           "tokens": row["tokens"], "duration": round(duration, 3)}
    if "score" in row:
        res["score"] = row["score"]
    if len(row["nbest"]) > 1:
        res["nbest"] = [h if isinstance(h, dict) else {"text": _text(tok, h[0]), "score": h[1]} for h in row["nbest"]]
    if "rescored" in row:
        res["rescored"] = row["rescored"]
    if "word_frames" in row:
        res["words"] = [{"word": w, "start": round(a * shift, 3), "end": round(min((b + 1) * shift, duration), 3)}
                        for w, a, b in row["word_frames"]]
    elif searcher is not None:
        words = word_timestamps(row["tokens"], row["frames"], searcher.boundary_ids, searcher.word_start_ids,
                                frame_shift=shift, num_frames=row["num_frames"]) if row["tokens"] else []
        res["words"] = [{"word": _text(tok, w), "start": round(s, 3), "end": round(min(e, duration), 3)}
                        for w, s, e in words if _text(tok, w)]
    return res
