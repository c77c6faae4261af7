"""Run configs as code (ml_collections), command-line overrides and validation before anything starts.

A config file is a Python file with ``get_config()`` (or ``get_config(arg)`` for ``path.py:arg``) returning a
``ConfigDict``; configs start from :func:`base_config`, which is also the schema: :func:`validate_config` rejects
a key that the schema does not have (naming the closest one), a value of the wrong type, and values out of range,
before any data is read or any model is built. The ``model`` section is checked against the fields of the chosen
model's config dataclass, and the model family (:mod:`jasr.tasks`) checks the rest of what it needs.

Command line (``ml_collections`` conventions): ``--config configs/x.py --config.optim.lr=3e-4 --workdir DIR``.
"""
from __future__ import annotations

import ast
import difflib
import importlib.util
import json
import os
from typing import Any, Sequence

import ml_collections

from jasr.errors import ConfigError
from jasr.tasks import family

LOSSES = ("ctc", "attention", "joint", "wav2vec2_pretrain")
PRECISIONS = ("float32", "bfloat16")

# Sections whose keys are free-form (names of splits -> manifest paths) or checked elsewhere (model fields).
_OPEN_SECTIONS = ("data.eval_manifests", "model")


def base_config() -> ml_collections.ConfigDict:
    """Defaults and schema of a run config. Every config starts from this."""
    c = ml_collections.ConfigDict()
    c.seed = 0

    c.data = ml_collections.ConfigDict()
    c.data.train_manifest = ""          # JSONL (shared/data format); relative paths are relative to the repo root
    c.data.dev_manifest = ""            # dev set for WER during training ("" = no dev evaluation)
    c.data.eval_manifests = ml_collections.ConfigDict()  # extra named splits for decode.py --split NAME
    c.data.speakers_train = ()          # if set: keep only these speakers of train_manifest
    c.data.speakers_dev = ()            # if set: dev = these speakers of dev_manifest (or of train_manifest)
    c.data.demo = False                 # build the synthetic demo corpus (jasr.demo_data) and use its splits
    c.data.demo_dir = ".cache/demo_corpus"
    c.data.demo_num_train = 2000
    c.data.demo_num_dev = 200
    c.data.demo_num_heldout = 300
    c.data.demo_max_words = 4
    c.data.tokenizer = "char"           # "char" (built from the train transcripts) or a path to a tokenizer file
    c.data.sample_rate = 16000
    c.data.feature = "fbank"            # "fbank" | "mfcc" | "whisper" | "raw" (waveform, for wav2vec2)
    c.data.num_mel_bins = 80
    c.data.low_freq = 20.0              # mel filter bank range in Hz (fbank/mfcc); high_freq <= 0: Nyquist + high_freq
    c.data.high_freq = 0.0
    c.data.normalize = "utterance"      # "none" | "utterance" (mean/variance per utterance) | "level" (waveform RMS)
    c.data.max_frames = 8000            # padded frames per batch (B * T); B per duration bucket = max_frames // T
    c.data.max_batch_size = 0           # cap on B (0 = none)
    c.data.num_buckets = 4              # duration buckets at quantiles of the train durations ...
    c.data.bucket_boundaries = ()       # ... or explicit upper edges in seconds
    c.data.label_pad_multiple = 8
    c.data.device_features = False      # load raw audio, compute features on device inside the jitted step
    c.data.drop_unfit = False           # drop (instead of rejecting) utterances whose labels cannot fit the frames
    c.data.drop_too_long = False        # drop (instead of rejecting) utterances longer than the last bucket
    c.data.max_bad_fraction = 0.01      # unreadable/truncated/non-finite audio or unencodable transcripts are
                                        # skipped (named in the log); more than this fraction of a split: error
    c.data.num_workers = 0              # grain worker processes (0: in-process)
    c.data.shuffle_seed = 0
    c.data.spec_augment = False         # SpecAugment on device (train only)
    c.data.freq_masks = 2
    c.data.max_freq_width = 15
    c.data.time_masks = 2
    c.data.max_time_width = 20
    c.data.max_time_ratio = 0.05        # a time mask covers at most this share of the utterance (and max_time_width)
    c.data.max_time_warp = 0            # SpecAugment time warp: the centre frame moves by up to this many frames
    c.data.speed_perturb = ()           # speed factors drawn per training utterance, e.g. (0.9, 1.0, 1.1) (host)
    c.data.gain_db = ()                 # (low, high): random gain in dB per training utterance
    c.data.noise_snr_db = ()            # (low, high): white noise at a random SNR in dB ...
    c.data.noise_prob = 0.5             # ... added to this fraction of training utterances
    c.data.vtlp = ()                    # (low, high): vocal tract length perturbation, warp factor drawn per
    #                                     training utterance (spectrum warped, tempo unchanged; host)
    c.data.random_eq_db = 0.0           # > 0: random spectral tilt and broad bumps within +-this many dB per
    #                                     training utterance, mean power kept (jasr.augment.random_eq; host)
    c.data.random_eq_points = 1         # > 1: time-varying equalisation, this many random curves from start to end

    c.model = ml_collections.ConfigDict()
    c.model.name = "conformer_ctc"

    c.loss = ml_collections.ConfigDict()
    c.loss.type = "ctc"                 # "ctc" | "attention" | "joint" | "wav2vec2_pretrain"
    c.loss.ctc_weight = 0.3             # joint: ctc_weight * CTC + (1 - ctc_weight) * attention
    c.loss.label_smoothing = 0.1        # attention CE (conformer_aed, whisper)
    # wav2vec2_pretrain: Gumbel-softmax temperature of step s = max(max * decay**s, min) (transformers' recipe)
    c.loss.max_gumbel_temperature = 2.0
    c.loss.min_gumbel_temperature = 0.5
    c.loss.gumbel_temperature_decay = 0.999995

    c.optim = ml_collections.ConfigDict()
    c.optim.lr = 1e-3
    c.optim.schedule = "cosine"         # "cosine" | "noam" | "constant" (all with linear warmup)
    c.optim.warmup_steps = 500          # in optimiser updates
    c.optim.final_lr_ratio = 0.0        # cosine: final lr = lr * final_lr_ratio
    c.optim.b1 = 0.9
    c.optim.b2 = 0.98
    c.optim.eps = 1e-8
    c.optim.weight_decay = 0.01
    c.optim.clip_norm = 1.0             # global-norm clipping (0 disables)
    c.optim.grad_accum = 1              # micro-batches per optimiser update

    c.train = ml_collections.ConfigDict()
    c.train.num_steps = 1000            # train_step calls (micro-batches); updates = num_steps // grad_accum
    c.train.log_every = 50
    c.train.eval_every = 500            # dev WER/CER every N steps (and at the end)
    c.train.checkpoint_every = 500      # and at the end
    c.train.keep_last = 3
    c.train.keep_best = 1               # by dev WER
    c.train.async_checkpoint = True
    c.train.precision = "float32"       # "float32" | "bfloat16" (compute dtype; params and optimiser stay fp32)
    c.train.max_eval_batches = 0        # 0 = the whole dev set
    c.train.progress = True             # tqdm bar
    c.train.tensorboard = True
    c.train.init_from = ""              # HF directory to initialise from (wav2vec2_ctc / whisper / wav2vec2_pretrain)
    c.train.freeze_feature_encoder = False  # wav2vec2: the conv feature encoder gets no updates (HF fine-tuning)
    c.train.max_decode_tokens = 0       # attention decoding (whisper per 30 s window, conformer_aed): most new
    #                                     tokens per hypothesis; 0: the model's limit (whisper: max_target_positions
    #                                     minus the prompt; aed: the encoder's output frames of the audio bucket)
    c.train.stop_after = 0              # stop (checkpointed) after this many steps of this process (0 = no)
    c.train.ema_decay = 0.0             # > 0: keep an EMA of the params (jasr.averaging), checkpointed with the
    #                                     state; dev evaluation, best checkpoint and load_run use the EMA

    # devices: a mesh over jax.devices() (all processes); -1 takes the devices left over. Batches split over
    # data x fsdp (batch sizes are rounded to multiples of it), parameters and optimiser state over fsdp (along
    # embed) and tensor (mlp, heads, vocab), by the model family's logical axis rules (jasr.sharding)
    c.mesh = ml_collections.ConfigDict()
    c.mesh.data = -1
    c.mesh.fsdp = 1
    c.mesh.tensor = 1
    c.mesh.pipeline = 1                 # > 1: pipeline the model's layer stacks over this many stages (needs
    #                                     model scan_layers; layers divisible by it); layers axis over pipeline
    c.mesh.microbatches = 0             # pipeline microbatches per batch (0: = mesh.pipeline); rows are padded to
    #                                     a multiple of microbatches x data x fsdp

    # decode.py's defaults for this run (its flags override them); paths relative to the repo root
    c.decode = ml_collections.ConfigDict()
    c.decode.method = "greedy"          # "greedy" | "beam" | "lexicon" | "graph" (beam/lexicon/graph: CTC models)
    c.decode.beam = 16                  # prefixes kept per frame (beam, lexicon); graph: the search beam is fixed
    c.decode.nbest = 1                  # hypotheses written per utterance (<= beam)
    c.decode.lm = ""                    # ARPA n-gram LM (word level), fused with weight lm_weight
    c.decode.lm_weight = 0.5
    c.decode.word_bonus = 0.0           # added per word (per token without a lexicon)
    c.decode.lexicon = ""               # word list (first column of each line), spelled with the run's tokenizer
    c.decode.grammar = ""               # ARPA grammar G (lexicon: the word LM when decode.lm is empty; graph: HLG)
    c.decode.hotwords = ()              # phrases to boost (context biasing)
    c.decode.hotword_boost = 2.0        # per matched token
    c.decode.token_min_logp = -10.0     # grow prefixes only by tokens at least this likely (speed; best always)
    c.decode.length_penalty = 0.0       # attention beam search (AED: GNMT, Whisper: m ** p): length normalisation
    c.decode.ctc_weight = 0.0           # AED beam search: (1 - w) * attention + w * CTC prefix score (joint runs)
    c.decode.lm_lookahead = False       # beam/lexicon with a word LM: score partial words by the best word below
    c.decode.graph_decoding = "one_best"  # method graph: one_best | nbest | nbest_rescoring |
    #                                       whole_lattice_rescoring | attention_rescoring (icefall's methods)
    c.decode.num_paths = 100            # graph n-best methods: paths sampled per lattice
    c.decode.nbest_scale = 0.5          # graph n-best methods: lattice score scale for the sampling
    c.decode.rescore_lm = ""            # graph rescoring: the (larger) word LM ("" = the grammar)
    c.decode.lm_scales = ()             # graph rescoring: LM scales (the first gives the transcript; () = lm_weight)
    c.decode.attention_scales = (1.0,)  # graph attention_rescoring: attention-decoder scales
    c.decode.long_file_seconds = 60.0   # longer files decode in pieces, in bounded memory (jasr.long_audio):
    c.decode.chunk_seconds = 10.0       #   CTC heads over windows of chunk_seconds ...
    c.decode.context_seconds = 2.0      #   ... with this much context on each side (kept out of the output)
    c.decode.segment_seconds = 20.0     #   attention decoders: pieces of at most this, cut at quiet points
    c.decode.mesh_tensor = 1            # decode with the parameters sharded over this many local devices (tensor)
    c.decode.mesh_fsdp = 1              #   ... and fsdp (a model too large for one device); batches: the rest
    return c


