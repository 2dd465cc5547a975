#!/usr/bin/env python3
"""Golden reference files for the Qwen2.5-Coder pair (the `qwen2` architecture).

What it does
------------
Runs llama.cpp (through llama-cpp-python, as scripts/make_goldens.py does for SmolLM2) on
Qwen2.5-Coder-0.5B-Instruct and Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUFs that
`scripts/fetch_model.sh qwen-pair` fetches) and writes what tests/golden/qwen2_test.cpp checks:

  qwen2_tokenize.json              tokenizer ids for the SmolLM2 string set plus code snippets,
                                   Qwen's special tokens, FIM and tool-call markers (the two
                                   models share one tokenizer: the script checks that every id
                                   is the same with both), and what llama.cpp says of every
                                   added token (end of generation, control, printed text)
  qwen2.5-coder-0.5b_golden.json   per model: 64-token greedy continuations with the
  qwen2.5-coder-1.5b_golden.json   top1-top2 margin of every step, top-5 logits at every
                                   position of four prompts, perplexity of a fixed text

Each file carries a "meta" object (versions, model file and sha256, llama.cpp settings).

When it is run
--------------
By hand, once (and again only if a model or the reference semantics change); never in CI. The
output is deterministic: argmax only, fixed inputs.

Dependencies: the venv of scripts/make_goldens.py (llama-cpp-python 0.3.36, gguf, numpy); build
llama-cpp-python without AMX and for the CPU it runs on, e.g.
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \\
                -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" \\
        /opt/golden-venv/bin/pip install llama-cpp-python==0.3.36 gguf numpy

Usage
-----
    scripts/fetch_model.sh qwen-pair
    /opt/golden-venv/bin/python scripts/make_qwen_goldens.py --models-dir models --out tests/golden/data
"""

import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_goldens as mg  # noqa: E402  (the SmolLM2 generator: llama.cpp settings, helpers)

MODELS = [
    ("qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf"),
    ("qwen2.5-coder-1.5b", "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf"),
]
N_VOCAB = 151936
FIRST_ADDED_TOKEN = 151643  # <|endoftext|>; the added tokens and the padding follow it
QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
# Committed text (tests/data), so the perplexity text can be traced to files in the repository.
SHAREGPT_FIRST80 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data",
                                "sharegpt", "ShareGPT_V3_filtered_first80_prompts.json")


def chatml(user, system=QWEN_SYSTEM):
    """Qwen2.5-Coder's template (tokenizer.chat_template) rendered by hand for one user turn,
    no tools, add_generation_prompt=True."""
    return ("<|im_start|>system\n" + system + "<|im_end|>\n"
            "<|im_start|>user\n" + user + "<|im_end|>\n"
            "<|im_start|>assistant\n")


CODE_SNIPPETS = [
    "def quicksort(xs):\n    if len(xs) <= 1:\n        return xs\n    pivot, *rest = xs\n"
    "    return quicksort([x for x in rest if x < pivot]) + [pivot] + "
    "quicksort([x for x in rest if x >= pivot])\n",
    "@dataclass(frozen=True)\nclass Point:\n    x: float = 0.0\n    y: float = 0.0\n\n"
    "    def norm(self) -> float:\n        return math.hypot(self.x, self.y)\n",
    "async def fetch(session, url):\n    async with session.get(url, timeout=30) as r:\n"
    "        r.raise_for_status()\n        return await r.json()\n",
    "    # four spaces\n        # eight spaces\n\t# a tab\n\t\t# two tabs\n  \t mixed\n",
    "int add(int a, int b) { return a + b; }\r\nint main() { return add(40, 2); }\r\n",
    "template <typename T, size_t N>\nconstexpr size_t size(const T (&)[N]) noexcept { return N; }\n",
    "std::unordered_map<std::string, std::vector<int>> m{{\"a\", {1, 2}}, {\"b\", {}}};",
    "impl<T: Clone + Send> Worker<T> {\n    pub fn run(&mut self) -> Result<(), Box<dyn Error>> {\n"
    "        Ok(())\n    }\n}\n",
    "func (s *Server) Handle(w http.ResponseWriter, r *http.Request) {\n\tfmt.Fprintf(w, \"%d\\n\", 200)\n}\n",
    "export const sum = (xs: number[]): number => xs.reduce((a, b) => a + b, 0);\n",
    "SELECT u.id, COUNT(o.id) AS n\nFROM users u LEFT JOIN orders o ON o.user_id = u.id\n"
    "WHERE u.created_at >= '2024-01-01'\nGROUP BY u.id HAVING COUNT(o.id) > 10;\n",
    "#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.log; do gzip -9 \"$f\"; done\n",
    "server:\n  port: 50051\n  workers: 4\nmodels:\n  - name: qwen\n    path: ../models/q.gguf\n",
    "```python\nprint(\"hello\")\n```\n\nThen run `python3 hello.py`.",
    "--- a/x.py\n+++ b/x.py\n@@ -1,3 +1,3 @@\n-x = 1\n+x = 2\n y = 3\n",
    "pattern = re.compile(r\"^(?P<key>[A-Za-z_][\\w-]*)\\s*=\\s*(?P<val>.+?)\\s*$\")",
    "x = 0x7fffffff; y = 0b1010_1010; z = 1_000_000; w = 6.02214076e23; v = .5",
    "version 1.2.3-rc.4+build.5678, port 8080, 192.168.0.1, 2024-06-07T12:34:56Z",
    "# 计算斐波那契数列\ndef fib(n):  # 返回第 n 项\n    return n if n < 2 else fib(n-1) + fib(n-2)\n",
    "print(\"emoji 🚀 and ünïcödé in a string\")  # 日本語のコメント",
    "trailing spaces   \nand tabs\t\t\n\n\n\nmany blank lines",
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n\nprint(add(2, 3))<|fim_middle|>",
    "<|repo_name|>helios\n<|file_sep|>src/main.py\nimport sys\n<|file_sep|>README.md\n# Helios\n",
    "<|im_start|>system\n" + QWEN_SYSTEM + "<|im_end|>\n<|im_start|>user\nWrite hello world in C."
    "<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response><|im_end|>\n",
    "<|endoftext|><|im_end|><|object_ref_start|><|box_start|><|vision_pad|><|image_pad|>",
    "<|fim_pad|> <|repo_name|> <|file_sep|> <|video_pad|> <|quad_end|>",
    "<tool_call></tool_call><tool_call>",
    "1234567890 12 345 6789 007",
    "a1b22c333d4444",
    "٣٤٥ ½ ² ①",
]


