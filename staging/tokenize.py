"""Tokenize conversations once, with the model's chat template (or model.chat_template), masking labels to the
assistant turns.

The template is rendered once for the whole conversation and the assistant turns' character spans are found in
that rendering (staging/spans.py says how, and where a span starts and ends). A token is a target when its
start offset falls inside such a span; all others get -100 (Hugging Face's convention: the model shifts labels by
one internally). Conversations are tokenized in batches by the fast tokenizer's backend, and the spans are mapped
to token ranges by searching token starts, never token by token: starts summed from the ids' byte lengths for
byte-level BPE tokenizers (staging/offsets.py), else the offsets the backend tracks. Where tiktoken reproduces the
tokenizer (staging/ranked_bpe.py: Qwen's among others) it encodes, about 3.6 times faster than the backend. An
example longer than data.max_length keeps the window staging/length.py chooses (data.excess_length: truncate), or
is returned as dropped (drop, fail).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from jinja2 import TemplateError

from core.errors import UserError
from staging import length
from staging import spans as locate
from staging.formats import Conversation, InvalidRecord, Message
from staging.offsets import ByteOffsets, first_tokens_at
from staging.ranked_bpe import RankedBPE
from staging.tokenizer import document_end, load_tokenizer, no_template_error
from staging.vision import NO_IMAGES, Vision, cut_reason, expand, image_runs, image_texts, keeps_images
from storage.shards import IGNORE_INDEX, ExampleImages


@dataclass
class EncodedBatch:
    """Token ids and labels of the kept conversations of a batch, flat, with per-example lengths."""

    ids: np.ndarray
    labels: np.ndarray
    lengths: np.ndarray
    truncated: np.ndarray
    kept: np.ndarray  # indices (in the batch) of the conversations encoded
    rejects: list[tuple[int, str]] = field(default_factory=list)  # (index in the batch, reason)
    dropped: list[tuple[int, str]] = field(default_factory=list)  # over-long, by data.excess_length: drop or fail
    segments: np.ndarray | None = None  # preference rows (staging/pairs.py): each row's 3 segment lengths
    feedback: np.ndarray | None = None  # and its label (storage/shards.py PAIR, 1, 0)
    longest: int = 0  # tokens of the batch's longest conversation before data.max_length cut or dropped it
    images: list[ExampleImages] = field(default_factory=list)  # per kept example: its images' names and tokens
    records: list[str] | None = None  # prompt rows (staging/prompts.py): each kept row's record, as JSON


@dataclass(frozen=True)
class EncoderSettings:
    """What a tokenizing process needs (picklable, for the worker processes)."""

    model_path: str
    max_length: int
    chat_template: str | None = None  # model.chat_template's text; None: the tokenizer's own
    enable_thinking: bool = True
    mask_history: bool = False
    excess_length: str = "truncate"
    trust_remote_code: bool = False  # model.trust_remote_code
    vision: Vision | None = None  # a vision-language model's images (staging/vision.py); None: text only

    def encoder(self) -> ChatEncoder:
        """A ChatEncoder with the tokenizer loaded."""
        return ChatEncoder(
            load_tokenizer(
                self.model_path,
                self.chat_template,
                require_template=False,
                trust_remote_code=self.trust_remote_code,
            ),
            self.max_length,
            enable_thinking=self.enable_thinking,
            mask_history=self.mask_history,
            excess_length=self.excess_length,
            name=self.model_path,
            vision=self.vision,
        )


def reasoning_error(location: str) -> UserError:
    """A record with reasoning for a chat template that does not render it: the run's data and template disagree."""
    return UserError(
        f"{location}: the record has reasoning (reasoning_content, or v1 'reasoning' parts), but the chat template "
        "does not render an assistant's reasoning_content, so it would be dropped; set model.chat_template to a "
        "template that renders it (Qwen3's does), set data.enable_thinking=false to train without the reasoning, or "
        "remove the reasoning parts"
    )


