"""Independent NumPy forward pass of the Llama family: the reference the C++ runtime is tested on.

Nothing here is shared with the C++ code: GGUF weights come from the `gguf` package
(GGUFReader + gguf.quants.dequantize), Hugging Face weights from the `safetensors` package,
and the math is the textbook definition written out in float64 by default.

Supported architectures:
  llama / mistral  RMSNorm, GQA, SwiGLU, RoPE (optionally "linear" or "llama3" scaling)
  qwen2            as llama, plus q/k/v projection biases
  qwen3            as llama, plus per-head RMSNorm of q and k (q_norm, k_norm) before RoPE and an
                   explicit head_dim that may differ from hidden / heads

RoPE layout, the one subtle point. For pair j of a head of size d, theta_j = base^(-2j/d)
(divided by a per-pair frequency factor for llama3 scaling) and angle = pos * theta_j.
  "neox" (half-split): rotates (x[j], x[j + d/2]). Hugging Face checkpoints of every
      architecture, and GGUF files of qwen2/qwen3 (llama.cpp: LLAMA_ROPE_TYPE_NEOX).
  "normal" (adjacent pairs): rotates (x[2j], x[2j+1]). GGUF files of arch llama: llama.cpp's
      convert_hf_to_gguf.py (LlamaModel.permute) reorders the rows of Q and K so that
      half-split pairs become adjacent, and ggml applies LLAMA_ROPE_TYPE_NORM.
The reference never un-permutes weights: it applies the rope mode that belongs to the file, so
agreement between the HF and GGUF copies of one model checks the permutation and both modes.

Usage:
  model = load_model(path)         # .gguf file or HF directory
  logits = model.forward([1, 2, 3])  # [num_tokens, vocab_size], row i = logits after token i
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Optional, Sequence

import numpy as np

# GGUF architectures and the rope mode llama.cpp uses for each (llama_model_rope_type()).
_GGUF_ROPE_MODE = {"llama": "normal", "qwen2": "neox", "qwen3": "neox"}

# HF model_type -> canonical architecture name used by this module.
_HF_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}


@dataclasses.dataclass
class Config:
    """Architecture hyperparameters, as read from the weights file."""

    arch: str  # "llama" (also Mistral), "qwen2", "qwen3"
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_size: int
    vocab_size: int  # rows of the token embedding / LM head
    rms_eps: float
    rope_theta: float
    rope_mode: str  # "normal" (adjacent pairs) or "neox" (half-split)
    # Per-pair divisor of theta_j, shape [head_dim / 2] (llama3 scaling); None = all ones.
    rope_freq_factors: Optional[np.ndarray] = None
    # Positions are multiplied by this before the angle is taken ("linear" scaling = 1/factor).
    rope_pos_scale: float = 1.0
    context_length: int = 0
    sliding_window: Optional[int] = None  # attention window if the model uses one
    source: str = ""  # "gguf" or "hf"


@dataclasses.dataclass
class Layer:
    """Weights of one decoder block, PyTorch orientation ([out_features, in_features])."""

    attn_norm: np.ndarray  # [hidden]
    wq: np.ndarray  # [heads * head_dim, hidden]
    wk: np.ndarray  # [kv_heads * head_dim, hidden]
    wv: np.ndarray  # [kv_heads * head_dim, hidden]
    wo: np.ndarray  # [hidden, heads * head_dim]
    ffn_norm: np.ndarray  # [hidden]
    w_gate: np.ndarray  # [ffn, hidden]
    w_up: np.ndarray  # [ffn, hidden]
    w_down: np.ndarray  # [hidden, ffn]
    bq: Optional[np.ndarray] = None  # [heads * head_dim]
    bk: Optional[np.ndarray] = None  # [kv_heads * head_dim]
    bv: Optional[np.ndarray] = None  # [kv_heads * head_dim]
    bo: Optional[np.ndarray] = None  # [hidden]
    q_norm: Optional[np.ndarray] = None  # [head_dim] (qwen3)
    k_norm: Optional[np.ndarray] = None  # [head_dim] (qwen3)


def round_to_kv_dtype(x: np.ndarray, kv_dtype: str) -> np.ndarray:
    """x rounded to f16 (NumPy's IEEE conversion) or bf16 (float32 bits rounded to the nearest
    multiple of 2^16, ties to even), back in x's dtype; unchanged for "f32"."""
    if kv_dtype == "f32":
        return x
    if kv_dtype == "f16":
        return x.astype(np.float16).astype(x.dtype)
    if kv_dtype == "bf16":
        bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
        return rounded.view(np.float32).astype(x.dtype)
    raise ValueError(f"kv_dtype {kv_dtype!r}: want f32, f16 or bf16")


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * weight over the last axis."""
    ms = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(ms + eps) * weight


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def rope_angles(cfg: Config, positions: np.ndarray, dtype) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin of the rotation angles, each [num_tokens, head_dim / 2] (pair j in column j)."""
    d = cfg.head_dim
    j = np.arange(d // 2, dtype=np.float64)
    theta = cfg.rope_theta ** (-2.0 * j / d)
    if cfg.rope_freq_factors is not None:
        theta = theta / cfg.rope_freq_factors.astype(np.float64)
    angle = (positions.astype(np.float64) * cfg.rope_pos_scale)[:, None] * theta[None, :]
    return np.cos(angle).astype(dtype), np.sin(angle).astype(dtype)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, mode: str) -> np.ndarray:
    """x [num_tokens, heads, head_dim] with each pair chosen by `mode` rotated by its angle."""
    half = x.shape[-1] // 2
    if mode == "neox":
        a, b = x[..., :half], x[..., half:]
    elif mode == "normal":
        a, b = x[..., 0::2], x[..., 1::2]
    else:
        raise ValueError(f"unknown rope mode {mode!r}")
    c, s = cos[:, None, :], sin[:, None, :]
    ra = a * c - b * s
    rb = a * s + b * c
    out = np.empty_like(x)
    if mode == "neox":
        out[..., :half], out[..., half:] = ra, rb
    else:
        out[..., 0::2], out[..., 1::2] = ra, rb
    return out


