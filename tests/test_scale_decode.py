"""Tensor-parallel decoding (decode.py --mesh-tensor / --mesh-fsdp, jasr.transcribe.decode_mesh): a tiny random
Wav2Vec2-CTC and a tiny random Whisper (Hugging Face directories written by transformers, loaded as decode.py
--hf-model loads them) decode six FSDD digits on 8 host CPU devices with the parameters sharded over tensor = 2 (data
4) and tensor = 8 (and, for Wav2Vec2, fsdp 2 x tensor 2, data 2): the transcripts, tokens, scores (CTC greedy)
and WER of one device, with fewer parameter bytes per device. Whisper decodes long-form greedily at one temperature
(a random model would fail every fallback test and sample at all six).

The 8 devices exist only in a fresh interpreter started with ``XLA_FLAGS=--xla_force_host_platform_device_count=8``,
so the checks run in one subprocess.
"""
import textwrap
from host_devices import assert_printed_ok, run_with_host_devices


CHECKS = textwrap.dedent('''
    import dataclasses, json, os, tempfile, time
    import jax
    import numpy as np
    import torch
    import transformers
    from jasr import transcribe as tr
    from jasr.errors import ConfigError
    from jasr.hf_runs import load_hf_model
    from models.whisper_longform import LongFormOptions
    assert jax.device_count() == 8

    tmp = tempfile.mkdtemp()
    fsdd = os.path.join("..", "shared", "data", "fsdd")
    with open(os.path.join(fsdd, "manifest.jsonl")) as f:
        recs = [json.loads(line) for line in f]
    rows = [{**r, "audio": os.path.abspath(os.path.join(fsdd, r["audio"]))} for r in recs
            if r["id"] in ("0_george_0", "1_george_1", "2_theo_2", "3_yweweler_3", "4_george_4", "5_theo_5")]
    manifest = os.path.join(tmp, "six.jsonl")
    with open(manifest, "w") as f:
        f.write("".join(json.dumps(r) + chr(10) for r in rows))

    torch.manual_seed(0)
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, "|": 4, **{c: 5 + i for i, c in enumerate("EROTWNIHSFV")}}
    w2v = os.path.join(tmp, "w2v")
    transformers.Wav2Vec2ForCTC(transformers.Wav2Vec2Config(
        vocab_size=len(vocab), pad_token_id=0, hidden_size=64, num_hidden_layers=1, num_attention_heads=8,
        intermediate_size=128, conv_dim=(16, 16, 16, 16), conv_stride=(5, 4, 4, 4), conv_kernel=(10, 4, 4, 4),
        num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=4, do_stable_layer_norm=False, mask_time_prob=0.0,
        layerdrop=0.0)).eval().save_pretrained(w2v)
    with open(os.path.join(w2v, "vocab.json"), "w") as f:
        json.dump(vocab, f)
    whisper = os.path.join(tmp, "whisper")    # large-v3's vocabulary (51866 = 2 x 25933) and 128 mel bins
    transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(
        vocab_size=51866, num_mel_bins=128, d_model=32, encoder_layers=1, encoder_attention_heads=8,
        encoder_ffn_dim=64, decoder_layers=1, decoder_attention_heads=8, decoder_ffn_dim=64, max_source_positions=1500,
        max_target_positions=16, pad_token_id=50257, bos_token_id=50257, eos_token_id=50257,
        decoder_start_token_id=50258)).eval().save_pretrained(whisper)

    def decode(run, utts, method, tensor, fsdp=1, data=-1):
        run.config.mesh.data = data
        settings = tr.settings_from_config(run.config, {"method": method, "beam": 3, "mesh_tensor": tensor,
                                                        "mesh_fsdp": fsdp}, root=".")
        return tr.transcribe(run, utts, settings, progress=False)

    for directory, method, meshes in ((w2v, "greedy", ((2, 1), (8, 1), (2, 2))), (whisper, "greedy", ((2, 1), (8, 1)))):
        run = dataclasses.replace(load_hf_model(directory, "."), bucket_edges=[1.0])   # one batch shape
        if run.config.model.name == "whisper":     # one temperature: no sampled fallbacks (a random model fails them)
            run = dataclasses.replace(run, task=dataclasses.replace(run.task, longform=LongFormOptions(
                temperatures=(0.0,), prompt_bucket=16)))
        _, utts, bad = tr.collect_utterances(run.config, ".", manifest=manifest)
        assert len(utts) == 6 and not bad
        if True:
            t0 = time.time()
            m1, one = decode(run, utts, method, 1, data=1)
            print("one device", round(time.time() - t0, 1), "s")
            assert m1["mesh"] == {} and len(one) == 6 and not m1["failed"], m1
            assert any(r["hyp"] for r in one), (directory, method, [r["hyp"] for r in one])
            for tensor, fsdp in meshes:
                t0 = time.time()
                m, got = decode(run, utts, method, tensor, fsdp)
                print(tensor, fsdp, round(time.time() - t0, 1), "s")
                assert m["mesh"] == {"pipeline": 1, "data": 8 // (tensor * fsdp), "fsdp": fsdp, "tensor": tensor}, m
                where = (run.config.model.name, method, tensor, fsdp)
                assert [r["hyp"] for r in got] == [r["hyp"] for r in one], where
                assert [r["tokens"] for r in got] == [r["tokens"] for r in one], where
                assert m["wer"] == m1["wer"] and m["cer"] == m1["cer"], where
                if "score" in one[0]:
                    np.testing.assert_allclose([r["score"] for r in got], [r["score"] for r in one], rtol=1e-5,
                                               atol=1e-4, err_msg=str(where))
                # the parameters are split: fewer bytes on each device than the whole model on one (Whisper's
                # vocabulary of 51866 does not divide by 8: under tensor = 8 its embedding stays whole)
                shrink = 0.99 if (run.config.model.name, tensor) == ("whisper", 8) else 0.75
                assert m["param_mib_per_device"] < shrink * m1["param_mib_per_device"], (where, m, m1)
                print(where, "MiB per device", round(m1["param_mib_per_device"], 3), "->",
                      round(m["param_mib_per_device"], 3))
    try:
        decode(run, utts, "greedy", 3)
        raise AssertionError("tensor = 3 over 8 devices must fail")
    except ConfigError as e:
        assert "8 local devices do not divide by 3" in str(e), e

    # Whisper's whole-file windows are data parallel under the decode mesh: the encoder's logical constraints put
    # the rows of a window batch on the data axis (one row per device here), not all on the first device
    from jasr.sharding import DEFAULT_RULES, make_mesh, mesh_context
    from models.whisper_decode import encode
    model, params = run.task.model, run.state.params
    windows = np.zeros((8, model.config.num_mel_bins, 2 * model.config.max_source_positions), np.float32)
    with mesh_context(make_mesh({"data": 8}), DEFAULT_RULES):
        enc = jax.jit(lambda p, x: encode(model, p, x))(params, windows)
    assert enc.sharding.spec[0] == "data" and {s.data.shape[0] for s in enc.addressable_shards} == {1}, enc.sharding
    print("OK")
''')


def test_tensor_parallel_decode_equals_one_device():
    assert_printed_ok(run_with_host_devices(CHECKS))
