"""fun_asr.Session: audio in, text out, with FunASR's exact preprocessing, prompt and decoding."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np

from fun_asr import _core
from fun_asr.asr.assemble import assemble
from fun_asr.asr.cutting import _Cutter, _Item, _source_name
from fun_asr.asr.interrupts import RunningCalls
from fun_asr.asr.language import guess_language, language_notice, language_prompt_name, normalize_language
from fun_asr.asr.options import TranscribeOptions, check_hotwords, check_lengths, check_vad_options
from fun_asr.asr.progress import _bar, _NoBar
from fun_asr.asr.prompt import PromptSpec, prompt_runs
from fun_asr.asr.results import Segment, Transcription
from fun_asr.asr.speakers import split_at_speakers
from fun_asr.asr.tokenizer import TextTokenizer
from fun_asr.audio.decode import SAMPLE_RATE, AudioError, AudioInput, AudioReader, Limits, check_audio_input
from fun_asr.audio.frontend import FrontendConfig, fake_token_len, features, lfr
from fun_asr.converter.hub import DEFAULT_REPO, DEMO, resolve_model
from fun_asr.model.demo import WORDS as _DEMO_WORDS
from fun_asr.model.native import load_model, model_metadata
from fun_asr.notices import (
    Notice,
)
from fun_asr.speakers.diarize import RecordingSpeakers, SpeakerOptions
from fun_asr.vad.frontend import num_fbank_frames
from fun_asr.vad.native import FsmnVad

log = logging.getLogger("fun_asr")
# _run decodes the segments encoded so far once their adaptor rows (and the features kept for word
# timestamps) pass this many bytes: a recording of any length holds a bounded amount (the real model's
# rows are ~8.5 kB per second of speech: one wave per ~2 hours of continuous speech)
_WAVE_BYTES = 64 << 20


def _default_package(device: str) -> str:
    if device.startswith(("cuda", "gpu")):
        return "f16"
    if device == "auto" and any(d["type"] in ("gpu", "igpu") for d in _core.system_info()["devices"]):
        return "f16"
    return "q8_0"


def _check_draft(draft: Any, what: str, vocab: int) -> list[int]:
    """A draft as a list of token ids, each in [0, vocab) (checked before anything is decoded)."""
    if isinstance(draft, str | bytes) or not hasattr(draft, "__iter__"):
        raise TypeError(f"{what} must be a list of token ids (ints), got {type(draft).__name__}")
    ids = list(draft)
    if not all(isinstance(t, int | np.integer) and not isinstance(t, bool) for t in ids):
        raise TypeError(f"{what} must be a list of token ids (ints)")
    bad = [int(t) for t in ids if not 0 <= t < vocab]
    if bad:
        raise ValueError(f"{what}: token id {bad[0]} is outside the vocabulary [0, {vocab})")
    return [int(t) for t in ids]



VAD_ENV = "FUN_ASR_VAD_MODEL"  # a user default VAD (a .gguf, a FunASR fsmn-vad folder, or a hub repo id)
NO_VAD_MESSAGE = (
    "{model}: no FSMN-VAD in this model and none given, so long audio is cut at pauses and silence or noise can "
    "come out as made-up words; embed one (fun-asr-convert SRC --vad-model DIR|GGUF), give --vad-model "
    f"(vad_model=), or set {VAD_ENV}; --vad none (vad=None) turns this notice off"
)


class Session:
    """A loaded model ready to transcribe.

    ``model``: a GGUF file, an HF checkpoint folder, or a hub repo id (default
    ``FunAudioLLM/Fun-ASR-Nano-2512-hf`` at the pinned revision: downloaded and converted once,
    Q8_0 on CPU and F16 on CUDA unless ``package_type`` says otherwise).
    ``device``: ``auto``, ``cpu``, ``cuda``, ``cuda:N``. ``threads``: CPU threads, 0 = auto (up to all cores;
    fewer when timed decode steps say that is faster, e.g. beside a busy process).

    ``vad``: FunASR's FSMN-VAD in front of the recognizer (only speech is transcribed, each segment
    timed by the VAD, as FunASR's own pipeline). ``"auto"`` (default) takes the first of: ``vad_model``
    (a GGUF from ``fun-asr-convert``, a FunASR ``fsmn-vad`` folder, or a hub repo id); the VAD embedded
    in the model package (``fun-asr-convert --vad-model``; the hub model's conversion embeds FunASR's
    ``fsmn-vad``); ``$FUN_ASR_VAD_MODEL``; for a hub ``model``, the hub's VAD; one already in fun-asr's
    or the hub's cache. ``"fsmn"`` requires one (downloading ``funasr/fsmn-vad`` as a last resort).
    Without a VAD, long audio is cut at its quietest points (``Transcription.segmentation`` says which):
    with ``"auto"`` that is logged once and every result carries the ``no_vad`` warning; ``None`` turns
    the VAD and that notice off. ``vad_source`` says where the VAD came from.

    ``speaker_model``: FunASR's CAM++ for ``transcribe(..., diarize=True)`` (a GGUF from ``fun-asr-convert``, a
    FunASR/ModelScope CAM++ folder, a hub repo id, or a loaded :class:`fun_asr.speakers.SpeakerModel`). ``"auto"``
    (default) takes, when speakers are first asked for: the CAM++ embedded in the model package
    (``fun-asr-convert --speaker-model``); ``$FUN_ASR_SPEAKER_MODEL``; for a hub ``model``, the hub's CAM++
    (downloaded once); one already in fun-asr's cache. None: no speakers (``diarize=True`` then raises).
    ``speaker_source`` says where it came from.
    With a CTC head (FunASR/ModelScope checkpoints), a segment decoded alone takes the head's greedy transcript
    as the draft of lossless speculative decoding: the same tokens, fewer decoder passes (``ctc_drafts``, True
    then; set it False to skip the head's cost where its transcript rarely matches).
    One Session can be used from several threads; transcriptions run one at a time.
    """

    def __init__(self, model: str | os.PathLike[str] = DEFAULT_REPO, device: str = "auto", threads: int = 0, *,
                 package_type: str | None = None, revision: str | None = None, progress: bool = True,
                 vad: str | None = "auto", vad_model: str | os.PathLike[str] | None = None,
                 limits: Limits | None = None, speaker_model: Any = "auto") -> None:
        if vad not in ("auto", "fsmn", None, "none"):
            raise ValueError(f"vad must be 'auto', 'fsmn' or None, got {vad!r}")
        if not isinstance(device, str):
            raise TypeError(f"device must be a string (auto, cpu, cuda, cuda:N), got {type(device).__name__}")
        _core.check_device(device)  # before anything is downloaded or converted for it
        from_hub = not Path(model).expanduser().exists() and str(model) != DEMO  # the demo is local, VAD embedded
        self._model_arg = model
        if str(model) == DEMO and not Path(model).exists():
            log.warning("the 20-word demo model (-m demo): it knows only %s; for real speech use the default "
                        "model or a converted checkpoint", ", ".join(_DEMO_WORDS))
        path = resolve_model(model, package_type or _default_package(device), revision, progress)
        self.path = path
        self.model = load_model(path, device=device, threads=threads)
        self.threads = threads
        meta = model_metadata(path)
        missing = [k for k in ("tokenizer.huggingface.json", "fun_asr_nano.prompt", "fun_asr_nano.model_spec")
                   if k not in meta]
        if missing:
            raise ValueError(f"{path}: model has no {', '.join(missing)}; re-convert it with fun-asr-convert")
        self.tokenizer = TextTokenizer(meta["tokenizer.huggingface.json"])
        self.prompt = PromptSpec.from_dict(json.loads(meta["fun_asr_nano.prompt"]))
        self.spec = json.loads(meta["fun_asr_nano.model_spec"])
        from fun_asr.model.funasr_checkpoint import languages_for

        # Fun-ASR-Nano or Fun-ASR-MLT-Nano (31 languages): the checkpoint says which table applies
        self.language_table = str(meta.get("fun_asr_nano.language_table") or "nano")
        self.spec["languages"] = languages_for(self.spec, self.language_table)
        self.frontend = FrontendConfig.from_spec(self.spec)
        info = self.model.info()
        self.stop_ids: list[int] = list(info["decoder"]["eos_token_ids"])
        self.max_segment_seconds = info["encoder"]["max_frames"] * self.frontend.seconds_per_lfr_frame
        self.context_length = int(info["decoder"]["max_positions"])
        self.vocab_size = int(info["decoder"]["vocab"])
        self.limits = limits or Limits()
        self._lock = threading.Lock()
        self._calls = RunningCalls(self.model.interrupt, self.model.clear_interrupt)  # for interrupt()
        self.prefix_cache = True  # reuse the prompt prefix's K/V across segments (token for token the same)
        self._prefix_ids: tuple[int, ...] = ()
        from fun_asr.asr.ctc import CtcAligner

        self.aligner = CtcAligner.from_model(self.model, meta)  # None: no CTC head, no word timestamps
        self.ctc_reason = None if self.aligner else str(self.model.info()["ctc"].get("reason") or "no CTC head")
        # A segment decoded alone takes its CTC greedy transcript (re-tokenized) as the draft of lossless
        # speculative decoding: the same tokens as without it, fewer decoder passes where the two agree. The CTC
        # head runs on the kept encoder output only when the segment is decoded alone. False: never.
        self.ctc_drafts = self.aligner is not None
        if self.aligner is not None:  # its transcript has no punctuation: greedy's commas must not misalign it
            self.model.draft_skip = self.tokenizer.punctuation_ids(self.vocab_size)  # ~0.2 s, once
        self._told_no_ctc = False
        self._told_languages: set[str] = set()  # languages the spec lacks, logged once each
        self.vad: FsmnVad | None = None
        self.vad_source: str | None = None  # where the VAD came from: "embedded", a path, a repo id, ...
        if vad not in (None, "none"):
            self.vad, self.vad_source = self._load_vad(vad, vad_model, from_hub, progress, meta)
        # "auto" found no VAD: every result says so (warning code no_vad), and it is logged once here
        self.vad_missing = vad == "auto" and self.vad is None
        if self.vad_missing:
            log.warning("%s", NO_VAD_MESSAGE.format(model=path))
        self._speaker_arg = speaker_model
        self._from_hub = from_hub
        self._progress = progress
        self._speaker_model: Any = None
        self.speaker_source: str | None = None
        if speaker_model is not None and speaker_model != "auto":
            self.speaker_model  # noqa: B018 - given: loaded now, so that a bad one fails here

    @property
    def speaker_model(self) -> Any:
        """The CAM++ speaker model (:class:`fun_asr.speakers.SpeakerModel`), loaded on first use; ValueError
        naming the ways to give one when there is none."""
        if self._speaker_model is None:
            from fun_asr.asr.speakers import find_speaker_model

            self._speaker_model, self.speaker_source = find_speaker_model(
                self._speaker_arg, self.path, self._model_arg, self._from_hub, self._progress)
        return self._speaker_model

    def embed_speakers(self, windows: list[np.ndarray]) -> np.ndarray:
        """CAM++ embeddings ``[N, D]`` of 16 kHz windows (the speaker model, under the Session's lock)."""
        model = self.speaker_model
        with self._lock:
            return model.embed(windows, threads=self._speaker_threads())

    def embed_speaker_features(self, features: list[np.ndarray]) -> np.ndarray:
        """CAM++ embeddings ``[N, D]`` of CAM++ feature windows (under the Session's lock)."""
        model = self.speaker_model
        with self._lock:
            return model.embed_features(features, threads=self._speaker_threads())

    def _speaker_threads(self) -> int:
        """The Session's threads; for threads=0 the count the ASR model's timed decode steps chose now."""
        return self.threads or int(self.model.thread_choice()["threads"])

    def _speaker_windows(self) -> RecordingSpeakers:
        return RecordingSpeakers(self.embed_speaker_features, self.speaker_model.frontend)

    def _load_vad(self, mode: str, vad_model: str | os.PathLike[str] | None, from_hub: bool,
                  progress: bool, meta: dict[str, Any]) -> tuple[FsmnVad | None, str | None]:
        """The VAD to run, and where it came from. In order: ``vad_model``; the VAD embedded in the package;
        ``$FUN_ASR_VAD_MODEL``; for a hub model, the hub's VAD (downloaded); else one already in fun-asr's or
        the hub's cache (``mode="fsmn"`` downloads ``funasr/fsmn-vad`` instead). A VAD that was asked for
        (``vad_model``, the variable, ``"fsmn"``) and cannot be loaded raises; ``"auto"`` otherwise goes on."""
        from fun_asr.asr.components import find_component
        from fun_asr.converter.hub import MODELSCOPE, MODELSCOPE_VAD_REPO, VAD

        def embedded() -> FsmnVad | None:
            return FsmnVad.load(self.path, threads=1) \
                if "fsmn_vad.block_count" in meta and self.path.is_file() else None

        def missing(exc: Exception | None) -> tuple[None, None]:
            if exc is not None:
                if mode == "fsmn":
                    raise exc
                log.warning("FSMN-VAD unavailable (%s); long audio is cut at pauses instead", exc)
            return None, None

        hub_vad = MODELSCOPE + MODELSCOPE_VAD_REPO if from_hub and str(self._model_arg).startswith(MODELSCOPE) \
            else None  # a ModelScope model brings ModelScope's VAD
        return find_component(VAD, vad_model, embedded=embedded, env=VAD_ENV, hub_repo=hub_vad,
                              download=mode == "fsmn" or from_hub, progress=progress,
                              load=lambda path: FsmnVad.load(path, threads=1), missing=missing)

    def __repr__(self) -> str:
        return f"Session({str(self.path)!r}, backend={self.model.info()['backend']}, vad={self.vad_source!r})"

    # -- options -------------------------------------------------------------------------------

    def normalize_language(self, language: str | None) -> str | None:
        """zh/en/ja, their English names or 中文/英文/日文 -> the code; None -> None; any other name is kept as
        written and reaches the prompt as FunASR passes it (:func:`fun_asr.asr.language.normalize_language`)."""
        return normalize_language(self.spec, language)

    def options(self, language: str | None = None, itn: bool = True, hotwords: list[str] | str | None = None,
                max_new_tokens: int = 512, segment_seconds: float = 30.0, repetition_guard: bool = True,
                ignore_eos: bool = False, vad: bool | None = None,
                word_timestamps: bool = False, *, silence_schedule: Any = None, dynamic_silence: bool | None = None,
                max_end_silence_time: int | None = None, diarize: bool = False, num_speakers: int | None = None,
                min_speakers: int | None = None, max_speakers: int | None = None) -> TranscribeOptions:
        """Checks transcription options once (ValueError/TypeError naming the option) and returns them.
        ``diarize``: speaker labels (loads the speaker model now, so that a missing one fails before any audio is
        read); ``num_speakers``, ``min_speakers``, ``max_speakers`` need it.
        ``silence_schedule``, ``dynamic_silence``, ``max_end_silence_time``: FunASR 1.4.16's per-call FSMN-VAD
        kwargs (:class:`fun_asr.asr.options.VadOptions`); they need the VAD to run."""
        words = check_hotwords(hotwords, self.limits)
        check_lengths(max_new_tokens, segment_seconds, self.max_segment_seconds, self.limits)
        if vad and self.vad is None:
            raise ValueError("vad=True but this Session has no VAD model (Session(vad='fsmn', vad_model=...))")
        use_vad = self.vad is not None if vad is None else bool(vad)
        vad_opts = check_vad_options(silence_schedule, dynamic_silence, max_end_silence_time)
        if vad_opts.given and not use_vad:
            named = ", ".join(vad_opts.to_dict())
            why = "vad=False" if vad is False else "this Session has no VAD model (Session(vad='fsmn', vad_model=...))"
            raise ValueError(f"{named}: FSMN-VAD options, but the VAD does not run here ({why}); the audio would be "
                             "cut at pauses, so they would have no effect")
        speakers = SpeakerOptions.check(num_speakers, min_speakers, max_speakers)
        if diarize is True and use_vad and not vad_opts.given:
            # speaker turns need segments that end at turn gaps: FunASR's dynamic end-silence schedule waits for
            # up to 2 s of silence (a conversation becomes 30 s segments); its static mode (the VAD config's
            # max_end_silence_time, 800 ms) ends them there. Any VAD option given is used as given instead.
            vad_opts = check_vad_options(None, False, None)
        if not isinstance(diarize, bool):
            raise TypeError(f"diarize must be True or False, got {diarize!r}")
        if speakers.to_dict() and not diarize:
            raise ValueError(f"{', '.join(speakers.to_dict())}: speaker options, but diarize is False (pass "
                             "diarize=True / --diarize)")
        if diarize:
            self.speaker_model  # noqa: B018 - loads it, or raises naming how to give one
        opts = TranscribeOptions(self.normalize_language(language), bool(itn), words, max_new_tokens,
                                 float(segment_seconds), bool(repetition_guard), bool(ignore_eos), use_vad,
                                 bool(word_timestamps), no_vad=vad is None and self.vad_missing,
                                 vad_options=vad_opts, diarize=diarize, speakers=speakers)
        # The longest decoder input + max_new_tokens must fit the decoder's context: checked here, once,
        # so that a long hotword list fails with a clear message instead of deep inside decoding.
        before, after = self.prompt_ids(opts)
        longest_vad = (self.vad.cfg.segment_limit_ms / 1000 + 0.02) if use_vad and self.vad is not None else 0.0
        seconds = max(float(segment_seconds), longest_vad)
        rows = fake_token_len(int(np.ceil(seconds / self.frontend.seconds_per_lfr_frame)),
                              self.prompt.fake_token_halvings)
        need = len(before) + rows + len(after) + max_new_tokens
        if need > self.context_length:
            raise ValueError(f"the prompt ({len(before) + len(after)} tokens with {len(words)} hotwords) + "
                             f"{rows} audio rows for {seconds:g} s segments + max_new_tokens {max_new_tokens} = "
                             f"{need} positions, over the decoder's context of {self.context_length}: use fewer "
                             "hotwords, shorter segments or a smaller max_new_tokens")
        return opts

    _options = options  # older name

    # -- transcription -------------------------------------------------------------------------

    def prompt_ids(self, opts: TranscribeOptions) -> tuple[list[int], list[int]]:
        lang_name = language_prompt_name(self.spec, opts.language)  # a name the model lacks: as written (FunASR)
        before, after = prompt_runs(self.prompt, lang_name, opts.itn, list(opts.hotwords))
        return self.tokenizer.encode_runs(before), self.tokenizer.encode_runs(after)

    def transcribe(self, audio: AudioInput, *, sample_rate: int | None = None, language: str | None = None,
                   itn: bool = True, hotwords: list[str] | str | None = None, max_new_tokens: int = 512,
                   segment_seconds: float = 30.0, repetition_guard: bool = True,
                   progress: bool = False, ignore_eos: bool = False, batch_size: int = 8,
                   vad: bool | None = None, word_timestamps: bool = False, silence_schedule: Any = None,
                   dynamic_silence: bool | None = None, max_end_silence_time: int | None = None,
                   diarize: bool = False, num_speakers: int | None = None, min_speakers: int | None = None,
                   max_speakers: int | None = None, draft: list[int] | None = None) -> Transcription:
        """Transcribes one recording (path, bytes, binary file object, or array with ``sample_rate``).

        Its segments are decoded up to ``batch_size`` at a time (token for token the same as one by
        one). ``vad``: False cuts at pauses even when the Session has a VAD (None: the Session's
        choice). ``word_timestamps``: per-token start/end from the checkpoint's CTC head by FunASR's
        forced alignment (the ModelScope checkpoint has it; the Hugging Face one does not: then segment
        times only, said once). Raises on audio that cannot be read. ``ignore_eos`` is for benchmarks
        only: decode exactly ``max_new_tokens`` per segment.

        FunASR 1.4.16's per-call VAD kwargs (``AutoModel.generate(..., silence_schedule=...)``): ``silence_schedule``
        (the dynamic end-silence table, ``[(accumulated_speech_ms, silence_ms), ...]``, or a string
        ``"10000:2000,inf:100"``; default ``fun_asr.vad.DEFAULT_SILENCE_SCHEDULE``), ``dynamic_silence`` (the
        schedule on/off; default on unless ``max_end_silence_time`` is given) and ``max_end_silence_time``
        (a fixed end silence, ms). See :class:`fun_asr.asr.options.VadOptions`.

        ``diarize=True``: who spoke when, FunASR's way (``spk_model="cam++"``): every segment gets
        ``Segment.speaker`` (0, 1, ... in order of first appearance) and ``Transcription.speakers`` the speaker
        timeline. ``num_speakers``: exactly that many (FunASR's ``preset_spk_num``); else the count is found in
        ``min_speakers``..``max_speakers`` (default 1..15). Needs the Session's speaker model (``speaker_model``).

        ``draft``: token ids the transcript probably contains (a stream's previous partial of the same speech):
        lossless speculative decoding - the decoder verifies several of them per pass and keeps only what its
        own greedy choice gives, so the tokens are exactly those without a draft (a wrong draft costs one
        pass). Used where a segment is decoded alone; the result's timings then count ``decode_passes``,
        ``draft_proposed`` and ``draft_accepted``.
        """
        check_audio_input(audio)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        opts = self.options(language, itn, hotwords, max_new_tokens, segment_seconds, repetition_guard, ignore_eos,
                            vad, word_timestamps, silence_schedule=silence_schedule, dynamic_silence=dynamic_silence,
                            max_end_silence_time=max_end_silence_time, diarize=diarize, num_speakers=num_speakers,
                            min_speakers=min_speakers, max_speakers=max_speakers)
        drafts = None if draft is None else [_check_draft(draft, "draft", self.vocab_size)]
        return self._run([audio], sample_rate, opts, batch_size=batch_size, progress=progress, raise_errors=True,
                         drafts=drafts)[0]

    def transcribe_batch(self, audios: list[AudioInput], *, sample_rate: int | None = None,
                         language: str | None = None, itn: bool = True, hotwords: list[str] | str | None = None,
                         max_new_tokens: int = 512, segment_seconds: float = 30.0, repetition_guard: bool = True,
                         batch_size: int = 8, progress: bool = False, ignore_eos: bool = False,
                         names: list[str] | None = None, vad: bool | None = None,
                         word_timestamps: bool = False, silence_schedule: Any = None,
                         dynamic_silence: bool | None = None,
                         max_end_silence_time: int | None = None, warn: bool = True, diarize: bool = False,
                         num_speakers: int | None = None, min_speakers: int | None = None,
                         max_speakers: int | None = None,
                         drafts: list[list[int] | None] | None = None) -> list[Transcription]:
        """Transcribes several recordings with the same options, decoding up to ``batch_size``
        segments at once (one KV cache slot each: every decoding step reads the weights once for the
        whole batch). Results are in input order and token for token equal to ``transcribe``.

        A recording that cannot be read or transcribed does not fail the others: its result has
        ``error`` set (``ok`` is False, text empty, ``empty_reason`` "error") and a warning is issued.
        ``names`` labels the recordings in messages and ``Transcription.source`` (default: the file
        path, or ``input N <array>``). The timings of each result hold its share of the batch's prefill
        and decode time. ``silence_schedule``, ``dynamic_silence``, ``max_end_silence_time``: FunASR's VAD
        kwargs, and ``diarize``, ``num_speakers``, ``min_speakers``, ``max_speakers`` (each recording's speakers
        on its own), and ``drafts`` (one token list or None per recording: see ``draft`` there), as in
        :meth:`transcribe`. ``warn=False``: the notices are only in each result's ``warnings``,
        no Python warnings are issued (a server that reports them itself; warning filters are process-wide)."""
        one = str | bytes | bytearray | memoryview | os.PathLike | np.ndarray
        if isinstance(audios, one) or hasattr(audios, "read"):
            raise TypeError(f"transcribe_batch takes a list of recordings, got one {type(audios).__name__}; "
                            "wrap it in a list or call transcribe()")
        if not isinstance(audios, list | tuple):
            raise TypeError(f"transcribe_batch takes a list of recordings, got {type(audios).__name__}")
        for i, a in enumerate(audios):
            check_audio_input(a, f"audios[{i}]")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if names is not None and (len(names) != len(audios) or not all(isinstance(n, str) for n in names)):
            raise ValueError(f"names must be {len(audios)} strings, one per recording")
        if drafts is not None:
            if not isinstance(drafts, list | tuple) or len(drafts) != len(audios):
                raise ValueError(f"drafts must be a list of {len(audios)} token lists (or None), one per recording")
            drafts = [None if d is None else _check_draft(d, f"drafts[{i}]", self.vocab_size)
                      for i, d in enumerate(drafts)]
        opts = self.options(language, itn, hotwords, max_new_tokens, segment_seconds, repetition_guard, ignore_eos,
                            vad, word_timestamps, silence_schedule=silence_schedule, dynamic_silence=dynamic_silence,
                            max_end_silence_time=max_end_silence_time, diarize=diarize, num_speakers=num_speakers,
                            min_speakers=min_speakers, max_speakers=max_speakers)
        return self._run(list(audios), sample_rate, opts, batch_size=batch_size, progress=progress,
                         raise_errors=False, names=names, warn=warn, drafts=drafts)

    def stream(self, language: str | None = None, itn: bool = True, hotwords: list[str] | str | None = None, *,
               max_new_tokens: int | None = None, repetition_guard: bool = True, stream_options: Any = None,
               decoder: Any = None, mode: str = "vad", chunk_ms: int | None = None,
               rollback_chars: int | None = None) -> Any:
        """A live stream: ``feed(pcm, sample_rate=16000)`` any chunk of float32 or int16 audio (or int16
        bytes) and get events; ``close()`` flushes.

        ``mode="vad"`` (default, :class:`fun_asr.asr.stream.Stream`): FunASR 1.4.16's realtime-server
        semantics, ``partial`` and ``sentence`` events; needs the VAD. ``stream_options``: a
        :class:`fun_asr.asr.stream.StreamOptions`; ``decoder``: a replacement decode function (the server
        shares one batched decoder between streams). ``max_new_tokens`` default 512.

        ``mode="chunked"`` (:class:`fun_asr.asr.chunked.ChunkedStream`): Fun-ASR-Nano's streaming SDK
        (``FunASRNanoStreamingVLLM``): every ``chunk_ms`` (720) of audio the whole audio so far is encoded
        again and decoded with the fixed text as the answer's start (``prev_text``); all but the last
        ``rollback_chars`` (8) characters become fixed and are never rewritten. No VAD needed.
        ``max_new_tokens`` default 200 per chunk; ``stream_options``: a
        :class:`fun_asr.asr.chunked.ChunkedOptions` (window, prev_text, ...)."""
        if mode not in ("vad", "chunked"):
            raise ValueError(f"mode must be 'vad' (FunASR's realtime server: VAD sentences and partials) or "
                             f"'chunked' (Fun-ASR-Nano's streaming SDK: fixed and unfixed text), got {mode!r}")
        if mode == "chunked":
            from fun_asr.asr.chunked import ChunkedOptions, ChunkedStream

            if decoder is not None:
                raise ValueError("mode='chunked' decodes with the fixed text forced as the answer's start; a "
                                 "replacement decoder= is for mode='vad' only")
            if stream_options is not None and not isinstance(stream_options, ChunkedOptions):
                raise TypeError(f"mode='chunked' takes stream_options=ChunkedOptions(...), got "
                                f"{type(stream_options).__name__}")
            copts = stream_options or ChunkedOptions()
            given = {k: v for k, v in (("chunk_ms", chunk_ms), ("rollback_chars", rollback_chars),
                                       ("max_new_tokens", max_new_tokens)) if v is not None}
            copts = copts.replace(**given)
            if copts.window_seconds > self.max_segment_seconds:
                raise ValueError(f"window_seconds ({copts.window_seconds:g}) is longer than the encoder's window "
                                 f"({self.max_segment_seconds:.2f} s)")
            opts = self.options(language, itn, hotwords, copts.max_new_tokens, copts.window_seconds,
                                repetition_guard, vad=False)
            return ChunkedStream(self, opts, copts)
        if chunk_ms is not None or rollback_chars is not None:
            raise ValueError("chunk_ms and rollback_chars are options of mode='chunked' (Fun-ASR-Nano's streaming "
                             "SDK); mode='vad' takes stream_options=StreamOptions(...)")
        from fun_asr.asr.stream import Stream, StreamOptions

        max_new_tokens = 512 if max_new_tokens is None else max_new_tokens
        opts = self.options(language, itn, hotwords, max_new_tokens, 30.0, repetition_guard)
        # a partial never needs more tokens than a closed sentence (FunASR: 200 and 512)
        sopts = stream_options or StreamOptions(max_new_tokens=max_new_tokens,
                                                partial_max_new_tokens=min(200, max_new_tokens))
        return Stream(self, opts, sopts, decoder)

    def _decode_audio(self, samples: np.ndarray, opts: TranscribeOptions, forced: list[int],
                      max_new_tokens: int, draft: list[int] | None = None) -> tuple[list[int], str, dict[str, float]]:
        """16 kHz samples as one segment (no VAD, no cutting): features -> encoder -> greedy decoding with the
        prompt of ``opts``, the answer forced to start with the token ids ``forced`` (FunASR's ``prev_text``).
        Returns the new tokens (stop ids removed), the stop reason and timings (``encode_ms``,
        ``decode_ms``; with a draft also ``decode_passes``, ``draft_proposed``, ``draft_accepted``). With
        ``forced`` empty the tokens are those ``transcribe(samples, vad=False)`` gives a recording of at most
        ``segment_seconds``. ``draft``: tokens the answer probably continues with (a stream's previous decode):
        lossless speculative decoding, the same tokens as without it (Model.generate_batch)."""
        with self.interruptible():
            return self._decode_one(samples, opts, forced, max_new_tokens, draft)

    def _decode_one(self, samples: np.ndarray, opts: TranscribeOptions, forced: list[int],
                    max_new_tokens: int, draft: list[int] | None) -> tuple[list[int], str, dict[str, float]]:
        t0 = time.perf_counter()
        feats = features(np.ascontiguousarray(samples, np.float32), self.frontend)
        if feats.shape[0] == 0:  # shorter than one 25 ms frame: nothing to hear
            return [], "empty", {"encode_ms": 0.0, "decode_ms": 0.0}
        before, after = self.prompt_ids(opts)
        stop = [] if opts.ignore_eos else self.stop_ids
        with self._lock:
            if not draft and self._ctc_drafting():  # no draft given: the segment's CTC greedy transcript
                out, enc = self.model.encode_keep_encoder(feats)
                draft = self._ctc_draft(enc)
                del enc
            else:
                out = self.model.encode(feats)
            rows = out[: fake_token_len(feats.shape[0], self.prompt.fake_token_halvings)]
            prefix = self.model.embed(before)
            parts = [prefix, rows, self.model.embed(after)]
            if forced:
                parts.append(self.model.embed(list(forced)))
            t1 = time.perf_counter()
            self._use_prefix(before, prefix)
            (tokens, reason), = self.model.generate_batch([np.ascontiguousarray(np.concatenate(parts))],
                                                          max_new_tokens, stop, repetition_guard=opts.repetition_guard,
                                                          draft=list(draft) if draft else None)
            gen = self.model.last_generation()
        t2 = time.perf_counter()
        timings = {"encode_ms": (t1 - t0) * 1e3, "decode_ms": (t2 - t1) * 1e3}
        for key in ("decode_passes", "draft_proposed", "draft_accepted"):
            timings[key] = float(gen[key])
        return [t for t in tokens if t not in self.stop_ids], reason, timings

    def interrupt(self) -> bool:
        """From another thread: stops the transcriptions running on this session (``transcribe``,
        ``transcribe_batch``, a stream's decodes) at the model's next graph node or decoding step; each of
        those calls raises :class:`fun_asr.Interrupted` and the session stays usable. Calls that start before
        the interrupted ones have ended stop too; once none runs, later calls run normally. Returns whether
        a transcription was running (with none, nothing happens: the next call is not affected). The VAD's and
        the speaker model's passes are not interrupted (they run between the model's, briefly)."""
        return self._calls.interrupt()

    def _run(self, audios: list[AudioInput], sample_rate: int | None, opts: TranscribeOptions, batch_size: int,
             progress: bool, raise_errors: bool, names: list[str] | None = None,
             warn: bool = True, drafts: list[list[int] | None] | None = None) -> list[Transcription]:
        """Each recording streams through read -> 16 kHz -> fbank -> VAD (or the pause splitter) -> the
        segment's features -> encoder, block by block, so that no recording is held whole (_stream); the
        segments' adaptor rows wait for decoding, all recordings' together (longest first), in waves when
        they grow past _WAVE_BYTES."""
        with self.interruptible():
            return self._run_all(audios, sample_rate, opts, batch_size, progress, raise_errors, names, warn, drafts)

    def interruptible(self) -> AbstractContextManager[None]:
        """A block that counts as one running transcription for :meth:`interrupt` (every transcription is one):
        an interrupt while it is open, also between the calls it makes, stops them (the calls raise
        :class:`fun_asr.Interrupted`) until it ends — for a caller that decides to run a transcription and
        must not lose an interrupt that comes before the call starts."""
        return self._calls.running()

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
                self._encode(item, a, b, opts, jobs, waiting)
                if opts.diarize:
                    if item.speakers is None:
                        item.speakers = self._speaker_windows()
                    item.speakers.add(a / SAMPLE_RATE, item.samples[a:b])
            finally:
                bar[0].update(1)

        def decode() -> None:
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

    def _encode(self, item: _Item, a: int, b: int, opts: TranscribeOptions,
                jobs: list[tuple[_Item, int, np.ndarray]], waiting: list[int]) -> None:
        """The features of samples [a, b) of the recording (its last segment) through the encoder: its
        adaptor rows join ``jobs`` (``waiting`` counts the bytes held for decoding)."""
        si = len(item.segments) - 1
        t0 = time.perf_counter()
        feats = self._features(item, a, b)
        item.timings["frontend_ms"] += (time.perf_counter() - t0) * 1e3
        if feats.shape[0] == 0:  # a tail shorter than one 25 ms frame has nothing to hear
            return
        t0 = time.perf_counter()
        # the encoder output stays for the CTC head: word timestamps, and the CTC draft in case the segment is
        # decoded alone (the head runs later, only if needed, without a second encoder pass)
        stamps = opts.word_timestamps and self.aligner is not None
        keep = stamps or (item.draft is None and self._ctc_drafting())
        with self._lock:
            if keep:
                out, item.enc_out[si] = self.model.encode_keep_encoder(feats)
                waiting[0] += item.enc_out[si].nbytes
            else:
                out = self.model.encode(feats)
        rows = out[: fake_token_len(feats.shape[0], self.prompt.fake_token_halvings)].copy()  # not a view of out
        item.timings["encode_ms"] += (time.perf_counter() - t0) * 1e3
        jobs.append((item, si, rows))
        waiting[0] += rows.nbytes

    def _ctc_drafting(self) -> bool:
        """Whether a segment without a draft of its own gets its CTC greedy transcript as one: a CTC head,
        ``ctc_drafts`` on, and the model taking drafts (``draft_max`` > 0, flash attention)."""
        return (self.ctc_drafts and self.aligner is not None and self.model.draft_max > 0
                and bool(self.model.flash_attn))

    def _ctc_draft(self, encoder_output: np.ndarray) -> list[int]:
        """The CTC head's greedy transcript of a segment (from its encoder output), as decoder token ids: the
        draft that the decoder verifies (never trusted: a wrong one costs a pass)."""
        from fun_asr.asr.ctc import draft_text

        assert self.aligner is not None
        try:
            labels = self.model.ctc_greedy(encoder_output)
        except (ValueError, RuntimeError, MemoryError) as exc:  # no draft is only slower: decode without one
            log.debug("no CTC draft: %s", exc)
            return []
        return self.tokenizer.encode_plain(draft_text(labels, self.aligner.blank_id, self.aligner.tokenizer))

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

    def _use_prefix(self, before: list[int], prefix: np.ndarray) -> None:
        """The system prompt + instruction's K/V, computed once and reused by every segment's prefill
        (under the lock: another transcription may have set its own since)."""
        if self.prefix_cache and tuple(before) != self._prefix_ids:
            self._prefix_ids = ()  # until set: an interrupted set_prefix leaves none
            self.model.set_prefix(prefix)
            self._prefix_ids = tuple(before)
        elif not self.prefix_cache and self._prefix_ids:
            self.model.clear_prefix()
            self._prefix_ids = ()

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

    def _align(self, items: list[_Item]) -> None:
        """Word (CTC token) timestamps of every decoded segment: FunASR 1.4.16's forced alignment of the
        LLM's text on the CTC head's posteriors (the head on each segment's encoder output, kept since it was
        encoded: no second encoder pass). Without a CTC head: segment times only, logged once per Session, and every
        result carries the ``word_timestamps_unavailable`` warning. A segment with text whose alignment
        fails (FunASR then has no times either) keeps ``words == []`` and gets ``word_timestamps_failed``;
        its subtitle is one segment-level cue."""
        if self.aligner is None:
            if not self._told_no_ctc:
                self._told_no_ctc = True
                log.warning("word timestamps unavailable: %s; segment-level times only", self.ctc_reason)
            return
        for item in items:
            t0 = time.perf_counter()
            for si, enc in item.enc_out.items():
                seg = item.segments[si]
                raw = self.tokenizer.decode([t for t in seg.tokens if t not in self.stop_ids])  # not stripped
                times = self.aligner.align_text(self.model.ctc_logprobs_encoded(enc), raw,
                                                offset_ms=int(round(seg.start * 1000)))
                seg.words = [{"word": t.text, "start": t.start, "end": t.end, "score": t.score} for t in times]
                if seg.text.strip() and not any(w["word"].strip() for w in seg.words):
                    item.warnings.append(Notice(
                        "word_timestamps_failed",
                        f"{item.source}: segment {seg.start:.2f}-{seg.end:.2f} s: the forced alignment of its text "
                        "on the CTC head failed, so it has segment-level times only (one subtitle cue)"))
            item.enc_out.clear()
            item.timings["align_ms"] = item.timings.get("align_ms", 0.0) + (time.perf_counter() - t0) * 1e3

    def _segment(self, item: _Item, opts: TranscribeOptions) -> None:
        """Cuts a recording held in memory (``item.samples``) into the segments the recognizer hears: the
        VAD's speech segments (FunASR's pipeline) or, without a VAD, spans of at most segment_seconds cut at
        the quietest points. The streaming cutter of _run given the whole recording at once (the same spans
        as block by block); everything is kept, so that _features can slice any span."""
        samples = np.asarray(item.samples, np.float32)
        cutter = _Cutter(self.frontend, self.vad, item, opts)
        spans = cutter.feed(samples) + cutter.finish()
        item.spans = spans
        item.segments = [Segment(a / SAMPLE_RATE, b / SAMPLE_RATE, "", [], "empty", False, False) for a, b in spans]
        if item.segmentation == "vad" and not spans:
            item.empty_reason = "no_speech"

    def _features(self, item: _Item, a: int, b: int) -> np.ndarray:
        """LFR features of samples [a, b): sliced from the recording's fbank when the segment starts on a
        frame boundary (identical to computing them on the slice: Kaldi frames are independent), else
        computed on the slice (FunASR cuts the audio at the segment and runs the frontend on it)."""
        shift = int(round(self.frontend.sample_rate * self.frontend.frame_shift_ms / 1000))
        if item.fbank is not None and a % shift == 0:
            k = a // shift
            count = num_fbank_frames(b - a)
            if k + count <= len(item.fbank):
                return lfr(item.fbank[k : k + count], self.frontend.lfr_m, self.frontend.lfr_n)
        return features(item.samples[a:b], self.frontend)

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

    def _decode(self, jobs: list[tuple[_Item, int, np.ndarray]], opts: TranscribeOptions, batch_size: int,
                progress: bool, raise_errors: bool, prefix: np.ndarray | None = None,
                suffix: np.ndarray | None = None) -> None:
        """Greedy decoding of every segment, `batch_size` at a time; fills the Segments in place.
        A chunk that fails is retried one segment at a time so that only the bad one fails.
        Segments are taken longest first (FunASR sorts VAD segments by length before batching them),
        so each batch holds similar lengths; results land in their own Segment, so order is kept.
        With ``prefix``/``suffix`` (the prompt's embeddings) the jobs hold only the audio rows, and each
        chunk's decoder inputs are put together when it is decoded."""
        stop = [] if opts.ignore_eos else self.stop_ids
        if batch_size > 1:
            jobs = sorted(jobs, key=lambda j: -j[2].shape[0])  # the prompt's length is the same for all
        bar = _bar(progress, None, "decoding", "tok")
        for k in range(0, len(jobs), batch_size):
            chunk = jobs[k : k + batch_size]
            done = [0]

            def on_step(produced: int, active: int, done: list[int] = done) -> None:
                bar.update(produced - done[0])
                done[0] = produced

            inputs = [j[2] if prefix is None else np.ascontiguousarray(np.concatenate([prefix, j[2], suffix]))
                      for j in chunk]
            # A segment decoded alone verifies its recording's draft, else its CTC greedy transcript (the model
            # takes drafts for one sequence: in a batch, the batch already shares each step's weight reads).
            lone = chunk[0][0].draft if len(chunk) == 1 else None
            ctc_ms = 0.0
            kept = chunk[0][0].enc_out.get(chunk[0][1]) if len(chunk) == 1 and lone is None else None
            if kept is not None and self._ctc_drafting():
                t0 = time.perf_counter()
                lone = self._ctc_draft(kept)  # the caller holds the lock
                ctc_ms = (time.perf_counter() - t0) * 1e3
            del kept
            if not opts.word_timestamps:  # nothing else needs the kept encoder outputs
                for j in chunk:
                    j[0].enc_out.pop(j[1], None)
            draft = [t for t in lone if t not in self.stop_ids] or None if lone else None
            try:
                results = self.model.generate_batch(inputs, opts.max_new_tokens, stop,
                                                    repetition_guard=opts.repetition_guard, on_step=on_step,
                                                    draft=draft)
            except (ValueError, RuntimeError, MemoryError):
                if raise_errors or len(chunk) == 1:
                    if len(chunk) == 1 and not raise_errors:
                        chunk[0][0].fail(sys.exc_info()[1])
                        continue
                    raise
                for job in chunk:  # find the bad one; the others decode as they would have
                    self._decode([job], opts, 1, False, False, prefix, suffix)
                continue
            del inputs
            stats = self.model.last_generation()
            for (item, si, _), (tokens, reason) in zip(chunk, results, strict=True):
                seg = item.segments[si]
                seg.tokens, seg.stop_reason = tokens, reason
                seg.text = self.tokenizer.decode([t for t in tokens if t not in self.stop_ids]).strip()
                seg.truncated, seg.repetition = reason == "max_new_tokens", reason == "repetition"
                item.timings["prefill_ms"] += stats["prefill_ms"] / len(chunk)
                item.timings["decode_ms"] += stats["decode_ms"] / len(chunk)
                if ctc_ms:
                    item.timings["ctc_draft_ms"] = item.timings.get("ctc_draft_ms", 0.0) + ctc_ms
                if draft:
                    for key in ("decode_passes", "draft_proposed", "draft_accepted"):
                        item.draft_stats[key] = item.draft_stats.get(key, 0) + int(stats[key])
        bar.close()


__all__ = ["Segment", "Session", "TranscribeOptions", "Transcription", "guess_language",
           "normalize_language"]
