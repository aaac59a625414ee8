"""Materialize the built-in `tiny` model: a random Qwen2-shaped model and a byte-level BPE tokenizer
trained in-process, saved with `save_pretrained` so that everything downstream loads it through the
same `from_pretrained` path a real model takes.

    python -m trainer.tiny --out DIR --corpus FILE

The result depends only on the recipe below and the corpus bytes (fixed seed), so every machine
builds the same model; `COMPLETE` is written last.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

log = logging.getLogger(__name__)

# Shaped like a real Qwen2.5 model, only smaller: every linear layer's dimensions are multiples of 64
# (head_dim 64 as in Qwen2.5-0.5B, grouped-query attention), because kernels assume it. bitsandbytes
# packs 4-bit weights for its CPU kernel in blocks of 32 on CPUs with AVX512-BF16, and refuses other sizes.
RECIPE = {
    "vocab_size": 2048,
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 4096,
    "seed": 1234,
}
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen's ChatML template, without the default system prompt.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def corpus_texts(corpus: Path) -> list[str]:
    """Every string in a JSON/JSONL corpus file (values of any nesting), in file order."""
    raw = corpus.read_text(encoding="utf-8")
    try:
        docs = [json.loads(raw)]
    except json.JSONDecodeError:
        docs = [json.loads(line) for line in raw.splitlines() if line.strip()]
    texts: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, str):
            texts.append(node)
        elif isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(docs)
    return texts


def build_tokenizer(texts: list[str]):
    """A byte-level BPE tokenizer (Qwen-style special tokens, ChatML template) trained on `texts`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=RECIPE["vocab_size"] - len(SPECIAL_TOKENS),
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    fast.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS[1:]})
    fast.add_special_tokens({"pad_token": SPECIAL_TOKENS[0], "eos_token": SPECIAL_TOKENS[2]})
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = RECIPE["max_position_embeddings"]
    return fast


def build_model(vocab_size: int, pad_id: int, eos_id: int):
    """A Qwen2ForCausalLM with random weights from a fixed seed."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(RECIPE["seed"])
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=RECIPE["hidden_size"],
        intermediate_size=RECIPE["intermediate_size"],
        num_hidden_layers=RECIPE["num_hidden_layers"],
        num_attention_heads=RECIPE["num_attention_heads"],
        num_key_value_heads=RECIPE["num_key_value_heads"],
        max_position_embeddings=RECIPE["max_position_embeddings"],
        tie_word_embeddings=False,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        bos_token_id=None,
    )
    return Qwen2ForCausalLM(config)


def materialize(out: Path, corpus: Path) -> None:
    """Write tokenizer + model + COMPLETE into `out` unless a complete copy is already there."""
    if (out / "COMPLETE").exists():
        log.info("tiny model already at %s", out)
        return
    tokenizer = build_tokenizer(corpus_texts(corpus))
    model = build_model(len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id)
    staging = out.with_name(f".staging-{out.name}")
    staging.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(staging)
    model.save_pretrained(staging, safe_serialization=True)
    (staging / "COMPLETE").write_text(json.dumps(RECIPE, sort_keys=True) + "\n")
    try:
        staging.rename(out)
    except OSError:  # another process won the race and its copy is identical
        if not (out / "COMPLETE").exists():
            raise


def main(argv: list[str] | None = None) -> int:
    """CLI entry: build the tiny model into --out."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path, help="directory to create")
    parser.add_argument("--corpus", required=True, type=Path, help="JSON/JSONL file to train the tokenizer on")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    materialize(args.out, args.corpus)
    return 0


if __name__ == "__main__":
    sys.exit(main())
