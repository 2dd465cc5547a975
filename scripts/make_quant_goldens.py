#!/usr/bin/env python3
"""Reference data for the quantized matmul kernels, computed by llama.cpp's own CPU code.

Writes tests/golden/data/quant_dot.json: for each weight type Helios multiplies with
(Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), seeded random weight rows (random bytes
with every fp16 scale overwritten by a finite value, as in dequant.json), float activation rows,
the activation blocks ggml's CPU backend quantizes them to (Q8_0, Q8_1 or Q8_K) and the dot
product of each (weight row, activation row) pair from ggml's vec_dot function for the type.
tests/golden/quant_dot_test.cpp checks that Helios quantizes to the same bytes and computes
the same dot products, bit for bit, and dequantizes the weights to the same floats as ggml.

It calls the ggml CPU library that llama-cpp-python builds (from its vendored llama.cpp) through
ctypes, so the figures are those of the x86 code paths that library was compiled with (AVX2 and
above: built with GGML_NATIVE on an AVX2 machine). Run by hand, never in CI:

    python3 -m venv /opt/golden-venv
    CMAKE_ARGS="-DGGML_NATIVE=ON" /opt/golden-venv/bin/pip install numpy llama-cpp-python
    /opt/golden-venv/bin/python scripts/make_quant_goldens.py --out tests/golden/data
"""

import argparse
import ctypes
import glob
import json
import os

import numpy as np

# type name, ggml type id, block values, block bytes, byte offsets of fp16 scales, positive scales,
# activation format, its block bytes
TYPES = [
    ("Q8_0", 8, 32, 34, [0], False, "q8_0", 34),
    ("Q4_0", 2, 32, 18, [0], False, "q8_0", 34),
    ("Q4_1", 3, 32, 20, [0, 2], False, "q8_1", 36),
    ("Q5_0", 6, 32, 22, [0], False, "q8_0", 34),
    ("Q5_1", 7, 32, 24, [0, 2], False, "q8_1", 36),
    ("Q4_K", 12, 256, 144, [0, 2], True, "q8_K", 292),
    ("Q5_K", 13, 256, 176, [0, 2], True, "q8_K", 292),
    ("Q6_K", 14, 256, 210, [208], False, "q8_K", 292),
]
N_IN = 512
N_W_ROWS = 3
N_X_ROWS = 3


def load_ggml_cpu():
    import llama_cpp
    libdir = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    base = ctypes.CDLL(glob.glob(os.path.join(libdir, "libggml-base.so*"))[0], mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(glob.glob(os.path.join(libdir, "libggml-cpu.so*"))[0], mode=ctypes.RTLD_GLOBAL)
    cpu.ggml_cpu_init()
    return base, cpu, llama_cpp.__version__


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/golden/data")
    args = ap.parse_args()
    base, cpu, version = load_ggml_cpu()
    features = {f: bool(getattr(cpu, "ggml_cpu_has_" + f)()) for f in ("avx2", "fma", "f16c", "avx512", "avx512_vnni", "avx_vnni")}
    assert features["avx2"] and features["fma"], "the reference must come from ggml's AVX2 code"

    rng = np.random.default_rng(20260601)
    cases = []
    for name, _, block_values, block_bytes, scale_offsets, positive, act, act_bytes in TYPES:
        nb = N_IN // block_values
        w = rng.integers(0, 256, size=(N_W_ROWS, nb, block_bytes), dtype=np.uint8)
        for off in scale_offsets:
            mag = np.exp(rng.uniform(np.log(1e-3), np.log(0.2), size=(N_W_ROWS, nb)))
            sign = 1.0 if positive else rng.choice([-1.0, 1.0], size=(N_W_ROWS, nb))
            w[:, :, off:off + 2] = (mag * sign).astype("<f2").view(np.uint8).reshape(N_W_ROWS, nb, 2)
        w = np.ascontiguousarray(w.reshape(N_W_ROWS, nb * block_bytes))
        x = rng.standard_normal((N_X_ROWS, N_IN)).astype(np.float32)
        x[0, 5] = 30.0                      # an outlier, as hidden states have
        x[1, :block_values] = 0.0           # a block of zeros
        x[2] *= 1e-3

        quantize = getattr(cpu, "quantize_row_" + act)
        quantize.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        xq = np.zeros((N_X_ROWS, nb * act_bytes), dtype=np.uint8)
        for r in range(N_X_ROWS):
            quantize(x[r].ctypes.data, xq[r].ctypes.data, N_IN)

        vec_dot = getattr(cpu, "ggml_vec_dot_%s_%s" % (name.lower().replace("_k", "_K"), act))
        vec_dot.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                            ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        dots = np.zeros((N_X_ROWS, N_W_ROWS), dtype=np.float32)
        for r in range(N_X_ROWS):
            for o in range(N_W_ROWS):
                out = np.zeros(1, dtype=np.float32)
                vec_dot(N_IN, out.ctypes.data, 0, w[o].ctypes.data, 0, xq[r].ctypes.data, 0, 1)
                dots[r, o] = out[0]
        # ggml's dequantization of the same rows (libggml-base, compiled without fused multiply-adds
        # in these loops or not: either way the products are exact in f32 for these types).
        dequantize = getattr(base, "dequantize_row_" + name.lower().replace("_k", "_K"))
        dequantize.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        wd = np.zeros((N_W_ROWS, N_IN), dtype=np.float32)
        for o in range(N_W_ROWS):
            dequantize(w[o].ctypes.data, wd[o].ctypes.data, N_IN)
        cases.append({
            "type": name, "activation": act.upper(), "n_in": N_IN,
            "weights_hex": [row.tobytes().hex() for row in w],
            "x_f32_hex": [row.tobytes().hex() for row in x],
            "activations_hex": [row.tobytes().hex() for row in xq],
            "weights_dequantized_f32_hex": [row.tobytes().hex() for row in wd],
            "dots_f32_hex": [row.tobytes().hex() for row in dots],
            "dots": [[float(v) for v in row] for row in dots],
        })
    meta = {"generator": "scripts/make_quant_goldens.py", "llama_cpp_python_version": version,
            "ggml_cpu_features": features, "rng": "numpy default_rng(20260601)",
            "note": "dots[r][o] = ggml_vec_dot_<type>_<activation>(weights[o], activations[r]); "
                    "activations = quantize_row_<activation>(x[r]); all little-endian"}
    path = os.path.join(args.out, "quant_dot.json")
    with open(path, "w") as f:
        json.dump({"meta": meta, "cases": cases}, f, indent=1)
        f.write("\n")
    print("wrote", path)


if __name__ == "__main__":
    main()
