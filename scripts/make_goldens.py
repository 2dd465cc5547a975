#!/usr/bin/env python3
"""Generate the golden reference files for the Helios C++ tests.

What it does
------------
Runs an *independent* implementation -- llama.cpp through its Python binding
llama-cpp-python, plus the `gguf` Python package for dequantization -- on the
SmolLM2-135M-Instruct Q4_1 GGUF model and writes JSON reference data that the
C++ tests in tests/golden/ compare against:

  smollm2_tokenize.json    tokenizer ids for >=120 varied strings
  smollm2_greedy.json      64-token greedy continuations + top1-top2 margins
  smollm2_logits.json      top-5 logits at every position of 4 prompts
  smollm2_perplexity.json  perplexity of a ~500-token fixed text
  dequant.json             gguf-py dequantization of seeded random blocks
                           (F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K, Q5_0)

Every JSON file carries a "meta" object (llama-cpp-python version, model file
name + sha256, llama.cpp settings) so a regenerated file can be diffed.

When it is run
--------------
By hand, once (and again only if the model or the reference semantics
change). It is NEVER run in CI; the C++ tests only read the JSON it wrote.
The output is deterministic: no sampling, fixed seeds, fixed inputs.

Dependencies (outside the project's build)
------------------------------------------
    python3 -m venv /opt/golden-venv
    /opt/golden-venv/bin/pip install llama-cpp-python gguf numpy

Usage
-----
    /opt/golden-venv/bin/python scripts/make_goldens.py \
        --model models/SmolLM2-135M-Instruct.Q4_1.gguf --out tests/golden/data
"""

import argparse
import hashlib
import inspect
import json
import math
import os
import sys

import numpy as np

SHAREGPT = "/work/shared/data/sharegpt/mlenergy_ShareGPT_V3_filtered_1000_prompts.json"

N_CTX = 2048
N_THREADS = 2
N_BATCH = 512
SEED = 1234
GGML_TYPE_F32 = 0
GREEDY_STEPS = 64

DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------

def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_sharegpt():
    with open(SHAREGPT, encoding="utf-8") as f:
        data = json.load(f)
    # list of {"id", "conversations": [{"from": "human", "value": str}]}
    return [d["conversations"][0]["value"] for d in data]


def chatml(user, system=DEFAULT_SYSTEM):
    """The model's chat template (tokenizer.chat_template) rendered by hand,
    with add_generation_prompt=True."""
    return ("<|im_start|>system\n" + system + "<|im_end|>\n"
            "<|im_start|>user\n" + user + "<|im_end|>\n"
            "<|im_start|>assistant\n")


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


def make_llama(model_path, **extra):
    """llama.cpp on model_path with the goldens' settings; extra: more Llama() arguments."""
    import llama_cpp
    from llama_cpp import Llama

    params = inspect.signature(Llama.__init__).parameters
    kw = dict(model_path=model_path, n_ctx=N_CTX, n_threads=N_THREADS,
              n_threads_batch=N_THREADS, n_batch=N_BATCH, seed=SEED,
              verbose=False)
    settings = dict(n_ctx=N_CTX, n_threads=N_THREADS, n_threads_batch=N_THREADS,
                    n_batch=N_BATCH, seed=SEED)
    if "n_ubatch" in params:
        kw["n_ubatch"] = N_BATCH
        settings["n_ubatch"] = N_BATCH
    if "logits_all" in params:
        kw["logits_all"] = True
        settings["logits_all"] = True
    if "type_k" in params:
        kw["type_k"] = GGML_TYPE_F32
        kw["type_v"] = GGML_TYPE_F32
        settings["type_k"] = "GGML_TYPE_F32 (0)"
        settings["type_v"] = "GGML_TYPE_F32 (0)"
    if "flash_attn" in params:
        kw["flash_attn"] = False
        settings["flash_attn"] = False
    if "n_gpu_layers" in params:
        kw["n_gpu_layers"] = 0
        settings["n_gpu_layers"] = 0
    if "offload_kqv" in params:
        kw["offload_kqv"] = False
    for k in ("use_mmap",):
        if k in params:
            settings[k] = params[k].default
    llm = Llama(**kw, **extra)
    settings["backend"] = "CPU"
    settings["rope_freq_base"] = "from model (100000)"
    try:
        settings["system_info"] = llama_cpp.llama_print_system_info().decode().strip()
    except Exception:  # pragma: no cover
        pass
    return llm, settings


