"""Whisper long-form transcription: :func:`transcribe_longform` (openai-whisper's ``transcribe``: seek on
timestamps, temperature fallback on compression ratio and average log-probability, no-speech skipping,
conditioning on the previous text), :func:`transcribe_sequential` (the seek loop alone, as transformers without
fallback) and :func:`transcribe_batched` (fixed windows decoded in parallel, merged by longest common overlap).
"""
from __future__ import annotations

import dataclasses
import math
import zlib
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from models.whisper import WhisperModel
from models.whisper_decode import (FRAME_SECONDS, TIME_PRECISION, GenerationSettings, beam_nbest_from_encoder,
                                   build_prompts, decode_options, detect_language, encode, generate_from_encoder,
                                   model_limit, no_speech_probs, sample_from_encoder, strip)


def _window(features: np.ndarray, start: int, length: int, num_frames: int) -> np.ndarray:
    seg = features[:, start:start + length]
    if seg.shape[1] < num_frames:
        seg = np.pad(seg, ((0, 0), (0, num_frames - seg.shape[1])))
    return seg


def split_segments(tokens: Sequence[int], timestamp_begin: int, window_frames: int, time_offset: float,
                   input_stride: int = 2) -> tuple[list[dict], int]:
    """Split one window's generated tokens (eos removed) into timestamped segments and give the seek advance in
    mel frames, as transformers' ``_retrieve_segment`` / openai-whisper's ``transcribe``."""
    tokens = list(tokens)
    is_ts = [t >= timestamp_begin for t in tokens]
    single_ending = is_ts[-2:] == [False, True]
    cuts = [i + 1 for i in range(len(is_ts) - 1) if is_ts[i] and is_ts[i + 1]]
    segments = []
    if cuts:
        if single_ending:
            cuts.append(len(tokens))
        else:
            cuts[-1] += 1
        last = 0
        for j, cut in enumerate(cuts):
            piece = tokens[last:cut]
            end_idx = -1 if j != len(cuts) - 1 or single_ending else -2
            segments.append({"start": time_offset + (piece[0] - timestamp_begin) * TIME_PRECISION,
                             "end": time_offset + (piece[end_idx] - timestamp_begin) * TIME_PRECISION,
                             "tokens": piece})
            last = cut
        if single_ending:
            advance = window_frames
        else:
            advance = (tokens[last - 2] - timestamp_begin) * input_stride
    else:
        ts = [t for t in tokens if t >= timestamp_begin]
        end_pos = int(window_frames * FRAME_SECONDS / TIME_PRECISION)
        if ts and ts[-1] != timestamp_begin:
            end_pos = ts[-1] - timestamp_begin
        segments.append({"start": time_offset, "end": time_offset + end_pos * TIME_PRECISION, "tokens": tokens})
        advance = window_frames
    return segments, advance


