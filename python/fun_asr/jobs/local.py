"""The work of one batch (shared by both engines) and the local engine: reader threads ahead of one Session."""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fun_asr.asr.option_table import OPTIONS
from fun_asr.errors import names_input
from fun_asr.jobs.inputs import Item, is_url

log = logging.getLogger("fun_asr.batch")
@dataclass
class JobOptions:
    """The job's transcription options (per-item language/hotwords override the first two)."""

    language: str | None = None
    hotwords: tuple[str, ...] = ()
    itn: bool = True
    max_new_tokens: int = OPTIONS["max_new_tokens"].default
    segment_seconds: float = OPTIONS["segment_seconds"].default
    repetition_guard: bool = True
    batch_size: int = 8
    vad_options: dict[str, Any] = field(default_factory=dict)  # FunASR's VAD kwargs (silence_schedule, ...)
    speaker_options: dict[str, Any] = field(default_factory=dict)  # diarize=True and num/min/max_speakers
    output_options: dict[str, Any] = field(default_factory=dict)  # max_line_width / max_line_count given

    def for_item(self, item: Item) -> tuple[str | None, tuple[str, ...]]:
        return (self.language if item.language is None else item.language,
                self.hotwords if item.hotwords is None else item.hotwords)

    def transcription_options(self, language: str | None, hotwords: tuple[str, ...]) -> dict[str, Any]:
        """The Session's option keywords (``Session.options``, ``transcribe_batch``) for one language and
        hotword list."""
        return {**self.base_options(language, hotwords), **self.vad_options, **self.speaker_options,
                **self.output_options}

    def base_options(self, language: str | None, hotwords: tuple[str, ...]) -> dict[str, Any]:
        """The decoding options every record names (a failed one's too)."""
        return {"language": language, "itn": self.itn, "hotwords": list(hotwords),
                "max_new_tokens": self.max_new_tokens, "segment_seconds": self.segment_seconds,
                "repetition_guard": self.repetition_guard}


@dataclass
class Loaded:
    """One recording read and decoded to 16 kHz mono float32 (or why it could not be)."""

    item: Item
    samples: np.ndarray | None = None
    warnings: list[str] = field(default_factory=list)
    truncated: bool = False
    load_ms: float = 0.0
    error: str | None = None


def _message(audio: str, exc: BaseException) -> str:
    """``exc``'s message, led by the recording's name unless it names it already (as data: names_input)."""
    msg = str(exc) or type(exc).__name__
    return msg if names_input(exc) == audio else f"{audio}: {msg}"


def load(item: Item) -> Loaded:
    """Reads and decodes one recording (a local path directly, a URL through fsspec); never raises."""
    from fun_asr.audio.decode import decode_audio

    if item.error is not None:
        return Loaded(item, error=item.error)
    t0 = time.perf_counter()
    try:
        if is_url(item.audio):
            import fsspec

            with fsspec.open(item.audio, "rb") as f:
                source: Any = f.read()
        else:
            source = item.audio
        samples, info = decode_audio(source, None, item.audio)
    except Exception as exc:  # noqa: BLE001 - any reader/filesystem failure is this item's error
        return Loaded(item, error=_message(item.audio, exc), load_ms=(time.perf_counter() - t0) * 1e3)
    return Loaded(item, samples, list(info.warnings), info.truncated, (time.perf_counter() - t0) * 1e3)


def _failed_record(item: Item, error: str, options: dict, load_ms: float = 0.0) -> dict:
    from fun_asr.asr.session import Transcription

    t = Transcription("", [], options.get("language"), 0.0, {"load_ms": round(load_ms, 3)}, dict(options), item.audio,
                      [error], False, "error", error)
    return _record(item, t.to_dict())


def _record(item: Item, d: dict) -> dict:
    d.pop("source", None)
    rec = {"id": item.id, "audio": item.audio, **d}
    if item.reference is not None:
        from fun_asr.jobs.evaluate import score

        s = score(item.reference, rec.get("text") or "")
        rec["reference"] = item.reference
        rec.update(s.to_dict())
    return rec


