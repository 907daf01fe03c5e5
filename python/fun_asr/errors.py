"""fun-asr's errors as data: what went wrong (a stable ``code``), the option or setting it concerns (``option``),
the limit that was hit (``limit``) and the values, so that each front end says it in its own words.

Every error here is a :class:`FunAsrError` and also the built-in exception it always was (``ValueError``,
``TypeError``, ``RuntimeError``, ``FileNotFoundError``, ``FileExistsError``), so ``except ValueError`` keeps
working. ``str(exc)`` is the Python API's words; :func:`render` says the same for another front end:

- ``"python"``: the Python API's names (``segment_seconds``, ``Session(vad_model=...)``);
- ``"cli"``: fun-asr-transcribe's and fun-asr-batch's flags (``--segment-seconds``, ``--vad-model``);
- ``"server-console"``: fun-asr-serve's flags, for its console (``--max-segment-seconds``);
- ``"http-client"``: what a client of the HTTP routes can act on: the form field it sends (``hotwords``,
  ``spk=true``), else the server's flag as ``fun-asr-serve --flag``;
- ``"websocket"``: the same for a WebSocket client (its JSON keys and commands).

A message is a template in the Python API's words whose fields name what each front end spells differently:
``{o[name]}`` an option or setting (``{o[name=value]}`` with a value: ``diarize=True`` is ``--diarize`` on the
command line and ``spk=true`` in a request), ``{p[name]}`` the option as a prefix (``"--hotwords: "``; nothing in
Python, where the message names it itself), ``{l[limit]}`` where a limit is changed (`` (--max-audio-seconds)``,
or nothing where the front end cannot change it), ``{h[key]}`` a phrase of :data:`PHRASES`; every other field is
one of the error's values. Transcription options are spelled from :data:`fun_asr.asr.option_table.OPTIONS`
(:func:`use_options`); the settings that are not per-call options (``vad_model``, ``device``, ``overwrite``, the
``Limits`` fields, the server's flags) from :data:`SETTINGS`.
"""

from __future__ import annotations

import logging
import os
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

Front = Literal["python", "cli", "server-console", "http-client", "websocket"]
FRONTS: tuple[Front, ...] = ("python", "cli", "server-console", "http-client", "websocket")
E = TypeVar("E", bound=BaseException)
SERVER = "fun-asr-serve"

# Every code an error can carry, and what it means (docs/python.md, errors).
CODES: Mapping[str, str] = {
    "option.type": "an option's value has the wrong type",
    "option.value": "an option's value is not one it accepts",
    "option.range": "an option's value is outside its range",
    "option.needs": "an option was given without the option or setting it needs",
    "limit.hotwords": "more hotwords than Limits.max_hotwords",
    "limit.hotword_chars": "a hotword longer than Limits.max_hotword_chars",
    "limit.max_new_tokens": "max_new_tokens over Limits.max_new_tokens",
    "limit.audio_seconds": "a recording longer than Limits.max_audio_seconds",
    "limit.context": "the prompt, the audio and max_new_tokens do not fit the decoder's context",
    "vad.missing": "the VAD was asked for, but the Session has none",
    "vad.unused": "FSMN-VAD options were given, but the VAD does not run",
    "speaker_model.missing": "speaker labels were asked for, but there is no speaker model",
    "stream.needs_vad": "streaming with VAD endpoints, but the Session has no VAD",
    "stream.endpoint": "commit() in a stream whose VAD ends the utterances",
    "device.unusable": "the device is not usable on this machine",
    "device.unsupported": "this build has no backend for the device",
    "model.fetch": "a model could not be fetched from the hub",
    "output.exists": "an output exists and would be replaced (overwrite)",
}


@dataclass(frozen=True)
class Spelling:
    """How one setting is written in each front end (None: that front end does not take it)."""

    python: str | None = None
    cli: str | None = None
    server: str | None = None  # fun-asr-serve's flag
    request: str | None = None  # what an HTTP client sends (a form field, with its value where given)
    ws: str | None = None  # what a WebSocket client sends


