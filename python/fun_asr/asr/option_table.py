"""The transcription options, each declared once: :data:`OPTIONS` maps a name to its :class:`Option` (type,
default, one-line help, check, and how each front end spells it: the command-line flag, the HTTP form field,
the WebSocket JSON key, the batch job's key; None where that front end does not take it).

Everything else is driven by this table: :meth:`fun_asr.Session.options` fills in the defaults and refuses
unknown names (:func:`option_values`), the command-line flags are generated from it (:func:`add_arguments`,
:func:`cli_values`), the OpenAI form's subtitle fields are read with it (:func:`form_values`) and the batch job
takes its keys. ``stage`` says who uses an option: ``"decode"`` (the Session's decoding) or ``"output"`` (the
srt/vtt writer, :func:`fun_asr.asr.formats.render`)."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from fun_asr.errors import Front, Message, OptionError

if TYPE_CHECKING:
    import argparse


def _check_bool(name: str) -> Callable[[Any], Any]:
    def check(value: Any) -> bool:
        if not isinstance(value, bool | int) or value not in (0, 1):
            raise TypeError(f"{name} must be True or False, got {value!r}")
        return bool(value)

    return check


def _check_language(value: Any) -> Any:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"language must be a string or None, got {type(value).__name__}")
    return value


def _check_hotwords(value: Any) -> tuple[str, ...]:
    from fun_asr.asr.option_checks import check_hotwords
    from fun_asr.audio.decode import Limits

    return check_hotwords(value, Limits())


def _check_max_new_tokens(value: Any) -> int:
    from fun_asr.asr.option_checks import check_lengths
    from fun_asr.audio.decode import Limits

    check_lengths(value, 1.0, math.inf, Limits())
    return value


def _check_segment_seconds(value: Any) -> float:
    from fun_asr.asr.option_checks import check_lengths
    from fun_asr.audio.decode import Limits

    check_lengths(1, value, math.inf, Limits())
    return float(value)


def _check_vad(name: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        from fun_asr.asr.option_checks import check_vad_options

        if value is None:
            return None
        if name == "silence_schedule":  # checked alone: the schedule on
            return check_vad_options(silence_schedule=value, dynamic_silence=True).silence_schedule
        return getattr(check_vad_options(**{name: value}), name)

    return check


def _check_count(name: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        from fun_asr.speakers.diarize import SpeakerOptions

        if value is not None:
            SpeakerOptions.check(**{name: value})
        return value

    return check


def _check_clustering(value: Any) -> Any:
    from fun_asr.speakers.cluster import check_clustering

    return None if value is None else check_clustering(value)


def check_line_option(name: str, value: Any, least: int = 1) -> int | None:
    """``max_line_width`` / ``max_line_count``: None, or a whole number >= ``least`` (OptionError naming it)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise OptionError("option.range", f"{{o[{name}]}} must be a whole number of at least {{least}}, got "
                          "{value!r}", option=name, least=least, value=value)
    return value


def check_lines(values: Mapping[str, Any]) -> dict[str, int]:
    """The subtitle line options (``max_line_width``, ``max_line_count``; absent or None: not given) checked,
    each and together (OptionError naming the option): the ones given."""
    given = {k: check_line_option(k, values.get(k)) for k in OUTPUT_OPTIONS if values.get(k) is not None}
    if "max_line_count" in given and "max_line_width" not in given:
        raise OptionError("option.needs", "{o[max_line_count]} needs {o[max_line_width]} (the lines are made by "
                          "wrapping at that width)", option="max_line_count")
    return given  # type: ignore[return-value]


@dataclass(frozen=True)
class Option:
    """One transcription option: ``name`` (the Python keyword), ``type`` (what a text value is converted with:
    ``int``, ``float``, ``bool``, ``str``; ``list`` for a comma-separated list, ``object`` for a structured value),
    ``default``, ``help`` (one line; other options as ``{o[name]}`` fields: :meth:`help_in`), ``check``
    (value -> checked value; TypeError/ValueError naming the option),
    and its spelling in each front end: ``cli`` (flag), ``form`` (HTTP form field), ``ws`` (WebSocket JSON key),
    ``job`` (batch job key)."""

    name: str
    type: type
    default: Any
    help: str
    check: Callable[[Any], Any]
    cli: str | None = None
    form: str | None = None
    ws: str | None = None
    job: str | None = None
    stage: str = "decode"  # "decode": the Session's; "output": the srt/vtt writer's
    metavar: str | None = None

    def help_in(self, front: Front = "python") -> str:
        """:attr:`help` in ``front``'s words: it names other options as ``{o[name]}`` fields (see
        :mod:`fun_asr.errors`), so the command line reads ``--diarize`` where Python reads ``diarize``."""
        return Message(self.help).render(front)


def _opt(name: str, type_: type, default: Any, help_: str, check: Callable[[Any], Any], **spelling: Any) -> Option:
    return Option(name, type_, default, help_, check, **spelling)


