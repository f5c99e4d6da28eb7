"""Synthetic GLM-5 FP8 checkpoints (`make-checkpoint`) and the checkpoint loader.

Writer: `make_checkpoint` writes a Hugging Face model directory shaped like zai-org/GLM-5-FP8
(config.json, generation_config.json, tokenizer files, block-FP8 safetensors shards and
model.safetensors.index.json). Every tensor comes from `weights.generate_tensor` over
`weights.layer_tensor_specs` / `model_tensor_specs`, so a checkpoint written with `seed` and
`weights.random_layer(cfg, layer, seed)` hold bit-identical weights.

- Shards are written in the safetensors format directly: the header is known from the tensor
  table before any data exists, so each tensor is generated, written at its offset and dropped.
  Memory stays at one tensor (the largest is embed_tokens / lm_head, 1.9 GB at full dims), and a
  full-size MoE layer (~9.7 GB) streams expert by expert.
- Shards are filled in checkpoint order (embed_tokens, layer 0, 1, ..., model.norm, lm_head) up to
  `max_shard_bytes`; a layer larger than that spans several shards. Inside a shard, tensors are laid
  out widest dtype first (fp32, bf16, fp8), as safetensors itself does, so every tensor is aligned.
- Everything is written into a hidden sibling directory `.<name>.partial-<pid>-<rand>` and renamed
  to `out_dir` only when complete; a failed run removes it, a killed one leaves only that hidden
  directory behind (safe to delete), never a half checkpoint at `out_dir`.

Loader: `load_config`, `checkpoint_source` (lazy name -> tensor, each shard opened once),
`load_layer` (runtime `LayerWeights`, experts lazy) and `verify_checkpoint` (header-only check of
every tensor's presence, dtype and shape against the tensor table).
"""
from __future__ import annotations

import difflib
import json
import os
import re
import secrets
import shutil
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import torch

from . import tokenizer as _tok
from .config import Glm5Config, QuantConfig, small_config
from .weights import (LayerWeights, TensorSpec, assemble_layer, generate_tensor, layer_tensor_specs, model_tensor_specs,
                      stored_layout)

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
DEFAULT_MAX_SHARD_BYTES = 5 * 10**9
PRESETS = ("glm5", "glm5.2")
EXPERTS_PER_PROGRESS_GROUP = 32

_ST_DTYPE = {torch.float8_e4m3fn: "F8_E4M3", torch.bfloat16: "BF16", torch.float32: "F32"}
_TORCH_DTYPE = {v: k for k, v in _ST_DTYPE.items()}


class CheckpointError(Exception):
    """A checkpoint directory is missing a file or tensor, or holds a tensor of the wrong dtype/shape."""


class MissingTensorError(CheckpointError, KeyError):
    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class TensorMismatchError(CheckpointError, ValueError):
    pass


# ---- what the checkpoint stores ---------------------------------------------------------------------

@dataclass(frozen=True)
class StoredTensor:
    """One tensor as stored in the checkpoint (an fp8 spec stores two: weight and weight_scale_inv)."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * self.dtype.itemsize

    def describe(self) -> str:
        return f"{str(self.dtype).replace('torch.', '')}{list(self.shape)}"


def stored_tensors(spec: TensorSpec) -> list[StoredTensor]:
    """The tensors `weights.generate_tensor(spec, seed)` returns, without generating them."""
    return [StoredTensor(name, dtype, shape) for name, dtype, shape in stored_layout(spec)]


def checkpoint_tensor_specs(cfg: Glm5Config) -> list[TensorSpec]:
    """All tensors of a checkpoint of `cfg`, in file order: embed_tokens, layers 0..L-1, norm, lm_head."""
    model = model_tensor_specs(cfg)
    head = [s for s in model if s.name == "model.embed_tokens.weight"]
    tail = [s for s in model if s.name != "model.embed_tokens.weight"]
    return head + [s for i in range(cfg.num_hidden_layers) for s in layer_tensor_specs(cfg, i)] + tail


# ---- config -----------------------------------------------------------------------------------------

def checkpoint_config(preset: str = "glm5", *, layers: int, small: bool = False) -> Glm5Config:
    """The config a checkpoint of `preset` with `layers` decoder layers (and no MTP layer) has.

    small=True keeps the preset's behaviour (rope theta, GLM-5.2's indexer schedule) on the small
    test dims of `config.small_config`. modules_to_not_convert lists the bf16 linear modules:
    embed_tokens, lm_head and every indexer's weights_proj.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise ValueError(f"layers must be a positive integer, got {layers!r}")
    base = Glm5Config.preset(preset)
    if small:
        cfg = small_config(num_hidden_layers=layers, rope_theta=base.rope_theta,
                           index_topk_freq=base.index_topk_freq, index_skip_topk_offset=base.index_skip_topk_offset,
                           source=f"<preset {preset}, small dims>")
    else:
        cfg = base.replace(num_hidden_layers=layers, num_nextn_predict_layers=0)
    skip = list(base.quant.modules_to_not_convert if base.quant else ("model.embed_tokens", "lm_head"))
    skip += [f"model.layers.{i}.self_attn.indexer.weights_proj" for i in range(layers) if cfg.is_full_indexer_layer(i)]
    return cfg.replace(quant=QuantConfig(modules_to_not_convert=tuple(dict.fromkeys(skip))))