# The settings that are no per-call transcription option, and the server's own spellings of options (its flags
# and request fields, where they differ from the option table's).
SETTINGS: Mapping[str, Spelling] = {
    "vad": Spelling("vad", "--vad", "--vad"),
    "model": Spelling("model", "-m", "-m"),
    "vad_model": Spelling("vad_model", "--vad-model", "--vad-model"),
    "speaker_model": Spelling("speaker_model", "--speaker-model", "--speaker-model"),
    "device": Spelling("device", "--device", "--device"),
    "overwrite": Spelling("overwrite", "--overwrite"),
    "endpoint": Spelling("StreamOptions(endpoint=...)", None, "--endpoint-mode"),
    "max_audio_seconds": Spelling("Limits.max_audio_seconds", None, "--max-audio-seconds"),
    "max_hotwords": Spelling("Session(limits=Limits(max_hotwords=...))"),
    "max_hotword_chars": Spelling("Session(limits=Limits(max_hotword_chars=...))"),
    "max_upload_mb": Spelling("max_upload_mb", None, "--max-upload-mb"),
    # per-call options that fun-asr-serve sets with a flag of its own
    "segment_seconds": Spelling(server="--max-segment-seconds"),
    "max_new_tokens": Spelling(server="--max-new-tokens"),
    "hotwords": Spelling(server="--hotword-file"),
    "diarize": Spelling(server="--enable-spk", ws="SPK"),
    "speaker_clustering": Spelling(server="--speaker-clustering"),
}
# An option or setting with a value, where a front end says it in a way of its own.
VALUES: Mapping[str, Spelling] = {
    "diarize=True": Spelling("diarize=True", "--diarize", "--enable-spk / spk=true", "spk=true", "SPK:true"),
    "vad=None": Spelling("vad=None", "--vad none", "--vad none"),
    "vad=False": Spelling("vad=False", "--vad none", "--vad none"),
    "endpoint=client": Spelling("StreamOptions(endpoint='client')", None, "--endpoint-mode client"),
    "overwrite=True": Spelling("overwrite=True", "--overwrite"),
}
_SERVER_VAD = ("start fun-asr-serve with --vad fsmn and --vad-model, or give a model that embeds its VAD")
# Phrases ({h[key]}) that each front end says in its own way: (Python, command line, server; clients: the server's)
PHRASES: Mapping[str, tuple[str, str, str]] = {
    "no_vad": ("this Session has no VAD model (Session(vad='fsmn', vad_model=...))",
               "this model has no FSMN-VAD (give --vad-model, or drop --vad none)",
               f"this server has no FSMN-VAD ({_SERVER_VAD})"),
    "needs_vad": ("vad=True but this Session has no VAD model (Session(vad='fsmn', vad_model=...))",
                  "this model has no FSMN-VAD (give --vad-model)",
                  f"this server has no FSMN-VAD ({_SERVER_VAD})"),
    "stream_vad": ("streaming needs the FSMN-VAD: create the Session with vad='fsmn' (and vad_model=) or a hub "
                   "model, which brings it (or StreamOptions(endpoint='client'): the caller ends each utterance "
                   "with commit())",
                   "--stream needs the FSMN-VAD to close its sentences and this model has none: give --vad-model "
                   "(a FunASR fsmn-vad folder or .gguf), or use --stream-mode chunked",
                   f"streaming needs the FSMN-VAD: {_SERVER_VAD}, or use --endpoint-mode client (the client ends "
                   "each utterance with COMMIT)"),
    "commit": ("commit()", "commit()", "COMMIT"),
    "its_vad": ("this stream's VAD ends them itself", "this stream's VAD ends them itself",
                "this server's VAD ends them itself"),
    "use_cpu": ("use the cpu or auto device", "use --device cpu or --device auto",
                "use {o[device]} cpu or --device auto"),
    "no_speakers_asked": ("diarize is False", "--diarize is not given", "speaker labels are not asked for"),
    "force": ("--force (overwrite=True)", "{o[overwrite=True]}", "{o[overwrite=True]}"),
    "give_model": ("-m (model=)", "-m", "{o[model]}"),
    "give_speaker": ("--speaker-model (speaker_model=)", "--speaker-model", "{o[speaker_model]}"),
    "give_vad": ("--vad-model (vad_model=)", "--vad-model", "{o[vad_model]}"),
    "vad_off": ("--vad none (vad=None)", "--vad none", "{o[vad=None]}"),
    "or_none": (" or None", "", ""),  # a speaker count: on a command line or in a request it is left out instead
    "omit_num_speakers": ("", " (omit {o[num_speakers]} to have the speakers counted)",
                          " (omit {o[num_speakers]} to have the speakers counted)"),
    "omit_min_speakers": ("", " (omit {o[min_speakers]} for at least 1)", " (omit {o[min_speakers]} for at least 1)"),
    "omit_max_speakers": ("", " (omit {o[max_speakers]} for at most 15)", " (omit {o[max_speakers]} for at most 15)"),
    "ask_speakers": ("diarize=True, --diarize, spk=true", "--diarize", "{o[diarize=True]}"),
    "give_speaker_model": ("speaker_model= / --speaker-model", "--speaker-model", "{o[speaker_model]}"),
    "pass_diarize": ("pass diarize=True / --diarize", "add --diarize", "pass {o[diarize=True]}"),
}