_TABLE = (
    _opt("language", str, None, "zh, en, ja (or their names); None: automatic", _check_language,
         cli="--language", form="language", ws="svs_lang", job="language"),
    _opt("itn", bool, True, "inverse text normalization", _check_bool("itn"),
         cli="--no-itn", form="itn", ws="itn", job="itn"),
    _opt("hotwords", list, (), "words to favour (a list, or one comma-separated string)", _check_hotwords,
         cli="--hotwords", form="hotwords", ws="hotwords", job="hotwords"),
    _opt("max_new_tokens", int, 512, "decoding limit per segment", _check_max_new_tokens,
         cli="--max-new-tokens", job="max_new_tokens"),
    _opt("segment_seconds", float, 30.0,
         "longest segment in seconds: the VAD's forced cut, or the pause splitter's limit", _check_segment_seconds,
         cli="--segment-seconds", job="segment_seconds"),
    _opt("repetition_guard", bool, True, "stop n-gram loops early", _check_bool("repetition_guard"),
         cli="--no-repetition-guard", job="repetition_guard"),
    _opt("ignore_eos", bool, False, "benchmarks only: always decode max_new_tokens", _check_bool("ignore_eos")),
    _opt("vad", bool, None, "segment with the Session's FSMN-VAD (None: the Session's choice)", lambda v: v),
    _opt("word_timestamps", bool, False, "per-word (CTC token) times from the checkpoint's CTC head",
         _check_bool("word_timestamps"), cli="--word-timestamps", form="timestamp_granularities"),
    _opt("silence_schedule", object, None,
         "FunASR's dynamic end-silence schedule: pairs of accumulated speech ms : end silence ms, the first row "
         "whose limit is reached applies, e.g. '10000:2000,20000:1000,30000:800,40000:600,50000:400,60000:200,"
         "inf:100' (the default)",
         _check_vad("silence_schedule"), cli="--silence-schedule", form="silence_schedule", job="silence_schedule",
         metavar="MS:SILENCE,..."),
    _opt("dynamic_silence", bool, None, "FunASR's dynamic end-silence schedule on or off (default on unless "
         "{o[max_end_silence_time]} is given; off = a fixed end silence, the VAD config's 800 ms)",
         _check_vad("dynamic_silence"), cli="--dynamic-silence", form="dynamic_silence", job="dynamic_silence"),
    _opt("max_end_silence_time", int, None, "FunASR's fixed end silence in ms (turns the schedule off unless "
         "{o[dynamic_silence]})", _check_vad("max_end_silence_time"),
         cli="--max-end-silence-time", form="max_end_silence_time", job="max_end_silence_time", metavar="MS"),
    _opt("diarize", bool, False, "who spoke when: a speaker label on every segment", _check_bool("diarize"),
         cli="--diarize", form="spk", job="diarize"),
    _opt("num_speakers", int, None, "with {o[diarize]}: exactly this many speakers", _check_count("num_speakers"),
         cli="--num-speakers", job="num_speakers"),
    _opt("min_speakers", int, None, "with {o[diarize]}: at least this many (default 1)", _check_count("min_speakers"),
         cli="--min-speakers", job="min_speakers"),
    _opt("max_speakers", int, None, "with {o[diarize]}: at most this many (default 15)", _check_count("max_speakers"),
         cli="--max-speakers", job="max_speakers"),
    _opt("speaker_clustering", str, None, "with {o[diarize]}: auto or funasr (None: the Session's)", _check_clustering,
         cli="--speaker-clustering", job="speaker_clustering"),
    _opt("max_line_width", int, None,
         "srt/vtt: at most this many characters per subtitle line (wrapped at spaces; text without spaces at "
         "characters); a longer cue is split into several, timed by its word times where it has them",
         lambda v: check_line_option("max_line_width", v), cli="--max-line-width", form="max_line_width",
         job="max_line_width", stage="output", metavar="CHARS"),
    _opt("max_line_count", int, None,
         "srt/vtt: at most this many lines per cue (with {o[max_line_width]}; default: as many as the text needs)",
         lambda v: check_line_option("max_line_count", v), cli="--max-line-count", form="max_line_count",
         job="max_line_count", stage="output", metavar="LINES"),
)

OPTIONS: Mapping[str, Option] = MappingProxyType({o.name: o for o in _TABLE})
# Session.options' positional parameters, in order (the rest are keyword-only)
POSITIONAL = ("language", "itn", "hotwords", "max_new_tokens", "segment_seconds", "repetition_guard", "ignore_eos",
              "vad", "word_timestamps")
OUTPUT_OPTIONS = tuple(o.name for o in _TABLE if o.stage == "output")
VAD_OPTIONS = ("silence_schedule", "dynamic_silence", "max_end_silence_time")  # FunASR's per-call VAD kwargs


def default(name: str) -> Any:
    """The default of option ``name``."""
    return OPTIONS[name].default


def unknown_option(given: Iterable[str], where: str) -> None:
    """TypeError naming the first keyword of ``given`` that is no transcription option, and the options."""
    unknown = sorted(set(given) - set(OPTIONS))
    if unknown:
        raise TypeError(f"{where}() got an unexpected keyword argument {unknown[0]!r}; the transcription options "
                        f"are {', '.join(OPTIONS)}")