def transcribe_sequential(model: WhisperModel, params, input_features, settings: GenerationSettings, *,
                          num_frames: Optional[Sequence[int]] = None, max_new_tokens: Optional[int] = None,
                          num_beams: int = 1, language: Optional[str] = None, task: Optional[str] = None,
                          return_timestamps: bool = True, length_penalty: float = 1.0,
                          batch_size: Optional[int] = None) -> list[dict]:
    """Long-form transcription by seeking: each example is cut into 30 s windows; with timestamps the next window
    starts at the last complete timestamp pair (as openai-whisper and transformers do), without timestamps windows
    are consecutive. Examples of a batch advance together; the jitted decoder always sees ``batch_size`` windows
    (finished examples are replaced by zero windows) so it compiles once.

    ``input_features``: ``[B, n_mels, T]`` with any ``T``; ``num_frames`` the valid frames per example (default
    ``T``); ``max_new_tokens`` per window defaults to the model's limit (``max_target_positions`` minus the
    prompt). Returns per example ``{"tokens": [...], "segments": [{"start", "end", "tokens"}...]}`` where
    ``tokens`` concatenates the segments (transformers' long-form output).
    """
    feats = np.asarray(input_features, np.float32)
    if feats.ndim != 3 or feats.shape[1] != model.config.num_mel_bins:
        raise ValueError(f"input_features must be [batch, n_mels={model.config.num_mel_bins}, frames], "
                         f"got {feats.shape}")
    b, _, total = feats.shape
    max_frames = np.full(b, total) if num_frames is None else np.asarray(num_frames, np.int64)
    if max_frames.shape != (b,) or (max_frames > total).any() or (max_frames < 0).any():
        raise ValueError(f"num_frames must be {b} values in [0, {total}], got {num_frames}")
    nf = model.config.num_frames
    bs = b if batch_size is None else batch_size
    tb = settings.timestamp_begin
    if return_timestamps and tb is None:
        raise ValueError("timestamps need no_timestamps_token_id in the generation settings")
    init = settings.init_tokens(language=language, task=task, return_timestamps=return_timestamps)
    opts = decode_options(settings, max_new_tokens=model_limit(model, len(init), max_new_tokens),
                          num_beams=num_beams, return_timestamps=return_timestamps, length_penalty=length_penalty)
    seek = np.zeros(b, np.int64)
    results = [{"tokens": [], "segments": []} for _ in range(b)]
    langs = None
    if len(init) > 1 and init[1] is None:       # detect once per example, on its first window (as transformers)
        langs = np.zeros(b, np.int64)
        for start in range(0, b, bs):
            rows = list(range(start, min(start + bs, b)))
            windows = [_window(feats[i], 0, int(min(max_frames[i], nf)), nf) for i in rows]
            windows += [np.zeros_like(windows[0])] * (bs - len(rows))
            enc = encode(model, params, jnp.asarray(np.stack(windows)))
            langs[rows] = detect_language(model, params, enc, settings)[:len(rows)]
        for i in range(b):
            results[i]["language_token"] = int(langs[i])
    while (seek < max_frames).any():
        active = [i for i in range(b) if seek[i] < max_frames[i]]
        for start in range(0, len(active), bs):
            rows = active[start:start + bs]
            lens = [int(min(max_frames[i] - seek[i], nf)) for i in rows]
            windows = [_window(feats[i], int(seek[i]), n, nf) for i, n in zip(rows, lens)]
            windows += [np.zeros_like(windows[0])] * (bs - len(rows))
            enc = encode(model, params, jnp.asarray(np.stack(windows)))
            prompt = build_prompts(model, params, enc, settings, language, task, return_timestamps,
                              None if langs is None else langs[rows])
            seqs, _ = generate_from_encoder(model, params, enc, prompt, opts)
            gen = strip(seqs[:len(rows)], prompt.shape[1], settings)
            for i, n, toks in zip(rows, lens, gen):
                offset = float(seek[i]) * FRAME_SECONDS
                if return_timestamps:
                    segs, adv = split_segments(toks, tb, n, offset)
                else:
                    segs, adv = [{"start": offset, "end": offset + n * FRAME_SECONDS, "tokens": toks}], n
                results[i]["segments"] += segs
                seek[i] += adv
    for r in results:
        r["tokens"] = [t for s in r["segments"] for t in s["tokens"]]
    return results


def merge_overlapping(chunks: Sequence[Sequence[int]], min_match: int = 1) -> list[int]:
    """Merge token sequences of overlapping windows: for each next chunk, find the alignment of its start with the
    end of the text so far that agrees on the most tokens (transformers' ASR pipeline
    ``_find_longest_common_sequence`` rule: matches / overlap length + a tiny bonus for longer overlaps), keep the
    left half of the agreed overlap from the left and the rest from the right. Without any agreement (fewer than
    ``min_match`` equal tokens) the chunks are concatenated."""
    out = list(chunks[0]) if chunks else []
    for seq in chunks[1:]:
        seq = list(seq)
        best, best_i, best_matches = 0.0, 0, 0
        for i in range(1, min(len(out), len(seq)) + 1):
            left, right = out[-i:], seq[:i]
            matches = sum(a == c for a, c in zip(left, right))
            score = matches / i + i / 10000.0
            if matches >= min_match and score > best:
                best, best_i, best_matches = score, i, matches
        if best_matches >= min_match and best_i > 0:
            i = best_i
            keep_left = i // 2
            out = out[:len(out) - i + keep_left] + seq[keep_left:]
        else:
            out = out + seq
    return out


