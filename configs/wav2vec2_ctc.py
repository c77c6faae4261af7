"""Wav2Vec2 CTC fine-tuning on raw 16 kHz audio from a Hugging Face checkpoint (e.g. facebook/wav2vec2-base).

    huggingface-cli download facebook/wav2vec2-base --local-dir pretrained/wav2vec2-base
    python train.py --config configs/wav2vec2_ctc.py --workdir runs/w2v_ctc \\
        --config.train.init_from=pretrained/wav2vec2-base \\
        --config.data.train_manifest=data/train.jsonl --config.data.dev_manifest=data/dev.jsonl
    python decode.py --workdir runs/w2v_ctc --split dev

The encoder comes from train.init_from (a pretraining, base or CTC checkpoint; its config.json gives the
architecture, the `model` section below overrides single fields such as dropout and masking). The CTC head is
always initialised fresh: it is sized to jasr's character tokenizer built from the training transcripts, whose id 0
is the CTC blank (= the model's pad_token_id, as in transformers). Audio is normalised per utterance (zero mean,
unit variance) as Wav2Vec2FeatureExtractor does; the model masks its own time steps (SpecAugment,
model.mask_time_prob) when training, and the conv feature encoder is frozen (train.freeze_feature_encoder).
Use --config.train.precision=bfloat16 on accelerators.
"""
from jasr.config import base_config


def get_config():
    c = base_config()
    d = c.data
    d.train_manifest = "data/train.jsonl"     # set on the command line
    d.dev_manifest = "data/dev.jsonl"
    d.feature = "raw"
    d.sample_rate = 16000
    d.tokenizer = "char"
    d.max_frames = 16000                      # 10 ms units: ~160 s of padded audio per batch
    d.bucket_boundaries = (4.0, 8.0, 12.0, 16.0)
    d.drop_too_long = True
    d.drop_unfit = True

    m = c.model
    m.name = "wav2vec2_ctc"
    m.mask_time_prob = 0.05
    m.mask_time_length = 10
    m.layerdrop = 0.05
    m.hidden_dropout = 0.1
    m.attention_dropout = 0.1
    m.activation_dropout = 0.0
    m.feat_proj_dropout = 0.0
    m.final_dropout = 0.0

    c.loss.type = "ctc"
    o = c.optim
    o.lr = 1e-4
    o.schedule = "cosine"
    o.warmup_steps = 500
    o.b2 = 0.999
    o.weight_decay = 0.005
    o.clip_norm = 1.0

    t = c.train
    t.init_from = "pretrained/wav2vec2-base"  # a transformers directory you downloaded
    t.freeze_feature_encoder = True
    t.num_steps = 20000
    t.log_every = 50
    t.eval_every = 1000
    t.checkpoint_every = 1000
    return c
