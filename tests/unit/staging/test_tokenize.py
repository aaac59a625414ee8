"""Tokenization: labels are exactly the assistant tokens of every assistant turn, the fast batched encoder gives
the same ids and labels as the plain per-turn algorithm, and examples that cannot be trained on are named."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from staging import length
from staging.formats import Conversation
from staging.tokenize import IGNORE_INDEX, ChatEncoder
from staging.tokenizer import load_tokenizer
from storage.location import Location
from tests.datafiles import SAMPLE, read_records

# A Qwen2.5-style template that renders tools and tool calls (the tiny model's ChatML template renders neither).
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response>"
    "<|im_end|>\n"
    "{% else %}<|im_start|>{{ message.role }}\n{{ message.content }}"
    "{% for call in message.tool_calls or [] %}<tool_call>\n"
    '{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}\n</tool_call>'
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def reference_encode(tokenizer, conversation: Conversation, max_length: int) -> tuple[list[int], list[int]]:
    """The walking skeleton's algorithm, token by token: the oracle the fast encoder must match exactly."""
    messages, tools = conversation["messages"], conversation.get("tools")
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
    spans = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant" or message.get("weight") == 0:
            continue
        start = len(
            tokenizer.apply_chat_template(messages[:index], tools=tools, tokenize=False, add_generation_prompt=True)
        )
        end = len(tokenizer.apply_chat_template(messages[: index + 1], tools=tools, tokenize=False))
        spans.append((start, end))
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    labels = [
        tok if any(start <= begin < end for start, end in spans) else IGNORE_INDEX
        for tok, (begin, _) in zip(ids, offsets, strict=True)
    ]
    return ids[:max_length], labels[:max_length]


def chat(*turns: tuple[str, str]) -> Conversation:
    return {"messages": [{"role": role, "content": text} for role, text in turns]}


def with_template(tiny_model: str, tmp_path: Path, template: str) -> str:
    """A copy of the tiny model's tokenizer with another chat template."""
    out = tmp_path / "tok"
    out.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(tiny_model) / name, out / name)
    (out / "chat_template.jinja").write_text(template)
    return str(out)


def encode_one(encoder: ChatEncoder, conversation: Conversation) -> tuple[list[int], list[int]]:
    batch = encoder.encode([conversation])
    assert not batch.rejects, batch.rejects
    return batch.ids.tolist(), batch.labels.tolist()


def test_masked_positions_are_exactly_the_non_assistant_tokens(builtin_tokenizer) -> None:
    tok = load_tokenizer(builtin_tokenizer)
    conversation = chat(
        ("system", "Be brief."),
        ("user", "Add 2 and 3."),
        ("assistant", "2 plus 3 is 5."),
        ("user", "Times 4?"),
        ("assistant", "5 times 4 is 20."),
    )
    ids, labels = encode_one(ChatEncoder(tok, 512), conversation)
    assert all(label in (IGNORE_INDEX, tid) for tid, label in zip(ids, labels, strict=True))
    targets = tok.decode([t for t, label in zip(ids, labels, strict=True) if label != IGNORE_INDEX])
    masked = tok.decode([t for t, label in zip(ids, labels, strict=True) if label == IGNORE_INDEX])
    # ChatML, written out by hand: each assistant turn's content and its <|im_end|>\n are the targets.
    assert targets == "2 plus 3 is 5.<|im_end|>\n5 times 4 is 20.<|im_end|>\n"
    assert masked == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nAdd 2 and 3.<|im_end|>\n"
        "<|im_start|>assistant\n<|im_start|>user\nTimes 4?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert (
        ids
        == tok(tok.apply_chat_template(conversation["messages"], tokenize=False), add_special_tokens=False)["input_ids"]
    )


MODES = {"tiktoken": (True, True), "summed byte offsets": (True, False), "tracked offsets": (False, False)}


