"""Whisper generation in JAX, one import for both halves: :mod:`models.whisper_decode` (settings, logits
processors, greedy / sampling / beam search over a static KV cache, language detection, no-speech probability) and
:mod:`models.whisper_longform` (long-form transcription: openai-whisper's ``transcribe`` with temperature fallback,
no-speech skipping and previous-text conditioning; the plain seek loop; batched fixed windows)."""
from models.whisper_decode import (FRAME_SECONDS, TIME_PRECISION, DecodeOptions, GenerationSettings, build_prompts,
                                   decode_options, detect_language, encode, generate, generate_from_encoder,
                                   model_limit, no_speech_probs, process_logits, sample_from_encoder, strip)
from models.whisper_longform import (LongFormOptions, conditioning_tokens, merge_overlapping, needs_fallback,
                                     should_skip, split_segments, text_compression_ratio, token_compression_ratio,
                                     transcribe_batched, transcribe_longform, transcribe_sequential)

__all__ = [
    "FRAME_SECONDS", "TIME_PRECISION", "DecodeOptions", "GenerationSettings", "build_prompts", "decode_options",
    "detect_language", "encode", "generate", "generate_from_encoder", "model_limit", "no_speech_probs",
    "process_logits", "sample_from_encoder", "strip", "LongFormOptions", "conditioning_tokens",
    "merge_overlapping", "needs_fallback", "should_skip", "split_segments", "text_compression_ratio",
    "token_compression_ratio", "transcribe_batched", "transcribe_longform", "transcribe_sequential",
]
