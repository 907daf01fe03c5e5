"""The server's shared decoder: one worker thread owns the model and transcribes queued requests with equal
options together (one decoding pass for a batch)."""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future

import numpy as np

from fun_asr.asr.session import Session
from fun_asr.audio.decode import SAMPLE_RATE, AudioInfo, decode_audio


class Batcher:
    """One worker thread owns the model: it takes queued requests and transcribes up to `max_batch`
    with equal options together (Session.transcribe_batch: one decoding pass for all of them). A request
    with a draft (a stream's previous partial tokens) that finds no company is decoded with it (lossless
    speculative decoding: the same tokens); in a batch, drafts are left out (the batch already shares each
    step's weight reads, and the model verifies drafts for one sequence only)."""

    def __init__(self, session: Session, max_batch: int, max_new_tokens: int, segment_seconds: float = 30.0) -> None:
        self.session, self.max_batch, self.max_new_tokens = session, max(1, max_batch), max_new_tokens
        self.segment_seconds = segment_seconds
        self.jobs: queue.Queue[tuple[tuple, tuple[np.ndarray, str, list[int] | None], Future] | None] = queue.Queue()
        self.thread = threading.Thread(target=self._work, name="fun-asr-batcher", daemon=True)
        self.thread.start()

    def submit(self, samples: np.ndarray, options: tuple, name: str = "upload",
               draft: list[int] | None = None) -> Future:  # Future[Transcription]
        fut: Future = Future()
        self.jobs.put((options, (samples, name, list(draft) if draft else None), fut))
        return fut

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join(timeout=60)

    def _work(self) -> None:
        held: list[tuple[tuple, tuple[np.ndarray, str, list[int] | None], Future]] = []
        while True:
            first = held.pop(0) if held else self.jobs.get()
            if first is None:
                return
            batch = [first]
            stop = False
            while len(batch) < self.max_batch:
                try:
                    job = self.jobs.get(timeout=0.005)
                except queue.Empty:
                    break
                if job is None:
                    stop = True
                    break
                (batch if job[0] == first[0] else held).append(job)
            self._run(batch)
            if stop:
                for _, _, fut in held:
                    fut.set_exception(RuntimeError("server is shutting down"))
                return

    def _run(self, batch: list[tuple[tuple, tuple[np.ndarray, str, list[int] | None], Future]]) -> None:
        # options: (language, itn, hotwords, max_new_tokens, segment_seconds, vad, word_timestamps[, vad_kwargs]);
        # None = the server's setting; vad_kwargs: FunASR's VAD kwargs (and diarize for spk) as (name, value) pairs.
        # Streams decode their VAD sentences without running the offline VAD again.
        batch = [job for job in batch if job[2].set_running_or_notify_cancel()]  # drop timed-out requests
        if not batch:
            return
        language, itn, hotwords, max_new, seconds, vad, words, *rest = batch[0][0]
        vad_kwargs = dict(rest[0]) if rest else {}
        try:
            results = self.session.transcribe_batch(
                [job[1][0] for job in batch], sample_rate=SAMPLE_RATE, language=language, itn=itn,
                hotwords=list(hotwords), max_new_tokens=max_new or self.max_new_tokens, batch_size=len(batch),
                segment_seconds=seconds or self.segment_seconds, names=[job[1][1] for job in batch], vad=vad,
                word_timestamps=words, warn=False,  # each route reports its results' warnings itself
                drafts=[batch[0][1][2]] if len(batch) == 1 and batch[0][1][2] else None, **vad_kwargs)
        except Exception as exc:  # noqa: BLE001 - handed to every waiting request
            for _, _, fut in batch:
                fut.set_exception(exc)
            return
        for (_, _, fut), result in zip(batch, results, strict=True):
            if result.ok:
                fut.set_result(result)
            else:
                fut.set_exception(ValueError(result.error))


def _decode(data: bytes, name: str) -> tuple[np.ndarray, AudioInfo]:
    return decode_audio(data, name=name)

