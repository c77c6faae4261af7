"""Per-device memory and step time of a training step (loss + gradients + AdamW update, jasr.steps.train_step, as
train.py jits it) of a Whisper large-v3-sized and a Wav2Vec2-large-sized model under several meshes.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \\
        python bench/scale.py [--out bench/results/scale.md] [--models whisper,wav2vec2] [--variants ...]
                              [--meshes ...] [--time-variants ...]

Memory: the step is lowered and compiled for the mesh from abstract shapes only (jax.ShapeDtypeStruct with the
shardings jasr.sharding.state_shardings gives the train state under the family's logical axis rules, batches
split over data x fsdp), nothing is allocated; ``compiled.memory_analysis()`` gives the bytes of the partitioned
program of one device: arguments (the state shards and the batch rows of the device), outputs (the new state, in
the old one's buffers: the step donates its state, as train.py does, and XLA reports those bytes as aliased),
temporaries (activations, gradients, optimizer intermediates). The sharded
state per device is summed from the shard shapes. The compiled program is XLA:CPU's; a GPU or TPU compiler fuses and
schedules differently, so temporaries there differ (arguments and outputs do not).

Step time: only a scaled-down model (Whisper: d_model 256, 2 + 2 layers, 8 heads, large-v3's vocabulary and
128 mel bins; Wav2Vec2: hidden 256, 2 layers, 8 heads; float32 + remat by default: without remat the small
Whisper's XLA:CPU temporaries pass 10 GB) with real arrays fits this machine; 8 host "devices" share its CPU cores,
so the times compare meshes on one machine and say nothing about accelerators.

Meshes (8 devices): dp=8, fsdp=8, tp=2 x fsdp=4, tp=8, dp=2 x fsdp=4, pp=2 x dp=4, pp=2 x fsdp=4; each with
float32, bfloat16 compute (train.precision; params and optimizer state stay float32) and bfloat16 + remat
(model.remat: every layer recomputed in the backward pass). Layers are scanned (model.scan_layers), as for any
large model (one compiled layer). Pipeline rows: pp=2 x dp=4 and pp=2 x fsdp=4 (mesh.pipeline = 2: each stage
holds half of every layer stack; microbatches = stages, GPipe as models.layer_stack runs it).
"""
from __future__ import annotations

import os
import sys

if "jax" not in sys.modules:        # 8 host devices unless the caller chose (the flag must precede JAX's start)
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import functools  # noqa: E402
import math  # noqa: E402
import shlex  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from jasr.config import load_config_file  # noqa: E402
from jasr.optim import make_optimizer_from_config  # noqa: E402
from jasr.run_data import dummy_batch, feature_config, raw_audio_batches  # noqa: E402
from jasr.sharding import (DEFAULT_RULES, batch_sharding, logical_specs, make_mesh, mesh_context,  # noqa: E402
                           replicated, state_shardings)
from jasr.steps import create_train_state, train_step  # noqa: E402
from jasr.tasks import build_task  # noqa: E402
from jasr.tokenizers import load_tokenizer  # noqa: E402

MESHES = {"1 device": {"data": 1}, "dp=8": {"data": 8}, "fsdp=8": {"fsdp": 8},
          "tp=2 x fsdp=4": {"tensor": 2, "fsdp": 4}, "tp=8": {"tensor": 8}, "dp=2 x fsdp=4": {"data": 2, "fsdp": 4},
          "pp=2 x dp=4": {"pipeline": 2, "data": 4}, "pp=2 x fsdp=4": {"pipeline": 2, "fsdp": 4}}
VARIANTS = {"fp32": ("float32", False), "bf16": ("bfloat16", False), "bf16+remat": ("bfloat16", True),
            "fp32+remat": ("float32", True)}

# large-v3: 32 + 32 layers, d_model 1280, 20 heads, ffn 5120, 128 mel bins, 51866 tokens (1.55 B parameters)
WHISPER = {"large": dict(vocab_size=51866, num_mel_bins=128, d_model=1280, encoder_layers=32, decoder_layers=32,
                         encoder_attention_heads=20, decoder_attention_heads=20, encoder_ffn_dim=5120,
                         decoder_ffn_dim=5120),
           "small": dict(vocab_size=51866, num_mel_bins=128, d_model=256, encoder_layers=2, decoder_layers=2,
                         encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=1024,
                         decoder_ffn_dim=1024)}
