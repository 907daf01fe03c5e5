"""fun_asr.Session: audio in, text out, with FunASR's exact preprocessing, prompt and decoding."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fun_asr import _core
from fun_asr.audio import SAMPLE_RATE, AudioInput, load_audio
from fun_asr.frontend import FrontendConfig, fake_token_len, features
from fun_asr.hub import DEFAULT_REPO, resolve_model
from fun_asr.model import load_model
from fun_asr.prompt import PromptSpec, prompt_text
from fun_asr.segment import split_points
from fun_asr.tokenizer import TextTokenizer

log = logging.getLogger("fun_asr")


@dataclass
class Segment:
    start: float
    end: float
    text: str
    tokens: list[int]
    stop_reason: str  # eos | max_new_tokens | repetition
    truncated: bool  # hit max_new_tokens: the text may be cut
    repetition: bool  # the repetition guard stopped an n-gram loop


@dataclass
class Transcription:
    text: str
    segments: list[Segment]
    language: str | None
    duration: float
    timings: dict[str, float]
    options: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": 1,
            "text": self.text,
            "language": self.language,
            "duration": round(self.duration, 3),
            "segments": [asdict(s) for s in self.segments],
            "timings": self.timings,
            "options": self.options,
        }


@dataclass(frozen=True)
class TranscribeOptions:
    language: str | None = None
    itn: bool = True
    hotwords: tuple[str, ...] = ()
    max_new_tokens: int = 512
    segment_seconds: float = 30.0
    repetition_guard: bool = True
    ignore_eos: bool = False  # benchmarks only: always generate max_new_tokens


def _read_metadata(path: Path) -> dict[str, Any]:
    """The GGUF-style metadata of a GGUF file or a checkpoint folder."""
    if path.is_dir():
        from fun_asr.checkpoint import Checkpoint
        from fun_asr.converter.writer import gguf_metadata

        ckpt = Checkpoint.open(path)
        return gguf_metadata(ckpt, ckpt.hparams)
    import gguf

    reader = gguf.GGUFReader(path)
    keys = ("tokenizer.huggingface.json", "fun_asr_nano.prompt", "fun_asr_nano.model_spec")
    return {k: reader.fields[k].contents() for k in keys if k in reader.fields}


def _default_package(device: str) -> str:
    if device.startswith(("cuda", "gpu")):
        return "f16"
    if device == "auto" and any(d["type"] in ("gpu", "igpu") for d in _core.system_info()["devices"]):
        return "f16"
    return "q8_0"


class Session:
    """A loaded model ready to transcribe.

    ``model``: a GGUF file, an HF checkpoint folder, or a hub repo id (default
    ``FunAudioLLM/Fun-ASR-Nano-2512-hf`` at the pinned revision: downloaded and converted once,
    Q8_0 on CPU and F16 on CUDA unless ``package_type`` says otherwise).
    ``device``: ``auto``, ``cpu``, ``cuda``, ``cuda:N``. ``threads``: CPU threads, 0 = all cores.
    One Session can be used from several threads; transcriptions run one at a time.
    """

    def __init__(self, model: str | os.PathLike[str] = DEFAULT_REPO, device: str = "auto", threads: int = 0, *,
                 package_type: str | None = None, revision: str | None = None, progress: bool = True) -> None:
        path = resolve_model(model, package_type or _default_package(device), revision, progress)
        self.path = path
        self.model = load_model(path, device=device, threads=threads)
        meta = _read_metadata(path)
        missing = [k for k in ("tokenizer.huggingface.json", "fun_asr_nano.prompt", "fun_asr_nano.model_spec")
                   if k not in meta]
        if missing:
            raise ValueError(f"{path}: model has no {', '.join(missing)}; re-convert it with fun-asr-convert")
        self.tokenizer = TextTokenizer(meta["tokenizer.huggingface.json"])
        self.prompt = PromptSpec.from_dict(json.loads(meta["fun_asr_nano.prompt"]))
        self.spec = json.loads(meta["fun_asr_nano.model_spec"])
        self.frontend = FrontendConfig.from_spec(self.spec)
        info = self.model.info()
        self.stop_ids: list[int] = list(info["decoder"]["eos_token_ids"])
        self.max_segment_seconds = info["encoder"]["max_frames"] * self.frontend.seconds_per_lfr_frame
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Session({str(self.path)!r}, backend={self.model.info()['backend']})"

    # -- options -------------------------------------------------------------------------------

    def normalize_language(self, language: str | None) -> str | None:
        """zh/en/ja, their English names or 中文/英文/日文 -> the code; None -> None."""
        if language is None or language == "" or str(language).lower() == "auto":
            return None
        key = str(language).strip().lower()
        for code, entry in self.spec["languages"].items():
            if key == code or key in [n.lower() for n in entry["names"]]:
                return code
        accepted = []
        for code, entry in self.spec["languages"].items():
            accepted.append(f"{code} ({', '.join(n for n in entry['names'] if n != code)})")
        raise ValueError(f"unsupported language {language!r}: accepted {'; '.join(accepted)}, or None for automatic")

    def _options(self, language: str | None, itn: bool, hotwords: list[str] | str | None, max_new_tokens: int,
                 segment_seconds: float, repetition_guard: bool, ignore_eos: bool = False) -> TranscribeOptions:
        if isinstance(hotwords, str):
            hotwords = [h.strip() for h in hotwords.split(",")]
        words = tuple(h for h in (hotwords or []) if h)
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
        if not 1.0 <= segment_seconds <= self.max_segment_seconds:
            raise ValueError(f"segment_seconds must be between 1 and {self.max_segment_seconds:.2f} "
                             f"(the encoder's position table), got {segment_seconds}")
        return TranscribeOptions(self.normalize_language(language), bool(itn), words, max_new_tokens,
                                 float(segment_seconds), bool(repetition_guard), bool(ignore_eos))

    # -- transcription -------------------------------------------------------------------------

    def prompt_ids(self, opts: TranscribeOptions) -> tuple[list[int], list[int]]:
        lang_name = None if opts.language is None else self.spec["languages"][opts.language]["prompt_name"]
        before, after = prompt_text(self.prompt, lang_name, opts.itn, list(opts.hotwords))
        return self.tokenizer.encode(before), self.tokenizer.encode(after)

    def transcribe(self, audio: AudioInput, *, sample_rate: int | None = None, language: str | None = None,
                   itn: bool = True, hotwords: list[str] | str | None = None, max_new_tokens: int = 512,
                   segment_seconds: float = 30.0, repetition_guard: bool = True,
                   progress: bool = False, ignore_eos: bool = False) -> Transcription:
        """Transcribes one recording (path, bytes, file object, or array with ``sample_rate``).

        ``ignore_eos`` is for benchmarks only: decode exactly ``max_new_tokens`` per segment.
        """
        opts = self._options(language, itn, hotwords, max_new_tokens, segment_seconds, repetition_guard, ignore_eos)
        t0 = time.perf_counter()
        samples = load_audio(audio, sample_rate)
        load_ms = (time.perf_counter() - t0) * 1e3
        spans = split_points(samples, opts.segment_seconds)
        before, after = self.prompt_ids(opts)
        timings = {"load_ms": load_ms, "frontend_ms": 0.0, "encode_ms": 0.0, "prefill_ms": 0.0, "decode_ms": 0.0}
        n_tokens = 0
        segments: list[Segment] = []
        bar = None
        if progress and len(spans) > 1:
            from tqdm import tqdm

            bar = tqdm(total=len(spans), unit="seg", desc="transcribing", leave=False)
        with self._lock:
            prefix = self.model.embed(before)
            suffix = self.model.embed(after)
            for start, end in spans:
                seg = self._segment(samples[start:end], prefix, suffix, opts, timings)
                seg.start, seg.end = start / SAMPLE_RATE, end / SAMPLE_RATE
                n_tokens += len(seg.tokens)
                segments.append(seg)
                if bar:
                    bar.update(1)
        if bar:
            bar.close()
        for s in segments:
            if s.truncated:
                warnings.warn(f"segment {s.start:.2f}-{s.end:.2f} s hit max_new_tokens={opts.max_new_tokens}; "
                              "its text may be cut (raise max_new_tokens)", stacklevel=2)
            if s.repetition:
                warnings.warn(f"segment {s.start:.2f}-{s.end:.2f} s was stopped by the repetition guard", stacklevel=2)
        duration = len(samples) / SAMPLE_RATE
        total_ms = (time.perf_counter() - t0) * 1e3
        timings["total_ms"] = total_ms
        timings["tokens"] = n_tokens
        timings["tokens_per_s"] = n_tokens / (timings["decode_ms"] / 1e3) if timings["decode_ms"] > 0 else 0.0
        timings["real_time_factor"] = total_ms / 1e3 / duration if duration > 0 else 0.0
        options = {"language": opts.language, "itn": opts.itn, "hotwords": list(opts.hotwords),
                   "max_new_tokens": opts.max_new_tokens, "segment_seconds": opts.segment_seconds,
                   "repetition_guard": opts.repetition_guard}
        return Transcription(self._join(segments, opts.language), segments, opts.language, duration,
                             {k: round(v, 3) if isinstance(v, float) else v for k, v in timings.items()}, options)

    def _segment(self, samples: np.ndarray, prefix: np.ndarray, suffix: np.ndarray, opts: TranscribeOptions,
                 timings: dict[str, float]) -> Segment:
        t0 = time.perf_counter()
        feats = features(samples, self.frontend)
        timings["frontend_ms"] += (time.perf_counter() - t0) * 1e3
        if feats.shape[0] == 0:  # shorter than one 25 ms frame: nothing to hear
            return Segment(0.0, 0.0, "", [], "empty", False, False)
        t0 = time.perf_counter()
        audio = self.model.encode(feats)[: fake_token_len(feats.shape[0], self.prompt.fake_token_halvings)]
        timings["encode_ms"] += (time.perf_counter() - t0) * 1e3
        emb = np.ascontiguousarray(np.concatenate([prefix, audio, suffix]))
        stop = [] if opts.ignore_eos else self.stop_ids
        tokens = self.model.generate(emb, opts.max_new_tokens, stop, repetition_guard=opts.repetition_guard)
        stats = self.model.last_generation()
        timings["prefill_ms"] += stats["prefill_ms"]
        timings["decode_ms"] += stats["decode_ms"]
        reason = stats["stop_reason"]
        text_tokens = [t for t in tokens if t not in self.stop_ids]
        return Segment(0.0, 0.0, self.tokenizer.decode(text_tokens).strip(), tokens, reason,
                       reason == "max_new_tokens", reason == "repetition")

    def _join(self, segments: list[Segment], language: str | None) -> str:
        sep_for = {code: e.get("join", " ") for code, e in self.spec["languages"].items()}
        text = ""
        for s in segments:
            if not s.text:
                continue
            if text:
                if language is not None:
                    sep = sep_for.get(language, " ")
                else:  # no language given: no space between CJK characters, a space otherwise
                    sep = "" if _is_cjk(text[-1]) and _is_cjk(s.text[0]) else " "
                text += sep
            text += s.text
        return text


def _is_cjk(ch: str) -> bool:
    o = ord(ch)
    return (0x3000 <= o <= 0x9FFF) or (0xF900 <= o <= 0xFAFF) or (0xFF00 <= o <= 0xFFEF) or (0xAC00 <= o <= 0xD7AF)


__all__ = ["Segment", "Session", "TranscribeOptions", "Transcription"]