def test_fast_encoder_matches_the_per_token_reference(builtin_tokenizer) -> None:
    """Every way of encoding and finding token starts (staging/ranked_bpe.py, offsets.py; MODES) against the oracle,
    computed once; the texts include characters split across byte-level tokens and text an NFC normalizer changes
    (e + combining accent, the Angstrom sign, Devanagari qa), which the summed byte offsets hand back to the tracked
    ones."""
    tok = load_tokenizer(builtin_tokenizer)
    conversations = [r.conversation for r in read_records(str(SAMPLE), "auto")]
    conversations += [
        chat(("user", "Ünïcödé: 你好, мир — ok?"), ("assistant", "  leading spaces and émojis 🙂\n\n")),
        chat(("user", "Cafe\u0301 \u212b?"), ("assistant", "\u212bngstr\u00f6m, cafe\u0301 👨‍👩‍👧 日本語")),
        chat(("user", "日本語のテキスト"), ("assistant", "🎉🎉 done")),
        # NFC grows U+0958 by 3 bytes and shrinks each Angstrom sign by 1: the byte totals agree, the starts do not.
        chat(("user", "\u0958 qa"), ("assistant", "\u212b\u212b\u212b three")),
        chat(("user", "a"), ("assistant", "b"), ("user", "c"), ("assistant", "d"), ("user", "e"), ("assistant", "f")),
        chat(("user", "What is\n\n7?"), ("assistant", "\nSeven.\n")),
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hey", "weight": 0},
                {"role": "user", "content": "2+2"},
                {"role": "assistant", "content": "4"},
            ]
        },
    ]
    for max_length, policy in ((512, "truncate"), (32, "drop")):
        oracle = [reference_encode(tok, conversation, max_length) for conversation in conversations]
        lengths = [
            len(tok(tok.apply_chat_template(c["messages"], tokenize=False), add_special_tokens=False)["input_ids"])
            for c in conversations
        ]
        for mode, (byte_offsets, ranked_bpe) in MODES.items():
            encoder = ChatEncoder(
                tok, max_length, excess_length=policy, byte_offsets=byte_offsets, ranked_bpe=ranked_bpe
            )
            assert (encoder.offsets is not None) == byte_offsets, mode  # both built-in tokenizers are byte-level BPE
            assert (encoder.ranked is not None) == ranked_bpe, mode  # and tiktoken reproduces both
            batch = encoder.encode(conversations)
            assert not batch.rejects, mode
            dropped = {index for index, _ in batch.dropped}
            assert (len(dropped) > 0) == (max_length == 32), mode  # the short limit drops the longer conversations
            assert batch.kept.tolist() == [i for i in range(len(conversations)) if i not in dropped], mode
            position = 0
            for index, example_length in zip(batch.kept.tolist(), batch.lengths.tolist(), strict=True):
                ids, labels = oracle[index]
                assert batch.ids[position : position + example_length].tolist() == ids, (mode, index)
                assert batch.labels[position : position + example_length].tolist() == labels, (mode, index)
                position += example_length
            for index, reason in batch.dropped:  # dropped exactly when the whole rendering is longer
                n = lengths[index]
                assert n > max_length and reason == f"{n} tokens, longer than data.max_length={max_length}", mode


def test_weight_zero_turns_are_not_targets(builtin_tokenizer) -> None:
    tok = load_tokenizer(builtin_tokenizer)
    conversation = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "ignored reply", "weight": 0},
            {"role": "user", "content": "2+2"},
            {"role": "assistant", "content": "4"},
        ]
    }
    ids, labels = encode_one(ChatEncoder(tok, 512), conversation)
    assert tok.decode([t for t, label in zip(ids, labels, strict=True) if label != IGNORE_INDEX]) == "4<|im_end|>\n"


def token_count(tok, messages: list[dict[str, str]], generation_prompt: bool = False) -> int:
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    return len(tok(text, add_special_tokens=False)["input_ids"])


def test_truncation_drops_whole_later_turns_first(builtin_tokenizer) -> None:
    tok = load_tokenizer(builtin_tokenizer)
    conversation = chat(
        ("user", "Add 2 and 3."),
        ("assistant", "2 plus 3 is 5."),
        ("user", "Times 4?"),
        ("assistant", "5 times 4 is 20."),
        ("user", "Minus 1? " * 20),
        ("assistant", "19. " * 20),
    )
    two_turns = conversation["messages"][:4]
    limit = token_count(tok, two_turns) + 5  # the second turn and a few tokens of the third user turn fit
    batch = ChatEncoder(tok, limit).encode([conversation])
    ids, labels = batch.ids.tolist(), batch.labels.tolist()
    assert batch.truncated.tolist() == [True] and not batch.rejects and not batch.dropped
    # Exactly the first two turns, cut after the second answer's <|im_end|> and newline; its targets kept.
    assert ids == tok(tok.apply_chat_template(two_turns, tokenize=False), add_special_tokens=False)["input_ids"]
    assert tok.decode([t for t, la in zip(ids, labels, strict=True) if la != IGNORE_INDEX]) == (
        "2 plus 3 is 5.<|im_end|>\n5 times 4 is 20.<|im_end|>\n"
    )
    # With mask_history only the last turn is a target: it keeps the end of its prompt and its answer's start.
    last = ChatEncoder(tok, limit, mask_history=True).encode([conversation])
    ids, labels = last.ids.tolist(), last.labels.tolist()
    first = next(i for i, label in enumerate(labels) if label != IGNORE_INDEX)
    assert len(ids) == limit and labels[first:] == ids[first:]
    assert tok.decode(ids[:first]).endswith("Minus 1? <|im_end|>\n<|im_start|>assistant\n")
    assert ("19. " * 20).startswith(tok.decode(ids[first:]))


