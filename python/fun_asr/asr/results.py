"""Results: a transcribed :class:`Segment` and the :class:`Transcription` of one recording."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from fun_asr.asr.confidence import avg_logprob, compression_ratio
from fun_asr.asr.language import guess_language


@dataclass
class Segment:
    start: float
    end: float
    text: str
    tokens: list[int]
    stop_reason: str  # eos | max_new_tokens | repetition
    truncated: bool  # hit max_new_tokens: the text may be cut
    repetition: bool  # the repetition guard stopped an n-gram loop
    # word_timestamps: [{"word", "start", "end", "score", "probability"}] (s; score: the CTC head's, FunASR's;
    # probability: the decoder's, as in token_words)
    words: list[dict[str, Any]] | None = None
    speaker: int | None = None  # diarize: the speaker (0, 1, ... in order of first appearance; label SPK0, ...)
    # the log-probability of each token in ``tokens`` (the stop token's included): log softmax of the decoder's
    # logits at the token it took
    token_logprobs: list[float] | None = None
    # the mean FSMN-VAD silence probability over the segment's 10 ms frames (None: cut without a VAD)
    no_speech_prob: float | None = None
    # the text as words [{"word", "probability"}]: each the mean token probability of the tokens spelling it
    # (fun_asr.asr.confidence.token_words); the words joined are the text before stripping
    token_words: list[dict[str, Any]] | None = None

    @property
    def speaker_label(self) -> str | None:
        """``SPK0``, ``SPK1``, ... (FunASR's server labels), or None without diarization."""
        return None if self.speaker is None else f"SPK{self.speaker}"

    @property
    def avg_logprob(self) -> float | None:
        """The mean of ``token_logprobs`` (Whisper's ``avg_logprob``: its end-of-text token counts too), <= 0;
        None without tokens."""
        return avg_logprob(self.token_logprobs)

    @property
    def compression_ratio(self) -> float:
        """Whisper's compression ratio of the text (UTF-8 bytes / zlib-compressed bytes; > 2.4: repetitive)."""
        return compression_ratio(self.text)


def _segment_dict(s: Segment) -> dict[str, Any]:
    d = asdict(s)
    if d["speaker"] is None:  # no diarization: the segment has no speaker key
        del d["speaker"]
    d["avg_logprob"] = s.avg_logprob
    d["compression_ratio"] = s.compression_ratio
    return d


@dataclass
class Transcription:
    """One recording's result.

    ``warnings`` lists everything a reader of the text should know, each a :class:`fun_asr.notices.Notice`
    (the message, with a ``code``: ``input_truncated``, ``too_short``, ``truncated``, ``repetition``,
    ``word_timestamps_failed``, and the Session-wide ``no_vad`` and ``word_timestamps_unavailable``;
    ``warning_codes`` lists the codes). Per-recording ones are also issued once as Python warnings; the
    Session-wide ones are logged once per Session. ``empty_reason`` says why ``text`` is empty when it is for a
    known reason (``"too_short"``: less than one 25 ms analysis frame; ``"no_speech"``: the VAD found
    none, so the recognizer was not run; ``"error"``). In
    ``transcribe_batch`` a recording that cannot be read or transcribed does not fail the batch: its
    result has ``error`` set (and ``ok`` False) and the others are transcribed as usual.
    """

    text: str
    segments: list[Segment]
    language: str | None
    duration: float
    timings: dict[str, float]
    options: dict[str, Any] = field(default_factory=dict)
    source: str | None = None  # file name, "<audio bytes>", "<array>"
    warnings: list[str] = field(default_factory=list)
    input_truncated: bool = False  # the file holds less audio than its header promises
    empty_reason: str | None = None  # "too_short" | "error" when text is empty for that reason
    error: str | None = None  # transcribe_batch: why this recording failed (its text is empty)
    segmentation: str | None = None  # "vad" (FSMN-VAD speech segments) | "pauses" (cut at quiet points)
    # diarize: the speaker timeline [(start_s, end_s, speaker)] (FunASR's postprocess output); None without
    speakers: list[tuple[float, float, int]] | None = None

    @property
    def num_speakers(self) -> int | None:
        """How many speakers the diarization found (None without diarization)."""
        if self.speakers is None:
            return None
        return len({s for _, _, s in self.speakers})

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def warning_codes(self) -> list[str]:
        """The code of each warning, in order (a plain string from an older record counts as input_truncated)."""
        return [getattr(w, "code", "input_truncated") for w in self.warnings]

    @property
    def truncated(self) -> bool:
        """Some segment hit max_new_tokens, so its text may be cut."""
        return any(s.truncated for s in self.segments)

    @property
    def words(self) -> list[dict[str, Any]] | None:
        """Every segment's word (CTC token) timestamps in order, or None when none were computed."""
        if all(s.words is None for s in self.segments):
            return None
        return [w for s in self.segments for w in (s.words or [])]

    @property
    def detected_language(self) -> str | None:
        """The requested language, else one inferred from the script of the text (kana: ja, hangul:
        ko, other CJK: zh, Latin letters: en); Fun-ASR-Nano has no language-ID output of its own."""
        return self.language or guess_language(self.text)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": 2,
            "source": self.source,
            "text": self.text,
            "language": self.language,
            "detected_language": self.detected_language,
            "duration": round(self.duration, 3),
            "truncated": self.truncated,
            "input_truncated": self.input_truncated,
            "empty_reason": self.empty_reason,
            "error": self.error,
            "segmentation": self.segmentation,
            "warnings": [str(w) for w in self.warnings],
            "warning_codes": self.warning_codes,
            "segments": [_segment_dict(s) for s in self.segments],
            **({} if self.speakers is None else {
                "num_speakers": self.num_speakers,
                "speakers": [{"start": round(a, 3), "end": round(b, 3), "speaker": k} for a, b, k in self.speakers]}),
            "timings": self.timings,
            "options": self.options,
        }