def hf_config_dict(cfg: Glm5Config, tok: _tok.TokenizerSpec | None = None) -> dict:
    """config.json content: `Glm5Config.to_hf_dict()` with the tokenizer's BOS/EOS ids.

    The IndexShare keys are dropped when the schedule is "every layer full" (freq 1), as in the
    official GLM-5 config; GLM-5.2 keeps index_topk_freq / index_skip_topk_offset.
    """
    d = cfg.to_hf_dict()
    if cfg.index_topk_freq == 1 and cfg.index_skip_topk_offset == 0:
        d.pop("index_topk_freq", None)
        d.pop("index_skip_topk_offset", None)
    tok = tok or _tok.build_tokenizer()
    d["bos_token_id"], d["eos_token_id"] = tok.bos_token_id, tok.eos_token_id
    return d


def write_model_files(out_dir: str | os.PathLike, cfg: Glm5Config) -> None:
    """config.json, generation_config.json and the tokenizer files (everything but the weights)."""
    out = Path(out_dir)
    tok = _tok.write_tokenizer(out, vocab_size=cfg.vocab_size, model_max_length=cfg.max_position_embeddings)
    _dump_json(out / "config.json", hf_config_dict(cfg, tok))
    _dump_json(out / "generation_config.json", {
        "_from_model_config": True, "bos_token_id": tok.bos_token_id, "eos_token_id": [tok.eos_token_id],
        "pad_token_id": tok.eos_token_id})


# ---- writing the weights ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Progress:
    """Reported after each tensor group (a layer's attention, its dense MLP, its router, 32 experts, ...)."""

    group: str
    shard: str
    done_bytes: int
    total_bytes: int
    elapsed_s: float

    def __str__(self) -> str:
        pct = 100.0 * self.done_bytes / max(self.total_bytes, 1)
        return (f"[{pct:5.1f}%] {self.done_bytes / 1e9:7.2f}/{self.total_bytes / 1e9:.2f} GB  "
                f"{self.group} -> {self.shard}  ({self.elapsed_s:.0f} s)")


ProgressFn = Callable[[Progress], None]

_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.(.*)")
_EXPERT_RE = re.compile(r"mlp\.experts\.(\d+)\.")


def _group_of(name: str, n_experts: int) -> str:
    m = _LAYER_RE.fullmatch(name)
    if not m:
        return name.removesuffix(".weight")  # model.embed_tokens, model.norm, lm_head
    layer, rest = m.group(1), m.group(2)
    e = _EXPERT_RE.match(rest)
    if e:
        lo = int(e.group(1)) // EXPERTS_PER_PROGRESS_GROUP * EXPERTS_PER_PROGRESS_GROUP
        return f"layer {layer} experts {lo}-{min(lo + EXPERTS_PER_PROGRESS_GROUP, n_experts) - 1}"
    if rest.startswith("mlp.shared_experts."):
        return f"layer {layer} shared expert"
    if rest.startswith("mlp.gate."):
        return f"layer {layer} router"
    if rest.startswith("mlp."):
        return f"layer {layer} dense mlp"
    return f"layer {layer} attention"


def plan_shards(specs: Sequence[TensorSpec], max_shard_bytes: int) -> list[list[TensorSpec]]:
    """Greedy packing in order; a spec (fp8 weight + its scale) never straddles two shards."""
    if max_shard_bytes < 1:
        raise ValueError(f"max_shard_bytes must be positive, got {max_shard_bytes}")
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for s in specs:
        n = sum(t.nbytes for t in stored_tensors(s))
        if shards[-1] and size + n > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(s)
        size += n
    return shards if shards[0] else []