class Model:
    """A loaded model; forward() computes logits for every position of one sequence."""

    def __init__(
        self,
        cfg: Config,
        tok_embd: np.ndarray,
        layers: list[Layer],
        out_norm: np.ndarray,
        lm_head: np.ndarray,
        metadata: dict,
    ):
        self.cfg = cfg
        self.tok_embd = tok_embd  # [vocab, hidden]
        self.layers = layers
        self.out_norm = out_norm  # [hidden]
        self.lm_head = lm_head  # [vocab, hidden]; the same array as tok_embd when tied
        self.metadata = metadata  # raw GGUF metadata or HF config.json

    @property
    def tied_embeddings(self) -> bool:
        return self.lm_head is self.tok_embd

    def astype(self, dtype) -> "Model":
        """A copy with every weight converted to `dtype` (e.g. a float32 run to gauge rounding)."""

        def cast(a):
            return None if a is None else a.astype(dtype)

        layers = [
            Layer(**{f.name: cast(getattr(l, f.name)) for f in dataclasses.fields(Layer)})
            for l in self.layers
        ]
        tok = cast(self.tok_embd)
        head = tok if self.tied_embeddings else cast(self.lm_head)
        return Model(self.cfg, tok, layers, cast(self.out_norm), head, self.metadata)

    def forward(self, token_ids: Sequence[int], return_hidden: bool = False,
                kv_dtype: str = "f32", num_layers: Optional[int] = None,
                capture: Optional[list] = None):
        """Logits [num_tokens, vocab_size] for a sequence starting at position 0.

        With return_hidden=True also returns the residual stream leaving every layer,
        [num_layers, num_tokens, hidden]. kv_dtype "f16" or "bf16" rounds K (after RoPE) and V
        to that type before attention, as a KV cache of that type holds them (round to nearest
        even; "f32" leaves them alone).

        num_layers runs only the first that many decoder layers, then the final norm and the
        LM head (a "self:K" draft); None runs all of them. `capture`, a list, receives one dict
        per layer run: "q" [num_tokens, heads, head_dim] after RoPE and "k"
        [num_tokens, kv_heads, head_dim] after RoPE and the kv_dtype rounding (what attention
        used). Neither changes the results of the layers that run.
        """
        cfg = self.cfg
        ids = np.asarray(token_ids, dtype=np.int64)
        if ids.ndim != 1 or ids.size == 0:
            raise ValueError("token_ids must be a non-empty 1-D sequence")
        if ids.min() < 0 or ids.max() >= cfg.vocab_size:
            raise ValueError(f"token id out of range [0, {cfg.vocab_size})")
        n = ids.size
        if cfg.sliding_window is not None and n > cfg.sliding_window:
            raise NotImplementedError("sequence longer than the sliding window")
        dtype = self.tok_embd.dtype
        nh, nkv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        group = nh // nkv
        cos, sin = rope_angles(cfg, np.arange(n), dtype)
        # Causal mask: row i (query) sees columns 0..i.
        mask = np.triu(np.full((n, n), -np.inf, dtype=dtype), k=1)
        scale = 1.0 / math.sqrt(hd)

        x = self.tok_embd[ids].copy()  # [n, hidden]
        hidden = []
        run = self.layers if num_layers is None else self.layers[:num_layers]
        if num_layers is not None and not 1 <= num_layers <= len(self.layers):
            raise ValueError(f"num_layers {num_layers}: the model has {len(self.layers)}")
        for layer in run:
            h = rms_norm(x, layer.attn_norm, cfg.rms_eps)
            q = h @ layer.wq.T
            k = h @ layer.wk.T
            v = h @ layer.wv.T
            if layer.bq is not None:
                q = q + layer.bq
            if layer.bk is not None:
                k = k + layer.bk
            if layer.bv is not None:
                v = v + layer.bv
            q = q.reshape(n, nh, hd)
            k = k.reshape(n, nkv, hd)
            v = v.reshape(n, nkv, hd)
            if layer.q_norm is not None:
                q = rms_norm(q, layer.q_norm, cfg.rms_eps)
            if layer.k_norm is not None:
                k = rms_norm(k, layer.k_norm, cfg.rms_eps)
            q = apply_rope(q, cos, sin, cfg.rope_mode)
            k = round_to_kv_dtype(apply_rope(k, cos, sin, cfg.rope_mode), kv_dtype)
            v = round_to_kv_dtype(v, kv_dtype)
            if capture is not None:
                capture.append({"q": q.copy(), "k": k.copy()})
            # GQA: query head hq reads kv head hq // group.
            qh = q.transpose(1, 0, 2)  # [nh, n, hd]
            kh = np.repeat(k.transpose(1, 0, 2), group, axis=0)  # [nh, n, hd]
            vh = np.repeat(v.transpose(1, 0, 2), group, axis=0)
            scores = (qh @ kh.transpose(0, 2, 1)) * scale + mask  # [nh, n, n]
            scores = scores - scores.max(axis=-1, keepdims=True)
            p = np.exp(scores)
            p /= p.sum(axis=-1, keepdims=True)
            attn = (p @ vh).transpose(1, 0, 2).reshape(n, nh * hd)
            o = attn @ layer.wo.T
            if layer.bo is not None:
                o = o + layer.bo
            x = x + o
            h = rms_norm(x, layer.ffn_norm, cfg.rms_eps)
            x = x + (silu(h @ layer.w_gate.T) * (h @ layer.w_up.T)) @ layer.w_down.T
            if return_hidden:
                hidden.append(x.copy())
        logits = rms_norm(x, self.out_norm, cfg.rms_eps) @ self.lm_head.T
        if return_hidden:
            return logits, np.stack(hidden)
        return logits


