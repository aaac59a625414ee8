"""Preference records (data.preference=pairs) tokenized once into preference rows: a pair's prompt once, then its
chosen and its rejected answer; KTO feedback's prompt, then its answer (storage/shards.py's preference rows).

Each answer is rendered with its prompt by the chat template, as the model will read it (tools and reasoning kept,
as for supervised data), and its targets are found exactly as supervised targets are (staging/tokenize.py): every
token of the answer's assistant turns, nothing of the prompt (earlier assistant turns in the prompt are context).
The prompt is the tokens before the answer's first target, which must be the same for both answers of a pair (a
template that tokenizes the prompt differently by what follows it is refused for that record). A sequence ends at
its answer's last target.

A pair too long for data.max_length (prompt plus its longer answer) is truncated as a unit: the prompt is cut from
the left and both answers from the right, by staging/length.py's budget rule (excess_length truncate), or dropped
(drop, fail) and counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from staging import length
from staging.formats import Conversation, InvalidRecord, Message
from staging.tokenize import ChatEncoder, EncodedBatch, reasoning_error
from storage.shards import IGNORE_INDEX, PAIR

ANSWERS = ("chosen", "rejected")


def is_preference(record: Conversation) -> bool:
    """Whether a spooled record is a preference record (staging/preference.py `staged`)."""
    return "chosen" in record or "desirable" in record


def sequences(record: Conversation) -> tuple[list[Conversation], int]:
    """The conversations to render (prompt + each answer) and how many prompt messages come before the answer."""
    if "desirable" in record:
        messages: list[Message] = record["messages"]
        last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
        return [{"messages": messages[: last + 1], "tools": record.get("tools")}], last
    prompt = record["messages"]
    return [{"messages": prompt + record[key], "tools": record.get("tools")} for key in ANSWERS], len(prompt)


@dataclass
class _Rows:
    """The preference rows of a batch, as they are encoded."""

    ids: list[np.ndarray] = field(default_factory=list)
    labels: list[np.ndarray] = field(default_factory=list)
    segments: list[list[int]] = field(default_factory=list)
    feedback: list[int] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)

    def batch(self, rejects: list[tuple[int, str]], dropped: list[tuple[int, str]]) -> EncodedBatch:
        ids = np.concatenate(self.ids) if self.ids else np.zeros(0, dtype=np.int32)
        labels = np.concatenate(self.labels) if self.labels else np.zeros(0, dtype=np.int32)
        segments = np.array(self.segments, dtype=np.int32).reshape(-1, 3)
        return EncodedBatch(
            ids,
            labels,
            segments.sum(axis=1).astype(np.int32),
            np.array(self.truncated, dtype=bool),
            np.array(self.kept, dtype=np.int32),
            sorted(rejects),
            dropped,
            segments=segments,
            feedback=np.array(self.feedback, dtype=np.int8),
        )


def encode_preference(encoder: ChatEncoder, items: list[tuple[str, Conversation]]) -> EncodedBatch:
    """A batch of preference records as preference rows; a record the template cannot render (or whose prompt
    tokenizes differently before its two answers) is rejected with the reason, an over-long one truncated or
    dropped by data.excess_length."""
    rendered, owners, rejects = _render(encoder, items)
    tokens = list(encoder.token_bounds(rendered))
    out = _Rows()
    dropped: list[tuple[int, str]] = []
    for index, first, prompt_messages in owners:
        record = items[index][1]
        n = 1 if "desirable" in record else 2
        answers = []
        for k in range(n):
            ids, bounds = tokens[first + k]
            turns = list(zip(bounds[0::2], bounds[1::2], strict=True))
            # The answer's turns: the assistant turns after the prompt's own ones.
            answers.append((ids, turns[_assistant_turns(record["messages"][:prompt_messages]) :]))
        try:
            row = _row(answers, encoder.max_length, encoder.excess_length)
        except InvalidRecord as exc:
            rejects.append((index, str(exc)))
            continue
        if row is None:
            need = max(len(ids[: turns[-1][1]]) for ids, turns in answers)
            dropped.append(
                (index, f"{need} tokens (prompt and longer answer), longer than data.max_length={encoder.max_length}")
            )
            continue
        ids, labels, segments, truncated = row
        out.ids.append(ids)
        out.labels.append(labels)
        out.segments.append(segments + [0] * (3 - len(segments)))
        out.feedback.append(PAIR if n == 2 else int(record["desirable"]))
        out.truncated.append(truncated)
        out.kept.append(index)
    return out.batch(rejects, dropped)


Rendered = list[tuple[int, str, list[tuple[int, int]], list[bool]]]


def _render(
    encoder: ChatEncoder, items: list[tuple[str, Conversation]]
) -> tuple[Rendered, list[tuple[int, int, int]], list[tuple[int, str]]]:
    """Every record's sequences rendered, with their answers' spans: (the renderings, per record its index, its
    first rendering and its prompt's message count, the records the template refused)."""
    rendered: Rendered = []
    owners: list[tuple[int, int, int]] = []
    rejects: list[tuple[int, str]] = []
    for index, (location, record) in enumerate(items):
        convs, prompt_messages = sequences(record)
        try:
            parts = []
            for conversation in convs:
                if encoder.drops_reasoning(conversation):
                    raise reasoning_error(location)
                parts.append((index, *encoder.spans(conversation)))
        except InvalidRecord as exc:
            rejects.append((index, str(exc)))
            continue
        owners.append((index, len(rendered), prompt_messages))
        rendered.extend(parts)
    return rendered, owners, rejects


def _assistant_turns(messages: list[Message]) -> int:
    return sum(1 for m in messages if m["role"] == "assistant")


def _row(
    answers: list[tuple[np.ndarray, list[tuple[int, int]]]], max_length: int, excess_length: str
) -> tuple[np.ndarray, np.ndarray, list[int], bool] | None:
    """(ids, labels, segment lengths, truncated) of one record's row, or None when it is too long to keep."""
    prompts = []
    for _, turns in answers:
        if not turns or all(a >= b for a, b in turns):
            raise InvalidRecord("the chat template left no tokens of an answer; check the tokenizer's chat template")
        prompts.append(turns[0][0])
    prompt = prompts[0]
    first = answers[0][0][:prompt]
    if any(p != prompt or not np.array_equal(ids[:p], first) for p, (ids, _) in zip(prompts, answers, strict=True)):
        raise InvalidRecord(
            "the prompt tokenizes differently before the chosen and the rejected answer; a pair needs one prompt"
        )
    bodies = []
    for ids, turns in answers:
        labels = np.full(len(ids), IGNORE_INDEX, dtype=np.int32)
        for a, b in turns:
            labels[a:b] = ids[a:b]
        end = turns[-1][1]
        bodies.append((ids[prompt:end], labels[prompt:end]))
    longest = max(len(body) for body, _ in bodies)
    kept_prompt, kept_answer = prompt, longest
    if prompt + longest > max_length:
        if excess_length != "truncate":
            return None
        kept_prompt, kept_answer = length.budget_split(prompt, longest, max_length)
    head = answers[0][0][prompt - kept_prompt : prompt]
    parts_ids = [head] + [body[:kept_answer] for body, _ in bodies]
    parts_labels = [np.full(len(head), IGNORE_INDEX, dtype=np.int32)] + [lab[:kept_answer] for _, lab in bodies]
    segments = [len(part) for part in parts_ids]
    return (
        np.concatenate(parts_ids).astype(np.int32),
        np.concatenate(parts_labels),
        segments,
        (kept_prompt, kept_answer) != (prompt, longest),
    )