class ChatEncoder:
    """Renders conversations with a tokenizer's chat template and encodes them with its fast backend."""

    def __init__(
        self,
        tokenizer: Any,
        max_length: int,
        *,
        enable_thinking: bool = True,
        mask_history: bool = False,
        excess_length: str = "truncate",
        byte_offsets: bool = True,
        ranked_bpe: bool = True,
        name: str = "",
        vision: Vision | None = None,
    ) -> None:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        self.tokenizer = tokenizer
        self.max_length = max_length
        self.vision = vision
        # The start, pad and end tokens' text an image is expanded to (ids from the model's config.json).
        self.image_texts = image_texts(tokenizer, vision)
        self.enable_thinking = enable_thinking
        self.mask_history = mask_history
        self.excess_length = excess_length
        self.backend = tokenizer.backend_tokenizer
        # tokenizer(text) switches these off per call; calling the backend directly must do the same.
        self.backend.no_truncation()
        self.backend.no_padding()
        spec = json.loads(self.backend.to_str())  # the tokenizer.json (Qwen's: 7 MB), parsed once for both
        self.offsets = ByteOffsets.of(self.backend, spec) if byte_offsets else None
        self.ranked = RankedBPE.of(self.backend, spec) if ranked_bpe and self.offsets is not None else None
        self.special = dict(tokenizer.special_tokens_map)
        self._compile = _compile_jinja_template
        self._templates: dict[bool, tuple[Any, dict[str, Any]]] = {}
        self.document_end = document_end(tokenizer)
        self.name = name  # the model's path, for the error a tokenizer without a chat template gives chat data
        self.has_template = tokenizer.chat_template is not None
        source = tokenizer.get_chat_template(None, None) if self.has_template else ""
        self.generation_blocks = locate.uses_generation_blocks(source)
        self.chatml = (
            self.has_template and not self.generation_blocks and locate.is_chatml(lambda m, g: self.render(m, None, g))
        )
        # Probed once: records with reasoning need a template that renders it (unless enable_thinking drops it).
        self.renders_reasoning = self.has_template and locate.renders_reasoning(lambda m: self.render(m, None, False))

    def _variables(self, messages: list[Message], tools: list[Any] | None, generation_prompt: bool) -> dict[str, Any]:
        return {
            "messages": messages,
            "tools": tools,
            "documents": None,
            "add_generation_prompt": generation_prompt,
            "enable_thinking": self.enable_thinking,
        }

    def render(self, messages: list[Message], tools: list[Any] | None, generation_prompt: bool) -> str:
        """What `apply_chat_template(..., tokenize=False)` gives, without its per-call overhead."""
        key = tools is not None
        if key not in self._templates:
            source = self.tokenizer.get_chat_template(None, tools)
            # transformers' sandboxed environment (its filters and globals), but our own Template object, and
            # its globals merged with the special tokens once: Template.render would merge a ChainMap per call.
            template = self._compile(source).environment.from_string(source)
            template.globals = dict(template.globals)  # each Context would otherwise walk the ChainMap
            self._templates[key] = (template, {**template.globals, **self.special})
        template, variables = self._templates[key]
        context = template.new_context(
            {**variables, **self._variables(messages, tools, generation_prompt)}, shared=True
        )
        try:
            return "".join(template.root_render_func(context))
        except TemplateError as exc:  # e.g. raise_exception('...') in the template: this record, not the run
            raise InvalidRecord(f"the chat template refused it: {exc}") from None

    def _render_generation(self, messages: list[Message], tools: list[Any] | None) -> tuple[str, list[Any]]:
        """The rendering and the character spans of its {% generation %} blocks (transformers' tracker)."""
        from transformers.utils.chat_template_utils import _render_with_assistant_indices

        source = self.tokenizer.get_chat_template(None, tools)
        try:
            return _render_with_assistant_indices(
                self._compile(source), **self._variables(messages, tools, False), **self.special
            )
        except TemplateError as exc:
            raise InvalidRecord(f"the chat template refused it: {exc}") from None

    def prepare(self, conversation: Conversation) -> tuple[list[Message], list[Any] | None]:
        """The messages as the template receives them: without reasoning_content unless data.enable_thinking."""
        messages = conversation["messages"]
        if not self.enable_thinking:
            messages = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in messages]
        return messages, conversation.get("tools")

    def drops_reasoning(self, conversation: Conversation) -> bool:
        """Whether a conversation carries reasoning that the chat template would drop (data.enable_thinking
        drops it on purpose: then it is not the template's doing)."""
        if "text" in conversation or not self.has_template or self.renders_reasoning or not self.enable_thinking:
            return False
        return any((m.get("reasoning_content") or "").strip() for m in conversation["messages"])

    def check_render(self, conversation: Conversation) -> None:
        """Fail loudly if the fast render ever differs from `apply_chat_template` (a transformers upgrade)."""
        if "text" in conversation or not self.has_template:
            return  # plain text is not rendered; spans() refuses chat records without a template
        messages, tools = self.prepare(conversation)
        try:
            ours = self.render(messages, tools, False)
        except InvalidRecord:
            return  # the template refuses this one; encode() rejects it with the reason
        theirs = self.tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, enable_thinking=self.enable_thinking
        )
        if ours != theirs:
            raise RuntimeError(
                "the fast chat-template render differs from apply_chat_template; "
                "this transformers version is not supported by staging/tokenize.py"
            )

    def spans(self, conversation: Conversation) -> tuple[str, list[tuple[int, int]], list[bool]]:
        """The rendered conversation, the character spans [start, end) of its assistant turns, and which of
        them are targets. Plain text is one target turn, ended with the end-of-document token."""
        if "text" in conversation:
            if self.document_end is None:
                raise UserError(
                    "the tokenizer has neither an end-of-document token nor an eos_token, which "
                    "plain-text examples (data.format text) end with; set eos_token in its "
                    "tokenizer_config.json"
                )
            text = conversation["text"] + self.document_end
            return text, [(0, len(text))], [True]
        if not self.has_template:
            raise no_template_error(self.name)
        messages, tools = self.prepare(conversation)
        if self.generation_blocks:
            text, indices = self._render_generation(messages, tools)
            spans = locate.generation_spans(indices, messages)
        else:
            text = self.render(messages, tools, False)
            if self.chatml:
                spans = locate.chatml_spans(text, messages, self.enable_thinking)
            else:
                spans = locate.prefix_spans(text, messages, lambda m, g: self.render(m, tools, g))
        locate.check_tool_calls(text, messages, spans)
        return text, spans, locate.trained(spans, messages, self.mask_history)

    def encode(self, conversations: list[Conversation]) -> EncodedBatch:
        """Encode a batch; conversations that cannot be trained on are returned as rejects with the reason, and
        over-long ones (unless data.excess_length is truncate, or truncating would cut an image) as dropped."""
        rendered: list[tuple[int, str, list[tuple[int, int]], list[bool]]] = []
        images: dict[int, ExampleImages] = {}
        rejects: list[tuple[int, str]] = []
        for index, conversation in enumerate(conversations):
            try:
                if "images" in conversation:
                    conversation, images[index] = expand(conversation, self.vision, self.image_texts)
                rendered.append((index, *self.spans(conversation)))
            except InvalidRecord as exc:
                rejects.append((index, str(exc)))
        out = _Collector()
        for (index, _, _, flags), (ids, bounds) in zip(rendered, self.token_bounds(rendered), strict=True):
            turns = list(zip(bounds[0::2], bounds[1::2], strict=True))
            targets = [turn for turn, flag in zip(turns, flags, strict=True) if flag and turn[0] < turn[1]]
            n_tokens = len(ids)
            out.longest = max(out.longest, n_tokens)
            pictures = images.get(index, NO_IMAGES)
            runs = image_runs(ids, self.vision, pictures)
            if not targets:
                rejects.append(
                    (index, "the chat template left no assistant tokens; check the tokenizer's chat template")
                )
            elif n_tokens > self.max_length and self.excess_length != "truncate":
                out.dropped.append((index, f"{n_tokens} tokens, longer than data.max_length={self.max_length}"))
            else:
                first, stop = length.window(n_tokens, turns, targets[0], self.max_length)
                if not keeps_images(runs, first, stop):
                    out.dropped.append((index, cut_reason(n_tokens, runs, self.max_length)))
                    continue
                out.add(
                    index,
                    ids[first:stop],
                    [(max(a, first) - first, min(b, stop) - first) for a, b in targets],
                    stop - first < n_tokens,
                    pictures,
                )
        rejects.sort()
        return out.batch(rejects)

    def token_bounds(
        self, rendered: list[tuple[int, str, list[tuple[int, int]], list[bool]]]
    ) -> Iterator[tuple[np.ndarray, list[int]]]:
        """Each rendered text's ids, and the token index at each boundary of its spans (start, end, start, ...)."""
        texts = [text for _, text, _, _ in rendered]
        if self.offsets is None:
            encodings = self.backend.encode_batch(texts, add_special_tokens=False)
            for (_, text, spans, _), encoding in zip(rendered, encodings, strict=True):
                yield (
                    np.array(encoding.ids, dtype=np.int32),
                    [_first_token_at(encoding, len(text), p) for span in spans for p in span],
                )
            return
        # No tracked offsets (a third faster): token starts are summed from the ids (staging/offsets.py), and the
        # ids come from tiktoken where it reproduces this tokenizer (staging/ranked_bpe.py), else the backend.
        if self.ranked is not None:
            batch_ids = self.ranked.encode(texts)
            if texts:
                self.ranked.check(self.backend, texts[0], batch_ids[0])
        else:
            batch_ids = [encoding.ids for encoding in self.backend.encode_batch_fast(texts, add_special_tokens=False)]
        for (_, text, spans, _), token_ids in zip(rendered, batch_ids, strict=True):
            ids = np.array(token_ids, dtype=np.int32)
            starts = self.offsets.starts(text, ids)
            if starts is not None:
                yield ids, first_tokens_at(text, starts, [p for span in spans for p in span])
            else:  # not exactly its tokens' bytes (a text the NFC normalizer changes): encode it again, with offsets
                encoding = self.backend.encode(text, add_special_tokens=False)
                yield (
                    np.array(encoding.ids, dtype=np.int32),
                    [_first_token_at(encoding, len(text), p) for span in spans for p in span],
                )