def _call(session: Any, loaded: list[Loaded], language: str | None, hotwords: tuple[str, ...],
          opts: JobOptions) -> list[Any]:
    from fun_asr.notices import FunAsrWarning

    with warnings.catch_warnings():  # everything is in the records: no stream of warnings
        warnings.simplefilter("ignore", FunAsrWarning)
        return session.transcribe_batch(
            [ld.samples for ld in loaded], sample_rate=16000, batch_size=opts.batch_size,
            names=[ld.item.audio for ld in loaded], **opts.transcription_options(language, hotwords))


def transcribe_loaded(session: Any, loaded: Sequence[Loaded], opts: JobOptions) -> list[dict]:
    """Records for a batch of decoded recordings, in order: one ``transcribe_batch`` call per group of
    equal options (language, hotwords); a group whose options are invalid fails as a whole."""
    records: list[dict | None] = [None] * len(loaded)
    groups: dict[tuple, list[int]] = {}
    for i, ld in enumerate(loaded):
        groups.setdefault(opts.for_item(ld.item), []).append(i)
    for (language, hotwords), idx in groups.items():
        base_options = opts.base_options(language, hotwords)
        ok = [i for i in idx if loaded[i].error is None]
        for i in idx:
            if loaded[i].error is not None:
                records[i] = _failed_record(loaded[i].item, loaded[i].error or "", base_options, loaded[i].load_ms)
        if not ok:
            continue
        try:
            session.options(**opts.transcription_options(language, hotwords))
        except (ValueError, TypeError) as exc:
            for i in ok:
                records[i] = _failed_record(loaded[i].item, _message(loaded[i].item.audio, exc), base_options,
                                            loaded[i].load_ms)
            continue
        try:
            results: list[Any] = _call(session, [loaded[i] for i in ok], language, hotwords, opts)
        except Exception:  # noqa: BLE001 - transcribe_batch isolates bad recordings; this is a last resort
            log.warning("a batch failed as a whole; transcribing its recordings one by one", exc_info=True)
            results = []
            for i in ok:
                try:
                    results += _call(session, [loaded[i]], language, hotwords, opts)
                except Exception as exc:  # noqa: BLE001 - recorded as this item's error
                    results.append(exc)
        for i, result in zip(ok, results, strict=True):
            ld = loaded[i]
            if isinstance(result, Exception):
                records[i] = _failed_record(ld.item, _message(ld.item.audio, result), base_options, ld.load_ms)
                continue
            result.warnings = ld.warnings + list(result.warnings)
            result.input_truncated = result.input_truncated or ld.truncated
            t = result.timings
            t["load_ms"] = round(t.get("load_ms", 0.0) + ld.load_ms, 3)
            if "total_ms" in t:
                t["total_ms"] = round(t["total_ms"] + ld.load_ms, 3)
                if result.duration > 0:
                    t["real_time_factor"] = round(t["total_ms"] / 1e3 / result.duration, 3)
            records[i] = _record(ld.item, result.to_dict())
            if opts.output_options:  # the subtitle cues made with the job's line limits
                from fun_asr.asr.formats import subtitle_cues

                records[i]["cues"] = subtitle_cues(result)
    return [r for r in records if r is not None]


# -- progress ---------------------------------------------------------------------------------------

