"""FunASR's VAD decision logic (``FsmnVADStreaming.DetectOneFrame`` and friends) and 1.4.16's offline ``inference()``
(:func:`detect_segments`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import numpy as np

from fun_asr.vad.config import STREAMING_SILENCE_SCHEDULE, VadConfig
from fun_asr.vad.frontend import num_fbank_frames

_START_NOT_DETECTED, _IN_SPEECH, _END_DETECTED = 1, 2, 3  # VadStateMachine
_SPEECH2SPEECH, _SPEECH2SIL, _SIL2SIL, _SIL2SPEECH = 0, 1, 2, 3  # AudioChangeState


class _Seg:
    __slots__ = ("start_ms", "end_ms", "has_start", "has_end")

    def __init__(self, start_ms: int) -> None:
        self.start_ms = start_ms
        self.end_ms = start_ms
        self.has_start = False
        self.has_end = False


class VadDetector:
    """FunASR 1.4.16's per-stream VAD state (``cache["stats"]`` + ``WindowDetector``) and frame rules.

    Feed it every frame's silence probability (column ``sil_pdf_ids`` of the softmax, summed if several)
    and decibels, in order, through :meth:`accept`, one call per FunASR ``forward`` (the chunk). Its
    thresholds (``end_silence_ms``, ``speech_noise_thres``) may change between calls, as FunASR's schedule
    does."""

    def __init__(self, cfg: VadConfig, end_silence_ms: int | None = None,
                 speech_noise_thres: float | None = None) -> None:
        self.cfg = cfg
        frame = cfg.frame_in_ms
        self._win_size = int(cfg.window_size_ms / frame)
        self._sil2speech = int(cfg.sil_to_speech_time_thres / frame)
        self._speech2sil = int(cfg.speech_to_sil_time_thres / frame)
        self._latency = self._win_size + (int(cfg.lookback_time_start_point / frame) if cfg.do_extend else 0)
        self._lookahead = int(cfg.lookahead_time_end_point / frame)
        self._max_seg_frames = cfg.segment_limit_ms / frame  # float, as FunASR compares
        # Stats.max_end_sil_frame_cnt_thresh (a time in ms despite its name)
        end = cfg.max_end_silence_time if end_silence_ms is None else end_silence_ms
        self.max_end_sil_ms = end - cfg.speech_to_sil_time_thres
        self.speech_noise_thres = cfg.speech_noise_thres if speech_noise_thres is None else speech_noise_thres
        self.frames = 0  # frm_cnt
        self.noise_average_decibel = -100.0
        self.number_end_time_detected = 0
        self.data_buf_start_frame = 0
        self._segs: list[_Seg] = []
        self._out_offset = 0
        self._next_seg = True
        self._reset_detection()

    # -- thresholds --------------------------------------------------------------------------------
    def set_end_silence(self, silence_ms: int) -> None:
        """What FunASR's dynamic schedule does: ``max(silence_ms - speech_to_sil_time_thres, 0)``."""
        self.max_end_sil_ms = max(silence_ms - self.cfg.speech_to_sil_time_thres, 0)

    @property
    def in_speech(self) -> bool:
        return self._state == _IN_SPEECH

    @property
    def silence_ms(self) -> int:
        """How long the frames have been silent (the detector's running silence count), in ms."""
        return self._sil_count * self.cfg.frame_in_ms

    def fork(self) -> VadDetector:
        """An independent copy to simulate on (VadStream.predicted_end): the segments not returned yet, the
        window and the counters; the segments already returned are left out."""
        other = copy.copy(self)
        other._segs = [copy.copy(seg) for seg in self._segs[self._out_offset:]]
        other._out_offset = 0
        other._win = list(self._win)
        return other

    def first_pending_frame(self) -> int:
        """No segment that :meth:`accept` has not returned yet starts before this frame: the open one
        (if any) starts here or later, and a later one at most the start look-back before the next frame."""
        starts = [seg.start_ms // self.cfg.frame_in_ms for seg in self._segs[self._out_offset:]]
        return max(0, min([*starts, self.frames - self._latency]))

    # -- state ---------------------------------------------------------------------------------------
    def _reset_window(self) -> None:
        self._win = [0] * self._win_size
        self._win_sum = 0
        self._win_pos = 0
        self._win_speech = False  # pre_frame_state

    def _reset_detection(self) -> None:
        self._sil_count = 0  # continous_silence_frame_count
        self._latest_speech = 0  # latest_confirmed_speech_frame
        self._latest_silence = -1  # lastest_confirmed_silence_frame
        self._confirmed_start = -1
        self._confirmed_end = -1
        self._state = _START_NOT_DETECTED
        self._reset_window()

    # -- per frame -----------------------------------------------------------------------------------
    def _frame_is_speech(self, p_sil: float, db: float) -> bool:
        """GetFrameState."""
        cfg = self.cfg
        snr = db - self.noise_average_decibel
        if db < cfg.decibel_thres:
            return False
        # FunASR: noise_prob = log(p_sil) * ratio; speech_prob = log(1 - p_sil);
        # speech if exp(speech_prob) >= exp(noise_prob) + speech_noise_thres (a log(0) would raise there).
        noise = math.exp(math.log(p_sil) * cfg.speech_2_noise_ratio) if p_sil > 0 else 0.0
        rest = 1.0 - p_sil
        speech = math.exp(math.log(rest)) if rest > 0 else 0.0
        if speech >= noise + self.speech_noise_thres:
            return snr >= cfg.snr_thres and db >= cfg.decibel_thres
        if self.noise_average_decibel < -99.9:
            self.noise_average_decibel = db
        else:
            n = cfg.noise_frame_num_used_for_snr
            self.noise_average_decibel = (db + self.noise_average_decibel * (n - 1)) / n
        return False

    def _window(self, speech: bool) -> int:
        """WindowDetector.DetectOneFrame."""
        cur = 1 if speech else 0
        self._win_sum += cur - self._win[self._win_pos]
        self._win[self._win_pos] = cur
        self._win_pos = (self._win_pos + 1) % self._win_size
        if not self._win_speech and self._win_sum >= self._sil2speech:
            self._win_speech = True
            return _SIL2SPEECH
        if self._win_speech and self._win_sum <= self._speech2sil:
            self._win_speech = False
            return _SPEECH2SIL
        return _SPEECH2SPEECH if self._win_speech else _SIL2SIL

    def _pop_to_output(self, frame: int, first_is_start: bool, last_is_end: bool) -> None:
        """PopDataToOutputBuf(frame, 1, ...): extends (or opens) the current segment through ``frame``."""
        self.data_buf_start_frame = max(self.data_buf_start_frame, frame)  # PopDataBufTillFrame
        if not self._segs or first_is_start:
            self._segs.append(_Seg(frame * self.cfg.frame_in_ms))
        seg = self._segs[-1]
        self.data_buf_start_frame += 1
        seg.end_ms = (frame + 1) * self.cfg.frame_in_ms
        if first_is_start:
            seg.has_start = True
        if last_is_end:
            seg.has_end = True

    def _on_voice_detected(self, frame: int) -> None:
        self._latest_speech = frame
        self._pop_to_output(frame, False, False)

    def _on_silence_detected(self, frame: int) -> None:
        self._latest_silence = frame
        if self._state == _START_NOT_DETECTED:
            self.data_buf_start_frame = max(self.data_buf_start_frame, frame)

    def _on_voice_start(self, frame: int, fake: bool = False) -> None:
        if self._confirmed_start == -1:
            self._confirmed_start = frame
        if not fake and self._state == _START_NOT_DETECTED:
            self._pop_to_output(self._confirmed_start, True, False)

    def _on_voice_end(self, frame: int, fake: bool) -> None:
        for t in range(self._latest_speech + 1, frame):
            self._on_voice_detected(t)
        if self._confirmed_end == -1:
            self._confirmed_end = frame
        if not fake:
            self._pop_to_output(self._confirmed_end, False, True)
        self.number_end_time_detected += 1

    def _end_segment(self, frame: int) -> None:
        self._on_voice_end(frame, False)
        self._state = _END_DETECTED

    def _speech_frame(self, frame: int, ends: bool) -> None:
        """A speech frame inside a segment: it joins the segment, or ends it (``ends``: the segment is too long, or
        this is the input's last frame)."""
        if ends:
            self._end_segment(frame)
        else:
            self._on_voice_detected(frame)

    def _speech_starts(self, state: int, cur: int, ends: bool) -> None:
        """The window turned to speech at frame ``cur``: a segment starts (``_latency`` frames back, not before the
        data buffer), or, inside one, the frames since the last speech frame join it (``ends``: as
        :meth:`_speech_frame`)."""
        if state == _START_NOT_DETECTED:
            start = max(self.data_buf_start_frame, cur - self._latency)
            self._on_voice_start(start)
            self._state = _IN_SPEECH
            for t in range(start + 1, cur + 1):
                self._on_voice_detected(t)
        elif state == _IN_SPEECH:
            for t in range(self._latest_speech + 1, cur):
                self._on_voice_detected(t)
            self._speech_frame(cur, ends=ends)

    def _no_speech(self, cur: int) -> None:
        """No start found (the single-utterance start timeout, or the input's end without any segment): the
        silence so far is confirmed and an empty segment is started and ended (not output)."""
        for t in range(self._latest_silence + 1, cur):
            self._on_silence_detected(t)
        self._on_voice_start(0, fake=True)
        self._on_voice_end(0, fake=True)
        self._state = _END_DETECTED

    def _silence_in_speech(self, cur: int, too_long: bool, is_final: bool) -> None:
        """A silence frame inside a segment: the segment ends once the silence has lasted ``max_end_sil_ms`` (back
        at its start, less the lookahead when extending), when it is too long or at the input's end; else,
        extending, the frame joins the segment within the lookahead."""
        cfg = self.cfg
        if self._sil_count * cfg.frame_in_ms >= self.max_end_sil_ms:
            lookback = int(self.max_end_sil_ms / cfg.frame_in_ms)
            if cfg.do_extend:
                lookback = max(0, lookback - self._lookahead - 1)
            self._end_segment(cur - lookback)
        elif too_long:
            self._end_segment(cur)
        elif cfg.do_extend and not is_final:
            if self._sil_count <= self._lookahead:
                self._on_voice_detected(cur)
        elif is_final:
            self._end_segment(cur)

    def _detect_one_frame(self, speech: bool, cur: int, is_final: bool) -> None:
        cfg = self.cfg
        if speech and not (1.0 > cfg.fe_prior_thres):
            speech = False
        change = self._window(speech)
        state = self._state
        too_long = cur - self._confirmed_start + 1 > self._max_seg_frames
        if change == _SIL2SPEECH:
            self._sil_count = 0
            self._speech_starts(state, cur, too_long or is_final)
        elif change == _SPEECH2SIL or change == _SPEECH2SPEECH:
            self._sil_count = 0
            if state == _IN_SPEECH:
                self._speech_frame(cur, ends=too_long or is_final)
        else:  # _SIL2SIL
            self._sil_count += 1
            if state == _START_NOT_DETECTED:
                single_timeout = (cfg.detect_mode == 0
                                  and self._sil_count * cfg.frame_in_ms > cfg.max_start_silence_time)
                if single_timeout or (is_final and self.number_end_time_detected == 0):
                    self._no_speech(cur)
                elif cur >= self._latency:
                    self._on_silence_detected(cur - self._latency)
            elif state == _IN_SPEECH:
                self._silence_in_speech(cur, too_long, is_final)
        if self._state == _END_DETECTED and cfg.detect_mode == 1:
            self._reset_detection()

    # -- per chunk -----------------------------------------------------------------------------------
    def accept(self, silence_probs: Sequence[float] | np.ndarray, decibels: Sequence[float] | np.ndarray,
               is_final: bool = False, streaming: bool = False) -> list[list[int]]:
        """One FunASR ``forward`` call over the next frames. Returns, as FunASR does:

        - ``streaming=False``: completed segments ``[start_ms, end_ms]`` (and, when ``is_final``, every
          segment not returned yet, an open one included);
        - ``streaming=True``: events ``[beg, -1]`` (start), ``[-1, end]`` (end), ``[beg, end]`` (both).

        No frames -> no detection at all (FunASR returns before detecting, even when ``is_final``)."""
        probs = np.asarray(silence_probs).reshape(-1).astype(np.float64)  # exact for float32 input
        dbs = np.asarray(decibels).reshape(-1).astype(np.float64)
        n = probs.shape[0]
        if dbs.shape[0] != n:
            raise ValueError(f"{n} probabilities but {dbs.shape[0]} decibel values")
        if n == 0:
            return []
        base = self.frames
        self.frames += n
        if self._state != _END_DETECTED:
            p_list, db_list = probs.tolist(), dbs.tolist()
            for k in range(n):
                speech = self._frame_is_speech(p_list[k], db_list[k])
                self._detect_one_frame(speech, base + k, is_final and k == n - 1)
        return self._collect(is_final, streaming)

    def _collect(self, is_final: bool, streaming: bool) -> list[list[int]]:
        out = []
        for i in range(self._out_offset, len(self._segs)):
            seg = self._segs[i]
            if streaming:
                if not seg.has_start or (not self._next_seg and not seg.has_end):
                    continue
                start = seg.start_ms if self._next_seg else -1
                if seg.has_end:
                    end = seg.end_ms
                    self._next_seg = True
                    self._out_offset += 1
                else:
                    end = -1
                    self._next_seg = False
            else:
                if not is_final and (not seg.has_start or not seg.has_end):
                    continue
                start, end = seg.start_ms, seg.end_ms
                self._out_offset += 1
            out.append([start, end])
        return out


def silence_column(probs: np.ndarray, sil_pdf_ids: Sequence[int]) -> np.ndarray:
    """The silence probability per frame from softmax outputs [T, C] (FunASR sums ``sil_pdf_ids``)."""
    probs = np.asarray(probs)
    if probs.ndim == 1:
        return probs  # already the silence column
    if len(sil_pdf_ids) == 1:
        return probs[:, sil_pdf_ids[0]].astype(np.float32)
    out = np.zeros(probs.shape[0], np.float64)
    for i in sil_pdf_ids:
        out += probs[:, i].astype(np.float64)
    return out


class Schedule:
    """FunASR 1.4.16 inference()'s dynamic end silence, carried across chunks (and generate calls)."""

    def __init__(self, cfg: VadConfig, chunk_ms: int) -> None:
        self.cfg = cfg
        self.chunk_ms = chunk_ms
        self.accumulated_ms = 0
        self.in_speech = False

    def before_chunk(self, det: VadDetector, n_samples: int = 0) -> None:
        if not self.cfg.dynamic:
            return
        if det.in_speech or self.in_speech:
            self.accumulated_ms += self.chunk_ms
            self.in_speech = True
        for limit_ms, silence_ms in self.cfg.silence_schedule:
            if self.accumulated_ms <= limit_ms:
                det.set_end_silence(silence_ms)
                det.speech_noise_thres = self.cfg.dynamic_speech_noise_thres
                break

    def after_chunk(self, events: list[list[int]]) -> None:
        if events and self.cfg.dynamic:
            self.accumulated_ms = 0
            self.in_speech = False


class ServerSchedule:
    """FunASR 1.4.16's realtime server (``DynamicStreamingVAD``, ``dynamic_vad.py``): before every
    chunk, the end silence follows how long the open sentence has lasted (audio end, this chunk
    included, minus the sentence's start; 0 outside speech) through ``STREAMING_SILENCE_SCHEDULE``, and
    ``speech_noise_thres`` is 0.5. FunASR applies it per received message; here per ``chunk_ms`` piece,
    which is the same for 60 ms messages and makes the result independent of how audio is fed."""

    def __init__(self, cfg: VadConfig, table: Sequence[tuple[float, int]] = STREAMING_SILENCE_SCHEDULE,
                 speech_noise_thres: float = 0.5) -> None:
        self.fs = cfg.frontend.fs
        self.table = tuple(table)
        self.thres = speech_noise_thres
        self.samples = 0
        self.speech_start_ms: int | None = None

    def before_chunk(self, det: VadDetector, n_samples: int = 0) -> None:
        self.samples += n_samples
        acc = 0 if self.speech_start_ms is None else max(0, self.samples * 1000 // self.fs - self.speech_start_ms)
        silence = self.table[-1][1]
        for limit_ms, silence_ms in self.table:
            if acc <= limit_ms:
                silence = silence_ms
                break
        det.set_end_silence(silence)
        det.speech_noise_thres = self.thres

    def after_chunk(self, events: list[list[int]]) -> None:
        for beg, end in events:
            if beg >= 0 and end == -1:
                self.speech_start_ms = beg
            elif end >= 0:
                self.speech_start_ms = None


def new_detector(cfg: VadConfig) -> VadDetector:
    # init_cache: a max_end_silence_time passed to generate() replaces the config's; the schedule, when on
    # (dynamic_silence), sets its own before every chunk
    return VadDetector(cfg, end_silence_ms=cfg.end_silence_ms)


class OfflineChunks:
    """1.4.16's offline ``inference()`` loop over per-frame values that arrive in pieces: the clip in
    ``offline_chunk_ms`` (60 s) chunks, each chunk's frames (those the streaming frontend has emitted by
    then: all but the last two until the final chunk) through the detector, the dynamic end-silence
    schedule stepped before each chunk. A chunk runs once it is known not to be the last one (more audio
    than its end has arrived) and its frames are in, or at :meth:`run` with ``final``."""

    def __init__(self, cfg: VadConfig) -> None:
        fe = cfg.frontend
        self.cfg = cfg
        self.stride = int(cfg.offline_chunk_ms * fe.fs / 1000)
        self.keep = (fe.lfr_m - 1) - (fe.lfr_m - 1) // 2  # LFR right context the streaming frontend waits for
        self.det = new_detector(cfg)
        self.sched = Schedule(cfg, cfg.offline_chunk_ms)
        self.chunk = 0  # next chunk
        self.done = 0  # frames given to the detector
        self._p = np.zeros(0, np.float64)  # frames from self._base on, not yet given to the detector
        self._db = np.zeros(0, np.float32)
        self._base = 0

    @property
    def frames(self) -> int:
        """Frames pushed so far."""
        return self._base + self._p.shape[0]

    def push(self, silence_probs: np.ndarray, decibels: np.ndarray) -> None:
        if silence_probs.shape[0] != decibels.shape[0]:
            raise ValueError(f"{silence_probs.shape[0]} probabilities but {decibels.shape[0]} decibel values")
        self._p = np.concatenate([self._p, silence_probs]) if self._p.size else silence_probs
        self._db = np.concatenate([self._db, decibels]) if self._db.size else decibels

    def run(self, n_samples: int, final: bool = False) -> list[list[int]]:
        """The chunks that can run with ``n_samples`` samples of audio so far (``final``: the whole clip,
        every frame pushed); returns their segments ``[[start_ms, end_ms], ...]``."""
        fe = self.cfg.frontend
        total = num_fbank_frames(n_samples, fe)
        if final and self.frames != total:
            raise ValueError(f"{n_samples} samples make {total} frames; got {self.frames} frame values")
        out: list[list[int]] = []
        if final and total == 0:
            return out
        last = n_samples // self.stride  # the final chunk's index, once n_samples is the clip's length
        while self.chunk < last or (final and self.chunk == last):
            is_final = final and self.chunk == last
            upto = total if is_final else max(num_fbank_frames((self.chunk + 1) * self.stride, fe) - self.keep, 0)
            if upto > self.frames:
                break  # its frames are not all in yet
            self.sched.before_chunk(self.det)
            a, b = self.done - self._base, max(upto - self._base, 0)
            segs = self.det.accept(self._p[a:b], self._db[a:b], is_final=is_final, streaming=False)
            self.done = max(self.done, upto)
            out.extend(segs)
            self.sched.after_chunk(bool(segs))
            self.chunk += 1
            drop = self.done - self._base
            self._p, self._db, self._base = self._p[drop:], self._db[drop:], self.done
        return out


def detect_segments(silence_probs: np.ndarray, decibels: np.ndarray, n_samples: int,
                    cfg: VadConfig = VadConfig()) -> list[list[int]]:
    """Speech segments ``[[start_ms, end_ms], ...]`` of a whole clip, as FunASR 1.4.16's offline
    ``AutoModel.generate(input=clip)``: the clip in ``offline_chunk_ms`` (60 s) chunks, each chunk's frames
    (those the streaming frontend has emitted by then: all but the last two until the final chunk) through
    the detector, the dynamic end-silence schedule stepped before each chunk.

    ``silence_probs``/``decibels``: one value per frame of the whole clip (``num_fbank_frames(n_samples)``);
    ``silence_probs`` may also be the full softmax output [T, C]."""
    p = silence_column(silence_probs, cfg.sil_pdf_ids)
    db = np.asarray(decibels, dtype=np.float32).reshape(-1)
    total = num_fbank_frames(n_samples, cfg.frontend)
    if p.shape[0] != total or db.shape[0] != total:
        raise ValueError(f"{n_samples} samples make {total} frames; got {p.shape[0]} probabilities and "
                         f"{db.shape[0]} decibel values")
    chunks = OfflineChunks(cfg)
    chunks.push(p, db)
    return chunks.run(n_samples, final=True)