class _Collector:
    """The kept examples of a batch, as they are encoded."""

    def __init__(self) -> None:
        self.ids: list[np.ndarray] = []
        self.targets: list[list[tuple[int, int]]] = []  # token ranges of the targets, per kept example
        self.lengths: list[int] = []
        self.truncated: list[bool] = []
        self.kept: list[int] = []
        self.dropped: list[tuple[int, str]] = []
        self.longest = 0
        self.images: list[ExampleImages] = []

    def add(
        self, index: int, ids: np.ndarray, targets: list[tuple[int, int]], truncated: bool, images: ExampleImages
    ) -> None:
        """One kept example: its ids, its target ranges within them, and its images."""
        self.images.append(images)
        self.ids.append(ids)
        self.targets.append([(a, b) for a, b in targets if a < b])
        self.lengths.append(len(ids))
        self.truncated.append(truncated)
        self.kept.append(index)

    def batch(self, rejects: list[tuple[int, str]]) -> EncodedBatch:
        """The EncodedBatch of what was added."""
        ids = np.concatenate(self.ids) if self.ids else np.zeros(0, dtype=np.int32)
        return EncodedBatch(
            ids,
            _labels(ids, self.lengths, self.targets),
            np.array(self.lengths, dtype=np.int32),
            np.array(self.truncated, dtype=bool),
            np.array(self.kept, dtype=np.int32),
            rejects,
            self.dropped,
            longest=self.longest,
            images=self.images,
        )


