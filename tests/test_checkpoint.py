"""make-checkpoint and the loader: layout, dtypes, determinism, bitwise agreement with the in-memory
generator, the tokenizer, atomic publication and the loader's error messages (CPU, small dims; one
@slow full-dims layer)."""
import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from glm5_fastpath import checkpoint as ck
from glm5_fastpath.config import Glm5Config
from glm5_fastpath.testing.numerics import assert_equal
from glm5_fastpath.tokenizer import SPECIAL_TOKENS, build_tokenizer
from glm5_fastpath.weights import ExpertStore, generate_tensor, layer_tensor_specs, model_tensor_specs, random_layer

PRESETS = ["glm5", "glm5.2"]
LAYERS = 4
FP8 = torch.float8_e4m3fn


def _make(tmp_path: Path, preset: str, seed: int, name: str = "ckpt", layers: int = LAYERS, **kw) -> Path:
    return ck.make_checkpoint(tmp_path / name, layers=layers, preset=preset, seed=seed, small=True, **kw)


def _model_files(tmp_path: Path) -> Path:
    """config + tokenizer files only (what the tokenizer tests need; no weights)."""
    ck.write_model_files(tmp_path, ck.checkpoint_config("glm5", layers=LAYERS, small=True))
    return tmp_path


def _expected(cfg: Glm5Config) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """Checkpoint dtypes per spec/glm5_layer.md section 1, written out independently of checkpoint.stored_tensors."""
    specs = [s for i in range(cfg.num_hidden_layers) for s in layer_tensor_specs(cfg, i)] + model_tensor_specs(cfg)
    out = {}
    for s in specs:
        if s.kind == "fp8":
            n, k = s.shape
            out[s.name] = (FP8, s.shape)
            out[s.name + "_scale_inv"] = (torch.float32, ((n + 127) // 128, (k + 127) // 128))
        elif s.kind == "bias":
            out[s.name] = (torch.float32, s.shape)
        else:
            out[s.name] = (torch.bfloat16, s.shape)
    return out


def _headers(ckpt: Path) -> dict[str, tuple[torch.dtype, tuple[int, ...], str]]:
    """name -> (dtype, shape, file) read from every shard on disk (not through the index)."""
    dtypes = {"F8_E4M3": FP8, "BF16": torch.bfloat16, "F32": torch.float32}
    out = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            for name in h.keys():
                sl = h.get_slice(name)
                assert name not in out, f"{name} stored twice ({out[name][2]} and {f.name})"
                out[name] = (dtypes[sl.get_dtype()], tuple(sl.get_shape()), f.name)
    return out


def _assert_same_weights(where: str, a, b, experts: list[int]) -> None:
    """Walk two LayerWeights (dataclasses of tensors) and compare every tensor bitwise."""
    if isinstance(a, torch.Tensor):
        assert_equal(where, a, b)
    elif isinstance(a, ExpertStore):
        assert len(a) == len(b), f"{where}: {len(a)} vs {len(b)} experts"
        for e in experts:
            _assert_same_weights(f"{where}[{e}]", a.get(e), b.get(e), experts)
    elif isinstance(a, tuple):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same_weights(f"{where}[{i}]", x, y, experts)
    elif dataclasses.is_dataclass(a):
        assert type(a) is type(b), f"{where}: {type(a).__name__} vs {type(b).__name__}"
        for f in dataclasses.fields(a):
            _assert_same_weights(f"{where}.{f.name}", getattr(a, f.name), getattr(b, f.name), experts)
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


# ---- config.json --------------------------------------------------------------------------------

@pytest.mark.parametrize("preset", PRESETS)
def test_config_json_parses_back_with_sglang_keys(tmp_path, seed, preset):
    p = _make(tmp_path, preset, seed)
    cfg = Glm5Config.from_file(p)
    raw = json.loads((p / "config.json").read_text())
    assert cfg.num_hidden_layers == LAYERS and raw["num_nextn_predict_layers"] == 0
    assert raw["architectures"] == ["GlmMoeDsaForCausalLM"] and raw["model_type"] == "glm_moe_dsa"
    for key, want in [("topk_method", "noaux_tc"), ("scoring_func", "sigmoid"), ("moe_layer_freq", 1),
                      ("indexer_rope_interleave", True), ("rope_interleave", True)]:
        assert raw[key] == want, f"config.json {key}={raw.get(key)!r}, want {want!r}"
    assert raw["first_k_dense_replace"] == cfg.first_k_dense_replace == 1  # small dims: layer 0 dense, 1-3 MoE
    preset_cfg = Glm5Config.preset(preset)
    assert cfg.rope_theta == preset_cfg.rope_theta
    qc = raw["quantization_config"]
    assert (qc["quant_method"], qc["fmt"], qc["activation_scheme"], qc["weight_block_size"]) == ("fp8", "e4m3", "dynamic", [128, 128])
    full = cfg.full_indexer_layers
    assert set(qc["modules_to_not_convert"]) == {"model.embed_tokens", "lm_head"} | {
        f"model.layers.{i}.self_attn.indexer.weights_proj" for i in full}
    if preset == "glm5.2":
        assert (raw["index_topk_freq"], raw["index_skip_topk_offset"]) == (4, 3)
        assert full == [0, 1, 2]
    else:
        assert "index_topk_freq" not in raw and full == list(range(LAYERS))
    tok = build_tokenizer()
    gen = json.loads((p / "generation_config.json").read_text())
    assert raw["bos_token_id"] == gen["bos_token_id"] == tok.vocab[SPECIAL_TOKENS[0]] == 0
    assert raw["eos_token_id"] == tok.vocab["<|endoftext|>"] == 1 and gen["eos_token_id"] == [1]


@pytest.mark.parametrize("preset", PRESETS)
def test_full_dims_config_matches_shipped_preset(preset):
    shipped = json.loads((Path(ck.__file__).parent / "configs" / f"{preset}.json").read_text())
    cfg = ck.checkpoint_config(preset, layers=78)
    ours = ck.hf_config_dict(cfg)
    for key, want in shipped.items():
        if key == "num_nextn_predict_layers":
            assert ours[key] == 0
        elif key == "quantization_config":
            for k, v in want.items():
                got = ours[key][k]
                assert set(v) <= set(got) if k == "modules_to_not_convert" else got == v, (k, got, v)
        else:
            assert ours[key] == want, f"{key}: {ours.get(key)!r} vs shipped {want!r}"
    assert len(ours["quantization_config"]["modules_to_not_convert"]) == 2 + len(cfg.full_indexer_layers)


# ---- tensors -----------------------------------------------------------------------------------

@pytest.mark.parametrize("preset", PRESETS)
def test_every_tensor_present_with_checkpoint_dtype_and_no_extra(tmp_path, seed, preset):
    p = _make(tmp_path, preset, seed)
    cfg = ck.load_config(p)
    want, got = _expected(cfg), _headers(p)
    assert set(got) == set(want), f"missing {sorted(set(want) - set(got))[:5]}, extra {sorted(set(got) - set(want))[:5]}"
    for name, (dtype, shape) in want.items():
        assert got[name][:2] == (dtype, shape), f"{name}: stored {got[name][:2]}, want {(dtype, shape)}"
    L = "model.layers.1."  # an MoE layer with a full indexer in both presets
    assert got[L + "self_attn.indexer.weights_proj.weight"][0] == torch.bfloat16
    assert got[L + "self_attn.indexer.wk.weight"][0] == FP8 and got[L + "self_attn.indexer.wq_b.weight"][0] == FP8
    assert got[L + "mlp.gate.weight"][0] == torch.bfloat16 and got[L + "input_layernorm.weight"][0] == torch.bfloat16
    assert got[L + "mlp.gate.e_score_correction_bias"][0] == torch.float32
    assert got[L + "mlp.experts.0.down_proj.weight_scale_inv"][:2] == (torch.float32, (cfg.hidden_size // 128, cfg.moe_intermediate_size // 128))
    assert ck.verify_checkpoint(p) == len(want)


def test_glm52_shared_layers_have_no_indexer(tmp_path, seed):
    p = _make(tmp_path, "glm5.2", seed)
    names = set(_headers(p))
    for layer in range(LAYERS):
        has = any(n.startswith(f"model.layers.{layer}.self_attn.indexer.") for n in names)
        assert has == (layer in (0, 1, 2)), f"layer {layer}: indexer tensors present={has}"
    assert ck.load_layer(p, 3).attn.indexer is None


@pytest.mark.parametrize("max_shard_bytes", [ck.DEFAULT_MAX_SHARD_BYTES, 400_000])
def test_index_covers_every_tensor(tmp_path, seed, max_shard_bytes):
    p = _make(tmp_path, "glm5", seed, max_shard_bytes=max_shard_bytes)
    index = json.loads((p / ck.INDEX_FILE).read_text())
    got = _headers(p)
    assert index["weight_map"] == {n: f for n, (_, _, f) in got.items()}
    files = sorted(p.glob("*.safetensors"))
    assert [f.name for f in files] == [f"model-{i:05d}-of-{len(files):05d}.safetensors" for i in range(1, len(files) + 1)]
    data = sum(t.numel() * t.element_size() for f in files for t in load_file(str(f)).values())
    assert index["metadata"]["total_size"] == data
    if max_shard_bytes < ck.DEFAULT_MAX_SHARD_BYTES:
        assert len(files) > LAYERS, "a small max_shard_bytes should split layers over shards"
        for f in files:  # over the bound only when a single tensor (with its scale) is larger than it
            weights = [n for n, (_, _, g) in got.items() if g == f.name and not n.endswith("_scale_inv")]
            assert f.stat().st_size <= max_shard_bytes + 64 * 1024 or len(weights) == 1, (f.name, f.stat().st_size)
    else:
        assert len(files) == 1


def test_deterministic_per_seed(tmp_path, seed):
    # 2 layers: a dense and an MoE one
    a, b = _make(tmp_path, "glm5.2", seed, "a", layers=2), _make(tmp_path, "glm5.2", seed, "b", layers=2)
    c = _make(tmp_path, "glm5.2", seed + 1, "c", layers=2)
    names = sorted(f.name for f in a.iterdir())
    assert names == sorted(f.name for f in b.iterdir()) == sorted(f.name for f in c.iterdir())
    for n in names:
        assert (a / n).read_bytes() == (b / n).read_bytes(), f"{n} differs between two runs with seed {seed}"
    shard = next(a.glob("*.safetensors")).name
    assert (a / shard).read_bytes() != (c / shard).read_bytes(), "seeds {seed} and {seed+1} wrote the same weights"
    assert (a / "config.json").read_bytes() == (c / "config.json").read_bytes()


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("max_shard_bytes", [ck.DEFAULT_MAX_SHARD_BYTES, 300_000])
def test_load_layer_equals_random_layer_bitwise(tmp_path, seed, preset, max_shard_bytes):
    p = _make(tmp_path, preset, seed, max_shard_bytes=max_shard_bytes)
    cfg = ck.load_config(p)
    E = cfg.n_routed_experts
    with ck.checkpoint_source(p) as src:
        for layer in range(LAYERS):
            loaded, generated = ck.load_layer(src, layer), random_layer(cfg, layer, seed)
            # experts: first, a middle one, the last routed one and the fused shared expert (index E)
            _assert_same_weights(f"layer{layer}", loaded, generated, experts=[0, E // 2 + 1, E - 1, E])
        head = model_tensor_specs(cfg)
        for s in head:
            assert_equal(s.name, src(s.name), generate_tensor(s, seed)[s.name])


# ---- tokenizer ---------------------------------------------------------------------------------

TEXTS = ["The quick brown fox jumps over the lazy dog.", "", " leading and  double  spaces\n\ttab\r\n",
         "naïve café, 日本語, Ελληνικά, emoji 😀🚀", "code: def f(x): return x**2  # <tag> {a: [1, 2]}",
         "".join(chr(i) for i in range(1, 128))]


def test_tokenizer_files_consistent_with_config(tmp_path):
    p = _model_files(tmp_path)
    cfg = ck.load_config(p)
    tj = json.loads((p / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    ids = sorted(vocab.values())
    assert ids == list(range(len(ids))) and len(ids) < cfg.vocab_size
    assert sum(len(t) == 1 for t in vocab) >= 256  # every byte has a token
    for a_b in tj["model"]["merges"]:
        a, b = a_b.split(" ")
        assert a in vocab and b in vocab and a + b in vocab, a_b
    assert {t["content"]: t["id"] for t in tj["added_tokens"]} == {t: vocab[t] for t in SPECIAL_TOKENS}
    tc = json.loads((p / "tokenizer_config.json").read_text())
    raw = json.loads((p / "config.json").read_text())
    assert vocab[tc["bos_token"]] == raw["bos_token_id"] and vocab[tc["eos_token"]] == raw["eos_token_id"]
    assert json.loads((p / "special_tokens_map.json").read_text())["eos_token"] == tc["eos_token"]


def test_tokenizer_round_trip_with_tokenizers(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    p = _model_files(tmp_path)
    tok = tokenizers.Tokenizer.from_file(str(p / "tokenizer.json"))
    for text in TEXTS:
        ids = tok.encode(text).ids
        assert tok.decode(ids, skip_special_tokens=False) == text, repr(text)
    assert len(tok.encode("the quick brown fox").ids) < len("the quick brown fox"), "merges should apply"
    assert tok.encode("<|endoftext|>").ids == [1] and tok.token_to_id("<|startoftext|>") == 0


def test_tokenizer_loads_in_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    p = _model_files(tmp_path)
    for tok in (transformers.PreTrainedTokenizerFast(tokenizer_file=str(p / "tokenizer.json")),
                transformers.AutoTokenizer.from_pretrained(str(p))):
        for text in TEXTS:
            assert tok.decode(tok.encode(text, add_special_tokens=False)) == text, repr(text)
    assert (tok.bos_token_id, tok.eos_token_id) == (0, 1)


# ---- atomic publication ------------------------------------------------------------------------

def test_failed_write_leaves_no_checkpoint(tmp_path, seed):
    out = tmp_path / "ckpt"
    seen = []

    def boom(progress):
        assert not out.exists(), "out_dir appeared before the checkpoint was complete"
        seen.append(progress)
        if len(seen) == 5:
            raise RuntimeError("simulated failure")

    with pytest.raises(RuntimeError, match="simulated failure"):
        _make(tmp_path, "glm5", seed, progress=boom)
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [], "the partial directory was not cleaned up"
    assert len(seen) == 5 and str(seen[0])


def test_refuses_non_empty_out_dir_unless_overwrite(tmp_path, seed):
    out = tmp_path / "ckpt"
    out.mkdir()
    assert _make(tmp_path, "glm5", seed, layers=1) == out  # an empty directory is fine
    (out / "precious.txt").write_text("x")
    with pytest.raises(FileExistsError, match="not empty"):
        _make(tmp_path, "glm5", seed, layers=1)
    assert (out / "precious.txt").exists()
    _make(tmp_path, "glm5.2", seed, layers=1, overwrite=True)
    assert not (out / "precious.txt").exists() and ck.load_config(out).index_topk_freq == 4
    assert sorted(x.name for x in tmp_path.iterdir()) == ["ckpt"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError, match="not a directory"):
        _make(tmp_path, "glm5", seed, name="file", layers=1, overwrite=True)


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="preset"):
        ck.make_checkpoint(tmp_path / "x", layers=1, preset="glm4", small=True)
    with pytest.raises(ValueError, match="layers"):
        ck.make_checkpoint(tmp_path / "x", layers=0, small=True)
    assert not (tmp_path / "x").exists()


# ---- loader errors -----------------------------------------------------------------------------

def test_loader_missing_files(tmp_path, seed):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ck.load_layer(tmp_path / "nope", 0)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="model.safetensors.index.json"):
        ck.checkpoint_source(tmp_path / "empty")
    p = _make(tmp_path, "glm5", seed, layers=2, max_shard_bytes=300_000)
    index = json.loads((p / ck.INDEX_FILE).read_text())
    shard = index["weight_map"]["model.layers.1.self_attn.o_proj.weight"]
    (p / shard).unlink()
    with pytest.raises(FileNotFoundError, match=f"{shard}.*missing"):
        ck.load_layer(p, 1)
    with pytest.raises(ValueError, match="out of range"):
        ck.load_layer(p, 2)


def test_loader_tensor_missing_from_index(tmp_path, seed):
    p = _make(tmp_path, "glm5", seed, layers=2)
    index = json.loads((p / ck.INDEX_FILE).read_text())
    gone = "model.layers.1.self_attn.kv_b_proj.weight_scale_inv"
    del index["weight_map"][gone]
    (p / ck.INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(ck.MissingTensorError, match=gone.replace(".", r"\.")):
        ck.load_layer(p, 1)
    ck.load_layer(p, 0)  # other layers still load
    with pytest.raises(KeyError):  # MissingTensorError is a KeyError too
        ck.checkpoint_source(p)("model.layers.0.no_such.weight")


def test_loader_shape_mismatch_names_tensor(tmp_path, seed):
    p = _make(tmp_path, "glm5", seed, layers=1)
    raw = json.loads((p / "config.json").read_text())
    raw["kv_lora_rank"] = 256  # the checkpoint was written with 128
    (p / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ck.TensorMismatchError,
                       match=r"model\.layers\.0\.self_attn\.kv_a_proj_with_mqa\.weight: expected float8_e4m3fn\[288, 512\], got float8_e4m3fn\[160, 512\]"):
        ck.load_layer(p, 0)


def test_loader_dtype_mismatch_names_tensor(tmp_path, seed):
    p = _make(tmp_path, "glm5", seed, layers=2)
    shard = p / "model-00001-of-00001.safetensors"
    tensors = load_file(str(shard))
    name = "model.layers.1.mlp.gate.e_score_correction_bias"
    tensors[name] = tensors[name].to(torch.bfloat16)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    with pytest.raises(ck.TensorMismatchError, match=rf"{name.replace('.', chr(92) + '.')}: expected float32\[16\], got bfloat16\[16\]"):
        ck.load_layer(p, 1)
    with pytest.raises(ck.TensorMismatchError):
        ck.verify_checkpoint(p)


# ---- full dims ---------------------------------------------------------------------------------

@pytest.mark.slow
def test_full_dims_dense_layer_write_and_load(tmp_path):
    """Layer 0 of full-size GLM-5 (dense, 0.40 GB): the attention + dense tensors only (no 3.8 GB embed/lm_head)."""
    cfg = ck.checkpoint_config("glm5", layers=1)
    assert cfg.hidden_size == 6144 and not cfg.is_moe_layer(0)
    ck.write_model_files(tmp_path, cfg)
    specs = layer_tensor_specs(cfg, 0)
    ck.write_weights(tmp_path, specs, seed=7)
    lw = ck.load_layer(tmp_path, 0)
    by_name = {s.name: s for s in specs}
    p = "model.layers.0."
    q_a = generate_tensor(by_name[p + "self_attn.q_a_proj.weight"], 7)
    kv_a = generate_tensor(by_name[p + "self_attn.kv_a_proj_with_mqa.weight"], 7)
    assert lw.attn.qkv_a.shape == (2624, 6144) and tuple(lw.attn.qkv_a.scale_inv.shape) == (21, 48)
    assert_equal("qkv_a", lw.attn.qkv_a.weight, torch.cat([q_a[p + "self_attn.q_a_proj.weight"],
                                                           kv_a[p + "self_attn.kv_a_proj_with_mqa.weight"]]))
    down = generate_tensor(by_name[p + "mlp.down_proj.weight"], 7)
    assert_equal("down", lw.mlp.down.weight, down[p + "mlp.down_proj.weight"])
    assert_equal("down scale", lw.mlp.down.scale_inv, down[p + "mlp.down_proj.weight_scale_inv"])
    assert tuple(lw.attn.o_proj.scale_inv.shape) == (48, 128) and lw.attn.w_kc.shape == (64, 192, 512)
    assert lw.attn.indexer.weights_proj.shape == (32, 6144) and lw.attn.indexer.weights_proj.dtype == torch.bfloat16