def special_marker(text):
    return "<|" in text or "<tool_call>" in text or "</tool_call>" in text


def special_tokens(llm):
    """What llama.cpp makes of every token from <|endoftext|> on (the added tokens and the
    padding of the vocabulary to 151936), and of a few ordinary ones."""
    import llama_cpp
    vocab = llm._model.vocab
    buf = (llama_cpp.ctypes.c_char * 256)()

    def piece(t, special):
        n = llama_cpp.llama_token_to_piece(vocab, t, buf, len(buf), 0, special)
        assert n >= 0
        return bytes(buf[:n]).decode("utf-8", errors="replace")

    out = []
    for t in list(range(FIRST_ADDED_TOKEN, N_VOCAB)) + [0, 198, 271, 1350]:
        out.append({"id": t, "eog": bool(llama_cpp.llama_vocab_is_eog(vocab, t)),
                    "control": bool(llama_cpp.llama_vocab_is_control(vocab, t)),
                    "piece": piece(t, False), "piece_special": piece(t, True)})
    return out


def make_tokenize(llms, metas, sg, out):
    texts = mg.tokenize_texts(sg) + CODE_SNIPPETS
    cases = mg.tokenize_cases(llms[0], texts, special_marker)
    for llm, meta in zip(llms[1:], metas[1:]):
        other = mg.tokenize_cases(llm, texts, special_marker)
        assert other == cases, f"{meta['model_file']} tokenizes differently"
    specials = special_tokens(llms[0])
    for llm in llms[1:]:
        assert special_tokens(llm) == specials
    for c in cases[:40]:
        if not c["parse_special"]:
            back = llms[0].detokenize(c["ids"]).decode("utf-8", errors="replace")
            assert back == c["text"] or special_marker(c["text"]), (back, c["text"])
    meta = dict(metas[0], model_file=[m["model_file"] for m in metas],
                model_sha256=[m["model_sha256"] for m in metas],
                tokenize="llama_tokenize(text, add_special, parse_special); both models give "
                         "the same ids for every case (checked when generated)",
                special_tokens="ids >= 151643 and 0, 198, 271, 1350: llama_vocab_is_eog, "
                               "llama_vocab_is_control, llama_token_to_piece(special=false/true)")
    mg.write_json(os.path.join(out, "qwen2_tokenize.json"),
                  {"meta": meta, "cases": cases, "special_tokens": specials})
    return len(cases)


def greedy_prompts(sg):
    return [
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
        "#include <stdio.h>\n\nint main(void) {\n",
        "// Returns true when n is prime.\nfunction isPrime(n) {\n",
        "class Stack:\n    def __init__(self):\n",
        "fn main() {\n    let v: Vec<i32> = ",
        "SELECT name, COUNT(*) AS n FROM orders\n",
        "The capital of France is",
        "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n\nprint(add(2, 3))<|fim_middle|>",
        chatml("Write a Python function that reverses a string."),
        chatml("What is the difference between a list and a tuple in Python?"),
        chatml("Explain what a mutex is in one paragraph."),
        chatml(sg[15]),
    ]


def make_greedy(llm, sg):
    cases, smallest = [], math.inf
    for prompt in greedy_prompts(sg):
        prompt_ids = [int(i) for i in llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)]
        out_ids, margins = mg.greedy_continuation(llm, prompt_ids)
        smallest = min(smallest, min(margins))
        text = llm.detokenize(out_ids).decode("utf-8", errors="replace")
        cases.append({"prompt": prompt, "prompt_ids": prompt_ids, "output_ids": out_ids,
                      "output_text": text, "top2_margins": margins})
        print(f"  greedy n_prompt={len(prompt_ids)} min_margin={min(margins):.4f} text={text[:50]!r}")
    return cases, smallest