def _suggest(key: str, options: Sequence[str]) -> str:
    close = difflib.get_close_matches(key, list(options), n=3)
    return f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""


def _check_keys(cfg: ml_collections.ConfigDict, schema: ml_collections.ConfigDict, prefix: str) -> None:
    for key in cfg.keys():
        path = f"{prefix}{key}"
        if key not in schema:
            raise ConfigError(f"unknown config key {path!r}{_suggest(key, list(schema.keys()))}")
        if path in _OPEN_SECTIONS:
            continue
        v, s = cfg[key], schema[key]
        if isinstance(s, ml_collections.ConfigDict):
            if not isinstance(v, ml_collections.ConfigDict):
                raise ConfigError(f"config {path!r} must be a section, got {v!r}")
            _check_keys(v, s, path + ".")
        else:
            _check_type(path, v, s)


def _check_type(path: str, value: Any, default: Any) -> None:
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif isinstance(default, str):
        ok = isinstance(value, str)
    elif isinstance(default, (tuple, list)):
        ok = isinstance(value, (tuple, list))
    else:
        ok = True
    if not ok:
        raise ConfigError(f"config {path!r} must be a {type(default).__name__}, got {value!r}")


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def validate_config(cfg: ml_collections.ConfigDict, *, check_paths: bool = True, repo_root: str | None = None
                    ) -> None:
    """Raises :class:`ConfigError` naming the first bad key or value. Checks files exist if `check_paths`."""
    _check_keys(cfg, base_config(), "")
    d, o, t, ls = cfg.data, cfg.optim, cfg.train, cfg.loss
    _require(d.feature in ("fbank", "mfcc", "whisper", "raw"),
             f"config 'data.feature' must be 'fbank', 'mfcc', 'whisper' or 'raw', got {d.feature!r}")
    _require(d.normalize in ("none", "utterance", "level"),
             f"config 'data.normalize' must be 'none', 'utterance' or 'level', got {d.normalize!r}")
    _require(d.sample_rate in (8000, 16000, 22050, 24000, 44100, 48000),
             f"config 'data.sample_rate' must be a standard rate, got {d.sample_rate}")
    _require(d.max_frames >= 1, f"config 'data.max_frames' must be >= 1, got {d.max_frames}")
    _require(0.0 <= d.max_bad_fraction <= 1.0,
             f"config 'data.max_bad_fraction' must be in [0, 1], got {d.max_bad_fraction}")
    _require(d.max_batch_size >= 0, f"config 'data.max_batch_size' must be >= 0, got {d.max_batch_size}")
    _require(d.num_buckets >= 1, f"config 'data.num_buckets' must be >= 1, got {d.num_buckets}")
    _require(all(isinstance(b, (int, float)) and b > 0 for b in d.bucket_boundaries)
             and list(d.bucket_boundaries) == sorted(set(d.bucket_boundaries)),
             f"config 'data.bucket_boundaries' must be increasing positive seconds, got {tuple(d.bucket_boundaries)}")
    _require(d.label_pad_multiple >= 1, f"config 'data.label_pad_multiple' must be >= 1, got {d.label_pad_multiple}")
    for k in ("freq_masks", "max_freq_width", "time_masks", "max_time_width", "max_time_warp"):
        _require(d[k] >= 0, f"config 'data.{k}' must be >= 0, got {d[k]}")
    _require(0.0 <= d.max_time_ratio <= 1.0, f"config 'data.max_time_ratio' must be in [0, 1], got {d.max_time_ratio}")
    _require(all(isinstance(v, (int, float)) and 0.5 <= v <= 2.0 for v in d.speed_perturb),
             f"config 'data.speed_perturb' must be speed factors in [0.5, 2], got {tuple(d.speed_perturb)}")
    for k in ("gain_db", "noise_snr_db"):
        _require(len(d[k]) in (0, 2) and all(isinstance(v, (int, float)) for v in d[k])
                 and (not d[k] or d[k][0] <= d[k][1]), f"config 'data.{k}' must be () or (low, high), "
                                                       f"got {tuple(d[k])}")
    _require(len(d.vtlp) in (0, 2) and all(isinstance(v, (int, float)) and 0.5 <= v <= 2.0 for v in d.vtlp)
             and (not d.vtlp or d.vtlp[0] <= d.vtlp[1]),
             f"config 'data.vtlp' must be () or (low, high) warp factors in [0.5, 2], low <= high, got {d.vtlp}")
    _require(d.random_eq_db >= 0.0, f"config 'data.random_eq_db' must be >= 0, got {d.random_eq_db}")
    _require(d.random_eq_points >= 1, f"config 'data.random_eq_points' must be >= 1, got {d.random_eq_points}")
    _require(0.0 <= d.noise_prob <= 1.0, f"config 'data.noise_prob' must be in [0, 1], got {d.noise_prob}")
    _require(not (d.device_features and d.feature not in ("fbank", "mfcc", "whisper")),
             f"config 'data.device_features' needs data.feature fbank/mfcc/whisper, got {d.feature!r}")
    _require(d.num_mel_bins >= 1, f"config 'data.num_mel_bins' must be >= 1, got {d.num_mel_bins}")
    nyquist = d.sample_rate / 2.0
    high = d.high_freq if d.high_freq > 0 else nyquist + d.high_freq
    _require(0.0 <= d.low_freq < high <= nyquist,
             f"config 'data.low_freq'={d.low_freq} / 'data.high_freq'={d.high_freq} must give 0 <= low < high <= "
             f"Nyquist ({nyquist:g} Hz; high_freq <= 0 means Nyquist + high_freq)")
    _require(d.num_workers >= 0, f"config 'data.num_workers' must be >= 0, got {d.num_workers}")
    for name in ("demo_num_train", "demo_num_dev", "demo_num_heldout", "demo_max_words"):
        _require(d[name] >= (1 if name in ("demo_num_train", "demo_max_words") else 0),
                 f"config 'data.{name}' out of range: {d[name]}")
    if not d.demo:
        _require(bool(d.train_manifest), "config 'data.train_manifest' is empty (set it, or data.demo=True)")
    family(cfg.model.get("name"))   # a ConfigError naming the registered families if it is none of them
    _require(ls.type in LOSSES, f"config 'loss.type' must be one of {LOSSES}, got {ls.type!r}")
    _require(0.0 <= ls.ctc_weight <= 1.0, f"config 'loss.ctc_weight' must be in [0, 1], got {ls.ctc_weight}")
    _require(0.0 <= ls.label_smoothing < 1.0, f"config 'loss.label_smoothing' must be in [0, 1), "
                                             f"got {ls.label_smoothing}")
    _require(o.lr > 0, f"config 'optim.lr' must be > 0, got {o.lr}")
    _require(o.schedule in ("cosine", "noam", "constant"),
             f"config 'optim.schedule' must be 'cosine', 'noam' or 'constant', got {o.schedule!r}")
    _require(o.warmup_steps >= 0, f"config 'optim.warmup_steps' must be >= 0, got {o.warmup_steps}")
    _require(0.0 <= o.final_lr_ratio <= 1.0, f"config 'optim.final_lr_ratio' must be in [0, 1], "
                                             f"got {o.final_lr_ratio}")
    _require(0.0 <= o.b1 < 1.0 and 0.0 <= o.b2 < 1.0, f"config 'optim.b1'/'optim.b2' must be in [0, 1), "
                                                      f"got {o.b1}, {o.b2}")
    _require(o.eps > 0, f"config 'optim.eps' must be > 0, got {o.eps}")
    _require(o.weight_decay >= 0, f"config 'optim.weight_decay' must be >= 0, got {o.weight_decay}")
    _require(o.clip_norm >= 0, f"config 'optim.clip_norm' must be >= 0, got {o.clip_norm}")
    _require(o.grad_accum >= 1, f"config 'optim.grad_accum' must be >= 1, got {o.grad_accum}")
    _require(t.num_steps >= 1, f"config 'train.num_steps' must be >= 1, got {t.num_steps}")
    _require(t.num_steps % o.grad_accum == 0, f"config 'train.num_steps'={t.num_steps} must be a multiple of "
                                              f"'optim.grad_accum'={o.grad_accum}")
    for k in ("log_every", "eval_every", "checkpoint_every", "keep_last"):
        _require(t[k] >= 1, f"config 'train.{k}' must be >= 1, got {t[k]}")
    _require(t.checkpoint_every % t.log_every == 0,
             f"config 'train.checkpoint_every'={t.checkpoint_every} must be a multiple of 'train.log_every'="
             f"{t.log_every} (so that a resumed run logs the same averages)")
    _require(0.0 <= t.ema_decay < 1.0, f"config 'train.ema_decay' must be in [0, 1), got {t.ema_decay}")
    _require(t.keep_best >= 0, f"config 'train.keep_best' must be >= 0, got {t.keep_best}")
    _require(t.precision in PRECISIONS, f"config 'train.precision' must be one of {PRECISIONS}, "
                                        f"got {t.precision!r}")
    _require(t.max_eval_batches >= 0 and t.stop_after >= 0, "config 'train.max_eval_batches' and "
                                                            "'train.stop_after' must be >= 0")
    _require(0 < ls.min_gumbel_temperature <= ls.max_gumbel_temperature,
             f"config 'loss.min_gumbel_temperature'={ls.min_gumbel_temperature} must be > 0 and <= "
             f"'loss.max_gumbel_temperature'={ls.max_gumbel_temperature}")
    _require(0 < ls.gumbel_temperature_decay <= 1.0, f"config 'loss.gumbel_temperature_decay' must be in (0, 1], "
                                                   f"got {ls.gumbel_temperature_decay}")
    _require(t.max_decode_tokens >= 0, f"config 'train.max_decode_tokens' must be >= 0, got {t.max_decode_tokens}")
    check_decode(cfg.decode)
    m = cfg.mesh
    for k in ("data", "fsdp", "tensor", "pipeline"):
        _require(isinstance(m[k], int) and (m[k] >= 1 or m[k] == -1), f"config 'mesh.{k}' must be >= 1 or -1 (the "
                                                                     f"devices left over), got {m[k]!r}")
    _require(sum(m[k] == -1 for k in ("data", "fsdp", "tensor", "pipeline")) <= 1,
             "config 'mesh': only one axis may be -1 (the devices left over)")
    _require(isinstance(m.get("microbatches", 0), int) and m.get("microbatches", 0) >= 0,
             f"config 'mesh.microbatches' must be an int >= 0 (0: = mesh.pipeline), got {m.get('microbatches')!r}")
    _require(m.pipeline != 1 or m.get("microbatches", 0) == 0,
             f"config 'mesh.microbatches'={m.get('microbatches')} needs mesh.pipeline > 1 (it microbatches a pipeline)")
    if t.init_from and check_paths:
        root = repo_root or os.getcwd()
        full = t.init_from if os.path.isabs(t.init_from) else os.path.join(root, t.init_from)
        _require(not os.path.isdir(full) or os.path.isfile(os.path.join(full, "config.json")),
                 f"config 'train.init_from': {t.init_from!r} is not a Hugging Face model directory (no config.json)")
    family(cfg.model.name).check_config(cfg)
    if check_paths:
        root = repo_root or os.getcwd()
        paths = [("data.train_manifest", d.train_manifest), ("data.dev_manifest", d.dev_manifest),
                 ("train.init_from", t.init_from)]
        paths += [(f"data.eval_manifests.{k}", v) for k, v in d.eval_manifests.items()]
        paths += [(f"decode.{k}", cfg.decode[k]) for k in ("lm", "lexicon", "grammar", "rescore_lm")]
        for key, p in paths:
            if p and not (d.demo and key.startswith("data.")):
                full = p if os.path.isabs(p) else os.path.join(root, p)
                _require(os.path.exists(full), f"config {key!r}: {p!r} does not exist (resolved to {full})")
        if d.tokenizer != "char" and not d.tokenizer.startswith("whisper:"):
            full = d.tokenizer if os.path.isabs(d.tokenizer) else os.path.join(root, d.tokenizer)
            _require(os.path.exists(full), f"config 'data.tokenizer': {d.tokenizer!r} is neither 'char' nor an "
                                           f"existing file")


