"""The WebSocket streams' limits and server-wide defaults (FunASR's realtime-server flags), shared by every
WebSocket protocol: :class:`RealtimeLimits`, built and checked by :func:`realtime_limits`; and uvicorn's
WebSocket settings (:func:`uvicorn_ws_options`)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fun_asr.asr.option_table import OPTIONS, default
from fun_asr.asr.options import check_hotwords, check_lengths
from fun_asr.errors import FunAsrError, render, spell
from fun_asr.serve.core.hotword_files import read_hotword_file, read_postprocess_hotword_file

log = logging.getLogger("fun_asr.server")

DEFAULT_HOTWORD_FILE = "热词列表"  # FunASR's --hotword-file default: read when it exists in the working folder
ENDPOINT_MODES = ("server", "client")


@dataclass(frozen=True)
class RealtimeLimits:
    """Per-connection limits and the server-wide stream defaults (FunASR's realtime-server flags);
    :func:`realtime_limits` builds one from the flags and checks it against the Session."""

    max_streams: int = 16  # concurrent connections; more are refused with an error event (close 1013)
    idle_seconds: float = 60.0  # no message for this long (while the server is reading) closes the connection
    max_seconds: float = 4 * 3600.0  # audio per stream
    buffer_seconds: float = 30.0  # audio read but not processed yet, per stream; past it reading waits
    language: str | None = None  # --language (a normalized code); LANGUAGE: replaces it per connection
    hotwords: tuple[str, ...] = ()  # --hotword-file; HOTWORDS: replaces them per connection
    postprocess_hotwords: tuple[tuple[str, str], ...] = ()  # --postprocess-hotword-file (wrong, right)
    endpoint_mode: str = "server"  # --endpoint-mode: "server" (the VAD ends sentences) or "client" (COMMIT)
    enable_spk: bool = False  # --enable-spk: every stream's sentences carry speakers (SPK:false turns them off)


@dataclass(frozen=True)
class RealtimeFlags:
    """fun-asr-serve's realtime flags as :func:`realtime_limits` takes them (keyword arguments of the same
    names)."""

    max_new_tokens: int = OPTIONS["max_new_tokens"].default
    max_streams: int = 16
    idle_seconds: float = 60.0
    max_seconds: float = 4 * 3600.0
    buffer_seconds: float = 30.0
    language: str | None = None
    hotword_file: str | os.PathLike[str] | None = None
    postprocess_hotword_file: str | os.PathLike[str] | None = None
    endpoint_mode: str = "server"
    enable_spk: bool = False


def realtime_limits(session: Any, **flags: Any) -> RealtimeLimits:
    """The realtime limits and server-wide defaults from FunASR's flags (:class:`RealtimeFlags`' fields as
    keywords), checked against the Session (ValueError naming the flag). ``hotword_file`` None reads FunASR's
    default ``热词列表`` when it exists in the working folder (logged)."""
    f = RealtimeFlags(**flags)
    if isinstance(f.max_streams, bool) or not isinstance(f.max_streams, int) or f.max_streams < 1:
        raise ValueError(f"--max-streams must be a positive integer, got {f.max_streams!r}")
    for name, value in (("--stream-idle-seconds", f.idle_seconds), ("--stream-max-seconds", f.max_seconds),
                        ("--stream-buffer-seconds", f.buffer_seconds)):
        if not value > 0:
            raise ValueError(f"{name} must be positive, got {value:g}")
    if f.endpoint_mode not in ENDPOINT_MODES:
        raise ValueError(f"--endpoint-mode must be 'server' (the VAD ends sentences) or 'client' (the client sends "
                         f"COMMIT), got {f.endpoint_mode!r}")
    words = _server_hotwords(f.hotword_file)
    pairs = read_postprocess_hotword_file(f.postprocess_hotword_file) if f.postprocess_hotword_file is not None \
        else {}
    code = _flagged("--language", session.normalize_language, f.language)
    _flagged("--hotword-file", check_hotwords, words, session.limits)
    # (--max-new-tokens: named by the message itself)
    check_lengths(f.max_new_tokens, default("segment_seconds"), session.max_segment_seconds, session.limits)
    # the prompt with these hotwords + max_new_tokens within the decoder's context: the hotwords' share
    _flagged("--hotword-file", session.options, code, True, words, f.max_new_tokens)
    if f.enable_spk:
        try:
            session.options(diarize=True)  # the speaker model: loaded now, or the reason there is none
        except (ValueError, OSError) as exc:
            raise ValueError(f"--enable-spk: {render(exc, 'server-console')}") from None
    return RealtimeLimits(f.max_streams, float(f.idle_seconds), float(f.max_seconds), float(f.buffer_seconds), code,
                          tuple(words), tuple(pairs.items()), f.endpoint_mode, bool(f.enable_spk))


def _server_hotwords(hotword_file: str | os.PathLike[str] | None) -> list[str]:
    """--hotword-file's words; without one FunASR's default file in the working folder, when there."""
    if hotword_file is not None:
        words = read_hotword_file(hotword_file)
        log.info("loaded %d hotwords from %s", len(words), hotword_file)
        return words
    if Path(DEFAULT_HOTWORD_FILE).is_file():  # FunASR's default, as FunASR reads it
        words = read_hotword_file(DEFAULT_HOTWORD_FILE)
        log.warning("read %d hotwords from ./%s (FunASR's default --hotword-file)", len(words), DEFAULT_HOTWORD_FILE)
        return words
    return []


def _flagged(flag: str, check: Callable[..., Any], *args: Any) -> Any:
    """``check(*args)``; its ValueError or TypeError as a ValueError in the server's words that names its ``flag``
    (an error about the flag's own option names it already)."""
    try:
        return check(*args)
    except FunAsrError as exc:
        said = render(exc, "server-console")
        raise ValueError(said if spell(exc.option or "", "server-console") == flag else f"{flag}: {said}") from None
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{flag}: {exc}") from None


def uvicorn_ws_options(max_upload_mb: float, ping_interval: float = 20.0, ping_timeout: float = 0.0) -> dict[str, Any]:
    """uvicorn.Config's WebSocket settings: the largest message is the upload limit (a recording may come as
    one frame); uvicorn's legacy ``websockets`` implementation queues at most one received message for the
    handler (``ws_max_queue`` 1; its default, 32, would let one connection park 32 frames of up to the upload
    limit each before the server's back-pressure starts; the websockets-sansio implementation, uvicorn's
    default, and wsproto pause the socket after each message anyway); pings every ``ping_interval`` s; no
    ping timeout unless asked (``<= 0``: off, FunASR's default), since a stream that falls behind is not
    read (back-pressure) and cannot answer a ping."""
    return {"ws_max_size": max(1, int(max_upload_mb * 1024 * 1024)),
            "ws_max_queue": 1,
            "ws_ping_interval": ping_interval if ping_interval > 0 else None,
            "ws_ping_timeout": ping_timeout if ping_timeout > 0 else None}


__all__ = ["DEFAULT_HOTWORD_FILE", "ENDPOINT_MODES", "RealtimeFlags", "RealtimeLimits", "realtime_limits",
           "uvicorn_ws_options"]