_OPTIONS: dict[str, Any] = {}  # the transcription options' table (use_options: fun_asr.asr registers it)


def use_options(table: Mapping[str, Any]) -> None:
    """Spell the transcription options from ``table`` (:data:`fun_asr.asr.option_table.OPTIONS`: each entry's
    ``cli``, ``form`` and ``ws``). :mod:`fun_asr.asr` registers it when it loads (this module, below it, imports
    nothing of the package)."""
    _OPTIONS.clear()
    _OPTIONS.update(table)


def _option(name: str) -> Any:
    return _OPTIONS.get(name)


def _client(front: Front, setting: Spelling | None, option: Any) -> str | None:
    """An HTTP or WebSocket client's spelling: what it sends, else the server's flag as ``fun-asr-serve --flag``."""
    sent = (option.form if option is not None else None) if front == "http-client" else \
        (option.ws if option is not None else None)
    if setting is not None:
        sent = (setting.request if front == "http-client" else setting.ws) or sent
        if sent is None and setting.server:
            return f"{SERVER} {setting.server}"
    return sent


def spell(name: str, front: Front) -> str | None:
    """Option or setting ``name`` in ``front``'s words (None: that front end has no way to set it)."""
    setting, option = SETTINGS.get(name), _option(name)
    if front == "python":
        return (setting.python if setting is not None else None) or name
    if front == "cli":
        return (setting.cli if setting is not None else None) or (option.cli if option is not None else None)
    if front == "server-console":
        return (setting.server if setting is not None else None) or (option.form if option is not None else None)
    return _client(front, setting, option)


def _with_value(said: str, value: str) -> str:
    """A front end's spelling ``said`` of an option with ``value``: a flag (``--x``, ``--no-x``, ``--x value``) or
    a request field (``x=value``, booleans in lower case)."""
    if said.startswith("-") or " -" in said:
        if value in ("True", "False"):
            return said if value == "True" else said.replace("--", "--no-", 1)
        return f"{said} {value}"
    return f"{said}={value.lower() if value in ('True', 'False') else value}"