def eval_prompt(llm, ids):
    """Single eval of the whole prompt from a fresh state; returns the
    [len(ids), n_vocab] float32 logits (a copy)."""
    llm.reset()
    llm.eval(ids)
    assert llm.n_tokens == len(ids)
    return np.array(llm.scores[:len(ids), :], dtype=np.float32, copy=True)


def greedy_continuation(llm, prompt_ids, steps=GREEDY_STEPS):
    """Argmax (first index on ties) for `steps` tokens after prompt_ids, continuing past EOS;
    returns the ids and each step's top1-top2 logit margin."""
    llm.reset()
    llm.eval(prompt_ids)
    out_ids, margins = [], []
    for step in range(steps):
        row = np.array(llm.scores[llm.n_tokens - 1, :], dtype=np.float32)
        top2 = np.argpartition(-row, 2)[:2]
        tok = int(np.argmax(row))  # first index on exact ties
        other = int(top2[0]) if int(top2[0]) != tok else int(top2[1])
        out_ids.append(tok)
        margins.append(float(row[tok]) - float(row[other]))
        if step + 1 < steps:
            llm.eval([tok])
    return out_ids, margins


def top5_rows(logits):
    """[[id, logit] x5] per row, descending."""
    rows = []
    for row in logits:
        idx = np.argsort(-row, kind="stable")[:5]
        rows.append([[int(j), float(row[j])] for j in idx])
    return rows


def perplexity_of(llm, ids):
    """(perplexity, mean nll) of ids from one eval: exp(mean_{i>=1} -log softmax(logits[i-1])[ids[i]])
    in float64."""
    x = eval_prompt(llm, ids).astype(np.float64)[:-1]
    m = x.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(x - m).sum(axis=1))
    nll = lse - x[np.arange(len(ids) - 1), ids[1:]]
    mean_nll = float(nll.mean())
    return float(math.exp(mean_nll)), mean_nll


def selection(only):
    """want(k) for a --only comma list: everything when it is empty."""
    chosen = set(filter(None, only.split(",")))
    return lambda k: not chosen or k in chosen


# --------------------------------------------------------------------------
# 2. tokenizer
# --------------------------------------------------------------------------

