"""Token ids from ridgeserve's tokenizer == Hugging Face `tokenizers` on SmolLM2's vocabulary.

The reference tokenizer.json is built here from the GGUF's own metadata (gguf.GGUFReader:
tokens, merges, token types) with SmolLM2's pre-tokenizer (Digits(individual) + ByteLevel), so
the comparison checks ridgeserve's BPE, regexes and special-token handling, not a copy of its
own loader. The corpus: text files on the machine (licenses, vim docs, the KJV bible, C/C++
headers) plus a generated multilingual / emoji / whitespace / digit / special-token corpus.

Checks, for Tokenizer::FromGguf (the real model file) and Tokenizer::FromHfDir (the
tokenizer.json written here):
  * ids identical to tokenizers, with parse_special (tokenizers' default) and without it
    (tokenizers' encode_special_tokens = True);
  * Decode(Encode(text)) == text;
  * the Llama 3 and Qwen2 pre-tokenizer regexes (Split + ByteLevel without regex), on the same
    vocabulary, against tokenizers through FromHfDir.
Exits nonzero on any mismatch, printing the first ones with context.
"""

import glob
import json
import os
import random
import subprocess
import sys
import tempfile
import time

import gguf
import tokenizers

BIN = os.environ["RIDGESERVE_BIN"]
MODEL = os.environ["RIDGESERVE_DEFAULT_MODEL"]
DUMP = os.path.join(BIN, "tokenize_dump")

GPT2_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                   "use_regex": True}
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


# ----------------------------------------------------------------------------- reference
def read_gguf_vocab(path):
    reader = gguf.GGUFReader(path)
    fields = reader.fields

    def get(key):
        return fields[key].contents() if key in fields else None

    return {
        "tokens": get("tokenizer.ggml.tokens"),
        "types": get("tokenizer.ggml.token_type"),
        "merges": get("tokenizer.ggml.merges"),
        "pre": get("tokenizer.ggml.pre"),
        "bos": get("tokenizer.ggml.bos_token_id"),
        "eos": get("tokenizer.ggml.eos_token_id"),
        "chat_template": get("tokenizer.chat_template"),
    }


def tokenizer_json(vocab, pre_tokenizer, ignore_merges=False, digit_pairs=False):
    tokens = list(vocab["tokens"])
    merges = [m.split(" ", 1) for m in vocab["merges"]]
    if digit_pairs:
        # SmolLM2 has single-digit tokens only; two-digit tokens make the regexes' digit
        # grouping (\p{N}{1,3} vs \p{N}) visible in the ids.
        for a in "0123456789":
            for b in "0123456789":
                merges.append([a, b])
                tokens.append(a + b)
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True}
             for i, (t, ty) in enumerate(zip(tokens, vocab["types"])) if ty == 3]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None,
            "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": False,
            "byte_fallback": False, "ignore_merges": ignore_merges,
            "vocab": {t: i for i, t in enumerate(tokens)},
            "merges": merges,
        },
    }


SMOLLM_PRE = {"type": "Sequence", "pretokenizers": [
    {"type": "Digits", "individual_digits": True}, GPT2_BYTE_LEVEL]}


def split_pre(regex):
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
         "use_regex": False}]}


# ----------------------------------------------------------------------------- corpus
def read_text(path, limit=None):
    try:
        with open(path, "rb") as f:
            data = f.read(limit) if limit else f.read()
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def file_corpus():
    docs = []
    for path in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.isfile(path):
            text = read_text(path)
            if text:
                docs.append(("license " + os.path.basename(path), text))
    vim = sorted(glob.glob("/usr/share/vim/vim90/doc/*.txt"))
    budget = 200_000
    for path in vim[::7]:
        text = read_text(path, 40_000)
        if text and budget > 0:
            docs.append(("vim " + os.path.basename(path), text))
            budget -= len(text)
    try:
        bible = subprocess.run(["bible", "-p", "/usr/lib", "gen1:1-gen10:32"],
                               capture_output=True, timeout=60, check=True).stdout
        docs.append(("bible gen1-10", bible.decode("utf-8")))
    except (OSError, subprocess.SubprocessError, UnicodeDecodeError):
        print("note: bible-kjv not available, skipping it")
    headers = ["stdio.h", "stdlib.h", "string.h", "math.h", "pthread.h", "c++/12/bits/stl_vector.h",
               "c++/12/bits/basic_string.h", "pcre2.h", "nlohmann/json.hpp"]
    budget = 150_000
    for name in headers:
        text = read_text(os.path.join("/usr/include", name), 40_000)
        if text and budget > 0:
            docs.append(("header " + name, text))
            budget -= len(text)
    return docs


