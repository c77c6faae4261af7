"""The embedded demo: a small Conformer-CTC learns spoken digit strings synthesised offline with eSpeak NG.

    python train.py --config configs/demo.py --workdir runs/demo
    python decode.py --workdir runs/demo --split heldout

The corpus (jasr.demo_data; needs the optional `demo` extra) is built on first use under data.demo_dir; the
`heldout` split uses voices, rates and pitches that never occur in training.
"""
from jasr.config import base_config


def get_config():
    c = base_config()
    c.seed = 0
    d = c.data
    d.demo = True
    d.demo_dir = ".cache/demo_corpus"
    d.demo_num_train = 2000
    d.demo_num_dev = 200
    d.demo_num_heldout = 300
    d.demo_max_words = 4
    d.sample_rate = 16000
    d.feature = "fbank"
    d.num_mel_bins = 80
    d.normalize = "utterance"
    d.device_features = True          # fbank computed inside the jitted step (cheap on CPU too)
    d.max_frames = 4096               # ~16 utterances of ~2.5 s per batch
    d.num_buckets = 2
    d.spec_augment = True
    d.freq_masks = 2
    d.max_freq_width = 10
    d.time_masks = 2
    d.max_time_width = 10

    m = c.model
    m.name = "conformer_ctc"
    m.d_model = 96
    m.num_layers = 4
    m.num_heads = 4
    m.ff_mult = 4
    m.conv_kernel = 15
    m.subsampling = 4
    m.subsampling_channels = 32
    m.dropout_rate = 0.1
    m.attention_dropout_rate = 0.0
    m.ff_dropout_rate = 0.1

    c.loss.type = "ctc"
    o = c.optim
    o.lr = 2e-3
    o.schedule = "cosine"
    o.warmup_steps = 80
    o.final_lr_ratio = 0.02
    o.clip_norm = 1.0

    t = c.train
    t.num_steps = 800
    t.log_every = 20
    t.eval_every = 200
    t.checkpoint_every = 200
    t.keep_last = 2
    t.keep_best = 1
    return c
