"""Recordings through the engine: each read block by block, cut into segments as they are decided (FunASR's
FSMN-VAD or the pause splitter), each segment encoded as it is cut; then all recordings' segments decoded
together (longest first), in waves when they grow large; then word timestamps, speakers, and one
:class:`fun_asr.asr.results.Transcription` per recording."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from fun_asr.asr.assemble import assemble
from fun_asr.asr.cutting import _Cutter, _Item, _source_name
from fun_asr.asr.engine import Engine
from fun_asr.asr.language import language_notice
from fun_asr.asr.options import TranscribeOptions
from fun_asr.asr.progress import _bar, _NoBar
from fun_asr.asr.results import Segment, Transcription
from fun_asr.asr.speakers import split_at_speakers
from fun_asr.audio.decode import SAMPLE_RATE, AudioError, AudioInput, AudioReader, Limits
from fun_asr.notices import Notice
from fun_asr.speakers.diarize import RecordingSpeakers
from fun_asr.vad.native import FsmnVad

log = logging.getLogger("fun_asr")
# _run decodes the segments encoded so far once their adaptor rows (and the features kept for word
# timestamps) pass this many bytes: a recording of any length holds a bounded amount (the real model's
# rows are ~8.5 kB per second of speech: one wave per ~2 hours of continuous speech)
_WAVE_BYTES = 64 << 20

VAD_ENV = "FUN_ASR_VAD_MODEL"  # a user default VAD (a .gguf, a FunASR fsmn-vad folder, or a hub repo id)
NO_VAD_MESSAGE = (
    "{model}: no FSMN-VAD in this model and none given, so long audio is cut at pauses and silence or noise can "
    "come out as made-up words; embed one (fun-asr-convert SRC --vad-model DIR|GGUF), give --vad-model "
    f"(vad_model=), or set {VAD_ENV}; --vad none (vad=None) turns this notice off"
)


class Pipeline(Engine):
    """An :class:`~fun_asr.asr.engine.Engine` with what cutting a recording needs: its ``vad`` (None: cut at
    pauses) and input ``limits``; a recording's speakers come from :meth:`_speaker_windows`."""

    def __init__(self, path: Path, device: str, threads: int, limits: Limits) -> None:
        super().__init__(path, device, threads)
        self.limits = limits
        self.vad: FsmnVad | None = None
        self._told_languages: set[str] = set()  # languages the spec lacks, logged once each

    def _speaker_windows(self) -> RecordingSpeakers:
        """A recording's speaker windows, embedded by the speaker model: the Session gives them (it holds the
        speaker model); a pipeline without one cannot diarize."""
        raise NotImplementedError("diarize=True needs a speaker model (fun_asr.Session(speaker_model=...))")

    def _run(self, audios: list[AudioInput], sample_rate: int | None, opts: TranscribeOptions, batch_size: int,
             progress: bool, raise_errors: bool, names: list[str] | None = None,
             warn: bool = True, drafts: list[list[int] | None] | None = None) -> list[Transcription]:
        """Each recording streams through read -> 16 kHz -> fbank -> VAD (or the pause splitter) -> the
        segment's features -> encoder, block by block, so that no recording is held whole (_stream); the
        segments' adaptor rows wait for decoding, all recordings' together (longest first), in waves when
        they grow past _WAVE_BYTES."""
        with self.interruptible():
            return self._run_all(audios, sample_rate, opts, batch_size, progress, raise_errors, names, warn, drafts)

    def _run_all(self, audios: list[AudioInput], sample_rate: int | None, opts: TranscribeOptions,
                 batch_size: int, progress: bool, raise_errors: bool, names: list[str] | None,
                 warn: bool, drafts: list[list[int] | None] | None) -> list[Transcription]:
        t_start = time.perf_counter()
        before, after = self.prompt_ids(opts)
        items = [_Item(i) for i in range(len(audios))]
        for item, d in zip(items, drafts or [], strict=False):
            item.draft = d
        with self._lock:
            prefix = self.model.embed(before)
            suffix = self.model.embed(after)
            self._use_prefix(before, prefix)
        jobs: list[tuple[_Item, int, np.ndarray]] = []  # (item, segment index, adaptor rows)
        waiting = [0]  # bytes held for decoding: the jobs' rows, the features kept for word timestamps
        # segments are encoded as the recordings are read: the bar's total is the segments decided so far
        bar: list[Any] = [_NoBar(), 0]  # the encoding bar (from the second segment on), segments decided
        # segments waiting for a packed encoder pass (Engine.encoder_pack; up to batch_size of them)
        pack = min(batch_size, self.encoder_pack) if batch_size > 1 else 1
        pending: list[tuple[_Item, int, np.ndarray]] = []

        def encode_pending() -> None:
            segments = [s for s in pending if s[0].error is None]
            pending.clear()
            if not segments:
                return
            try:
                self._encode_segments(segments, opts, jobs, waiting)
            except (ValueError, RuntimeError, MemoryError):
                if raise_errors:
                    raise
                for segment in segments:  # find the bad one; the others encode as they would have
                    try:
                        self._encode_segments([segment], opts, jobs, waiting)
                    except (ValueError, RuntimeError, MemoryError) as exc:
                        segment[0].fail(exc)

        def encode(item: _Item, a: int, b: int) -> None:
            item.spans.append((a, b))
            item.segments.append(Segment(a / SAMPLE_RATE, b / SAMPLE_RATE, "", [], "empty", False, False))
            bar[1] += 1
            if bar[1] == 2 and progress:
                bar[0] = _bar(True, 2, "encoding", "seg")
                bar[0].update(1)
            elif bar[1] > 2:
                bar[0].total = bar[1]
                bar[0].refresh()
            try:
                if pack > 1:
                    segment = self._segment_features(item, a, b)
                    if segment is not None:
                        pending.append(segment)
                    if len(pending) >= pack:
                        encode_pending()
                else:
                    self._encode(item, a, b, opts, jobs, waiting)
                if opts.diarize:
                    if item.speakers is None:
                        item.speakers = self._speaker_windows()
                    item.speakers.add(a / SAMPLE_RATE, item.samples[a:b])
            finally:
                bar[0].update(1)

        def decode() -> None:
            encode_pending()
            bar[0].close()
            bar[:] = [_NoBar(), 0]
            wave = [j for j in jobs if j[0].error is None]
            jobs.clear()
            waiting[0] = 0
            with self._lock:
                self._use_prefix(before, prefix)
                self._decode(wave, opts, batch_size, progress, raise_errors, prefix, suffix)
                if opts.word_timestamps:
                    self._align(items)

        for item, audio in zip(items, audios, strict=True):  # a bad recording fails alone
            item.source = names[item.index] if names else _source_name(audio, item.index, len(items))
            label = "audio" if len(items) == 1 else f"audio {item.index + 1}/{len(items)}"
            steps = self._stream(item, audio, sample_rate, opts, encode, progress, label)
            while True:
                try:
                    if next(steps, True):
                        break
                except (AudioError, OSError, ValueError, RuntimeError, MemoryError) as exc:
                    if raise_errors:
                        raise
                    item.fail(exc)
                    break
                if waiting[0] > _WAVE_BYTES:  # a very long recording: decode what is there, keep memory bounded
                    decode()
        decode()

        options = {"language": opts.language, "itn": opts.itn, "hotwords": list(opts.hotwords),
                   "max_new_tokens": opts.max_new_tokens, "segment_seconds": opts.segment_seconds,
                   "repetition_guard": opts.repetition_guard}
        if opts.word_timestamps:
            options["word_timestamps"] = True if self.aligner is not None else f"unavailable: {self.ctc_reason}"
        options.update(opts.vad_options.to_dict())  # the VAD kwargs given (none: the VAD's defaults)
        if opts.diarize:
            options["diarize"] = True
            options.update(opts.speakers.to_dict())
            for item in items:
                self._label_speakers(item, opts)
        total_ms = (time.perf_counter() - t_start) * 1e3
        results = []
        for item in items:  # a loop, not a comprehension: warnings point at the caller (stacklevel)
            results.append(self._result(item, opts, options, total_ms if len(items) == 1 else None, warn))
        return results

    def _stream(self, item: _Item, audio: AudioInput, sample_rate: int | None, opts: TranscribeOptions,
                encode: Callable[[_Item, int, int], None], progress: bool, label: str) -> Iterator[bool]:
        """Reads one recording block by block (AudioReader: the checks and limits of decode_audio as the
        blocks come), cuts it into segments as they are decided (_Cutter) and hands each to ``encode``,
        keeping only the samples and fbank frames that segments to come need. Yields False after each
        block (the caller may decode in between), True at the end; raises what reading or cutting raised."""
        t0 = time.perf_counter()
        reader = AudioReader(audio, sample_rate, item.source, self.limits)
        item.timings["load_ms"] += (time.perf_counter() - t0) * 1e3
        expected = reader.expected_seconds
        bar = _bar(progress, None if expected is None else int(round(expected)), label, "s", delay=1.0)
        cutter = _Cutter(self.frontend, self.vad, item, opts)
        shown = 0
        try:
            blocks = reader.blocks()
            while True:
                t0 = time.perf_counter()
                block = next(blocks, None)
                item.timings["load_ms"] += (time.perf_counter() - t0) * 1e3
                if block is None:
                    break
                for a, b in cutter.feed(block):
                    encode(item, a, b)
                cutter.trim()
                seconds = len(item.samples) // SAMPLE_RATE
                if seconds > shown:
                    bar.update(seconds - shown)
                    shown = seconds
                yield False
            item.warnings = [Notice("input_truncated", w) for w in reader.info.warnings]
            item.input_truncated = reader.info.truncated
            if len(item.samples) < self.frontend.samples_per_frame:
                item.empty_reason = "too_short"
                item.segmentation = None  # nothing was cut
                seconds = len(item.samples) / SAMPLE_RATE
                item.warnings.append(Notice("too_short", f"{item.source}: audio is {seconds:.3f} s long, shorter than "
                                            f"one {self.frontend.frame_length_ms:g} ms analysis frame: nothing to "
                                            "transcribe"))
            else:
                for a, b in cutter.finish():
                    encode(item, a, b)
                if item.segmentation == "vad" and not item.spans:
                    item.empty_reason = "no_speech"
        finally:
            reader.close()
            cutter.release()
            bar.close()
        yield True

    def _label_speakers(self, item: _Item, opts: TranscribeOptions) -> None:
        """Each segment's speaker from the recording's windows (FunASR's clustering, vad_segment mode)."""
        if item.error is not None:
            return
        t0 = time.perf_counter()
        speakers = item.speakers or self._speaker_windows()
        labels, timeline = speakers.label([(s.start, s.end) for s in item.segments], opts.speakers)
        segments = []
        for seg, spk in zip(item.segments, labels, strict=True):  # a segment two speakers share is cut at the turn
            segments += split_at_speakers(seg, spk, timeline, self.tokenizer.decode, self.stop_ids)
        item.segments = segments
        item.speaker_turns = timeline
        item.timings["speaker_ms"] = speakers.embed_ms + (time.perf_counter() - t0) * 1e3
        item.speakers = None

    def _result(self, item: _Item, opts: TranscribeOptions, options: dict[str, Any],
                total_ms: float | None, warn: bool = True) -> Transcription:
        # conditions of the whole Session: logged once (Session.__init__, _align), recorded in every result
        session_notes = []
        if opts.no_vad and item.segmentation == "pauses":
            session_notes.append(Notice("no_vad", NO_VAD_MESSAGE.format(model=self.path)))
        if opts.word_timestamps and self.aligner is None:
            session_notes.append(Notice("word_timestamps_unavailable", f"word timestamps unavailable: "
                                        f"{self.ctc_reason}; segment-level times only"))
        unknown = language_notice(self.spec, opts.language)  # recorded in every result, logged once per language
        if unknown is not None:
            session_notes.append(unknown)
            # bounded: a server's clients can send any number of names (past 256, they are only in the results)
            if opts.language not in self._told_languages and len(self._told_languages) < 256:
                self._told_languages.add(opts.language)
                log.warning("%s", unknown)
        return assemble(item, opts, options, total_ms, self.spec, session_notes, warn)