class _Words(Mapping[str, str]):
    """The ``{o[...]}`` / ``{p[...]}`` / ``{l[...]}`` / ``{h[...]}`` fields of a template in one front end."""

    def __init__(self, kind: str, front: Front, names: Mapping[str, str]) -> None:
        self.kind, self.front, self.names = kind, front, names

    def __getitem__(self, key: str) -> str:
        if self.kind == "h":
            python, cli, server = PHRASES[key]
            said = python if self.front == "python" else cli if self.front == "cli" else server
            return said.format(o=_Words("o", self.front, self.names))
        if self.kind == "l":  # where the limit is changed
            where = spell(key, "python") if self.front == "python" else self.names.get(key) or spell(key, self.front)
            return f" ({where})" if where else ""
        if self.kind == "p":  # the option as a prefix: the Python API's messages name it themselves
            return "" if self.front == "python" else f"{self._name(key)}: "
        return self._name(key)

    def _name(self, key: str) -> str:
        name, eq, value = key.partition("=")
        given = VALUES.get(key) if eq else None
        if self.front == "python":
            return (given.python if given is not None else None) or (key if eq else spell(name, "python") or name)
        if key in self.names:
            return self.names[key]
        if eq and name in self.names:
            return _with_value(self.names[name], value)
        said = _value_phrase(given, self.front) if given is not None else None
        if said:
            return said
        if eq:
            return _with_value(spell(name, self.front) or name, value)
        return self.names.get(name) or spell(name, self.front) or name

    def __iter__(self) -> Any:
        return iter(())

    def __len__(self) -> int:
        return 0


def _value_phrase(given: Spelling, front: Front) -> str | None:
    if front == "python":
        return given.python
    if front == "cli":
        return given.cli
    if front == "server-console":
        return given.server
    said = given.request if front == "http-client" else given.ws
    return said or (f"{SERVER} {given.server}" if given.server else None)


class Message:
    """A message as data: a template in the Python API's words (see the module) and its values."""

    __slots__ = ("template", "values")

    def __init__(self, template: str, **values: Any) -> None:
        self.template, self.values = template, values

    def render(self, front: Front = "python", names: Mapping[str, str] | None = None) -> str:
        if front not in FRONTS:
            raise ValueError(f"front must be one of {', '.join(FRONTS)}, got {front!r}")
        names = names or {}
        fields = {k: _Words(k, front, names) for k in ("o", "p", "l", "h")}
        values = {k: render(v, front, names) if _structured(v) else v for k, v in self.values.items()}
        return string.Formatter().vformat(self.template, (), {**values, **fields})

    def __str__(self) -> str:
        return self.render()

    def __repr__(self) -> str:
        return f"Message({self.template!r}, **{self.values!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_message, (self.template, self.values))


def _message(template: str, values: dict[str, Any]) -> Message:
    return Message(template, **values)


class FunAsrError(Exception):
    """Base class of fun-asr's errors: ``code`` (one of :data:`CODES`), ``option`` (the option or setting it
    concerns, or None), ``limit`` (the :class:`~fun_asr.audio.decode.Limits` field that was hit, or None),
    ``values`` (what the message says) and ``message`` (the :class:`Message`). ``str(exc)``: the Python API's
    words; :func:`render`: another front end's."""

    def __init__(self, code: str, template: str, *, option: str | None = None, limit: str | None = None,
                 **values: Any) -> None:
        if code not in CODES:
            raise ValueError(f"unknown error code {code!r}: accepted {', '.join(CODES)}")
        self.code, self.option, self.limit, self.values = code, option, limit, values
        self.message = Message(template, **values)
        super().__init__(self.message.render())

    def render(self, front: Front = "python", names: Mapping[str, str] | None = None) -> str:
        """This error in ``front``'s words (``names``: spellings of a protocol's own, e.g. ``{"hotwords":
        "HOTWORDS"}``)."""
        return self.message.render(front, names)

    source: str | None = None  # the input (a path, a recording's name) the message starts with (names_input)

    def __str__(self) -> str:
        return self.message.render()

    def __reduce__(self) -> tuple[Any, ...]:  # pickling (Ray, process pools) keeps the data
        return (_rebuild, (type(self), self.code, self.message.template, self.option, self.limit, self.values),
                None if self.source is None else {"source": self.source})


