"""Tiny random-weight Llama-family models, written as a Hugging Face directory AND a GGUF file.

Each model exists twice with the same weights:
  DIR/<name>/hf/          config.json, model.safetensors, tokenizer.json, tokenizer_config.json
  DIR/<name>/hf_sharded/  (models with sharded=True) model.safetensors.index.json + 2 shards
  DIR/<name>.gguf         the layout llama.cpp's convert_hf_to_gguf.py produces: ggml tensor
                          names, arch metadata, tokenizer.ggml.*, and for arch llama the rows of
                          Q and K permuted (LlamaModel.permute) for adjacent-pair RoPE.

The models (hidden 64, 4 heads / 2 KV heads, ffn 128, context 256, byte-level BPE vocabulary of
256 bytes + merges + <|endoftext|> <|im_start|> <|im_end|>):
  tiny_llama     llama, tied embeddings, F32, 2 layers
  tiny_llama3    llama, untied lm_head, "llama3" rope scaling (GGUF: rope_freqs.weight),
                 add_bos_token, F16, 3 layers, plus a sharded HF variant
  tiny_qwen2     qwen2, q/k/v bias, untied, F32, embedding rows padded past the tokenizer
                 (config vocab_size 320 > 300 tokens; GGUF gets [PAD] tokens as llama.cpp does)
  tiny_qwen3     qwen3, per-head q_norm/k_norm, head_dim 24 != 64/4, tied, BF16
Draft models (DRAFT_SPECS, same tokenizer as tiny_llama, written by write_all(drafts=True)):
  tiny_llama_draft  llama, 1 layer, hidden 32, 2 heads / 1 KV head, ffn 64, tied, F32

CLI: python tests/reference/tiny_models.py --out DIR [--check]
  --check loads every written model with the NumPy reference (llama_numpy.py) and asserts
  that the HF directory, the sharded directory and the GGUF give the same logits (~1e-6).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from typing import Optional

import numpy as np

CHATML_SMOLLM = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CHATML_PLAIN = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOKENIZER_VOCAB = 300  # 3 specials + 256 bytes + 41 merges

# Fixed training text for the BPE merges: deterministic, no dependence on files on the machine.
_MERGE_CORPUS = [
    "The quick brown fox jumps over the lazy dog. The dog sleeps in the sun, and the fox runs "
    "into the forest. Then the model reads the text, and the tokens of the text are counted. "
    "There is a reason for the order of the merges: the most frequent pair is merged first.",
    "In the beginning there was the word, and the word was with the tokenizer. The tokenizer "
    "splits the text into bytes, then merges the bytes into tokens, one pair at a time.",
]


@dataclasses.dataclass(frozen=True)
class TinySpec:
    name: str
    model_type: str  # HF model_type and GGUF general.architecture
    num_layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    ffn: int = 128
    context: int = 256
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    tied: bool = True
    qkv_bias: bool = False
    qk_norm: bool = False
    llama3_scaling: Optional[dict] = None  # HF rope_scaling dict
    dtype: str = "F32"  # storage type of matrices and (HF) vectors: F32, F16, BF16
    vocab_rows: int = TOKENIZER_VOCAB  # embedding rows; > TOKENIZER_VOCAB pads
    add_bos: bool = False
    bos_id: int = 1
    eos_id: int = 2
    chat_template: str = CHATML_SMOLLM
    merges_as_pairs: bool = False  # tokenizer.json merges as [a, b] lists (newer) or "a b"
    sharded: bool = False
    seed: int = 0


SPECS = [
    TinySpec(name="tiny_llama", model_type="llama", seed=1),
    TinySpec(
        name="tiny_llama3",
        model_type="llama",
        num_layers=3,
        tied=False,
        rope_theta=10000.0,
        # head_dim 16, theta 1e4: wavelengths 6.3, 19.9, 62.8, 199, ... so with an original
        # context of 64 the pairs fall in all three llama3 bands (kept, smoothed, divided).
        llama3_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        dtype="F16",
        add_bos=True,
        bos_id=0,
        merges_as_pairs=True,
        sharded=True,
        seed=2,
    ),
    TinySpec(
        name="tiny_qwen2",
        model_type="qwen2",
        tied=False,
        qkv_bias=True,
        rope_theta=1000000.0,
        rms_eps=1e-6,
        vocab_rows=320,
        bos_id=0,
        chat_template=CHATML_PLAIN,
        seed=3,
    ),
    TinySpec(
        name="tiny_qwen3",
        model_type="qwen3",
        head_dim=24,
        qk_norm=True,
        rope_theta=1000000.0,
        rms_eps=1e-6,
        dtype="BF16",
        bos_id=0,
        chat_template=CHATML_PLAIN,
        merges_as_pairs=True,
        seed=4,
    ),
]

# Draft models for SpecPC / SpecKV (tests/model/specpc_reference_test.py): the tokenizer and
# special tokens of tiny_llama (same TinySpec defaults), other weights (seed) and another shape
# (1 layer, 2 heads / 1 KV head, hidden 32), so a scorer that used the target's shapes fails.
# Not in SPECS: write_all() and the tests built on it are unchanged; get_spec() finds them.
DRAFT_SPECS = [
    TinySpec(name="tiny_llama_draft", model_type="llama", num_layers=1, hidden=32, heads=2,
             kv_heads=1, head_dim=16, ffn=64, seed=5),
]


def get_spec(name: str) -> TinySpec:
    for spec in SPECS + DRAFT_SPECS:
        if spec.name == name:
            return spec
    raise KeyError(f"no tiny model named {name!r}")


# ----------------------------------------------------------------------------------------------
# Tokenizer


def build_tokenizer(spec: TinySpec):
    """A byte-level BPE tokenizer (SmolLM2-style pre-tokenizer) trained on a fixed corpus.

    Returns the `tokenizers.Tokenizer`; ids: 0-2 specials, then 256 byte tokens, then merges.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=1,
        show_progress=False,
    )
    tok.train_from_iterator(_MERGE_CORPUS, trainer)
    if tok.get_vocab_size() != TOKENIZER_VOCAB:
        raise RuntimeError(f"BPE training gave {tok.get_vocab_size()} tokens")
    if spec.add_bos:
        bos = SPECIAL_TOKENS[spec.bos_id]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A:0", pair=f"{bos} $A:0 {bos} $B:1", special_tokens=[(bos, spec.bos_id)]
        )
    return tok