def _labels(ids: np.ndarray, lengths: list[int], targets: list[list[tuple[int, int]]]) -> np.ndarray:
    """-100 everywhere but the target ranges (within each example), which copy the ids."""
    labels = np.full(len(ids), IGNORE_INDEX, dtype=np.int32)
    offset = 0
    for example_length, ranges in zip(lengths, targets, strict=True):
        for first, stop in ranges:
            labels[offset + first : offset + stop] = ids[offset + first : offset + stop]
        offset += example_length
    return labels


def _first_token_at(encoding: Any, text_length: int, position: int) -> int:
    """Index of the first token whose start offset is >= position (offsets never decrease along a text)."""
    n = len(encoding)
    if position >= text_length:
        return n
    token = encoding.char_to_token(position)
    if token is None:  # a character no token covers (dropped by a normalizer): search the offsets
        return next((t for t in range(n) if _begin(encoding, t) >= position), n)
    if _begin(encoding, token) < position:
        token += 1
        while token < n and _begin(encoding, token) < position:
            token += 1
    else:
        while token > 0 and _begin(encoding, token - 1) >= position:
            token -= 1
    return token


def _begin(encoding: Any, token: int) -> int:
    """Start offset of one token (`encoding.offsets` would build the whole list)."""
    return encoding.token_to_chars(token)[0]