def _rebuild(cls: type[FunAsrError], code: str, template: str, option: str | None, limit: str | None,
             values: dict[str, Any]) -> FunAsrError:
    return cls(code, template, option=option, limit=limit, **values)


class OptionError(FunAsrError, ValueError):
    """An option's value is wrong, or a limit was hit (a ``ValueError``)."""


class OptionTypeError(FunAsrError, TypeError):
    """An option's value has the wrong type (a ``TypeError``)."""


class SetupError(FunAsrError, ValueError):
    """What was asked for needs something this Session or server lacks: a VAD, a speaker model, a device (a
    ``ValueError``)."""


class StateError(FunAsrError, RuntimeError):
    """A call that does not fit the object's state (a ``RuntimeError``)."""


class MissingFileError(FunAsrError, FileNotFoundError):
    """A file that should exist does not (a ``FileNotFoundError``)."""


class OutputExistsError(FunAsrError, FileExistsError):
    """An output exists and would be replaced (a ``FileExistsError``)."""


def literal(text: str) -> str:
    """``text`` (a path, anything a user gave) as a part of a template: said as it is in every front end."""
    return text.replace("{", "{{").replace("}", "}}")


def naming(exc: E, source: str) -> E:
    """``exc``, whose message starts with the input ``source`` (a path, a recording's name: ``"NAME: what is
    wrong"``), with that input as data: its ``source`` (:func:`names_input`)."""
    exc.source = source  # type: ignore[attr-defined]
    return exc


def names_input(exc: BaseException) -> str | None:
    """The input (a path, a recording's name) that ``exc``'s message names already, as data: the ``source`` that
    the raise site gave (:func:`naming`, :class:`~fun_asr.audio.decode.AudioError`), else an ``OSError``'s
    ``filename`` (the operating system's message ends with it); None: the message names no input, and a caller
    that reports it says which."""
    source = getattr(exc, "source", None)
    if isinstance(source, str):
        return source
    filename = exc.filename if isinstance(exc, OSError) else None
    return os.fsdecode(filename) if isinstance(filename, str | bytes | os.PathLike) else None


def options_field(names: Iterable[str]) -> str:
    """A template's fields for these option names, comma-separated (``"{o[a]}, {o[b]}"``): names, never values."""
    return ", ".join("{o[" + name + "]}" for name in names)


def _structured(value: Any) -> bool:
    return isinstance(value, FunAsrError | Message) or isinstance(getattr(value, "detail", None), Message) or (
        isinstance(value, Warning) and bool(value.args) and _structured(value.args[0]))


def render(error: object, front: Front = "python", names: Mapping[str, str] | None = None) -> str:
    """What ``error`` says in ``front``'s words: a :class:`FunAsrError`, a :class:`Message`, a
    :class:`~fun_asr.notices.Notice` that carries one (its ``detail``) or a warning issued with either, rendered
    for that front end; anything else as ``str()``."""
    if isinstance(error, FunAsrError | Message):
        return error.render(front, names)
    detail = getattr(error, "detail", None)
    if isinstance(detail, Message):
        return detail.render(front, names)
    if isinstance(error, Warning) and error.args and _structured(error.args[0]):
        return render(error.args[0], front, names)
    return str(error)


class FrontFilter(logging.Filter):
    """A logging filter that says a record's structured arguments (errors, notices: :func:`render`) in
    ``front``'s words; a record without any is left as it is."""

    def __init__(self, front: Front) -> None:
        super().__init__()
        self.front = front

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and any(_structured(a) for a in args):
            record.args = tuple(render(a, self.front) if _structured(a) else a for a in args)
        elif _structured(record.msg):
            record.msg = render(record.msg, self.front)
        return True


__all__ = ["CODES", "FRONTS", "PHRASES", "SETTINGS", "VALUES", "Front", "FrontFilter", "FunAsrError", "Message",
           "MissingFileError", "OptionError", "OptionTypeError", "OutputExistsError", "SetupError", "Spelling",
           "StateError", "literal", "names_input", "naming", "options_field", "render", "spell", "use_options"]
