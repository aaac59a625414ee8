"""Tokenization: labels are exactly the assistant tokens of every assistant turn, the fast batched encoder gives
the same ids and labels as the plain per-turn algorithm, and examples that cannot be trained on are named."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tasks.data.formats import Conversation
from tasks.data.records import read_records
from tasks.data.tokenize import IGNORE_INDEX, ChatEncoder, load_tokenizer

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample" / "conversations.json"
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
        start = len(tokenizer.apply_chat_template(messages[:index], tools=tools, tokenize=False,
                                                  add_generation_prompt=True))
        end = len(tokenizer.apply_chat_template(messages[: index + 1], tools=tools, tokenize=False))
        spans.append((start, end))
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    labels = [tok if any(start <= begin < end for start, end in spans) else IGNORE_INDEX
              for tok, (begin, _) in zip(ids, offsets, strict=True)]
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
    conversation = chat(("system", "Be brief."), ("user", "Add 2 and 3."), ("assistant", "2 plus 3 is 5."),
                        ("user", "Times 4?"), ("assistant", "5 times 4 is 20."))
    ids, labels = encode_one(ChatEncoder(tok, 512), conversation)
    assert all(label in (IGNORE_INDEX, tid) for tid, label in zip(ids, labels, strict=True))
    targets = tok.decode([t for t, label in zip(ids, labels, strict=True) if label != IGNORE_INDEX])
    masked = tok.decode([t for t, label in zip(ids, labels, strict=True) if label == IGNORE_INDEX])
    # ChatML, written out by hand: each assistant turn's content and its <|im_end|>\n are the targets.
    assert targets == "2 plus 3 is 5.<|im_end|>\n5 times 4 is 20.<|im_end|>\n"
    assert masked == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nAdd 2 and 3.<|im_end|>\n"
                      "<|im_start|>assistant\n<|im_start|>user\nTimes 4?<|im_end|>\n<|im_start|>assistant\n")
    assert ids == tok(tok.apply_chat_template(conversation["messages"], tokenize=False),
                      add_special_tokens=False)["input_ids"]


def test_fast_encoder_matches_the_per_token_reference(builtin_tokenizer) -> None:
    tok = load_tokenizer(builtin_tokenizer)
    conversations = [r.conversation for r in read_records(str(SAMPLE), "auto")]
    conversations += [
        chat(("user", "Ünïcödé: 你好, мир — ok?"), ("assistant", "  leading spaces and émojis 🙂\n\n")),
        chat(("user", "a"), ("assistant", "b"), ("user", "c"), ("assistant", "d"), ("user", "e"), ("assistant", "f")),
        chat(("user", "What is\n\n7?"), ("assistant", "\nSeven.\n")),
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hey", "weight": 0},
                      {"role": "user", "content": "2+2"}, {"role": "assistant", "content": "4"}]},
    ]
    for max_length in (512, 32):
        batch = ChatEncoder(tok, max_length).encode(conversations)
        rejected = {index for index, _ in batch.rejects}
        assert (len(rejected) > 0) == (max_length == 32)  # the short limit cuts off some whole answers
        assert batch.kept.tolist() == [i for i in range(len(conversations)) if i not in rejected]
        position = 0
        for index, length in zip(batch.kept.tolist(), batch.lengths.tolist(), strict=True):
            ids, labels = reference_encode(tok, conversations[index], max_length)
            assert batch.ids[position:position + length].tolist() == ids
            assert batch.labels[position:position + length].tolist() == labels
            position += length
        for index in rejected:  # rejected only because the reference keeps no target within max_length
            assert set(reference_encode(tok, conversations[index], max_length)[1]) == {IGNORE_INDEX}


def test_weight_zero_turns_are_not_targets(builtin_tokenizer) -> None:
    tok = load_tokenizer(builtin_tokenizer)
    conversation = {"messages": [{"role": "user", "content": "hi"},
                                 {"role": "assistant", "content": "ignored reply", "weight": 0},
                                 {"role": "user", "content": "2+2"}, {"role": "assistant", "content": "4"}]}
    ids, labels = encode_one(ChatEncoder(tok, 512), conversation)
    assert tok.decode([t for t, label in zip(ids, labels, strict=True) if label != IGNORE_INDEX]) == "4<|im_end|>\n"


def test_truncation_is_counted_and_prompts_longer_than_max_length_are_rejected(builtin_tokenizer) -> None:
    tok = load_tokenizer(builtin_tokenizer)
    head = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    prompt = len(tok(head, add_special_tokens=False)["input_ids"])
    limit = prompt + 4
    encoder = ChatEncoder(tok, limit)
    batch = encoder.encode([chat(("user", "hi"), ("assistant", "word " * 50)),
                            chat(("user", "word " * 50), ("assistant", "ok")),
                            chat(("user", "hi"), ("assistant", "ok"))])
    assert batch.kept.tolist() == [0, 2] and batch.truncated.tolist() == [True, False]
    assert batch.lengths[0] == limit and len(batch.ids) == len(batch.labels) == limit + batch.lengths[1]
    [(index, reason)] = batch.rejects
    assert index == 1 and reason.startswith(f"no assistant token within data.max_length={limit} (the first is token ")
    assert reason.endswith("raise data.max_length or shorten the prompt")


def test_tool_calls_are_rendered_and_trained_by_a_tool_template(tiny_model, tmp_path) -> None:
    tok = load_tokenizer(with_template(tiny_model, tmp_path, TOOL_TEMPLATE))
    conversation = {"tools": [{"name": "add"}], "messages": [
        {"role": "user", "content": "Add 2 and 3."},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]},
        {"role": "tool", "content": "5"}, {"role": "assistant", "content": "It is 5."}]}
    encoder = ChatEncoder(tok, 512)
    encoder.check_render(conversation)
    ids, labels = encode_one(encoder, conversation)
    assert (ids, labels) == reference_encode(tok, conversation, 512)
    targets = tok.decode([t for t, label in zip(ids, labels, strict=True) if label != IGNORE_INDEX])
    assert targets == ('<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>\n'
                       "It is 5.<|im_end|>\n")


def test_templates_that_cannot_place_labels_are_named(tiny_model, tmp_path) -> None:
    from tasks.data.spans import TemplateUnsupported

    bare_chatml = ("{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
                   "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    no_tools = ChatEncoder(load_tokenizer(with_template(tiny_model, tmp_path / "bare", bare_chatml)), 512)
    call = {"messages": [{"role": "user", "content": "Add"}, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "add", "arguments": {}}}]}]}
    assert no_tools.encode([call]).rejects == [(0, "turn 1: the chat template does not render tool calls; use a model "
                                                   "whose template supports tools (or set model.chat_template)")]
    strict = ("{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system prompts') }}"
              "{% endif %}{% endfor %}" + TOOL_TEMPLATE)
    refusing = ChatEncoder(load_tokenizer(with_template(tiny_model, tmp_path / "strict", strict)), 512)
    refused = chat(("system", "s"), ("user", "hi"), ("assistant", "ok"))
    refusing.check_render(refused)
    batch = refusing.encode([refused, chat(("user", "hi"), ("assistant", "ok"))])
    assert batch.rejects == [(0, "the chat template refused it: no system prompts")] and batch.kept.tolist() == [1]
    # Not ChatML, no generation blocks, and every prefix rendered differently: a run error naming the behaviour.
    counting = ("{{ messages | length }}\n{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
                "{% if add_generation_prompt %}[assistant] {% endif %}")
    unstable = ChatEncoder(load_tokenizer(with_template(tiny_model, tmp_path, counting)), 512)
    with pytest.raises(TemplateUnsupported, match=r"^the chat template renders earlier turns differently once later "
                                                  r"turns follow, and marks assistant turns neither with"):
        unstable.encode([chat(("user", "hi"), ("assistant", "ok"))])
    # A ChatML template whose history differs from its last turn is handled from the one full rendering.
    dated = "{{ messages | length }}\n" + TOOL_TEMPLATE
    ids, labels = encode_one(ChatEncoder(load_tokenizer(with_template(tiny_model, tmp_path / "dated", dated)), 512),
                             chat(("user", "hi"), ("assistant", "ok"), ("user", "more"), ("assistant", "done")))
    tok = load_tokenizer(tiny_model)
    assert tok.decode([t for t, la in zip(ids, labels, strict=True) if la != IGNORE_INDEX]) == (
        "ok<|im_end|>\ndone<|im_end|>\n")


def test_a_tokenizer_without_chat_template_is_named(tiny_model, tmp_path) -> None:
    from config.errors import UserError

    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(tiny_model) / name, bare / name)
    with pytest.raises(UserError, match=rf"^model.name_or_path {bare}: the tokenizer has no chat template; add "):
        load_tokenizer(str(bare))