def _shard_header(entries: list[StoredTensor]) -> tuple[bytes, dict[str, int]]:
    """safetensors header (u64 length + JSON, space-padded to 8 bytes) and each tensor's data offset."""
    layout = sorted(entries, key=lambda t: -t.dtype.itemsize)  # stable: widest dtype first keeps alignment
    header: dict[str, dict] = {"__metadata__": {"format": "pt"}}  # type: ignore[dict-item]
    offsets: dict[str, int] = {}
    pos = 0
    for t in layout:
        offsets[t.name] = pos
        header[t.name] = {"dtype": _ST_DTYPE[t.dtype], "shape": list(t.shape), "data_offsets": [pos, pos + t.nbytes]}
        pos += t.nbytes
    js = json.dumps(header, separators=(",", ":")).encode()
    js += b" " * (-(len(js) + 8) % 8)
    return struct.pack("<Q", len(js)) + js, offsets


def _write_shard(path: Path, specs: Sequence[TensorSpec], seed: int, after_spec: Callable[[TensorSpec, int], None]) -> int:
    planned = {t.name: t for s in specs for t in stored_tensors(s)}
    head, offsets = _shard_header(list(planned.values()))
    data_bytes = sum(t.nbytes for t in planned.values())
    with open(path, "wb") as f:
        f.write(head)
        for spec in specs:
            out = generate_tensor(spec, seed)
            if set(out) != {t.name for t in stored_tensors(spec)}:
                raise RuntimeError(f"weights.generate_tensor({spec.name}) returned {sorted(out)}, "
                                   f"but checkpoint.stored_tensors expects {[t.name for t in stored_tensors(spec)]}")
            written = 0
            for name, t in out.items():
                want = planned[name]
                if t.dtype != want.dtype or tuple(t.shape) != want.shape:
                    raise RuntimeError(f"{name}: generated {str(t.dtype)}{list(t.shape)}, the tensor table says "
                                       f"{want.describe()} (weights.generate_tensor and checkpoint.stored_tensors disagree)")
                f.seek(len(head) + offsets[name])
                f.write(t.contiguous().view(-1).view(torch.uint8).numpy())
                written += want.nbytes
            del out
            after_spec(spec, written)
        f.flush()
        os.fsync(f.fileno())
    size = path.stat().st_size
    if size != len(head) + data_bytes:
        raise RuntimeError(f"{path}: wrote {size} bytes, expected {len(head) + data_bytes}")
    return data_bytes


def write_weights(out_dir: str | os.PathLike, specs: Sequence[TensorSpec], *, seed: int = 0,
                  max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES, progress: ProgressFn | None = None) -> dict[str, str]:
    """Write `specs` as safetensors shards plus model.safetensors.index.json into `out_dir`.

    Returns the weight_map (tensor name -> shard file). Low level: `make_checkpoint` is the entry
    point; tests use this to write a subset of tensors (one full-size layer).
    """
    out = Path(out_dir)
    shards = plan_shards(specs, max_shard_bytes)
    total = sum(t.nbytes for s in specs for t in stored_tensors(s))
    weight_map: dict[str, str] = {}
    n_experts = 1 + max((int(m.group(1)) for s in specs if (m := _EXPERT_RE.search(s.name))), default=0)
    t0 = time.monotonic()
    state = {"done": 0, "group": None, "shard": ""}

    def report() -> None:
        if progress is not None and state["group"] is not None:
            progress(Progress(state["group"], state["shard"], state["done"], total, time.monotonic() - t0))

    def after_spec(spec: TensorSpec, nbytes: int) -> None:
        group = _group_of(spec.name, n_experts)
        if group != state["group"]:
            report()  # the previous group is complete
            state["group"] = group
        state["done"] += nbytes

    for i, shard_specs in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        if state["shard"]:
            report()  # a group cut by a shard boundary is reported per shard
            state["group"] = None
        state["shard"] = fname
        _write_shard(out / fname, shard_specs, seed, after_spec)
        for s in shard_specs:
            for t in stored_tensors(s):
                weight_map[t.name] = fname
    report()
    _dump_json(out / INDEX_FILE, {"metadata": {"total_size": total}, "weight_map": weight_map})
    return weight_map