def option_values(args: tuple[Any, ...], kwargs: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Every option's value: ``args`` in :data:`POSITIONAL` order, then ``kwargs``, the rest their defaults
    (TypeError for too many positional arguments, a name given twice, or an unknown name)."""
    if len(args) > len(POSITIONAL):
        raise TypeError(f"{where}() takes at most {len(POSITIONAL)} positional options ({', '.join(POSITIONAL)}), "
                        f"got {len(args)}")
    unknown_option(kwargs, where)
    values = {o.name: o.default for o in _TABLE}
    for name, value in zip(POSITIONAL, args, strict=False):
        if name in kwargs:
            raise TypeError(f"{where}() got multiple values for argument {name!r}")
        values[name] = value
    values.update(kwargs)
    return values


def signature(first: str | None = "self") -> inspect.Signature:
    """The options as a call signature (the :data:`POSITIONAL` ones positional, the rest keyword-only, each with
    its default): what ``help(Session.options)`` and ``inspect.signature`` show of ``Session.options``."""
    kinds = inspect.Parameter
    params = [kinds(first, kinds.POSITIONAL_OR_KEYWORD)] if first else []
    for o in _TABLE:
        kind = kinds.POSITIONAL_OR_KEYWORD if o.name in POSITIONAL else kinds.KEYWORD_ONLY
        note = f"{o.type.__name__} | None" if o.default is None else o.type.__name__
        params.append(kinds(o.name, kind, default=o.default, annotation=note))
    return inspect.Signature(params, return_annotation="TranscribeOptions")


# -- command lines --------------------------------------------------------------------------------------------


def add_arguments(ap: argparse.ArgumentParser | Any, names: Iterable[str], **helps: str) -> None:
    """The options ``names`` as flags of ``ap`` (their :attr:`Option.cli` spelling): ``--no-x`` for an option
    that is on by default, ``--x/--no-x`` for one whose default is None (the callee's choice), ``--x`` for one
    off by default, else a value flag. ``helps``: a command's own help of an option (default the table's)."""
    for name in names:
        o = OPTIONS[name]
        if o.cli is None:
            raise ValueError(f"{name} has no command-line flag")
        text = helps.get(name, o.help_in("cli"))
        if o.type is bool and o.default is None:
            import argparse

            ap.add_argument(o.cli, action=argparse.BooleanOptionalAction, default=None, help=text)
        elif o.type is bool:
            ap.add_argument(o.cli, action="store_true", help=text)
        else:
            kind = str if o.type in (list, object) else o.type
            ap.add_argument(o.cli, type=kind, default=None, metavar=o.metavar, help=text)


def cli_dest(name: str) -> str:
    """The argparse attribute of option ``name``'s flag (``--no-itn``: ``no_itn``)."""
    return OPTIONS[name].cli.lstrip("-").replace("-", "_")  # type: ignore[union-attr]


def cli_values(args: argparse.Namespace, names: Iterable[str]) -> dict[str, Any]:
    """The options ``names`` as their flags set them: ``--no-x`` as ``x=False``, flags left out as the
    option's default."""
    out: dict[str, Any] = {}
    for name in names:
        o = OPTIONS[name]
        value = getattr(args, cli_dest(name))
        if o.type is bool and o.cli is not None and o.cli.startswith("--no-") and o.default is True:
            value = not value
        out[name] = o.default if value is None else value
    return out


# -- HTTP forms -----------------------------------------------------------------------------------------------


def form_values(form: Mapping[str, Any], names: Iterable[str]) -> dict[str, Any]:
    """The options ``names`` read from a form (their :attr:`Option.form` field; absent or empty: the default),
    converted and checked: a :class:`~fun_asr.errors.FunAsrError` naming the option (``exc.option``; render it
    for ``"http-client"`` to name the field)."""
    out: dict[str, Any] = {}
    for name in names:
        o = OPTIONS[name]
        raw = form.get(o.form) if o.form else None
        if not isinstance(raw, str) or raw == "":
            out[name] = o.default
            continue
        try:
            value = o.type(raw.strip()) if o.type in (int, float) else raw
        except ValueError:
            kind = "a whole number" if o.type is int else "a number"
            raise OptionError("option.type", f"{{o[{name}]}} must be {kind}, got {{value!r:.40}}", option=name,
                              value=raw) from None
        out[name] = o.check(value)
    return out


def check_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """Each value checked by its option's check (TypeError/ValueError naming the option)."""
    unknown_option(values, "check_values")
    return {name: OPTIONS[name].check(v) for name, v in values.items()}


__all__ = ["OPTIONS", "OUTPUT_OPTIONS", "POSITIONAL", "VAD_OPTIONS", "Option", "add_arguments", "check_line_option",
           "check_lines", "check_values",
           "cli_dest", "cli_values", "default", "form_values", "option_values", "signature",
           "unknown_option"]
