"""FunASR's runtime WebSocket protocol (funasr-runtime's 2pass server: online, offline, 2pass) over ``Stream``:
its messages, their fields and how they are checked. The server's table of WebSocket protocols
(``serve/app.py``) gives a connection to this protocol when its first message is a JSON object
(:func:`recognises`); the connection itself: :mod:`fun_asr.serve.protocols.funasr_runtime.serving`.

Client -> server (as ``runtime/python/websocket/funasr_wss_client.py`` and ``runtime/html5`` send it):

- a JSON object with any of ``mode`` (``online`` | ``offline`` | ``2pass``, default 2pass), ``chunk_size``
  (``[5, 10, 5]``: 60 ms units; the middle one sets how often the online pass decodes), ``chunk_interval``,
  ``encoder_chunk_look_back``, ``decoder_chunk_look_back`` (streaming-Paraformer settings: checked, no
  effect here), ``wav_name``, ``wav_format`` (``pcm``, any case: raw 16-bit little-endian mono at
  ``audio_fs``; anything else, or PCM that starts with a RIFF/WAVE header, is a file decoded when it ends),
  ``audio_fs`` (PCM rate, resampled to 16 kHz with soxr), ``is_speaking``, ``hotwords`` (a JSON string of
  ``{word: weight}``, a JSON list, or a plain comma/line separated string; weights have no effect on
  Fun-ASR-Nano's prompt hotwords), ``itn``, ``svs_itn`` (used when ``itn`` is absent), ``svs_lang``
  (``auto`` or a language);
- binary frames of audio (PCM may split samples across frames);
- ``{"is_speaking": false}`` (or ``"is_finished": true``) ends the utterance; with ``"is_end": true`` (the
  newest client) the server also acknowledges it once everything is sent:
  ``{"mode", "wav_name", "text": "", "is_final": <no error>, "is_end": true[, "error"]}``. The connection
  stays open for another utterance with the same settings.

Server -> client: ``{"mode", "text", "wav_name", "is_final"}`` with ``mode`` ``2pass-online`` (the online
pass: new text of the open sentence, appended to what was sent, as the clients concatenate it),
``2pass-offline`` (the offline pass: the whole sentence, decoded in full by Fun-ASR-Nano once the VAD closes
it, replacing its online text), or ``online`` / ``offline`` in those modes. ``is_final`` is true on the last
message of an utterance only (after ``is_speaking: false``; an empty ``text`` when nothing was left). With a
CTC head (the ModelScope checkpoint) offline-pass messages also carry ``timestamp``, a JSON *string*
``"[[start_ms,end_ms],...]"`` with one pair per unit the html5 page counts (a word of ASCII letters, else a
character), and ``stamp_sents``, ``[{"text_seg", "punc", "start", "end", "ts_list"}]``. Offline-pass messages
carry fun-asr's ``confidence`` (the sentence's exp(mean token log-probability), in (0, 1]): a top-level key that
FunASR's clients (python, html5, C++, Java, Go, C#, Android) neither read nor reject. Problems give
``"error"`` (and ``"warning"``) fields in these messages; nothing is dropped silently.

Limits are the realtime protocol's (docs/funasr_compat.md): ``--max-streams`` counts a connection from its
accept, ``--stream-max-seconds`` ends an utterance as the realtime protocol ends a stream (the connection stays open),
and the read-ahead is bounded by ``--stream-buffer-seconds`` of audio and ``MAX_QUEUED_TEXTS`` text messages.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fun_asr.asr.prompt import split_hotwords
from fun_asr.audio.decode import SAMPLE_RATE

MODES = ("online", "offline", "2pass")
OUT_MODES = {"online": ("online", "online"), "offline": ("offline", "offline"),
             "2pass": ("2pass-online", "2pass-offline")}  # (online pass, offline pass)
DEFAULT_WAV_NAME = "wav-default-id"  # funasr-runtime's default
MAX_QUEUED_TEXTS = 64  # text messages read ahead of the worker; past it (or the audio bound) reading waits
MAX_WAV_NAME = 256  # characters of wav_name kept (it is echoed in every reply): a longer one is cut, with a warning
MAX_NAMED = 64  # unknown field names remembered per connection (each is named in one warning)
# known FunASR fields that have nothing to do here (accepted as FunASR's servers accept them)
NO_EFFECT = ("chunk_interval", "encoder_chunk_look_back", "decoder_chunk_look_back")
KNOWN_FIELDS = {"mode", "chunk_size", "wav_name", "wav_format", "audio_fs", "is_speaking", "is_finished", "is_end",
          "hotwords", "itn", "svs_itn", "svs_lang", *NO_EFFECT}
# containers soundfile cannot read: refused when announced, instead of after the whole upload
_UNREADABLE = {"m4a", "mp4", "aac", "amr", "wma", "webm", "mkv", "mov", "avi", "3gp", "mpeg", "ts"}
FILE_FORMATS = "wav, flac, ogg (vorbis/opus), mp3, aiff, or 'others' for any of these"


# -- settings -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RuntimeConfig:
    mode: str = "2pass"
    chunk_size: tuple[int, int, int] = (5, 10, 5)
    wav_name: str = DEFAULT_WAV_NAME
    wav_format: str = "pcm"
    audio_fs: int = SAMPLE_RATE
    hotwords: tuple[str, ...] = ()
    itn: bool = True
    language: str | None = None

    @property
    def pcm(self) -> bool:
        return self.wav_format.lower() == "pcm"

    @property
    def online_ms(self) -> int:
        """How often the online pass decodes the open sentence: the streaming model's chunk (chunk_size[1] x
        60 ms, 600 ms for [5, 10, 5])."""
        return max(60, self.chunk_size[1] * 60)


# fields that shape a running utterance: a change mid-utterance applies from the next one
PER_UTTERANCE = ("mode", "chunk_size", "wav_format", "audio_fs", "hotwords", "itn", "language")


def form_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ValueError(f"{name} must be true or false, got {value!r}")


def field_int(name: str, value: Any, low: int, high: int | None = None) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        top = f" and at most {high}" if high is not None else ""
        raise ValueError(f"{name} must be an integer of at least {low}{top}, got {value!r}")
    return value


def parse_chunk_size(value: Any) -> tuple[int, int, int]:
    parts = value.split(",") if isinstance(value, str) else value
    try:
        if not isinstance(parts, list | tuple) or len(parts) != 3:
            raise ValueError
        nums = tuple(field_int("chunk_size", p.strip() if isinstance(p, str) else p, 0) for p in parts)
    except ValueError:
        nums = ()
    if len(nums) != 3 or nums[1] < 1:
        raise ValueError(f"chunk_size must be three integers [look-back, chunk, look-ahead] in 60 ms units with a "
                         f"chunk of at least 1 (e.g. [5, 10, 5]), got {value!r}")
    return nums  # type: ignore[return-value]


def _weighted(d: dict) -> list[str]:
    words = []
    for word, weight in d.items():
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise ValueError(f"hotwords: the weight of {str(word)[:20]!r} must be a number ({{\"word\": 20}}), "
                             f"got {weight!r}")
        words.append(str(word))
    return words


def parse_hotwords(value: Any) -> list[str]:
    """The words of FunASR's ``hotwords`` field: a JSON string of ``{word: weight}`` (html5, the client with a
    hotword file), a JSON list of words, a plain string separated by commas or line breaks (the newest client
    joins its file's words with commas), or the same as a JSON value; empty or null -> none."""
    if value is None:
        return []
    if isinstance(value, dict):
        return _weighted(value)
    if isinstance(value, list):
        if not all(isinstance(w, str) for w in value):
            raise ValueError("hotwords: a list must hold strings")
        return [w.strip() for w in value if w.strip()]
    if not isinstance(value, str):
        raise ValueError(f"hotwords must be a string ('{{\"word\": 20}}' or 'a,b'), got {type(value).__name__}")
    text = value.strip()
    if text[:1] in ("{", "["):
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError:
            parsed = None  # a plain string that starts with a bracket (funasr-runtime: its "nn" hotwords)
        if isinstance(parsed, dict | list):
            return parse_hotwords(parsed)
    return split_hotwords(text)


MISSING = object()


def raise_field(msg: str) -> Any:
    raise ValueError(msg)


def parse_wav_format(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"wav_format must be a string (pcm, or a file type such as wav or mp3), got {value!r}")
    fmt = value.strip()
    if fmt.lower().lstrip(".") in _UNREADABLE:
        raise ValueError(f"wav_format {fmt!r} cannot be decoded here: send pcm (raw 16-bit little-endian mono "
                         f"at audio_fs) or a file of {FILE_FORMATS}")
    return fmt



def error_message(message: str) -> dict[str, Any]:
    """An error before any setting arrived, in this protocol's shape: an utterance's failed acknowledgement."""
    return {"mode": "2pass", "text": "", "wav_name": DEFAULT_WAV_NAME, "is_final": False, "is_end": True,
            "error": message}


def recognises(first: dict[str, Any]) -> bool:
    """Whether a connection's first message is this protocol's: a text message holding a JSON object."""
    text = first.get("text")
    return text is not None and text.lstrip().startswith("{")


__all__ = ["DEFAULT_WAV_NAME", "MAX_QUEUED_TEXTS", "MODES", "OUT_MODES", "error_message", "parse_hotwords",
           "recognises"]
