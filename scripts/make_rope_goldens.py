#!/usr/bin/env python3
"""Reference logits for rope scaling (Llama 3.1's rope_freqs.weight, linear), computed by llama.cpp.

Writes tests/golden/data/rope_scaling.json: the logits llama.cpp gives for every position of a
fixed token sequence on three seeded synthetic models that `helios make-synthetic` writes (F32
weights, rope base 500000, 4 heads of 16): plain, with --llama3-rope, and with --rope-linear 4.
The models are not stored: tests/golden/rope_scaling_test.cpp writes the same files through
make_synthetic_model with the spec recorded here and compares Helios's logits with these.

llama.cpp runs with F32 K/V caches and without flash attention, so the only differences left are
the order of float sums. Run by hand after a build (never in CI):

    python3 -m venv /opt/golden-venv
    /opt/golden-venv/bin/pip install numpy llama-cpp-python
    /opt/golden-venv/bin/python scripts/make_rope_goldens.py --helios build/helios --out tests/golden/data
"""

import argparse
import json
import os
import subprocess
import tempfile

import numpy as np

SPEC = {"preset": "tiny", "rope_base": 500000.0, "type": "F32", "untied": True, "seed": 7}
# Ids of the synthetic byte-level vocabulary (512 entries; 0-2 are unk, bos, eos).
TOKENS = [1, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 300, 411, 260, 509, 3, 77,
          128, 255, 64, 480, 37, 90, 201, 333]


def write_model(helios, path, llama3_rope, rope_linear):
    cmd = [helios, "make-synthetic", "--preset", SPEC["preset"], "--rope-base", str(SPEC["rope_base"]),
           "--type", SPEC["type"], "--seed", str(SPEC["seed"]), "--out", path]
    if SPEC["untied"]:
        cmd.append("--untied")
    if llama3_rope:
        cmd.append("--llama3-rope")
    if rope_linear:
        cmd += ["--rope-linear", str(rope_linear)]
    subprocess.run(cmd, check=True, capture_output=True)


def logits_of(path):
    from llama_cpp import Llama

    f32 = 0  # GGML_TYPE_F32
    llm = Llama(model_path=path, n_ctx=64, n_batch=64, logits_all=True, type_k=f32, type_v=f32,
                flash_attn=False, n_threads=2, verbose=False)
    llm.eval(TOKENS)
    return np.array(llm.scores[: len(TOKENS)], dtype=np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--helios", default="build/helios", help="the helios program (default: build/helios)")
    ap.add_argument("--out", default="tests/golden/data", help="folder for rope_scaling.json")
    args = ap.parse_args()
    models = []
    with tempfile.TemporaryDirectory() as tmp:
        for n, (scaled, linear) in enumerate(((False, 0), (True, 0), (False, 4))):
            path = os.path.join(tmp, f"synthetic-{n}.gguf")
            write_model(args.helios, path, scaled, linear)
            logits = logits_of(path)
            models.append({"llama3_rope": scaled, "rope_linear": linear,
                           "logits": [[float(f"{v:.7g}") for v in row] for row in logits]})
            print(f"llama3_rope={scaled} rope_linear={linear}: {logits.shape[0]} rows of {logits.shape[1]} logits")
    for m in models[1:]:
        diff = np.abs(np.array(models[0]["logits"]) - np.array(m["logits"])).max()
        print(f"largest change llama3_rope={m['llama3_rope']} rope_linear={m['rope_linear']} makes to a logit: "
              f"{diff:.4g}")
    out = os.path.join(args.out, "rope_scaling.json")
    with open(out, "w") as f:
        json.dump({"source": "llama.cpp via llama-cpp-python (scripts/make_rope_goldens.py)", "spec": SPEC,
                   "tokens": TOKENS, "models": models}, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