class Progress:
    """Counts what the job did; shows it as a tqdm bar (``"bar"``, a terminal) or as one line on stderr
    every ``interval`` seconds (``"lines"``: logs, CI, a scheduler's output file)."""

    def __init__(self, mode: str | None, total: int, initial_note: str = "", interval: float = 10.0) -> None:
        self.t0 = time.perf_counter()
        self.t_work = self.t0
        self.total = total
        self.audio = 0.0
        self.items = 0
        self.failed = 0
        self.bar = None
        self.interval = max(0.01, float(interval))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if mode == "bar":
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="fun-asr-batch", unit="file", dynamic_ncols=True, smoothing=0.1)
            if initial_note:
                self.bar.write(initial_note)
        elif mode == "lines":
            self._print((f"{initial_note}; " if initial_note else "fun-asr-batch: ") + f"{total} to transcribe")
            self._thread = threading.Thread(target=self._lines, name="fun-asr-progress", daemon=True)

    def begin(self) -> None:
        """The engine starts (the model is loaded): speed and ETA are measured from here."""
        self.t_work = time.perf_counter()
        if self._thread is not None and not self._thread.is_alive():
            self._thread.start()

    def counts(self) -> dict[str, Any]:
        """What the summary says of the run: processed, failed, audio and wall seconds, speed."""
        return {"processed": self.items, "failed": self.failed, "audio_seconds": round(self.audio, 3),
                "wall_seconds": round(self.wall, 3), "rtfx": round(self.audio / self.wall, 3) if self.wall > 0 else 0.0}

    def update(self, records: Sequence[dict]) -> None:
        self.items += len(records)
        self.failed += sum(1 for r in records if r.get("error"))
        self.audio += sum(float(r.get("duration") or 0.0) for r in records)
        if self.bar is not None:
            wall = time.perf_counter() - self.t0
            rtfx = self.audio / wall if wall > 0 else 0.0
            note = f"{self.audio / 3600:.3f} h audio, RTFx {rtfx:.1f}"
            if self.failed:
                note += f", {self.failed} failed"
            self.bar.set_postfix_str(note, refresh=False)
            self.bar.update(len(records))

    def line(self) -> str:
        """``fun-asr-batch: 120/1000 recordings (12%), 0.333 h of audio, 45.2x real time, ETA 0:12:34``."""
        items, audio = self.items, self.audio
        wall = time.perf_counter() - self.t_work
        pct = f" ({100 * items / self.total:.0f}%)" if self.total else ""
        failed = f", {self.failed} failed" if self.failed else ""
        speed = f"{audio / wall:.1f}x real time" if wall > 0 and items else "speed n/a"
        if items:
            left = (self.total - items) * wall / items
            eta = f"ETA {int(left // 3600)}:{int(left % 3600 // 60):02d}:{int(left % 60):02d}"
        else:
            eta = "ETA n/a (no recording finished yet)"
        return (f"fun-asr-batch: {items}/{self.total} recordings{pct}{failed}, {audio / 3600:.3f} h of audio, "
                f"{speed}, {eta}")

    def _lines(self) -> None:
        while not self._stop.wait(self.interval):
            self._print(self.line())

    @staticmethod
    def _print(text: str) -> None:
        with contextlib.suppress(OSError, ValueError):  # stderr closed: no progress, the job goes on
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=5)
        if self.bar is not None:
            self.bar.close()

    @property
    def wall(self) -> float:
        return time.perf_counter() - self.t0


# -- engines ----------------------------------------------------------------------------------------

def local_engine(todo: list[Item], session: Any, opts: JobOptions, emit: Callable[[list[dict]], None],
                  workers: int, stop: threading.Event | None = None) -> None:
    """Reader threads decode the next batch while the Session transcribes the current one (so about
    two batches of decoded audio are in memory). ``stop`` set: no batch after the one in flight."""
    ahead = max(opts.batch_size, workers)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fun-asr-read") as pool:
        window: deque[Future[Loaded]] = deque()
        pending = iter(todo)

        def fill() -> None:
            while len(window) < ahead + opts.batch_size:
                item = next(pending, None)
                if item is None:
                    return
                window.append(pool.submit(load, item))

        fill()
        try:
            while window and not (stop is not None and stop.is_set()):
                batch = [window.popleft() for _ in range(min(opts.batch_size, len(window)))]
                fill()
                emit(transcribe_loaded(session, [f.result() for f in batch], opts))
        finally:
            for f in window:
                f.cancel()
