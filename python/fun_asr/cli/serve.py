"""fun-asr-serve: an OpenAI-compatible /v1/audio/transcriptions server."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from typing import Any

from fun_asr.asr.option_table import default
from fun_asr.cli.common import DEMO_HELP, DEMO_HOTWORDS
from fun_asr.converter.hub import DEFAULT_REPO
from fun_asr.errors import FrontFilter, render
from fun_asr.model import demo
from fun_asr.speakers.cluster import CLUSTERINGS

PROG = "fun-asr-serve"


class _DefaultsOnce(argparse.ArgumentDefaultsHelpFormatter):
    """Adds "(default: X)" to an option's help unless the help says its default itself, or there is none
    to show (None, an on/off flag): each default shows once."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default is None or isinstance(action.default, bool):
            return text
        return super()._get_help_string(action) or text


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description="Fun-ASR-Nano transcription server, OpenAI- and "
                                 "FunASR-compatible: POST /v1/audio/transcriptions, GET /v1/models, FunASR's POST "
                                 "/asr, GET /health, and FunASR's WebSocket protocols (realtime, and the runtime's "
                                 "online/offline/2pass) on every path and on --ws-port.",
                                 formatter_class=_DefaultsOnce)
    ap.add_argument("-m", "--model", default=DEFAULT_REPO,
                    help=f"GGUF file, checkpoint folder or hub repo id (a repo is fetched and converted once), or "
                         f"{DEMO_HELP}")
    ap.add_argument("--host", default="127.0.0.1",
                    help="address to listen on (0.0.0.0 exposes the server to the network)")
    ap.add_argument("--port", type=int, default=8000, help="TCP port")
    ap.add_argument("--ws-port", type=int, default=10095,
                    help="also serve on FunASR's realtime port, so its WebSocket clients connect unchanged "
                         "(ws://HOST:10095/; 0 = off; the main port serves WebSockets on every path too). "
                         "Opened only when the server streams (it has a VAD, or --endpoint-mode client)")
    ap.add_argument("--ssl-certfile", help="TLS certificate (PEM): serve https:// and wss:// on every port "
                                           "(FunASR's clients connect with --ssl 1)")
    ap.add_argument("--ssl-keyfile", help="TLS private key (PEM), unless the certificate file holds it")
    ap.add_argument("--max-streams", type=int, default=16, help="concurrent realtime WebSocket streams")
    ap.add_argument("--stream-idle-seconds", type=float, default=60.0,
                    help="close a WebSocket that sends nothing for this long")
    ap.add_argument("--stream-max-seconds", type=float, default=4 * 3600.0, help="longest audio per stream")
    ap.add_argument("--stream-buffer-seconds", type=float, default=30.0,
                    help="audio a stream may have waiting; past it the server stops reading the connection until "
                         "it caught up (TCP back-pressure: no audio is refused)")
    ap.add_argument("--hotword-file", default=None,
                    help="FunASR's hotword file, one hotword per line: every WebSocket stream's hotwords until "
                         "the client sends HOTWORDS: (default: ./热词列表 when it exists, as FunASR; "
                         f"{DEMO_HOTWORDS})")
    ap.add_argument("--postprocess-hotword-file", default=None,
                    help="FunASR's 'wrong=>right' lines: text replacements in every closed WebSocket sentence")
    ap.add_argument("--language", default=None,
                    help="WebSocket streams' language until the client sends LANGUAGE: (default: automatic)")
    ap.add_argument("--endpoint-mode", choices=["server", "client"], default="server",
                    help="who ends WebSocket sentences: the server's VAD, or the client's COMMIT (FunASR's modes)")
    ap.add_argument("--enable-spk", action="store_true",
                    help="FunASR's realtime speakers: every WebSocket sentence carries 'spk', re-clustered at STOP "
                         "(needs a speaker model; POST /asr and /v1 take spk=true without this flag)")
    ap.add_argument("--speaker-clustering", choices=CLUSTERINGS, default="auto",
                    help="how spk=true requests' speakers are clustered: auto (default): a recording under 20 "
                         "speaker windows (~15 s of speech) gets its speaker count from agglomerative clustering; "
                         "funasr: FunASR's labels exactly (one speaker there); from 20 windows on both are FunASR's "
                         "clustering (--enable-spk streams keep FunASR's realtime tracker)")
    ap.add_argument("--speaker-model", default=None,
                    help="CAM++ speaker model for spk=true and --enable-spk: a .gguf, a FunASR CAM++ folder or a hub "
                         "repo id (default: the one embedded in the model package, $FUN_ASR_SPEAKER_MODEL, or the "
                         "hub model's)")
    ap.add_argument("--ws-ping-interval", type=float, default=20.0, help="WebSocket ping interval; <= 0: no pings")
    ap.add_argument("--ws-ping-timeout", type=float, default=0.0,
                    help="close a WebSocket whose pong is this late; <= 0: never (a stream that fell behind is not "
                         "read, so it cannot answer; FunASR's default)")
    ap.add_argument("--device", default="auto", help="auto, cpu, gpu[:N], cuda[:N], vulkan[:N] or metal")
    ap.add_argument("--threads", type=int, default=0,
                    help="CPU threads (default 0: auto, up to all cores, fewer on a busy machine when that is faster)")
    ap.add_argument("--max-upload-mb", type=float, default=100.0, help="largest accepted upload, in MB (413 above)")
    ap.add_argument("--max-concurrency", type=int, default=8,
                    help="requests with equal options transcribed together in one batch")
    ap.add_argument("--max-new-tokens", type=int, default=default("max_new_tokens"), help="decoding limit per segment")
    ap.add_argument("--vad", default="auto", choices=["auto", "fsmn", "none"],
                    help="FunASR's FSMN-VAD in front of the recognizer (auto: when available)")
    ap.add_argument("--vad-model", help="FSMN-VAD model: .gguf, FunASR fsmn-vad folder or hub repo id "
                                        "(default funasr/fsmn-vad)")
    ap.add_argument("--max-segment-seconds", type=float, default=default("segment_seconds"),
                    help="longest segment: the VAD's forced cut, or the pause splitter's limit")
    ap.add_argument("--model-id", default=None,
                    help="the model id /v1/models reports and requests name (default fun-asr-nano; "
                         f"{demo.SERVED_ID} for -m demo)")
    ap.add_argument("--api-key", default=None,
                    help="require 'Authorization: Bearer KEY' on every route but /health, WebSockets included "
                         "(default: $FUN_ASR_API_KEY if set, else no key)")
    ap.add_argument("--cors-origin", action="append", default=None, metavar="ORIGIN",
                    help="allow browser requests from this origin (repeatable; default: no CORS)")
    ap.add_argument("--request-timeout", type=float, default=600.0, help="seconds before a transcription gets 504")
    ap.add_argument("--max-queue", type=int, default=256, help="requests waiting before new ones get 429")
    ap.add_argument("--max-audio-seconds", type=float, default=4 * 3600.0, help="longest accepted recording")
    ap.add_argument("--no-access-log", action="store_true", help="no per-request JSON log lines on stderr")
    ap.add_argument("--verbose", action="store_true", help="log every request and full tracebacks")
    return ap