DECODE_METHODS = ("greedy", "beam", "lexicon", "graph")


def check_decode(dc: ml_collections.ConfigDict, prefix: str = "config 'decode.") -> None:
    """Checks decoding settings (a config's decode section, or decode.py's flags merged into it); raises
    ConfigError naming the key (`prefix` + key + "'")."""
    def req(cond, key, msg):
        _require(cond, f"{prefix}{key}' {msg}")
    req(dc.method in DECODE_METHODS, "method", f"must be one of {DECODE_METHODS}, got {dc.method!r}")
    req(dc.beam >= 1, "beam", f"must be >= 1, got {dc.beam}")
    req(1 <= dc.nbest <= dc.beam, "nbest", f"must be in [1, beam={dc.beam}], got {dc.nbest}")
    req(dc.lm_weight >= 0, "lm_weight", f"must be >= 0, got {dc.lm_weight}")
    req(0.0 <= dc.ctc_weight <= 1.0, "ctc_weight", f"must be in [0, 1], got {dc.ctc_weight}")
    req(dc.token_min_logp <= 0, "token_min_logp", f"must be <= 0 (a log-probability), got {dc.token_min_logp}")
    req(all(isinstance(h, str) and h.strip() for h in dc.hotwords), "hotwords",
        f"must be non-empty phrases, got {tuple(dc.hotwords)}")
    req(dc.method != "lexicon" or dc.lexicon, "lexicon", "is needed by method 'lexicon' (a word list)")
    req(dc.method != "graph" or (dc.lexicon and (dc.grammar or dc.lm)), "grammar",
        "(or 'decode.lm') and 'decode.lexicon' are needed by method 'graph' (HLG = lexicon o grammar)")


