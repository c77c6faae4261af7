"""Whisper fine-tuning from a Hugging Face checkpoint (e.g. openai/whisper-tiny) on 30 s log-mel windows.

    huggingface-cli download openai/whisper-tiny --local-dir pretrained/whisper-tiny
    python train.py --config configs/whisper_finetune.py --workdir runs/whisper \\
        --config.train.init_from=pretrained/whisper-tiny \\
        --config.data.train_manifest=data/train.jsonl --config.data.dev_manifest=data/dev.jsonl
    python decode.py --workdir runs/whisper --split dev

Teacher forcing as transformers' fine-tuning recipes: decoder prompt <|startoftranscript|><|en|><|transcribe|>
<|notimestamps|>, targets = BPE(" " + text) + <|endoftext|>, label-smoothed cross-entropy on the targets only (not
on the prompt). The encoder's sinusoidal positions stay frozen. Dev WER uses greedy decoding of the 30 s window
with the checkpoint's suppress lists (generation_config.json), up to the model's 448 positions (cap:
train.max_decode_tokens); decode.py transcribes whole files (long-form, seeking on timestamps).
English-only (.en) checkpoints need --config.data.tokenizer=whisper:gpt2; another language: a WhisperTokenizer
JSON file (jasr.tokenizers, with "language") as data.tokenizer. large-v3: --config.data.num_mel_bins=128
--config.data.tokenizer=whisper:multilingual:100. Training utterances must be at most 30 s (longer ones are
dropped).
"""
from jasr.config import base_config


def get_config():
    c = base_config()
    d = c.data
    d.train_manifest = "data/train.jsonl"     # set on the command line
    d.dev_manifest = "data/dev.jsonl"
    d.feature = "whisper"
    d.normalize = "none"
    d.num_mel_bins = 80
    d.sample_rate = 16000
    d.tokenizer = "whisper:multilingual"
    d.max_frames = 3000 * 16                  # 16 windows of 30 s per batch
    d.bucket_boundaries = (30.0,)
    d.drop_too_long = True
    d.label_pad_multiple = 16

    c.model.name = "whisper"                  # architecture from train.init_from/config.json

    c.loss.type = "attention"
    c.loss.label_smoothing = 0.1
    o = c.optim
    o.lr = 1e-5
    o.schedule = "cosine"
    o.warmup_steps = 500
    o.b2 = 0.999
    o.weight_decay = 0.0
    o.clip_norm = 1.0

    t = c.train
    t.init_from = "pretrained/whisper-tiny"   # a transformers directory you downloaded
    t.num_steps = 4000
    t.log_every = 50
    t.eval_every = 500
    t.checkpoint_every = 500
    return c
