"""fun-asr-transcribe --stream: standard input or a file fed to Session.stream() as it arrives (or at real-time
pace), the events printed as they come: timed sentences and partials (VAD mode) or fixed text (chunked mode)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from typing import Any

from fun_asr.cli.common import UsageError
from fun_asr.cli.transcribe_files import STDIN, error
from fun_asr.errors import names_input, render


def check_stream_input(args: argparse.Namespace) -> None:
    """--raw-pcm RATE: with --stream, a rate in range, and not for a FILE that starts with a header (UsageError)."""
    rate = args.raw_pcm
    if rate is None:
        return
    if not args.stream:
        raise UsageError("--raw-pcm RATE is for --stream (e.g. --stream --raw-pcm 16000 -); without --stream, "
                         "'-' and files are decoded from their headers (wav, flac, ogg, mp3, ...)")
    if not 1000 <= rate <= 384_000:
        raise UsageError(f"--raw-pcm RATE must be a sample rate from 1000 to 384000 Hz, got {rate}")
    name = args.files[0]
    if name != STDIN and os.path.isfile(name):
        from fun_asr.audio.piped import ACCEPTED, KIND_NAMES, header_kind

        with open(name, "rb") as f:
            kind = header_kind(f.read(12))
        if kind is not None:
            raise UsageError(f"--raw-pcm with {name}: the file starts with a {KIND_NAMES[kind]} header, not raw PCM; "
                             f"drop --raw-pcm ({ACCEPTED} are recognized by their headers)")


def _clock(ms: int) -> str:
    m, rest = divmod(int(ms), 60_000)
    return f"{m:02d}:{rest / 1000:06.3f}"


def run_stream(session, args: argparse.Namespace, language: str | None) -> int:  # noqa: ANN001
    """--stream: feed standard input or a file to Session.stream(), print events as they come."""
    import time

    import numpy as np

    from fun_asr.audio.decode import AudioError
    from fun_asr.audio.piped import RawPcmConflict

    chunked = args.stream_mode == "chunked"
    try:
        if chunked:
            stream = session.stream(language, not args.no_itn, args.hotwords, mode="chunked",
                                    max_new_tokens=args.max_new_tokens,
                                    repetition_guard=not args.no_repetition_guard, chunk_ms=args.chunk_ms,
                                    rollback_chars=args.rollback_chars)
        else:
            stream = session.stream(language, not args.no_itn, args.hotwords, max_new_tokens=args.max_new_tokens,
                                    repetition_guard=not args.no_repetition_guard)
    except (ValueError, TypeError) as exc:
        error(render(exc, "cli"))
        return 2
    as_json = args.format == "json"
    tty = sys.stdout.isatty()
    shown_partial = [False]
    shown_fixed = [0]

    def show_chunks(events: list, final: bool = False) -> None:
        """Chunked mode: -f json one SDK result per line; a terminal shows the fixed text and, dimmed, the
        unfixed end on one refreshed line; otherwise the text is written as it becomes fixed."""
        for ev in events:
            if as_json:
                print(json.dumps(ev.to_dict(), ensure_ascii=False), flush=True)
            elif tty:
                width = os.get_terminal_size().columns - 1
                line = ev.fixed_text + "\033[2m" + ev.unfixed_text + "\033[0m"
                tail = ev.text[-width:] if len(ev.text) > width else None
                sys.stdout.write("\r\033[K" + (tail if tail is not None else line) + ("\n" if ev.is_final else ""))
                sys.stdout.flush()
            else:
                sys.stdout.write(ev.fixed_text[shown_fixed[0]:] + ("\n" if ev.is_final else ""))
                sys.stdout.flush()
                shown_fixed[0] = len(ev.fixed_text)

    def show(events: list, final: bool = False) -> None:
        if chunked:
            show_chunks(events, final)
            return
        for ev in events:
            if as_json:
                print(json.dumps(ev.to_dict(), ensure_ascii=False), flush=True)
            elif ev.type == "sentence":
                if shown_partial[0]:
                    sys.stdout.write("\r\033[K")
                    shown_partial[0] = False
                print(f"[{_clock(ev.start)} --> {_clock(ev.end)}] {ev.text}", flush=True)
            elif tty:
                sys.stdout.write(f"\r\033[K… {ev.text[-(os.get_terminal_size().columns - 3):]}")
                sys.stdout.flush()
                shown_partial[0] = True
        if final:
            if shown_partial[0]:
                sys.stdout.write("\r\033[K")
            if as_json:
                print(json.dumps({"type": "final", **stream.response(is_final=True), "latency_ms": stream.latency()},
                                 ensure_ascii=False), flush=True)

    try:
        blocks, rate, notes = _stream_input(args)
    except RawPcmConflict as exc:  # a header on standard input given --raw-pcm
        error(str(exc))
        return 2
    except (OSError, ValueError) as exc:  # no audio in a form we read: nothing was shown
        name = args.files[0]
        error(str(exc) if name == STDIN or names_input(exc) == name else f"{name}: {exc}")
        return 1
    t0 = time.perf_counter()
    fed = 0
    failed = None
    try:
        for block in blocks:
            if args.realtime:
                wait = t0 + fed / rate - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
            show(stream.feed(np.ascontiguousarray(block), sample_rate=rate))
            fed += block.size
    except AudioError as exc:  # samples that are not audio, or a decoder that gave none
        failed = str(exc)
        if fed == 0:
            error(failed)
            return 1
    show(stream.close(), final=True)
    from fun_asr.notices import InputWarning

    for note in notes:
        warnings.warn(note, InputWarning, stacklevel=1)
    if failed:
        error(failed)
        return 1
    return 0


def _stream_input(args: argparse.Namespace) -> tuple[Any, int, list[str]]:
    """--stream's input: (mono float32 blocks, their sample rate, warnings to show at the end (the list fills as the
    blocks are read)). Standard input, --raw-pcm and anything that is not a regular file (a named pipe, /dev/stdin)
    are read as they arrive, their header checked now (:class:`~fun_asr.audio.piped.PipedAudio`); a regular file
    is decoded whole now and given in 100 ms pieces at 16 kHz. OSError / ValueError (AudioError) name what is
    wrong; RawPcmConflict when --raw-pcm meets a header."""
    from fun_asr.audio.decode import SAMPLE_RATE, decode_audio
    from fun_asr.audio.piped import PipedAudio

    name = args.files[0]
    if name == STDIN or args.raw_pcm is not None or not os.path.isfile(name):
        fd = sys.stdin.buffer.fileno() if name == STDIN else os.open(name, os.O_RDONLY)
        piped = PipedAudio(fd, "standard input" if name == STDIN else name, args.raw_pcm)
        return piped.blocks(), piped.rate, piped.warnings
    samples, info = decode_audio(name)
    step = SAMPLE_RATE // 10  # 100 ms
    return (samples[i : i + step] for i in range(0, samples.size, step)), SAMPLE_RATE, list(info.warnings)