def transcribe_batched(model: WhisperModel, params, input_features, settings: GenerationSettings, *,
                       num_frames: Optional[Sequence[int]] = None, overlap_frames: int = 0,
                       max_new_tokens: Optional[int] = None, num_beams: int = 1, language: Optional[str] = None,
                       task: Optional[str] = None, batch_size: int = 8) -> list[dict]:
    """Long-form transcription by fixed windows decoded in parallel: windows of 30 s start every
    ``30 s - overlap_frames`` frames; all windows of all examples are decoded ``batch_size`` at a time (no
    timestamps); window texts are concatenated (``overlap_frames=0``) or merged with :func:`merge_overlapping`.
    ``max_new_tokens`` per window defaults to the model's limit (``max_target_positions`` minus the prompt).

    Returns per example ``{"tokens": merged tokens, "windows": [(start_frame, tokens)...]}``.
    """
    feats = np.asarray(input_features, np.float32)
    if feats.ndim != 3 or feats.shape[1] != model.config.num_mel_bins:
        raise ValueError(f"input_features must be [batch, n_mels={model.config.num_mel_bins}, frames], "
                         f"got {feats.shape}")
    b, _, total = feats.shape
    nf = model.config.num_frames
    if not 0 <= overlap_frames < nf:
        raise ValueError(f"overlap_frames must be in [0, {nf}), got {overlap_frames}")
    lengths = np.full(b, total) if num_frames is None else np.asarray(num_frames, np.int64)
    step = nf - overlap_frames
    jobs = []                                        # (example, start, length)
    for i in range(b):
        starts = list(range(0, max(int(lengths[i]) - overlap_frames, 1), step))
        for s in starts:
            jobs.append((i, s, int(min(nf, lengths[i] - s))))
    prompt_length = len(settings.init_tokens(language=language, task=task))
    opts = decode_options(settings, max_new_tokens=model_limit(model, prompt_length, max_new_tokens),
                          num_beams=num_beams)
    outs: list[list[int]] = []
    for j in range(0, len(jobs), batch_size):
        part = jobs[j:j + batch_size]
        windows = [_window(feats[i], s, n, nf) for i, s, n in part]
        windows += [np.zeros_like(windows[0])] * (batch_size - len(part))
        enc = encode(model, params, jnp.asarray(np.stack(windows)))
        prompt = build_prompts(model, params, enc, settings, language, task, False)
        seqs, _ = generate_from_encoder(model, params, enc, prompt, opts)
        outs += strip(seqs[:len(part)], prompt.shape[1], settings)
    results = [{"tokens": [], "windows": []} for _ in range(b)]
    for (i, s, _), toks in zip(jobs, outs):
        results[i]["windows"].append((s, toks))
    for r in results:
        pieces = [t for _, t in r["windows"]]
        r["tokens"] = (merge_overlapping(pieces) if overlap_frames else [t for p in pieces for t in p])
    return results


# ----------------------------------------------------------------------------------------------------------------
# openai-whisper's transcribe: temperature fallback, no-speech skipping, previous-text conditioning
# ----------------------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class LongFormOptions:
    """openai-whisper ``transcribe`` options (defaults as there). ``num_beams`` > 1: beam search at temperature 0
    (length penalty 1, so its score is the average log-probability); ``best_of`` samples per window at temperature
    > 0, the best by summed log-probability / tokens; the previous text is dropped from the prompt after a window
    decoded above ``prompt_reset_temperature``; ``prompt_bucket`` > 1 keeps the previous-text tokens in multiples of
    it (the most recent ones), which bounds the compiled programs (one per prompt length); ``nbest`` > 1 (<=
    ``num_beams``): a window decoded by beam search keeps its ``nbest`` best hypotheses (``windows[i]["nbest"]``)."""
    temperatures: tuple = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    compression_ratio_threshold: Optional[float] = 2.4
    logprob_threshold: Optional[float] = -1.0
    no_speech_threshold: Optional[float] = 0.6
    condition_on_previous_text: bool = True
    num_beams: int = 1
    best_of: int = 1
    prompt_reset_temperature: float = 0.5
    prompt_bucket: int = 1
    nbest: int = 1

    def __post_init__(self):
        if not self.temperatures or any(t < 0 for t in self.temperatures):
            raise ValueError(f"temperatures must be a non-empty sequence of values >= 0, got {self.temperatures}")
        if self.num_beams < 1 or self.best_of < 1 or self.prompt_bucket < 1:
            raise ValueError("num_beams, best_of and prompt_bucket must be >= 1")
        if not 1 <= self.nbest <= self.num_beams:
            raise ValueError(f"nbest must be in [1, num_beams={self.num_beams}], got {self.nbest}")