def make_checkpoint(out_dir: str | os.PathLike, *, layers: int, preset: str = "glm5", seed: int = 0,
                    small: bool = False, progress: ProgressFn | None = None, overwrite: bool = False,
                    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> Path:
    """Write a GLM-5-shaped FP8 checkpoint with `layers` decoder layers to `out_dir`; return its path.

    Full GLM-5 dims per layer unless small=True (the layer count is what shrinks it: a dense layer
    is ~0.4 GB, an MoE layer ~9.7 GB, embed_tokens + lm_head 3.8 GB). Layers 0-2 are dense
    (first_k_dense_replace=3; 1 with small=True), so a full-dims checkpoint with an MoE layer needs
    layers >= 4. `out_dir` must not exist or be empty, unless overwrite=True.
    """
    out = Path(out_dir).resolve()  # a symlinked out_dir: write next to (and rename onto) its target
    cfg = checkpoint_config(preset, layers=layers, small=small)
    _check_target(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        write_model_files(tmp, cfg)
        write_weights(tmp, checkpoint_tensor_specs(cfg), seed=seed, max_shard_bytes=max_shard_bytes, progress=progress)
        _publish(tmp, out, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _check_target(out: Path, overwrite: bool) -> None:
    if out.exists():
        if not out.is_dir():
            raise FileExistsError(f"{out} exists and is not a directory")
        if any(out.iterdir()) and not overwrite:
            raise FileExistsError(f"{out} is not empty; pass overwrite=True (--overwrite) to replace it")


def _publish(tmp: Path, out: Path, overwrite: bool) -> None:
    _check_target(out, overwrite)  # again: it may have changed during a long write
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()
    if out.exists():  # overwrite=True: swap, then delete the old one
        old = out.parent / f".{out.name}.old-{os.getpid()}-{secrets.token_hex(4)}"
        os.rename(out, old)
        os.rename(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, out)


def _dump_json(path: Path, obj: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


# ---- loading ----------------------------------------------------------------------------------------

def load_config(ckpt_dir: str | os.PathLike) -> Glm5Config:
    """Glm5Config of a checkpoint directory (its config.json)."""
    d = Path(ckpt_dir)
    if not d.is_dir():
        raise FileNotFoundError(f"checkpoint directory {d} does not exist")
    return Glm5Config.from_file(d / "config.json")


class CheckpointSource:
    """A lazy name -> tensor source over a checkpoint's shards (a `weights.TensorSource`).

    Reads model.safetensors.index.json (or a lone model.safetensors); each shard is opened once, on
    first use, and its handle kept until `close()`. Tensors come back in checkpoint dtypes on the CPU.
    """

    def __init__(self, ckpt_dir: str | os.PathLike):
        from safetensors import safe_open  # core dependency; imported here to keep package import light

        self._safe_open = safe_open
        self.dir = Path(ckpt_dir)
        if not self.dir.is_dir():
            raise FileNotFoundError(f"checkpoint directory {self.dir} does not exist")
        self._handles: dict[str, object] = {}
        index = self.dir / INDEX_FILE
        if index.exists():
            self.index_path = index
            try:
                doc = json.loads(index.read_text(encoding="utf-8"))
            except json.JSONDecodeError as e:
                raise CheckpointError(f"{index}: not valid JSON ({e})") from None
            wm = doc.get("weight_map") if isinstance(doc, dict) else None
            if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
                raise CheckpointError(f"{index}: no 'weight_map' object of tensor name -> shard file")
            self.weight_map: dict[str, str] = dict(wm)
        elif (self.dir / SINGLE_FILE).exists():
            self.index_path = self.dir / SINGLE_FILE
            self.weight_map = {n: SINGLE_FILE for n in self._handle(SINGLE_FILE, None).keys()}
        else:
            raise FileNotFoundError(f"{self.dir}: no {INDEX_FILE} and no {SINGLE_FILE}; not a safetensors checkpoint")
        self._config: Glm5Config | None = None

    @property
    def config(self) -> Glm5Config:
        if self._config is None:
            self._config = load_config(self.dir)
        return self._config

    def __contains__(self, name: str) -> bool:
        return name in self.weight_map

    def names(self) -> list[str]:
        return list(self.weight_map)

    def _handle(self, fname: str, wanted: str | None):
        h = self._handles.get(fname)
        if h is None:
            path = self.dir / fname
            if not path.exists():
                what = f" (needed for {wanted})" if wanted else ""
                raise FileNotFoundError(f"{path}: shard listed in {INDEX_FILE} is missing{what}")
            try:
                h = self._safe_open(str(path), framework="pt", device="cpu")
            except Exception as e:  # safetensors raises its own error type for a corrupt header
                raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from e
            self._handles[fname] = h
        return h

    def _locate(self, name: str):
        fname = self.weight_map.get(name)
        if fname is None:
            near = difflib.get_close_matches(name, self.weight_map, n=3)
            hint = f"; similar names: {', '.join(near)}" if near else ""
            raise MissingTensorError(f"tensor {name} is not in {self.index_path} "
                                     f"({len(self.weight_map)} tensors){hint}")
        h = self._handle(fname, name)
        if name not in h.keys():
            raise MissingTensorError(f"tensor {name}: {INDEX_FILE} maps it to {fname}, which does not contain it")
        return h

    def __call__(self, name: str) -> torch.Tensor:
        return self._locate(name).get_tensor(name)

    def stored(self, name: str) -> StoredTensor:
        """dtype and shape from the shard header, without reading the data."""
        sl = self._locate(name).get_slice(name)
        st_dtype = sl.get_dtype()
        if st_dtype not in _TORCH_DTYPE:
            raise TensorMismatchError(f"tensor {name}: stored as {st_dtype}, which GLM-5 checkpoints never use")
        return StoredTensor(name, _TORCH_DTYPE[st_dtype], tuple(sl.get_shape()))

    def check(self, expected: Iterable[StoredTensor]) -> int:
        """Raise MissingTensorError / TensorMismatchError on the first tensor that is absent or differs."""
        n = 0
        for want in expected:
            got = self.stored(want.name)
            if got.dtype != want.dtype or got.shape != want.shape:
                raise TensorMismatchError(f"tensor {want.name}: expected {want.describe()}, got {got.describe()} "
                                          f"(in {self.dir / self.weight_map[want.name]}; config {self.dir / 'config.json'})")
            n += 1
        return n

    def close(self) -> None:
        self._handles.clear()

    def __enter__(self) -> "CheckpointSource":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def checkpoint_source(ckpt_dir: str | os.PathLike) -> CheckpointSource:
    return CheckpointSource(ckpt_dir)


def expected_layer_tensors(cfg: Glm5Config, layer: int) -> list[StoredTensor]:
    return [t for s in layer_tensor_specs(cfg, layer) for t in stored_tensors(s)]


def load_layer(ckpt: str | os.PathLike | CheckpointSource, layer: int, device=None) -> LayerWeights:
    """Runtime weights of decoder layer `layer` (via weights.assemble_layer; experts load lazily).

    Every tensor of the layer is checked against the tensor table first (header only), so a wrong
    checkpoint fails here, naming the tensor, rather than deep inside a kernel. Pass a
    CheckpointSource to load several layers through the same open shards.
    """
    src = ckpt if isinstance(ckpt, CheckpointSource) else CheckpointSource(ckpt)
    cfg = src.config
    if not 0 <= layer < cfg.num_hidden_layers:
        raise ValueError(f"layer {layer} out of range: {src.dir} has num_hidden_layers={cfg.num_hidden_layers}")
    src.check(expected_layer_tensors(cfg, layer))
    return assemble_layer(cfg, layer, src, device=device)


def verify_checkpoint(ckpt: str | os.PathLike | CheckpointSource) -> int:
    """Check every tensor of the checkpoint against the tensor table (headers only); return the count.

    Fails on a missing tensor, a wrong dtype/shape, or an unexpected tensor (tensors of layers
    >= num_hidden_layers, i.e. MTP layers of a real checkpoint, are ignored).
    """
    src = ckpt if isinstance(ckpt, CheckpointSource) else CheckpointSource(ckpt)
    cfg = src.config
    expected = [t for s in checkpoint_tensor_specs(cfg) for t in stored_tensors(s)]
    n = src.check(expected)
    known = {t.name for t in expected}
    extra = []
    for name in src.names():
        m = _LAYER_RE.fullmatch(name)
        if name not in known and not (m and int(m.group(1)) >= cfg.num_hidden_layers):
            extra.append(name)
    if extra:
        raise CheckpointError(f"{src.index_path}: {len(extra)} tensors the config does not define, e.g. {extra[:5]}")
    return n
