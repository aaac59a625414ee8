"""Column and tag mappings rewrite a user's keys and role names into a format's own before it is normalized, and put
the normalizer's complaints back into the user's names."""

from __future__ import annotations

from staging.mapping import Mapping


def test_columns_rename_an_alpaca_record_and_leave_the_rest() -> None:
    mapping = Mapping("alpaca", {"prompt": "question", "response": "answer", "kto_tag": "ok"})
    assert mapping.apply({"question": "2+2?", "answer": "4", "ok": True, "id": 7}) == {
        "instruction": "2+2?",
        "output": "4",
        "label": True,
        "id": 7,
    }
    assert mapping.apply(["not", "an", "object"]) == ["not", "an", "object"]
    assert mapping.column("output") == "answer" and mapping.column("system") == "system"


def test_tags_rename_turns_and_roles_of_the_conversation_and_of_a_pairs_answers() -> None:
    tags = {"role_tag": "speaker", "content_tag": "text", "user_tag": "me", "assistant_tag": "bot"}
    mapping = Mapping("openai", {"messages": "dialog"}, tags)
    record = {
        "dialog": [{"speaker": "me", "text": "hi"}, {"speaker": "bot", "text": "hello", "weight": 0}],
        "chosen": {"speaker": "bot", "text": "good"},
        "rejected": [{"speaker": "bot", "text": "bad"}],
    }
    assert mapping.apply(record) == {
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello", "weight": 0}],
        "chosen": {"role": "assistant", "content": "good"},
        "rejected": [{"role": "assistant", "content": "bad"}],
    }


def test_a_mapping_its_format_cannot_take_says_why() -> None:
    assert Mapping("sharegpt", {"query": "q"}).problem() == (
        "column 'query' is not one of format sharegpt's: messages, system, tools, images, chosen, rejected, kto_tag"
    )
    assert Mapping("alpaca", tags={"role_tag": "r"}).problem() == "format alpaca has no turns to tag"
    assert (
        Mapping("qwen", tags={"observation_tag": "tool"}).problem()
        == "tag 'observation_tag' is not one of format qwen's"
    )
    assert Mapping("sharegpt", {"messages": "dialog"}, {"observation_tag": "tool"}).problem() is None


def test_a_normalizers_reason_is_told_in_the_users_names() -> None:
    mapping = Mapping("alpaca", {"response": "answer"})
    assert mapping.explain("output: empty text") == "answer (column response): empty text"
    assert mapping.explain("'output': missing") == "'answer' (column response): missing"
    assert mapping.explain("instruction: empty text") == "instruction: empty text"