def tokenize_texts(sg):
    t = []
    # plain English
    t += [
        "Hello",
        "Hello world",
        "Hello, world!",
        "The quick brown fox jumps over the lazy dog.",
        "I am a helpful assistant.",
        "What is the capital of France?",
        "Once upon a time, there was a little girl named Lily.",
        "hello HELLO Hello hElLo",
        "supercalifragilisticexpialidocious",
        "antidisestablishmentarianism and pneumonoultramicroscopicsilicovolcanoconiosis",
        "a",
        "A",
        "I",
        ".",
    ]
    # whitespace
    t += [
        "",
        " ",
        "  ",
        "   ",
        "                ",
        " Hello",
        "Hello ",
        "  Hello  world  ",
        "Hello   world",
        "\t",
        "\tHello\tworld\t",
        "\t\t\tx",
        "\n",
        "\n\n",
        "\n\n\n\n",
        "Hello\nworld",
        "Hello\n\nworld\n",
        "\r\n",
        "line1\r\nline2\r\n\r\nline3",
        "\r\n\r\n\r\n",
        " \n \t \r\n ",
        "end with newline\n",
        "a \n b",
        "   \n   leading spaces on a line",
    ]
    # digits & numbers
    t += [
        "0",
        "7",
        "42",
        "123",
        "2024",
        "1234567890",
        "3.14159265358979323846",
        "-273.15",
        "1,000,000",
        "1e-10 and 6.022e23",
        "0x7FFF_FFFF",
        "Call 555-123-4567 now",
        "In 1969, 3 astronauts flew 384400 km.",
        "12345678901234567890123456789012345678901234567890",
        "v1.2.3-rc4",
        "x2 + y2 = z2",
    ]
    # code
    t += [
        "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
        "class Foo:\n    def __init__(self, x):\n        self.x = x\n\n    def __repr__(self):\n        return f\"Foo({self.x!r})\"\n",
        "import numpy as np\nx = np.arange(10)[::-1]\nprint(x.sum())",
        "for i in range(10):\n\tprint(i)\n",
        "#include <iostream>\n\nint main() {\n    std::cout << \"Hello\" << std::endl;\n    return 0;\n}\n",
        "template <typename T>\nstd::vector<T> v{1, 2, 3};\nauto p = std::make_unique<int>(5);",
        "if (a != b && c >= d || !e) { x->y = z[0]; } // comment",
        "{\"name\": \"SmolLM\", \"layers\": 30, \"vocab\": [1, 2, 3], \"ok\": true, \"x\": null}",
        "{\n  \"key\": \"value\",\n  \"nested\": {\n    \"a\": [1.5, -2e3]\n  }\n}",
        "<!DOCTYPE html>\n<html>\n<head><title>Test</title></head>\n<body><p class=\"x\">Hi &amp; bye</p></body>\n</html>",
        "<div id='main'><a href=\"https://example.com/path?q=1&r=2\">link</a></div>",
        "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
        "fn main() { let v: Vec<u32> = (0..10).collect(); println!(\"{:?}\", v); }",
        "const f = async (x) => { await g(x); return x ?? 0; };",
        "$ ls -la | grep '.py' && echo \"done\" > /dev/null 2>&1",
        "    \n        indented\n    \n",
    ]
    # contractions
    t += [
        "It's, you're, we'll, I've, I'd, don't, can't, won't.",
        "IT'S YOU'RE WE'LL I'VE I'D DON'T",
        "John'S car and MARY'S book",
        "she'S 'll 're 've 'm 'd 's 't",
        "rock 'n' roll",
        "'quoted' and \"double quoted\"",
        "the dog's bone, the dogs' bones",
    ]
    # punctuation
    t += [
        "!!!",
        "???!!!...",
        "Wait... what?!",
        "-----",
        "==========",
        "***bold*** __under__ ~~strike~~",
        "(a[b{c}d]e)",
        "@#$%^&*()_+-=[]{}|;':\",./<>?`~",
        "email: john.doe@example.com, url: https://www.example.org/a/b.html",
        "—en–dash — em-dash… ellipsis",
        "«guillemets» „quotes“ 'single' “double”",
    ]
    # unicode
    t += [
        "café naïve résumé façade",
        "Ångström Øresund Æsir",
        "Straße Fußball größer",
        "ß",
        "Ελληνικά: Καλημέρα κόσμε",
        "Русский: Привет, мир!",
        "中文：你好，世界！",
        "日本語：こんにちは世界。カタカナ",
        "한국어: 안녕하세요 세계",
        "العربية: مرحبا بالعالم",
        "हिन्दी: नमस्ते दुनिया",
        "עברית: שלום עולם",
        "ไทย: สวัสดีชาวโลก",
        "Tiếng Việt: Xin chào thế giới",
        "😀",
        "I love 🍕 and 🍣!",
        "👨‍👩‍👧‍👦 family",
        "👩‍💻 🧑🏽‍🚀 👍🏻👍🏿",
        "🇫🇷 🇯🇵 🇺🇸",
        "❤️ ✔️ ☀️",
        "e\u0301 a\u0300 n\u0303 (combining marks)",
        "Z\u0351\u0308\u0347a\u0336l\u0337g\u0334o\u035c",
        "zero\u200bwidth\u200cnon\u200djoiner\ufeffbom",
        "\u00a0non-breaking\u00a0space",
        "mixed: Hello мир 世界 🌍 مرحبا",
        "∑∫∂√∞ ≤≥≠ ±×÷ αβγ",
        "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛",
        "\u0000nul and \u0007bell",
        "½ ¼ ² ³ ①②③",
    ]
    # special tokens in text
    t += [
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<|im_start|>user\nHi<|im_end|>\n",
        "<|im_start|>system\n" + DEFAULT_SYSTEM + "<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
        "Text before<|endoftext|>text after",
        "<|im_start|><|im_end|><|endoftext|>",
        " <|im_end|> ",
        "<|im_start",
        "<|unknown_token|>",
        "<|endoftext|><|endoftext|>",
    ]
    # real ShareGPT text
    t += [sg[0], sg[6], sg[26], sg[36], sg[8], sg[22], sg[28][:1500]]
    return t


