#!/usr/bin/env python3
"""Soak and fault test of fun-asr-serve on loopback: bounded in count and time, the tiny model by default.

    python tools/soak.py [--clients 64] [--requests 1000] [--seconds 600] [--streams 16] [--stream-rounds 4]
                         [--rss-transcriptions 500] [--phases http,ws,sigterm,rss] [--json out.json]

Phases (each starts its own server subprocess, ``python -m fun_asr.cli.serve``, on a free 127.0.0.1 port):

- ``http``: ``--clients`` threads x ``--requests`` uploads each (stopping early after ``--seconds``): good clips
  (the answer must equal the text an in-process Session gives for that clip: ``wrong`` otherwise), mixed with bad
  uploads (not audio, empty, no file field: 400; over the upload limit: 413; a wrong API key: 401) and client
  disconnects (half a body then close; a whole request then close without reading). ``lost`` = a request that
  is not a deliberate disconnect and got no answer, a 5xx or an unexpected status. p50/p99 latency of the good
  uploads; server RSS before (after warm-up) and after.
- ``ws``: ``--streams`` concurrent FunASR realtime WebSocket clients x ``--stream-rounds`` streams each, paced at
  ``--ws-speed`` x real time; about a third disconnect at a random point without STOP. A completed stream's final
  sentences must equal an in-process ``Session.stream`` over the same audio. Afterwards ``--streams`` streams at
  once must all start (no stream slot leaked by the disconnects).
- ``sigterm``: ``--clients`` threads upload continuously; SIGTERM after a few seconds. Every request sent before
  the signal must be answered (200, right text); the server must finish its graceful shutdown (uvicorn then
  re-raises the SIGTERM: exit status -15, or 0) within its 30 s grace period.
- ``rss``: ``--rss-transcriptions`` sequential transcriptions in this process (one Session); RSS growth after
  the first 50 must be <= 5 %.

Exit status 1 if anything is lost or wrong, a phase fails its check, or RSS grows more than 5 %.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "fuzz"))
API_KEY = "soak-key"
SR = 16000


def rss_kb(pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


# -- clips and the answers they must get ---------------------------------------------------------------

def make_clips() -> list[np.ndarray]:
    """Short recordings from examples/: each clip alone, pieces, and two joined by a pause (VAD: two segments)."""
    import soundfile as sf

    ex = {n: sf.read(ROOT / "examples" / f"{n}.wav", dtype="float32")[0] for n in ("en_hello", "zh_weather",
                                                                                 "ja_hello")}
    rng = np.random.default_rng(7)
    quiet = lambda s: (3e-4 * rng.standard_normal(int(s * SR))).astype(np.float32)  # noqa: E731
    clips = [ex["en_hello"], ex["zh_weather"], ex["ja_hello"], ex["en_hello"][: SR],
             np.concatenate([quiet(0.5), ex["ja_hello"], quiet(0.3)]),
             np.concatenate([ex["en_hello"], quiet(1.2), ex["zh_weather"]])]
    return [np.clip(c, -1, 1) for c in clips]


def wav_bytes(x: np.ndarray) -> bytes:
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, x, SR, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def as_pcm16(x: np.ndarray) -> np.ndarray:
    return (np.clip(x, -1, 1) * 32767).astype(np.int16).astype(np.float32) / 32768


# -- the server ---------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, args: argparse.Namespace, log: Path) -> None:
        import requests

        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log
        cmd = [sys.executable, "-m", "fun_asr.cli.serve", "-m", str(args.model), "--vad", "fsmn", "--vad-model",
               str(args.vad_model), "--host", "127.0.0.1", "--port", str(self.port), "--ws-port", "0",
               "--device", "cpu", "--threads", str(args.threads), "--max-new-tokens", str(args.max_new_tokens),
               "--max-upload-mb", str(args.max_upload_mb), "--max-concurrency", str(args.max_concurrency),
               "--api-key", API_KEY, "--max-streams", str(args.streams), "--request-timeout", "600"]
        self.proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
        deadline = time.time() + 180
        while True:
            try:
                if requests.get(self.base + "/health", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                raise SystemExit(f"soak: server did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.3)

    def rss(self) -> int:
        return rss_kb(self.proc.pid)

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


# -- HTTP ---------------------------------------------------------------------------------------------

KINDS = [("good", 84), ("garbage", 3), ("empty", 2), ("nofile", 2), ("oversize", 2), ("wrongkey", 2),
         ("cut", 2), ("noread", 3)]
EXPECT = {"good": 200, "garbage": 400, "empty": 400, "nofile": 400, "oversize": 413, "wrongkey": 401}


def raw_request(port: int, body: bytes, boundary: str, send_fraction: float, read: bool) -> None:
    """A request on a raw socket that the client abandons: part of the body then close, or all of it and close
    without reading the answer."""
    head = (f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {API_KEY}\r\n"
            f"Content-Type: multipart/form-data; boundary={boundary}\r\nContent-Length: {len(body)}\r\n\r\n")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head.encode() + body[: int(len(body) * send_fraction)])
        if read:
            s.recv(1)


def multipart(fields: list[tuple[str, bytes, str | None]], boundary: str) -> bytes:
    from fuzz_upload import multipart as mp

    return mp([(n, v, f) for n, v, f in fields], boundary)


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count: dict[str, int] = {}
        self.lost: list[tuple[float, str]] = []  # (time the request was sent, what happened)
        self.wrong: list[str] = []
        self.latency: list[float] = []

    def add(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.count[key] = self.count.get(key, 0) + n


def http_client(idx: int, server: Server, args: argparse.Namespace, clips: list[bytes], expected: list[str],
                tally: Tally, deadline: float, stop_at: float | None = None,
                sent_log: list[tuple[float, str]] | None = None) -> None:
    import requests

    rng = random.Random(1000 + idx)
    sess = requests.Session()
    url = server.base + "/v1/audio/transcriptions"
    auth = {"Authorization": f"Bearer {API_KEY}"}
    big = os.urandom(int(args.max_upload_mb * 1024 * 1024) + 200_000)
    for i in range(args.requests):
        if time.time() > deadline or (stop_at is not None and time.time() > stop_at):
            break
        kind = "good" if stop_at is not None else rng.choices([k for k, _ in KINDS], [w for _, w in KINDS])[0]
        c = rng.randrange(len(clips))
        tag = f"client {idx} request {i} ({kind}, clip {c})"
        if kind in ("cut", "noread"):
            boundary = f"soak{idx}x{i}"
            body = multipart([("file", clips[c], "a.wav")], boundary)
            try:
                raw_request(server.port, body, boundary, 0.5 if kind == "cut" else 1.0, read=False)
            except OSError:
                pass
            tally.add(kind)
            continue
        files: dict[str, Any] = {"file": ("a.wav", clips[c], "audio/wav")}
        headers = dict(auth)
        if kind == "garbage":
            files = {"file": ("x.wav", os.urandom(rng.randrange(1, 4000)), "audio/wav")}
        elif kind == "empty":
            files = {"file": ("e.wav", b"", "audio/wav")}
        elif kind == "nofile":
            files = {"model": (None, b"whisper-1")}  # type: ignore[dict-item]
        elif kind == "oversize":
            files = {"file": ("big.wav", big, "audio/wav")}
        elif kind == "wrongkey":
            headers = {"Authorization": "Bearer nope"}
        t0 = time.time()
        if sent_log is not None:
            with tally.lock:
                sent_log.append((t0, tag))
        try:
            r = sess.post(url, files=files, headers=headers, timeout=600)
        except requests.RequestException as exc:
            sess = requests.Session()
            if kind == "oversize":  # the server answered 413 from the headers and closed while we still sent
                tally.add("oversize_reset")
                continue
            with tally.lock:
                tally.lost.append((t0, f"{tag}: {type(exc).__name__}: {exc}"[:300]))
            continue
        dt = time.time() - t0
        tally.add(f"{kind}:{r.status_code}")
        want = EXPECT[kind]
        if r.status_code != want:
            with tally.lock:
                tally.lost.append((t0, f"{tag}: HTTP {r.status_code}, expected {want}: {r.text[:200]}"))
            continue
        if kind == "good":
            text = r.json().get("text")
            with tally.lock:
                tally.latency.append(dt)
                if text != expected[c]:
                    tally.wrong.append(f"{tag}: got {text!r:.120}, expected {expected[c]!r:.120}")


def phase_http(args: argparse.Namespace, clips: list[bytes], expected: list[str], log: Path) -> dict[str, Any]:
    import requests

    server = Server(args, log)
    try:
        for _ in range(3):  # warm-up: the first requests allocate the KV cache and the compute buffers
            requests.post(server.base + "/v1/audio/transcriptions", files={"file": ("a.wav", clips[0])},
                          headers={"Authorization": f"Bearer {API_KEY}"}, timeout=600)
        rss_before = server.rss()
        tally = Tally()
        t0 = time.time()
        deadline = t0 + args.seconds
        threads = [threading.Thread(target=http_client, args=(i, server, args, clips, expected, tally, deadline))
                   for i in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.time() - t0
        alive = requests.get(server.base + "/health", timeout=10).status_code == 200
        rss_after = server.rss()
    finally:
        code = server.stop()
    answered = sum(v for k, v in tally.count.items() if ":" in k)
    good = sum(v for k, v in tally.count.items() if k.startswith("good:"))
    return {"clients": args.clients, "requests_per_client": args.requests, "seconds": round(elapsed, 1),
            "requests_sent": answered + len(tally.lost) + tally.count.get("oversize_reset", 0),
            "answered": answered, "good_answered": good, "lost": len(tally.lost), "wrong": len(tally.wrong),
            "disconnects": tally.count.get("cut", 0) + tally.count.get("noread", 0),
            "oversize_closed_while_sending": tally.count.get("oversize_reset", 0),
            "by_kind_status": dict(sorted(tally.count.items())), "requests_per_s": round(answered / elapsed, 1),
            "latency_p50_ms": round(percentile(tally.latency, 50) * 1e3, 1),
            "latency_p99_ms": round(percentile(tally.latency, 99) * 1e3, 1),
            "server_rss_before_mb": round(rss_before / 1024, 1), "server_rss_after_mb": round(rss_after / 1024, 1),
            "healthy_after": alive, "exit_code": code, "lost_examples": [m for _, m in tally.lost[:10]],
            "wrong_examples": tally.wrong[:10]}


# -- WebSocket ----------------------------------------------------------------------------------------

async def ws_stream(url: str, pcm: bytes, speed: float, cut_at: int | None) -> dict[str, Any]:
    import websockets

    got: list[dict] = []
    frame = 3200  # 100 ms
    async with websockets.connect(url, max_size=None,
                                  additional_headers={"Authorization": f"Bearer {API_KEY}"}) as ws:
        await ws.send("START")
        got.append(json.loads(await ws.recv()))

        async def reader() -> None:
            async for msg in ws:
                got.append(json.loads(msg))
                if got[-1].get("event") == "stopped":
                    return

        task = asyncio.create_task(reader())
        frames = [pcm[i : i + frame] for i in range(0, len(pcm), frame)]
        for k, f in enumerate(frames):
            if cut_at is not None and k == cut_at:
                task.cancel()
                return {"disconnected": True, "messages": got}
            await ws.send(f)
            await asyncio.sleep(0.1 / speed)
        await ws.send("STOP")
        await asyncio.wait_for(task, 600)
    return {"disconnected": False, "messages": got}


async def ws_client(idx: int, url: str, args: argparse.Namespace, pcms: list[bytes], expected: list[list],
                    out: dict[str, Any]) -> None:
    rng = random.Random(500 + idx)
    for _ in range(args.stream_rounds):
        c = rng.randrange(len(pcms))
        n_frames = (len(pcms[c]) + 3199) // 3200
        cut = rng.randrange(1, n_frames) if rng.random() < 0.33 else None
        try:
            res = await ws_stream(url, pcms[c], args.ws_speed, cut)
        except Exception as exc:  # noqa: BLE001 - a stream that fails is counted, not fatal
            out["errors"].append(f"client {idx}: {type(exc).__name__}: {exc}"[:300])
            continue
        msgs = res["messages"]
        if res["disconnected"]:
            out["disconnected"] += 1
            continue
        out["completed"] += 1
        if any(m.get("event") == "error" for m in msgs):
            out["error_events"].append(f"client {idx} clip {c}: {[m for m in msgs if m.get('event') == 'error']}"[:300])
            continue
        final = [m for m in msgs if m.get("is_final")]
        got = [(s["text"], s["start"], s["end"]) for s in final[-1]["sentences"]] if final else None
        if msgs[-1].get("event") != "stopped" or got != expected[c]:
            out["wrong"].append(f"client {idx} clip {c}: got {got!r:.200}, expected {expected[c]!r:.200}")


async def ws_all_start(url: str, n: int) -> int:
    import websockets

    conns = [await websockets.connect(url, additional_headers={"Authorization": f"Bearer {API_KEY}"})
             for _ in range(n)]
    started = 0
    for ws in conns:
        await ws.send("START")
        started += json.loads(await ws.recv()).get("event") == "started"
    for ws in conns:
        await ws.close()
    return started


def phase_ws(args: argparse.Namespace, pcms: list[bytes], expected: list[list], log: Path) -> dict[str, Any]:
    server = Server(args, log)
    url = f"ws://127.0.0.1:{server.port}/"
    out: dict[str, Any] = {"completed": 0, "disconnected": 0, "errors": [], "error_events": [], "wrong": []}
    try:
        rss_before = server.rss()
        t0 = time.time()

        async def run() -> None:
            await asyncio.gather(*(ws_client(i, url, args, pcms, expected, out) for i in range(args.streams)))

        asyncio.run(run())
        elapsed = time.time() - t0
        time.sleep(1.0)  # the server notices the last disconnects
        started = asyncio.run(ws_all_start(url, args.streams))
        rss_after = server.rss()
    finally:
        code = server.stop()
    return {"streams": args.streams, "rounds": args.stream_rounds, "seconds": round(elapsed, 1),
            "completed": out["completed"], "disconnected_on_purpose": out["disconnected"],
            "client_errors": len(out["errors"]), "error_events": len(out["error_events"]), "wrong": len(out["wrong"]),
            "all_slots_free_after": started == args.streams, "started_after": started,
            "server_rss_before_mb": round(rss_before / 1024, 1), "server_rss_after_mb": round(rss_after / 1024, 1),
            "exit_code": code, "examples": (out["errors"] + out["error_events"] + out["wrong"])[:10]}


# -- SIGTERM ------------------------------------------------------------------------------------------

def phase_sigterm(args: argparse.Namespace, clips: list[bytes], expected: list[str], log: Path) -> dict[str, Any]:
    server = Server(args, log)
    tally = Tally()
    sent: list[tuple[float, str]] = []
    stop_at = time.time() + args.sigterm_after + 30
    threads = [threading.Thread(target=http_client, args=(i, server, args, clips, expected, tally, time.time() + 600,
                                                          stop_at, sent))
               for i in range(min(args.clients, 16))]
    for t in threads:
        t.start()
    time.sleep(args.sigterm_after)
    t_term = time.time()
    server.proc.send_signal(signal.SIGTERM)
    try:
        code = server.proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        code = None
    t_exit = time.time()
    for t in threads:
        t.join()
    before = [s for s in sent if s[0] < t_term]
    # a failure is "lost" when its request was sent before the signal (and had reached the server: 50 ms)
    lost = [m for t, m in tally.lost if t < t_term - 0.05]
    refused_after = len(tally.lost) - len(lost)
    answered = sum(v for k, v in tally.count.items() if k.startswith("good:"))
    # uvicorn handles SIGTERM with a graceful shutdown, then re-raises the captured signal: exit status -15 (or 0)
    graceful = code in (0, -signal.SIGTERM) and t_exit - t_term < 60
    return {"sent_before_sigterm": len(before), "answered": answered, "lost": len(lost), "wrong": len(tally.wrong),
            "refused_after_sigterm": refused_after, "exit_code": code, "graceful_exit": graceful,
            "exit_seconds_after_sigterm": round(t_exit - t_term, 1), "lost_examples": lost[:10],
            "wrong_examples": tally.wrong[:10]}


# -- RSS over sequential transcriptions ----------------------------------------------------------------

def phase_rss(args: argparse.Namespace, clips: list[np.ndarray]) -> dict[str, Any]:
    import warnings

    import fun_asr

    warnings.filterwarnings("ignore", category=fun_asr.FunAsrWarning)
    s = fun_asr.Session(args.model, device="cpu", threads=args.threads, vad="fsmn", vad_model=args.vad_model,
                        progress=False)
    marks: dict[int, int] = {0: rss_kb()}
    t0 = time.time()
    for i in range(1, args.rss_transcriptions + 1):
        s.transcribe(clips[i % len(clips)], sample_rate=SR, max_new_tokens=args.max_new_tokens)
        if i in (1, 10, 50, 100, 200, 300, 400) or i == args.rss_transcriptions:
            marks[i] = rss_kb()
    base = marks.get(50, marks[1])
    end = marks[args.rss_transcriptions]
    growth = (end - base) / base * 100
    return {"transcriptions": args.rss_transcriptions, "seconds": round(time.time() - t0, 1),
            "rss_mb": {str(k): round(v / 1024, 1) for k, v in marks.items()},
            "growth_after_50_percent": round(growth, 2), "ok": growth <= 5.0}


# -- main ---------------------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="GGUF (default: the tests' tiny model, q8_0, built once)")
    ap.add_argument("--vad-model", help="FSMN-VAD GGUF (default: FunASR's, converted once)")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests", type=int, default=1000, help="per client")
    ap.add_argument("--seconds", type=float, default=600.0, help="the HTTP phase stops issuing requests after this")
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--stream-rounds", type=int, default=4)
    ap.add_argument("--ws-speed", type=float, default=2.0, help="WebSocket audio pace, x real time")
    ap.add_argument("--sigterm-after", type=float, default=5.0)
    ap.add_argument("--rss-transcriptions", type=int, default=500)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--max-upload-mb", type=float, default=1.0)
    ap.add_argument("--max-concurrency", type=int, default=8)
    ap.add_argument("--phases", default="http,ws,sigterm,rss")
    ap.add_argument("--json", help="write the report here too")
    ap.add_argument("--logs", default=None, help="folder for the server logs (default: a temporary folder)")
    args = ap.parse_args()

    import tempfile
    import warnings

    import _seeds

    import fun_asr

    args.model = Path(args.model) if args.model else _seeds.tiny_gguf("q8_0")
    args.vad_model = Path(args.vad_model) if args.vad_model else _seeds.vad_gguf()
    logs = Path(args.logs or tempfile.mkdtemp(prefix="fun-asr-soak-"))
    logs.mkdir(parents=True, exist_ok=True)
    phases = args.phases.split(",")
    clips = make_clips()
    wavs = [wav_bytes(c) for c in clips]
    warnings.filterwarnings("ignore", category=fun_asr.FunAsrWarning)
    ref = fun_asr.Session(args.model, device="cpu", threads=args.threads, vad="fsmn", vad_model=args.vad_model,
                          progress=False)
    expected = [ref.transcribe(w, max_new_tokens=args.max_new_tokens).text for w in wavs]
    report: dict[str, Any] = {"model": str(args.model), "vad_model": str(args.vad_model), "threads": args.threads,
                              "max_new_tokens": args.max_new_tokens, "cpus": os.cpu_count(), "logs": str(logs)}
    print(f"soak: model {args.model}, {len(clips)} clips, expected texts computed in-process; logs in {logs}",
          flush=True)
    if "http" in phases:
        report["http"] = phase_http(args, wavs, expected, logs / "http-server.log")
        print("http:", json.dumps(report["http"], ensure_ascii=False), flush=True)
    if "ws" in phases:
        pcms, want = [], []
        for c in clips:
            x = np.concatenate([c, np.zeros(int(2.5 * SR), np.float32)])  # a pause closes the last sentence
            pcms.append((np.clip(x, -1, 1) * 32767).astype("<i2").tobytes())
            st = ref.stream(max_new_tokens=args.max_new_tokens)
            events = st.feed(as_pcm16(x)) + st.close()
            want.append([(e.text, e.start, e.end) for e in events if e.type == "sentence"])
        report["ws"] = phase_ws(args, pcms, want, logs / "ws-server.log")
        print("ws:", json.dumps(report["ws"], ensure_ascii=False), flush=True)
    if "sigterm" in phases:
        report["sigterm"] = phase_sigterm(args, wavs, expected, logs / "sigterm-server.log")
        print("sigterm:", json.dumps(report["sigterm"], ensure_ascii=False), flush=True)
    if "rss" in phases:
        del ref
        report["rss"] = phase_rss(args, clips)
        print("rss:", json.dumps(report["rss"], ensure_ascii=False), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, ensure_ascii=False))
    bad = []
    h = report.get("http")
    if h and (h["lost"] or h["wrong"] or not h["healthy_after"]):
        bad.append("http")
    w = report.get("ws")
    if w and (w["wrong"] or w["client_errors"] or w["error_events"] or not w["all_slots_free_after"]):
        bad.append("ws")
    s = report.get("sigterm")
    if s and (s["lost"] or s["wrong"] or not s["graceful_exit"]):
        bad.append("sigterm")
    if report.get("rss") and not report["rss"]["ok"]:
        bad.append("rss")
    print("soak:", "FAILED " + ", ".join(bad) if bad else "all checks passed", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