WORDS = [
    # English, with contractions in several cases and apostrophes
    "the", "quick", "brown", "fox", "don't", "I'm", "they'll", "we've", "she'd", "it's", "IT'S",
    "You'RE", "WE'VE", "o'clock", "rock'n'roll", "'tis", "’s", "can’t", "'ſ", "ſtraße",
    # Latin scripts with accents
    "café", "naïve", "über", "Straße", "façade", "mañana", "São", "Paulo", "Ærø", "Łódź",
    "Việt", "Nam", "tiếng", "İstanbul", "ǅemal", "ﬁnancial",
    # Greek, Cyrillic, Armenian, Georgian
    "Ελληνικά", "αβγ", "Русский", "язык", "Україна", "Հայերեն", "ქართული",
    # RTL and Indic, Thai
    "العربية", "مرحبا", "עברית", "שלום", "हिन्दी", "नमस्ते", "বাংলা", "தமிழ்", "ภาษาไทย",
    # CJK
    "日本語", "のテキスト", "カタカナ", "ｶﾀｶﾅ", "中文", "测试文本", "繁體中文", "한국어", "텍스트",
    # combining marks and zalgo
    "e\u0301", "a\u0308o\u0308", "Z\u0324\u0354\u0367\u0311a\u0356\u0308l\u036eg\u0317o",
    # code-ish
    "std::vector<int>", "->", "=>", "!==", "x+=1;", "foo_bar", "CamelCase", "__init__",
    "0x1F", "1e-5", "3.14159", "#include", "/usr/bin/env", "https://example.com/a?b=c&d=e",
]
EMOJI = ["😀", "👍", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷", "🇯🇵", "❤️", "🧑🏿‍💻", "👩‍❤️‍💋‍👨",
         "🐈‍⬛", "🤷‍♀️", "✊🏾", "🫠", "©", "™", "☃"]
DIGITS = ["0", "7", "42", "1234567890", "٣٤٥", "०१२", "１２３", "²³", "½", "¾", "Ⅻ", "Ⅳ", "①②",
          "𝟘𝟙", "߁", "፲"]
SPACES = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r", "\v", "\f", " \n ",
          "\u00a0", "\u2003", "\u3000", "\u180e", "\u200b", "\u2028", "\u2029", "\u0085",
          "\u1680", "\u202f", "\u205f", "\ufeff", " \t \n\t  "]
PUNCT = list(".,;:!?-—–()[]{}<>\"'`~@#$%^&*_+=|\\/…«»„“”‘’¡¿·•") + ["...", "?!", "--", "''"]
# Control characters and 4-byte characters whose lead byte has no symbol in SmolLM2's
# vocabulary (0x04, 0x1D, 0xF1): tokenizers drops such bytes; so must we.
CONTROL = ["\x00", "\x04", "\x1d", "\x7f", "\x1b[0m", "\U00050000", "\U000f0000", "\ud7ff"]
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>", "<file_sep>",
            "<|im_sta", "<|", "|>", "<<|im_end|>|>", "<|im_start|><|im_end|>",
            "<jupyter_code>", "<|endoftext|>\n"]