def _tokenizer_json(spec: TinySpec, tok) -> dict:
    j = json.loads(tok.to_str())
    merges = j["model"]["merges"]
    if merges and not isinstance(merges[0], str) and not spec.merges_as_pairs:
        j["model"]["merges"] = [" ".join(m) for m in merges]
    elif merges and isinstance(merges[0], str) and spec.merges_as_pairs:
        j["model"]["merges"] = [m.split(" ", 1) for m in merges]
    return j


def _vocab_and_merges(tok) -> tuple[list[str], list[str]]:
    j = json.loads(tok.to_str())
    by_id = sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1])
    tokens = [t for t, _ in by_id]
    if [i for _, i in by_id] != list(range(len(tokens))):
        raise RuntimeError("tokenizer ids are not contiguous")
    merges = [m if isinstance(m, str) else " ".join(m) for m in j["model"]["merges"]]
    return tokens, merges


def _tokenizer_config(spec: TinySpec, tok) -> dict:
    added = {
        str(i): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, t in enumerate(SPECIAL_TOKENS)
    }
    return {
        "add_bos_token": spec.add_bos,
        "add_eos_token": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": SPECIAL_TOKENS[spec.bos_id],
        "chat_template": spec.chat_template,
        "clean_up_tokenization_spaces": False,
        "eos_token": SPECIAL_TOKENS[spec.eos_id],
        "model_max_length": spec.context,
        "pad_token": SPECIAL_TOKENS[spec.eos_id],
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": SPECIAL_TOKENS[0],
    }


# ----------------------------------------------------------------------------------------------
# Weights