SPECIAL_MARKERS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")


def tokenize_cases(llm, texts, has_special):
    """llama_tokenize of every text: with parse_special too where has_special(text), and a
    sprinkling of add_special=True (the models have add_bos_token=false, so llama.cpp adds
    nothing; the tests check that too). No (text, flags) pair twice."""
    cases, seen = [], set()

    def add(text, add_special, parse_special):
        key = (text, add_special, parse_special)
        if key in seen:
            return
        seen.add(key)
        ids = llm.tokenize(text.encode("utf-8"), add_bos=add_special, special=parse_special)
        cases.append({"text": text, "add_special": add_special,
                      "parse_special": parse_special, "ids": [int(i) for i in ids]})

    for i, text in enumerate(texts):
        special = has_special(text)
        if special:
            add(text, False, True)
        add(text, False, False)
        if i % 10 == 0 or text in ("", " ", "Hello", "<|im_end|>"):
            add(text, True, special)
    return cases


def make_tokenize(llm, meta, sg, out):
    cases = tokenize_cases(llm, tokenize_texts(sg), lambda t: any(m in t for m in SPECIAL_MARKERS))
    # sanity: round-trip of the detokenizer for a few plain cases
    for c in cases[:20]:
        if not c["parse_special"]:
            back = llm.detokenize(c["ids"]).decode("utf-8", errors="replace")
            assert back == c["text"], (back, c["text"])
    write_json(os.path.join(out, "smollm2_tokenize.json"),
               {"meta": dict(meta, add_special_note=
                             "add_special maps to llama_tokenize(add_special); the model has "
                             "tokenizer.ggml.add_bos_token=false so no BOS/EOS is added"),
                "cases": cases})
    return len(cases)


# --------------------------------------------------------------------------
# 3. greedy
# --------------------------------------------------------------------------

def greedy_prompts(sg):
    p = [
        ("Once upon a time, in a small village by the sea,", False),
        ("The capital of France is", False),
        ("Q: What is the boiling point of water at sea level?\nA:", False),
        ("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", False),
        ("Here is a list of five fruits:\n1.", False),
        ("12 + 35 = 47\n23 + 41 =", False),
        ("#include <stdio.h>\n\nint main(void) {\n", False),
        ("The three laws of thermodynamics are", False),
        ("Hello", False),
        (chatml("What is the capital of France?"), True),
        (chatml("Write a haiku about the ocean."), True),
        (chatml(sg[15]), True),
        (chatml(sg[37]), True),
        (sg[12], False),
        (sg[11], False),
    ]
    return p


