"""Conformer attention encoder-decoder with joint CTC/attention training (ESPnet/WeNet recipe shape) on the demo
corpus. Dev WER uses the CTC head's greedy decode with loss.type="joint", greedy attention decoding with
loss.type="attention" (to eos or the encoder's output frames; cap: train.max_decode_tokens).

    python train.py --config configs/conformer_aed.py --workdir runs/aed
"""
import os

from jasr.config import load_config_file


def get_config():
    c = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "demo.py"))
    c.data.spec_augment = True
    m = c.model
    for k in list(m.keys()):
        if k != "name":
            del m[k]
    m.name = "conformer_aed"
    m.encoder = dict(d_model=96, num_layers=4, num_heads=4, ff_mult=4, conv_kernel=15, subsampling=4,
                     subsampling_channels=32, dropout_rate=0.1, attention_dropout_rate=0.0, ff_dropout_rate=0.1)
    m.decoder = dict(type="transformer", num_layers=2, num_heads=4, ff_dim=384, dropout_rate=0.1)
    c.loss.type = "joint"
    c.loss.ctc_weight = 0.3
    c.loss.label_smoothing = 0.1
    return c
