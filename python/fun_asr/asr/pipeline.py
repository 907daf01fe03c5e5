"""Recordings through the engine: each read block by block, cut into segments as they are decided (FunASR's
FSMN-VAD or the pause splitter), each segment encoded as it is cut; then all recordings' segments decoded
together (longest first), in waves when they grow large; then word timestamps, speakers, and one
:class:`fun_asr.asr.results.Transcription` per recording."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from fun_asr.asr.assemble import assemble
from fun_asr.asr.cutting import CutItem, Cutter, source_name
from fun_asr.asr.engine import Engine
from fun_asr.asr.language import language_notice
from fun_asr.asr.options import TranscribeOptions
from fun_asr.asr.progress import NoBar, progress_bar
from fun_asr.asr.results import Segment, Transcription
from fun_asr.asr.speakers import split_at_speakers
from fun_asr.audio.decode import SAMPLE_RATE, AudioError, AudioInput, AudioReader, Limits
from fun_asr.audio.frontend import fake_token_len
from fun_asr.errors import Message
from fun_asr.notices import Notice
from fun_asr.speakers.diarize import RecordingSpeakers
from fun_asr.vad.native import FsmnVad

log = logging.getLogger("fun_asr")
# _run decodes the segments encoded so far once their adaptor rows (and the features kept for word
# timestamps) pass this many bytes: a recording of any length holds a bounded amount (the real model's
# rows are ~8.5 kB per second of speech: one wave per ~2 hours of continuous speech)
_WAVE_BYTES = 64 << 20

VAD_ENV = "FUN_ASR_VAD_MODEL"  # a user default VAD (a .gguf, a FunASR fsmn-vad folder, or a hub repo id)
# (a template of fun_asr.errors: each front end names its own way of giving a VAD or turning it off)
NO_VAD_MESSAGE = (
    "{model}: no FSMN-VAD in this model and none given, so long audio is cut at pauses and silence or noise can "
    "come out as made-up words; embed one (fun-asr-convert SRC --vad-model DIR|GGUF), give {h[give_vad]}, or set "
    f"{VAD_ENV}; {{h[vad_off]}} turns this notice off"
)


def no_vad_notice(model: Any) -> Notice:
    """The ``no_vad`` notice of a Session without a VAD (``model``: its model file)."""
    return Notice("no_vad", Message(NO_VAD_MESSAGE, model=model))


def _open_segment(item: CutItem, a: int, b: int) -> None:
    """Samples [a, b) become the recording's next segment (its text comes when it is decoded)."""
    item.spans.append((a, b))
    item.segments.append(Segment(a / SAMPLE_RATE, b / SAMPLE_RATE, "", [], "empty", False, False))


@dataclass
class Arrivals:
    """Recordings that join a running ``transcribe_batch`` (a server's requests that arrive while it decodes).

    ``take(n)``: up to n more recordings ``(audio, name)`` that have arrived, or none yet (asked whenever a decoder
    slot is free and nothing else waits; it must not block). ``deliver(index, result)``: each recording's
    :class:`~fun_asr.asr.results.Transcription` as soon as it is ready, the given recordings numbered first, then
    the arrivals in the order they came."""

    take: Callable[[int], list[tuple[AudioInput, str]]]
    deliver: Callable[[int, Transcription], None]


