"""Whisper fine-tuning (``whisper``): 30 s log-mel windows, the ``whisper:*`` BPE tokenizer, the decoder prompt
``<|startoftranscript|><|lang|><|transcribe|><|notimestamps|>``, label-smoothed cross-entropy on the text tokens and
``<|endoftext|>``, greedy decoding for dev WER (one 30 s window), long-form transcription of whole files for
decode.py (seek on timestamps, as openai-whisper); architecture and weights from a Hugging Face directory.

Hypotheses run to ``<|endoftext|>`` or to the model's limit (``max_target_positions`` minus the prompt), capped by
config ``train.max_decode_tokens`` when that is > 0; never to a length taken from the reference."""
from __future__ import annotations

import dataclasses
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jasr import losses
from jasr.errors import ConfigError
from jasr.features import FeatureConfig
from jasr.tasks.base import (SearchOptions, Task, check_stacks, model_defaults, model_fields, read_hf_config,
                             require, stack_options)
from jasr.tokenizers import WhisperTokenizer, normalize_whitespace
from models.hf_io import load_state_dict
from models.whisper import WhisperConfig, WhisperModel
from models.whisper_decode import DecodeOptions, GenerationSettings, generate_from_encoder
from models.whisper_longform import LongFormOptions, split_segments, transcribe_longform
from models.whisper_hf import hf_to_params


