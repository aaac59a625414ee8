"""Hypothesis strategies for the bad-input fuzzer: data files in every supported format and container with
invalid records at random places, each with the location its error must name, and invalid config overrides.

Every mutation here makes a record invalid for sure (the fuzzer asserts the error names exactly the first bad
record), and none adds another format's keys, so `auto` still recognizes the file from its valid records.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

FORMATS = ("qwen", "sharegpt", "openai", "alpaca")
CONTAINERS = ("jsonl", "json", "parquet")
ROLE_NAMES = {"system", "user", "assistant", "tool", "human", "gpt", "function_call", "observation"}
FORMAT_KEYS = {"conversations", "messages", "instruction", "output"}
DETECT_SAMPLE = 16

texts = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=24).filter(lambda t: t.strip())
blank = st.sampled_from(["", " ", "\n\t "])
not_a_role = st.text(max_size=10).filter(lambda t: t not in ROLE_NAMES)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.lists(st.integers(), max_size=2)
)
junk_keys = st.text(max_size=8).filter(lambda k: k not in FORMAT_KEYS)
junk = st.recursive(
    scalars | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(junk_keys, inner, max_size=3),
    max_leaves=6,
)


def valid(fmt: str, prompt: str, answer: str) -> dict[str, Any]:
    """One valid single-turn record."""
    if fmt == "qwen":
        return {"conversations": [{"from": "user", "value": prompt}, {"from": "assistant", "value": answer}]}
    if fmt == "sharegpt":
        return {"conversations": [{"from": "human", "value": prompt}, {"from": "gpt", "value": answer}]}
    if fmt == "openai":
        return {"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]}
    return {"instruction": prompt, "input": "", "output": answer}


def _turns_key(fmt: str) -> tuple[str, str, str]:
    return ("messages", "role", "content") if fmt == "openai" else ("conversations", "from", "value")


@st.composite
def broken(draw: st.DrawFn, fmt: str, container: str, record: dict[str, Any]) -> dict[str, Any] | Any:
    """`record` made invalid; in Parquet only in ways that keep the column types (a row is typed)."""
    typed = container == "parquet"
    if fmt == "alpaca":
        kinds = ["blank_output", "null_output", "blank_prompt"] + (
            [] if typed else ["output_type", "no_output", "not_object", "junk"]
        )
    else:
        kinds = ["blank_text", "null_text", "bad_role", "no_answer", "answer_first"] + (
            [] if typed else ["text_type", "turns_type", "turn_type", "not_object", "junk"]
        )
    kind = draw(st.sampled_from(kinds))
    out = json.loads(json.dumps(record))
    if kind == "not_object":
        return draw(scalars)
    if kind == "junk":
        return draw(st.dictionaries(junk_keys, junk, max_size=4))
    if fmt == "alpaca":
        if kind == "blank_output":
            out["output"] = draw(blank)
        elif kind == "null_output":
            out["output"] = None
        elif kind == "blank_prompt":
            out["instruction"], out["input"] = draw(blank), draw(blank)
        elif kind == "output_type":
            out["output"] = draw(scalars.filter(lambda v: v is not None))
        elif kind == "no_output":
            del out["output"]
        return out
    key, role_key, text_key = _turns_key(fmt)
    turns = out[key]
    turn = draw(st.integers(0, len(turns) - 1))
    if kind == "blank_text":
        turns[turn][text_key] = draw(blank)
    elif kind == "null_text":
        turns[turn][text_key] = None
    elif kind == "bad_role":
        turns[turn][role_key] = draw(not_a_role)
    elif kind == "no_answer":
        out[key] = turns[:1]
    elif kind == "answer_first":
        out[key] = list(reversed(turns))
    elif kind == "text_type":
        turns[turn][text_key] = draw(
            st.one_of(st.integers(), st.booleans(), st.dictionaries(junk_keys, st.integers(), max_size=2))
        )
    elif kind == "turns_type":
        out[key] = draw(
            st.one_of(st.none(), st.integers(), st.text(max_size=5), st.dictionaries(junk_keys, st.integers()))
        )
    elif kind == "turn_type":
        turns[turn] = draw(scalars)
    return out


@dataclass
class DataCase:
    """A data file to write, the format to read it with, and where its first invalid record is."""

    fmt: str
    read_as: str  # the format the pipeline is told (auto or fmt)
    container: str
    records: list[Any]
    bad: list[int]  # indexes of the invalid records
    truncate_at: float | None  # the whole file cut short (a broken JSON array or Parquet file), as a fraction
    malformed_line: int | None  # JSONL: the index of a record whose line is cut short

    def write(self, directory: Path) -> str:
        """Write the file; returns its path."""
        path = directory / f"data.{self.container}"
        if self.container == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.Table.from_pylist(self.records), path)
        elif self.container == "json":
            path.write_text(json.dumps(self.records, indent=1, ensure_ascii=False), encoding="utf-8")
        else:
            lines = [json.dumps(r, ensure_ascii=False) for r in self.records]
            if self.malformed_line is not None:
                line = lines[self.malformed_line]
                lines[self.malformed_line] = line[: max(1, len(line) // 2)]
            path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
        if self.truncate_at is not None:
            raw = path.read_bytes()
            path.write_bytes(raw[: max(1, int(len(raw) * self.truncate_at))])
        return str(path)

    def expected(self, path: str) -> str:
        """What the error message must start with: the first bad record's location, or the file's."""
        if self.truncate_at is not None:
            return f"{path}:"
        first = min(self.bad + ([self.malformed_line] if self.malformed_line is not None else []))
        if self.container == "jsonl":
            return f"{path}:{first + 1}: "
        if self.container == "json":
            return f"{path}[{first}]: "
        return f"{path}#{first}: "

    def undetectable(self) -> bool:
        """With `auto`, no valid record among the first ones: a file-level 'cannot tell the format' is right."""
        bad = set(self.bad) | ({self.malformed_line} if self.malformed_line is not None else set())
        return self.read_as == "auto" and all(i in bad for i in range(min(DETECT_SAMPLE, len(self.records))))


@st.composite
def data_cases(draw: st.DrawFn) -> DataCase:
    """A data file with at least one invalid record (or a file cut short)."""
    fmt = draw(st.sampled_from(FORMATS))
    container = draw(st.sampled_from(CONTAINERS))
    n = draw(st.integers(1, 24))
    records = [valid(fmt, draw(texts), draw(texts)) for _ in range(n)]
    truncate_at = malformed = None
    bad: list[int] = []
    mode = draw(st.sampled_from(["records", "records", "records", "file"]))
    if mode == "file" and container != "jsonl":
        truncate_at = draw(st.floats(0.05, 0.95))
    elif mode == "file":
        malformed = draw(st.integers(0, n - 1))
    else:
        bad = sorted(draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=3)))
        for index in bad:
            records[index] = draw(broken(fmt, container, records[index]))
    read_as = draw(st.sampled_from(["auto", fmt]))
    return DataCase(fmt, read_as, container, records, bad, truncate_at, malformed)


# Leaf keys of the config and values of every JSON kind; most combinations are invalid.
CONFIG_KEYS = [
    "run.name",
    "run.storage",
    "data.source",
    "data.format",
    "data.eval_source",
    "data.on_invalid",
    "data.max_length",
    "data.eval_ratio",
    "data.digest_algorithm",
    "data.shard_rows",
    "data.num_proc",
    "model.name_or_path",
    "train.method",
    "train.learning_rate",
    "train.max_steps",
    "train.epochs",
    "train.save_steps",
    "train.keep_latest_k",
    "train.resume",
    "train.micro_batch_size",
    "train.gradient_accumulation_steps",
    "train.warmup_ratio",
    "train.lora.r",
    "train.lora.dropout",
    "train.lora.target_modules",
    "deepspeed.config",
    "launch.backend",
    "launch.nnodes",
    "launch.nproc_per_node",
    "launch.master_port",
    "launch.rdzv_timeout",
    "launch.retries",
    "launch.env",
    "eval.batch_size",
    "eval.model",
    "register.model_name",
    "register.gate",
    "register.gate.threshold",
    "run.storage_options",
    "data.storage_options",
]
config_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-10, 10**7),
    st.floats(allow_nan=False),
    st.text(max_size=12),
    st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


@st.composite
def config_overrides(draw: st.DrawFn) -> tuple[str, str]:
    """(config key, `KEY=VALUE` override): a known key with a value of any kind, or an unknown key."""
    if draw(st.integers(0, 9)) == 0:
        section = draw(st.sampled_from(["run", "data", "train", "launch", "eval"]))
        key = f"{section}.{draw(st.from_regex(r'[a-z_]{1,10}', fullmatch=True))}"
    else:
        key = draw(st.sampled_from(CONFIG_KEYS))
    value = draw(config_values)
    raw = draw(st.text(max_size=12)) if draw(st.booleans()) and isinstance(value, str) else json.dumps(value)
    return key, f"{key}={raw}"
