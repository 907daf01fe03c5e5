"""FunASR's realtime WebSocket protocol (1.4.16 ``funasr/bin/realtime_ws.py``, docs/streaming.md) over ``Stream``.

Client -> server, text (commands are case-insensitive, as FunASR's):

- ``START`` opens a stream. ``STOP`` ends it: always one result with ``is_final: true`` (also when no
  audio came: then with no sentences), then ``{"event": "stopped"}``.
- ``HOTWORDS:a,b`` (commas or line breaks; replaces the server's ``--hotword-file`` words for this
  connection; ``HOTWORDS:`` clears them) -> ``{"event": "hotwords_set", "hotwords": [...]}``.
- ``LANGUAGE:x`` (empty: automatic; replaces the server's ``--language``) -> ``{"event": "language_set",
  "language": "x"}`` (as sent).
- ``POSTPROCESS_HOTWORDS:wrong=>right,...`` (``=>``, ``->`` or ``→``; a bare word maps to itself; lines
  starting with ``#`` are skipped) -> ``{"event": "postprocess_hotwords_set", "postprocess_hotwords":
  {wrong: right}}``: text replacements in each closed sentence (longest key first), never in partials, on
  top of the server's ``--postprocess-hotword-file``; they do not bias decoding.
- ``COMMIT`` (only with ``--endpoint-mode client``: no VAD runs and the client ends each utterance) ->
  one ``is_final`` result holding that utterance's sentence; the stream goes on. In that mode STOP's
  final result comes when audio arrived after the last COMMIT, or when the stream has had none yet. An
  utterance that reaches 30 s (the longest sentence, ``StreamOptions.max_sentence_s``) without COMMIT is
  committed there by the server: its final result, as COMMIT's, adds ``"notice"`` saying so (FunASR does not
  bound it: its buffer grows until COMMIT). Without the mode: ``{"event": "error", "error": "COMMIT requires
  --endpoint-mode client"}``.
- ``SPK:true`` / ``SPK:false`` turn the speakers of this connection's sentences on or off (``--enable-spk``
  turns them on for every connection, as FunASR's server) -> ``{"event": "spk_set", "spk": true}``. On, each
  locked sentence carries ``"spk"`` (0, 1, ...) as it closes (FunASR's ``HybridSpeakerTracker``: the sentence's
  CAM++ windows clustered with the last 128, ids kept stable by matching speaker centres), and the final result
  (STOP; COMMIT with client endpoints) is re-clustered over all of them, a sentence two speakers share being
  split. ``SPK:true`` on a server without a speaker model gets an error event naming ``--speaker-model``. It
  applies from the next sentence on.

Client -> server, binary (after START): 16 kHz mono little-endian int16 PCM, frames of any size up to the
server's upload limit (``--max-upload-mb``; larger frames close the connection with code 1009): a
recording may come as one frame or many. Server -> client: the events above, ``{"event": "error",
"error": ...}`` (the connection stays usable), and results ``{"sentences": [{"text", "start", "end",
"confidence"}],
"partial", "partial_start_ms", "duration_ms", "is_final"}`` (``sentences`` cumulative; with client
endpoints a result holds the current utterance's sentences only, as FunASR's). ``confidence`` (fun-asr's, a key
FunASR's clients do not read): the sentence's exp(mean token log-probability), in (0, 1].

No audio is refused or dropped. A frame is split into pieces of at most 1 s that wait in a queue of
``buffer_seconds`` of audio; while it is full the server stops reading the connection (TCP back-pressure:
the client's sends wait), so a stream that falls behind is transcribed completely, later. Only an explicit
limit ends a stream, with an error event naming it: ``max_seconds`` of audio (the audio past it is not
transcribed; the stream gets its final result) or ``idle_seconds`` without a message (the open stream gets
its final result, then the connection closes). Read ahead per connection: that queue, the frame being split
into it, and the next message in uvicorn (two with its legacy ``websockets`` implementation, whose
``ws_max_queue`` is 1 here, not 32: :func:`uvicorn_ws_options`).

A client that reads results slower than they come gets the newest: a non-final result not yet sent is
replaced by the next (results are cumulative; events and final results are never replaced). What waits to be
sent is bounded (``OUTBOX_MAX_EVENTS`` 256 events or ``OUTBOX_MAX_BYTES`` 1 MB): past it the server stops
reading the connection until the client reads (the same back-pressure), and when nothing could be sent for
``idle_seconds`` meanwhile the connection ends (close 1008, access-log reason ``client not reading``). Only
the first unknown command's error lists the accepted commands. Keepalive pings cannot be answered while
reading waits, so the server's ping timeout is off by default (FunASR's ``--ws-ping-timeout 0``) and
FunASR's clients connect with ``ping_interval=None``. Decoding goes through the server's shared batched
decoder, so concurrent streams share decoding passes. Every connection writes one JSON line to the
``fun_asr.access`` log.
"""

from __future__ import annotations

from typing import Any

from fun_asr.audio.decode import SAMPLE_RATE

PIECE_BYTES = SAMPLE_RATE * 2  # frames enter a stream's queue in pieces of at most 1 s of audio
SPK_ON, SPK_OFF = ("true", "1", "on", "yes"), ("false", "0", "off", "no")
COMMANDS = ("START, STOP, HOTWORDS:a,b, LANGUAGE:x, POSTPROCESS_HOTWORDS:wrong=>right, COMMIT (--endpoint-mode "
            "client), SPK:true|false, and binary 16 kHz mono int16 PCM frames")


def error_event(message: str) -> dict[str, Any]:
    """An error in this protocol's shape: ``{"event": "error", "error": ...}`` (the connection stays usable)."""
    return {"event": "error", "error": message}


def recognises(first: dict[str, Any]) -> bool:  # noqa: ARG001 - the fallback: any first message
    """Any first message: the realtime protocol is the server's fallback (``START``, ``LANGUAGE:x``, binary
    audio, ...)."""
    return True


__all__ = ["COMMANDS", "PIECE_BYTES", "error_event", "recognises"]
