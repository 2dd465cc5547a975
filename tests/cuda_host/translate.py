#!/usr/bin/env python3
"""A kernels/cuda/*.cu file as C++ for the host emulation (tests/cuda_host/device.h).

Two rewrites, nothing else: a launch `kernel<<<grid, block[, smem[, stream]]>>>(args)` becomes
`::helios::cuda_host::launch("kernel", grid, block[, smem[, stream]]).run([=] { kernel(args); })`
(the lambda copies what the arguments read, as a launch copies its arguments), and a
`__shared__ T name[dims];` declaration a reference to the running block's storage for that site
(`extern __shared__ T name[];`: a pointer to its dynamic shared memory). The output starts with a
#line so that compiler errors and debuggers point at the .cu file.

usage: translate.py IN.cu OUT.cpp
"""
import re
import sys

LAUNCH = re.compile(r"\b(?P<kernel>[A-Za-z_][\w:]*(?:\s*<[^;{}\n]*?>)?)\s*<<<(?P<config>.*?)>>>\s*\(", re.S)
SHARED = re.compile(
    r"(?P<extern>extern\s+)?__shared__\s+(?:__align__\((?P<align>\d+)\)\s+)?(?P<type>[\w:]+(?:\s*<[^;]*?>)?)\s+"
    r"(?P<name>\w+)\s*(?P<dims>(?:\[[^\]]*\])*)\s*;")


def translate(text: str, site_base: int) -> str:
    sites = iter(range(site_base, site_base + 10000))

    def shared(m: re.Match) -> str:
        type_, name, dims = m["type"], m["name"], m["dims"]
        if m["extern"]:
            if dims != "[]":
                raise SystemExit(f"translate.py: extern __shared__ {name} must be an array of unknown size")
            return f"{type_}* {name} = static_cast<{type_}*>(::helios::cuda_host::dynamic_shared());"
        if m["align"]:
            # The storage is aligned as the type is; a wider __align__ needs a wrapper type.
            type_expr = f"::helios::cuda_host::Aligned<{type_}{dims}, {m['align']}>"
            return f"auto& {name} = ::helios::cuda_host::shared_at<{type_expr}>({next(sites)}).value;"
        return f"auto& {name} = ::helios::cuda_host::shared_at<{type_}{dims}>({next(sites)});"

    out, at = [], 0
    for m in LAUNCH.finditer(text):
        if m.start() < at:
            continue
        end = closing_paren(text, m.end() - 1)
        kernel = " ".join(m["kernel"].split())
        config = " ".join(m["config"].split())
        args = text[m.end():end]
        out.append(text[at:m.start()])
        out.append(f'::helios::cuda_host::launch("{kernel}", {config}).run([=] {{ {kernel}({args}); }})')
        at = end + 1
    out.append(text[at:])
    return SHARED.sub(shared, "".join(out))


def closing_paren(text: str, open_at: int) -> int:
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    raise SystemExit("translate.py: a kernel launch's arguments never close")


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    src, out = sys.argv[1], sys.argv[2]
    text = open(src, encoding="utf-8").read()
    # Sites are numbered per file from a hash of its name, so two files' sites never meet.
    site_base = (sum(src.encode()) % 1000) * 10000
    body = translate(text, site_base)
    header = f'#include "cuda_host/device.h"\n#line 1 "{src}"\n'
    with open(out, "w", encoding="utf-8") as f:
        f.write(header + body)


if __name__ == "__main__":
    main()
