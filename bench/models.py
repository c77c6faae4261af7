"""Model speed, jasr (JAX, jit) against transformers (PyTorch), same random weights, CPU, one run.

- Whisper encoder latency on 30 s (3000 mel frames), batch 1 and 8, for the tiny and base architectures.
- Whisper decoder tokens/s with the KV cache (greedy, 32 new tokens after a 4-token prompt, encoder output given),
  batch 1 and 8: jasr's jitted ``while_loop`` with a static cache against a PyTorch loop over
  ``WhisperForConditionalGeneration`` with transformers' ``DynamicCache`` (no Python-side logits processors on
  either side; eos disabled so both run every step).
- Wav2Vec2 forward on 10 s through ``bench/wav2vec2_bench.py`` (another module) when present.

Median of ``--repeats`` (>= 5) timed runs after one warm-up; torch with its default thread count.
Writes ``bench/results/models.md``. Run: ``./run.sh bench models`` (or ``.venv/bin/python bench/models.py``).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
# torch's idle OpenMP workers otherwise busy-wait after each call and slow the JAX calls that follow.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

NEW_TOKENS = 32
PROMPT = 4


def _median_ms(fn, repeats: int) -> float:
    fn()                                                      # warm-up (and compilation for jax)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1e3)


def _random_hf(size: str, seed: int = 0):
    import torch
    import transformers

    from models.whisper import WhisperConfig

    cfg = WhisperConfig.preset(size)
    hf_cfg = transformers.WhisperConfig(**{k: v for k, v in cfg.to_hf_dict().items()
                                           if k not in ("architectures", "num_hidden_layers")})
    torch.manual_seed(seed)
    model = transformers.WhisperForConditionalGeneration(hf_cfg).eval()
    with torch.no_grad():   # unit-scale embeddings: clear greedy choices (std 0.02 gives near-ties)
        model.model.decoder.embed_tokens.weight.normal_(0.0, 1.0)
    return cfg, model


def bench_whisper(sizes=("tiny", "base"), batches=(1, 8), repeats: int = 5) -> list[dict]:
    import jax
    import jax.numpy as jnp
    import torch

    from models.whisper_generate import DecodeOptions, encode, generate_from_encoder
    from models.whisper_hf import hf_to_params

    rows = []
    for size in sizes:
        cfg, hf = _random_hf(size)
        sd = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
        params = hf_to_params(sd, cfg)
        from models.whisper import WhisperModel
        model = WhisperModel(cfg)
        rng = np.random.default_rng(0)
        for b in batches:
            feats = rng.standard_normal((b, cfg.num_mel_bins, cfg.num_frames)).astype(np.float32)
            fj, ft = jnp.asarray(feats), torch.tensor(feats)

            def jax_enc():
                return encode(model, params, fj).block_until_ready()

            def torch_enc():
                with torch.no_grad():
                    return hf.model.encoder(ft).last_hidden_state

            jms, tms = _median_ms(jax_enc, repeats), _median_ms(torch_enc, repeats)
            rows.append(dict(name=f"whisper-{size} encoder 30 s", batch=b, jasr_ms=jms, torch_ms=tms))
            print(rows[-1], flush=True)

            enc_j = jax_enc()
            with torch.no_grad():
                enc_t = torch_enc()
            prompt = np.tile(np.array([cfg.decoder_start_token_id, 50259, 50359, 50363][:PROMPT], np.int32), (b, 1))
            pj = jnp.asarray(prompt)
            opts = DecodeOptions(max_new_tokens=NEW_TOKENS, eos_token_id=-1, pad_token_id=0)

            def jax_dec():
                return generate_from_encoder(model, params, enc_j, pj, opts)[0].block_until_ready()

            def torch_dec():
                from transformers.cache_utils import DynamicCache, EncoderDecoderCache
                from transformers.modeling_outputs import BaseModelOutput

                eo = BaseModelOutput(last_hidden_state=enc_t)
                cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
                ids = torch.tensor(prompt, dtype=torch.long)
                out = []
                with torch.no_grad():
                    for _ in range(NEW_TOKENS):
                        o = hf(encoder_outputs=eo, decoder_input_ids=ids, cache=cache, use_cache=True)
                        cache = o.cache
                        ids = o.logits[:, -1].argmax(-1, keepdim=True)
                        out.append(ids)
                return torch.cat(out, 1)

            # both produce the same greedy tokens (a correctness check of the benchmark itself)
            same = np.array_equal(np.asarray(jax_dec())[:, PROMPT:], torch_dec().numpy())
            jms, tms = _median_ms(jax_dec, repeats), _median_ms(torch_dec, repeats)
            ntok = b * NEW_TOKENS
            rows.append(dict(name=f"whisper-{size} decoder greedy, KV cache ({NEW_TOKENS} tokens)", batch=b,
                             jasr_ms=jms, torch_ms=tms, jasr_tok_s=ntok / jms * 1e3, torch_tok_s=ntok / tms * 1e3,
                             same_tokens=same))
            print(rows[-1], flush=True)
        del hf, params
    return rows


def bench_wav2vec2(repeats: int = 5) -> list[dict]:
    path = os.path.join(ROOT, "bench", "wav2vec2_bench.py")
    if not os.path.isfile(path):
        # TODO(lead): wire once bench/wav2vec2_bench.py exists: run(sizes=("base",), repeats=5) -> rows
        print("bench/wav2vec2_bench.py not found: Wav2Vec2 row skipped", flush=True)
        return []
    import importlib.util

    spec = importlib.util.spec_from_file_location("wav2vec2_bench", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = mod.run(sizes=("base",), repeats=repeats)
    out = []
    for r in rows:
        out.append(dict(name=f"{r['name']} forward 10 s", batch=r.get("batch", 1), jasr_ms=r["jasr_ms"],
                        torch_ms=r["torch_ms"]))
        print(out[-1], flush=True)
    return out


def to_markdown(rows: list[dict], header: str) -> str:
    lines = [header, "",
             "| model / measure | batch | jasr (ms) | transformers (ms) | jasr tokens/s | torch tokens/s | speed-up |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        tok = (f"{r['jasr_tok_s']:.0f} | {r['torch_tok_s']:.0f}" if "jasr_tok_s" in r else " | ")
        note = "" if r.get("same_tokens", True) else " (tokens differ!)"
        lines.append(f"| {r['name']}{note} | {r['batch']} | {r['jasr_ms']:.1f} | {r['torch_ms']:.1f} | {tok} | "
                     f"{r['torch_ms'] / r['jasr_ms']:.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="tiny,base")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-wav2vec2", action="store_true")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "models.md"))
    args = ap.parse_args(argv)
    if args.repeats < 5:
        raise SystemExit("--repeats must be >= 5")
    import jax
    import torch

    t0 = time.time()
    load0 = os.getloadavg()[0]
    rows = bench_whisper(sizes=tuple(args.sizes.split(",")), repeats=args.repeats)
    if not args.no_wav2vec2:
        rows += bench_wav2vec2(repeats=args.repeats)
    header = (f"# Model speed: jasr (JAX {jax.__version__}, jit) vs transformers (torch {torch.__version__}), CPU\n\n"
              f"Random weights from the real configs; median of {args.repeats} runs after a warm-up; "
              f"{os.cpu_count()} CPU cores, torch threads = {torch.get_num_threads()}. Decoder: greedy, "
              f"{PROMPT}-token prompt + {NEW_TOKENS} new tokens, KV cache, encoder output given. "
              f"Speed-up = transformers time / jasr time. Total bench time {time.time() - t0:.0f} s. "
              f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}. "
              f"Load average at start/end: {load0:.1f} / {os.getloadavg()[0]:.1f} (above the core count the "
              f"figures are inflated, torch's OpenMP threads more than XLA's).")
    md = to_markdown(rows, header)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(md)
    print(md)

    import collect_results  # noqa: E402
    collect_results.refresh_after(args.out)


if __name__ == "__main__":
    main()
