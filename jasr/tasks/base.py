"""What the training loop and decode.py ask of a model family: the :class:`Task` interface and the parts that
several families share (the on-device front end, the model section of a config).

A family subclasses :class:`Task` in its own module of :mod:`jasr.tasks` and is registered there by one line. The
class answers the questions asked before any data is read (config checks, subsampling, feature and label rules),
:meth:`Task.build` makes an instance from a run config, and the instance (a hashable, static argument of the
jitted steps) initialises, scores and decodes the network.

Batches are dicts of arrays: ``features [B, T, F]`` + ``feature_paddings [B, T]`` or ``audio [B, S]`` +
``audio_paddings [B, S]``; ``labels [B, N]`` + ``label_paddings [B, N]``; ``row_weights [B]`` (0 for the loader's
padding rows); paddings are 1.0 where padded.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import os
from typing import Any, Callable, ClassVar

import flax.linen as nn
import jax
import ml_collections

from jasr import augment
from jasr.errors import ConfigError
from jasr.features import FeatureConfig, compute_features_jax
from jasr.sharding import pipeline_stages
from models.layer_stack import REMAT_POLICIES, StackOptions


@dataclasses.dataclass(frozen=True)
class Frontend:
    """On-device feature extraction (for batches of raw audio) and SpecAugment (training only); hashable."""
    feature_config: Any = None         # FeatureConfig when batches carry raw audio to featurise on device
    spec_augment: tuple = ()           # (freq_masks, max_freq_width, time_masks, max_time_width, max_time_ratio,
    #                                    max_time_warp) or ()

    @classmethod
    def from_config(cls, cfg: ml_collections.ConfigDict, fc: FeatureConfig) -> "Frontend":
        d = cfg.data
        return cls(fc if (d.device_features and d.feature != "raw") else None,
                   (d.freq_masks, d.max_freq_width, d.time_masks, d.max_time_width, float(d.max_time_ratio),
                    int(d.max_time_warp)) if d.spec_augment else ())

    def __call__(self, batch: dict, key, train: bool) -> dict:
        if self.feature_config is not None and "audio" in batch:
            feats, pads = compute_features_jax(batch["audio"], batch["audio_paddings"], self.feature_config)
            batch = {k: v for k, v in batch.items() if k not in ("audio", "audio_paddings")}
            batch["features"], batch["feature_paddings"] = feats, pads
        if train and self.spec_augment and key is not None and "features" in batch:
            fm, fw, tm, tw, ratio, warp = self.spec_augment
            batch = dict(batch)
            batch["features"] = augment.spec_augment(jax.random.fold_in(key, 7), batch["features"],
                                                     batch["feature_paddings"], num_freq_masks=fm,
                                                     max_freq_width=fw, num_time_masks=tm, max_time_width=tw,
                                                     max_time_ratio=ratio, max_time_warp=warp)
        return batch


def model_fields(cfg: ml_collections.ConfigDict) -> dict:
    """The config's model section minus ``name`` and ``remat_policy`` (see :func:`stack_options`), as a plain
    dict."""
    return {k: (v.to_dict() if isinstance(v, ml_collections.ConfigDict) else v)
            for k, v in cfg.model.items() if k not in ("name", "remat_policy")}


def model_fields_with_precision(cfg: ml_collections.ConfigDict) -> dict:
    """model_fields plus ``dtype="bfloat16"`` when train.precision is bfloat16 (the compute dtype; params stay
    float32)."""
    fields = model_fields(cfg)
    if cfg.train.precision == "bfloat16":
        fields["dtype"] = "bfloat16"
    return fields


def stack_options(cfg: ml_collections.ConfigDict) -> StackOptions:
    """How the model's layer stacks run: ``model.remat_policy`` (one of models.layer_stack.REMAT_POLICIES; "none"
    leaves the model's ``remat`` bool in charge, which means "full") and the pipeline of the mesh section
    (``mesh.pipeline`` stages, ``mesh.microbatches``)."""
    policy = cfg.model.get("remat_policy", "none")
    require(policy in REMAT_POLICIES, f"config 'model.remat_policy' must be one of {REMAT_POLICIES}, got {policy!r}")
    mesh = cfg.get("mesh") or {}
    try:
        stages = pipeline_stages(dict(mesh))
    except ValueError as e:
        raise ConfigError(f"config 'mesh': {e}") from e
    return StackOptions(policy, stages, int(mesh.get("microbatches", 0)) if stages > 1 else 0)


def check_stacks(options: StackOptions, stacks) -> None:
    """ConfigError unless every layer stack of `stacks` (``(config key of its layer count, layers, scanned)``)
    can pipeline over ``options.stages``."""
    if options.stages == 1:
        return
    for key, layers, scan in stacks:
        require(scan, f"config 'mesh.pipeline'={options.stages}: pipelining needs scanned layers (set "
                      f"'{key.rsplit('.', 1)[0]}.scan_layers'=True: parameters stacked on a 'layers' axis)")
        require(layers % options.stages == 0, f"config '{key}'={layers}: the layers do not split evenly over "
                                              f"mesh.pipeline={options.stages} stages")


def model_defaults(cls: type, fields: dict) -> dict:
    """The fields of dataclass `cls` with `fields` over its defaults."""
    return {**{f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}, **fields}


def read_hf_config(hf_dir: str | None) -> dict | None:
    """The config.json of a Hugging Face model folder as a dict (None without a folder)."""
    if not hf_dir:
        return None
    with open(os.path.join(hf_dir, "config.json")) as f:
        return json.load(f)


def require(cond: bool, msg: str) -> None:
    """Raises ConfigError(msg) unless `cond`."""
    if not cond:
        raise ConfigError(msg)


@dataclasses.dataclass(frozen=True)
class SearchOptions:
    """Attention-decoder beam search options for :meth:`Task.beam_decode` (hashable: a static jit argument).

    ``beam_size`` hypotheses kept per step, ``nbest`` returned (<= beam_size); a finished hypothesis of ``m``
    tokens (eos included) ranks by ``score / lp(m)`` with ``lp(m) = m ** length_penalty`` (``length_norm="plain"``)
    or GNMT's ``((5 + m) / 6) ** length_penalty`` (AED; Whisper uses transformers' ``m ** length_penalty`` over
    the generated tokens); ``ctc_weight`` (AED with a CTC head): score ``(1 - w) * attention + w * CTC prefix
    score``; ``ctc_candidates`` tokens per hypothesis scored by CTC (0: all); ``length_bonus`` added per token."""
    beam_size: int = 8
    nbest: int = 1
    length_penalty: float = 0.0
    length_norm: str = "plain"
    ctc_weight: float = 0.0
    ctc_candidates: int = 0
    length_bonus: float = 0.0

    def __post_init__(self):
        if self.beam_size < 1 or not 1 <= self.nbest <= self.beam_size:
            raise ValueError(f"SearchOptions: need beam_size >= 1 and 1 <= nbest <= beam_size, got "
                             f"{self.beam_size}, {self.nbest}")
        if not 0.0 <= self.ctc_weight <= 1.0:
            raise ValueError(f"SearchOptions.ctc_weight must be in [0, 1], got {self.ctc_weight}")
        if self.length_norm not in ("plain", "gnmt"):
            raise ValueError(f"SearchOptions.length_norm must be 'plain' or 'gnmt', got {self.length_norm!r}")


@dataclasses.dataclass(frozen=True)
class Task:
    """A model family: the network and everything the pipeline needs to know to train and decode it.

    Instance methods are pure functions of pytrees (called inside jit):
    ``init(key, batch) -> variables``; ``loss(params, model_state, batch, key, train) -> (loss_sum, (weight,
    new_model_state, aux))``, the reported loss being ``loss_sum / weight`` (weight = label tokens, or masked
    frames for pre-training); ``greedy_decode(params, model_state, batch) -> (ids [B, L] left-aligned, lengths
    [B])`` or None for a model without a decoder. A hypothesis' length limit comes from the audio and the model
    (and config ``train.max_decode_tokens``), never from ``labels``: decoding is the same with or without a
    transcript.
    """
    model: nn.Module
    frozen: tuple = ()            # parameter path prefixes that get no gradient and no update (jasr.optim)
    blank_id: int = 0

    name: ClassVar[str] = ""
    loss_types: ClassVar[tuple[str, ...]] = ()    # the values of loss.type this family trains with
    needs_transcripts: ClassVar[bool] = True      # False: self-supervised; dev evaluation reports the loss only
    logged_aux: ClassVar[tuple[str, ...]] = ()    # per-step aux values averaged into the train log
    has_feature_encoder: ClassVar[bool] = False   # train.freeze_feature_encoder applies

    # -- questions asked of the config, before any data is read ---------------------------------------------------
    @classmethod
    def model_config_class(cls) -> type:
        """The dataclass whose fields are the keys allowed in the config's model section."""
        raise NotImplementedError

    @classmethod
    def extra_model_keys(cls) -> frozenset:
        """Model-section keys that are not fields of model_config_class (module options)."""
        return frozenset()

    @classmethod
    def check_config(cls, cfg: ml_collections.ConfigDict) -> None:
        """Family-specific checks; raises ConfigError naming the key. The base checks loss.type and the model keys."""
        require(cfg.loss.type in cls.loss_types, f"config 'loss.type'={cfg.loss.type!r} does not fit model "
                                                 f"{cls.name!r} (use one of {cls.loss_types})")
        fields = ({f.name for f in dataclasses.fields(cls.model_config_class())} | cls.extra_model_keys()
                  | {"remat_policy"})
        stack_options(cfg)      # model.remat_policy, mesh.pipeline / microbatches
        for k in model_fields(cfg):
            if k not in fields:
                close = difflib.get_close_matches(k, sorted(fields), n=3)
                hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
                raise ConfigError(f"unknown config key 'model.{k}' for model {cls.name!r}{hint}")
        require(not cfg.train.init_from or cls.load_pretrained is not Task.load_pretrained,
                f"config 'train.init_from' is not supported for {cls.name!r} (Hugging Face import exists for "
                f"wav2vec2 and whisper)")
        require(cls.has_feature_encoder or not cfg.train.freeze_feature_encoder,
                f"config 'train.freeze_feature_encoder' is for wav2vec2 models, not {cls.name!r}")

    @classmethod
    def subsampling(cls, cfg: ml_collections.ConfigDict) -> int:
        """Loader frames (10 ms) per network output frame; the loader checks that labels fit."""
        return 1

    @classmethod
    def feature_config(cls, cfg: ml_collections.ConfigDict) -> FeatureConfig:
        """The features the loader (or the on-device front end) computes."""
        d = cfg.data
        if d.feature == "raw":   # waveforms; the fbank config only sizes frames for bucketing
            return FeatureConfig(kind="fbank", sample_rate=d.sample_rate, num_mel_bins=d.num_mel_bins,
                                 normalize="none")
        banks = {} if d.feature == "whisper" else dict(low_freq=d.low_freq, high_freq=d.high_freq)
        return FeatureConfig(kind=d.feature, sample_rate=d.sample_rate, num_mel_bins=d.num_mel_bins,
                             normalize=d.normalize, **banks)

    @classmethod
    def label_fn(cls, tokenizer) -> Callable[[str], list[int]] | None:
        """How the loader turns a transcript into labels (None: tokenizer.encode)."""
        return None

    @classmethod
    def init_length(cls, raw_audio: bool) -> int:
        """Frames (or samples, for raw audio) of the dummy batch that shapes the parameters."""
        return 64000 if raw_audio else 400

    @classmethod
    def build(cls, cfg: ml_collections.ConfigDict, vocab_size: int, fc: FeatureConfig, *, tokenizer=None,
              hf_dir: str | None = None) -> "Task":
        """The task of a run config (`vocab_size` and the input dimension come from the data; `hf_dir`: a folder
        with a Hugging Face config.json the architecture is read from)."""
        raise NotImplementedError

    # -- pure functions of pytrees ----------------------------------------------------------------------------
    def init(self, key: jax.Array, batch: dict) -> dict:
        raise NotImplementedError

    def init_boxed(self, key: jax.Array, batch: dict) -> dict:
        """:meth:`init` with every parameter still in its logical-axis box (``nn.get_partition_spec`` reads the
        names; jasr.sharding maps them to a mesh). The default is :meth:`init` (families that keep the boxes)."""
        return self.init(key, batch)

    def loss(self, params, model_state, batch: dict, key, train: bool):
        raise NotImplementedError

    def greedy_decode(self, params, model_state, batch: dict):
        return None

    def beam_decode(self, params, model_state, batch: dict, options: SearchOptions):
        """Attention-decoder beam search from the audio keys of `batch` (jit it with `options` static):
        ``{"ids": [B, N, L] left-aligned, best first, "lengths": [B, N], "scores": [B, N] (normalised; -inf for an
        empty slot)}`` with ``N = options.nbest``; None for a family without an attention decoder (decode.py then
        uses greedy_decode or CTC prefix beam search). Length limits as greedy_decode's."""
        return None

    @property
    def has_ctc_head(self) -> bool:
        """True when :meth:`ctc_log_probs` gives log-probs (CTC models, AED runs trained with a joint CTC loss)."""
        return False

    def ctc_log_probs(self, params, model_state, batch: dict):
        """The CTC head's ``(log_probs [B, T', V] float32 (log-softmax over the tokenizer's ids, blank = blank_id),
        paddings [B, T'] (1.0 on padded frames))`` from the audio keys of `batch` (inference: no dropout, no
        masking; jit-able); None for a family without a CTC head (see :attr:`has_ctc_head`). Lexicon, LM and graph
        decoding search these."""
        return None

    def sequence_log_probs(self, params, model_state, batch: dict, tokens, token_paddings, rows):
        """Attention-decoder log-probability of whole token sequences (eos included) given the audio of `batch`:
        ``tokens [N, L]`` (tokenizer ids, no sos/eos; 1.0 in ``token_paddings [N, L]`` past each sequence),
        ``rows [N]`` the batch row whose audio each sequence is scored against -> ``[N]`` float32 (icefall's
        attention-decoder rescoring of an n-best list); None for a family without an attention decoder."""
        return None

    @classmethod
    def decode_feature_config(cls, cfg: ml_collections.ConfigDict) -> FeatureConfig:
        """The features of whole files for :meth:`transcribe` (default: :meth:`feature_config`)."""
        return cls.feature_config(cfg)

    @property
    def transcribes_whole_files(self) -> bool:
        """True when :meth:`transcribe` decodes whole files on the host (long-form), which decode.py then uses
        instead of the jitted :meth:`greedy_decode`."""
        return False

    def transcribe(self, params, model_state, batch: dict) -> list[list[int]]:
        """Token ids per row of a batch of whole files (features of :meth:`decode_feature_config`); only for a
        family with ``transcribes_whole_files``."""
        raise NotImplementedError(f"{self.name!r} decodes with greedy_decode")

    def output_frames(self, samples: int, fc: FeatureConfig) -> int | None:
        """The network's output frames for `samples` audio samples (exact, after its subsampling), which labels
        must fit; None: the loader's estimate (feature frames // subsampling)."""
        return None

    def load_pretrained(self, directory: str, key: jax.Array) -> dict:
        """The parameter tree from a Hugging Face directory (strict about every tensor used)."""
        raise ConfigError(f"train.init_from is not supported for {self.name!r}")

    @property
    def has_decoder(self) -> bool:
        return self.needs_transcripts

    @property
    def best_metric(self) -> str:
        """The dev metric that picks the best checkpoint: WER, or the loss for a model without a decoder."""
        return "dev_wer" if self.has_decoder else "dev_loss"
