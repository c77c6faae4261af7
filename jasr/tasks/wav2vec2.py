"""Wav2Vec2 families on 16 kHz waveforms: CTC fine-tuning (``wav2vec2_ctc``) and self-supervised pretraining
(``wav2vec2_pretrain``), both optionally from a Hugging Face directory (architecture from its config.json, weights
by name)."""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from jasr import losses
from jasr.decoding import ctc_greedy_decode
from jasr.errors import ConfigError
from jasr.tasks.base import (Task, check_stacks, model_defaults, model_fields, model_fields_with_precision,
                             read_hf_config, require, stack_options)
from models.hf_io import load_state_dict
from models.wav2vec2 import Wav2Vec2Config, Wav2Vec2ForCTC, feat_extract_output_lengths
from models.wav2vec2_hf import params_from_hf_state_dict
from models.wav2vec2_pretrain import Wav2Vec2ForPreTraining, pretraining_loss, sample_pretraining_inputs


def normalize_audio(audio, paddings):
    """Zero mean, unit variance over each row's valid samples (Wav2Vec2FeatureExtractor's do_normalize); padded
    samples stay 0. audio, paddings [B, S] -> [B, S]."""
    valid = 1.0 - paddings.astype(jnp.float32)
    n = jnp.maximum(jnp.sum(valid, axis=-1, keepdims=True), 1.0)
    mean = jnp.sum(audio * valid, axis=-1, keepdims=True) / n
    var = jnp.sum(jnp.square((audio - mean) * valid), axis=-1, keepdims=True) / n
    return (audio - mean) / jnp.sqrt(var + 1e-7) * valid


@dataclasses.dataclass(frozen=True)
class _Wav2Vec2Task(Task):
    """Shared by both heads: raw normalised audio in, 20 ms frames out, the feature encoder optionally frozen."""
    has_feature_encoder = True
    head: ClassVar[str] = ""      # params_from_hf_state_dict's head

    @classmethod
    def model_config_class(cls):
        return Wav2Vec2Config

    @classmethod
    def check_config(cls, cfg):
        d = cfg.data
        require(d.feature == "raw", f"config 'data.feature' must be 'raw' for model {cls.name!r} (it reads 16 kHz "
                                    f"waveforms), got {d.feature!r}")
        require(d.sample_rate == 16000, f"config 'data.sample_rate' must be 16000 for {cls.name!r}, "
                                        f"got {d.sample_rate}")
        require(not d.spec_augment, f"config 'data.spec_augment' must be False for {cls.name!r} (the model masks "
                                    f"its own frames: model.mask_time_prob / mask_feature_prob)")
        super().check_config(cfg)
        if not cfg.train.init_from:     # else the layer count comes from the checkpoint's config (checked in build)
            m = model_defaults(Wav2Vec2Config, model_fields(cfg))
            check_stacks(stack_options(cfg), [("model.num_hidden_layers", m["num_hidden_layers"], m["scan_layers"])])

    @classmethod
    def subsampling(cls, cfg):
        return 2   # 20 ms frames vs the 10 ms frames the loader counts

    @classmethod
    def model_class(cls) -> type:
        raise NotImplementedError

    @classmethod
    def build(cls, cfg, vocab_size, fc, *, tokenizer=None, hf_dir=None):
        fields = cls.head_fields(model_fields_with_precision(cfg), vocab_size)
        hf = read_hf_config(hf_dir)
        try:
            mcfg = Wav2Vec2Config.from_hf(hf, **fields) if hf else Wav2Vec2Config(**fields)
        except (TypeError, ValueError, NotImplementedError) as e:
            raise ConfigError(f"config 'model' for {cls.name!r}: {e}") from e
        frozen = ("wav2vec2/feature_extractor",) if cfg.train.freeze_feature_encoder else ()
        stack = stack_options(cfg)
        check_stacks(stack, [("model.num_hidden_layers", mcfg.num_hidden_layers, mcfg.scan_layers)])
        return cls.from_model(cls.model_class()(mcfg, stack), frozen, cfg)

    @classmethod
    def head_fields(cls, fields: dict, vocab_size: int) -> dict:
        return fields

    @classmethod
    def from_model(cls, model, frozen, cfg) -> "_Wav2Vec2Task":
        return cls(model=model, frozen=frozen, blank_id=0)

    def init(self, key, batch):
        return nn.unbox(self.init_boxed(key, batch))

    def init_boxed(self, key, batch):
        k1, k2 = jax.random.split(key)
        audio = normalize_audio(batch["audio"], batch["audio_paddings"])
        return self.model.init({"params": k1, "dropout": k2}, audio, batch["audio_paddings"], deterministic=True)

    def output_frames(self, samples, fc):
        return int(feat_extract_output_lengths(self.model.config, samples))

    def load_pretrained(self, directory, key):
        """The encoder from any Wav2Vec2 checkpoint (pretraining, base or CTC); heads as the subclass says."""
        mcfg = self.model.config
        drop = self.dropped_prefixes()
        if mcfg.mask_time_prob <= 0 and mcfg.mask_feature_prob <= 0:
            drop += ("masked_spec_embed", "wav2vec2.masked_spec_embed")
        sd = {k: v for k, v in load_state_dict(directory).items() if not k.startswith(drop)}
        return params_from_hf_state_dict(sd, mcfg, self.head, init_missing=key)

    def dropped_prefixes(self) -> tuple[str, ...]:
        return ("lm_head.",)


