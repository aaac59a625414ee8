"""The environment DeepSpeed's just-in-time CUDA builds read (its fused Adam compiles on a node's first GPU run)."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import MutableMapping

log = logging.getLogger(__name__)

ARCH_LIST = "TORCH_CUDA_ARCH_LIST"
# "9.0a", "10.0f": a capability with PyTorch's arch-specific or family suffix.
SUFFIXED = re.compile(r"^(\d+\.\d+)[a-z]+(\+PTX)?$")


def plain_arch_list(environ: MutableMapping[str, str] = os.environ) -> str | None:
    """Rewrite TORCH_CUDA_ARCH_LIST without the letter suffixes of its capabilities ("9.0a" -> "9.0") for this
    process and its children; the new value, or None when there was nothing to rewrite.

    Why: DeepSpeed 0.19's builder sorts the list by int() of each part and fails on "9.0a" ("invalid literal for int()
    with base 10: '0a'", seen on an H200 image that sets TORCH_CUDA_ARCH_LIST=9.0a), before compiling anything. The
    suffix asks for instructions specific to one chip that none of DeepSpeed's ops use; the plain capability builds
    kernels that run on that chip all the same."""
    value = environ.get(ARCH_LIST, "").strip()
    if not value:
        return None
    parts = value.replace(" ", ";").split(";")
    plain = [SUFFIXED.sub(r"\1\2", p.strip()) for p in parts if p.strip()]
    rewritten = ";".join(dict.fromkeys(plain))
    if rewritten == ";".join(p.strip() for p in parts if p.strip()):
        return None
    environ[ARCH_LIST] = rewritten
    log.info(
        "%s=%s rewritten as %s for DeepSpeed's CUDA builds (it cannot parse the suffix)", ARCH_LIST, value, rewritten
    )
    return rewritten
