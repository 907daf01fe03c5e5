"""What may reach a client of fun-asr-serve: no server-side path.

:class:`ClientWords` takes what may reach a client (HTTP JSON, error bodies, every WebSocket protocol's messages,
the web page's data): an error or notice is said in the client's words first (:func:`fun_asr.errors.render`: the
request fields and commands a client sends, else ``fun-asr-serve --flag``), then without any server-side path:
the model's file becomes the model's name as ``GET /v1/models`` lists it, and every other path on the server is
replaced by ``<path>`` (a leading ``PATH: `` is dropped). The server's own log keeps the paths.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fun_asr.errors import Front, render

HIDDEN = "<path>"  # what a client sees instead of a path on the server
# The realtime WebSocket protocol's own spellings: its commands (HOTWORDS:...)
REALTIME_NAMES: Mapping[str, str] = {"hotwords": "HOTWORDS"}

# what clients send (HTTP form fields, the ?api_key= query, the runtime WebSocket protocol's JSON fields): a
# message may spell these as name=value, the way a client writes them
REQUEST_FIELDS = frozenset({
    "file", "model", "language", "prompt", "response_format", "temperature", "stream", "itn", "hotwords", "spk",
    "timestamp_granularities", "include", "timestamp", "silence_schedule", "dynamic_silence", "max_end_silence_time",
    "api_key", "mode", "chunk_size", "chunk_interval", "encoder_chunk_look_back", "decoder_chunk_look_back",
    "wav_name", "wav_format", "audio_fs", "is_speaking", "is_finished", "is_end", "svs_itn", "svs_lang"})


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
    """Server messages as a client may see them (see the module): ``words(msg)`` (``msg``: an error, a notice or
    a string; ``front``: ``"http-client"`` or ``"websocket"``, ``names``: a protocol's own spellings, see
    :func:`fun_asr.errors.render`); ``words.fields(obj)`` for a WebSocket message's ``error``, ``warning``,
    ``notice`` and ``warnings`` fields.

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

    def __call__(self, msg: object, *, front: Front = "http-client", names: Mapping[str, str] | None = None) -> str:
        if self._sources() != self._seen:  # a speaker model loaded since: its path is hidden too
            self._build()
        msg = render(msg, front, names)
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

    def fields(self, obj: Any, *, names: Mapping[str, str] | None = None) -> Any:
        """A WebSocket message (a dict) with its message fields in the client's words (a new dict when any
        changed; the same object otherwise)."""
        if not isinstance(obj, dict) or not any(k in obj for k in self.FIELDS):
            return obj
        out = dict(obj)
        for k in self.FIELDS:
            v = out.get(k)
            if isinstance(v, str):
                out[k] = self(v, front="websocket", names=names)
            elif isinstance(v, list):
                out[k] = [self(x, front="websocket", names=names) if isinstance(x, str) else x for x in v]
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


__all__ = ["HIDDEN", "REALTIME_NAMES", "REQUEST_FIELDS", "ClientWords"]