# ------------------------------------------------------------------------------------------------------------
# loading and command line

def load_config_file(spec: str) -> ml_collections.ConfigDict:
    """Loads ``path.py`` or ``path.py:arg`` (ml_collections convention) and returns its ``get_config(...)``."""
    path, _, arg = spec.partition(":")
    if not os.path.exists(path):
        raise ConfigError(f"--config: file {path!r} not found")
    mod_spec = importlib.util.spec_from_file_location(f"_jasr_config_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
        raise ConfigError(f"--config: {path!r} has no get_config() function")
    cfg = module.get_config(arg) if arg else module.get_config()
    if not isinstance(cfg, ml_collections.ConfigDict):
        raise ConfigError(f"--config: {path}:get_config() must return an ml_collections.ConfigDict")
    return cfg


def _parse_value(raw: str, current: Any, key: str) -> Any:
    if isinstance(current, bool):
        low = raw.lower()
        if low in ("true", "1", "yes"):
            return True
        if low in ("false", "0", "no"):
            return False
        raise ConfigError(f"--config.{key}: expected a bool, got {raw!r}")
    if isinstance(current, str) or current is None:
        try:
            v = ast.literal_eval(raw)
            return v if current is None else raw
        except (ValueError, SyntaxError):
            return raw
    try:
        v = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        raise ConfigError(f"--config.{key}: cannot parse {raw!r} as a {type(current).__name__}") from None
    if isinstance(current, float) and isinstance(v, int) and not isinstance(v, bool):
        v = float(v)
    if isinstance(current, tuple) and isinstance(v, (list, tuple)):
        v = tuple(v)
    elif isinstance(current, tuple) and not isinstance(v, (list, tuple)):
        v = (v,)
    if type(v) is not type(current) and not (isinstance(current, float) and isinstance(v, float)):
        raise ConfigError(f"--config.{key}: expected a {type(current).__name__}, got {raw!r}")
    return v


def apply_override(cfg: ml_collections.ConfigDict, key: str, raw: str) -> None:
    """Sets dotted `key` (e.g. ``optim.lr``) from the string `raw`, typed like the current value."""
    parts = key.split(".")
    node = cfg
    for i, p in enumerate(parts[:-1]):
        if p not in node or not isinstance(node[p], ml_collections.ConfigDict):
            where = ".".join(parts[:i]) or "<root>"
            opts = [k for k in node.keys()] if isinstance(node, ml_collections.ConfigDict) else []
            raise ConfigError(f"--config.{key}: unknown config key {'.'.join(parts[:i + 1])!r} "
                              f"(under {where}){_suggest(p, opts)}")
        node = node[p]
    last = parts[-1]
    open_section = ".".join(parts[:-1]) in _OPEN_SECTIONS
    if last not in node:
        if open_section:
            with node.unlocked():
                node[last] = _parse_value(raw, None, key)
            return
        raise ConfigError(f"--config.{key}: unknown config key {key!r}{_suggest(last, list(node.keys()))}")
    current = node[last]
    if isinstance(current, ml_collections.ConfigDict):
        raise ConfigError(f"--config.{key}: is a section, set one of its keys ({', '.join(current.keys())})")
    value = _parse_value(raw, current, key)
    with node.ignore_type():
        node[last] = value


def parse_overrides(argv: Sequence[str]) -> tuple[str | None, list[tuple[str, str]], list[str]]:
    """Splits argv into (config spec, [(key, raw value)], rest). Accepts ``--x=v`` and ``--x v``."""
    spec, overrides, rest = None, [], []
    i = 0
    argv = list(argv)
    while i < len(argv):
        a = argv[i]
        if a == "--config" or a.startswith("--config=") or a.startswith("--config."):
            name, eq, val = a[2:].partition("=")
            if not eq:
                if i + 1 >= len(argv):
                    raise ConfigError(f"{a}: missing value")
                val = argv[i + 1]
                i += 1
            if name == "config":
                spec = val
            else:
                overrides.append((name[len("config."):], val))
        else:
            rest.append(a)
        i += 1
    return spec, overrides, rest


def config_from_argv(argv: Sequence[str]) -> tuple[ml_collections.ConfigDict, list[str]]:
    """``--config FILE[:arg]`` plus ``--config.key=value`` overrides -> (config, remaining args)."""
    spec, overrides, rest = parse_overrides(argv)
    if spec is None:
        raise ConfigError("--config FILE is required (e.g. --config configs/demo.py)")
    cfg = load_config_file(spec)
    for key, raw in overrides:
        apply_override(cfg, key, raw)
    return cfg, rest


def save_config(cfg: ml_collections.ConfigDict, path: str) -> None:
    """Writes the resolved config as JSON (atomically; an OSError such as a full disk names `path`)."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "w") as f:
            f.write(cfg.to_json_best_effort(indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise OSError(e.errno, e.strerror, path) from e


def load_saved_config(path: str) -> ml_collections.ConfigDict:
    """Reads a config written by :func:`save_config` back into a ConfigDict on top of the schema."""
    with open(path) as f:
        raw = json.load(f)
    cfg = base_config()

    def fill(node, values, prefix):
        for k, v in values.items():
            if isinstance(v, dict) and (k in node and isinstance(node[k], ml_collections.ConfigDict)):
                fill(node[k], v, prefix + k + ".")
            else:
                with node.ignore_type():
                    if k not in node:
                        with node.unlocked():
                            node[k] = tuple(v) if isinstance(v, list) else v
                    else:
                        node[k] = tuple(v) if isinstance(v, list) else v
    fill(cfg, raw, "")
    return cfg