class Pipeline:
    """Recordings through ``engine`` (an :class:`~fun_asr.asr.engine.Engine`, which the pipeline uses and does not
    own), with what cutting a recording needs: its ``vad`` (None: cut at pauses) and input ``limits``. A
    recording's speaker windows come from ``speaker_windows`` (the Session's, which holds the speaker model;
    None: the pipeline cannot diarize)."""

    def __init__(self, engine: Engine, limits: Limits, vad: FsmnVad | None = None,
                 speaker_windows: Callable[[], RecordingSpeakers] | None = None) -> None:
        self.engine = engine
        self.limits = limits
        self.vad = vad
        self._speaker_windows_of = speaker_windows
        self._told_languages: set[str] = set()  # languages the spec lacks, logged once each

    def _speaker_windows(self) -> RecordingSpeakers:
        """A recording's speaker windows, embedded by the speaker model (``speaker_windows``)."""
        if self._speaker_windows_of is None:
            raise NotImplementedError("diarize=True needs a speaker model (fun_asr.Session(speaker_model=...))")
        return self._speaker_windows_of()

    def _run(self, audios: list[AudioInput], sample_rate: int | None, opts: TranscribeOptions, batch_size: int,
             progress: bool, raise_errors: bool, names: list[str] | None = None,
             warn: bool = True, drafts: list[list[int] | None] | None = None) -> list[Transcription]:
        """Each recording streams through read -> 16 kHz -> fbank -> VAD (or the pause splitter) -> the
        segment's features -> encoder, block by block, so that no recording is held whole (_stream); the
        segments' adaptor rows wait for decoding, all recordings' together (longest first), in waves when
        they grow past _WAVE_BYTES."""
        with self.engine.interruptible():
            return self._run_all(audios, sample_rate, opts, batch_size, progress, raise_errors, names, warn, drafts)

    def _run_all(self, audios: list[AudioInput], sample_rate: int | None, opts: TranscribeOptions,
                 batch_size: int, progress: bool, raise_errors: bool, names: list[str] | None,
                 warn: bool, drafts: list[list[int] | None] | None) -> list[Transcription]:
        t_start = time.perf_counter()
        before, after = self.engine.prompt_ids(opts)
        items = [CutItem(i) for i in range(len(audios))]
        for item, d in zip(items, drafts or [], strict=False):
            item.draft = d
        with self.engine._lock:
            prefix = self.engine.model.embed(before)
            suffix = self.engine.model.embed(after)
            self.engine._use_prefix(before, prefix)
        jobs: list[tuple[CutItem, int, np.ndarray]] = []  # (item, segment index, adaptor rows)
        waiting = [0]  # bytes held for decoding: the jobs' rows, the features kept for word timestamps
        # segments are encoded as the recordings are read: the bar's total is the segments decided so far
        bar: list[Any] = [NoBar(), 0]  # the encoding bar (from the second segment on), segments decided
        # segments waiting for a packed encoder pass (Engine.encoder_pack; up to batch_size of them)
        pack = min(batch_size, self.engine.encoder_pack) if batch_size > 1 else 1
        pending: list[tuple[CutItem, int, np.ndarray]] = []

        def encode_pending() -> None:
            segments = [s for s in pending if s[0].error is None]
            pending.clear()
            if not segments:
                return
            try:
                self.engine._encode_segments(segments, opts, jobs, waiting)
            except (ValueError, RuntimeError, MemoryError):
                if raise_errors:
                    raise
                for segment in segments:  # find the bad one; the others encode as they would have
                    try:
                        self.engine._encode_segments([segment], opts, jobs, waiting)
                    except (ValueError, RuntimeError, MemoryError) as exc:
                        segment[0].fail(exc)

        def encode(item: CutItem, a: int, b: int) -> None:
            _open_segment(item, a, b)
            bar[1] += 1
            if bar[1] == 2 and progress:
                bar[0] = progress_bar(True, 2, "encoding", "seg")
                bar[0].update(1)
            elif bar[1] > 2:
                bar[0].total = bar[1]
                bar[0].refresh()
            try:
                if pack > 1:
                    segment = self.engine._segment_features(item, a, b)
                    if segment is not None:
                        pending.append(segment)
                    if len(pending) >= pack:
                        encode_pending()
                else:
                    self.engine._encode(item, a, b, opts, jobs, waiting)
                self._add_speaker_window(item, a, b, opts)
            finally:
                bar[0].update(1)

        def decode() -> None:
            encode_pending()
            bar[0].close()
            bar[:] = [NoBar(), 0]
            wave = [j for j in jobs if j[0].error is None]
            jobs.clear()
            waiting[0] = 0
            with self.engine._lock:
                self.engine._use_prefix(before, prefix)
                self.engine._decode(wave, opts, batch_size, progress, raise_errors, prefix, suffix)
                if opts.word_timestamps:
                    self.engine._align(items)

        for item, audio in zip(items, audios, strict=True):  # a bad recording fails alone
            item.source = names[item.index] if names else source_name(audio, item.index, len(items))
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

        options = self._options_record(opts)
        if opts.diarize:
            for item in items:
                self._label_speakers(item, opts)
        total_ms = (time.perf_counter() - t_start) * 1e3
        results = []
        for item in items:  # a loop, not a comprehension: warnings point at the caller (stacklevel)
            results.append(self._result(item, opts, options, total_ms if len(items) == 1 else None, warn))
        return results

    def _options_record(self, opts: TranscribeOptions) -> dict[str, Any]:
        """The options a result records (Transcription.options)."""
        options = {"language": opts.language, "itn": opts.itn, "hotwords": list(opts.hotwords),
                   "max_new_tokens": opts.max_new_tokens, "segment_seconds": opts.segment_seconds,
                   "repetition_guard": opts.repetition_guard}
        if opts.word_timestamps:
            engine = self.engine
            options["word_timestamps"] = True if engine.aligner is not None else f"unavailable: {engine.ctc_reason}"
        options.update(opts.vad_options.to_dict())  # the VAD kwargs given (none: the VAD's defaults)
        if opts.diarize:
            options["diarize"] = True
            options.update(opts.speakers.to_dict())
        options.update(opts.output_options())  # max_line_width / max_line_count given: srt/vtt use them
        return options

    def _add_speaker_window(self, item: CutItem, a: int, b: int, opts: TranscribeOptions) -> None:
        """diarize: samples [a, b) (a segment just cut) into the recording's speaker windows."""
        if opts.diarize:
            if item.speakers is None:
                item.speakers = self._speaker_windows()
            item.speakers.add(a / SAMPLE_RATE, item.samples[a:b])

    def _run_arrivals(self, audios: list[AudioInput], sample_rate: int | None, opts: TranscribeOptions,
                      batch_size: int, names: list[str] | None, warn: bool, arrivals: Arrivals) -> list[Transcription]:
        """_run with recordings joining while it decodes (a server's requests arriving mid-batch): every
        recording is read, cut and encoded as it comes (the given ones first, then each that ``arrivals.take``
        hands over whenever the decoder has a free slot and nothing else waits); its segments' prefills join the
        running decoding steps (Model.generate_batch's join: continuous batching over at most ``batch_size``
        sequences), and its result goes to ``arrivals.deliver`` as soon as its last segment ends. Every
        segment's tokens are those it gets decoded alone (bit for bit on the CPU). Returns every result, the
        given recordings' first, then the arrivals' in the order they came."""
        with self.engine.interruptible():
            before, after = self.engine.prompt_ids(opts)
            with self.engine._lock:
                prefix = self.engine.model.embed(before)
                suffix = self.engine.model.embed(after)
                self.engine._use_prefix(before, prefix)
            options = self._options_record(opts)
            stop = [] if opts.ignore_eos else self.engine.stop_ids
            items: list[CutItem] = []
            results: dict[int, Transcription] = {}
            queued: list[tuple[CutItem, int, np.ndarray]] = []  # encoded segments waiting for a decoder slot
            owners: list[tuple[CutItem, int, float]] = []  # per decoder sequence: its item, segment, time handed over
            left: dict[int, int] = {}  # per item: its segments not decoded yet

            def finish(item: CutItem) -> None:
                if opts.word_timestamps and item.error is None:
                    self.engine._align([item])
                if opts.diarize:
                    self._label_speakers(item, opts)
                results[item.index] = self._result(item, opts, options, None, warn)
                arrivals.deliver(item.index, results[item.index])

            def read(audio: AudioInput, name: str) -> None:
                item = CutItem(len(items))
                items.append(item)
                item.source = name
                jobs: list[tuple[CutItem, int, np.ndarray]] = []

                def encode(it: CutItem, a: int, b: int) -> None:
                    _open_segment(it, a, b)
                    self.engine._encode(it, a, b, opts, jobs, [0])
                    self._add_speaker_window(it, a, b, opts)

                try:
                    for _ in self._stream(item, audio, sample_rate, opts, encode, False, name):
                        pass
                except (AudioError, OSError, ValueError, RuntimeError, MemoryError) as exc:
                    item.fail(exc)
                jobs = jobs if item.error is None else []
                if not opts.word_timestamps:  # (a batch takes no CTC draft: nothing else needs the encoder output)
                    item.enc_out.clear()
                left[item.index] = len(jobs)
                queued.extend(jobs)
                if not jobs:
                    finish(item)

            def hand_over(free: int, max_rows: int) -> list[np.ndarray]:
                if not queued:
                    for audio, name in arrivals.take(free):
                        read(audio, name)
                prompts = []
                while queued and len(prompts) < free:
                    item, si, rows = queued[0]
                    if len(prefix) + len(rows) + len(suffix) > max_rows:  # no room in this batch's cache: the next
                        break
                    queued.pop(0)
                    owners.append((item, si, time.perf_counter()))
                    prompts.append(np.ascontiguousarray(np.concatenate([prefix, rows, suffix])))
                return prompts

            def done(index: int, tokens: list[int], reason: str) -> None:
                item, si, t0 = owners[index]
                self.engine._fill_segment(item, si, tokens, reason, self.engine.model.token_logprobs_of(index))
                item.timings["decode_ms"] += (time.perf_counter() - t0) * 1e3  # its prefill and steps, shared
                left[item.index] -= 1
                if left[item.index] == 0:
                    finish(item)

            for i, audio in enumerate(audios):
                read(audio, names[i] if names else source_name(audio, i, len(audios)))
            # room in the cache for a joining segment of up to segment_seconds
            frames = int(opts.segment_seconds / self.engine.frontend.seconds_per_lfr_frame) + 1
            join_rows = len(prefix) + fake_token_len(frames, self.engine.prompt.fake_token_halvings) + len(suffix)
            while True:
                first = hand_over(batch_size, self.engine.context_length)
                if not first:
                    break
                owners[:] = owners[-len(first):]  # this call's sequences count from 0
                with self.engine._lock:
                    self.engine._use_prefix(before, prefix)
                    self.engine.model.generate_batch(first, opts.max_new_tokens, stop,
                                                     repetition_guard=opts.repetition_guard, max_active=batch_size,
                                                     join=hand_over, on_done=done, join_rows=join_rows)
            return [results[i] for i in range(len(items))]

    def _stream(self, item: CutItem, audio: AudioInput, sample_rate: int | None, opts: TranscribeOptions,
                encode: Callable[[CutItem, int, int], None], progress: bool, label: str) -> Iterator[bool]:
        """Reads one recording block by block (AudioReader: the checks and limits of decode_audio as the
        blocks come), cuts it into segments as they are decided (Cutter) and hands each to ``encode``,
        keeping only the samples and fbank frames that segments to come need. Yields False after each
        block (the caller may decode in between), True at the end; raises what reading or cutting raised."""
        t0 = time.perf_counter()
        reader = AudioReader(audio, sample_rate, item.source, self.limits)
        item.timings["load_ms"] += (time.perf_counter() - t0) * 1e3
        expected = reader.expected_seconds
        bar = progress_bar(progress, None if expected is None else int(round(expected)), label, "s", delay=1.0)
        cutter = Cutter(self.engine.frontend, self.vad, item, opts)
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
                    item.segments[-1].no_speech_prob = cutter.no_speech_prob(a, b)
                cutter.trim()
                seconds = len(item.samples) // SAMPLE_RATE
                if seconds > shown:
                    bar.update(seconds - shown)
                    shown = seconds
                yield False
            item.warnings = [Notice("input_truncated", w) for w in reader.info.warnings]
            item.input_truncated = reader.info.truncated
            if len(item.samples) < self.engine.frontend.samples_per_frame:
                item.empty_reason = "too_short"
                item.segmentation = None  # nothing was cut
                seconds = len(item.samples) / SAMPLE_RATE
                frame_ms = self.engine.frontend.frame_length_ms
                item.warnings.append(Notice("too_short", f"{item.source}: audio is {seconds:.3f} s long, shorter than "
                                            f"one {frame_ms:g} ms analysis frame: nothing to transcribe"))
            else:
                for a, b in cutter.finish():
                    encode(item, a, b)
                    item.segments[-1].no_speech_prob = cutter.no_speech_prob(a, b)
                if item.segmentation == "vad" and not item.spans:
                    item.empty_reason = "no_speech"
        finally:
            reader.close()
            cutter.release()
            bar.close()
        yield True

    def _label_speakers(self, item: CutItem, opts: TranscribeOptions) -> None:
        """Each segment's speaker from the recording's windows (FunASR's clustering, vad_segment mode)."""
        if item.error is not None:
            return
        t0 = time.perf_counter()
        speakers = item.speakers or self._speaker_windows()
        labels, timeline = speakers.label([(s.start, s.end) for s in item.segments], opts.speakers)
        segments = []
        for seg, spk in zip(item.segments, labels, strict=True):  # a segment two speakers share is cut at the turn
            segments += split_at_speakers(seg, spk, timeline, self.engine.tokenizer.decode, self.engine.stop_ids)
        item.segments = segments
        item.speaker_turns = timeline
        item.timings["speaker_ms"] = speakers.embed_ms + (time.perf_counter() - t0) * 1e3
        item.speakers = None

    def _result(self, item: CutItem, opts: TranscribeOptions, options: dict[str, Any],
                total_ms: float | None, warn: bool = True) -> Transcription:
        # conditions of the whole Session: logged once (Session.__init__, _align), recorded in every result
        session_notes = []
        if opts.no_vad and item.segmentation == "pauses":
            session_notes.append(no_vad_notice(self.engine.path))
        if opts.word_timestamps and self.engine.aligner is None:
            session_notes.append(Notice("word_timestamps_unavailable", f"word timestamps unavailable: "
                                        f"{self.engine.ctc_reason}; segment-level times only"))
        unknown = language_notice(self.engine.spec, opts.language)  # recorded in every result, logged once per language
        if unknown is not None:
            session_notes.append(unknown)
            # bounded: a server's clients can send any number of names (past 256, they are only in the results)
            if opts.language not in self._told_languages and len(self._told_languages) < 256:
                self._told_languages.add(opts.language)
                log.warning("%s", unknown)
        self.engine._token_words(item)
        return assemble(item, opts, options, total_ms, self.engine.spec, session_notes, warn)