def _log_to_console(args: argparse.Namespace) -> None:
    """The console's log lines and warnings in this command's words; one JSON access line per request (unless
    --no-access-log)."""
    before = list(logging.getLogger().handlers)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format=f"{PROG}: %(message)s")
    for console in logging.getLogger().handlers:
        if console not in before:  # the console's (not a host application's, nor a test's, handlers)
            console.addFilter(FrontFilter("server-console"))
    import warnings

    warnings.formatwarning = lambda msg, *a, **k: f"{PROG}: warning: {render(msg, 'server-console')}\n"
    if not args.no_access_log:  # one JSON line per request on stderr, never the audio
        access = logging.getLogger("fun_asr.access")
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        access.addHandler(handler)
        access.setLevel(logging.INFO)
        access.propagate = False


def _check_options(args: argparse.Namespace) -> str | None:
    """What is wrong with the options, in one line (None: nothing), judged before anything is bound, fetched or
    loaded: the numbers' ranges, the TLS files (uvicorn would fail only after the model loaded), the device."""
    checks = (("--max-concurrency", args.max_concurrency, 1), ("--max-new-tokens", args.max_new_tokens, 1),
              ("--threads", args.threads, 0), ("--max-streams", args.max_streams, 1), ("--ws-port", args.ws_port, 0),
              ("--max-queue", args.max_queue, 1))
    for name, value, low in checks:
        if value < low:
            return f"{name} must be {low} or more, got {value}"
    if args.ssl_keyfile and not args.ssl_certfile:
        return "--ssl-keyfile needs --ssl-certfile"
    if args.ssl_certfile:
        import ssl

        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(args.ssl_certfile, args.ssl_keyfile)
        except (OSError, ssl.SSLError) as exc:
            return f"cannot load the TLS certificate {args.ssl_certfile}: {exc}"
    for name, value in (("--max-upload-mb", args.max_upload_mb), ("--max-audio-seconds", args.max_audio_seconds),
                        ("--request-timeout", args.request_timeout)):
        if not value > 0:
            return f"{name} must be positive, got {value:g}"
    from fun_asr.model.native import usable_device

    try:  # as every command checks it: a device named but not usable here is an error, never the CPU instead
        usable_device(args.device)
    except ValueError as exc:
        return f"--device {args.device}: {render(exc, 'server-console')}"
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _log_to_console(args)
    problem = _check_options(args)
    if problem:
        print(f"{PROG}: error: {problem}", file=sys.stderr)
        return 2  # nothing was started: fix the command (README: Exit codes)
    try:
        import uvicorn

        from fun_asr.serve.app import create_app
    except ImportError as exc:
        print(f"{PROG}: error: the server needs FastAPI and uvicorn ({exc.name} is missing): "
              "pip install 'fun-asr[server]'", file=sys.stderr)
        return 2  # it cannot start: nothing was served (README: Exit codes)
    # Bind first: a busy port is reported before the model loads, and never after a "listening" line.
    try:
        sock = _bind(args.host, args.port)
    except OSError as exc:
        print(f"{PROG}: error: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 2  # it cannot start: nothing was served (README: Exit codes)
    sockets = [sock]
    from fun_asr.asr.session import Session

    try:
        from fun_asr.audio.decode import Limits

        session = Session(args.model, device=args.device, threads=args.threads, progress=sys.stderr.isatty(),
                          vad=None if args.vad == "none" else args.vad, vad_model=args.vad_model,
                          limits=Limits(max_audio_seconds=args.max_audio_seconds),
                          speaker_model=args.speaker_model or "auto", speaker_clustering=args.speaker_clustering)
    except Exception as exc:  # noqa: BLE001
        for sk in sockets:
            sk.close()
        if args.verbose:
            raise
        print(f"{PROG}: error: cannot load model {args.model}: {render(exc, 'server-console')}", file=sys.stderr)
        return 2  # it cannot start: nothing was served (README: Exit codes)
    args.model_id = args.model_id or (demo.SERVED_ID if session.demo else "fun-asr-nano")
    from fun_asr.serve.core.limits import realtime_limits, uvicorn_ws_options

    try:
        limits = realtime_limits(session, max_new_tokens=args.max_new_tokens, max_streams=args.max_streams,
                                 idle_seconds=args.stream_idle_seconds, max_seconds=args.stream_max_seconds,
                                 buffer_seconds=args.stream_buffer_seconds, language=args.language,
                                 hotword_file=args.hotword_file, postprocess_hotword_file=args.postprocess_hotword_file,
                                 endpoint_mode=args.endpoint_mode, enable_spk=args.enable_spk)
        app = create_app(session, model_id=args.model_id, max_upload_mb=args.max_upload_mb,
                         max_concurrency=args.max_concurrency, max_new_tokens=args.max_new_tokens,
                         segment_seconds=args.max_segment_seconds, realtime=limits,
                         api_key=args.api_key or os.environ.get("FUN_ASR_API_KEY") or None,
                         cors_origins=args.cors_origin, request_timeout=args.request_timeout,
                         max_queue=args.max_queue)
    except ValueError as exc:
        for sk in sockets:
            sk.close()
        print(f"{PROG}: error: {render(exc, 'server-console')}", file=sys.stderr)
        return 2
    # FunASR's WebSocket protocols need the VAD to end sentences (or the client's COMMIT): without them nothing
    # streams, and FunASR's realtime port is left free for a server that does
    streams = session.vad is not None or args.endpoint_mode == "client"
    if streams and args.ws_port and args.ws_port != args.port:
        try:
            sockets.append(_bind(args.host, args.ws_port))
        except OSError as exc:  # a second server, or FunASR's own: the main port still serves WebSockets
            print(f"{PROG}: warning: FunASR's realtime port {args.ws_port} is busy ({exc.strerror or exc}); "
                  f"WebSocket clients connect to port {args.port} instead", file=sys.stderr)
    if args.enable_spk and not streams:
        print(f"{PROG}: warning: --enable-spk has no effect: no WebSocket streams without a VAD", file=sys.stderr)
    config = uvicorn.Config(app, log_level="info" if args.verbose else "warning", timeout_graceful_shutdown=30,
                            ssl_certfile=args.ssl_certfile, ssl_keyfile=args.ssl_keyfile,
                            **uvicorn_ws_options(args.max_upload_mb, args.ws_ping_interval, args.ws_ping_timeout))
    server = uvicorn.Server(config)
    print(f"{PROG}: {_served(args, session, sockets, streams)}", file=sys.stderr, flush=True)
    _serve(server, sockets)
    return 0


def _serve(server: Any, sockets: list[socket.socket]) -> None:
    """Runs uvicorn until Ctrl-C or SIGTERM, both a normal end of the server's life (exit code 0, README "Exit
    codes"). uvicorn finishes the requests in flight, then raises the signal it caught again with the handler it
    found; SIGTERM's default one would kill the process (143), so SIGTERM raises an exception here, as SIGINT
    does, and either one ends the server quietly. The SIGTERM handler found before is back afterwards (main()
    called inside another program)."""
    from fun_asr.cli import exits

    with exits.terminate_on_sigterm():
        try:
            server.run(sockets=sockets)
        except (KeyboardInterrupt, exits.Terminated):
            pass


def _served(args: argparse.Namespace, session: object, sockets: list[socket.socket], streams: bool) -> str:
    """The startup line: what is served where (HTTP routes, WebSockets on which ports, or why none)."""
    host, port = sockets[0].getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    tls = "s" if args.ssl_certfile else ""
    backend = session.model.info()["backend"]  # type: ignore[attr-defined]
    line = (f"{args.model_id} ({backend}) listening on http{tls}://{shown}:{port}/: OpenAI's /v1 (POST "
            "/v1/audio/transcriptions, GET /v1/models), FunASR's POST /asr, GET /health, the web page GET /")
    if streams:
        ws = " and ".join(f"ws{tls}://{shown}:{sk.getsockname()[1]}/" for sk in sockets)
        return f"{line}; FunASR's WebSockets (realtime, 2pass) on {ws}"
    port_note = f", and port {args.ws_port} (--ws-port) is not opened" if args.ws_port and args.ws_port != port else ""
    return (f"{line}; no WebSockets: without a VAD nothing ends sentences (start with --vad fsmn and --vad-model, or "
            f"--endpoint-mode client for the realtime protocol){port_note}")


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
        sock.set_inheritable(True)
    except OSError:
        sock.close()
        raise
    return sock


if __name__ == "__main__":
    sys.exit(main())
