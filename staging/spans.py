"""Where an assistant turn's targets are in the one rendering of a whole conversation.

Templates may render history differently from the last turn (Qwen3 drops the reasoning of assistant turns before
the last user message; others do the same with system prompts or dates), so the turns are found in the full
rendering itself, never by rendering prefixes and comparing. In order of preference:

1. `{% generation %}` blocks: a template that marks the assistant's text says exactly what is trained.
2. ChatML role markers (Qwen and every template whose generation prompt opens `<|im_start|>assistant`): the k-th
   `<|im_start|>assistant` of the rendering is the k-th assistant message.
3. Prefixes, for other templates: the text between the rendering of the turns before (with the generation prompt)
   and through the turn; it needs a template that renders each prefix as a prefix of the whole, and says so.

The span rule for ChatML: a target starts after the header `<|im_start|>assistant\n` and ends after the turn's end
token `<|im_end|>` (a target, so the model learns to stop) and the newline the template writes after it (also a
target: it is what follows the end token in every rendering). An empty reasoning block (`<think>\n\n</think>\n\n`,
Qwen3's last turn without reasoning) at the start of a turn is a target with data.enable_thinking (the model
learns to skip thinking for such data) and part of the prompt without (the non-thinking mode's prompt).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from core.errors import UserError
from staging.formats import InvalidRecord, Message

HEADER = "<|im_start|>assistant"
MARKERS = ("<|im_start|>", "<|im_end|>")
END = "<|im_end|>"
EMPTY_REASONING = re.compile(r"<think>\s*</think>\s*")
GENERATION_TAG = re.compile(r"{%-?\s*generation\s*-?%}")
Span = tuple[int, int]
Render = Callable[[list[Message], bool], str]


class TemplateUnsupported(UserError):
    """The chat template renders conversations in a way no method here can place labels in; a run error."""


def uses_generation_blocks(source: str) -> bool:
    """Whether a template marks the assistant's text with {% generation %} blocks."""
    return bool(GENERATION_TAG.search(source))


def is_chatml(render: Render) -> bool:
    """Whether the template's generation prompt opens a ChatML assistant turn."""
    probe: list[Message] = [{"role": "user", "content": "x"}]
    try:
        return render(probe, True)[len(render(probe, False)) :].startswith(HEADER)
    except InvalidRecord:
        return False


def renders_reasoning(render: Callable[[list[Message]], str]) -> bool:
    """Whether a template renders an assistant's reasoning_content (Qwen3's does, in its `<think>` block; most
    templates drop it): a probe conversation's marker is looked for in the rendering."""
    marker = "tandem-reasoning-probe-7f3a"
    probe: list[Message] = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "y", "reasoning_content": marker},
    ]
    try:
        return marker in render(probe)
    except InvalidRecord:
        return False


def assistant_indices(messages: list[Message]) -> list[int]:
    """Indices of the assistant messages, in order."""
    return [index for index, message in enumerate(messages) if message["role"] == "assistant"]


def chatml_spans(text: str, messages: list[Message], enable_thinking: bool) -> list[Span]:
    """One span per assistant message, from the role markers of the full rendering."""
    for index, message in enumerate(messages):
        for marker in MARKERS:
            if marker in (message.get("content") or "") or marker in (message.get("reasoning_content") or ""):
                raise InvalidRecord(
                    f"turn {index}: the text contains the chat marker {marker!r}, which the "
                    "tokenizer reads as a turn boundary; remove it from the data"
                )
    spans = []
    start = text.find(HEADER)
    while start >= 0:
        begin = start + len(HEADER)
        begin += text.startswith("\n", begin)
        close = text.find(END, begin)
        if close < 0:
            raise TemplateUnsupported(
                f"the chat template opens an assistant turn ({HEADER!r}) without closing it "
                f"with {END!r}; use a template that ends every turn (model.chat_template)"
            )
        end = close + len(END)
        end += text.startswith("\n", end)
        empty = EMPTY_REASONING.match(text, begin)
        if empty and not enable_thinking:
            begin = empty.end()
        spans.append((begin, end))
        start = text.find(HEADER, end)
    expected = len(assistant_indices(messages))
    if len(spans) != expected:
        raise TemplateUnsupported(
            f"the chat template renders {len(spans)} assistant turns for a conversation of {expected} assistant "
            "messages (it merges, drops or adds turns), so their tokens cannot be told apart; use a template that "
            "renders each assistant message as one turn, or marks it with {% generation %} (model.chat_template)"
        )
    return spans


def generation_spans(indices: list[Span], messages: list[Message]) -> list[Span]:
    """One span per assistant message, from the template's {% generation %} blocks."""
    expected = len(assistant_indices(messages))
    if len(indices) != expected:
        raise TemplateUnsupported(
            f"the chat template has {len(indices)} {{% generation %}} blocks for a conversation of {expected} "
            "assistant messages; it must wrap each assistant message in exactly one (model.chat_template)"
        )
    return list(indices)


def prefix_spans(text: str, messages: list[Message], render: Render) -> list[Span]:
    """One span per assistant message, from renderings of the conversation's prefixes."""
    spans = []
    for index in assistant_indices(messages):
        head = render(messages[:index], True)
        through = text if index == len(messages) - 1 else render(messages[: index + 1], False)
        if not (text.startswith(head) and text.startswith(through)):
            raise TemplateUnsupported(
                "the chat template renders earlier turns differently once later turns follow, and marks assistant "
                "turns neither with {% generation %} blocks nor with ChatML's <|im_start|>assistant, so assistant "
                "tokens cannot be located; give model.chat_template a template that wraps each assistant message "
                "in {% generation %} ... {% endgeneration %}"
            )
        spans.append((len(head), len(through)))
    return spans


def check_tool_calls(text: str, messages: list[Message], spans: list[Span]) -> None:
    """Every tool call's function name appears in its turn's span: the template renders tool calls."""
    for index, (start, end) in zip(assistant_indices(messages), spans, strict=True):
        for call in messages[index].get("tool_calls", ()):
            function: Any = call.get("function", call) if isinstance(call, dict) else {}
            if function.get("name", "") not in text[start:end]:
                raise InvalidRecord(
                    f"turn {index}: the chat template does not render tool calls; "
                    "use a model whose template supports tools (or set model.chat_template)"
                )


def trained(spans: list[Span], messages: list[Message], mask_history: bool) -> list[bool]:
    """Which assistant spans are targets: not weight 0, and only the last with mask_history."""
    indices = assistant_indices(messages)
    assert len(indices) == len(spans), "one span per assistant message"
    return [
        messages[index].get("weight") != 0 and (not mask_history or n == len(indices) - 1)
        for n, index in enumerate(indices)
    ]