def token_compression_ratio(tokens: Sequence[int], vocab_size: int) -> float:
    """transformers' rule: raw / zlib-compressed length of the token ids as little-endian bytes."""
    width = int(math.log2(vocab_size) / 8) + 1
    raw = b"".join(int(t).to_bytes(width, "little") for t in tokens)
    return len(raw) / len(zlib.compress(raw))


def text_compression_ratio(text: str) -> float:
    """openai-whisper's rule: raw / zlib-compressed length of the UTF-8 text."""
    raw = text.encode("utf-8")
    return len(raw) / len(zlib.compress(raw))


def needs_fallback(compression_ratio: float, avg_logprob: float, no_speech_prob: float,
                   options: LongFormOptions) -> bool:
    """openai-whisper: too repetitive or too improbable, unless it is silence (no-speech and improbable)."""
    o = options
    bad = ((o.compression_ratio_threshold is not None and compression_ratio > o.compression_ratio_threshold)
           or (o.logprob_threshold is not None and avg_logprob < o.logprob_threshold))
    silence = (o.no_speech_threshold is not None and o.logprob_threshold is not None
               and no_speech_prob > o.no_speech_threshold and avg_logprob < o.logprob_threshold)
    return bad and not silence


def should_skip(avg_logprob: float, no_speech_prob: float, options: LongFormOptions) -> bool:
    """openai-whisper: skip the window when the no-speech probability is high, unless the text is probable."""
    o = options
    if o.no_speech_threshold is None or not no_speech_prob > o.no_speech_threshold:
        return False
    return not (o.logprob_threshold is not None and avg_logprob > o.logprob_threshold)


def conditioning_tokens(segments: Sequence[dict], timestamp_begin: int) -> list[int]:
    """The tokens a window adds to the previous text: its segments' tokens, without the second timestamp of a
    segment that ends with a pair (openai-whisper's token stream; transformers' ``skip_ending_double_timestamps``)."""
    out = []
    for s in segments:
        t = list(s["tokens"])
        out += t[:-1] if len(t) > 2 and t[-2] >= timestamp_begin else t
    return out


def _rows(a, idx, size):
    """Rows ``idx`` of ``a``, padded to ``size`` rows by repeating the first (fixed shapes for jit)."""
    return a[jnp.asarray(list(idx) + [idx[0]] * (size - len(idx)))]


def _decode_attempt(model, params, enc, prompt, opts, temperature, key, best_of, settings, nbest=1):
    """One decode of every row at one temperature: ``(tokens list per row (eos removed), ended, sum_logprob,
    alternatives)``; alternatives (beam search with `nbest` > 1): per row the `nbest` best ``(tokens,
    sum_logprob)``, best first, else None."""
    n = enc.shape[0]
    p = prompt.shape[1]
    if temperature == 0.0:
        alts = None
        if opts.num_beams > 1 and nbest > 1:
            all_seqs, all_scores = beam_nbest_from_encoder(model, params, enc, prompt, opts, nbest)
            all_seqs, all_scores = np.asarray(all_seqs), np.asarray(all_scores, np.float64)
            alts = []
            for r in range(n):
                row = [(t, sc * (len(t) + 1)) for t, sc in zip(strip(all_seqs[r], p, settings), all_scores[r])
                       if np.isfinite(sc)]
                alts.append(row)
            seqs, score = all_seqs[:, 0], all_scores[:, 0]
        else:
            seqs, score = generate_from_encoder(model, params, enc, prompt, opts)
        toks = strip(seqs, p, settings)
        ended = [settings.eos_token_id in row for row in np.asarray(seqs)[:, p:].tolist()]
        score = np.asarray(score, np.float64)
        if opts.num_beams > 1:    # length penalty 1: the score is the average log-prob over tokens + eos
            score = score * np.array([len(t) + 1 for t in toks])
        return toks, ended, score, alts
    rep = lambda a: jnp.repeat(a, best_of, axis=0)  # noqa: E731
    seqs, score = sample_from_encoder(model, params, rep(enc), rep(prompt), opts, key, temperature)
    toks, score = strip(seqs, p, settings), np.asarray(score, np.float64)
    rows = np.asarray(seqs)[:, p:].tolist()
    out_t, out_e, out_s = [], [], []
    for i in range(n):
        cand = range(i * best_of, (i + 1) * best_of)
        best = max(cand, key=lambda j: score[j] / max(len(toks[j]), 1))
        out_t.append(toks[best])
        out_e.append(settings.eos_token_id in rows[best])
        out_s.append(score[best])
    return out_t, out_e, np.asarray(out_s), None


