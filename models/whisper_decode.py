"""Whisper decoding in JAX: static-size KV cache under jit, greedy, sampling and beam search, Whisper's logits
processors, language detection and the no-speech probability. Long-form transcription is in
:mod:`models.whisper_longform`; :mod:`models.whisper_generate` re-exports both.

Semantics follow transformers' ``WhisperForConditionalGeneration.generate`` (v5) for this subset:

- decoder prompt ("init tokens"): ``<|startoftranscript|>`` [language] [task] [``<|notimestamps|>`` unless
  timestamps are requested], built by :meth:`GenerationSettings.init_tokens` like transformers'
  ``_retrieve_init_tokens`` (``language``/``task`` arguments, else the legacy ``forced_decoder_ids``; with
  ``lang_to_id`` and no language the language is detected per example, as :func:`detect_language`); a prompt may
  start with ``<|startofprev|>`` and previous text (long-form conditioning);
- logits processors, in transformers' order: begin-suppress (at the first generated position only), suppress,
  then the timestamp processor (``<|notimestamps|>`` banned, timestamps in pairs, non-decreasing, the first one
  at most ``max_initial_timestamp_index``, and timestamps forced when their total probability beats every text
  token);
- greedy: argmax per step, ``pad_token_id`` after ``eos``; stops when every row ended or after ``max_new_tokens``;
  sampling (:func:`sample_from_encoder`): the same loop drawing from ``softmax(processed / temperature)`` with an
  explicit PRNG key, log-probabilities from the unscaled processed logits (as openai-whisper);
- beam search: transformers' vectorised beam search (keeps ``2 * num_beams`` candidates per step, finished
  hypotheses scored ``sum_logprobs / generated_length ** length_penalty``, ``early_stopping`` False / True /
  "never" with transformers' stopping heuristic), one returned sequence per input.

Input features are ``[B, n_mels, frames]`` log-mel (see :mod:`models.whisper`); shorter windows are zero-padded
to 30 s as transformers does.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any, Mapping, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np

from models.whisper import WhisperModel, init_cache

Array = jax.Array
Params = Any
NEG = -jnp.inf

TIME_PRECISION = 0.02          # seconds per timestamp token
FRAME_SECONDS = 0.01           # seconds per mel frame (hop 160 at 16 kHz)


# ----------------------------------------------------------------------------------------------------------------
# Settings
# ----------------------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class GenerationSettings:
    """The generation-relevant fields of a transformers ``generation_config.json`` (hashable)."""

    decoder_start_token_id: int
    eos_token_id: int
    pad_token_id: int
    suppress_tokens: tuple[int, ...] = ()
    begin_suppress_tokens: tuple[int, ...] = ()
    no_timestamps_token_id: Optional[int] = None
    max_initial_timestamp_index: Optional[int] = None
    lang_to_id: tuple[tuple[str, int], ...] = ()
    task_to_id: tuple[tuple[str, int], ...] = ()
    is_multilingual: Optional[bool] = None
    forced_decoder_ids: Optional[tuple[tuple[int, Optional[int]], ...]] = None
    prev_sot_token_id: Optional[int] = None       # <|startofprev|> (long-form conditioning on previous text)

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> "GenerationSettings":
        eos = d.get("eos_token_id")
        if isinstance(eos, (list, tuple)):
            eos = eos[0]
        if eos is None or d.get("decoder_start_token_id") is None:
            raise ValueError("generation config needs eos_token_id and decoder_start_token_id")
        pad = d.get("pad_token_id")
        fdi = d.get("forced_decoder_ids")
        return cls(
            decoder_start_token_id=int(d["decoder_start_token_id"]), eos_token_id=int(eos),
            pad_token_id=int(eos if pad is None else pad),
            suppress_tokens=tuple(int(t) for t in (d.get("suppress_tokens") or ())),
            begin_suppress_tokens=tuple(int(t) for t in (d.get("begin_suppress_tokens") or ())),
            no_timestamps_token_id=d.get("no_timestamps_token_id"),
            max_initial_timestamp_index=d.get("max_initial_timestamp_index"),
            lang_to_id=tuple(sorted((k, int(v)) for k, v in (d.get("lang_to_id") or {}).items())),
            task_to_id=tuple(sorted((k, int(v)) for k, v in (d.get("task_to_id") or {}).items())),
            is_multilingual=d.get("is_multilingual"),
            forced_decoder_ids=None if fdi is None else tuple((int(i), None if t is None else int(t)) for i, t in fdi),
            prev_sot_token_id=None if d.get("prev_sot_token_id") is None else int(d["prev_sot_token_id"]))

    @classmethod
    def from_pretrained(cls, directory: str) -> "GenerationSettings":
        """``generation_config.json`` of a transformers directory, else the token ids of its ``config.json``."""
        for name in ("generation_config.json", "config.json"):
            path = os.path.join(directory, name)
            if os.path.isfile(path):
                with open(path) as f:
                    return cls.from_hf_dict(json.load(f))
        raise FileNotFoundError(f"{directory!r} has neither generation_config.json nor config.json")

    @property
    def no_speech_token_id(self) -> Optional[int]:
        """``<|nospeech|>`` (``<|nocaptions|>``): the id before ``<|notimestamps|>``, as transformers assumes."""
        return None if self.no_timestamps_token_id is None else self.no_timestamps_token_id - 1

    @property
    def timestamp_begin(self) -> Optional[int]:
        return None if self.no_timestamps_token_id is None else self.no_timestamps_token_id + 1

    def init_tokens(self, language: Optional[str] = None, task: Optional[str] = None,
                    return_timestamps: bool = False) -> list[Optional[int]]:
        """The decoder prompt, as transformers' ``_retrieve_init_tokens``. A ``None`` in second place means
        "detect the language" (see :func:`detect_language`)."""
        lang_to_id, task_to_id = dict(self.lang_to_id), dict(self.task_to_id)
        if self.is_multilingual is False and (language is not None or task is not None):
            raise ValueError("cannot set language or task for an English-only model")
        tokens: list[Optional[int]] = [self.decoder_start_token_id]
        if language is None and task is None and self.forced_decoder_ids:
            fdi = list(self.forced_decoder_ids)
            i = 1
            while fdi and fdi[0][0] == i:
                tokens.append(fdi[0][1])
                fdi = fdi[1:]
                i += 1
            if fdi:
                raise ValueError(f"forced_decoder_ids {self.forced_decoder_ids} do not follow Whisper's prompt")
        lang_undefined = len(tokens) <= 1 or tokens[1] is None
        if language is not None:
            lang_id = _language_id(language, lang_to_id)
            if len(tokens) > 1:
                tokens[1] = lang_id
            else:
                tokens.append(lang_id)
        elif lang_to_id and lang_undefined:
            if len(tokens) > 1:
                tokens[1] = None
            else:
                tokens.append(None)          # placeholder: detected per example
        if task is not None:
            if task not in task_to_id:
                raise ValueError(f"task {task!r} not in {sorted(task_to_id)}")
            tokens.append(task_to_id[task])
        elif language is not None and task_to_id and not any(t in tokens for t in task_to_id.values()):
            tokens.append(task_to_id["transcribe"])
        if return_timestamps and self.no_timestamps_token_id is None:
            raise ValueError("timestamps need no_timestamps_token_id in the generation settings")
        nts = self.no_timestamps_token_id
        if not return_timestamps and nts is not None and tokens[-1] != nts:
            tokens.append(nts)
        elif return_timestamps and tokens[-1] == nts:
            tokens = tokens[:-1]
        keep_placeholder = bool(lang_to_id) and language is None and len(tokens) > 1 and tokens[1] is None
        return [t for i, t in enumerate(tokens) if t is not None or (i == 1 and keep_placeholder)]


def _language_id(language: str, lang_to_id: Mapping[str, int]) -> int:
    key = language.lower()
    for cand in (key, f"<|{key}|>"):
        if cand in lang_to_id:
            return lang_to_id[cand]
    raise ValueError(f"unsupported language {language!r}; this model knows {sorted(lang_to_id)}")


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
    """Static decoding options (one compiled program per distinct value)."""

    max_new_tokens: int
    eos_token_id: int
    pad_token_id: int
    num_beams: int = 1
    suppress_tokens: tuple[int, ...] = ()
    begin_suppress_tokens: tuple[int, ...] = ()
    timestamp_begin: Optional[int] = None          # None: timestamps off
    no_timestamps_token_id: Optional[int] = None
    max_initial_timestamp_index: Optional[int] = None
    length_penalty: float = 1.0
    early_stopping: Union[bool, str] = False

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.num_beams < 1:
            raise ValueError(f"num_beams must be >= 1, got {self.num_beams}")
        if self.early_stopping not in (True, False, "never"):
            raise ValueError(f"early_stopping must be True, False or 'never', got {self.early_stopping!r}")


# ----------------------------------------------------------------------------------------------------------------
# Logits processors (pure; rows are independent)
# ----------------------------------------------------------------------------------------------------------------

def process_logits(scores: Array, tokens: Array, cur_len: Array, begin_index: int, opts: DecodeOptions) -> Array:
    """Whisper's logits processors on ``scores [N, V]`` (float32) given the token buffer ``tokens [N, S]`` whose
    first ``cur_len`` entries are filled; ``begin_index`` is the prompt length."""
    n, v = scores.shape
    vocab = jnp.arange(v)
    if opts.begin_suppress_tokens:
        mask = jnp.isin(vocab, jnp.asarray(opts.begin_suppress_tokens))
        scores = jnp.where(mask[None] & (cur_len == begin_index), NEG, scores)
    if opts.suppress_tokens:
        mask = jnp.isin(vocab, jnp.asarray(opts.suppress_tokens))
        scores = jnp.where(mask[None], NEG, scores)
    if opts.timestamp_begin is not None:
        scores = _timestamp_rules(scores, tokens, cur_len, begin_index, opts)
    return scores


def _timestamp_rules(scores, tokens, cur_len, begin_index, opts):
    tb, eos = opts.timestamp_begin, opts.eos_token_id
    n, v = scores.shape
    s = tokens.shape[1]
    vocab = jnp.arange(v)[None]
    if opts.no_timestamps_token_id is not None:
        scores = scores.at[:, opts.no_timestamps_token_id].set(NEG)
    n_gen = cur_len - begin_index
    last = jax.lax.dynamic_index_in_dim(tokens, jnp.maximum(cur_len - 1, 0), axis=1, keepdims=False)
    penult = jax.lax.dynamic_index_in_dim(tokens, jnp.maximum(cur_len - 2, 0), axis=1, keepdims=False)
    last_ts = (n_gen >= 1) & (last >= tb)
    pen_ts = (n_gen < 2) | (penult >= tb)
    scores = jnp.where((last_ts & pen_ts)[:, None] & (vocab >= tb), NEG, scores)
    scores = jnp.where((last_ts & ~pen_ts)[:, None] & (vocab < eos), NEG, scores)
    pos = jnp.arange(s)[None]
    is_ts = (pos >= begin_index) & (pos < cur_len) & (tokens >= tb)
    any_ts = is_ts.any(axis=1)
    last_pos = jnp.max(jnp.where(is_ts, pos, 0), axis=1)
    last_val = jnp.take_along_axis(tokens, last_pos[:, None], axis=1)[:, 0]
    ts_last = jnp.where(any_ts, jnp.where(last_ts & ~pen_ts, last_val, last_val + 1), tb)
    scores = jnp.where((vocab >= tb) & (vocab < ts_last[:, None]), NEG, scores)
    first = cur_len == begin_index
    scores = jnp.where(first & (vocab < tb), NEG, scores)
    if opts.max_initial_timestamp_index is not None:
        scores = jnp.where(first & (vocab > tb + opts.max_initial_timestamp_index), NEG, scores)
    logprobs = jax.nn.log_softmax(scores.astype(jnp.float32), axis=-1)
    ts_logprob = jax.nn.logsumexp(logprobs[:, tb:], axis=-1)
    max_text = jnp.max(logprobs[:, :tb], axis=-1)
    return jnp.where((ts_logprob > max_text)[:, None] & (vocab < tb), NEG, scores)


# ----------------------------------------------------------------------------------------------------------------
# Greedy and beam search over a static KV cache
# ----------------------------------------------------------------------------------------------------------------

def _step(model, params, ids, cache, index, encoder_hidden=None):
    logits, cache = model.apply({"params": params}, ids, encoder_hidden, None, cache, index, method="decode")
    return logits[:, -1].astype(jnp.float32), cache


def _decode_loop(model, params, encoder_hidden, prompt, opts: DecodeOptions, pick):
    """Greedy or sampling loop; ``pick(scores [N, V], step) -> tokens [N]``."""
    n, p = prompt.shape
    total = p + opts.max_new_tokens
    cache = init_cache(model.config, n, total, model.dtype, encoder_hidden.shape[1])
    tokens = jnp.full((n, total), opts.pad_token_id, jnp.int32).at[:, :p].set(prompt)
    logits, cache = _step(model, params, prompt, cache, 0, encoder_hidden)
    done = jnp.zeros((n,), bool)
    logprob = jnp.zeros((n,), jnp.float32)

    def cond(state):
        i, _, _, _, done, _ = state
        return (i < opts.max_new_tokens) & ~jnp.all(done)

    def body(state):
        i, tokens, cache, logits, done, logprob = state
        cur = p + i
        scores = process_logits(logits, tokens, cur, p, opts)
        nxt = pick(scores, i).astype(jnp.int32)
        lp = jnp.take_along_axis(jax.nn.log_softmax(scores, axis=-1), nxt[:, None], axis=1)[:, 0]
        logprob = logprob + jnp.where(done, 0.0, lp)
        nxt = jnp.where(done, opts.pad_token_id, nxt)
        tokens = jax.lax.dynamic_update_slice(tokens, nxt[:, None], (0, cur))
        done = done | (nxt == opts.eos_token_id)
        # The step for the next token is computed even on the last iteration; its result is unused.
        logits, cache = _step(model, params, nxt[:, None], cache, cur)
        return i + 1, tokens, cache, logits, done, logprob

    _, tokens, _, _, _, logprob = jax.lax.while_loop(cond, body, (0, tokens, cache, logits, done, logprob))
    return tokens, logprob


@functools.partial(jax.jit, static_argnums=(0, 4))
def _greedy(model: WhisperModel, params, encoder_hidden, prompt, opts: DecodeOptions):
    return _decode_loop(model, params, encoder_hidden, prompt, opts, lambda s, i: jnp.argmax(s, axis=-1))


@functools.partial(jax.jit, static_argnums=(0, 4))
def _sample(model: WhisperModel, params, encoder_hidden, prompt, opts: DecodeOptions, key, temperature):
    def pick(scores, i):
        return jax.random.categorical(jax.random.fold_in(key, i), scores / temperature, axis=-1)
    return _decode_loop(model, params, encoder_hidden, prompt, opts, pick)


def _gather_beams(x, idx):
    """x [B, K, ...], idx [B, K'] -> [B, K', ...]."""
    return jnp.take_along_axis(x, idx.reshape(idx.shape + (1,) * (x.ndim - 2)), axis=1)


@functools.partial(jax.jit, static_argnums=(0, 4))
def _beam(model: WhisperModel, params, encoder_hidden, prompt, opts: DecodeOptions):
    b, p = prompt.shape
    k = opts.num_beams
    keep = 2 * k
    total = p + opts.max_new_tokens
    n = b * k
    lp_pow = opts.length_penalty
    enc = jnp.repeat(encoder_hidden, k, axis=0)
    flat_prompt = jnp.repeat(prompt, k, axis=0)
    cache = init_cache(model.config, n, total, model.dtype, encoder_hidden.shape[1])
    logits, cache = _step(model, params, flat_prompt, cache, 0, enc)
    running = jnp.full((b, k, total), opts.pad_token_id, jnp.int32).at[:, :, :p].set(prompt[:, None])
    sequences = running
    running_scores = jnp.zeros((b, k), jnp.float32).at[:, 1:].set(-1e9)
    beam_scores = jnp.full((b, k), -1e9, jnp.float32)
    finished = jnp.zeros((b, k), bool)
    unsat = jnp.ones((b, 1), bool)
    top_mask = jnp.arange(keep) < k

    def cond(state):
        return state[0]

    def body(state):
        _, cur, running, running_scores, sequences, beam_scores, finished, unsat, cache, logits = state
        v = logits.shape[-1]
        logp = jax.nn.log_softmax(logits, axis=-1)
        logp = process_logits(logp, running.reshape(n, total), cur, p, opts)
        acc = (logp.reshape(b, k, v) + running_scores[:, :, None]).reshape(b, k * v)
        top_lp, top_idx = jax.lax.top_k(acc, keep)
        src = top_idx // v
        tok = (top_idx % v).astype(jnp.int32)
        cand = _gather_beams(running, src)
        cand = jax.lax.dynamic_update_slice(cand, tok[:, :, None], (0, 0, cur))
        hits = (tok == opts.eos_token_id) | (cur + 1 >= total)
        # running beams for the next step
        run_lp = top_lp + hits.astype(jnp.float32) * -1.0e9
        _, nxt_idx = jax.lax.top_k(run_lp, k)
        new_running = _gather_beams(cand, nxt_idx)
        new_running_scores = _gather_beams(run_lp, nxt_idx)
        new_src = _gather_beams(src, nxt_idx)
        # finished hypotheses
        just = hits & top_mask[None]
        fin_lp = top_lp / ((cur + 1 - p).astype(jnp.float32) ** lp_pow)
        full = jnp.all(finished, axis=-1, keepdims=True) & (opts.early_stopping is True)
        fin_lp = fin_lp + full.astype(jnp.float32) * -1.0e9
        fin_lp = fin_lp + (~unsat).astype(jnp.float32) * -1.0e9
        fin_lp = fin_lp + (~just).astype(jnp.float32) * -1.0e9
        m_seq = jnp.concatenate([sequences, cand], axis=1)
        m_scores = jnp.concatenate([beam_scores, fin_lp], axis=1)
        m_fin = jnp.concatenate([finished, just], axis=1)
        _, m_idx = jax.lax.top_k(m_scores, k)
        sequences = _gather_beams(m_seq, m_idx)
        beam_scores = _gather_beams(m_scores, m_idx)
        finished = _gather_beams(m_fin, m_idx)
        # reorder the self-attention cache (cross-attention K/V is identical across the beams of an input)
        flat_src = (new_src + jnp.arange(b)[:, None] * k).reshape(n)
        cache = dict(cache, self_k=jnp.take(cache["self_k"], flat_src, axis=1),
                     self_v=jnp.take(cache["self_v"], flat_src, axis=1))
        cur = cur + 1
        # transformers' early-stop heuristic
        if opts.early_stopping == "never" and lp_pow > 0.0:
            best_len = jnp.asarray(total - p, jnp.float32)
        else:
            best_len = (cur - p).astype(jnp.float32)
        best_running = new_running_scores[:, :1] / (best_len ** lp_pow)
        worst_fin = jnp.where(finished, jnp.min(beam_scores, axis=1, keepdims=True), -1.0e9)
        unsat = unsat & jnp.any(best_running > worst_fin, axis=-1, keepdims=True)
        go = jnp.any(unsat) & ~(jnp.all(finished) & (opts.early_stopping is True)) & ~jnp.all(hits)
        last_tok = jax.lax.dynamic_index_in_dim(new_running, cur - 1, axis=2, keepdims=False).reshape(n, 1)
        logits, cache = jax.lax.cond(
            go, lambda c: _step(model, params, last_tok, c, cur - 1), lambda c: (logits, c), cache)
        return go, cur, new_running, new_running_scores, sequences, beam_scores, finished, unsat, cache, logits

    state = (jnp.asarray(True), jnp.asarray(p, jnp.int32), running, running_scores, sequences, beam_scores,
             finished, unsat, cache, logits)
    state = jax.lax.while_loop(cond, body, state)
    return state[4], state[5]      # [B, K, S], [B, K]: the finished pool, best first (-1e9: an empty slot)


@functools.partial(jax.jit, static_argnums=(0,))
def encode(model: WhisperModel, params, input_features):
    """Jitted encoder: ``[B, n_mels, frames]`` -> ``[B, frames/2, d_model]``."""
    return model.apply({"params": params}, input_features, method="encode")


def decode_options(settings: GenerationSettings, *, max_new_tokens: int, num_beams: int = 1,
                   return_timestamps: bool = False, length_penalty: float = 1.0,
                   early_stopping: Union[bool, str] = False) -> DecodeOptions:
    return DecodeOptions(
        max_new_tokens=max_new_tokens, eos_token_id=settings.eos_token_id, pad_token_id=settings.pad_token_id,
        num_beams=num_beams, suppress_tokens=settings.suppress_tokens,
        begin_suppress_tokens=settings.begin_suppress_tokens,
        timestamp_begin=settings.timestamp_begin if return_timestamps else None,
        no_timestamps_token_id=settings.no_timestamps_token_id,
        max_initial_timestamp_index=settings.max_initial_timestamp_index,
        length_penalty=length_penalty, early_stopping=early_stopping)


def generate_from_encoder(model: WhisperModel, params, encoder_hidden: Array, prompt: Array,
                          opts: DecodeOptions) -> tuple[Array, Array]:
    """Decode from encoder states with a fixed prompt ``[B, P]``. Returns ``sequences [B, P + max_new_tokens]``
    (prompt included, ``pad_token_id`` after ``eos``) and a score per row (greedy: sum of processed log-probs of
    the generated tokens; beam: the length-penalised beam score)."""
    prompt = jnp.asarray(prompt, jnp.int32)
    if prompt.ndim != 2 or prompt.shape[0] != encoder_hidden.shape[0]:
        raise ValueError(f"prompt must be [batch={encoder_hidden.shape[0]}, P], got {prompt.shape}")
    total = prompt.shape[1] + opts.max_new_tokens
    if total > model.config.max_target_positions:
        raise ValueError(f"prompt length {prompt.shape[1]} + max_new_tokens {opts.max_new_tokens} > "
                         f"max_target_positions={model.config.max_target_positions}")
    if opts.num_beams == 1:
        return _greedy(model, params, encoder_hidden, prompt, opts)
    seqs, scores = _beam(model, params, encoder_hidden, prompt, opts)
    return seqs[:, 0], scores[:, 0]


def beam_nbest_from_encoder(model: WhisperModel, params, encoder_hidden: Array, prompt: Array, opts: DecodeOptions,
                            nbest: int) -> tuple[Array, Array]:
    """Beam search (``opts.num_beams`` >= `nbest`) returning the `nbest` best finished hypotheses per row, as
    transformers' ``num_return_sequences``: ``sequences [B, nbest, P + max_new_tokens]`` and length-penalised
    scores ``[B, nbest]`` (best first; -inf for a slot no hypothesis reached)."""
    prompt = jnp.asarray(prompt, jnp.int32)
    if not 1 <= nbest <= opts.num_beams:
        raise ValueError(f"nbest must be in [1, num_beams={opts.num_beams}], got {nbest}")
    if prompt.ndim != 2 or prompt.shape[0] != encoder_hidden.shape[0]:
        raise ValueError(f"prompt must be [batch={encoder_hidden.shape[0]}, P], got {prompt.shape}")
    if prompt.shape[1] + opts.max_new_tokens > model.config.max_target_positions:
        raise ValueError(f"prompt length {prompt.shape[1]} + max_new_tokens {opts.max_new_tokens} > "
                         f"max_target_positions={model.config.max_target_positions}")
    if opts.num_beams == 1:
        seqs, scores = _greedy(model, params, encoder_hidden, prompt, opts)
        return seqs[:, None], scores[:, None]
    seqs, scores = _beam(model, params, encoder_hidden, prompt, opts)
    scores = scores[:, :nbest]
    return seqs[:, :nbest], jnp.where(scores > -1e8, scores, NEG)


@functools.partial(jax.jit, static_argnums=(0, 3))
def _language_logits(model, params, encoder_hidden, sot: int):
    ids = jnp.full((encoder_hidden.shape[0], 1), sot, jnp.int32)
    logits, _ = model.apply({"params": params}, ids, encoder_hidden, method="decode")
    return logits[:, -1]


def detect_language(model: WhisperModel, params, encoder_hidden: Array, settings: GenerationSettings) -> np.ndarray:
    """Most likely language token per example (argmax over ``lang_to_id`` after ``<|startoftranscript|>``)."""
    if not settings.lang_to_id:
        raise ValueError("language detection needs lang_to_id in the generation settings")
    logits = np.asarray(_language_logits(model, params, encoder_hidden, settings.decoder_start_token_id))
    ids = np.array(sorted(i for _, i in settings.lang_to_id))
    return ids[np.argmax(logits[:, ids], axis=-1)]


def build_prompts(model, params, enc, settings, language, task, return_timestamps, lang_ids=None) -> np.ndarray:
    """Prompt rows for a batch; a language placeholder is filled from ``lang_ids`` or detected on ``enc``."""
    init = settings.init_tokens(language=language, task=task, return_timestamps=return_timestamps)
    b = enc.shape[0]
    prompt = np.tile(np.array([t if t is not None else -1 for t in init], np.int32), (b, 1))
    if len(init) > 1 and init[1] is None:
        if lang_ids is None:
            lang_ids = detect_language(model, params, enc, settings)
        prompt[:, 1] = np.asarray(lang_ids)[:b] if len(lang_ids) >= b else np.pad(lang_ids, (0, b - len(lang_ids)),
                                                                                  mode="edge")
    return prompt


def generate(model: WhisperModel, params, input_features, settings: GenerationSettings, *,
             max_new_tokens: Optional[int] = None, num_beams: int = 1, language: Optional[str] = None,
             task: Optional[str] = None, return_timestamps: bool = False, length_penalty: float = 1.0,
             early_stopping: Union[bool, str] = False) -> dict[str, Array]:
    """Short-form (<= 30 s) transcription of ``input_features [B, n_mels, frames]``; ``max_new_tokens`` defaults
    to the model's limit (``max_target_positions`` minus the prompt).

    Returns ``{"sequences": [B, P + max_new_tokens] (prompt, generated tokens, pad after eos),
    "prompt_length": P, "scores": [B]}``; :func:`strip` turns rows into the token lists transformers'
    ``generate`` returns.
    """
    feats = jnp.asarray(input_features, jnp.float32)
    enc = encode(model, params, feats)
    prompt = build_prompts(model, params, enc, settings, language, task, return_timestamps)
    opts = decode_options(settings, max_new_tokens=model_limit(model, prompt.shape[1], max_new_tokens),
                          num_beams=num_beams, return_timestamps=return_timestamps, length_penalty=length_penalty,
                          early_stopping=early_stopping)
    seqs, scores = generate_from_encoder(model, params, enc, prompt, opts)
    return {"sequences": seqs, "prompt_length": prompt.shape[1], "scores": scores}


def model_limit(model: WhisperModel, prompt_length: int, max_new_tokens: Optional[int] = None) -> int:
    """``max_new_tokens``, or when None the model's limit: ``max_target_positions`` minus the prompt."""
    if max_new_tokens is not None:
        return int(max_new_tokens)
    limit = model.config.max_target_positions - prompt_length
    if limit < 1:
        raise ValueError(f"a prompt of {prompt_length} tokens leaves no room in max_target_positions="
                         f"{model.config.max_target_positions}")
    return limit