def make_greedy(llm, meta, sg, out):
    cases = []
    global_min = (math.inf, None, None)
    for ci, (prompt, chat) in enumerate(greedy_prompts(sg)):
        prompt_ids = [int(i) for i in llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)]
        out_ids, margins = greedy_continuation(llm, prompt_ids)
        for step, margin in enumerate(margins):
            if margin < global_min[0]:
                global_min = (margin, ci, step)
        text = llm.detokenize(out_ids).decode("utf-8", errors="replace")
        cases.append({"prompt": prompt, "chat": chat, "prompt_ids": prompt_ids,
                      "output_ids": out_ids, "output_text": text,
                      "top2_margins": margins})
        print(f"greedy[{ci}] n_prompt={len(prompt_ids)} min_margin={min(margins):.4f} "
              f"text={text[:60]!r}")
    write_json(os.path.join(out, "smollm2_greedy.json"),
               {"meta": dict(meta, greedy="argmax over raw logits (first index on ties), "
                             "no penalties, 64 steps, continues past EOS; prompt_ids from "
                             "tokenize(add_special=False, parse_special=True)"),
                "cases": cases})
    return cases, global_min


# --------------------------------------------------------------------------
# 4. logits
# --------------------------------------------------------------------------

LOGITS_CODE = (
    "import numpy as np\n\n"
    "def softmax(x, axis=-1):\n"
    "    x = x - np.max(x, axis=axis, keepdims=True)\n"
    "    e = np.exp(x)\n"
    "    return e / np.sum(e, axis=axis, keepdims=True)\n"
)


def make_logits(llm, meta, sg, out):
    texts = [sg[11], sg[24], LOGITS_CODE, sg[25]]
    cases = []
    for text in texts:
        ids = [int(i) for i in llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)]
        ids = ids[:80]
        assert 20 <= len(ids) <= 80, len(ids)
        cases.append({"text": text, "prompt_ids": ids, "top5": top5_rows(eval_prompt(llm, ids))})
        print(f"logits: n={len(ids)}")
    write_json(os.path.join(out, "smollm2_logits.json"),
               {"meta": dict(meta, logits="one eval of the whole prompt; top-5 (id, raw logit) "
                             "at every position, descending"),
                "cases": cases})
    return len(cases)


# --------------------------------------------------------------------------
# 5. perplexity
# --------------------------------------------------------------------------

def make_perplexity(llm, meta, sg, out):
    text = "\n\n".join([sg[6], sg[12], sg[14], sg[22]])
    ids = [int(i) for i in llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)]
    assert 400 <= len(ids) <= N_BATCH, len(ids)
    ppl, mean_nll = perplexity_of(llm, ids)
    write_json(os.path.join(out, "smollm2_perplexity.json"),
               {"meta": dict(meta, perplexity="exp(mean_{i>=1} -log softmax(logits[i-1])[ids[i]]), "
                             "float64 numpy, logits from one eval of all ids"),
                "text": text, "ids": ids, "n_tokens": len(ids),
                "perplexity": ppl, "mean_nll": mean_nll})
    return len(ids), ppl, mean_nll


# --------------------------------------------------------------------------
# 6. dequant
# --------------------------------------------------------------------------

