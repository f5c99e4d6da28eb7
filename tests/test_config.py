import json
from pathlib import Path

import pytest

from glm5_fastpath.config import ConfigError, Glm5Config, small_config

SPEC = Path(__file__).resolve().parents[1].parent / "shared" / "spec"  # the project's shared/ beside the checkout


def _shipped(name):
    return Glm5Config.preset(name)


def test_glm5_values_match_spec_section1():
    c = _shipped("glm5")
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads) == (6144, 78, 64)
    assert (c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim) == (2048, 512, 192, 64, 256)
    assert (c.index_n_heads, c.index_head_dim, c.index_topk) == (32, 128, 2048)
    assert (c.n_routed_experts, c.num_experts_per_tok, c.n_shared_experts) == (256, 8, 1)
    assert (c.moe_intermediate_size, c.intermediate_size, c.vocab_size) == (2048, 12288, 154880)
    assert c.first_k_dense_replace == 3 and c.moe_layer_freq == 1
    assert c.rms_norm_eps == 1e-5 and c.rope_theta == 1e6 and c.routed_scaling_factor == 2.5
    assert c.qk_head_dim == 256 and c.qkv_a_out == 2624 and c.kv_cache_dim == 576
    assert c.softmax_scale == 1 / 16 and c.index_k_page_bytes == 8448
    assert c.is_fp8 and c.quant.weight_block_size == (128, 128)
    assert all(c.is_full_indexer_layer(i) for i in range(79))  # GLM-5/5.1: indexer on every layer
    assert [c.is_moe_layer(i) for i in range(5)] == [False, False, False, True, True]


def test_glm52_index_share_schedule():
    c = _shipped("glm5.2")
    full = c.full_indexer_layers
    assert full == [0, 1, 2] + list(range(6, 75, 4))
    assert len(full) == 21 and 78 - len(full) == 57
    assert c.is_full_indexer_layer(78)  # MTP layer
    assert c.rope_theta == 8e6 and c.max_position_embeddings == 1048576


def test_from_file_dir_and_roundtrip(tmp_path):
    c = _shipped("glm5.2")
    (tmp_path / "config.json").write_text(json.dumps(c.to_hf_dict()))
    c2 = Glm5Config.from_file(tmp_path)
    assert c2.replace(source="x") == c.replace(source="x")


def test_defaults_exactly_as_spec_when_absent(tmp_path):
    d = _shipped("glm5").to_hf_dict()
    for k in ("rms_norm_eps", "routed_scaling_factor", "n_group", "topk_group", "norm_topk_prob", "topk_method",
              "scoring_func", "first_k_dense_replace", "moe_layer_freq", "hidden_act", "rope_parameters",
              "rope_interleave", "indexer_rope_interleave", "index_topk_freq", "index_skip_topk_offset",
              "n_shared_experts", "max_position_embeddings", "num_key_value_heads"):
        d.pop(k)
    c = Glm5Config.from_dict(d)
    assert (c.rms_norm_eps, c.routed_scaling_factor, c.n_group, c.topk_group) == (1e-5, 2.5, 1, 1)
    assert (c.first_k_dense_replace, c.moe_layer_freq, c.n_shared_experts, c.rope_theta) == (3, 1, 1, 1e6)
    assert c.norm_topk_prob and c.rope_interleave and c.indexer_rope_interleave
    assert c.index_topk_freq == 1 and c.num_key_value_heads == 64 and c.max_position_embeddings == 202752


def test_legacy_rope_theta_key():
    d = _shipped("glm5").to_hf_dict()
    d.pop("rope_parameters")
    d["rope_theta"] = 5e5
    assert Glm5Config.from_dict(d).rope_theta == 5e5


REQUIRED = ["architectures", "hidden_size", "num_hidden_layers", "num_attention_heads", "q_lora_rank", "kv_lora_rank",
            "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "index_n_heads", "index_head_dim", "index_topk",
            "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "intermediate_size", "vocab_size"]


@pytest.mark.parametrize("field", REQUIRED)
def test_missing_required_field_names_field_and_file(tmp_path, field):
    d = _shipped("glm5").to_hf_dict()
    d.pop(field)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(d))
    with pytest.raises(ConfigError) as e:
        Glm5Config.from_file(p)
    assert f"'{field}'" in str(e.value) and str(p) in str(e.value)


@pytest.mark.parametrize("field,value,needle", [
    ("hidden_size", "6144", "integer"),
    ("hidden_size", 0, ">= 1"),
    ("num_experts_per_tok", 300, "exceeds"),
    ("architectures", ["DeepseekV3ForCausalLM"], "GlmMoeDsaForCausalLM"),
    ("scoring_func", "softmax", "sigmoid"),
    ("n_group", 8, "grouped"),
    ("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e6}, "default"),
    ("quantization_config", {"quant_method": "fp8", "weight_block_size": [64, 64]}, "[128, 128]"),
    ("quantization_config", {"quant_method": "awq"}, "fp8"),
    ("rms_norm_eps", "x", "number"),
    ("norm_topk_prob", 1, "true/false"),
    ("indexer_rope_interleave", False, "interleaved"),
    ("index_topk_freq", 0, ">= 1"),
])
def test_bad_field_names_field(tmp_path, field, value, needle):
    d = _shipped("glm5").to_hf_dict()
    d[field] = value
    p = tmp_path / "config.json"
    p.write_text(json.dumps(d))
    with pytest.raises(ConfigError) as e:
        Glm5Config.from_file(p)
    msg = str(e.value)
    assert field.split(".")[0] in msg and str(p) in msg and needle in msg, msg


def test_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        Glm5Config.from_file(tmp_path / "nope.json")
    p = tmp_path / "config.json"
    p.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        Glm5Config.from_file(p)


def test_spec_config_files_parse():
    for name in ("glm5-fp8", "glm5.2-fp8"):
        try:
            c = Glm5Config.from_file(f"{SPEC}/{name}.config.json")
        except ConfigError as e:
            if "no such config file" in str(e):
                pytest.skip("shared/spec not present beside the checkout")
            raise
        assert c.hidden_size == 6144


def test_small_preset_is_consistent():
    c = small_config()
    assert c.hidden_size % 128 == 0 and c.q_lora_rank % 128 == 0
    assert c.qkv_a_out % 128 != 0  # exercises ragged N blocks on purpose
    assert Glm5Config.preset("small") == c
    with pytest.raises(ConfigError, match="unknown preset"):
        Glm5Config.preset("glm4")
