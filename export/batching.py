"""Batching across clients, with TF Serving's parameters and their meaning.

Each request's sentences wait in one queue. A batch is formed when `max_batch_size`
sentences of one kind are waiting, or when the oldest has waited `batch_timeout_micros`;
it takes the oldest sentence and the waiting ones of its kind closest to it in length (less
padding), so every sentence leaves in its turn. `num_batch_threads` batches run at once. The
queue holds at most `max_enqueued_batches` full batches of sentences: past that a request is
refused at once (`QueueFull`) rather than left to grow memory. A translation does not depend
on its batch-mates (the search is batch-invariant), so each request gets what it would get
alone.
"""

import dataclasses
import os
import threading
import time
from concurrent.futures import Future


def _parameter(default, meaning):
    """A field with its one-line meaning (the server's --help)."""
    return dataclasses.field(default=default, metadata={"meaning": meaning})


@dataclasses.dataclass(frozen=True)
class BatchingParameters:
    """TF Serving's batching parameters (its `--batching_parameters_file` names)."""

    max_batch_size: int = _parameter(64, "sentences in one batch")
    batch_timeout_micros: int = _parameter(2000, "the longest the oldest sentence waits for "
                                           "batch-mates")  # fmt: skip
    max_enqueued_batches: int = _parameter(32, "the queue's bound, in batches of "
                                           "max_batch_size sentences; past it: 503")  # fmt: skip
    # One batch a CPU: a batch's search is many small kernels that a second CPU barely
    # speeds up, while two batches side by side run twice as many (bench/RESULTS.md).
    num_batch_threads: int = _parameter(os.cpu_count() or 1, "batches running at once, each "
                                        "on its share of the CPUs")  # fmt: skip

    def __post_init__(self):
        for field in dataclasses.fields(self):
            minimum = 0 if field.name == "batch_timeout_micros" else 1
            if getattr(self, field.name) < minimum:
                raise ValueError(f"{field.name} must be at least {minimum}, "
                                 f"not {getattr(self, field.name)}")  # fmt: skip

    @property
    def queue_capacity(self):
        """The most sentences that may wait."""
        return self.max_enqueued_batches * self.max_batch_size


class QueueFull(Exception):
    """The queue holds `queue_capacity` sentences already."""


class QueueClosed(QueueFull):
    """The queue takes no more submissions: it is closing."""


class _Request:
    """One submission: its results fill in as its sentences' batches finish."""

    def __init__(self, size):
        self.future = Future()
        self.results = [None] * size
        self.remaining = size
        self.lock = threading.Lock()

    def finish(self, index, result):
        with self.lock:
            self.results[index] = result
            self.remaining -= 1
            done = self.remaining == 0
        if done and not self.future.done():
            self.future.set_result(self.results)

    def fail(self, error):
        if not self.future.done():
            self.future.set_exception(error)


@dataclasses.dataclass
class _Waiting:
    request: _Request
    index: int  # in the request
    item: object
    length: int
    weight: int  # sentences it counts for in the queue
    key: object
    alone: bool  # a batch of its own
    arrived: float


class BatchQueue:
    """Runs `run_batch(key, items) -> results` (one result an item) on batches of items with
    the same `key`, formed across submissions as `BatchingParameters` say. `on_batch(size)` is
    called as each batch starts (for metrics)."""

    def __init__(self, run_batch, parameters=BatchingParameters(), on_batch=None):
        self.run_batch = run_batch
        self.parameters = parameters
        self.on_batch = on_batch or (lambda size: None)
        self._waiting = []  # in order of arrival
        self._queued_sentences = 0
        self._closing = False
        self._ready = threading.Condition()
        self._threads = [
            threading.Thread(target=self._work, name=f"batch-{n}", daemon=True)
            for n in range(parameters.num_batch_threads)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def depth(self):
        """Sentences waiting for a batch."""
        return self._queued_sentences

    def submit(self, key, items, lengths):
        """A `Future` of the results of `items` (in order), batched with waiting items of the
        same `key` by their `lengths`; `QueueFull` when they do not fit in the queue,
        `QueueClosed` once it is closing."""
        return self._enqueue(key, items, lengths, [1] * len(items), alone=False)

    def submit_alone(self, item, sentences):
        """A `Future` of `[run_batch(None, [item])[0]]`: a batch of its own (a request whose
        settings or shapes it cannot share), counting for `sentences` in the queue."""
        return self._enqueue(None, [item], [0], [sentences], alone=True)

    def _enqueue(self, key, items, lengths, weights, alone):
        request = _Request(len(items))
        if not items:
            request.future.set_result([])
            return request.future
        with self._ready:
            if self._closing:
                raise QueueClosed("the server is stopping")
            total = sum(weights)
            if self._queued_sentences + total > self.parameters.queue_capacity:
                raise QueueFull(f"the queue is full ({self._queued_sentences} sentences "
                                "waiting); try again shortly")  # fmt: skip
            now = time.monotonic()
            self._waiting.extend(
                _Waiting(request, i, item, length, weight, key, alone, now)
                for i, (item, length, weight) in enumerate(zip(items, lengths, weights))
            )  # fmt: skip
            self._queued_sentences += total
            self._ready.notify_all()
        return request.future

    def close(self):
        """Takes no more submissions, runs those waiting, and returns when they are done."""
        with self._ready:
            self._closing = True
            self._ready.notify_all()
        for thread in self._threads:
            thread.join()

    def _next_batch(self):
        """The next batch (a list of `_Waiting`), waiting for it as the parameters say; None
        once closed and empty."""
        timeout = self.parameters.batch_timeout_micros / 1e6
        size = self.parameters.max_batch_size
        with self._ready:
            while True:
                if self._waiting:
                    oldest = self._waiting[0]
                    if oldest.alone:
                        batch = [oldest]
                        break
                    mates = [w for w in self._waiting if w.key == oldest.key and not w.alone]
                    left = oldest.arrived + timeout - time.monotonic()
                    if len(mates) >= size or left <= 0 or self._closing:
                        batch = _closest_in_length(oldest, mates, size)
                        break
                    self._ready.wait(left)
                elif self._closing:
                    return None
                else:
                    self._ready.wait()
            chosen = {id(w) for w in batch}
            self._waiting = [w for w in self._waiting if id(w) not in chosen]
            self._queued_sentences -= sum(w.weight for w in batch)
            return batch

    def _work(self):
        while (batch := self._next_batch()) is not None:
            self.on_batch(sum(w.weight for w in batch))
            try:
                results = self.run_batch(batch[0].key, [w.item for w in batch])
            except Exception as error:  # reaches the batch's clients, not the worker
                for w in batch:
                    w.request.fail(error)
                continue
            for w, result in zip(batch, results):
                w.request.finish(w.index, result)


def _closest_in_length(oldest, mates, size):
    """`oldest` and, of `mates` (which hold it), the `size - 1` others closest to it in length,
    the earlier first among equals."""
    if len(mates) <= size:
        return mates
    others = sorted((m for m in mates if m is not oldest),
                    key=lambda m: abs(m.length - oldest.length))  # fmt: skip
    return [oldest] + others[: size - 1]
