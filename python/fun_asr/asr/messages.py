"""Session/audio error messages in a user's words (CLI flags, request fields), not Python names or ``Limits``."""

from __future__ import annotations

import logging
import re

_HOTWORD_LIMITS = (re.compile(r"^\d+ hotwords; at most \d+ are accepted"),
                   re.compile(r"^hotword .* characters; at most"))
# " (vad_model=)", " (vad=None)", " (model=)", " (overwrite=True)": a flag's Python spelling next to the flag
_PY_PARENS = re.compile(r" ?\((?:[a-z_]+=)[^()]*\)")
_STREAM_NEEDS_VAD = re.compile(r"streaming needs the FSMN-VAD: create the Session with .*", re.S)
_NO_VAD_SESSION = "this Session has no VAD model (Session(vad='fsmn', vad_model=...))"
# a speaker count's Python words ("... or None"): on the command line a count is left out, never None
_SPEAKER_COUNT = re.compile(r"(--(?:num|min|max)-speakers) must be a positive integer or None, got (.*)$", re.M)
_LEAVE_OUT = {"--num-speakers": "omit --num-speakers to have the speakers counted",
              "--min-speakers": "omit --min-speakers for at least 1",
              "--max-speakers": "omit --max-speakers for at most 15"}


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
    msg = _STREAM_NEEDS_VAD.sub("--stream needs the FSMN-VAD to close its sentences and this model has none: give "
                                "--vad-model (a FunASR fsmn-vad folder or .gguf), or use --stream-mode chunked", msg)
    msg = msg.replace(f"vad=True but {_NO_VAD_SESSION}", "this model has no FSMN-VAD (give --vad-model)")
    msg = msg.replace(_NO_VAD_SESSION, "this model has no FSMN-VAD (give --vad-model, or drop --vad none)")
    msg = msg.replace("(diarize=True, --diarize, spk=true)", "(--diarize)")
    msg = msg.replace("(speaker_model= / --speaker-model:", "(--speaker-model:")
    msg = msg.replace("diarize=True / --diarize", "--diarize")
    msg = _PY_PARENS.sub(lambda m: m.group(0) if "--" in m.group(0) else "", msg)
    msg = re.sub(r"\bsegment_seconds\b", segment_flag, msg)
    msg = re.sub(r"\bmax_new_tokens\b", "--max-new-tokens", msg)
    msg = re.sub(r"\b(num|min|max)_speakers\b", r"--\1-speakers", msg)
    msg = _SPEAKER_COUNT.sub(lambda m: f"{m[1]} must be a positive integer, got {m[2]} ({_LEAVE_OUT[m[1]]})", msg)
    msg = re.sub(r"\bspeaker_clustering\b", "--speaker-clustering", msg)
    msg = msg.replace("add overwrite=True", "add --overwrite")
    msg = msg.replace("use the cpu or auto device", "use --device cpu or --device auto")
    return msg


class CliWordsFilter(logging.Filter):
    """Rewrites the records a command logs (the Session's notices) with :func:`cli_words`."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = cli_words(record.getMessage())
        record.args = None
        return True
