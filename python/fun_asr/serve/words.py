"""What fun-asr-serve says, in its own words.

Two translations at the server's boundary (the Python API keeps its wording; :mod:`fun_asr.asr.messages`
does the same for the other commands):

- :func:`server_words`: a Session message with the Python API's spellings (``vad_model=``, ``vad=None``,
  ``Session(...)``, ``StreamOptions(...)``, ``diarize=True``, ``speaker_model=``, ``fun_asr.system_info()``,
  ``Limits`` fields) replaced by fun-asr-serve's flags, or by the request field / protocol command a client
  sends. For the server's console (startup errors, its log) and, through :class:`ClientWords`, its clients.
- :class:`ClientWords`: what may reach a client (HTTP JSON, error bodies, every WebSocket protocol's messages,
  the web page's data): :func:`server_words`, then no server-side path: the model's file becomes the model's
  name as ``GET /v1/models`` lists it, and every other path on the server is replaced by ``<path>`` (a
  leading ``PATH: `` is dropped). The server's own log keeps the paths.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

PROG = "fun-asr-serve"
HIDDEN = "<path>"  # what a client sees instead of a path on the server

# the Session's hint on where speakers come from, per place the user asked for them
SPEAKERS_CONSOLE = "--enable-spk / spk=true"
SPEAKERS_REQUEST = "spk=true"
SPEAKERS_REALTIME = "SPK:true"

_NO_VAD_HINT = "start fun-asr-serve with --vad fsmn and --vad-model, or give a model that embeds its VAD"
# exact phrases first (the rest is generic)
_PHRASES = (
    (" (Session(limits=Limits(max_hotwords=...)))", ""),
    ("this Session has no VAD model (Session(vad='fsmn', vad_model=...))",
     f"this server has no FSMN-VAD ({_NO_VAD_HINT})"),
    ("vad=True but this Session has no VAD model", "this server has no FSMN-VAD"),
    ("(StreamOptions(endpoint='client')); this stream's VAD ends them itself",
     "(fun-asr-serve --endpoint-mode client); this server's VAD ends them itself"),
    ("commit() ends utterances in client endpoint mode", "COMMIT ends utterances in client endpoint mode"),
)
_STREAM_NEEDS_VAD = re.compile(r"streaming needs the FSMN-VAD: create the Session with .*", re.S)
_SYSTEM_INFO = "(this build's backends: see fun_asr.system_info())"
# what clients send (HTTP form fields, the ?api_key= query, the runtime WebSocket protocol's JSON fields): a
# message may spell these as name=value, the way a client writes them
REQUEST_FIELDS = frozenset({
    "file", "model", "language", "prompt", "response_format", "temperature", "stream", "itn", "hotwords", "spk",
    "timestamp_granularities", "include", "timestamp", "silence_schedule", "dynamic_silence", "max_end_silence_time",
    "api_key", "mode", "chunk_size", "chunk_interval", "encoder_chunk_look_back", "decoder_chunk_look_back",
    "wav_name", "wav_format", "audio_fs", "is_speaking", "is_finished", "is_end", "svs_itn", "svs_lang"})
_FIELD_BOOL = re.compile(rf"\b({'|'.join(sorted(REQUEST_FIELDS))})=(True|False)\b")
# " (vad_model=)", " (vad=None)", " (model=)", " (overwrite=True)": a flag's Python spelling after the flag, dropped;
# one that also names a flag, "(diarize=True, --diarize, spk=true)", is rewritten as a whole instead, and a request
# field with its value, "(spk=true)", "(dynamic_silence=False)", is kept (see _FIELD_BOOL)
_PY_PARENS = re.compile(rf" ?\((?!(?:{'|'.join(sorted(REQUEST_FIELDS))})=[^\s()])[a-z_]+=[^()]*\)")


def _backends() -> str:
    try:
        from fun_asr import _core

        return ", ".join(_core.system_info()["registered_backends"]) or "none"
    except Exception:  # noqa: BLE001 - a message must not fail
        return "see fun-asr-serve --device"


def server_words(msg: str, *, speakers: str = SPEAKERS_CONSOLE, client: bool = False) -> str:
    """``msg`` (a Session, audio or converter message) in fun-asr-serve's words: its flags (``client``: as
    ``fun-asr-serve --flag``, for a client that did not type them) and, for speakers, ``speakers`` (how the
    user asked for them: ``--enable-spk``, the request field ``spk=true``, the realtime command
    ``SPK:true``). Paths are left as they are (see :class:`ClientWords`)."""
    flag = f"{PROG} " if client else ""
    # first the parenthesized Python spellings (those that also name a flag are rewritten as a whole below)
    msg = _PY_PARENS.sub(lambda m: m.group(0) if "--" in m.group(0) else "", msg)
    msg = msg.replace("(diarize=True, --diarize, spk=true)", f"({speakers})")
    msg = msg.replace("diarize=True / --diarize", speakers)
    msg = msg.replace("(speaker_model= / --speaker-model:", f"({flag}--speaker-model:")
    for old, new in _PHRASES:
        msg = msg.replace(old, new)
    msg = _STREAM_NEEDS_VAD.sub(f"streaming needs the FSMN-VAD: {_NO_VAD_HINT}, or use --endpoint-mode client "
                                "(the client ends each utterance with COMMIT)", msg)
    msg = msg.replace(_SYSTEM_INFO, f"(this build's backends: {_backends()})")
    msg = msg.replace("use the cpu or auto device", f"use {flag}--device cpu or --device auto")
    msg = msg.replace("(Limits.max_audio_seconds)", f"({flag}--max-audio-seconds)")
    msg = re.sub(r"\bsegment_seconds\b", f"{flag}--max-segment-seconds", msg)
    msg = re.sub(r"\bmax_new_tokens\b", f"{flag}--max-new-tokens", msg)
    msg = re.sub(r"\bmax_audio_seconds\b", f"{flag}--max-audio-seconds", msg)
    if client:  # "dynamic_silence=True": the request field as a client sends it
        msg = _FIELD_BOOL.sub(lambda m: f"{m.group(1)}={m.group(2).lower()}", msg)
    return msg


# -- paths ------------------------------------------------------------------------------------------------

_QUOTED = re.compile(r"""(?P<q>['"])(?P<body>[^'"\n]+)(?P=q)""")
# an absolute path (POSIX, ~/..., or a Windows drive) as a token: up to whitespace, a quote or , ; ( ) and a
# ':' that ends it ("PATH: message"); never part of a URL ("http://host/x", "ws://host:10095/")
_TOKEN = re.compile(r"""(?<![\w/.~:\\-])(?:~[/\\]|/|[A-Za-z]:\\)[^\s'",;()<>]*?(?=[:,;).]?(?:\s|$)|['"(),;<>])""")


def _roots() -> frozenset[str]:
    """The top-level folders of this machine (``/home``, ``/tmp``, ...): a ``/x/...`` token whose first part is
    one of them is a path on the server; ``/v1/audio/transcriptions`` or ``/asr`` is a route."""
    try:
        return frozenset(e.name for e in os.scandir("/") if e.is_dir(follow_symlinks=False) or e.is_symlink())
    except OSError:
        return frozenset()


class ClientWords:
    """Server messages as a client may see them (see the module): ``words(msg)``; ``words.fields(obj)`` for a
    WebSocket message's ``error``, ``warning``, ``notice`` and ``warnings`` fields.

    ``session``: the server's Session (its model file, VAD and speaker-model sources; any object: what it
    lacks is skipped), ``model_id``: the model's name as ``GET /v1/models`` lists it."""

    FIELDS = ("error", "warning", "notice", "warnings", "message", "detail")

    def __init__(self, session: Any = None, model_id: str | None = None, extra_paths: Iterable[Any] = ()) -> None:
        self.model_id = model_id or "the model"
        self._session, self._extra = session, tuple(extra_paths)
        self._roots = _roots()
        self._build()

    def _sources(self) -> tuple[Any, Any]:
        """Where the Session's VAD and speaker model came from (the speaker model loads on first use)."""
        return getattr(self._session, "vad_source", None), getattr(self._session, "speaker_source", None)

    def _build(self) -> None:
        session = self._session
        self._seen = self._sources()
        named: dict[str, str] = {}  # exact strings -> what a client sees
        model = getattr(session, "path", None)
        arg = getattr(session, "_model_arg", None)
        for p in (model, arg):
            if _is_local(p):
                for form in _forms(p):
                    named[form] = self.model_id
        for src in (*self._seen, *self._extra):
            text = None if src is None else str(src).split("=", 1)[-1]  # "FUN_ASR_VAD_MODEL=/path"
            if _is_local(text):  # (not "embedded", nor a hub repo id such as funasr/fsmn-vad)
                for form in _forms(text):
                    named.setdefault(form, HIDDEN)
        # folders whose contents are the server's own (anything under them): the caches, home, temp, cwd
        dirs: list[str] = []
        try:
            from fun_asr.converter.hub import cache_dir

            dirs.append(str(cache_dir()))
        except Exception:  # noqa: BLE001
            pass
        for d in (os.environ.get("HF_HUB_CACHE"), os.environ.get("HF_HOME"), os.environ.get("XDG_CACHE_HOME"),
                  tempfile.gettempdir(), str(Path.home()), os.getcwd()):
            if d:
                dirs.append(d)
        for d in dirs:
            for form in _forms(d):
                if len(form) > 1:
                    named.setdefault(form, HIDDEN)
        # longest first: a model file inside the cache is the model, not the cache; each as a whole path ("/root"
        # is not the start of "/rootfs")
        self._names = _alternation(k for k, v in named.items() if v != HIDDEN)
        self._hidden = _alternation(k for k, v in named.items() if v == HIDDEN)

    def __call__(self, msg: str, *, speakers: str = SPEAKERS_REQUEST) -> str:
        if self._sources() != self._seen:  # a speaker model loaded since: its path is hidden too
            self._build()
        msg = server_words(str(msg), speakers=speakers, client=True)
        if self._names is not None:
            msg = self._names.sub(self.model_id, msg)
        msg = _QUOTED.sub(lambda m: m.group("q") + HIDDEN + m.group("q") if self._is_path(m.group("body").strip())
                          else m.group(0), msg)
        if self._hidden is not None:
            # a folder of the server's continues into the path under it ("<cache>/models/x.gguf"): all hidden
            msg = self._hidden.sub(HIDDEN, msg)
            msg = re.sub(re.escape(HIDDEN) + r"""[^\s'",;:()<>]*""", HIDDEN, msg)
        msg = _TOKEN.sub(lambda m: HIDDEN if self._is_path(m.group(0)) else m.group(0), msg)
        # "PATH: message" (the Session's messages about a file): the message, about this request
        msg = re.sub(rf"^(?:{re.escape(HIDDEN)}:\s+)+", "", msg)
        msg = re.sub(rf"(?<=[:;(]\s){re.escape(HIDDEN)}:\s+", "", msg)
        return msg

    def _is_path(self, s: str) -> bool:
        if not s or s == HIDDEN:
            return False
        if s.startswith(("~/", "~\\")) or re.match(r"[A-Za-z]:\\", s):
            return True
        if not s.startswith("/") or s.startswith("//"):
            return False
        first = s[1:].split("/", 1)[0]
        return bool(first) and first in self._roots

    def fields(self, obj: Any, *, speakers: str = SPEAKERS_REALTIME) -> Any:
        """A WebSocket message (a dict) with its message fields in the client's words (a new dict when any
        changed; the same object otherwise)."""
        if not isinstance(obj, dict) or not any(k in obj for k in self.FIELDS):
            return obj
        out = dict(obj)
        for k in self.FIELDS:
            v = out.get(k)
            if isinstance(v, str):
                out[k] = self(v, speakers=speakers)
            elif isinstance(v, list):
                out[k] = [self(x, speakers=speakers) if isinstance(x, str) else x for x in v]
        return out


def _is_local(p: Any) -> bool:
    """Whether ``p`` names a file or folder on this machine (an absolute path, or one that exists)."""
    if p is None or str(p) in ("", "."):
        return False
    try:
        path = Path(str(p)).expanduser()
        return path.is_absolute() or path.exists()
    except (OSError, ValueError):
        return False


def _alternation(strings: Iterable[str]) -> re.Pattern[str] | None:
    """One pattern for these strings, longest first, each a whole path (not followed by more of a name)."""
    ordered = sorted(set(strings), key=len, reverse=True)
    return re.compile("|".join(re.escape(k) + r"(?![\w.-])" for k in ordered)) if ordered else None


def _forms(p: Any) -> set[str]:
    """The spellings of a path a message may use: as given, absolute, resolved, with ``~`` for the home."""
    forms = {str(p)}
    try:
        path = Path(str(p)).expanduser()
        forms.add(str(path))
        forms.add(str(path.absolute()))
        forms.add(str(path.resolve()))
    except (OSError, RuntimeError, ValueError):
        pass
    home = str(Path.home())
    for f in list(forms):
        if home not in ("/", "") and f.startswith(home + os.sep):
            forms.add("~" + f[len(home):])
    return {f for f in forms if f and f not in (".", os.sep)}


__all__ = ["HIDDEN", "REQUEST_FIELDS", "SPEAKERS_CONSOLE", "SPEAKERS_REALTIME", "SPEAKERS_REQUEST", "ClientWords",
           "server_words"]
