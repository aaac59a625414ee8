"""Tokenize the spooled records in `data.num_proc` processes, results in spool order.

Workers come from a fork server (never forked from this process, which runs Prefect's threads): the
server starts once per process with transformers imported, so later stagings start their workers in a
fraction of a second instead of importing it again. Each worker loads the tokenizer once. Small inputs
are tokenized in this process, where starting workers would cost more than it saves. The output does not
depend on the number of processes.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from staging.pairs import encode_preference, is_preference
from staging.prompts import encode_prompts, is_prompt
from staging.records import Reject
from staging.spool import Chunk, read_chunk
from staging.tokenize import ChatEncoder, EncodedBatch, EncoderSettings, reasoning_error

MIN_CHUNKS_PER_WORKER = 4
PRELOAD = [
    "staging.workers",
    "transformers",
    "transformers.tokenization_utils_tokenizers",
    "transformers.models.auto.tokenization_auto",
]
_ENCODER: ChatEncoder | None = None
R = TypeVar("R")


@dataclass
class ChunkResult:
    """One chunk tokenized: the kept examples, the records rejected and the over-long ones dropped (with their
    locations; a dropped record also with its index in the chunk, for its split)."""

    chunk: Chunk
    batch: EncodedBatch
    rejects: list[Reject]
    dropped: list[tuple[int, Reject]]


def worker_count(num_proc: int, chunks: int) -> int:
    """Processes to use: data.num_proc (0: one per core), fewer when there is too little work for them."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    wanted = num_proc or cores
    return max(1, min(wanted, chunks // MIN_CHUNKS_PER_WORKER))


def encode_chunk(encoder: ChatEncoder, spool: Path, chunk: Chunk) -> ChunkResult:
    """Tokenize one chunk of the spool."""
    items = read_chunk(spool, chunk)
    if is_preference(items[0][1]):  # data.preference=pairs: every record is one
        batch = encode_preference(encoder, items)
    elif is_prompt(items[0][1]):  # data.preference=prompts: every record is one
        batch = encode_prompts(encoder, items)
    else:
        encoder.check_render(items[0][1])
        for location, conversation in items:
            if encoder.drops_reasoning(conversation):
                raise reasoning_error(location)
        batch = encoder.encode([conversation for _, conversation in items])
    return ChunkResult(
        chunk,
        batch,
        [Reject(items[index][0], reason) for index, reason in batch.rejects],
        [(index, Reject(items[index][0], reason)) for index, reason in batch.dropped],
    )


def _init_worker(settings: EncoderSettings) -> None:
    global _ENCODER
    # One process per core already: the tokenizer's own thread pool would only oversubscribe the cores.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _ENCODER = settings.encoder()


def _encode_in_worker(spool: Path, chunk: Chunk) -> ChunkResult:
    assert _ENCODER is not None, "worker used before _init_worker"
    return encode_chunk(_ENCODER, spool, chunk)


def encode_chunks(spool: Path, chunks: list[Chunk], settings: EncoderSettings, workers: int) -> Iterator[ChunkResult]:
    """Every chunk tokenized, in order, by `workers` processes (1: this one, with the tokenizer loaded now)."""
    if workers == 1:
        encoder = settings.encoder()
        return (encode_chunk(encoder, spool, chunk) for chunk in chunks)
    return _encode_in_pool(spool, chunks, settings, workers)


def _encode_in_pool(spool: Path, chunks: list[Chunk], settings: EncoderSettings, workers: int) -> Iterator[ChunkResult]:
    with pool_of(workers, initializer=_init_worker, initargs=(settings,)) as pool:
        yield from in_order(pool, workers, _encode_in_worker, ((spool, chunk) for chunk in chunks))


def pool_of(
    workers: int, initializer: Callable[..., None] | None = None, initargs: tuple[Any, ...] = ()
) -> ProcessPoolExecutor:
    """`workers` processes started from the fork server (see above)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return ProcessPoolExecutor(workers, mp_context=context, initializer=initializer, initargs=initargs)


def in_order(
    pool: ProcessPoolExecutor, workers: int, fn: Callable[..., R], calls: Iterable[tuple[Any, ...]]
) -> Iterator[R]:
    """fn(*args) for every args of `calls`, run by the pool, yielded in the order of `calls`."""
    pending: deque[Future[R]] = deque()
    try:
        # A bounded window keeps memory flat: at most a few finished results wait to be consumed.
        for args in calls:
            pending.append(pool.submit(fn, *args))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:
            future.cancel()