# Wav2Vec2 large (lv60 layout: stable layer norm): 24 layers, hidden 1024, 16 heads, ffn 4096 (315 M with the CTC head)
WAV2VEC2 = {"large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
                          do_stable_layer_norm=True, feat_extract_norm="layer"),
            "small": dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=8, intermediate_size=1024,
                          do_stable_layer_norm=True, feat_extract_norm="layer")}
W2V_VOCAB = 32


def build(model: str, size: str, variant: str, sizes: dict):
    """(task, config, batch shape (rows, frames or samples, label tokens)) of `model` at `size` for the mesh of
    `sizes` (mesh.pipeline > 1: the layer stacks pipelined over that many stages, microbatches = stages)."""
    precision, remat = VARIANTS[variant]
    if model == "whisper":
        cfg = load_config_file(os.path.join(ROOT, "configs", "whisper_finetune.py"))
        fields = WHISPER[size]
        cfg.data.num_mel_bins = fields["num_mel_bins"]
        cfg.data.tokenizer = "whisper:multilingual:100"
    else:
        cfg = load_config_file(os.path.join(ROOT, "configs", "wav2vec2_ctc.py"))
        fields = WAV2VEC2[size]
    cfg.train.init_from = ""
    cfg.train.precision = precision
    cfg.mesh.pipeline = int(sizes.get("pipeline", 1))
    with cfg.model.unlocked():
        for k, v in {**fields, "remat": remat, "scan_layers": True}.items():
            cfg.model[k] = v
    fc = feature_config(cfg)
    if model == "whisper":
        tok = load_tokenizer(cfg.data.tokenizer)
        task = build_task(cfg, tok.vocab_size, fc, tokenizer=tok)
        shape = (16, 3000, 128)                      # 16 windows of 30 s, 128 label tokens
    else:
        task = build_task(cfg, W2V_VOCAB, fc)
        shape = (16, 15 * 16000, 256)                # 16 utterances of 15 s, 256 characters
    if size == "small":
        shape = (8,) + shape[1:]
    return task, cfg, shape


def _bytes(shape, dtype) -> int:
    return int(math.prod(shape)) * np.dtype(dtype).itemsize


def setup(task, cfg, shape, sizes):
    """(jitted train step, abstract sharded state, abstract sharded batch, key, mesh, rules, state shardings, the
    numpy batch, init function)."""
    tx, _ = make_optimizer_from_config(cfg.optim, cfg.train.num_steps, frozen=task.frozen)
    batch = dummy_batch(shape, feature_config(cfg), raw_audio_batches(cfg))
    key = jax.random.PRNGKey(0)
    init = functools.partial(create_train_state, task=task, tx=tx)
    abstract = jax.eval_shape(init, key, batch=batch)
    boxed = jax.eval_shape(task.init_boxed, key, batch)["params"]
    mesh = make_mesh(sizes)
    rules = getattr(task, "logical_axis_rules", DEFAULT_RULES)
    ssh = state_shardings(abstract, logical_specs(boxed), mesh, rules)
    bsh = {k: batch_sharding(mesh, np.ndim(v)) for k, v in batch.items()}
    abs_state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, ssh)
    abs_batch = {k: jax.ShapeDtypeStruct(np.shape(v), v.dtype, sharding=bsh[k]) for k, v in batch.items()}
    step = jax.jit(functools.partial(train_step, task=task, tx=tx), out_shardings=(ssh, replicated(mesh)),
                   donate_argnums=0)     # as train.py: the new state takes the old one's buffers
    return step, abs_state, abs_batch, key, mesh, rules, ssh, batch, init


