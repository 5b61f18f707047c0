"""A Hugging Face `tokenizers` tokenizer built from a GGUF file's byte-level BPE vocabulary.

The reference tokenization for GGUF models that ship no tokenizer.json: vocabulary and merges
come from the file (via the `gguf` package), the BPE algorithm and the pre-tokenizer from the
`tokenizers` library, so nothing is shared with the C++ tokenizer.
"""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

# tokenizer.ggml.token_type values (llama.cpp / gguf.TokenType).
_CONTROL = 3
_USER_DEFINED = 4


def _pre_tokenizer(pre: str):
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        # SmolLM2's tokenizer.json: every digit is its own pre-token, then the GPT-2 regex.
        return pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    if pre in ("default", "gpt2"):
        return byte_level
    raise NotImplementedError(f"tokenizer.ggml.pre {pre!r} is not supported by the reference")


def tokenizer_from_gguf_metadata(meta: dict) -> Tokenizer:
    """meta: GGUF metadata as returned in llama_numpy.Model.metadata."""
    if meta.get("tokenizer.ggml.model") != "gpt2":
        raise NotImplementedError("only byte-level BPE (tokenizer.ggml.model = gpt2) is supported")
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = list(meta["tokenizer.ggml.token_type"])
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = _pre_tokenizer(meta.get("tokenizer.ggml.pre", "default"))
    tok.decoder = decoders.ByteLevel()
    specials = [
        AddedToken(t, special=True, normalized=False)
        for t, ty in zip(tokens, types)
        if ty in (_CONTROL, _USER_DEFINED)
    ]
    tok.add_special_tokens(specials)
    return tok


def encode(meta: dict, text: str) -> list[int]:
    """Token ids of `text` as llama.cpp would produce them (BOS only if add_bos_token)."""
    ids = tokenizer_from_gguf_metadata(meta).encode(text, add_special_tokens=False).ids
    if meta.get("tokenizer.ggml.add_bos_token", False):
        ids = [int(meta["tokenizer.ggml.bos_token_id"])] + ids
    return ids


def tokenizer_from_gguf(path: str) -> Tokenizer:
    from gguf import GGUFReader

    reader = GGUFReader(path)
    meta = {k: f.contents() for k, f in reader.fields.items() if k.startswith("tokenizer.")}
    return tokenizer_from_gguf_metadata(meta)