def make_dequant(meta, out):
    import gguf
    from gguf import quants
    QT = gguf.GGMLQuantizationType
    rng = np.random.default_rng(20240607)

    def f16_scale(n):
        # sane finite non-zero fp16 values, magnitude in [1e-3, 0.25], random sign
        mag = np.exp(rng.uniform(np.log(1e-3), np.log(0.25), n))
        sign = rng.choice([-1.0, 1.0], n)
        return (mag * sign).astype(np.float16)

    cases = []

    # F16: finite values + a few edge values (zeros, subnormals, max)
    v = (rng.standard_normal(60) * 4).astype(np.float16)
    edge = np.array([0.0, -0.0, 6.0e-8, 65504.0], dtype=np.float16)
    raw16 = np.concatenate([edge, v]).astype("<f2").view(np.uint8)
    cases.append(("F16", QT.F16, raw16))

    # BF16: top halves of float32 (round-to-nearest-even not needed: we store bits)
    f = np.concatenate([np.array([0.0, -0.0, 1.0, -3.5e38 / 2], dtype=np.float32),
                        (rng.standard_normal(60) * 10).astype(np.float32)])
    bits = (f.view(np.uint32) >> 16).astype("<u2")
    cases.append(("BF16", QT.BF16, bits.view(np.uint8)))

    def blocks(nblk, size, scale_offsets):
        b = rng.integers(0, 256, size=(nblk, size), dtype=np.uint8)
        for off in scale_offsets:
            s = f16_scale(nblk).astype("<f2").view(np.uint8).reshape(nblk, 2)
            b[:, off:off + 2] = s
        return b.reshape(-1)

    cases.append(("Q8_0", QT.Q8_0, blocks(3, 34, [0])))
    cases.append(("Q4_0", QT.Q4_0, blocks(3, 18, [0])))
    cases.append(("Q4_1", QT.Q4_1, blocks(3, 20, [0, 2])))
    cases.append(("Q4_K", QT.Q4_K, blocks(2, 144, [0, 2])))
    cases.append(("Q6_K", QT.Q6_K, blocks(2, 210, [208])))
    # Added later, after every earlier draw, so the cases above stay as they were.
    cases.append(("Q5_0", QT.Q5_0, blocks(3, 22, [0])))

    res = []
    for name, qt, raw in cases:
        bs, ts = gguf.GGML_QUANT_SIZES[qt]
        assert raw.size % ts == 0
        n = raw.size // ts * bs
        vals = quants.dequantize(raw.copy(), qt).astype(np.float32).reshape(-1)
        assert vals.size == n, (name, vals.size, n)
        assert np.all(np.isfinite(vals)), name
        res.append({"type": name, "type_id": int(qt.value), "n_elements": int(n),
                    "block_size": int(bs), "type_size": int(ts),
                    "bytes_hex": raw.tobytes().hex(),
                    "values": [float(x) for x in vals]})
        print(f"dequant {name}: {n} values, absmax={float(np.abs(vals).max()):.4g}")
    dmeta = {"generator": meta["generator"], "gguf_py_version": meta.get("gguf_py_version"),
             "numpy_version": np.__version__, "rng": "numpy default_rng(20240607)",
             "note": "quantized blocks are random bytes with every fp16 scale (d, dmin/m) "
                     "overwritten by finite values of magnitude in [1e-3, 0.25]"}
    write_json(os.path.join(out, "dequant.json"), {"meta": dmeta, "cases": res})
    return len(res)


# --------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--out", default="tests/golden/data")
    ap.add_argument("--only", default="", help="comma list: tokenize,greedy,logits,perplexity,dequant")
    args = ap.parse_args()
    want = selection(args.only)

    os.makedirs(args.out, exist_ok=True)
    try:
        from importlib.metadata import version
        gguf_ver = version("gguf")
    except Exception:
        gguf_ver = None
    meta = {"generator": "scripts/make_goldens.py", "gguf_py_version": gguf_ver,
            "numpy_version": np.__version__}

    if want("dequant"):
        make_dequant(meta, args.out)
    if not any(want(k) for k in ("tokenize", "greedy", "logits", "perplexity")):
        return

    import llama_cpp
    sg = load_sharegpt()
    llm, settings = make_llama(args.model)
    meta.update({
        "llama_cpp_python_version": llama_cpp.__version__,
        "model_file": os.path.basename(args.model),
        "model_sha256": sha256_file(args.model),
        "llama_cpp_settings": settings,
        "sharegpt_source": os.path.basename(SHAREGPT),
    })
    assert llm.n_vocab() == 49152

    if want("tokenize"):
        print("tokenize cases:", make_tokenize(llm, meta, sg, args.out))
    if want("logits"):
        print("logits cases:", make_logits(llm, meta, sg, args.out))
    if want("perplexity"):
        n, ppl, nll = make_perplexity(llm, meta, sg, args.out)
        print(f"perplexity: n_tokens={n} ppl={ppl:.6f} mean_nll={nll:.6f}")
    if want("greedy"):
        cases, gmin = make_greedy(llm, meta, sg, args.out)
        print(f"greedy cases: {len(cases)}; smallest top2 margin {gmin[0]:.6f} "
              f"(case {gmin[1]}, step {gmin[2]})")


if __name__ == "__main__":
    sys.exit(main())