def memory_row(model: str, variant: str, mesh_name: str) -> dict:
    task, cfg, shape = build(model, "large", variant, MESHES[mesh_name])
    step, abs_state, abs_batch, key, mesh, rules, ssh, _, _ = setup(task, cfg, shape, MESHES[mesh_name])
    state_dev = sum(_bytes(s.shard_shape(x.shape), x.dtype) for x, s in
                    zip(jax.tree.leaves(abs_state), jax.tree.leaves(ssh)))
    params = sum(int(math.prod(x.shape)) for x in jax.tree.leaves(abs_state.params))
    t0 = time.time()
    with mesh_context(mesh, rules):
        compiled = step.lower(abs_state, abs_batch, key).compile()
    ma = compiled.memory_analysis()
    return {"model": model, "variant": variant, "mesh": mesh_name, "params": params, "rows": shape[0],
            "rows_per_device": shape[0] // (mesh.shape["data"] * mesh.shape["fsdp"]),
            "state": state_dev, "args": ma.argument_size_in_bytes, "out": ma.output_size_in_bytes,
            "temp": ma.temp_size_in_bytes, "alias": ma.alias_size_in_bytes, "compile_s": time.time() - t0}


def time_row(model: str, variant: str, mesh_name: str, reps: int = 3) -> dict:
    task, cfg, shape = build(model, "small", variant, MESHES[mesh_name])
    step, _, _, key, mesh, rules, ssh, batch, init = setup(task, cfg, shape, MESHES[mesh_name])
    rng = np.random.default_rng(0)
    for k in ("features", "audio"):
        if k in batch:
            batch[k] = rng.normal(size=batch[k].shape).astype(np.float32)
    if "labels" in batch:
        hi = W2V_VOCAB if model == "wav2vec2" else 50000
        batch["labels"] = rng.integers(1, hi, size=batch["labels"].shape).astype(np.int32)
    with mesh_context(mesh, rules):
        state = jax.jit(init, out_shardings=ssh)(key, batch=batch)
        dev_batch = {k: jax.device_put(v, batch_sharding(mesh, np.ndim(v))) for k, v in batch.items()}
        t0 = time.time()
        state, m = step(state, dev_batch, key)
        jax.block_until_ready(m)
        first = time.time() - t0
        times = []
        for _ in range(reps):
            t0 = time.time()
            state, m = step(state, dev_batch, key)
            jax.block_until_ready(m)
            times.append(time.time() - t0)
    return {"model": model, "variant": variant, "mesh": mesh_name, "first_s": first,
            "median_s": float(np.median(times)), "max_s": float(np.max(times)), "loss": float(m["loss"]),
            "rows": shape[0]}


def gib(n: float) -> str:
    return f"{n / 2 ** 30:.2f}"


def _machine() -> str:
    date = subprocess.run(["date", "-u"], capture_output=True, text=True).stdout.strip()
    up = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    return f"{date}; `uptime`: {up}; {os.cpu_count()} CPU cores; jax {jax.__version__}, {jax.device_count()} " \
           f"{jax.devices()[0].platform} devices"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "scale.md"))
    p.add_argument("--models", default="whisper,wav2vec2")
    p.add_argument("--variants", default="fp32,bf16+remat,bf16", help="memory rows: precision / remat variants")
    p.add_argument("--meshes", default=",".join(m for m in MESHES if m != "1 device"))
    p.add_argument("--time-variants", default="fp32+remat", help="step-time rows ('' for none; without remat the "
                   "small Whisper's XLA:CPU temporaries exceed 10 GB)")
    a = p.parse_args(argv)
    if jax.device_count() < 8:
        sys.exit(f"bench/scale.py needs 8 devices, got {jax.device_count()} (set XLA_FLAGS="
                 f"--xla_force_host_platform_device_count=8 before JAX starts)")
    models, meshes = a.models.split(","), a.meshes.split(",")
    variants = [v for v in a.variants.split(",") if v]
    cmd = "XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu python bench/scale.py " + \
        shlex.join(sys.argv[1:] if argv is None else argv)
    mem, times = [], []
    for model in models:
        for variant in variants:
            for mesh_name in meshes:
                r = memory_row(model, variant, mesh_name)
                print(f"[memory] {model} {variant} {mesh_name}: state {gib(r['state'])} GiB, args {gib(r['args'])}, "
                      f"out {gib(r['out'])} (aliased {gib(r['alias'])}), temp {gib(r['temp'])} "
                      f"(compiled in {r['compile_s']:.0f} s)", flush=True)
                mem.append(r)
                write(a.out, mem, times, cmd.strip())        # every row as it comes
    for model in models:
        for variant in [v for v in a.time_variants.split(",") if v]:
            for mesh_name in meshes:
                r = time_row(model, variant, mesh_name)
                print(f"[time] {model} {variant} {mesh_name}: {r['median_s'] * 1e3:.0f} ms (first "
                      f"{r['first_s']:.1f} s), loss {r['loss']:.3f}", flush=True)
                times.append(r)
                write(a.out, mem, times, cmd.strip())


