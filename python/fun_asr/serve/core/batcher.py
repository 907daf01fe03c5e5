"""The server's shared decoder: one worker thread owns the model and transcribes queued requests with equal
options together (one decoding pass for a batch)."""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future

import numpy as np

from fun_asr._core import Interrupted
from fun_asr.asr.option_table import OPTIONS
from fun_asr.asr.pipeline import Arrivals
from fun_asr.asr.results import Transcription
from fun_asr.asr.session import Session
from fun_asr.audio.decode import SAMPLE_RATE, AudioInfo, decode_audio
from fun_asr.serve.core.requests import DecodeRequest

FINAL, SPECULATIVE, PARTIAL = "final", "speculative", "partial"  # a job's kind (see Batcher)


class Batcher:
    """One worker thread owns the model: it takes queued requests and transcribes up to `max_batch`
    with equal options together (Session.transcribe_batch: one decoding pass for all of them). A request
    with a draft (a stream's previous partial tokens) that finds no company is decoded with it (lossless
    speculative decoding: the same tokens); in a batch, drafts are left out (the batch already shares each
    step's weight reads, and the model verifies drafts for one sequence only).

    Streams' partial decodes (``submit(partial=True)``) are best effort, everything else is not: whenever
    both wait, closed sentences and file requests go first, partials are decoded together only with
    partials (at most ``partial_batch`` at once, so that a closing sentence waits for at most one such batch),
    and a partial that has waited longer than ``partial_wait_s`` in the queue is answered None (skipped: its
    stream keeps the previous partial and asks again with newer audio) instead of decoding audio that is stale
    by then. A closed sentence or file request that arrives while partials decode interrupts them
    (Session.interrupt: the model stops at its next graph node) and is decoded at once; the interrupted partials
    are answered None too. Nothing but a partial is ever skipped.

    A stream's speculative closing decode (``submit(partial=True, speculative=True)``: the open sentence as
    the VAD will close it if its pause goes on) is probably a sentence's decode: it comes after closed sentences
    and file requests and before partials, is never skipped or interrupted, and interrupts running partials
    as a closed sentence does.

    A closed sentence or file request (or a speculative decode) that arrives while a batch of its kind decodes,
    with the batch's options, joins it (``join_running``; continuous batching across requests): it is read and
    encoded when a decoder slot is free, its segments join the running steps, and it is answered as soon as its
    last segment ends, as is every request of the batch (the same tokens as decoded alone). First come, first
    served: a request with other options that waits stops the joining (the batch drains and it goes next), and a
    running speculative batch takes no more while closed sentences wait (they go first)."""

    def __init__(self, session: Session, max_batch: int, max_new_tokens: int,
                 segment_seconds: float = OPTIONS["segment_seconds"].default, partial_batch: int | None = None,
                 partial_wait_s: float = 0.5, interrupt_partials: bool = True, join_running: bool = True) -> None:
        self.session, self.max_batch, self.max_new_tokens = session, max(1, max_batch), max_new_tokens
        self.segment_seconds = segment_seconds
        self.partial_batch = max(1, min(self.max_batch, partial_batch or self.max_batch))
        self.partial_wait_s = partial_wait_s
        self.partials_skipped = 0  # partials answered None: stale in the queue, or interrupted
        self.partials_interrupted = 0  # of those, interrupted by a closed sentence or a file request
        self.interrupt_partials = interrupt_partials  # False: a final waits for the running partials (measuring)
        # requests that arrive while a batch decodes join it (Session.transcribe_batch's arrivals); False: they wait
        # for the next batch (measuring)
        self.join_running = join_running
        self.joined = 0  # requests that joined a running batch
        self._state = threading.Lock()
        self._partial_running = False
        self._closed = False
        # (request, (samples, name, draft), future, kind (FINAL, SPECULATIVE or PARTIAL), time queued)
        self.jobs: queue.Queue[tuple[DecodeRequest, tuple[np.ndarray, str, list[int] | None], Future, str, float]
                               | None] = queue.Queue()
        # queued jobs taken off the queue, by kind, oldest first (the worker's; _collect fills them)
        self._lists: dict[str, list] = {FINAL: [], SPECULATIVE: [], PARTIAL: []}
        self._stopping = False  # close()'s end mark has come
        self.thread = threading.Thread(target=self._work, name="fun-asr-batcher", daemon=True)
        self.thread.start()

    def submit(self, samples: np.ndarray, request: DecodeRequest, name: str = "upload",
               draft: list[int] | None = None, partial: bool = False, speculative: bool = False) -> Future:
        """Future[Transcription]; a ``partial`` request's may be None (skipped: see the class), unless it is
        ``speculative``. ``request``: the decoding options (:class:`DecodeRequest`)."""
        if not isinstance(request, DecodeRequest):
            raise TypeError(f"request must be a DecodeRequest, got {type(request).__name__}")
        fut: Future = Future()
        kind = SPECULATIVE if speculative else PARTIAL if partial else FINAL
        with self._state:
            if self._closed:  # never behind close()'s end mark, where nothing would answer it
                raise RuntimeError("server is shutting down: the decoder takes no more requests")
            self.jobs.put((request, (samples, name, list(draft) if draft else None), fut, kind, time.monotonic()))
            if kind != PARTIAL and self.interrupt_partials and self._partial_running:
                self.session.interrupt()  # a partial batch that runs now gives way (see the class)
        return fut

    def close(self) -> None:
        """Decodes the batch it is on (and one more if waiting), answers every other request RuntimeError, stops."""
        with self._state:
            if self._closed:
                return
            self._closed = True
            self.jobs.put(None)
        self.thread.join(timeout=60)

    def _collect(self, timeout: float | None = 0.0) -> bool:
        """Moves queued jobs into their lists: waits up to ``timeout`` s for the first (None: until one comes),
        then takes what else is queued. Returns False once close()'s end mark has come."""
        block = timeout is None or timeout > 0
        while True:
            try:
                job = self.jobs.get(timeout=timeout) if block else self.jobs.get_nowait()
            except queue.Empty:
                return not self._stopping
            block = False
            if job is None:
                self._stopping = True
                continue
            self._lists[job[3]].append(job)

    def _work(self) -> None:
        finals, speculative, partials = (self._lists[k] for k in (FINAL, SPECULATIVE, PARTIAL))
        while True:
            if not finals and not speculative and not partials:
                if self._stopping:  # (its end mark already taken, by a running batch's joining)
                    return
                self._collect(timeout=None)
                if self._stopping and not (finals or speculative or partials):
                    return
            stopping = self._stopping  # the end mark came before this batch: it is the last one
            deadline = time.monotonic() + 0.005  # company that arrives within 5 ms, and all that is queued
            while not self._stopping and time.monotonic() < deadline:
                self._collect(timeout=max(0.0, deadline - time.monotonic()))
            if finals:
                batch, finals[:] = _take(finals, self.max_batch)
            elif speculative:
                batch, speculative[:] = _take(speculative, self.max_batch)
            else:
                now, waiting = time.monotonic(), []
                for job in partials:
                    if now - job[4] <= self.partial_wait_s:
                        waiting.append(job)
                    elif job[2].set_running_or_notify_cancel():  # stale: skipped (its stream asks again)
                        job[2].set_result(None)
                        self.partials_skipped += 1
                batch, partials[:] = _take(waiting, self.partial_batch)
            if batch:
                self._run(batch)
            if stopping:
                for job in finals + speculative + partials:
                    if job[2].set_running_or_notify_cancel():  # (a waiter that gave up cancelled its own)
                        job[2].set_exception(RuntimeError("server is shutting down"))
                finals.clear()
                speculative.clear()
                partials.clear()
                return

    def _run(self, batch: list) -> None:
        # the batch's DecodeRequest (its None fields: the server's settings)
        batch = [job for job in batch if job[2].set_running_or_notify_cancel()]  # drop timed-out requests
        if not batch:
            return
        request: DecodeRequest = batch[0][0]
        if batch[0][3] == PARTIAL and self.interrupt_partials:  # interruptible (submit) from before the look for finals
            with self.session.interruptible():
                with self._state:
                    self._partial_running = True
                    with self.jobs.mutex:
                        finals_waiting = any(job is not None and job[3] != PARTIAL for job in self.jobs.queue)
                try:
                    if finals_waiting:
                        self._interrupted(batch)
                    else:
                        self._transcribe(batch, request)
                finally:
                    with self._state:
                        self._partial_running = False
            return
        self._transcribe(batch, request)

    def _transcribe(self, batch: list, r: DecodeRequest) -> None:
        kind = batch[0][3]
        # Closed sentences and file requests (and speculative decodes) that arrive while this batch decodes join
        # it (Session.transcribe_batch's arrivals) when their options are the batch's; each is answered as soon
        # as it is done. A lone request with a draft decodes alone with it instead.
        joining = self.join_running and kind != PARTIAL and not (len(batch) == 1 and batch[0][1][2])
        jobs = list(batch)
        answered: set[int] = set()

        def take(free: int) -> list[tuple[np.ndarray, str]]:
            self._collect()
            waiting = self._lists[kind]
            # First come, first served: only requests with the batch's options that no other request waits
            # before join (one with other options lets this batch drain and goes next); finals go before a
            # speculative batch.
            if self._stopping or (kind == SPECULATIVE and self._lists[FINAL]):
                return []
            picked = []
            while waiting and len(picked) < free and waiting[0][0] == r:
                job = waiting.pop(0)
                if job[2].set_running_or_notify_cancel():  # (a cancelled one is dropped)
                    picked.append(job)
            jobs.extend(picked)
            self.joined += len(picked)
            return [(job[1][0], job[1][1]) for job in picked]

        def deliver(index: int, result: Transcription) -> None:
            answered.add(index)
            if result.ok:
                jobs[index][2].set_result(result)
            else:
                jobs[index][2].set_exception(ValueError(result.error))

        try:
            results = self.session.transcribe_batch(
                [job[1][0] for job in batch], sample_rate=SAMPLE_RATE, language=r.language, itn=r.itn,
                hotwords=list(r.hotwords), max_new_tokens=r.max_new_tokens or self.max_new_tokens,
                batch_size=self.max_batch if joining else len(batch),
                segment_seconds=r.segment_seconds or self.segment_seconds,
                names=[job[1][1] for job in batch], vad=r.vad, word_timestamps=r.word_timestamps,
                warn=False,  # each route reports its results' warnings itself
                drafts=None if joining or len(batch) > 1 or not batch[0][1][2] else [batch[0][1][2]],
                arrivals=Arrivals(take, deliver) if joining else None, **dict(r.vad_kwargs))
        except Exception as exc:  # noqa: BLE001 - handed to every waiting request
            if isinstance(exc, Interrupted) and kind == PARTIAL:  # given way to a final: skipped
                self._interrupted(batch)
                return
            for i, job in enumerate(jobs):
                if i not in answered:
                    job[2].set_exception(exc)
            return
        for i, result in enumerate(results):
            if i not in answered:
                deliver(i, result)

    def _interrupted(self, batch: list) -> None:
        for job in batch:
            job[2].set_result(None)
        self.partials_skipped += len(batch)
        self.partials_interrupted += len(batch)


def _take(jobs: list, most: int) -> tuple[list, list]:
    """The oldest job and up to `most` - 1 more with its request (in order); and the rest."""
    batch: list = []
    rest: list = []
    for job in jobs:
        (batch if job[0] == jobs[0][0] and len(batch) < most else rest).append(job)
    return batch, rest


def decode_batch_item(data: bytes, name: str) -> tuple[np.ndarray, AudioInfo]:
    return decode_audio(data, name=name)

