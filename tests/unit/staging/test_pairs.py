"""Preference records tokenized into preference rows: a pair's prompt once, then its chosen and rejected answers with
targets on the answers only; KTO feedback's prompt and answer with its label; an over-long pair truncated as a unit
(the prompt from the left, both answers from the right) or dropped."""

from __future__ import annotations

import pytest

from staging.pairs import encode_preference, is_preference, sequences
from staging.tokenize import EncoderSettings
from storage.shards import IGNORE_INDEX, PAIR

PROMPT = [{"role": "user", "content": "Is the sky blue?"}]
PAIR_RECORD = {
    "messages": PROMPT,
    "chosen": [{"role": "assistant", "content": "Yes, on a clear day."}],
    "rejected": [{"role": "assistant", "content": "No, it is plaid."}],
}
FEEDBACK = {"messages": [*PROMPT, {"role": "assistant", "content": "Yes."}], "desirable": False}


@pytest.fixture(scope="module")
def encoder(tiny_model):
    return EncoderSettings(tiny_model, max_length=256).encoder()


def test_a_pair_is_its_prompt_once_then_both_answers_each_rendered_with_the_prompt(encoder) -> None:
    assert is_preference(PAIR_RECORD) and is_preference(FEEDBACK) and not is_preference({"messages": PROMPT})
    batch = encode_preference(encoder, [("p.jsonl:1", PAIR_RECORD)])
    [(prompt, chosen, rejected)] = batch.segments.tolist()
    ids, labels = batch.ids.tolist(), batch.labels.tolist()
    assert len(ids) == prompt + chosen + rejected and batch.feedback.tolist() == [PAIR]
    assert labels[:prompt] == [IGNORE_INDEX] * prompt  # the prompt is never a target
    assert labels[prompt:] == ids[prompt:]  # every answer token is
    # Each answer as the model reads it: the prompt's tokens, then the answer's, as the template renders them.
    conversations, _ = sequences(PAIR_RECORD)
    for conversation, (start, stop) in zip(
        conversations, [(prompt, prompt + chosen), (prompt + chosen, len(ids))], strict=True
    ):
        whole = encoder.encode([conversation])
        assert whole.ids.tolist()[: prompt + stop - start] == ids[:prompt] + ids[start:stop]


def test_feedback_is_its_prompt_and_answer_with_its_label(encoder) -> None:
    batch = encode_preference(encoder, [("k.jsonl:1", FEEDBACK)])
    [(prompt, answer, none)] = batch.segments.tolist()
    assert none == 0 and batch.feedback.tolist() == [0] and len(batch.ids) == prompt + answer


def test_an_over_long_pair_is_truncated_as_a_unit_or_dropped(tiny_model, encoder) -> None:
    whole = encode_preference(encoder, [("p.jsonl:1", PAIR_RECORD)])
    [(prompt, chosen, rejected)] = whole.segments.tolist()
    limit = prompt + max(chosen, rejected) - 4
    short = EncoderSettings(tiny_model, max_length=limit).encoder()
    cut = encode_preference(short, [("p.jsonl:1", PAIR_RECORD)])
    [(kept_prompt, kept_chosen, kept_rejected)] = cut.segments.tolist()
    assert cut.truncated.tolist() == [True] and kept_prompt + max(kept_chosen, kept_rejected) == limit
    assert cut.ids.tolist()[:kept_prompt] == whole.ids.tolist()[prompt - kept_prompt : prompt]  # the prompt's end
    assert (
        cut.ids.tolist()[kept_prompt : kept_prompt + kept_chosen] == whole.ids.tolist()[prompt : prompt + kept_chosen]
    )
    dropping = EncoderSettings(tiny_model, max_length=limit, excess_length="drop").encoder()
    dropped = encode_preference(dropping, [("p.jsonl:1", PAIR_RECORD), ("k.jsonl:1", FEEDBACK)])
    assert dropped.kept.tolist() == [1] and dropped.dropped[0][0] == 0
    assert f"longer than data.max_length={limit}" in dropped.dropped[0][1]
