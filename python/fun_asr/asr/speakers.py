"""Which CAM++ speaker model a Session uses for ``diarize=True``, and where it came from.

In order: the ``speaker_model`` given (a GGUF, a FunASR/ModelScope CAM++ folder, a hub repo id, or a loaded
:class:`~fun_asr.speakers.native.SpeakerModel`); the CAM++ embedded in the model package
(``fun-asr-convert --speaker-model``); ``$FUN_ASR_SPEAKER_MODEL``; for a hub model, the hub's CAM++ (FunASR's
``cam++``: ``funasr/campplus``, ModelScope's ``iic/speech_campplus_sv_zh-cn_16k-common`` for a ModelScope model),
downloaded and converted once; one already in fun-asr's cache. Nothing found: a ValueError that names each way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fun_asr.asr.confidence import spoken
from fun_asr.errors import SetupError

SPEAKER_ENV = "FUN_ASR_SPEAKER_MODEL"
# (a template of fun_asr.errors: each front end names its own way of asking for speakers and giving the model)
NO_SPEAKER_MODEL = (
    "{model}: speaker labels ({h[ask_speakers]}) need FunASR's CAM++ speaker model, and there is none: this model "
    "package embeds none (fun-asr-convert SRC --speaker-model DIR|GGUF), none was given ({h[give_speaker_model]}: "
    f"a .gguf, a FunASR CAM++ folder or a hub repo id), ${SPEAKER_ENV} is not set and none is in fun-asr's cache"
)


def no_speaker_model(model: Any, reason: str | None = None) -> SetupError:
    """The error of a Session without a speaker model (``model``: the model as the user named it; ``reason``: why
    the hub's could not be had)."""
    if reason is None:
        return SetupError("speaker_model.missing", NO_SPEAKER_MODEL, option="speaker_model", model=model)
    return SetupError("speaker_model.missing", NO_SPEAKER_MODEL + "; the hub's CAM++ could not be had: {reason}",
                      option="speaker_model", model=model, reason=reason)


def find_speaker_model(arg: Any, package: Path, model_arg: Any, from_hub: bool,
                       progress: bool) -> tuple[Any, str]:
    """The speaker model and its source (``"embedded"``, a path, a repo id, ``$FUN_ASR_SPEAKER_MODEL=...``)."""
    from fun_asr.asr.components import find_component
    from fun_asr.converter.hub import MODELSCOPE, MODELSCOPE_SPEAKER_REPO, SPEAKER
    from fun_asr.speakers.native import SpeakerModel

    if arg is None:
        raise ValueError(f"{package}: this Session was made with speaker_model=None, so it has no speaker labels; "
                         "leave speaker_model out (auto) or give one")
    if isinstance(arg, SpeakerModel):
        return arg, "given"

    def missing(exc: Exception | None) -> tuple[None, None]:
        # the model as the user named it (-m demo: not its cache file)
        raise no_speaker_model(model_arg, None if exc is None else str(exc)) from None

    hub_repo = MODELSCOPE + MODELSCOPE_SPEAKER_REPO if from_hub and str(model_arg).startswith(MODELSCOPE) else None
    found, source = find_component(
        SPEAKER, None if arg == "auto" else arg, env=SPEAKER_ENV, hub_repo=hub_repo, download=from_hub,
        progress=progress, embedded=lambda: SpeakerModel.from_package(package) if package.is_file() else None,
        load=SpeakerModel.load, missing=missing)
    return found, str(source)


MIN_PIECE_S = 1.0  # a speaker's part of a segment shorter than this stays with its neighbour (no split)


def _pieces(start: float, end: float, timeline: list[tuple[float, float, int]]) -> list[list[Any]]:
    """The speaker turns of the timeline inside [start, end): consecutive turns of one speaker joined, parts under
    MIN_PIECE_S given to the neighbour before (the first: after), the first starting at ``start``, the last ending
    at ``end``, each boundary where the later turn begins."""
    parts: list[list[Any]] = []
    for a, b, spk in timeline:
        lo, hi = max(a, start), min(b, end)
        if hi <= lo:
            continue
        if parts and parts[-1][2] == spk:
            parts[-1][1] = hi
        else:
            parts.append([lo, hi, spk])
    changed = True
    while changed and len(parts) > 1:
        changed = False
        for i, p in enumerate(parts):
            if p[1] - p[0] < MIN_PIECE_S:
                j = i - 1 if i > 0 else 1
                lo, hi = min(p[0], parts[j][0]), max(p[1], parts[j][1])
                parts[j][0], parts[j][1] = lo, hi
                del parts[i]
                for k in range(len(parts) - 1, 0, -1):  # neighbours of one speaker join
                    if parts[k][2] == parts[k - 1][2]:
                        parts[k - 1][1] = parts[k][1]
                        del parts[k]
                changed = True
                break
    if parts:
        parts[0][0], parts[-1][1] = start, end
        for i in range(1, len(parts)):
            parts[i - 1][1] = parts[i][0]
    return parts


def _is_boundary(text: str, i: int) -> bool:
    """Whether text can be cut before position i without cutting a word (a space there, or a CJK character or
    punctuation on either side)."""
    if i <= 0 or i >= len(text):
        return True
    a, b = text[i - 1], text[i]
    return a.isspace() or b.isspace() or not (a.isalnum() and a.isascii()) or not (b.isalnum() and b.isascii())


def _token_cuts(full: str, prefix: list[str], parts: list[list[Any]], total: float) -> list[int]:
    """Where the tokens are cut: 0, then for each change of turn the consistent token boundary on a word boundary
    whose text is nearest the turns' share of ``full`` so far (none left: no more cuts), then the token count.
    ``prefix[k]``: the first k tokens decoded; ``total``: the segment's duration."""
    n_tokens = len(prefix) - 1
    cuts = [k for k in range(n_tokens + 1) if full.startswith(prefix[k])]  # consistent token boundaries
    chosen, done = [0], 0.0
    for p in parts[:-1]:
        done += p[1] - p[0]
        target = len(full) * done / total if total > 0 else 0
        ok = [k for k in cuts if k > chosen[-1] and _is_boundary(full, len(prefix[k]))]
        if not ok:
            break
        chosen.append(min(ok, key=lambda k: abs(len(prefix[k]) - target)))
    chosen.append(n_tokens)
    return chosen


def _cut_segment(segment: Any, parts: list[list[Any]], chosen: list[int], prefix: list[str],
                 spoken_tokens: tuple[list[int], Any]) -> list[Any]:
    """One Segment per stretch of tokens between ``chosen`` cuts, with its turn's times and speaker (a stretch
    with nothing said gives its time to the one before). ``spoken_tokens``: the tokens and their logprobs."""
    import dataclasses

    tokens, logprobs = spoken_tokens
    full = prefix[-1]
    out: list[Any] = []
    for i in range(len(chosen) - 1):
        a, b = chosen[i], chosen[i + 1]
        text = full[len(prefix[a]):len(prefix[b])] if b < len(tokens) else full[len(prefix[a]):]
        p = parts[min(i, len(parts) - 1)]
        if not text.strip() and out:  # nothing said in this part: the time goes to the part before
            out[-1].end = p[1]
            continue
        out.append(dataclasses.replace(segment, start=p[0], end=p[1], text=text.strip(), tokens=tokens[a:b],
                                       token_logprobs=None if logprobs is None else logprobs[a:b],
                                       truncated=False, repetition=False, words=None, speaker=int(p[2])))
    return out


def _share_words(out: list[Any], words: list[dict[str, Any]]) -> None:
    """Each part gets the words whose middle falls in it (the last part also those after its end)."""
    for piece in out:
        piece.words = [w for w in words
                       if piece.start <= (w["start"] + w["end"]) / 2 < piece.end or
                       (piece is out[-1] and (w["start"] + w["end"]) / 2 >= piece.end)]


def split_at_speakers(segment: Any, label: int | None, timeline: list[tuple[float, float, int]],
                      decode: Callable[[list[int]], str], stop_ids: Sequence[int]) -> list[Any]:
    """``segment`` labelled ``label`` (FunASR's distribute_spk), or, when the speaker timeline changes speaker
    inside it for at least MIN_PIECE_S each, cut there into one Segment per speaker turn: the text is cut at token
    boundaries in proportion to the turns' durations, on a word boundary (FunASR's realtime finalize cuts a
    shared sentence's text in proportion to time as well), the tokens with it; word times go to the turn they
    fall in; ``truncated``/``repetition`` stay with the last part. The parts' texts joined are the segment's."""
    parts = _pieces(segment.start, segment.end, timeline)
    tokens, logprobs = spoken(segment.tokens, segment.token_logprobs, stop_ids)
    if len(parts) < 2 or not tokens or not segment.text.strip():
        segment.speaker = label
        return [segment]
    full = decode(tokens)
    prefix = [decode(tokens[:k]) for k in range(len(tokens) + 1)]
    chosen = _token_cuts(full, prefix, parts, segment.end - segment.start)
    out = _cut_segment(segment, parts, chosen, prefix, (tokens, logprobs))
    if len(chosen) - 1 < len(parts) and out:  # fewer cuts than turns (no boundary left): the last part runs on
        out[-1].end = segment.end
    out[-1].truncated, out[-1].repetition = segment.truncated, segment.repetition
    if segment.words is not None:
        _share_words(out, segment.words)
    if len(out) == 1:
        out[0].speaker = label if label is not None else out[0].speaker
    return out


__all__ = ["MIN_PIECE_S", "NO_SPEAKER_MODEL", "SPEAKER_ENV", "find_speaker_model", "no_speaker_model",
           "split_at_speakers"]
