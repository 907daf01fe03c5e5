"""fun_asr.Session: audio in, text out, with FunASR's exact preprocessing, prompt and decoding.

The Session chooses and loads the model package (:class:`fun_asr.asr.engine.Engine`), finds its VAD and speaker
model, checks each call's options (:mod:`fun_asr.asr.options`) and hands recordings to the pipeline
(:class:`fun_asr.asr.pipeline.Pipeline`) or a live stream to :func:`fun_asr.asr.streams.open_stream`.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
import weakref
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fun_asr import _core
from fun_asr.asr.engine import Engine
from fun_asr.asr.language import guess_language, normalize_language
from fun_asr.asr.option_table import VAD_OPTIONS, check_lines, option_values
from fun_asr.asr.option_table import signature as option_signature
from fun_asr.asr.options import (
    OptionArgs,
    TranscribeOptions,
    VadOptions,
    check_batch_size,
    check_draft,
    check_hotwords,
    check_lengths,
    check_option_names,
    check_vad_options,
)
from fun_asr.asr.pipeline import NO_VAD_MESSAGE, VAD_ENV, Arrivals, Pipeline, no_vad_notice
from fun_asr.asr.results import Segment, Transcription
from fun_asr.asr.streams import STREAM_SIGNATURE, open_stream
from fun_asr.audio.decode import AudioInput, Limits, check_audio_input
from fun_asr.audio.frontend import fake_token_len
from fun_asr.converter.hub import DEFAULT_REPO, DEMO, resolve_model
from fun_asr.errors import OptionError, OptionTypeError, SetupError, options_field
from fun_asr.model.demo import WORDS as _DEMO_WORDS
from fun_asr.model.native import usable_device
from fun_asr.speakers.cluster import DEFAULT_CLUSTERING, check_clustering
from fun_asr.speakers.diarize import RecordingSpeakers, SpeakerOptions
from fun_asr.vad.native import FsmnVad

if TYPE_CHECKING:
    from typing_extensions import Unpack

log = logging.getLogger("fun_asr")


def _default_package(device: str) -> str:
    """F16 on a GPU, Q8_0 on the CPU (check_device said the device exists)."""
    return "q8_0" if _core.check_device(device) == _core.check_device("cpu") else "f16"


class _Part:
    """A Session attribute that is its engine's or its pipeline's (``part``: the Session's attribute holding it),
    read through the Session and, where ``writable``, set through it (else AttributeError, as a read-only
    property)."""

    def __init__(self, part: str, doc: str, writable: bool = False) -> None:
        self.part, self.__doc__, self.writable, self.name = part, doc, writable, ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        return self if obj is None else getattr(getattr(obj, self.part), self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        if not self.writable:
            raise AttributeError(f"property {self.name!r} of 'Session' object has no setter")
        setattr(getattr(obj, self.part), self.name, value)


@dataclass(frozen=True)
class SessionSettings:
    """:class:`Session`'s keyword-only settings (each described there): ``package_type``, ``revision``,
    ``progress``, ``vad``, ``vad_model``, ``limits``, ``speaker_model``, ``speaker_clustering``."""

    package_type: str | None = None
    revision: str | None = None
    progress: bool = True
    vad: str | None = "auto"
    vad_model: str | os.PathLike[str] | None = None
    limits: Limits | None = None
    speaker_model: Any = "auto"
    speaker_clustering: str = DEFAULT_CLUSTERING

    @classmethod
    def given(cls, settings: dict[str, Any]) -> SessionSettings:
        """The settings from ``Session(...)``'s keywords; TypeError naming an unknown one and the accepted."""
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(settings) - set(names))
        if unknown:
            raise TypeError(f"Session() got an unexpected keyword argument {unknown[0]!r}; it takes model, device, "
                            f"threads and {', '.join(names)}")
        return cls(**settings)

    @classmethod
    def signature(cls) -> inspect.Signature:
        """``Session(...)``'s parameters as help() shows them."""
        p = inspect.Parameter
        first = [p("self", p.POSITIONAL_OR_KEYWORD), p("model", p.POSITIONAL_OR_KEYWORD, default=DEFAULT_REPO),
                 p("device", p.POSITIONAL_OR_KEYWORD, default="auto"), p("threads", p.POSITIONAL_OR_KEYWORD, default=0)]
        return inspect.Signature([*first, *(p(f.name, p.KEYWORD_ONLY, default=f.default)
                                            for f in dataclasses.fields(cls))], return_annotation=None)