# ----------------------------------------------------------------------------------------------
# GGUF loading


def _gguf_metadata(reader) -> dict:
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def _load_gguf(path: str, dtype) -> Model:
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(path)
    meta = _gguf_metadata(reader)
    arch = meta["general.architecture"]
    if arch not in _GGUF_ROPE_MODE:
        raise NotImplementedError(f"GGUF architecture {arch!r} is not supported by the reference")

    def key(suffix, default=None):
        value = meta.get(f"{arch}.{suffix}", default)
        if value is None:
            raise KeyError(f"missing GGUF metadata {arch}.{suffix}")
        return value

    tensors = {t.name: t for t in reader.tensors}

    def get(name, required=True):
        t = tensors.get(name)
        if t is None:
            if required:
                raise KeyError(f"missing GGUF tensor {name}")
            return None
        # GGUF shapes are ggml order (fastest first); dequantize returns numpy order, i.e.
        # [rows, cols] = [out_features, in_features] for 2-D weights.
        w = dequantize(t.data, t.tensor_type)
        expected = tuple(int(s) for s in reversed(t.shape.tolist()))
        w = np.asarray(w).reshape(expected)
        return w.astype(dtype)

    hidden = int(key("embedding_length"))
    heads = int(key("attention.head_count"))
    head_dim = int(meta.get(f"{arch}.attention.key_length", hidden // heads))
    value_dim = int(meta.get(f"{arch}.attention.value_length", head_dim))
    if value_dim != head_dim:
        raise NotImplementedError("key_length != value_length")
    rope_dim = int(meta.get(f"{arch}.rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise NotImplementedError("partial rotary embeddings (rope.dimension_count != head_dim)")

    tok_embd = get("token_embd.weight")
    freq_factors = tensors.get("rope_freqs.weight")
    pos_scale = 1.0
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling == "linear":
        pos_scale = 1.0 / float(meta[f"{arch}.rope.scaling.factor"])
    elif scaling not in ("none", ""):
        raise NotImplementedError(f"GGUF rope scaling {scaling!r}")

    cfg = Config(
        arch=arch,
        num_layers=int(key("block_count")),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(meta.get(f"{arch}.attention.head_count_kv", heads)),
        head_dim=head_dim,
        ffn_size=int(key("feed_forward_length")),
        vocab_size=tok_embd.shape[0],
        rms_eps=float(key("attention.layer_norm_rms_epsilon")),
        rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        rope_mode=_GGUF_ROPE_MODE[arch],
        rope_freq_factors=(
            None if freq_factors is None else get("rope_freqs.weight").astype(np.float64)
        ),
        rope_pos_scale=pos_scale,
        context_length=int(meta.get(f"{arch}.context_length", 0)),
        source="gguf",
    )
    layers = []
    for i in range(cfg.num_layers):
        p = f"blk.{i}."
        layers.append(
            Layer(
                attn_norm=get(p + "attn_norm.weight"),
                wq=get(p + "attn_q.weight"),
                wk=get(p + "attn_k.weight"),
                wv=get(p + "attn_v.weight"),
                wo=get(p + "attn_output.weight"),
                ffn_norm=get(p + "ffn_norm.weight"),
                w_gate=get(p + "ffn_gate.weight"),
                w_up=get(p + "ffn_up.weight"),
                w_down=get(p + "ffn_down.weight"),
                bq=get(p + "attn_q.bias", False),
                bk=get(p + "attn_k.bias", False),
                bv=get(p + "attn_v.bias", False),
                bo=get(p + "attn_output.bias", False),
                q_norm=get(p + "attn_q_norm.weight", False),
                k_norm=get(p + "attn_k_norm.weight", False),
            )
        )
    out = get("output.weight", False)
    lm_head = tok_embd if out is None else out
    return Model(cfg, tok_embd, layers, get("output_norm.weight"), lm_head, meta)


# ----------------------------------------------------------------------------------------------
# Hugging Face (config.json + safetensors) loading


def _bf16_bits_to_f32(raw: bytes | bytearray, shape) -> np.ndarray:
    bits = np.frombuffer(bytes(raw), dtype="<u2").astype(np.uint32) << 16
    return bits.view(np.float32).reshape(shape)


class _SafetensorsDir:
    """Reads tensors by name from model.safetensors or an index-described set of shards."""

    def __init__(self, directory: str):
        self.dir = directory
        index_path = os.path.join(directory, "model.safetensors.index.json")
        if os.path.exists(index_path):
            with open(index_path) as f:
                self.weight_map = json.load(f)["weight_map"]
        else:
            single = os.path.join(directory, "model.safetensors")
            if not os.path.exists(single):
                raise FileNotFoundError(f"no model.safetensors(.index.json) in {directory}")
            from safetensors import safe_open

            with safe_open(single, framework="np") as f:
                self.weight_map = {k: "model.safetensors" for k in f.keys()}
        self._bf16_cache: dict[str, dict] = {}

    def has(self, name: str) -> bool:
        return name in self.weight_map

    def get(self, name: str) -> np.ndarray:
        from safetensors import safe_open

        file = os.path.join(self.dir, self.weight_map[name])
        with safe_open(file, framework="np") as f:
            dtype = f.get_slice(name).get_dtype()
            if dtype != "BF16":
                return f.get_tensor(name)
        # NumPy has no bfloat16: take the raw bytes through safetensors.deserialize.
        if file not in self._bf16_cache:
            from safetensors import deserialize

            with open(file, "rb") as fh:
                self._bf16_cache[file] = dict(deserialize(fh.read()))
        entry = self._bf16_cache[file][name]
        return _bf16_bits_to_f32(entry["data"], entry["shape"])


def llama3_inv_freq_factors(
    head_dim: int,
    theta: float,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_context: float,
) -> np.ndarray:
    """Per-pair divisors of theta_j for "llama3" rope scaling, [head_dim / 2].

    Same rule as transformers' _compute_llama3_parameters: long wavelengths are slowed down by
    `factor`, short ones kept, the band in between interpolated smoothly.
    """
    j = np.arange(head_dim // 2, dtype=np.float64)
    inv_freq = theta ** (-2.0 * j / head_dim)
    wavelen = 2.0 * math.pi / inv_freq
    low_wavelen = original_context / low_freq_factor
    high_wavelen = original_context / high_freq_factor
    smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    new_inv = np.where(
        wavelen < high_wavelen,
        inv_freq,
        np.where(
            wavelen > low_wavelen,
            inv_freq / factor,
            (1.0 - smooth) * inv_freq / factor + smooth * inv_freq,
        ),
    )
    return inv_freq / new_inv


def _load_hf(directory: str, dtype) -> Model:
    with open(os.path.join(directory, "config.json")) as f:
        hf = json.load(f)
    model_type = hf.get("model_type")
    if model_type not in _HF_ARCH:
        raise NotImplementedError(f"HF model_type {model_type!r} is not supported by the reference")
    arch = _HF_ARCH[model_type]
    hidden = int(hf["hidden_size"])
    heads = int(hf["num_attention_heads"])
    head_dim = int(hf.get("head_dim") or hidden // heads)
    # transformers >= 5 moved rope settings into rope_parameters.
    rope = dict(hf.get("rope_parameters") or {})
    scaling = dict(hf.get("rope_scaling") or {})
    theta = float(hf.get("rope_theta", rope.get("rope_theta", 10000.0)))
    rope_type = scaling.get("rope_type", scaling.get("type", rope.get("rope_type", "default")))
    params = scaling or rope
    freq_factors = None
    pos_scale = 1.0
    if rope_type == "llama3":
        freq_factors = llama3_inv_freq_factors(
            head_dim,
            theta,
            float(params["factor"]),
            float(params["low_freq_factor"]),
            float(params["high_freq_factor"]),
            float(params["original_max_position_embeddings"]),
        )
    elif rope_type == "linear":
        pos_scale = 1.0 / float(params["factor"])
    elif rope_type != "default":
        raise NotImplementedError(f"HF rope scaling {rope_type!r}")
    if float(hf.get("partial_rotary_factor", 1.0)) != 1.0:
        raise NotImplementedError("partial rotary embeddings")

    sliding = None
    if model_type == "mistral" and hf.get("sliding_window"):
        sliding = int(hf["sliding_window"])
    if model_type in ("qwen2", "qwen3") and hf.get("use_sliding_window"):
        sliding = int(hf["sliding_window"])

    st = _SafetensorsDir(directory)

    def get(name, required=True):
        if not st.has(name):
            if required:
                raise KeyError(f"missing safetensors tensor {name}")
            return None
        return np.asarray(st.get(name)).astype(dtype)

    tok_embd = get("model.embed_tokens.weight")
    cfg = Config(
        arch=arch,
        num_layers=int(hf["num_hidden_layers"]),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        ffn_size=int(hf["intermediate_size"]),
        vocab_size=tok_embd.shape[0],
        rms_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_mode="neox",
        rope_freq_factors=freq_factors,
        rope_pos_scale=pos_scale,
        context_length=int(hf.get("max_position_embeddings", 0)),
        sliding_window=sliding,
        source="hf",
    )
    layers = []
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        layers.append(
            Layer(
                attn_norm=get(p + "input_layernorm.weight"),
                wq=get(p + "self_attn.q_proj.weight"),
                wk=get(p + "self_attn.k_proj.weight"),
                wv=get(p + "self_attn.v_proj.weight"),
                wo=get(p + "self_attn.o_proj.weight"),
                ffn_norm=get(p + "post_attention_layernorm.weight"),
                w_gate=get(p + "mlp.gate_proj.weight"),
                w_up=get(p + "mlp.up_proj.weight"),
                w_down=get(p + "mlp.down_proj.weight"),
                bq=get(p + "self_attn.q_proj.bias", False),
                bk=get(p + "self_attn.k_proj.bias", False),
                bv=get(p + "self_attn.v_proj.bias", False),
                bo=get(p + "self_attn.o_proj.bias", False),
                q_norm=get(p + "self_attn.q_norm.weight", False),
                k_norm=get(p + "self_attn.k_norm.weight", False),
            )
        )
    if hf.get("tie_word_embeddings", False):
        lm_head = tok_embd
    else:
        lm_head = get("lm_head.weight")
    return Model(cfg, tok_embd, layers, get("model.norm.weight"), lm_head, hf)


def load_model(path: str, dtype=np.float64) -> Model:
    """Loads a .gguf file or a Hugging Face directory; weights are converted to `dtype`."""
    if os.path.isdir(path):
        return _load_hf(path, dtype)
    return _load_gguf(path, dtype)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    m = logits.max(axis=-1, keepdims=True)
    return logits - m - np.log(np.exp(logits - m).sum(axis=-1, keepdims=True))


def perplexity(logits: np.ndarray, token_ids: Sequence[int]) -> float:
    """exp(mean NLL of token i+1 given tokens 0..i) over the sequence."""
    ids = np.asarray(token_ids)
    lp = log_softmax(logits[:-1].astype(np.float64))
    nll = -lp[np.arange(len(ids) - 1), ids[1:]]
    return float(np.exp(nll.mean()))


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="Reference logits of a Llama-family model.")
    ap.add_argument("--model", required=True)
    ap.add_argument("--token_ids", required=True, help="comma-separated token ids")
    ap.add_argument("--out", help="write float32 logits [N, vocab] here")
    args = ap.parse_args()
    m = load_model(args.model)
    ids = [int(t) for t in args.token_ids.split(",")]
    out = m.forward(ids)
    if args.out:
        out.astype("<f4").tofile(args.out)
    print(json.dumps({"tokens": len(ids), "vocab_size": int(out.shape[1]),
                      "argmax": out.argmax(axis=-1).tolist()}))
