"""A rank's log line format and its parser, in one place: what the trainer writes, the launcher reads back."""

from __future__ import annotations

import io
import logging

from core.rank_log import CRASH, ERROR_LOGGER, crash_message, line_format, rank_errors


def test_a_ranks_error_line_is_read_back_from_the_node_log_with_its_rank() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter(line_format(3, 4, "gpu-7")))
    logger = logging.getLogger(ERROR_LOGGER)
    logger.addHandler(handler)
    try:
        logging.getLogger("trainer.loop").error("not this one: another logger")
        logger.error("%s", "train.max_steps must be > 0")
        logger.warning("not an error")
    finally:
        logger.removeHandler(handler)
    text = "torchrun noise\n" + stream.getvalue() + "[rank 1/4 gpu-6] ERROR trainer: data.source: missing\n"
    assert "[rank 3/4 gpu-7] ERROR trainer: train.max_steps must be > 0" in text
    assert rank_errors(text) == [(3, "train.max_steps must be > 0"), (1, "data.source: missing")]


def test_a_crash_line_is_told_from_a_sentence_of_ours() -> None:
    line = crash_message("TypeError", "build_engine (trainer/loop.py:108)", "unsupported operand")
    assert line == "TypeError in build_engine (trainer/loop.py:108): unsupported operand"
    assert CRASH.match(line) and CRASH.match(crash_message("KeyboardInterrupt", None, "stopped"))
    assert not CRASH.match("data.max_length must be > 0, got 0")