def strip(sequences, prompt_length: int, settings: GenerationSettings) -> list[list[int]]:
    """Generated tokens per row, without the prompt, trailing padding and the final eos (transformers' output)."""
    out = []
    for row in np.asarray(sequences)[:, prompt_length:].tolist():
        if settings.eos_token_id in row:
            row = row[:row.index(settings.eos_token_id)]
        elif settings.pad_token_id != settings.eos_token_id:
            while row and row[-1] == settings.pad_token_id:
                row.pop()
        out.append(row)
    return out


def sample_from_encoder(model: WhisperModel, params, encoder_hidden: Array, prompt: Array, opts: DecodeOptions,
                        key: Array, temperature: float) -> tuple[Array, Array]:
    """Sampling at ``temperature`` > 0 (a traced value: one program for every temperature) with the PRNG ``key``
    (step ``i`` draws with ``fold_in(key, i)``). Returns ``sequences [B, P + max_new_tokens]`` and the summed
    log-probabilities of the sampled tokens under the unscaled processed logits ``[B]``."""
    prompt = jnp.asarray(prompt, jnp.int32)
    if prompt.shape[1] + opts.max_new_tokens > model.config.max_target_positions:
        raise ValueError(f"prompt length {prompt.shape[1]} + max_new_tokens {opts.max_new_tokens} > "
                         f"max_target_positions={model.config.max_target_positions}")
    return _sample(model, params, encoder_hidden, prompt, opts, key, jnp.float32(temperature))


@functools.partial(jax.jit, static_argnums=(0, 4, 5))
def _no_speech(model, params, encoder_hidden, prompt, sot_index: int, token: int):
    logits, _ = model.apply({"params": params}, prompt, encoder_hidden, method="decode")
    return jax.nn.softmax(logits[:, sot_index].astype(jnp.float32), axis=-1)[:, token]


def no_speech_probs(model: WhisperModel, params, encoder_hidden: Array, prompt, sot_index: int,
                    no_speech_token: int) -> np.ndarray:
    """Probability of ``<|nospeech|>`` at the ``<|startoftranscript|>`` position ``sot_index`` of ``prompt [B, P]``
    (openai-whisper's ``no_speech_prob``; transformers' ``WhisperNoSpeechDetection``) ``[B]``."""
    return np.asarray(_no_speech(model, params, encoder_hidden, jnp.asarray(prompt, jnp.int32), int(sot_index),
                                 int(no_speech_token)))
