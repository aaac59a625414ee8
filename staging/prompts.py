"""Online RL's prompts (data.preference=prompts, train.objective=grpo) as users have them, recognised, validated,
normalized and tokenized once into prompt rows (storage/shards.py `PromptWriter`).

Forms, told by a record's keys:

    TRL           {"prompt": "text" or [{"role": ..., "content": ...}, ...], ...columns}  (TRL's GRPO datasets)
    OpenR1-Math   {"problem": "...", "solution": "...", "answer": "...", ...}
    GSM8K         {"question": "...", "answer": "... #### 72"}

The prompt becomes a conversation (a text is one user turn; a list of messages is read as OpenAI messages and must
end awaiting the assistant), and every other key of the record is a column the reward functions receive as a keyword
argument (TRL's signature: trainer/objectives/rl/reward_funcs.py), the reference answer among them: `answer`, or, as
TRL's accuracy_reward reads it, `solution`. With data.require_answer a record without either is invalid (one line
naming it, or a reject with data.on_invalid=skip). A `tools` column also goes to the chat template.

A prompt row is the prompt rendered by the chat template with its generation prompt (the tokens an answer follows),
no target, and its record: the location (for errors that name it), the prompt's messages and the columns, as JSON.
A prompt longer than data.max_length (train.rl.max_prompt_length) keeps its last tokens (data.excess_length=truncate,
as TRL cuts prompts from the left), or is dropped (drop, fail).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from staging.formats import Conversation, InvalidRecord, Message, openai_message, parse_tools, require_text, type_name
from staging.tokenize import ChatEncoder, EncodedBatch
from storage.shards import IGNORE_INDEX

# The key that holds the prompt, in the order they are looked for, and the form each one tells.
PROMPT_KEYS = (("prompt", "TRL's prompts"), ("problem", "OpenR1-Math's problems"), ("question", "GSM8K's questions"))
ANSWER_KEYS = ("answer", "solution")
PROMPT_MARK = "prompt_row"  # the spooled record's key that marks it a prompt (a column of the user's is in `columns`)


def form_of(record: object) -> str | None:
    """Which form a record's keys tell (its prompt key), or None: not a prompt record."""
    if not isinstance(record, dict):
        return None
    return next((key for key, _ in PROMPT_KEYS if key in record), None)


def form_label(key: str | None) -> str:
    """How users know a form, for the staging log."""
    return dict(PROMPT_KEYS).get(key or "", "prompts")


def refusal(record: object) -> str:
    """Why data.preference=prompts cannot read a record."""
    keys = sorted(record) if isinstance(record, dict) else type_name(record)
    return (
        f"not a prompt record (keys {keys}): data.preference=prompts reads TRL's 'prompt', OpenR1-Math's 'problem' "
        "or GSM8K's 'question'; rename the column that holds the prompt"
    )


def prompt_messages(value: object, key: str) -> list[Message]:
    """A prompt as messages: a text is one user turn; a list of messages must end awaiting the assistant."""
    if isinstance(value, str):
        return [{"role": "user", "content": require_text(value, key)}]
    if not isinstance(value, list) or not value:
        raise InvalidRecord(f"{key}: expected a text or a list of messages, got {type_name(value)}")
    messages = [openai_message(turn, f"{key}[{index}]")[0] for index, turn in enumerate(value)]
    if messages[-1]["role"] == "assistant":
        raise InvalidRecord(f"{key}: the last message is the assistant's; a prompt ends awaiting the answer")
    return messages


def has_answer(columns: dict[str, Any]) -> bool:
    """Whether a record carries a reference answer (a non-empty `answer` or `solution`)."""
    for key in ANSWER_KEYS:
        value = columns.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return True
        if isinstance(value, str) and value.strip():
            return True
    return False


def normalize(location: str, record: object, require_answer: bool) -> Conversation:
    """A prompt record as it is spooled: its messages, tools, columns and location; InvalidRecord says why not."""
    key = form_of(record)
    if key is None or not isinstance(record, dict):
        raise InvalidRecord(refusal(record))
    messages = prompt_messages(record[key], key)
    columns = {name: value for name, value in record.items() if name != key}
    if require_answer and not has_answer(columns):
        raise InvalidRecord(
            "no reference answer ('answer' or 'solution'), which train.rl.rewards' accuracy compares the completions "
            "with; add it, or take accuracy out of train.rl.rewards"
        )
    out: Conversation = {PROMPT_MARK: True, "messages": messages, "columns": columns, "location": location}
    tools = parse_tools(record.get("tools"))
    if tools:
        out["tools"] = tools
    return out


def is_prompt(record: Conversation) -> bool:
    """Whether a spooled record is a prompt record."""
    return bool(record.get(PROMPT_MARK))


def row_record(record: Conversation) -> str:
    """A prompt row's `record` column: its location, prompt messages and columns, as JSON."""
    doc = {"location": record["location"], "prompt": record["messages"], "columns": record["columns"]}
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS).decode()


def encode_prompts(encoder: ChatEncoder, items: list[tuple[str, Conversation]]) -> EncodedBatch:
    """A batch of prompt records as prompt rows: rendered with the generation prompt, tokenized, cut from the left or
    dropped when longer than data.max_length (data.excess_length); a record the template refuses is rejected."""
    rendered: list[tuple[int, str]] = []
    rejects: list[tuple[int, str]] = []
    for index, (_, record) in enumerate(items):
        try:
            rendered.append((index, encoder.render(record["messages"], record.get("tools"), True)))
        except InvalidRecord as exc:
            rejects.append((index, str(exc)))
    encodings = encoder.backend.encode_batch([text for _, text in rendered], add_special_tokens=False)
    ids_list: list[np.ndarray] = []
    kept, truncated, records, dropped = [], [], [], []
    longest = 0
    for (index, _), encoding in zip(rendered, encodings, strict=True):
        ids = np.array(encoding.ids, dtype=np.int32)
        longest = max(longest, len(ids))
        if len(ids) > encoder.max_length:
            if encoder.excess_length != "truncate":
                dropped.append((index, f"{len(ids)} prompt tokens, longer than data.max_length={encoder.max_length}"))
                continue
            ids = ids[-encoder.max_length :]
        ids_list.append(ids)
        kept.append(index)
        truncated.append(len(ids) < len(encoding.ids))
        records.append(row_record(items[index][1]))
    flat = np.concatenate(ids_list) if ids_list else np.zeros(0, dtype=np.int32)
    return EncodedBatch(
        flat,
        np.full(len(flat), IGNORE_INDEX, dtype=np.int32),
        np.array([len(ids) for ids in ids_list], dtype=np.int32),
        np.array(truncated, dtype=bool),
        np.array(kept, dtype=np.int32),
        sorted(rejects),
        dropped,
        longest=longest,
        records=records,
    )
