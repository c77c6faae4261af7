"""Wav2Vec2 self-supervised pretraining (contrastive + diversity loss, Gumbel product quantizer) on raw 16 kHz
audio; no transcripts needed. The architecture is the wav2vec2-base preset (models.wav2vec2.Wav2Vec2Config
defaults); set --config.train.init_from=DIR to continue from a transformers checkpoint instead.

    python train.py --config configs/wav2vec2_pretrain.py --workdir runs/w2v_pt \\
        --config.data.train_manifest=data/unlabelled.jsonl --config.data.dev_manifest=data/dev.jsonl

Per step: spans of the projected features are masked (model.mask_time_prob / mask_time_length, as transformers'
pretraining script), num_negatives distractors are drawn from the other masked frames, and the Gumbel-softmax
temperature is max(loss.max_gumbel_temperature * loss.gumbel_temperature_decay**step, loss.min_gumbel_temperature).
The reported loss is per masked frame; the dev evaluation reports it too (with fixed masks and negatives) and
picks the best checkpoint by it (there is no WER). Fine-tune the result with configs/wav2vec2_ctc.py after
exporting it with models.wav2vec2_hf.save_pretrained (head="pretraining").
"""
from jasr.config import base_config


def get_config():
    c = base_config()
    d = c.data
    d.train_manifest = "data/unlabelled.jsonl"   # set on the command line; "text" may be empty
    d.dev_manifest = "data/dev.jsonl"
    d.feature = "raw"
    d.sample_rate = 16000
    d.max_frames = 16000                         # 10 ms units: ~160 s of padded audio per batch
    d.bucket_boundaries = (4.0, 8.0, 12.0, 16.0)
    d.drop_too_long = True

    m = c.model
    m.name = "wav2vec2_pretrain"                 # wav2vec2-base shapes (Wav2Vec2Config defaults)
    m.mask_time_prob = 0.65
    m.mask_time_length = 10
    m.mask_time_min_masks = 2
    m.num_negatives = 100
    m.diversity_loss_weight = 0.1
    m.feat_quantizer_dropout = 0.0
    m.layerdrop = 0.05

    c.loss.type = "wav2vec2_pretrain"
    c.loss.max_gumbel_temperature = 2.0
    c.loss.min_gumbel_temperature = 0.5
    c.loss.gumbel_temperature_decay = 0.999995
    o = c.optim
    o.lr = 5e-4
    o.schedule = "cosine"
    o.warmup_steps = 10000
    o.b2 = 0.98
    o.eps = 1e-6
    o.weight_decay = 0.01
    o.clip_norm = 1.0

    t = c.train
    t.num_steps = 200000
    t.log_every = 100
    t.eval_every = 2000
    t.checkpoint_every = 2000
    return c
