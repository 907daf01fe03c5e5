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
from fun_asr.audio import SAMPLE_RATE, AudioError, AudioInput, load_audio
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
        return self._run([audio], sample_rate, opts, batch_size=1, progress=progress)[0]

    def transcribe_batch(self, audios: list[AudioInput], *, sample_rate: int | None = None,
                         language: str | None = None, itn: bool = True, hotwords: list[str] | str | None = None,
                         max_new_tokens: int = 512, segment_seconds: float = 30.0, repetition_guard: bool = True,
                         batch_size: int = 8, progress: bool = False,
                         ignore_eos: bool = False) -> list[Transcription]:
        """Transcribes several recordings with the same options, decoding up to ``batch_size``
        segments at once (one KV cache slot each: every decoding step reads the weights once for the
        whole batch). Results are in input order and token for token equal to ``transcribe``.
        The timings of each result hold its share of the batch's prefill and decode time."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        opts = self._options(language, itn, hotwords, max_new_tokens, segment_seconds, repetition_guard, ignore_eos)
        return self._run(list(audios), sample_rate, opts, batch_size=batch_size, progress=progress)

    def _run(self, audios: list[AudioInput], sample_rate: int | None, opts: TranscribeOptions, batch_size: int,
             progress: bool) -> list[Transcription]:
        t_start = time.perf_counter()
        before, after = self.prompt_ids(opts)
        items: list[tuple[np.ndarray, list[Segment], dict[str, float]]] = []
        jobs: list[tuple[int, int, np.ndarray]] = []  # (audio index, segment index, decoder input)
        with self._lock:
            prefix = self.model.embed(before)
            suffix = self.model.embed(after)
            for ai, audio in enumerate(audios):
                timings = {"load_ms": 0.0, "frontend_ms": 0.0, "encode_ms": 0.0, "prefill_ms": 0.0, "decode_ms": 0.0}
                t0 = time.perf_counter()
                try:
                    samples = load_audio(audio, sample_rate)
                except AudioError as exc:
                    raise AudioError(f"input {ai}: {exc}" if len(audios) > 1 else str(exc)) from None
                timings["load_ms"] = (time.perf_counter() - t0) * 1e3
                segments = []
                for si, (start, end) in enumerate(split_points(samples, opts.segment_seconds)):
                    t0 = time.perf_counter()
                    feats = features(samples[start:end], self.frontend)
                    timings["frontend_ms"] += (time.perf_counter() - t0) * 1e3
                    segments.append(Segment(start / SAMPLE_RATE, end / SAMPLE_RATE, "", [], "empty", False, False))
                    if feats.shape[0] == 0:  # shorter than one 25 ms frame: nothing to hear
                        continue
                    t0 = time.perf_counter()
                    rows = self.model.encode(feats)[: fake_token_len(feats.shape[0], self.prompt.fake_token_halvings)]
                    timings["encode_ms"] += (time.perf_counter() - t0) * 1e3
                    jobs.append((ai, si, np.ascontiguousarray(np.concatenate([prefix, rows, suffix]))))
                items.append((samples, segments, timings))
            self._decode(jobs, items, opts, batch_size, progress)

        options = {"language": opts.language, "itn": opts.itn, "hotwords": list(opts.hotwords),
                   "max_new_tokens": opts.max_new_tokens, "segment_seconds": opts.segment_seconds,
                   "repetition_guard": opts.repetition_guard}
        total_ms = (time.perf_counter() - t_start) * 1e3
        out = []
        for samples, segments, timings in items:
            for s in segments:
                if s.truncated:
                    warnings.warn(f"segment {s.start:.2f}-{s.end:.2f} s hit max_new_tokens={opts.max_new_tokens}; "
                                  "its text may be cut (raise max_new_tokens)", stacklevel=3)
                if s.repetition:
                    warnings.warn(f"segment {s.start:.2f}-{s.end:.2f} s was stopped by the repetition guard",
                                  stacklevel=3)
            duration = len(samples) / SAMPLE_RATE
            n_tokens = sum(len(s.tokens) for s in segments)
            timings["total_ms"] = total_ms if len(items) == 1 else sum(timings.values())
            timings["tokens"] = n_tokens
            timings["tokens_per_s"] = n_tokens / (timings["decode_ms"] / 1e3) if timings["decode_ms"] > 0 else 0.0
            timings["real_time_factor"] = timings["total_ms"] / 1e3 / duration if duration > 0 else 0.0
            out.append(Transcription(self._join(segments, opts.language), segments, opts.language, duration,
                                     {k: round(v, 3) if isinstance(v, float) else v for k, v in timings.items()},
                                     dict(options)))
        return out

    def _decode(self, jobs: list[tuple[int, int, np.ndarray]],
                items: list[tuple[np.ndarray, list[Segment], dict[str, float]]], opts: TranscribeOptions,
                batch_size: int, progress: bool) -> None:
        """Greedy decoding of every segment, `batch_size` at a time; fills the Segments in place."""
        stop = [] if opts.ignore_eos else self.stop_ids
        bar = None
        if progress and len(jobs) > 1:
            from tqdm import tqdm

            bar = tqdm(total=len(jobs), unit="seg", desc="transcribing", leave=False)
        for k in range(0, len(jobs), batch_size):
            chunk = jobs[k : k + batch_size]
            results = self.model.generate_batch([j[2] for j in chunk], opts.max_new_tokens, stop,
                                                repetition_guard=opts.repetition_guard)
            stats = self.model.last_generation()
            for (ai, si, _), (tokens, reason) in zip(chunk, results, strict=True):
                seg = items[ai][1][si]
                seg.tokens, seg.stop_reason = tokens, reason
                seg.text = self.tokenizer.decode([t for t in tokens if t not in self.stop_ids]).strip()
                seg.truncated, seg.repetition = reason == "max_new_tokens", reason == "repetition"
                items[ai][2]["prefill_ms"] += stats["prefill_ms"] / len(chunk)
                items[ai][2]["decode_ms"] += stats["decode_ms"] / len(chunk)
            if bar:
                bar.update(len(chunk))
        if bar:
            bar.close()

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