def write(path: str, mem: list, times: list, cmd: str) -> None:
    lines = ["# Scale: per-device memory and step time under meshes (bench/scale.py)", "",
             f"{_machine()}. Command: `{cmd}`.", "",
             "Memory from `jax.jit(train_step).lower(abstract sharded state, batch).compile().memory_analysis()` "
             "(XLA:CPU's partitioned program of one device; nothing allocated): **args** = the device's state "
             "shards + its batch rows, **out** = the new state, **aliased** = the output bytes held in donated "
             "argument buffers (the step donates the old state, as train.py does), **temp** = activations, "
             "gradients and optimizer temporaries, **total** = args + out - aliased + temp. **state** = the train "
             "state's shards on one device (params + AdamW moments + counters). "
             "GiB = 2^30 bytes. Layers scanned; bf16 = compute dtype (params and optimizer state float32); remat = "
             "each layer recomputed in the backward pass.", ""]
    for model in dict.fromkeys(r["model"] for r in mem):
        rows = [r for r in mem if r["model"] == model]
        r0 = rows[0]
        what = ("Whisper large-v3-sized (d_model 1280, 32 + 32 layers, 20 heads, ffn 5120, 128 mels, vocab 51866); "
                f"batch {r0['rows']} windows of 30 s, 128 label tokens") if model == "whisper" else \
            ("Wav2Vec2-large-sized CTC (hidden 1024, 24 layers, 16 heads, ffn 4096, stable layer norm, vocab "
             f"{W2V_VOCAB}); batch {r0['rows']} utterances of 15 s, 256 label tokens")
        lines += [f"## {model}: {what}; {r0['params'] / 1e6:.0f} M parameters", "",
                  "| variant | mesh | rows/device | state GiB | args GiB | out GiB | aliased GiB | temp GiB | "
                  "total GiB |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['variant']} | {r['mesh']} | {r['rows_per_device']} | {gib(r['state'])} | "
                         f"{gib(r['args'])} | {gib(r['out'])} | {gib(r['alias'])} | {gib(r['temp'])} | "
                         f"{gib(r['args'] + r['out'] - r['alias'] + r['temp'])} |")
        lines.append("")
    if times:
        lines += ["## Step time (scaled-down models; 8 host CPU devices sharing the machine's cores)", "",
                  "Whisper: d_model 256, 2 + 2 layers, 8 heads, vocab 51866, 128 mels, 8 windows of 30 s. Wav2Vec2: "
                  "hidden 256, 2 layers, 8 heads, 8 utterances of 15 s. Median of 3 steps after the first "
                  "(compilation); the slowest of the 3 beside it. These compare meshes on one CPU: collectives are "
                  "memory copies here, so they say nothing about accelerators.", "",
                  "| model | variant | mesh | median ms | slowest ms | first step s | loss |",
                  "|---|---|---|---|---|---|---|"]
        for r in times:
            lines.append(f"| {r['model']} | {r['variant']} | {r['mesh']} | {r['median_s'] * 1e3:.0f} | "
                         f"{r['max_s'] * 1e3:.0f} | {r['first_s']:.1f} | {r['loss']:.4f} |")
        lines.append("")
    with open(path, "w") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    main()
