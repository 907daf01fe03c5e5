"""Session/audio error messages in a user's words (CLI flags, request fields), not Python names or ``Limits``."""

from __future__ import annotations

import re

_HOTWORD_LIMITS = (re.compile(r"^\d+ hotwords; at most \d+ are accepted"),
                   re.compile(r"^hotword .* characters; at most"))


def cli_words(msg: str, *, segment_flag: str = "--segment-seconds", max_audio_flag: str | None = None,
              hotwords: str = "--hotwords") -> str:
    """``msg`` with the Python names a command-line user cannot act on replaced by the command's flags.

    ``max_audio_flag``: the flag that sets ``Limits.max_audio_seconds`` (None: the command has none, and
    the hint is dropped). ``hotwords``: what the user gave the hotwords with (a flag, a protocol command).
    """
    msg = msg.replace(" (Session(limits=Limits(max_hotwords=...)))", "")
    msg = msg.replace(" (Limits.max_audio_seconds)", f" ({max_audio_flag})" if max_audio_flag else "")
    msg = msg.replace("(Limits.max_audio_seconds)", f"({max_audio_flag})" if max_audio_flag else "")
    if any(p.search(msg) for p in _HOTWORD_LIMITS):
        msg = f"{hotwords}: {msg}"
    msg = re.sub(r"\bsegment_seconds\b", segment_flag, msg)
    msg = re.sub(r"\bmax_new_tokens\b", "--max-new-tokens", msg)
    msg = msg.replace("(diarize=True, --diarize, spk=true)", "(--diarize)")
    msg = msg.replace("(speaker_model= / --speaker-model:", "(--speaker-model:")
    msg = msg.replace("diarize=True / --diarize", "--diarize")
    msg = re.sub(r"\b(num|min|max)_speakers\b", r"--\1-speakers", msg)
    return msg