class Session:
    """A loaded model ready to transcribe.

    ``model``: a GGUF file, an HF checkpoint folder, or a hub repo id (default
    ``FunAudioLLM/Fun-ASR-Nano-2512-hf`` at the pinned revision: downloaded and converted once,
    Q8_0 on CPU and F16 on a GPU unless ``package_type`` says otherwise).
    ``device``: ``auto``, ``cpu``, ``gpu[:N]``, ``cuda[:N]``, ``vulkan[:N]``, ``metal``. ``threads``: CPU threads,
    0 = auto (up to all cores; fewer when timed decode steps say that is faster, e.g. beside a busy process).

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
    ``speaker_source`` says where it came from. ``speaker_clustering``: how the speakers of calls that do not name
    one are clustered (``"auto"``, default: a recording under 20 speaker windows gets its count from
    agglomerative clustering; ``"funasr"``: FunASR's labels bit for bit, one speaker there; see
    :meth:`transcribe`).
    With a CTC head (FunASR/ModelScope checkpoints), a segment decoded alone takes the head's greedy transcript
    as the draft of lossless speculative decoding: the same tokens, fewer decoder passes (``ctc_drafts``, True
    then; set it False to skip the head's cost where its transcript rarely matches).
    One Session can be used from several threads; transcriptions run one at a time.
    """

    def __init__(self, model: str | os.PathLike[str] = DEFAULT_REPO, device: str = "auto", threads: int = 0,
                 **settings: Any) -> None:
        c = SessionSettings.given(settings)
        vad, vad_model, progress, speaker_model = c.vad, c.vad_model, c.progress, c.speaker_model
        if vad not in ("auto", "fsmn", None, "none"):
            raise ValueError(f"vad must be 'auto', 'fsmn' or None, got {vad!r}")
        self.speaker_clustering = check_clustering(c.speaker_clustering)
        if not isinstance(device, str):
            raise TypeError(f"device must be a string (auto, cpu, gpu[:N], cuda[:N], vulkan[:N], metal), got "
                            f"{type(device).__name__}")
        usable_device(device)  # before anything is downloaded or converted for it: ValueError saying why not
        from_hub = not Path(model).expanduser().exists() and str(model) != DEMO  # the demo is local, VAD embedded
        self._model_arg = model
        # the 20-word demo model (-m demo): the server names it so (/v1/models, the web page)
        self.demo = str(model) == DEMO and not Path(model).exists()
        if self.demo:
            log.warning("the 20-word demo model (-m demo): it knows only %s; for real speech use the default "
                        "model or a converted checkpoint", ", ".join(_DEMO_WORDS))
        path = resolve_model(model, c.package_type or _default_package(device), c.revision, progress)
        # the Session owns its engine (the loaded model) and its pipeline (recordings through the engine)
        self._engine = Engine(path, device, threads)
        self.vad_source: str | None = None  # where the VAD came from: "embedded", a path, a repo id, ...
        loaded: FsmnVad | None = None
        if vad not in (None, "none"):
            loaded, self.vad_source = self._load_vad(vad, vad_model, from_hub, progress)
        # the pipeline calls back for speaker windows through a weak reference: no Session <-> Pipeline cycle, so a
        # Session that is dropped frees its model at once (not at the next garbage collection)
        windows = weakref.WeakMethod(self._speaker_windows)
        self._pipeline = Pipeline(self._engine, c.limits or Limits(), loaded, lambda: windows()())  # type: ignore[misc]
        # "auto" found no VAD: every result says so (warning code no_vad), and it is logged once here
        self.vad_missing = vad == "auto" and self.vad is None
        if self.vad_missing:
            log.warning("%s", no_vad_notice(path))
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
        with self._engine._lock:
            return model.embed(windows, threads=self._speaker_threads())

    def embed_speaker_features(self, features: list[np.ndarray]) -> np.ndarray:
        """CAM++ embeddings ``[N, D]`` of CAM++ feature windows (under the Session's lock)."""
        model = self.speaker_model
        with self._engine._lock:
            return model.embed_features(features, threads=self._speaker_threads())

    def _speaker_threads(self) -> int:
        """The Session's threads; for threads=0 the count the ASR model's timed decode steps chose now."""
        return self.threads or int(self.model.thread_choice()["threads"])

    def _speaker_windows(self) -> RecordingSpeakers:
        return RecordingSpeakers(self.embed_speaker_features, self.speaker_model.frontend)

    def _load_vad(self, mode: str, vad_model: str | os.PathLike[str] | None, from_hub: bool,
                  progress: bool) -> tuple[FsmnVad | None, str | None]:
        """The VAD to run, and where it came from. In order: ``vad_model``; the VAD embedded in the package;
        ``$FUN_ASR_VAD_MODEL``; for a hub model, the hub's VAD (downloaded); else one already in fun-asr's or
        the hub's cache (``mode="fsmn"`` downloads ``funasr/fsmn-vad`` instead). A VAD that was asked for
        (``vad_model``, the variable, ``"fsmn"``) and cannot be loaded raises; ``"auto"`` otherwise goes on."""
        from fun_asr.asr.components import find_component
        from fun_asr.converter.hub import MODELSCOPE, MODELSCOPE_VAD_REPO, VAD

        def embedded() -> FsmnVad | None:
            return FsmnVad.load(self.path, threads=1) \
                if "fsmn_vad.block_count" in self.metadata and self.path.is_file() else None

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

    # -- the engine and the pipeline it owns ----------------------------------------------------

    @property
    def engine(self) -> Engine:
        """The loaded model the Session owns (:class:`fun_asr.asr.engine.Engine`)."""
        return self._engine

    # the engine's and the pipeline's attributes, read (and set, where writable) through the Session
    path = _Part("_engine", "The model package (GGUF) loaded.")
    model = _Part("_engine", "The native model (:class:`fun_asr.model.native.Model`).", writable=True)
    threads = _Part("_engine", "CPU threads as given (0: auto).")
    metadata = _Part("_engine", "The package's GGUF metadata (Python values).")
    tokenizer = _Part("_engine", "The model's text tokenizer.")
    prompt = _Part("_engine", "The model's prompt (:class:`fun_asr.asr.prompt.PromptSpec`).")
    spec = _Part("_engine", "The model spec (its languages included).")
    language_table = _Part("_engine", '``"nano"`` (Fun-ASR-Nano) or ``"mlt_nano"`` (Fun-ASR-MLT-Nano, 31 languages).')
    frontend = _Part("_engine", "The audio frontend's settings (:class:`fun_asr.audio.frontend.FrontendConfig`).")
    stop_ids = _Part("_engine", "The token ids that end a transcript.")
    max_segment_seconds = _Part("_engine", "The longest segment the encoder takes.")
    context_length = _Part("_engine", "The decoder's context (positions).")
    vocab_size = _Part("_engine", "The decoder's vocabulary size.")
    aligner = _Part("_engine", "The CTC head's aligner (None: no CTC head, no word timestamps; ``ctc_reason`` says "
                    "why).")
    ctc_reason = _Part("_engine", "Why there is no CTC aligner (None: there is one).")
    ctc_drafts = _Part("_engine", "Whether a segment decoded alone takes its CTC greedy transcript as its draft (see "
                       "the class).", writable=True)
    prefix_cache = _Part("_engine", "Whether the prompt prefix's K/V is reused across segments (the same tokens either "
                         "way).", writable=True)
    encoder_pack = _Part("_engine", "The most segments encoded in one packed pass when recordings are transcribed in "
                         "batches.", writable=True)
    vad = _Part("_pipeline", "The FSMN-VAD that cuts recordings (None: cut at pauses; ``vad_source`` says where it "
                "came from).", writable=True)
    limits = _Part("_pipeline", "The input limits (:class:`fun_asr.audio.decode.Limits`).", writable=True)

    def prompt_ids(self, opts: TranscribeOptions) -> tuple[list[int], list[int]]:
        """The prompt's token ids before and after the audio for ``opts``."""
        return self._engine.prompt_ids(opts)

    def interrupt(self) -> bool:
        """From another thread: stops the transcriptions running on this session (``transcribe``,
        ``transcribe_batch``, a stream's decodes) at the model's next graph node or decoding step; each of
        those calls raises :class:`fun_asr.Interrupted` and the session stays usable. Calls that start before
        the interrupted ones have ended stop too; once none runs, later calls run normally. Returns whether
        a transcription was running (with none, nothing happens: the next call is not affected). The VAD's and
        the speaker model's passes are not interrupted (they run between the model's, briefly)."""
        return self._engine.interrupt()

    def interruptible(self) -> AbstractContextManager[None]:
        """A block that counts as one running transcription for :meth:`interrupt` (every transcription is one):
        an interrupt while it is open, also between the calls it makes, stops them (the calls raise
        :class:`fun_asr.Interrupted`) until it ends — for a caller that decides to run a transcription and
        must not lose an interrupt that comes before the call starts."""
        return self._engine.interruptible()

    def _decode_audio(self, samples: np.ndarray, opts: TranscribeOptions, forced: list[int], max_new_tokens: int,
                      draft: list[int] | None = None) -> tuple[list[int], str, dict[str, float]]:
        """One segment decoded alone with a forced answer start (the chunked stream's decode):
        :meth:`fun_asr.asr.engine.Engine._decode_audio`."""
        return self._engine._decode_audio(samples, opts, forced, max_new_tokens, draft)

    # -- options -------------------------------------------------------------------------------

    def normalize_language(self, language: str | None) -> str | None:
        """zh/en/ja, their English names or 中文/英文/日文 -> the code; None -> None; any other name is kept as
        written and reaches the prompt as FunASR passes it (:func:`fun_asr.asr.language.normalize_language`)."""
        return normalize_language(self.spec, language)

    def options(self, *args: Any, **kwargs: Unpack[OptionArgs]) -> TranscribeOptions:
        """Checks transcription options once (ValueError/TypeError naming the option) and returns them. The options
        are :data:`fun_asr.asr.option_table.OPTIONS` (name, default, help); the first nine may be given by position
        (``language, itn, hotwords, max_new_tokens, segment_seconds, repetition_guard, ignore_eos, vad,
        word_timestamps``), the rest by name; an unknown name is a TypeError naming the accepted ones.
        ``diarize``: speaker labels (loads the speaker model now, so that a missing one fails before any audio is
        read); ``num_speakers``, ``min_speakers``, ``max_speakers``, ``speaker_clustering`` (None: the Session's)
        need it.
        ``silence_schedule``, ``dynamic_silence``, ``max_end_silence_time``: FunASR 1.4.16's per-call FSMN-VAD
        kwargs (:class:`fun_asr.asr.options.VadOptions`); they need the VAD to run.
        ``max_line_width``, ``max_line_count``: srt/vtt subtitle lines (:func:`fun_asr.asr.formats.render`), kept
        in the result's ``options``."""
        v = option_values(args, kwargs, "options")
        words = check_hotwords(v["hotwords"], self.limits)
        check_lengths(v["max_new_tokens"], v["segment_seconds"], self.max_segment_seconds, self.limits)
        vad = v["vad"]
        if vad and self.vad is None:
            raise SetupError("vad.missing", "{h[needs_vad]}", option="vad_model")
        use_vad = self.vad is not None if vad is None else bool(vad)
        vad_opts, speakers = self._call_vad_and_speakers(v, use_vad)
        lines = check_lines(v)
        opts = TranscribeOptions(self.normalize_language(v["language"]), bool(v["itn"]), words, v["max_new_tokens"],
                                 float(v["segment_seconds"]), bool(v["repetition_guard"]), bool(v["ignore_eos"]),
                                 use_vad, bool(v["word_timestamps"]), no_vad=vad is None and self.vad_missing,
                                 vad_options=vad_opts, diarize=v["diarize"], speakers=speakers, **lines)
        self._check_context(opts, use_vad)
        return opts

    def _call_vad_and_speakers(self, v: dict[str, Any], use_vad: bool) -> tuple[VadOptions, SpeakerOptions]:
        """A call's VAD options and speaker options, checked against each other and the Session."""
        vad_opts = check_vad_options(*(v[k] for k in VAD_OPTIONS))
        if vad_opts.given and not use_vad:
            named = options_field(vad_opts.to_dict())
            why = "{o[vad=False]}" if v["vad"] is False else "{h[no_vad]}"
            raise OptionError("vad.unused", f"{named}: FSMN-VAD options, but the VAD does not run here ({why}); the "
                              "audio would be cut at pauses, so they would have no effect",
                              option=next(iter(vad_opts.to_dict())))
        clustering, diarize = v["speaker_clustering"], v["diarize"]
        speakers = SpeakerOptions.check(v["num_speakers"], v["min_speakers"], v["max_speakers"],
                                        self.speaker_clustering if clustering is None else clustering)
        if diarize is True and use_vad and not vad_opts.given:
            # speaker turns need segments that end at turn gaps: FunASR's dynamic end-silence schedule waits for
            # up to 2 s of silence (a conversation becomes 30 s segments); its static mode (the VAD config's
            # max_end_silence_time, 800 ms) ends them there. Any VAD option given is used as given instead.
            vad_opts = check_vad_options(None, False, None)
        if not isinstance(diarize, bool):
            raise OptionTypeError("option.type", "{o[diarize]} must be True or False, got {value!r}", option="diarize",
                                  value=diarize)
        given = [*speakers.counts(), *(["speaker_clustering"] if clustering is not None else [])]
        if given and not diarize:
            named = options_field(given)
            raise OptionError("option.needs", f"{named}: speaker options, but {{h[no_speakers_asked]}} "
                              "({h[pass_diarize]})", option=given[0])
        if diarize:
            self.speaker_model  # noqa: B018 - loads it, or raises naming how to give one
        return vad_opts, speakers

    def _check_context(self, opts: TranscribeOptions, use_vad: bool) -> None:
        """The longest decoder input + max_new_tokens must fit the decoder's context: checked here, once, so that
        a long hotword list fails with a clear message instead of deep inside decoding."""
        before, after = self.prompt_ids(opts)
        longest_vad = (self.vad.cfg.segment_limit_ms / 1000 + 0.02) if use_vad and self.vad is not None else 0.0
        seconds = max(opts.segment_seconds, longest_vad)
        rows = fake_token_len(int(np.ceil(seconds / self.frontend.seconds_per_lfr_frame)),
                              self.prompt.fake_token_halvings)
        need = len(before) + rows + len(after) + opts.max_new_tokens
        if need > self.context_length:
            raise OptionError("limit.context", "the prompt ({prompt} tokens with {count} hotwords) + {rows} audio rows "
                              "for {seconds:g} s segments + {o[max_new_tokens]} {most} = {need} positions, over the "
                              "decoder's context of {context}: use fewer hotwords, shorter segments or a smaller "
                              "{o[max_new_tokens]}", option="max_new_tokens", prompt=len(before) + len(after),
                              count=len(opts.hotwords), rows=rows, seconds=seconds, most=opts.max_new_tokens,
                              need=need, context=self.context_length)

    _options = options  # older name

    # -- transcription -------------------------------------------------------------------------

    def transcribe(self, audio: AudioInput, *, sample_rate: int | None = None, progress: bool = False,
                   batch_size: int = 8, draft: list[int] | None = None,
                   **options: Unpack[OptionArgs]) -> Transcription:
        """Transcribes one recording (path, bytes, binary file object, or array with ``sample_rate``).

        ``options``: the transcription options, as keywords (those of :meth:`options`, which checks them:
        ``language``, ``itn``, ``hotwords``, ``max_new_tokens``, ``segment_seconds``, ... - the list is
        :class:`fun_asr.asr.options.OptionArgs`). Its segments are decoded up to ``batch_size`` at a time (token for
        token the same as one by one). ``vad``: False cuts at pauses even when the Session has a VAD (None: the
        Session's choice). ``word_timestamps``: per-token start/end from the checkpoint's CTC head by FunASR's
        forced alignment (the ModelScope checkpoint has it; the Hugging Face one does not: then segment times only,
        said once). Raises on audio that cannot be read. ``ignore_eos`` is for benchmarks only: decode exactly
        ``max_new_tokens`` per segment.

        FunASR 1.4.16's per-call VAD kwargs (``AutoModel.generate(..., silence_schedule=...)``): ``silence_schedule``
        (the dynamic end-silence table, ``[(accumulated_speech_ms, silence_ms), ...]``, or a string
        ``"10000:2000,inf:100"``; default ``fun_asr.vad.DEFAULT_SILENCE_SCHEDULE``), ``dynamic_silence`` (the
        schedule on/off; default on unless ``max_end_silence_time`` is given) and ``max_end_silence_time``
        (a fixed end silence, ms). See :class:`fun_asr.asr.options.VadOptions`.

        ``diarize=True``: who spoke when, FunASR's way (``spk_model="cam++"``): every segment gets
        ``Segment.speaker`` (0, 1, ... in order of first appearance) and ``Transcription.speakers`` the speaker
        timeline. ``num_speakers``: exactly that many (FunASR's ``preset_spk_num``); else the count is found in
        ``min_speakers``..``max_speakers`` (default 1..15). ``speaker_clustering``: ``"auto"`` (the Session's default)
        finds the count of a recording under 20 speaker windows (~15 s of speech) by agglomerative clustering on
        cosine similarity, where FunASR's ``ClusterBackend`` returns one speaker; ``"funasr"`` keeps FunASR's labels
        bit for bit; from 20 windows on both are FunASR's clustering. Needs the Session's speaker model
        (``speaker_model``).

        ``draft``: token ids the transcript probably contains (a stream's previous partial of the same speech):
        lossless speculative decoding - the decoder verifies several of them per pass and keeps only what its
        own greedy choice gives, so the tokens are exactly those without a draft (a wrong draft costs one
        pass). Used where a segment is decoded alone; the result's timings then count ``decode_passes``,
        ``draft_proposed`` and ``draft_accepted``.
        """
        check_audio_input(audio)
        check_batch_size(batch_size)
        check_option_names(options, "transcribe")
        opts = self.options(**options)
        drafts = None if draft is None else [check_draft(draft, "draft", self.vocab_size)]
        return self._pipeline._run([audio], sample_rate, opts, batch_size=batch_size, progress=progress,
                                   raise_errors=True, drafts=drafts)[0]

    def transcribe_batch(self, audios: list[AudioInput], *, sample_rate: int | None = None, batch_size: int = 8,
                         progress: bool = False, names: list[str] | None = None, warn: bool = True,
                         drafts: list[list[int] | None] | None = None, arrivals: Arrivals | None = None,
                         **options: Unpack[OptionArgs]) -> list[Transcription]:
        """Transcribes several recordings with the same options, decoding up to ``batch_size``
        segments at once (one KV cache slot each: every decoding step reads the weights once for the
        whole batch). Results are in input order and token for token equal to ``transcribe``.

        A recording that cannot be read or transcribed does not fail the others: its result has
        ``error`` set (``ok`` is False, text empty, ``empty_reason`` "error") and a warning is issued.
        ``names`` labels the recordings in messages and ``Transcription.source`` (default: the file
        path, or ``input N <array>``). The timings of each result hold its share of the batch's prefill
        and decode time. ``silence_schedule``, ``dynamic_silence``, ``max_end_silence_time``: FunASR's VAD
        kwargs, and ``diarize``, ``num_speakers``, ``min_speakers``, ``max_speakers``, ``speaker_clustering`` (each
        recording's speakers on its own), and ``drafts`` (one token list or None per recording: see ``draft``
        there), as in :meth:`transcribe`. ``warn=False``: the notices are only in each result's ``warnings``,
        no Python warnings are issued (a server that reports them itself; warning filters are process-wide).

        ``arrivals`` (:class:`fun_asr.asr.pipeline.Arrivals`): recordings that join while this call decodes (a
        server's requests arriving mid-batch): each is read and encoded when a decoder slot is free, its segments
        join the running steps, and every result (the given recordings' too) is delivered as soon as it is ready;
        the call returns when nothing is left, with every result (given ones first, then arrivals in order). Not
        with ``drafts``."""
        one = str | bytes | bytearray | memoryview | os.PathLike | np.ndarray
        if isinstance(audios, one) or hasattr(audios, "read"):
            raise TypeError(f"transcribe_batch takes a list of recordings, got one {type(audios).__name__}; "
                            "wrap it in a list or call transcribe()")
        if not isinstance(audios, list | tuple):
            raise TypeError(f"transcribe_batch takes a list of recordings, got {type(audios).__name__}")
        for i, a in enumerate(audios):
            check_audio_input(a, f"audios[{i}]")
        check_batch_size(batch_size)
        check_option_names(options, "transcribe_batch")
        if names is not None and (len(names) != len(audios) or not all(isinstance(n, str) for n in names)):
            raise ValueError(f"names must be {len(audios)} strings, one per recording")
        if drafts is not None:
            if not isinstance(drafts, list | tuple) or len(drafts) != len(audios):
                raise ValueError(f"drafts must be a list of {len(audios)} token lists (or None), one per recording")
            drafts = [None if d is None else check_draft(d, f"drafts[{i}]", self.vocab_size)
                      for i, d in enumerate(drafts)]
        opts = self.options(**options)
        if arrivals is not None:
            if drafts is not None:
                raise ValueError("drafts are for recordings decoded alone; not with arrivals (a running batch)")
            if not isinstance(arrivals, Arrivals):
                raise TypeError(f"arrivals must be a fun_asr.asr.pipeline.Arrivals, got {type(arrivals).__name__}")
            return self._pipeline._run_arrivals(list(audios), sample_rate, opts, batch_size, names, warn, arrivals)
        return self._pipeline._run(list(audios), sample_rate, opts, batch_size=batch_size, progress=progress,
                                   raise_errors=False, names=names, warn=warn, drafts=drafts)

    def stream(self, *args: Any, **kwargs: Any) -> Any:
        """A live stream (the parameters: ``language``, ``itn``, ``hotwords``, then by name ``max_new_tokens``,
        ``repetition_guard``, ``stream_options``, ``decoder``, ``mode``, ``chunk_ms``, ``rollback_chars``):
        ``feed(pcm, sample_rate=16000)`` any chunk of audio (a numpy array of the shapes and dtypes
        :meth:`transcribe` takes, stereo averaged to mono as there, or int16 bytes) and get events; ``close()``
        flushes and returns the last events.

        ``mode="vad"`` (default, :class:`fun_asr.asr.stream.Stream`): FunASR 1.4.16's realtime-server
        semantics, ``partial`` and ``sentence`` events; needs the VAD. ``stream_options``: a
        :class:`fun_asr.asr.stream.StreamOptions`; ``decoder``: a replacement decode function, a
        :class:`fun_asr.asr.stream.Decoder` (the server shares one batched decoder between streams).
        ``max_new_tokens`` default: the option's (:data:`fun_asr.asr.option_table.OPTIONS`).

        ``mode="chunked"`` (:class:`fun_asr.asr.chunked.ChunkedStream`): Fun-ASR-Nano's streaming SDK
        (``FunASRNanoStreamingVLLM``): every ``chunk_ms`` (720) of audio the whole audio so far is encoded
        again and decoded with the fixed text as the answer's start (``prev_text``); all but the last
        ``rollback_chars`` (8) characters become fixed and are never rewritten. No VAD needed.
        ``max_new_tokens`` default 200 per chunk; ``stream_options``: a
        :class:`fun_asr.asr.chunked.ChunkedOptions` (window, prev_text, ...)."""
        return open_stream(self, *args, **kwargs)


Session.__init__.__signature__ = SessionSettings.signature()  # type: ignore[attr-defined]
Session.options.__signature__ = option_signature()  # type: ignore[attr-defined]  # the table's options, by name
Session.stream.__signature__ = STREAM_SIGNATURE  # type: ignore[attr-defined]

__all__ = ["NO_VAD_MESSAGE", "VAD_ENV", "Segment", "Session", "SessionSettings", "TranscribeOptions", "Transcription",
           "guess_language", "normalize_language"]