@dataclasses.dataclass(frozen=True)
class Wav2Vec2CTCTask(_Wav2Vec2Task):
    """CTC fine-tuning: a fresh CTC head sized to jasr's character tokenizer (blank 0 = the model's pad id), the
    model's own time/feature masking when training, loss per label token, greedy CTC decoding. From a
    checkpoint, the CTC head is always initialised fresh (jasr's vocabulary is not the checkpoint's) and the
    tensors of other heads are dropped."""
    name = "wav2vec2_ctc"
    loss_types = ("ctc",)
    head = "ctc"

    @classmethod
    def check_config(cls, cfg):
        super().check_config(cfg)
        require(cfg.data.tokenizer == "char", f"config 'data.tokenizer' must be 'char' for 'wav2vec2_ctc' (the CTC "
                                              f"head is sized to jasr's character vocabulary, blank 0), got "
                                              f"{cfg.data.tokenizer!r}")

    @classmethod
    def model_class(cls):
        return Wav2Vec2ForCTC

    @classmethod
    def head_fields(cls, fields, vocab_size):
        return {**fields, "vocab_size": vocab_size, "pad_token_id": 0}

    def dropped_prefixes(self):
        return ("lm_head.", "quantizer.", "project_hid.", "project_q.")

    def ctc_logits(self, params, batch, key=None, train=False):
        """(logits [B, T', V], paddings [B, T']); masks from the 'mask' rng when training."""
        rngs = None
        if train and key is not None:
            kd, km = jax.random.split(key)
            rngs = {"dropout": kd, "mask": km}
        audio = normalize_audio(batch["audio"], batch["audio_paddings"])
        out = self.model.apply({"params": params}, audio, batch["audio_paddings"], deterministic=not train,
                               rngs=rngs)
        return out.logits, out.paddings

    def loss(self, params, model_state, batch, key, train):
        logits, pads = self.ctc_logits(params, batch, key, train)
        ctc_sum, tokens, infeasible = losses.weighted_ctc_loss(logits, pads, batch["labels"],
                                                               batch["label_paddings"], batch["row_weights"],
                                                               self.blank_id)
        return ctc_sum, (jnp.maximum(tokens, 1.0), {}, {"ctc": ctc_sum, "infeasible_rows": infeasible})

    def greedy_decode(self, params, model_state, batch):
        return ctc_greedy_decode(*self.ctc_logits(params, batch), self.blank_id)

    @property
    def has_ctc_head(self):
        return True

    def ctc_log_probs(self, params, model_state, batch):
        """log_softmax of :meth:`ctc_logits` (inference) in float32, and the output paddings."""
        logits, pads = self.ctc_logits(params, batch)
        return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1), pads


@dataclasses.dataclass(frozen=True)
class Wav2Vec2PretrainTask(_Wav2Vec2Task):
    """Contrastive + diversity loss over masked frames with an annealed Gumbel temperature; the loss is per masked
    frame; dev evaluation uses fixed masks (key 0), so that the dev losses of two checkpoints compare. No labels:
    the loader gets a dummy label per utterance. From a checkpoint, the pretraining heads load when present."""
    gumbel: tuple = (2.0, 0.5, 0.999995)    # (max, min, decay) of the Gumbel temperature
    name = "wav2vec2_pretrain"
    loss_types = ("wav2vec2_pretrain",)
    needs_transcripts = False
    logged_aux = ("gumbel_temperature", "perplexity")
    head = "pretraining"

    @classmethod
    def model_class(cls):
        return Wav2Vec2ForPreTraining

    @classmethod
    def label_fn(cls, tokenizer):
        return lambda text: [1]

    @classmethod
    def from_model(cls, model, frozen, cfg):
        loss = cfg.loss
        return cls(model=model, frozen=frozen, blank_id=0, gumbel=(
            float(loss.max_gumbel_temperature), float(loss.min_gumbel_temperature),
            float(loss.gumbel_temperature_decay)))

    def gumbel_temperature(self, step) -> jax.Array:
        """max(max_temp * decay**step, min_temp), as transformers' wav2vec2 pretraining script."""
        hi, lo, decay = self.gumbel
        return jnp.maximum(hi * jnp.power(jnp.float32(decay), jnp.asarray(step, jnp.float32)), lo)

    def loss(self, params, model_state, batch, key, train):
        mcfg = self.model.config
        audio, pads = normalize_audio(batch["audio"], batch["audio_paddings"]), batch["audio_paddings"]
        k = key if (train and key is not None) else jax.random.PRNGKey(0)
        k_in, kd, kg = jax.random.split(k, 3)
        mask, neg = sample_pretraining_inputs(k_in, mcfg, audio.shape[0], audio.shape[1], pads)
        mask = mask & (batch["row_weights"][:, None] > 0)
        temp = self.gumbel_temperature(batch.get("step", 0))
        out = self.model.apply({"params": params}, audio, pads, mask_time_indices=mask, deterministic=not train,
                               gumbel_temperature=temp, rngs={"dropout": kd, "gumbel": kg} if train else None)
        pl = pretraining_loss(mcfg, out, mask, neg)
        aux = {"contrastive": pl.contrastive_loss, "diversity": pl.diversity_loss,
               "perplexity": out.codevector_perplexity, "gumbel_temperature": temp}
        return pl.loss, (jnp.maximum(pl.num_masked, 1.0), {}, aux)