@dataclasses.dataclass(frozen=True)
class WhisperTask(Task):
    """Whisper encoder-decoder; loader labels are the BPE of " " + text followed by <|endoftext|>."""
    label_smoothing: float = 0.1
    prompt: tuple = ()            # <|startoftranscript|><|lang|><|transcribe|><|notimestamps|>
    eos_id: int = 0               # <|endoftext|> (ends the targets and greedy decoding)
    max_decode_tokens: int = 0    # new tokens per utterance (per 30 s window); 0: max_target_positions - prompt
    suppress_tokens: tuple = ()   # from generation_config.json of train.init_from
    begin_suppress_tokens: tuple = ()
    no_timestamps_id: int = 0     # <|notimestamps|>; timestamps are the ids after it
    max_initial_timestamp_index: int = 50   # long-form: the first timestamp is at most 1.0 s (as openai-whisper)
    prev_sot_id: int | None = None          # <|startofprev|>: long-form conditioning on the previous text
    longform: LongFormOptions = LongFormOptions(prompt_bucket=16)   # openai-whisper's transcribe defaults
    name = "whisper"
    loss_types = ("attention",)

    @classmethod
    def model_config_class(cls):
        return WhisperConfig

    @classmethod
    def extra_model_keys(cls):
        return frozenset({"remat", "scan_layers"})     # WhisperModel options

    @classmethod
    def check_config(cls, cfg):
        super().check_config(cfg)
        d = cfg.data
        require(d.feature == "whisper", f"config 'data.feature' must be 'whisper' for model 'whisper', "
                                        f"got {d.feature!r}")
        require(d.normalize == "none", f"config 'data.normalize' must be 'none' for model 'whisper' (its log-mel "
                                       f"is scaled already), got {d.normalize!r}")
        require(d.tokenizer != "char", "config 'data.tokenizer' must be a Whisper tokenizer for model 'whisper' "
                                       "('whisper:multilingual', 'whisper:gpt2' or a tokenizer file), got 'char'")
        require(not d.spec_augment, "config 'data.spec_augment' is not supported for model 'whisper'")
        require(not d.device_features, "config 'data.device_features' is not supported for model 'whisper' (its "
                                       "log-mel windows are computed by the loader)")
        stack, fields = stack_options(cfg), model_fields(cfg)
        scan = bool(fields.get("scan_layers", False))
        if not cfg.train.init_from:     # else the layer counts come from the checkpoint's config (checked in build)
            m = model_defaults(WhisperConfig, fields)
            check_stacks(stack, [("model.encoder_layers", m["encoder_layers"], scan),
                                 ("model.decoder_layers", m["decoder_layers"], scan)])
        else:
            check_stacks(stack, [("model.scan_layers", stack.stages, scan)])

    @classmethod
    def feature_config(cls, cfg):
        d = cfg.data   # 30 s windows, as WhisperFeatureExtractor
        return FeatureConfig(kind="whisper", sample_rate=d.sample_rate, num_mel_bins=d.num_mel_bins,
                             normalize="none", whisper_pad_or_trim=True)

    @classmethod
    def label_fn(cls, tokenizer):
        return lambda text: tokenizer.encode(" " + normalize_whitespace(text)) + [tokenizer.eot]

    @classmethod
    def init_length(cls, raw_audio):
        return 3000

    @classmethod
    def build(cls, cfg, vocab_size, fc, *, tokenizer=None, hf_dir=None):
        if not isinstance(tokenizer, WhisperTokenizer):
            raise ConfigError(f"config 'data.tokenizer': model 'whisper' needs a Whisper tokenizer, got {tokenizer!r}")
        fields = model_fields(cfg)
        dtype = "bfloat16" if cfg.train.precision == "bfloat16" else fields.pop("dtype", "float32")
        fields.pop("dtype", None)
        remat, scan = bool(fields.pop("remat", False)), bool(fields.pop("scan_layers", False))
        hf = read_hf_config(hf_dir)
        try:
            mcfg = WhisperConfig.from_hf_dict({**hf, **fields}) if hf else WhisperConfig(**fields)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"config 'model' for 'whisper': {e}") from e
        if mcfg.vocab_size < tokenizer.vocab_size:
            raise ConfigError(f"config 'data.tokenizer': {tokenizer!r} has {tokenizer.vocab_size} tokens, more than "
                              f"the model's vocab_size {mcfg.vocab_size}")
        if mcfg.num_mel_bins != cfg.data.num_mel_bins:
            raise ConfigError(f"config 'data.num_mel_bins'={cfg.data.num_mel_bins} must equal the Whisper model's "
                              f"num_mel_bins={mcfg.num_mel_bins}")
        gen = {}
        if hf_dir and os.path.isfile(os.path.join(hf_dir, "generation_config.json")):
            with open(os.path.join(hf_dir, "generation_config.json")) as f:
                gen = json.load(f)
        stack = stack_options(cfg)
        check_stacks(stack, [("model.encoder_layers", mcfg.encoder_layers, scan),
                             ("model.decoder_layers", mcfg.decoder_layers, scan)])
        model = WhisperModel(mcfg, dtype=jnp.dtype(dtype), remat=remat, scan_layers=scan, stack=stack)
        return cls(model=model, frozen=("encoder/embed_positions",),   # sinusoids, frozen as in transformers
                   label_smoothing=float(cfg.loss.label_smoothing),
                   prompt=tuple(int(x) for x in tokenizer.sot_sequence_including_notimestamps),
                   eos_id=int(tokenizer.eot), max_decode_tokens=int(cfg.train.max_decode_tokens),
                   suppress_tokens=tuple(int(x) for x in (gen.get("suppress_tokens") or ())),
                   begin_suppress_tokens=tuple(int(x) for x in (gen.get("begin_suppress_tokens") or ())),
                   no_timestamps_id=int(tokenizer.no_timestamps), prev_sot_id=int(tokenizer.sot_prev),
                   max_initial_timestamp_index=int(50 if gen.get("max_initial_timestamp_index") is None
                                                   else gen["max_initial_timestamp_index"]))

    def init(self, key, batch):
        return nn.unbox(self.init_boxed(key, batch))

    def init_boxed(self, key, batch):
        k1, k2 = jax.random.split(key)
        ids = jnp.zeros((batch["labels"].shape[0], 4), jnp.int32)
        return self.model.init({"params": k1, "dropout": k2}, jnp.swapaxes(batch["features"], 1, 2), ids)

    def decoder_inputs(self, batch):
        """(features [B, n_mels, 3000], decoder inputs [B, P + N - 1], targets, target weights): inputs = prompt +
        labels[:-1]; the loss covers the text tokens and <|endoftext|> only."""
        labels, lpad = batch["labels"], batch["label_paddings"]
        b, n = labels.shape
        p = len(self.prompt)
        limit = self.model.config.max_target_positions
        if p + n - 1 > limit:
            raise ValueError(f"whisper: prompt ({p}) + label bucket ({n}) tokens exceed max_target_positions={limit}; "
                             f"use shorter utterances")
        full = jnp.concatenate([jnp.broadcast_to(jnp.asarray(self.prompt, jnp.int32), (b, p)),
                                labels.astype(jnp.int32)], axis=1)
        weights = jnp.concatenate([jnp.zeros((b, p - 1), jnp.float32), 1.0 - lpad], axis=1)
        weights = weights * batch["row_weights"][:, None]
        return jnp.swapaxes(batch["features"], 1, 2), full[:, :-1], full[:, 1:], weights

    def loss(self, params, model_state, batch, key, train):
        feats, inputs, targets, w = self.decoder_inputs(batch)
        model = self.model.clone(deterministic=not train) if train else self.model
        rngs = {"dropout": key} if (train and key is not None) else None
        logits = model.apply({"params": params}, feats, inputs, rngs=rngs)
        smoothed, nll = losses.label_smoothed_nll(logits, targets, self.label_smoothing)
        return jnp.sum(smoothed * w), (jnp.maximum(jnp.sum(w), 1.0), {}, {"nll": jnp.sum(nll * w)})

    def decode_window(self, params, batch, num_beams: int = 1, length_penalty: float = 1.0):
        """One 30 s window per row after the task's prompt: (ids [B, L], lengths [B], scores [B])."""
        feats = jnp.swapaxes(batch["features"], 1, 2)
        b, p = feats.shape[0], len(self.prompt)
        opts = DecodeOptions(max_new_tokens=self.max_new_tokens(p), eos_token_id=self.eos_id,
                             pad_token_id=self.eos_id, num_beams=num_beams, suppress_tokens=self.suppress_tokens,
                             begin_suppress_tokens=self.begin_suppress_tokens, length_penalty=length_penalty)
        enc = self.model.apply({"params": params}, feats, method="encode")
        prompt = jnp.broadcast_to(jnp.asarray(self.prompt, jnp.int32), (b, p))
        seqs, scores = generate_from_encoder(self.model, params, enc, prompt, opts)
        generated = seqs[:, p:]
        is_eos = generated == self.eos_id
        lengths = jnp.where(jnp.any(is_eos, axis=1), jnp.argmax(is_eos, axis=1), generated.shape[1])
        return generated.astype(jnp.int32), lengths.astype(jnp.int32), scores

    def greedy_decode(self, params, model_state, batch):
        ids, lengths, _ = self.decode_window(params, batch)
        return ids, lengths

    def output_frames(self, samples, fc):
        """The label tokens (text + <|endoftext|>) the decoder holds after the prompt, whatever the audio: a longer
        transcript is dropped from training (data.drop_unfit) and scored without a loss in evaluation."""
        return self.model.config.max_target_positions - len(self.prompt) + 1

    def max_new_tokens(self, prompt_length: int) -> int:
        """New tokens per window: the model's positions after the prompt, capped by max_decode_tokens if > 0."""
        limit = self.model.config.max_target_positions - prompt_length
        if limit < 1:
            raise ValueError(f"whisper: a prompt of {prompt_length} tokens leaves no room in max_target_positions="
                             f"{self.model.config.max_target_positions}")
        return min(limit, self.max_decode_tokens) if self.max_decode_tokens > 0 else limit

    @classmethod
    def decode_feature_config(cls, cfg):
        d = cfg.data    # whole files: the log-mel of all the audio, cut into 30 s windows by transcribe
        return FeatureConfig(kind="whisper", sample_rate=d.sample_rate, num_mel_bins=d.num_mel_bins,
                             normalize="none", whisper_pad_or_trim=False)

    @property
    def transcribes_whole_files(self):
        return True

    def generation_settings(self) -> GenerationSettings:
        """The task's prompt and token rules as models.whisper_generate settings (language and task forced)."""
        forced = tuple(enumerate(self.prompt[1:-1], 1)) if self.prompt[-1] == self.no_timestamps_id else ()
        return GenerationSettings(decoder_start_token_id=self.prompt[0], eos_token_id=self.eos_id,
                                  pad_token_id=self.eos_id, suppress_tokens=self.suppress_tokens,
                                  begin_suppress_tokens=self.begin_suppress_tokens,
                                  no_timestamps_token_id=self.no_timestamps_id,
                                  max_initial_timestamp_index=self.max_initial_timestamp_index,
                                  forced_decoder_ids=forced or None, prev_sot_token_id=self.prev_sot_id)

    def transcribe_segments(self, params, model_state, batch, options: LongFormOptions | None = None,
                            key=None) -> list[dict]:
        """openai-whisper's long-form ``transcribe`` of each row's whole log-mel ``features [B, T, n_mels]`` (valid
        frames from ``feature_paddings``) by models.whisper_longform.transcribe_longform: 30 s windows, seek on
        timestamps, temperature fallback (compression ratio of the token ids, average log-probability), no-speech
        skipping, conditioning on the previous text. ``options`` default to the task's ``longform`` (openai's
        values); ``key`` (default PRNGKey(0)) drives the sampling of fallback temperatures. Per row: ``{"tokens",
        "segments": [{"start", "end" (seconds), "tokens", "temperature", "avg_logprob", "compression_ratio",
        "no_speech_prob"}], "windows": [...]}``; timestamp tokens are included in the tokens."""
        feats = np.swapaxes(np.asarray(batch["features"], np.float32), 1, 2)
        frames = np.sum(np.asarray(batch["feature_paddings"]) < 0.5, axis=1).astype(np.int64)
        settings = self.generation_settings()
        prompt_length = len(settings.init_tokens(return_timestamps=True))
        return transcribe_longform(self.model, params, feats, settings, num_frames=frames,
                                   key=jax.random.PRNGKey(0) if key is None else key,
                                   options=self.longform if options is None else options,
                                   max_new_tokens=self.max_new_tokens(prompt_length),
                                   batch_size=max(int(np.sum(frames > 0)), 1))   # the rows with audio

    def transcribe(self, params, model_state, batch, options: LongFormOptions | None = None, key=None):
        """Token ids per row of :meth:`transcribe_segments` (timestamp tokens included)."""
        return [r["tokens"] for r in self.transcribe_segments(params, model_state, batch, options, key)]

    def beam_transcribe(self, params, model_state, batch, options: SearchOptions) -> list[list[tuple]]:
        """Long-form transcription of whole files (:meth:`transcribe_segments`) with beam search of
        ``options.beam_size`` in every 30 s window at temperature 0 (openai-whisper's ``beam_size``; the fallback
        temperatures still sample). Per row, best first: ``[(tokens, sum log-prob)]``, the ``options.nbest`` best
        hypotheses of a file decoded in one window, else the one transcript (its windows' log-probs summed)."""
        if options.ctc_weight > 0:
            raise ValueError("whisper beam search has no CTC head (ctc_weight must be 0)")
        opts = dataclasses.replace(self.longform, num_beams=options.beam_size, nbest=options.nbest)
        out = []
        for r in self.transcribe_segments(params, model_state, batch, opts):
            kept = [w for w in r["windows"] if not w["skipped"]]
            if len(kept) == 1 and "nbest" in kept[0] and len(r["windows"]) == 1:
                w = kept[0]     # each alternative as the transcript is made: its complete timestamped segments
                spans = [split_segments(t, self.no_timestamps_id + 1, w["frames"], 0.0)[0] for t, _ in w["nbest"]]
                out.append([([x for seg in segs for x in seg["tokens"]], float(sc))
                            for segs, (_, sc) in zip(spans, w["nbest"])])
            else:
                out.append([(r["tokens"], float(sum(w["sum_logprob"] for w in kept)))])
        return out

    def beam_decode(self, params, model_state, batch, options: SearchOptions):
        """Short-form (one 30 s window) beam search with the KV cache (transformers' beam search, length penalty
        ``options.length_penalty`` over the generated tokens); one hypothesis per row (``options.nbest`` must be 1;
        CTC options do not apply)."""
        if options.nbest != 1 or options.ctc_weight > 0:
            raise ValueError("whisper beam search returns one hypothesis per input and has no CTC head")
        ids, lengths, scores = self.decode_window(params, batch, options.beam_size, options.length_penalty)
        return {"ids": ids[:, None], "lengths": lengths[:, None], "scores": scores[:, None]}

    def load_pretrained(self, directory, key):
        """Every tensor of the checkpoint, mapped by name."""
        return hf_to_params(load_state_dict(directory), self.model.config, scan_layers=self.model.scan_layers)
