"""bench/layer_dump on CPU: the hooks record the first decode step of batch 1 per layer (attention out, MLP in /
out, router choice, layer outputs) and skip prefill / other batch sizes; the diff finds a layer whose MoE output
jumps without a router flip, and reports router overlap where the inputs differ enough to flip a choice."""
from __future__ import annotations

import types

import torch

from glm5_fastpath.bench import layer_dump as LD

H, E, K = 64, 16, 4


class Attn(torch.nn.Module):
    def __init__(self, w):
        super().__init__()
        self.w = w

    def forward(self, x):
        return x @ self.w


class Gate(torch.nn.Module):
    def __init__(self, g):
        super().__init__()
        self.weight = torch.nn.Parameter(g.to(torch.bfloat16), requires_grad=False)
        self.e_score_correction_bias = torch.nn.Parameter(torch.zeros(E), requires_grad=False)


class MoE(torch.nn.Module):
    def __init__(self, w, g, scale=1.0):
        super().__init__()
        self.w, self.scale, self.top_k = w, scale, K
        self.gate = Gate(g)

    def forward(self, hidden_states, forward_batch=None):
        return torch.tanh(hidden_states @ self.w) * self.scale


class Layer(torch.nn.Module):
    def __init__(self, attn, mlp):
        super().__init__()
        self.self_attn, self.mlp = attn, mlp

    def forward(self, positions, hidden_states, forward_batch, residual, zero_allocator=None):
        residual = hidden_states if residual is None else residual + hidden_states
        h = self.self_attn(residual)
        residual = residual + h
        return self.mlp(residual, forward_batch), residual


def _model(seed, moe_scale=None):
    g = torch.Generator().manual_seed(seed)
    layers = []
    for i in range(4):
        a = torch.randn(H, H, generator=g) / H ** 0.5
        w = torch.randn(H, H, generator=g) / H ** 0.5
        gw = torch.randn(E, H, generator=g) * 0.3
        layers.append(Layer(Attn(a), MoE(w, gw, (moe_scale or {}).get(i, 1.0))))
    m = torch.nn.Module()
    m.model = torch.nn.Module()
    m.model.layers = torch.nn.ModuleList(layers)
    return m


def _fb(decode):
    return types.SimpleNamespace(forward_mode=types.SimpleNamespace(is_decode=lambda: decode))


def _run(m, x, decode=True):
    h, r = x, None
    for layer in m.model.layers:
        h, r = layer(None, h, _fb(decode), r)
    return h


def test_records_first_decode_step_of_batch_one_only(tmp_path, monkeypatch):
    monkeypatch.setenv("GLM5_FASTPATH", "1")
    m = _model(0)
    dump = LD.install(m, tmp_path, steps=1)
    x = torch.randn(1, H, generator=torch.Generator().manual_seed(1))
    _run(m, torch.randn(5, H), decode=False)  # prefill: ignored
    _run(m, torch.randn(3, H), decode=True)   # batch 3: ignored
    assert not dump.written
    _run(m, x)
    assert dump.written and (tmp_path / "fastpath.pt").exists()
    data = torch.load(tmp_path / "fastpath.pt", weights_only=False)
    rec = data["steps"][0]
    assert data["mode"] == "fastpath" and sorted(rec) == [0, 1, 2, 3]
    assert set(rec[2]) == {"attn_out", "mlp_in", "mlp_out", "hidden_out", "residual_out", "router"}
    assert len(rec[2]["router"]["ids"]) == K and rec[2]["router"]["margin"] >= 0
    _run(m, x)  # later steps: nothing more
    assert sorted(torch.load(tmp_path / "fastpath.pt", weights_only=False)["steps"]) == [0]


def test_diff_flags_a_jump_and_reports_router_flips(tmp_path, monkeypatch):
    x = torch.randn(1, H, generator=torch.Generator().manual_seed(1))
    monkeypatch.delenv("GLM5_FASTPATH", raising=False)
    a = _model(0)
    LD.install(a, tmp_path, 1)
    _run(a, x)
    monkeypatch.setenv("GLM5_FASTPATH", "1")
    b = _model(0, moe_scale={2: 1.5})  # layer 2's MoE computes something else
    LD.install(b, tmp_path, 1)
    _run(b, x)
    res = LD.diff(torch.load(tmp_path / "stock.pt", weights_only=False),
                  torch.load(tmp_path / "fastpath.pt", weights_only=False))
    rows = {r["layer"]: r for r in res["rows"]}
    assert rows[0]["mlp_out"] == 0.0 and rows[1]["hidden_out"] == 0.0
    assert rows[2]["mlp_in"] == 0.0 and rows[2]["mlp_out"] > 0.1 and "mlp_out" in rows[2]["flag"]
    assert rows[2]["router_overlap"] == K  # same input, same choice
    assert rows[3]["mlp_in"] > 0.0
    md = LD.markdown(res)
    assert "| 0 | 2 |" in md and "jumps" in md


def test_maybe_install_needs_the_env(monkeypatch, tmp_path):
    monkeypatch.delenv(LD.ENV, raising=False)
    assert LD.maybe_install(_model(0)) is None
    monkeypatch.setenv(LD.ENV, str(tmp_path))
    assert LD.maybe_install(_model(0)) is not None
    assert LD.maybe_install(torch.nn.Linear(2, 2)) is None  # no model.layers


def test_cli_diff(tmp_path, monkeypatch, capsys):
    x = torch.randn(1, H, generator=torch.Generator().manual_seed(1))
    for mode in ("0", "1"):
        monkeypatch.setenv("GLM5_FASTPATH", mode)
        m = _model(0)
        LD.install(m, tmp_path, 1)
        _run(m, x)
    assert LD.main(["diff", str(tmp_path / "stock.pt"), str(tmp_path / "fastpath.pt"), "--out",
                    str(tmp_path / "d.md")]) == 0
    assert "| 0 | 3 |" in (tmp_path / "d.md").read_text()
