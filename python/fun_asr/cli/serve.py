"""fun-asr-serve: an OpenAI-compatible /v1/audio/transcriptions server."""

from __future__ import annotations

import argparse
import logging
import sys

from fun_asr.hub import DEFAULT_REPO


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fun-asr-serve", description="OpenAI-compatible Fun-ASR-Nano server.")
    ap.add_argument("-m", "--model", default=DEFAULT_REPO, help=f"GGUF, checkpoint folder or repo id ({DEFAULT_REPO})")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--max-upload-mb", type=float, default=100.0)
    ap.add_argument("--max-concurrency", type=int, default=8,
                    help="concurrent requests transcribed together in one batch (default 8)")
    ap.add_argument("--max-new-tokens", type=int, default=512, help="decoding limit per segment")
    ap.add_argument("--model-id", default="fun-asr-nano", help="the id /v1/models reports (default fun-asr-nano)")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    try:
        import uvicorn

        from fun_asr.server import create_app
    except ImportError as exc:
        print(f"fun-asr-serve: error: the server needs FastAPI and uvicorn ({exc.name} is missing): "
              "pip install 'fun-asr[server]'", file=sys.stderr)
        return 1
    from fun_asr.session import Session

    try:
        session = Session(args.model, device=args.device, threads=args.threads, progress=sys.stderr.isatty())
    except Exception as exc:  # noqa: BLE001
        if args.verbose:
            raise
        print(f"fun-asr-serve: error: cannot load model {args.model}: {exc}", file=sys.stderr)
        return 1
    app = create_app(session, model_id=args.model_id, max_upload_mb=args.max_upload_mb,
                     max_concurrency=args.max_concurrency, max_new_tokens=args.max_new_tokens)
    print(f"fun-asr-serve: {args.model_id} on http://{args.host}:{args.port}/v1 ({session.model.info()['backend']})",
          file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info" if args.verbose else "warning",
                timeout_graceful_shutdown=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