def test_a_first_turn_too_long_alone_keeps_the_prompt_end_and_the_answer_start(builtin_tokenizer) -> None:
    tok = load_tokenizer(builtin_tokenizer)
    question, answer = "Tell me everything. " * 40, "Here is all of it. " * 40
    messages = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    full = tok(tok.apply_chat_template(messages, tokenize=False), add_special_tokens=False)["input_ids"]
    prompt = token_count(tok, messages[:1], generation_prompt=True)
    for limit in (64, 16):
        batch = ChatEncoder(tok, limit).encode([{"messages": messages}])
        ids, labels = batch.ids.tolist(), batch.labels.tolist()
        kept_prompt, kept_answer = length.budget_split(prompt, len(full) - prompt, limit)
        assert len(ids) == limit == kept_prompt + kept_answer and batch.truncated.tolist() == [True]
        assert ids == full[prompt - kept_prompt : prompt + kept_answer]  # the prompt's end, then the answer's start
        assert labels == [IGNORE_INDEX] * kept_prompt + ids[kept_prompt:]
        assert tok.decode(ids[:kept_prompt]).endswith("<|im_start|>assistant\n")
        assert answer.startswith(tok.decode(ids[kept_prompt:]))
    # The share of the budget each keeps (LLaMA-Factory's rule), and a target whatever the sizes.
    assert length.budget_split(10, 3, 8) == (5, 3)  # a short answer is kept whole
    assert length.budget_split(3, 100, 10) == (3, 7)  # a short prompt is kept whole
    assert length.budget_split(60, 40, 10) == (6, 4)  # proportional shares
    assert length.budget_split(10**6, 300, 512) == (511, 1)  # a proportional share of 0 still keeps one target
    assert length.budget_split(0, 50, 8) == (0, 8)  # plain text: its head


def test_drop_and_fail_leave_over_long_examples_out(builtin_tokenizer) -> None:
    tok = load_tokenizer(builtin_tokenizer)
    short, long = chat(("user", "hi"), ("assistant", "ok")), chat(("user", "hi"), ("assistant", "word " * 50))
    limit = token_count(tok, short["messages"]) + 2
    for policy in ("drop", "fail"):
        batch = ChatEncoder(tok, limit, excess_length=policy).encode([long, short])
        n = token_count(tok, long["messages"])
        assert batch.kept.tolist() == [1] and batch.truncated.tolist() == [False] and not batch.rejects
        assert batch.dropped == [(0, f"{n} tokens, longer than data.max_length={limit}")]


def test_plain_text_is_all_targets_and_ends_with_the_end_of_document_token(builtin_tokenizer) -> None:
    tok = load_tokenizer(builtin_tokenizer)
    document = "Once upon a time there was a tiny model. " * 8
    batch = ChatEncoder(tok, 512).encode([{"text": document}])
    ids, labels = batch.ids.tolist(), batch.labels.tolist()
    assert ids == tok(document, add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|endoftext|>")]
    assert labels == ids and tok.decode(ids[-1:]) == "<|endoftext|>" != tok.eos_token  # not <|im_end|>
    head = ChatEncoder(tok, 16).encode([{"text": document}])  # too long: its head is kept, every token a target
    assert head.ids.tolist() == ids[:16] == head.labels.tolist() and head.truncated.tolist() == [True]
    from storage.shards import row
    from trainer.evaluation.samples import split_prompt

    prompt, reference = split_prompt(row(ids, labels))  # eval samples: the first half prompts the rest
    assert prompt + reference == ids and len(prompt) == len(ids) // 2


def test_tool_calls_are_rendered_and_trained_by_a_tool_template(tiny_model, tmp_path) -> None:
    tok = load_tokenizer(with_template(tiny_model, tmp_path, TOOL_TEMPLATE))
    conversation = {
        "tools": [{"name": "add"}],
        "messages": [
            {"role": "user", "content": "Add 2 and 3."},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}],
            },
            {"role": "tool", "content": "5"},
            {"role": "assistant", "content": "It is 5."},
        ],
    }
    encoder = ChatEncoder(tok, 512)
    encoder.check_render(conversation)
    ids, labels = encode_one(encoder, conversation)
    assert (ids, labels) == reference_encode(tok, conversation, 512)
    targets = tok.decode([t for t, label in zip(ids, labels, strict=True) if label != IGNORE_INDEX])
    assert targets == (
        '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>\nIt is 5.<|im_end|>\n'
    )