LOGITS_CPP = (
    "#include <vector>\n\n"
    "int sum(const std::vector<int>& v) {\n"
    "  int s = 0;\n"
    "  for (int x : v) s += x;\n"
    "  return s;\n"
    "}\n"
)


def make_logits(llm, sg):
    texts = [mg.LOGITS_CODE, LOGITS_CPP, sg[11], chatml("How do I read a file line by line in Python?")]
    cases = []
    for text in texts:
        ids = [int(i) for i in llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)][:80]
        assert 20 <= len(ids) <= 80, len(ids)
        cases.append({"text": text, "prompt_ids": ids, "top5": mg.top5_rows(mg.eval_prompt(llm, ids))})
    return cases


PERPLEXITY_CODE = '''\
import heapq
from collections import defaultdict


def dijkstra(graph, source):
    """Shortest distances from source in a graph of non-negative edge weights.

    graph maps a node to a list of (neighbour, weight) pairs.
    """
    dist = defaultdict(lambda: float("inf"))
    dist[source] = 0
    queue = [(0, source)]
    while queue:
        d, node = heapq.heappop(queue)
        if d > dist[node]:
            continue
        for neighbour, weight in graph.get(node, ()):
            nd = d + weight
            if nd < dist[neighbour]:
                dist[neighbour] = nd
                heapq.heappush(queue, (nd, neighbour))
    return dict(dist)


if __name__ == "__main__":
    g = {"a": [("b", 1), ("c", 4)], "b": [("c", 2), ("d", 5)], "c": [("d", 1)]}
    print(dijkstra(g, "a"))
'''


def perplexity_text():
    with open(SHAREGPT_FIRST80, encoding="utf-8") as f:
        sg80 = [d["conversations"][0]["value"] for d in json.load(f)]
    return "\n\n".join([sg80[6], PERPLEXITY_CODE])


def make_perplexity(llm):
    text = perplexity_text()
    ids = [int(i) for i in llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)]
    assert 300 <= len(ids) <= mg.N_BATCH, len(ids)
    ppl, mean_nll = mg.perplexity_of(llm, ids)
    return {"text": text, "ids": ids, "n_tokens": len(ids), "perplexity": ppl, "mean_nll": mean_nll,
            "source": "tests/data/sharegpt/ShareGPT_V3_filtered_first80_prompts.json entry 6 "
                      "and a Python snippet (scripts/make_qwen_goldens.py)"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--models-dir", default="models")
    ap.add_argument("--out", default="tests/golden/data")
    ap.add_argument("--only", default="", help="comma list: tokenize,model")
    args = ap.parse_args()
    want = mg.selection(args.only)

    import llama_cpp
    from importlib.metadata import version
    sg = mg.load_sharegpt()
    llms, metas = [], []
    for name, file in MODELS:
        path = os.path.join(args.models_dir, file)
        if not os.path.exists(path):
            sys.exit(f"{path} is missing: run scripts/fetch_model.sh {name}")
        llm, settings = mg.make_llama(path)
        settings["rope_freq_base"] = "from model (1000000)"
        assert llm.n_vocab() == N_VOCAB
        llms.append(llm)
        metas.append({"generator": "scripts/make_qwen_goldens.py",
                      "llama_cpp_python_version": llama_cpp.__version__,
                      "gguf_py_version": version("gguf"), "numpy_version": np.__version__,
                      "model": name, "model_file": file, "model_sha256": mg.sha256_file(path),
                      "llama_cpp_settings": settings,
                      "sharegpt_source": os.path.basename(mg.SHAREGPT)})
    os.makedirs(args.out, exist_ok=True)
    if want("tokenize"):
        print("tokenize cases:", make_tokenize(llms, metas, sg, args.out))
    if not want("model"):
        return
    for (name, _), llm, meta in zip(MODELS, llms, metas):
        print(name)
        greedy, smallest = make_greedy(llm, sg)
        logits = make_logits(llm, sg)
        ppl = make_perplexity(llm)
        print(f"  smallest greedy margin {smallest:.4f}; perplexity {ppl['perplexity']:.4f} "
              f"over {ppl['n_tokens']} tokens")
        meta = dict(meta, greedy="argmax over raw logits (first index on ties), 64 steps, past EOS; "
                    "prompt_ids from tokenize(add_special=False, parse_special=True)",
                    logits="one eval of the whole prompt (parse_special=True); top-5 (id, raw "
                    "logit) at every position, descending",
                    perplexity="exp(mean_{i>=1} -log softmax(logits[i-1])[ids[i]]), float64, one eval")
        mg.write_json(os.path.join(args.out, f"{name}_golden.json"),
                      {"meta": meta, "greedy": greedy, "logits": logits, "perplexity": ppl})


if __name__ == "__main__":
    sys.exit(main())