def generated_corpus(rng):
    docs = []
    categories = [(WORDS, 10), (EMOJI, 2), (DIGITS, 3), (SPACES, 6), (PUNCT, 4), (SPECIALS, 1),
                  (CONTROL, 1)]
    pools = [c for c, w in categories for _ in range(w)]
    for n in range(900):
        parts = []
        for _ in range(rng.randint(5, 120)):
            pool = rng.choice(pools)
            parts.append(rng.choice(pool))
            if rng.random() < 0.6:
                parts.append(" ")
        docs.append((f"generated #{n}", "".join(parts)))
    # Runs that stress the regex lookahead and the merge loop.
    docs.append(("5000 spaces", " " * 5000 + "x"))
    docs.append(("spaces then newline", "a" + " " * 300 + "\n" + " " * 7 + "b"))
    docs.append(("mixed whitespace run", "".join(rng.choice(SPACES) for _ in range(3000))))
    docs.append(("trailing spaces", "end of line   \n   \n\t\t"))
    docs.append(("3000 newlines", "\n" * 3000))
    docs.append(("long digits", "".join(rng.choice("0123456789") for _ in range(2000))))
    docs.append(("long word", "a" * 3000))
    docs.append(("long mixed word", "".join(rng.choice("abcdefgh") for _ in range(4000))))
    docs.append(("base64", "".join(rng.choice(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/") for _ in range(3000))))
    docs.append(("cjk paragraph", "".join(rng.choice("的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长") for _ in range(3000))))
    docs.append(("emoji run", "".join(rng.choice(EMOJI) for _ in range(500))))
    docs.append(("chatml", "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n"
                 "What's 2+2?<|im_end|>\n<|im_start|>assistant\n"))
    docs.append(("empty", ""))
    docs.append(("single space", " "))
    return docs


# ----------------------------------------------------------------------------- comparison
def write_records(path, docs):
    with open(path, "wb") as f:
        for _, text in docs:
            data = text.encode("utf-8")
            f.write(b"%d\n" % len(data))
            f.write(data)
            f.write(b"\n")


def read_records(path):
    out = []
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    while pos < len(data):
        nl = data.index(b"\n", pos)
        n = int(data[pos:nl])
        out.append(data[nl + 1:nl + 1 + n])
        pos = nl + 1 + n + 1
    return out


def run_dump(source_flag, docs_path, workdir, tag, parse_special):
    ids_path = os.path.join(workdir, f"{tag}.ids")
    dec_path = os.path.join(workdir, f"{tag}.dec")
    cmd = [DUMP, source_flag, f"--input={docs_path}", f"--ids_out={ids_path}",
           f"--decoded_out={dec_path}", f"--parse_special={int(parse_special)}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    sys.stdout.write(f"  [{tag}] {proc.stderr.strip()}\n")
    if proc.returncode != 0:
        raise SystemExit(f"FAIL: {' '.join(cmd)} exited {proc.returncode}")
    with open(ids_path) as f:
        ids = [[int(x) for x in line.split()] for line in f.read().split("\n")[:-1]]
    return ids, read_records(dec_path)


def describe_mismatch(name, text, ours, ref, hf):
    i = next((k for k in range(min(len(ours), len(ref))) if ours[k] != ref[k]),
             min(len(ours), len(ref)))
    lo = max(0, i - 3)

    def show(ids):
        return [f"{t}:{hf.id_to_token(t)!r}" for t in ids[lo:i + 4]]

    prefix = hf.decode(ref[:i])
    return (f"    doc {name!r}: first difference at token {i} (ours {len(ours)} ids, "
            f"tokenizers {len(ref)})\n      text near it: {text[len(prefix) - 20:len(prefix) + 30]!r}\n"
            f"      ours:       {show(ours)}\n      tokenizers: {show(ref)}")


def compare(tag, docs, ours, ref, hf, failures):
    bad = [k for k in range(len(docs)) if ours[k] != ref[k]]
    total = sum(len(r) for r in ref)
    print(f"  [{tag}] {len(docs)} docs, {total} tokens: {len(bad)} docs differ")
    for k in bad[:5]:
        failures.append(f"[{tag}] ids differ\n" + describe_mismatch(docs[k][0], docs[k][1],
                                                                   ours[k], ref[k], hf))
    if len(bad) > 5:
        failures.append(f"[{tag}] ... and {len(bad) - 5} more docs differ")


def gpt2_byte_symbols():
    """GPT-2's bytes_to_unicode, as published with GPT-2's encoder.py."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) +
          list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def check_round_trip(tag, docs, decoded, missing_bytes, failures):
    # Bytes whose symbol the vocabulary lacks are dropped by BPE (tokenizers does the same).
    def expected(text):
        return bytes(b for b in text.encode("utf-8") if b not in missing_bytes)

    bad = [k for k in range(len(docs)) if decoded[k] != expected(docs[k][1])]
    print(f"  [{tag}] round trip Decode(Encode(text)) == text: {len(docs) - len(bad)}/{len(docs)}")
    for k in bad[:3]:
        failures.append(f"[{tag}] round trip differs for doc {docs[k][0]!r}: "
                        f"{decoded[k][:80]!r} vs {docs[k][1][:80]!r}")


def reference_ids(hf, docs, parse_special):
    hf.encode_special_tokens = not parse_special
    start = time.time()
    out = [e.ids for e in hf.encode_batch([t for _, t in docs], add_special_tokens=False)]
    print(f"  tokenizers: {time.time() - start:.2f} s")
    return out


def main():
    if not os.path.exists(MODEL):
        raise SystemExit(f"FAIL: model {MODEL} missing (make model)")
    vocab = read_gguf_vocab(MODEL)
    assert vocab["pre"] == "smollm", vocab["pre"]
    rng = random.Random(20240611)
    file_docs = file_corpus()
    gen_docs = generated_corpus(rng)
    docs = file_docs + gen_docs
    size = sum(len(t.encode("utf-8")) for _, t in docs)
    print(f"corpus: {len(file_docs)} file docs + {len(gen_docs)} generated docs, {size} bytes")
    if size < 200_000:
        raise SystemExit(f"FAIL: corpus only {size} bytes")

    token_set = set(vocab["tokens"])
    missing = {b for b, c in gpt2_byte_symbols().items() if c not in token_set}
    print(f"bytes without a symbol in the vocabulary: {sorted(missing)}")
    failures = []
    with tempfile.TemporaryDirectory() as workdir:
        smol = tokenizer_json(vocab, SMOLLM_PRE)
        hf = tokenizers.Tokenizer.from_str(json.dumps(smol))
        # The reference must treat control tokens as tokenizers would for SmolLM2.
        assert hf.encode("<|im_start|>user", add_special_tokens=False).ids[0] == 1
        hf_dir = os.path.join(workdir, "smollm")
        os.makedirs(hf_dir)
        with open(os.path.join(hf_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(smol, f, ensure_ascii=False)
        with open(os.path.join(hf_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump({"bos_token": vocab["tokens"][vocab["bos"]],
                       "eos_token": vocab["tokens"][vocab["eos"]],
                       "chat_template": vocab["chat_template"]}, f)
        docs_path = os.path.join(workdir, "docs.rec")
        write_records(docs_path, docs)

        for parse_special in (True, False):
            print(f"SmolLM2, parse_special={parse_special}")
            ref = reference_ids(hf, docs, parse_special)
            for source, flag in (("gguf", f"--gguf={MODEL}"), ("hf_dir", f"--hf_dir={hf_dir}")):
                tag = f"{source} special={int(parse_special)}"
                ours, decoded = run_dump(flag, docs_path, workdir, tag, parse_special)
                compare(tag, docs, ours, ref, hf, failures)
                check_round_trip(tag, docs, decoded, missing, failures)

        # Other pre-tokenizers on the same vocabulary, through tokenizer.json only.
        gen_path = os.path.join(workdir, "generated.rec")
        write_records(gen_path, gen_docs)
        variants = (("llama3", split_pre(LLAMA3_REGEX), True),
                    ("qwen2", split_pre(QWEN2_REGEX), False),
                    ("gpt2 add_prefix_space", dict(GPT2_BYTE_LEVEL, add_prefix_space=True),
                     False))
        for name, pre, ignore_merges in variants:
            print(f"{name} pre-tokenizer on SmolLM2's vocabulary (+ two-digit tokens)")
            spec = tokenizer_json(vocab, pre, ignore_merges, digit_pairs=True)
            variant = tokenizers.Tokenizer.from_str(json.dumps(spec))
            vdir = os.path.join(workdir, name.replace(" ", "_"))
            os.makedirs(vdir)
            with open(os.path.join(vdir, "tokenizer.json"), "w", encoding="utf-8") as f:
                json.dump(spec, f, ensure_ascii=False)
            ref = reference_ids(variant, gen_docs, True)
            ours, decoded = run_dump(f"--hf_dir={vdir}", gen_path, workdir,
                                     name.replace(" ", "_"), True)
            compare(name, gen_docs, ours, ref, variant, failures)
            if not pre.get("add_prefix_space"):
                check_round_trip(name, gen_docs, decoded, missing, failures)

    if failures:
        print("\nFAILURES:")
        print("\n".join(failures))
        sys.exit(1)
    print("OK: ids identical to tokenizers and round trips exact")


if __name__ == "__main__":
    main()