def test_templates_that_cannot_place_labels_are_named(tiny_model, tmp_path) -> None:
    from staging.spans import TemplateUnsupported

    bare_chatml = (
        "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    no_tools = ChatEncoder(load_tokenizer(with_template(tiny_model, tmp_path / "bare", bare_chatml)), 512)
    call = {
        "messages": [
            {"role": "user", "content": "Add"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {}}}],
            },
        ]
    }
    assert no_tools.encode([call]).rejects == [
        (
            0,
            "turn 1: the chat template does not render tool calls; use a model "
            "whose template supports tools (or set model.chat_template)",
        )
    ]
    strict = (
        "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system prompts') }}"
        "{% endif %}{% endfor %}" + TOOL_TEMPLATE
    )
    refusing = ChatEncoder(load_tokenizer(with_template(tiny_model, tmp_path / "strict", strict)), 512)
    refused = chat(("system", "s"), ("user", "hi"), ("assistant", "ok"))
    refusing.check_render(refused)
    batch = refusing.encode([refused, chat(("user", "hi"), ("assistant", "ok"))])
    assert batch.rejects == [(0, "the chat template refused it: no system prompts")] and batch.kept.tolist() == [1]
    # Not ChatML, no generation blocks, and every prefix rendered differently: a run error naming the behaviour.
    counting = (
        "{{ messages | length }}\n{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant] {% endif %}"
    )
    unstable = ChatEncoder(load_tokenizer(with_template(tiny_model, tmp_path, counting)), 512)
    with pytest.raises(
        TemplateUnsupported,
        match=r"^the chat template renders earlier turns differently once later "
        r"turns follow, and marks assistant turns neither with",
    ):
        unstable.encode([chat(("user", "hi"), ("assistant", "ok"))])
    # A ChatML template whose history differs from its last turn is handled from the one full rendering.
    dated = "{{ messages | length }}\n" + TOOL_TEMPLATE
    ids, labels = encode_one(
        ChatEncoder(load_tokenizer(with_template(tiny_model, tmp_path / "dated", dated)), 512),
        chat(("user", "hi"), ("assistant", "ok"), ("user", "more"), ("assistant", "done")),
    )
    tok = load_tokenizer(tiny_model)
    assert tok.decode([t for t, la in zip(ids, labels, strict=True) if la != IGNORE_INDEX]) == (
        "ok<|im_end|>\ndone<|im_end|>\n"
    )


def test_a_tokenizer_without_chat_template_stages_plain_text_and_names_the_fix_for_chat(tiny_model, tmp_path) -> None:
    """A base model's tokenizer (no chat template) is enough for plain text, which is never rendered; chat data for
    it stops the staging in one line that says what to add, and leaves no dataset behind."""
    import json

    from config.sections.run_data import DataConfig
    from core.errors import UserError
    from staging.stage import stage_dataset

    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(tiny_model) / name, bare / name)
    notes = tmp_path / "notes.jsonl"
    notes.write_text("".join(json.dumps({"text": f"note {i}: two plus two is four."}) + "\n" for i in range(30)))
    ref = stage_dataset(
        DataConfig(source=str(notes)),
        Location(str(tmp_path / "storage")),
        str(bare),
        progress=lambda _: None,
        bars=False,
    )
    assert sum(ref.split_records.values()) > 0
    with pytest.raises(
        UserError,
        match=rf"^model.name_or_path {bare}: the tokenizer has no chat template, which "
        "chat data is rendered with; add chat_template.jinja ",
    ):
        stage_dataset(
            DataConfig(source=str(SAMPLE)),
            Location(str(tmp_path / "chat-storage")),
            str(bare),
            progress=lambda _: None,
            bars=False,
        )
    assert not list((tmp_path / "chat-storage").rglob("manifest.json"))
    with pytest.raises(UserError, match="no chat template"):  # where a template is needed up front
        load_tokenizer(str(bare))
