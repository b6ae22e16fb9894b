"""One worker thread runs every generation, one at a time, in arrival order.

The event loop submits a :class:`Job`; the worker calls ``Pair.stream`` and sends events back to
the loop: ``("delta", text)`` (streaming jobs only), then ``("done", Output, Echo or None)`` or
``("error", status, message)``, or ``("cancelled",)``. ``Job.cancel()`` (the client went away)
makes the worker skip a queued job, or close a running stream after its current delta, so the
engine stops before its next round. A lock per :class:`Pair` keeps two apps over one pair apart.
A worker thread that dies answers its job with a 503 and is replaced at once (``restarts``).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
import weakref
from dataclasses import dataclass, replace

from ...errors import SpecdecError
from .params import GenRequest

log = logging.getLogger("specdec.server")
_PAIR_LOCKS: "weakref.WeakKeyDictionary[object, threading.Lock]" = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


def pair_lock(pair) -> threading.Lock:
    """The lock that every use of ``pair`` by a server holds (one generation at a time)."""
    with _LOCKS_GUARD:
        return _PAIR_LOCKS.setdefault(pair, threading.Lock())


@dataclass(frozen=True)
class Echo:
    """What /v1/completions ``echo`` puts before the completion: the prompt's token ids, and their
    log-probabilities when ``logprobs`` was asked (the first None)."""

    prompt_ids: list[int]
    logprobs: list | None


class Busy(Exception):
    """The queue is full, or the worker is shutting down."""


class Job:
    """One request on its way through the queue; ``events`` is read on the event loop."""

    def __init__(self, req: GenRequest, stream: bool, loop: asyncio.AbstractEventLoop):
        self.req, self.stream, self.loop = req, stream, loop
        self.events: asyncio.Queue = asyncio.Queue()
        self._cancelled = threading.Event()
        self.submitted = time.perf_counter()
        self.started: float | None = None

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """Stop this job (idempotent; safe from any thread)."""
        self._cancelled.set()

    def emit(self, *event) -> None:
        """Send an event to the event loop (from the worker thread)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass


class Worker:
    """A FIFO queue of jobs and the thread that runs them on ``pair``."""

    def __init__(self, pair, max_queue: int = 64, on_done=None):
        self.pair, self.max_queue, self.on_done = pair, max_queue, on_done
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.waiting = 0
        self.running = 0
        self.restarts = 0  # threads started again after one died
        self._current: Job | None = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the thread (again after :meth:`stop`), or a new one if the last one died."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            if self._thread is None:
                self._stopping = False
            else:
                self.restarts += 1
            self._spawn()

    def _spawn(self) -> None:  # with self._lock held
        self._thread = threading.Thread(target=self._loop, name="specdec-engine", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue ``job``; raises :class:`Busy` when ``max_queue`` jobs are already queued or running."""
        self.start()
        with self._lock:
            if self._stopping:
                raise Busy("the server is shutting down")
            if self.waiting + self.running >= self.max_queue:
                raise Busy(f"the server is busy ({self.waiting + self.running} requests queued or running)")
            self.waiting += 1
        self._queue.put(job)

    def stop(self, timeout: float = 10.0) -> None:
        """Refuse new jobs, fail the queued ones, cancel the running one and join the thread."""
        with self._lock:
            self._stopping = True
            thread, self._thread = self._thread, None
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                with self._lock:
                    self.waiting -= 1
                job.emit("error", 503, "the server is shutting down")
        self._current_cancel()
        self._queue.put(None)
        if thread is not None:
            thread.join(timeout)

    def _current_cancel(self) -> None:
        job = self._current
        if job is not None:
            job.cancel()

    def _loop(self) -> None:
        """Run jobs until :meth:`stop`. Should anything escape (a bug, or an exception that is not an
        ``Exception``), the job it was running gets a 503 at once and a new thread takes over the
        queue, so no request waits on a dead thread."""
        try:
            self._serve()
        except BaseException:
            log.exception("the engine worker died; starting a new one")
            job, self._current = self._current, None
            with self._lock:
                self.running = 0
            if job is not None:
                job.cancel()
                job.emit("error", 503, "the engine worker failed while running this request; see the server log")
            with self._lock:
                if not self._stopping and self._thread is threading.current_thread():
                    self.restarts += 1
                    self._spawn()

    def _serve(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            with self._lock:
                self.waiting -= 1
                self.running = 1
            self._current = job
            if job.cancelled:
                job.emit("cancelled")
            else:
                job.started = time.perf_counter()
                with pair_lock(self.pair):
                    self._run(job)
            self._current = None
            with self._lock:
                self.running = 0

    def _echo(self, r) -> Echo | None:
        """/v1/completions ``echo``: the prompt's text as the model reads it, and with ``logprobs``
        its tokens' log-probabilities (one more pass of the target over the prompt)."""
        if not r.echo:
            return None
        ids = self.pair.encode(r.prompt, chat=r.chat)
        lps = None if r.config.logprobs is None else self.pair.prompt_logprobs(ids, top=r.config.logprobs)
        return Echo(ids, lps)

    def _choice(self, job: Job, config):
        """One generation of the job's request under ``config`` (finish reason ``cancelled`` when
        the client left)."""
        r = job.req
        stream = self.pair.stream(r.prompt, stop=r.stop, chat=r.chat, should_stop=lambda: job.cancelled,
                                  config=config)
        for delta in stream:
            if job.cancelled:
                stream.close()  # the engine stops before its next round
                break
            if job.stream:
                job.emit("delta", delta)
        return stream.output

    def _run(self, job: Job) -> None:
        r = job.req
        out, status, echo, more = None, None, None, []
        try:
            out = self._choice(job, r.config)
            for i in range(1, r.n):  # OpenAI's n: one generation after another
                if out is None or out.finish_reason == "cancelled" or job.cancelled:
                    break
                sampling = r.config.sampling
                seed = None if sampling.seed is None else sampling.seed + i
                more.append(self._choice(job, r.config.with_settings(sampling=replace(sampling, seed=seed))))
            if any(o is None or o.finish_reason == "cancelled" for o in more):
                out = None
            echo = self._echo(job.req) if out is not None and out.finish_reason != "cancelled" else None
        except SpecdecError as exc:  # a user error (e.g. a prompt over the context): 400
            status = 400
            job.emit("error", 400, str(exc))
        except Exception:  # a bug: log it, answer 500, keep serving
            status = 500
            log.exception("generation failed")
            job.emit("error", 500, "internal error during generation; see the server log")
        if status is None:
            if out is None or out.finish_reason == "cancelled":
                job.emit("cancelled")
            else:
                job.emit("done", out, echo, more)
        if self.on_done is not None:
            try:
                self.on_done(job, out)
            except Exception:
                log.exception("metrics update failed")
