#!/usr/bin/env python3
"""Reference logits for rope scaling (Llama 3.1's rope_freqs.weight, linear, YaRN), computed by llama.cpp.

Writes tests/golden/data/rope_scaling.json: the logits llama.cpp gives at every 16th position (and
the last) of a fixed 160-token sequence on seeded synthetic models that `helios make-synthetic`
writes (F32 weights, rope base 500000, 4 heads of 16): plain, with --llama3-rope, with
--rope-linear 4, with --rope-yarn 4 (original context 4096), and with --rope-yarn 8 (original
context 1024, --rope-attn-factor 0.8) after Llama 3's divisors. The models are not stored:
tests/golden/rope_scaling_test.cpp writes the same files through make_synthetic_model with the spec
recorded here and compares Helios's logits with these.

llama.cpp runs with F32 K/V caches and without flash attention, so the only differences left are
the order of float sums.

With --qwen PATH (Qwen2.5-Coder-0.5B-Instruct, `scripts/fetch_model.sh qwen2.5-coder-0.5b`) it also
writes tests/golden/data/qwen2_yarn.json: that model with Qwen2.5's long-context recipe (YaRN by 4
over an original context of 32768, given to llama.cpp as metadata overrides): the top-5 logits at
every position and the perplexity of the Qwen golden's perplexity text, and the perplexity without
the scaling, for tests/qwen/qwen2_yarn_test.cpp, which writes a copy of the file with the same keys.

Run by hand after a build (never in CI):

    python3 -m venv /opt/golden-venv
    /opt/golden-venv/bin/pip install numpy llama-cpp-python
    /opt/golden-venv/bin/python scripts/make_rope_goldens.py --helios build/helios --out tests/golden/data \
        [--qwen models/Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

SPEC = {"preset": "tiny", "rope_base": 500000.0, "type": "F32", "untied": True, "seed": 7}
# Ids of the synthetic byte-level vocabulary (512 entries; 0-2 are unk, bos, eos): bos, then a
# seeded walk over the rest, long enough that the slow pairs turn by a visible angle.
TOKENS = [1] + [int(3 + (t * 193 + 71) % 509) for t in range(159)]
ROWS = list(range(0, len(TOKENS), 16)) + [len(TOKENS) - 1]
# The scalings: make-synthetic's options for each, as the golden records them.
MODELS = [
    {"llama3_rope": False, "scaling": "none", "factor": 0, "original_ctx": 0, "attn_factor": 0},
    {"llama3_rope": True, "scaling": "none", "factor": 0, "original_ctx": 0, "attn_factor": 0},
    {"llama3_rope": False, "scaling": "linear", "factor": 4, "original_ctx": 0, "attn_factor": 0},
    {"llama3_rope": False, "scaling": "yarn", "factor": 4, "original_ctx": 4096, "attn_factor": 0},
    {"llama3_rope": True, "scaling": "yarn", "factor": 8, "original_ctx": 1024, "attn_factor": 0.8},
]


def write_model(helios, path, m):
    cmd = [helios, "make-synthetic", "--preset", SPEC["preset"], "--rope-base", str(SPEC["rope_base"]),
           "--type", SPEC["type"], "--seed", str(SPEC["seed"]), "--out", path]
    if SPEC["untied"]:
        cmd.append("--untied")
    if m["llama3_rope"]:
        cmd.append("--llama3-rope")
    if m["scaling"] != "none":
        cmd += [f"--rope-{m['scaling']}", str(m["factor"])]
    if m["original_ctx"]:
        cmd += ["--rope-original-ctx", str(m["original_ctx"])]
    if m["attn_factor"]:
        cmd += ["--rope-attn-factor", str(m["attn_factor"])]
    subprocess.run(cmd, check=True, capture_output=True)


def logits_of(path):
    from llama_cpp import Llama

    f32 = 0  # GGML_TYPE_F32
    llm = Llama(model_path=path, n_ctx=256, n_batch=256, logits_all=True, type_k=f32, type_v=f32,
                flash_attn=False, n_threads=2, verbose=False)
    llm.eval(TOKENS)
    return np.array(llm.scores[: len(TOKENS)], dtype=np.float32)[ROWS]


# Qwen2.5's YaRN recipe (its model cards' rope_scaling), as llama.cpp's converter writes it.
QWEN_YARN = {"qwen2.rope.scaling.type": "yarn", "qwen2.rope.scaling.factor": 4.0,
             "qwen2.rope.scaling.original_context_length": 32768}


def make_qwen_yarn(path, out_dir):
    import make_goldens as mg
    import make_qwen_goldens as qg

    plain, settings = mg.make_llama(path)
    ids = [int(i) for i in plain.tokenize(qg.perplexity_text().encode("utf-8"), add_bos=False, special=False)]
    ppl_plain, _ = mg.perplexity_of(plain, ids)
    del plain
    llm, _ = mg.make_llama(path, kv_overrides=QWEN_YARN)
    logits = mg.eval_prompt(llm, ids)
    ppl, _ = mg.perplexity_of(llm, ids)
    print(f"qwen2 yarn: perplexity {ppl:.4f} over {len(ids)} tokens (without the scaling {ppl_plain:.4f})")
    assert abs(ppl - ppl_plain) > 0.02 * ppl_plain, "the scaling should move perplexity by more than 2 %"
    out = os.path.join(out_dir, "qwen2_yarn.json")
    settings.pop("rope_freq_base", None)  # make_goldens' note for SmolLM2; this model's is in its file
    meta = dict(settings, model_file=os.path.basename(path), model_sha256=mg.sha256_file(path),
                kv_overrides=QWEN_YARN, source="llama.cpp via llama-cpp-python (scripts/make_rope_goldens.py)")
    mg.write_json(out, {"meta": meta, "keys": QWEN_YARN, "ids": ids, "top5": mg.top5_rows(logits),
                        "perplexity": ppl, "perplexity_unscaled": ppl_plain})


def describe(m):
    parts = ["rope_freqs" if m["llama3_rope"] else "no rope_freqs", f"scaling {m['scaling']}"]
    if m["factor"]:
        parts.append(f"factor {m['factor']}")
    if m["original_ctx"]:
        parts.append(f"original context {m['original_ctx']}")
    if m["attn_factor"]:
        parts.append(f"attn_factor {m['attn_factor']}")
    return ", ".join(parts)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--helios", default="build/helios", help="the helios program (default: build/helios)")
    ap.add_argument("--out", default="tests/golden/data", help="folder for rope_scaling.json")
    ap.add_argument("--qwen", help="Qwen2.5-Coder-0.5B-Instruct GGUF: also write qwen2_yarn.json")
    args = ap.parse_args()
    if args.qwen:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        make_qwen_yarn(args.qwen, args.out)
    models = []
    with tempfile.TemporaryDirectory() as tmp:
        for n, m in enumerate(MODELS):
            path = os.path.join(tmp, f"synthetic-{n}.gguf")
            write_model(args.helios, path, m)
            logits = logits_of(path)
            models.append(dict(m, logits=[[float(f"{v:.7g}") for v in row] for row in logits]))
            print(f"{describe(m)}: {logits.shape[0]} rows of {logits.shape[1]} logits")
    for m in models[1:]:
        diff = np.abs(np.array(models[0]["logits"]) - np.array(m["logits"])).max()
        print(f"largest change {describe(m)} makes to a logit: {diff:.4g}")
    out = os.path.join(args.out, "rope_scaling.json")
    with open(out, "w") as f:
        json.dump({"source": "llama.cpp via llama-cpp-python (scripts/make_rope_goldens.py)", "spec": SPEC,
                   "tokens": TOKENS, "rows": ROWS, "models": models}, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
