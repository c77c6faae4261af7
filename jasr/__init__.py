"""jasr: speech recognition in pure JAX.

``import jasr`` gives the user-facing names: the losses, audio loading and features, tokenizers, the data pipeline,
decoding (search, LMs, graphs, long files) and metrics. Lattice algorithms live in :mod:`fsa_ops` (k2 names),
networks in :mod:`models`; the model families in :mod:`jasr.tasks`, the pure train/eval steps in :mod:`jasr.steps`,
a run's data in :mod:`jasr.run_data`, meshes and sharding in :mod:`jasr.sharding`, several hosts
(``jax.distributed``, per-process batches) in :mod:`jasr.distributed` and the training loop in :mod:`jasr.training`
(driven by ``train.py``); layer stacks (remat policies, pipeline stages) in :mod:`models.layer_stack`.
"""
from jasr.audio import AudioError, audio_info, load_audio, resample
from jasr.augment import AudioAugment, spec_augment
from jasr.ctc_beam import BeamSearchResult, ctc_prefix_beam_search, nbest_lists, word_timestamps
from jasr.data import BatchConfig, DataError, compute_cmvn_stats, make_loader
from jasr.decoding import ctc_greedy_decode, ctc_greedy_ids, ids_to_text
from jasr.cmvn import CmvnStats
from jasr.features import (FeatureConfig, compute_features, compute_features_jax, fbank, mfcc, num_frames,
                           whisper_log_mel)
from jasr.graph_decoding import (GraphHypothesis, attention_rescoring, get_lattice, nbest, nbest_rescoring, one_best,
                                  whole_lattice_rescoring)
from jasr.hlg import (DecodingGraph, Lang, compile_hlg, compile_lg, compile_tlg, grammar_fsa, lang_from_tokenizer,
                      lexicon_fst, load_lang, make_lang, read_lexicon, save_lang)
from jasr.lexicon import (Hotwords, Lexicon, LmLookahead, lexicon_from_tokenizer, make_hotwords, make_lexicon,
                          make_lm_lookahead, word_boundaries)
from jasr.long_audio import (chunked_ctc_log_probs, decode_segments, iter_audio_blocks, iter_chunked_log_probs,
                             join_segments, split_on_silence, stream_features, task_log_probs_fn, task_segment_decoder)
from jasr.losses import ctc_loss, joint_ctc_attention_loss, wav2vec2_ctc_loss
from jasr.manifests import ManifestError, Utterance, read_folder, read_manifest, write_manifest
from jasr.metrics import cer, wer
from jasr.ngram import NgramLM, ngram_to_fsa, read_arpa, write_arpa
from jasr.ngram_estimate import estimate_kneser_ney
from jasr.tokenizers import CharTokenizer, SentencePieceTokenizer, TokenizerError, WhisperTokenizer, load_tokenizer

__version__ = "0.1.0"
__all__ = [
    "ctc_loss", "joint_ctc_attention_loss", "wav2vec2_ctc_loss",
    "AudioError", "audio_info", "load_audio", "resample", "AudioAugment", "spec_augment",
    "FeatureConfig", "CmvnStats", "compute_features", "compute_features_jax", "compute_cmvn_stats", "fbank", "mfcc",
    "whisper_log_mel", "num_frames",
    "CharTokenizer", "SentencePieceTokenizer", "WhisperTokenizer", "load_tokenizer", "TokenizerError",
    "Utterance", "ManifestError", "read_manifest", "write_manifest", "read_folder", "BatchConfig", "make_loader",
    "DataError",
    "ctc_greedy_decode", "ctc_greedy_ids", "ids_to_text", "wer", "cer",
    "ctc_prefix_beam_search", "BeamSearchResult", "nbest_lists", "word_timestamps",
    "Lexicon", "Hotwords", "make_lexicon", "lexicon_from_tokenizer", "make_hotwords", "word_boundaries",
    "LmLookahead", "make_lm_lookahead",
    "iter_audio_blocks", "stream_features", "iter_chunked_log_probs", "chunked_ctc_log_probs", "task_log_probs_fn",
    "split_on_silence", "decode_segments", "join_segments", "task_segment_decoder",
    "Lang", "DecodingGraph", "read_lexicon", "make_lang", "lang_from_tokenizer", "save_lang", "load_lang",
    "lexicon_fst", "grammar_fsa", "compile_lg", "compile_hlg", "compile_tlg",
    "GraphHypothesis", "get_lattice", "one_best", "nbest", "nbest_rescoring", "whole_lattice_rescoring",
    "attention_rescoring",
    "NgramLM", "read_arpa", "write_arpa", "ngram_to_fsa", "estimate_kneser_ney",
]