def _round_to_storage(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values exactly representable in the storage type (so every copy is identical)."""
    x = x.astype(np.float32)
    if dtype == "F32":
        return x
    if dtype == "F16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "BF16":
        from gguf.quants import GGMLQuantizationType, quantize

        bits = quantize(x, GGMLQuantizationType.BF16).view(np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32).reshape(x.shape)
    raise ValueError(dtype)


def make_weights(spec: TinySpec) -> dict[str, np.ndarray]:
    """HF-named float32 tensors, values already rounded to spec.dtype."""
    rng = np.random.default_rng(spec.seed)
    h, f, hd = spec.hidden, spec.ffn, spec.head_dim
    qd, kd = spec.heads * hd, spec.kv_heads * hd

    def mat(rows, cols, gain=1.0):
        return rng.standard_normal((rows, cols)) * (gain / np.sqrt(cols))

    def norm(n):
        return 1.0 + 0.2 * rng.standard_normal(n)

    w = {"model.embed_tokens.weight": 0.5 * rng.standard_normal((spec.vocab_rows, h))}
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(h)
        # q/k gain 1.5: attention scores of std ~2 so softmax is far from uniform.
        w[p + "self_attn.q_proj.weight"] = mat(qd, h, 1.5)
        w[p + "self_attn.k_proj.weight"] = mat(kd, h, 1.5)
        w[p + "self_attn.v_proj.weight"] = mat(kd, h)
        w[p + "self_attn.o_proj.weight"] = mat(h, qd)
        if spec.qkv_bias:
            w[p + "self_attn.q_proj.bias"] = 0.5 * rng.standard_normal(qd)
            w[p + "self_attn.k_proj.bias"] = 0.5 * rng.standard_normal(kd)
            w[p + "self_attn.v_proj.bias"] = 0.5 * rng.standard_normal(kd)
        if spec.qk_norm:
            w[p + "self_attn.q_norm.weight"] = norm(hd)
            w[p + "self_attn.k_norm.weight"] = norm(hd)
        w[p + "post_attention_layernorm.weight"] = norm(h)
        w[p + "mlp.gate_proj.weight"] = mat(f, h)
        w[p + "mlp.up_proj.weight"] = mat(f, h)
        w[p + "mlp.down_proj.weight"] = mat(h, f)
    w["model.norm.weight"] = norm(h)
    if not spec.tied:
        w["lm_head.weight"] = mat(spec.vocab_rows, h, 2.0)
    return {k: _round_to_storage(v, spec.dtype) for k, v in w.items()}


# ----------------------------------------------------------------------------------------------
# Hugging Face directory


def _hf_config(spec: TinySpec) -> dict:
    arch_class = {
        "llama": "LlamaForCausalLM",
        "qwen2": "Qwen2ForCausalLM",
        "qwen3": "Qwen3ForCausalLM",
    }
    torch_dtype = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}[spec.dtype]
    cfg = {
        "architectures": [arch_class[spec.model_type]],
        "model_type": spec.model_type,
        "hidden_size": spec.hidden,
        "intermediate_size": spec.ffn,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "hidden_act": "silu",
        "max_position_embeddings": spec.context,
        "rms_norm_eps": spec.rms_eps,
        "rope_theta": spec.rope_theta,
        "rope_scaling": spec.llama3_scaling,
        "tie_word_embeddings": spec.tied,
        "vocab_size": spec.vocab_rows,
        "bos_token_id": spec.bos_id,
        "eos_token_id": spec.eos_id,
        "torch_dtype": torch_dtype,
        "initializer_range": 0.02,
        "attention_dropout": 0.0,
        "use_cache": True,
        "transformers_version": "4.46.0",
    }
    if spec.model_type == "llama":
        cfg.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
    if spec.model_type in ("qwen2", "qwen3"):
        cfg.update(use_sliding_window=False, sliding_window=None, max_window_layers=spec.num_layers)
    if spec.model_type == "qwen3":
        cfg.update(attention_bias=False)
    if spec.head_dim != spec.hidden // spec.heads or spec.model_type == "qwen3":
        cfg["head_dim"] = spec.head_dim
    return cfg


def _save_safetensors(tensors: dict[str, np.ndarray], path: str, dtype: str) -> int:
    """Writes tensors in `dtype`; returns the number of data bytes."""
    from safetensors import TensorSpec, serialize_file

    keep = []
    specs = {}
    for name, x in tensors.items():
        if dtype == "F32":
            arr, st = np.ascontiguousarray(x, dtype="<f4"), "float32"
        elif dtype == "F16":
            arr, st = np.ascontiguousarray(x, dtype="<f2"), "float16"
        else:  # BF16: the top 16 bits of float32 values already rounded to bf16
            arr, st = np.ascontiguousarray((x.view(np.uint32) >> 16).astype("<u2")), "bfloat16"
        keep.append(arr)
        specs[name] = TensorSpec(
            dtype=st, shape=list(arr.shape), data_ptr=arr.ctypes.data, data_len=arr.nbytes
        )
    serialize_file(specs, path, metadata={"format": "pt"})
    return sum(a.nbytes for a in keep)


def write_hf(spec: TinySpec, weights: dict, tok, out_dir: str, sharded: bool = False) -> str:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(_hf_config(spec), f, indent=2)
    with open(os.path.join(out_dir, "tokenizer.json"), "w") as f:
        json.dump(_tokenizer_json(spec, tok), f, ensure_ascii=False, indent=2)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(_tokenizer_config(spec, tok), f, indent=2)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": spec.bos_id, "eos_token_id": spec.eos_id}, f, indent=2)
    if not sharded:
        _save_safetensors(weights, os.path.join(out_dir, "model.safetensors"), spec.dtype)
        return out_dir
    # Two shards split by layer, in the naming convention of transformers' save_pretrained;
    # the embedding goes to the second shard so loaders cannot rely on file order.
    names = list(weights)
    first = [n for n in names if n.startswith("model.layers.0.")]
    shards = {
        "model-00001-of-00002.safetensors": {n: weights[n] for n in first},
        "model-00002-of-00002.safetensors": {n: weights[n] for n in names if n not in first},
    }
    weight_map, total = {}, 0
    for file, tensors in shards.items():
        total += _save_safetensors(tensors, os.path.join(out_dir, file), spec.dtype)
        weight_map.update({n: file for n in tensors})
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
    return out_dir


# ----------------------------------------------------------------------------------------------
# GGUF


def permute_for_gguf(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py LlamaModel.permute: within each head, rows (j, j + d/2) -> (2j, 2j+1).

    For K, n_head is the number of KV heads.
    """
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


_HF_TO_GGUF = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def _gguf_name(hf_name: str) -> str:
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    if hf_name == "lm_head.weight":
        return "output.weight"
    parts = hf_name.split(".", 3)  # model, layers, N, rest
    return f"blk.{parts[2]}.{_HF_TO_GGUF[parts[3]]}"


def llama_cpp_rope_factors(spec: TinySpec) -> np.ndarray:
    """rope_freqs.weight [head_dim / 2] as convert_hf_to_gguf.py (LlamaModel) computes it.

    Written out per pair, the converter's way, on purpose: the reference's HF path uses the
    vectorised transformers formulation, so HF-vs-GGUF agreement cross-checks the two.
    """
    s = spec.llama3_scaling
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_context = s["original_max_position_embeddings"]
    low_freq_wavelen = old_context / low
    high_freq_wavelen = old_context / high
    factors = []
    for i in range(0, spec.head_dim, 2):
        freq = 1.0 / (spec.rope_theta ** (i / spec.head_dim))
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            factors.append(1.0)
        elif wavelen > low_freq_wavelen:
            factors.append(factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            factors.append(1.0 / ((1.0 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def write_gguf(spec: TinySpec, weights: dict, tok, path: str) -> str:
    import gguf
    from gguf.quants import quantize

    arch = spec.model_type
    w = gguf.GGUFWriter(path, arch)
    w.add_name(spec.name)
    w.add_type("model")
    w.add_block_count(spec.num_layers)
    w.add_context_length(spec.context)
    w.add_embedding_length(spec.hidden)
    w.add_feed_forward_length(spec.ffn)
    w.add_head_count(spec.heads)
    w.add_head_count_kv(spec.kv_heads)
    if spec.head_dim != spec.hidden // spec.heads:
        w.add_key_length(spec.head_dim)
        w.add_value_length(spec.head_dim)
    w.add_rope_freq_base(spec.rope_theta)
    w.add_layer_norm_rms_eps(spec.rms_eps)
    w.add_rope_dimension_count(spec.head_dim)
    w.add_vocab_size(spec.vocab_rows)
    file_type = {"F32": gguf.LlamaFileType.ALL_F32, "F16": gguf.LlamaFileType.MOSTLY_F16,
                 "BF16": gguf.LlamaFileType.MOSTLY_BF16}[spec.dtype]
    w.add_file_type(file_type)

    tokens, merges = _vocab_and_merges(tok)
    types = [
        gguf.TokenType.CONTROL if t in SPECIAL_TOKENS else gguf.TokenType.NORMAL for t in tokens
    ]
    # llama.cpp's converter pads the vocabulary to the embedding rows with unused [PAD] tokens.
    for i in range(len(tokens), spec.vocab_rows):
        tokens.append(f"[PAD{i}]")
        types.append(gguf.TokenType.UNUSED)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(spec.bos_id)
    w.add_eos_token_id(spec.eos_id)
    w.add_unk_token_id(0)
    w.add_pad_token_id(spec.eos_id)
    w.add_add_bos_token(spec.add_bos)
    w.add_chat_template(spec.chat_template)

    if spec.llama3_scaling is not None:
        w.add_tensor("rope_freqs.weight", llama_cpp_rope_factors(spec))

    for hf_name, x in weights.items():
        name = _gguf_name(hf_name)
        if arch == "llama" and (".attn_q." in name or ".attn_k." in name):
            x = permute_for_gguf(x, spec.heads if ".attn_q." in name else spec.kv_heads)
        if x.ndim == 1 or spec.dtype == "F32":
            # llama.cpp keeps norms and biases in F32 whatever the file type.
            w.add_tensor(name, np.ascontiguousarray(x, dtype=np.float32))
        elif spec.dtype == "F16":
            w.add_tensor(name, np.ascontiguousarray(x, dtype=np.float16))
        else:
            bf16 = gguf.GGMLQuantizationType.BF16
            raw = quantize(np.ascontiguousarray(x, dtype=np.float32), bf16)
            w.add_tensor(name, raw, raw_dtype=bf16)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Written:
    spec: TinySpec
    hf_dir: str
    gguf_path: str
    hf_sharded_dir: Optional[str] = None


def write_model(spec: TinySpec, out_dir: str) -> Written:
    tok = build_tokenizer(spec)
    weights = make_weights(spec)
    base = os.path.join(out_dir, spec.name)
    result = Written(
        spec=spec,
        hf_dir=write_hf(spec, weights, tok, os.path.join(base, "hf")),
        gguf_path=write_gguf(spec, weights, tok, os.path.join(out_dir, spec.name + ".gguf")),
    )
    if spec.sharded:
        result.hf_sharded_dir = write_hf(
            spec, weights, tok, os.path.join(base, "hf_sharded"), sharded=True
        )
    return result


def write_all(out_dir: str, drafts: bool = False) -> list[Written]:
    """Every model of SPECS (and of DRAFT_SPECS too with drafts=True) under out_dir."""
    os.makedirs(out_dir, exist_ok=True)
    return [write_model(spec, out_dir) for spec in SPECS + (DRAFT_SPECS if drafts else [])]


def sample_token_ids(spec: TinySpec, n: int, seed: int = 0) -> list[int]:
    """n random token ids over the whole tokenizer vocabulary (specials included)."""
    rng = np.random.default_rng(1000 + seed)
    return rng.integers(0, TOKENIZER_VOCAB, size=n).tolist()


def check(written: list[Written], num_tokens: int = 200, tol: float = 1e-5) -> bool:
    """Reference logits of every copy of every model agree; prints one line per model."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import llama_numpy

    ok = True
    for m in written:
        ids = sample_token_ids(m.spec, num_tokens)
        ref = llama_numpy.load_model(m.hf_dir).forward(ids)
        copies = {"gguf": m.gguf_path}
        if m.hf_sharded_dir:
            copies["hf_sharded"] = m.hf_sharded_dir
        for label, path in copies.items():
            other = llama_numpy.load_model(path).forward(ids)
            diff = float(np.abs(other - ref).max())
            good = diff <= tol and other.shape == ref.shape
            ok &= good
            print(f"{m.spec.name}: hf vs {label}: max|d|={diff:.3g} over {ids.__len__()} tokens, "
                  f"logit std {ref.std():.3g} -> {'ok' if good else 'FAIL'}")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--check", action="store_true", help="compare copies with the reference")
    args = ap.parse_args()
    written = write_all(args.out, drafts=True)
    for m in written:
        print(m.spec.name, m.hf_dir, m.gguf_path, m.hf_sharded_dir or "")
    if args.check and not check(written):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
