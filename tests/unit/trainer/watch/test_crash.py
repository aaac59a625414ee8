"""A rank's uncaught exception as one line (its type, our function and file:line, its message) and its exit class:
retryable for a lost peer or a timeout, not for anything else. How the launcher reads that line back is
tests/unit/test_rank_crash.py; the whole path, through real torchrun ranks, is in tests/distributed/test_trainer.py
(`test_a_failure_a_retry_would_repeat_stops_unretried_naming_the_rank[crash]`)."""

from __future__ import annotations

import torch.distributed as torch_dist

from core.errors import EXIT_RETRYABLE, EXIT_USER_ERROR
from core.rank_log import CRASH
from trainer.model.adapters import lora_targets
from trainer.watch.crash import crash_exit_code, crash_line


def raised(call) -> BaseException:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the test inspects whatever was raised
        return exc
    raise AssertionError("nothing was raised")


def test_the_line_names_the_type_our_innermost_function_and_the_message() -> None:
    class NoConfig:
        config = None  # no model_type, and no modules to list: an AttributeError inside trainer/model/load.py

    exc = raised(lambda: lora_targets(NoConfig(), None))
    line = crash_line(exc)
    assert line.startswith("AttributeError in lora_targets (trainer/model/adapters.py:")
    assert line.endswith("): 'NoConfig' object has no attribute 'named_modules'")
    assert CRASH.match(line)


def test_a_long_or_multi_line_message_is_cut_to_its_first_line() -> None:
    line = crash_line(ValueError("first line\nsecond line"))
    assert line == "ValueError: first line"
    assert len(crash_line(ValueError("x" * 1000))) < 400
    # DeepSpeed's assertions open with a tensor's repr ("Parameter containing:" and its rows) and end with the point.
    tensor_first = AssertionError(" Parameter containing:\ntensor([[0.1, 0.2],\n [0.3, 0.4]]) Cannot partition a param")
    assert crash_line(tensor_first) == "AssertionError: Parameter containing: … [0.3, 0.4]]) Cannot partition a param"


def test_lost_peers_and_timeouts_may_be_retried_everything_else_may_not() -> None:
    reset = RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:44470: Connection reset by peer.")
    assert crash_exit_code(reset) == EXIT_RETRYABLE
    assert crash_exit_code(torch_dist.DistNetworkError("store gone")) == EXIT_RETRYABLE
    assert crash_exit_code(TimeoutError("collective")) == EXIT_RETRYABLE
    assert crash_exit_code(TypeError("int() argument must be a string, not 'NoneType'")) == EXIT_USER_ERROR
    assert crash_exit_code(RuntimeError("shape mismatch")) == EXIT_USER_ERROR
