"""Wav2Vec2ForCTC forward: jasr (jitted JAX) vs transformers (PyTorch eager, CPU), same random weights.

    python bench/wav2vec2_bench.py [--sizes tiny,base] [--repeats 5] [--batch 1] [--seconds 10]

``run()`` returns one row per size (name, batch, seconds of audio, jasr_ms, torch_ms, ratio = jasr/torch, and the
largest logit difference as a sanity check); medians over ``repeats`` timed calls after one warm-up call (which also
compiles the jitted function). "base" is the facebook/wav2vec2-base architecture (random weights), "tiny" the
test suite's config.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, conv_dim=(16, 24, 16),
            conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3), num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=4,
            vocab_size=12)
SIZES = {"tiny": TINY, "base": {}}  # base: transformers' Wav2Vec2Config() defaults == facebook/wav2vec2-base


def _median_ms(fn, repeats: int) -> float:
    fn()  # warm-up (and compilation for jax)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e3)


def run(sizes=("base",), repeats: int = 5, batch: int = 1, seconds: float = 10.0, sample_rate: int = 16000,
        seed: int = 0) -> list[dict]:
    import jax
    import jax.numpy as jnp
    import torch
    from transformers import Wav2Vec2Config as HFConfig
    from transformers import Wav2Vec2ForCTC as HFForCTC

    from models.wav2vec2 import Wav2Vec2Config
    from models.wav2vec2_hf import build_model, params_from_hf_state_dict

    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    rows = []
    n = int(round(seconds * sample_rate))
    x = np.random.default_rng(seed).standard_normal((batch, n)).astype(np.float32)
    for name in sizes:
        if name not in SIZES:
            raise ValueError(f"unknown size {name!r}; one of {sorted(SIZES)}")
        torch.manual_seed(seed)
        hf = HFForCTC(HFConfig(**SIZES[name])).eval()
        sd = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
        cfg = Wav2Vec2Config.from_hf(hf.config.to_dict())
        params = params_from_hf_state_dict(sd, cfg, "ctc")
        model = build_model(cfg, "ctc")
        fwd = jax.jit(lambda p, a: model.apply({"params": p}, a).logits)
        xj = jnp.asarray(x)
        xt = torch.from_numpy(x)

        def jasr_call():
            return fwd(params, xj).block_until_ready()

        def torch_call():
            with torch.inference_mode():
                return hf(xt).logits

        jasr_ms = _median_ms(jasr_call, repeats)
        torch_ms = _median_ms(torch_call, repeats)
        diff = float(np.abs(np.asarray(jasr_call()) - torch_call().numpy()).max())
        rows.append(dict(name=f"wav2vec2-{name}", batch=batch, seconds=seconds, jasr_ms=round(jasr_ms, 2),
                         torch_ms=round(torch_ms, 2), ratio=round(jasr_ms / torch_ms, 3), max_abs_diff=diff))
        del hf, params, sd
    return rows


def to_markdown(rows: list[dict]) -> str:
    cols = ["name", "batch", "seconds", "jasr_ms", "torch_ms", "ratio", "max_abs_diff"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(f"{r[c]:.2e}" if c == "max_abs_diff" else str(r[c]) for c in cols) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="tiny,base")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args(argv)
    import jax
    import torch

    rows = run(tuple(s for s in args.sizes.split(",") if s), args.repeats, args.batch, args.seconds)
    print(f"Wav2Vec2ForCTC forward, {args.seconds:g} s of 16 kHz audio, jax {jax.__version__} "
          f"({jax.default_backend()}) vs torch {torch.__version__} (CPU, {torch.get_num_threads()} threads); "
          f"median of {args.repeats}\n")
    print(to_markdown(rows))


if __name__ == "__main__":
    main()
