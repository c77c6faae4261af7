"""models: Flax (linen) networks for speech recognition and their Hugging Face checkpoint import/export.

Whisper (``models.whisper``, ``whisper_hf``, ``whisper_generate``), Wav2Vec2 (``wav2vec2``, ``wav2vec2_hf``,
``wav2vec2_pretrain``), Conformer-CTC (``conformer``) and attention encoder-decoders (``aed`` with ``transformer`` /
``lstm`` decoders). Every module takes optax-style ``paddings`` (1.0 = padded) and carries logical axis names on its
parameters.
"""
from models.aed import AEDConfig, AEDModel, beam_search as aed_beam_search, greedy_search as aed_greedy_search
from models.conformer import ConformerConfig, ConformerCTC, ConformerEncoder
from models.hf_io import CheckpointKeyError
from models.lstm import LSTMDecoder, LSTMDecoderConfig
from models.transformer import TransformerConfig, TransformerDecoder, TransformerEncoder
from models.wav2vec2 import Wav2Vec2Config, Wav2Vec2ForCTC, Wav2Vec2Model
from models.wav2vec2_hf import from_pretrained as wav2vec2_from_pretrained
from models.wav2vec2_hf import save_pretrained as wav2vec2_save_pretrained
from models.wav2vec2_pretrain import Wav2Vec2ForPreTraining, pretraining_loss
from models.whisper import WhisperConfig, WhisperModel
from models.whisper_generate import GenerationSettings, generate as whisper_generate
from models.whisper_generate import transcribe_batched, transcribe_sequential
from models.whisper_hf import from_pretrained as whisper_from_pretrained
from models.whisper_hf import save_pretrained as whisper_save_pretrained

__all__ = [
    "CheckpointKeyError",
    "WhisperConfig", "WhisperModel", "whisper_from_pretrained", "whisper_save_pretrained", "GenerationSettings",
    "whisper_generate", "transcribe_sequential", "transcribe_batched",
    "Wav2Vec2Config", "Wav2Vec2Model", "Wav2Vec2ForCTC", "Wav2Vec2ForPreTraining",
    "pretraining_loss", "wav2vec2_from_pretrained", "wav2vec2_save_pretrained",
    "ConformerConfig", "ConformerEncoder", "ConformerCTC", "TransformerConfig", "TransformerEncoder",
    "TransformerDecoder", "LSTMDecoderConfig", "LSTMDecoder", "AEDConfig", "AEDModel",
    "aed_greedy_search", "aed_beam_search",
]
