"""Materialize a built-in model: a random Qwen2-shaped model and a byte-level BPE tokenizer with Qwen2.5's added
tokens and chat template, saved with `save_pretrained` so that everything downstream loads it through the same
`from_pretrained` path a real model takes.

    python -m trainer.model.tiny --out DIR --corpus FILE [--model tiny|tiny-qwen2.5]

`tiny` trains a small BPE on the corpus (Qwen2's pre-tokenizer and normalizer); `tiny-qwen2.5` takes Qwen's own
BPE (trainer/model/tiny_qwen.py) over a model of the full vocabulary. The result depends only on the recipe below and
the corpus bytes (fixed seed), so every machine builds the same model; `COMPLETE` is written last.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from config.chat_template import builtin_template
from config.sections.model_train import BUILTIN_MODELS
from core.errors import UserError
from storage.full import full_storage_is_one_line
from trainer.model.tiny_qwen import QWEN25_ADDED_TOKENS, QWEN25_VOCAB_SIZE, build_qwen25_tokenizer, qwen25_fast

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
# Qwen2's pre-tokenizer split (before the byte-level mapping): letters, single digits, punctuation runs, newlines.
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+"
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


def build_tokenizer(texts: list[str]) -> Any:
    """A byte-level BPE tokenizer trained on `texts`, with Qwen2's pre-tokenizer, added tokens and chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=RECIPE["vocab_size"] - len(QWEN25_ADDED_TOKENS),
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # The template's fixed text (default system prompt, tools preamble) is in every example: give it merges too.
    tok.train_from_iterator([*texts, builtin_template("qwen2.5")], trainer=trainer)
    return qwen25_fast(tok, RECIPE["max_position_embeddings"])


def build_model(vocab_size: int, pad_id: int, eos_id: int, tie_word_embeddings: bool = False) -> Any:
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
        tie_word_embeddings=tie_word_embeddings,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        bos_token_id=None,
    )
    return Qwen2ForCausalLM(config)


def build(name: str, corpus: Path) -> tuple[Any, Any]:
    """(tokenizer, model) of a built-in model."""
    if name == "tiny-qwen2.5":
        tokenizer = build_qwen25_tokenizer()
        # Qwen2.5's embedding rows (151936, padded past the tokenizer); tied, as in Qwen2.5-0.5B, to halve the size.
        return tokenizer, build_model(QWEN25_VOCAB_SIZE, tokenizer.pad_token_id, tokenizer.eos_token_id, True)
    tokenizer = build_tokenizer(corpus_texts(corpus))
    # The small corpus runs out of merges before vocab_size: the rows past the tokenizer are padding, as in Qwen.
    assert len(tokenizer) <= RECIPE["vocab_size"]
    return tokenizer, build_model(RECIPE["vocab_size"], tokenizer.pad_token_id, tokenizer.eos_token_id)


def materialize(out: Path, corpus: Path, name: str = "tiny") -> None:
    """Write tokenizer + model + COMPLETE into `out` unless a complete copy is already there."""
    if (out / "COMPLETE").exists():
        log.info("%s model already at %s", name, out)
        return
    tokenizer, model = build(name, corpus)
    staging = out.with_name(f".staging-{out.name}")
    staging.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(staging)
    model.save_pretrained(staging, safe_serialization=True)
    (staging / "COMPLETE").write_text(json.dumps({**RECIPE, "model": name}, sort_keys=True) + "\n")
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
    parser.add_argument("--model", default="tiny", choices=BUILTIN_MODELS, help="which built-in model")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        with full_storage_is_one_line(file=str(args.out)):
            materialize(args.out, args.corpus, args.model)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