def transcribe_longform(model: WhisperModel, params, input_features, settings: GenerationSettings, *,
                        key: Optional[jax.Array] = None, options: LongFormOptions = LongFormOptions(),
                        num_frames: Optional[Sequence[int]] = None, max_new_tokens: Optional[int] = None,
                        language: Optional[str] = None, task: Optional[str] = None,
                        batch_size: Optional[int] = None,
                        text_fn: Optional[Callable[[list[int]], str]] = None) -> list[dict]:
    """openai-whisper's ``transcribe`` over ``input_features [B, n_mels, T]`` (valid frames ``num_frames``): 30 s
    windows from ``seek``; each window is decoded at ``options.temperatures`` in turn until the result is neither
    too repetitive (compression ratio above the threshold: of ``text_fn(tokens)`` as openai-whisper when given,
    else of the token ids incl. eos as transformers) nor too improbable (average log-probability
    ``sum / (tokens + 1)`` below the threshold), unless it is silence; a window whose no-speech probability exceeds
    the threshold (and whose text is improbable) is skipped whole; otherwise its timestamped segments are kept and
    the next window starts at the last complete timestamp pair. With ``condition_on_previous_text`` (and
    ``settings.prev_sot_token_id``) the prompt is ``<|startofprev|>`` + the last ``max_target_positions // 2 - 1``
    tokens since the last reset + the init tokens. Sampling needs ``key`` (explicit PRNG).

    Windows of a batch advance together, ``batch_size`` (default B) at a time, grouped by prompt length. Returns
    per example ``{"tokens", "segments": [{"start", "end", "tokens", "temperature", "avg_logprob",
    "compression_ratio", "no_speech_prob"}], "windows": [{"start", "frames", "prompt_length", "skipped",
    "attempts": [{"temperature", "compression_ratio", "avg_logprob", "no_speech_prob", "needs_fallback"}]}]}``.
    """
    feats = np.asarray(input_features, np.float32)
    cfg = model.config
    if feats.ndim != 3 or feats.shape[1] != cfg.num_mel_bins:
        raise ValueError(f"input_features must be [batch, n_mels={cfg.num_mel_bins}, frames], got {feats.shape}")
    o = options
    if any(t > 0 for t in o.temperatures) and key is None:
        raise ValueError("temperatures > 0 sample: pass a PRNG key")
    tb = settings.timestamp_begin
    if tb is None:
        raise ValueError("long-form transcription needs no_timestamps_token_id in the generation settings")
    b, _, total = feats.shape
    max_frames = np.full(b, total) if num_frames is None else np.asarray(num_frames, np.int64)
    if max_frames.shape != (b,) or (max_frames > total).any() or (max_frames < 0).any():
        raise ValueError(f"num_frames must be {b} values in [0, {total}], got {num_frames}")
    nf, bs = cfg.num_frames, b if batch_size is None else batch_size
    init = settings.init_tokens(language=language, task=task, return_timestamps=True)
    inits = [list(init) for _ in range(b)]
    if len(init) > 1 and init[1] is None:       # detect once per example, on its first window
        for start in range(0, b, bs):
            rows = list(range(start, min(start + bs, b)))
            windows = [_window(feats[i], 0, int(min(max_frames[i], nf)), nf) for i in rows]
            windows += [np.zeros_like(windows[0])] * (bs - len(rows))
            langs = detect_language(model, params, encode(model, params, jnp.asarray(np.stack(windows))), settings)
            for j, i in enumerate(rows):
                inits[i][1] = int(langs[j])
    limit = model_limit(model, len(init), max_new_tokens)
    cond = o.condition_on_previous_text and settings.prev_sot_token_id is not None
    keep = cfg.max_target_positions // 2 - 1
    seek = np.zeros(b, np.int64)
    reset = [0] * b
    all_tokens: list[list[int]] = [[] for _ in range(b)]
    results = [{"tokens": [], "segments": [], "windows": []} for _ in range(b)]
    calls = 0

    def prompt_of(i):
        prev = all_tokens[i][reset[i]:][-keep:] if cond else []
        prev = prev[len(prev) % o.prompt_bucket:]
        return ([settings.prev_sot_token_id] + prev if prev else []) + inits[i]

    while (seek < max_frames).any():
        active = [i for i in range(b) if seek[i] < max_frames[i]]
        groups: dict[int, list[int]] = {}
        for i in active:
            groups.setdefault(len(prompt_of(i)), []).append(i)
        for p_len, members in sorted(groups.items()):
            for start in range(0, len(members), bs):
                rows = members[start:start + bs]
                lens = [int(min(max_frames[i] - seek[i], nf)) for i in rows]
                windows = [_window(feats[i], int(seek[i]), n, nf) for i, n in zip(rows, lens)]
                windows += [np.zeros_like(windows[0])] * (bs - len(rows))
                enc = encode(model, params, jnp.asarray(np.stack(windows)))
                prompts = [prompt_of(i) for i in rows]
                prompt = jnp.asarray(np.array(prompts + [prompts[0]] * (bs - len(rows)), np.int32))
                sot_index = p_len - len(init)
                ns = (no_speech_probs(model, params, enc, prompt, sot_index, settings.no_speech_token_id)
                      if o.no_speech_threshold is not None and settings.no_speech_token_id is not None
                      else np.full(bs, np.nan))
                max_new = min(limit, cfg.max_target_positions - p_len)
                final: dict[int, dict] = {}
                attempts: dict[int, list] = {j: [] for j in range(len(rows))}
                pending = list(range(len(rows)))
                for ti, temp in enumerate(o.temperatures):
                    beams = o.num_beams if temp == 0.0 else 1
                    opts = decode_options(settings, max_new_tokens=max_new, num_beams=beams, return_timestamps=True,
                                          length_penalty=1.0)
                    k = None if temp == 0.0 else jax.random.fold_in(key, calls)
                    calls += 1
                    toks, ended, sums, alts = _decode_attempt(model, params, _rows(enc, pending, bs),
                                                              _rows(prompt, pending, bs), opts, float(temp), k,
                                                              o.best_of, settings, o.nbest)
                    still = []
                    for r, j in enumerate(pending):
                        t = toks[r]
                        cr = (text_compression_ratio(text_fn(t)) if text_fn is not None else
                              token_compression_ratio(t + ([settings.eos_token_id] if ended[r] else []),
                                                      cfg.vocab_size))
                        att = {"temperature": float(temp), "compression_ratio": cr,
                               "avg_logprob": float(sums[r] / (len(t) + 1)), "no_speech_prob": float(ns[j]),
                               "tokens": t, "nbest": None if alts is None else alts[r]}
                        att["needs_fallback"] = needs_fallback(cr, att["avg_logprob"], att["no_speech_prob"], o)
                        attempts[j].append({kk: v for kk, v in att.items() if kk not in ("tokens", "nbest")})
                        final[j] = att
                        if att["needs_fallback"]:
                            still.append(j)
                    pending = still
                    if not pending:
                        break
                for j, (i, n) in enumerate(zip(rows, lens)):
                    res, offset = final[j], float(seek[i]) * FRAME_SECONDS
                    skip = should_skip(res["avg_logprob"], res["no_speech_prob"], o)
                    results[i]["windows"].append({"start": offset, "frames": n, "prompt_length": p_len,
                                                  "skipped": skip, "attempts": attempts[j],
                                                  "sum_logprob": res["avg_logprob"] * (len(res["tokens"]) + 1),
                                                  **({"nbest": res["nbest"]} if res["nbest"] else {})})
                    if skip:
                        seek[i] += n
                        continue
                    segs, adv = split_segments(res["tokens"], tb, n, offset)
                    for s in segs:
                        s.update({kk: res[kk] for kk in ("temperature", "avg_logprob", "compression_ratio",
                                                         "no_speech_prob")})
                    results[i]["segments"] += segs
                    all_tokens[i] += conditioning_tokens(segs, tb)
                    seek[i] += adv
                    if not o.condition_on_previous_text or res["temperature"] > o.prompt_reset_temperature:
                        reset[i] = len(all_tokens[i])
    for r in results:
        r["tokens"] = [t for s in r["segments"] for t in s["tokens"]]
    return results
