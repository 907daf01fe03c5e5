"""Shared machinery of the fuzz harnesses in this folder (atheris, coverage-guided).

Every harness is ``python tools/fuzz/fuzz_<name>.py [libFuzzer flags]``: it builds its seed corpus from real
files made by our own tools (cached, see :mod:`_seeds`), imports ``fun_asr`` under atheris' coverage
instrumentation and fuzzes ``one_input(data)``. A harness's ``one_input`` returns normally for input it
handled (including the documented errors: it catches exactly those) and raises for anything else; atheris then
writes the input to ``<cache>/artifacts/<name>/crash-*``. A crash or abort of the process is a finding too.

    python tools/fuzz/fuzz_gguf.py -max_total_time=60          # fuzz for a minute
    python tools/fuzz/fuzz_gguf.py -atheris_runs=10000          # 10,000 executions
    python tools/fuzz/fuzz_gguf.py --replay tests/data/fuzz/gguf # replay saved inputs (no atheris needed)

Flags of our own: ``--replay PATH...`` (files or folders; exit 1 if any input is a finding),
``--corpus DIR`` (default: a persistent corpus under the cache, seeded from the seeds every start),
``--seeds-only`` (build the seeds, print where, exit). Everything else goes to libFuzzer, with these
defaults unless given: ``-timeout=30 -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix=<cache>/...``.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


class Finding(AssertionError):
    """The target misbehaved without raising (a 500 answer, a malformed reply, a leaked stream, ...)."""


_BUCKETS = 256
_ns: dict = {}
exec(compile("def _bucket(h):\n" + "".join(f"    if h == {i}:\n        return {i}\n" for i in range(_BUCKETS))
             + "    return -1\n", "<fuzz-feedback>", "exec"), _ns)
_bucket = _ns["_bucket"]


def feedback(exc: BaseException | str) -> None:
    """Coverage feedback for outcomes the instrumentation cannot see (the native code is not instrumented):
    each kind of error message (digits removed) lands on one of 256 branches, so libFuzzer keeps inputs that
    reach a new kind of refusal deeper in the C++ loader."""
    import re
    import zlib

    text = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    text = re.sub(r"'[^']*'|\d+", "", text.split("\n")[0])[:200]
    _bucket(zlib.crc32(text.encode()) % _BUCKETS)


_SPECIAL = [0, -1, 1, 2, 3, 7, 255, 256, 65535, 2**31, 2**32 + 1, 2**63, 2**64, 10**30, -2**63, 0.5, -0.0, 1e-30,
            1e308, float("inf"), float("-inf"), float("nan"), True, False, None, "", "x", "default", "a" * 300,
            [], {}, [1, 2], [[[[[[[[[[]]]]]]]]]], {"a": {"b": {"c": []}}}]


def _nodes(obj: object, path: tuple = ()) -> list[tuple]:
    out = [path]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _nodes(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _nodes(v, (*path, i))
    return out


def mutate_json(obj: object, rng: object) -> object:
    """One structure-aware mutation of a JSON tree: a value replaced by an interesting one (huge, negative,
    infinite, NaN, another type, deep nesting), a number nudged, a key dropped or duplicated."""
    import copy

    obj = copy.deepcopy(obj)
    paths = _nodes(obj)
    path = rng.choice(paths)  # type: ignore[attr-defined]
    if not path:
        return rng.choice(_SPECIAL) if rng.random() < 0.05 else obj  # type: ignore[attr-defined]
    parent = obj
    for k in path[:-1]:
        parent = parent[k]  # type: ignore[index]
    key = path[-1]
    value = parent[key]  # type: ignore[index]
    op = rng.random()  # type: ignore[attr-defined]
    if op < 0.15 and isinstance(parent, dict):
        del parent[key]
    elif op < 0.25 and isinstance(parent, list):
        parent.insert(key, copy.deepcopy(value))
    elif op < 0.55 and isinstance(value, int | float) and not isinstance(value, bool):
        f = rng.choice([lambda v: -v, lambda v: v + 1, lambda v: v - 1, lambda v: v * 2, lambda v: v // 2,  # type: ignore[attr-defined]
                        lambda v: v * 2**31, lambda v: float(v) + 0.5, lambda v: 0, lambda v: str(v)])
        parent[key] = f(value)  # type: ignore[index]
    elif op < 0.65 and isinstance(value, str):
        parent[key] = value + rng.choice(["x", "0", "\u0000", "/..", "\ud800"[:1]])  # type: ignore[index, attr-defined]
    else:
        parent[key] = copy.deepcopy(rng.choice(_SPECIAL))  # type: ignore[index, attr-defined]
    return obj


def quiet_native_logs() -> None:
    os.environ.setdefault("FUN_ASR_GGML_LOG", "")


def cache_dir() -> Path:
    from _seeds import cache_dir as seeds_cache

    return seeds_cache()


def _inputs(paths: Iterable[str]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(f for f in p.iterdir() if f.is_file() and not f.name.startswith(".")
                          and f.suffix != ".md")
        elif p.is_file():
            out.append(p)
        else:
            raise SystemExit(f"--replay: {p} does not exist")
    return out


def replay(name: str, one_input: Callable[[bytes], None], paths: list[str]) -> int:
    """Runs every input once; prints one line per input; 1 if any is a finding."""
    files = _inputs(paths)
    bad = 0
    for f in files:
        t0 = time.perf_counter()
        try:
            one_input(f.read_bytes())
        except BaseException as exc:  # noqa: BLE001 - every escape is a finding here
            if isinstance(exc, KeyboardInterrupt):
                raise
            bad += 1
            print(f"FINDING {name} {f}: {type(exc).__name__}: {exc}", flush=True)
            traceback.print_exc()
            continue
        print(f"ok {name} {f.name} ({(time.perf_counter() - t0) * 1e3:.0f} ms)", flush=True)
    print(f"{name}: {len(files)} inputs replayed, {bad} findings", flush=True)
    return 1 if bad else 0


def instrument(atheris: object, prefixes: tuple[str, ...], harness: object) -> int:
    """Adds coverage instrumentation to every loaded function of the modules under ``prefixes`` and of the
    harness. (``atheris.instrument_imports`` does not work here: the editable install of fun_asr imports it
    through a custom loader, which leaves the code uninstrumented.)"""
    import gc
    import types

    count = 0
    for obj in gc.get_objects():
        if not isinstance(obj, types.FunctionType):
            continue
        mod = getattr(obj, "__module__", None) or ""
        if obj is _bucket or obj.__globals__ is getattr(harness, "__dict__", None) or any(
                mod == p or mod.startswith(p + ".") for p in prefixes):
            try:
                atheris.instrument_func(obj)  # type: ignore[attr-defined]
                count += 1
            except Exception as exc:  # noqa: BLE001 - a function atheris cannot patch stays uninstrumented
                print(f"fuzz: not instrumented: {obj.__qualname__}: {exc}", file=sys.stderr)
    print(f"fuzz: instrumented {count} functions of {', '.join(prefixes)} and the harness", flush=True)
    return count


def main(name: str, harness: object) -> None:
    """Entry point of ``fuzz_<name>.py``. ``harness`` is the harness module: ``MODULES`` (what to import under
    coverage instrumentation), ``seeds(out_dir)`` (writes the seed corpus), ``setup()`` (loads models once),
    ``one_input(data)``."""
    quiet_native_logs()
    args = sys.argv[1:]
    if args and args[0] == "--replay":
        harness.setup()  # type: ignore[attr-defined]
        sys.exit(replay(name, harness.one_input, args[1:]))  # type: ignore[attr-defined]
    corpus: Path | None = None
    if "--corpus" in args:
        i = args.index("--corpus")
        corpus = Path(args[i + 1])
        del args[i : i + 2]
    seeds_only = "--seeds-only" in args
    if seeds_only:
        args.remove("--seeds-only")

    import atheris

    for mod in harness.MODULES:  # type: ignore[attr-defined]
        __import__(mod)
    instrument(atheris, ("fun_asr", *getattr(harness, "INSTRUMENT", ())), harness)
    seed_dir = cache_dir() / "seeds" / name
    if not (seed_dir / ".complete").is_file():
        tmp = seed_dir.with_name(f".{name}.{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        harness.seeds(tmp)  # type: ignore[attr-defined]
        (tmp / ".complete").write_text("ok\n")
        shutil.rmtree(seed_dir, ignore_errors=True)
        os.replace(tmp, seed_dir)
    if seeds_only:
        print(seed_dir)
        return
    if corpus is None:
        corpus = cache_dir() / "corpus" / name
    corpus.mkdir(parents=True, exist_ok=True)
    for f in seed_dir.iterdir():
        if not f.name.startswith(".") and not (corpus / f.name).exists():
            shutil.copyfile(f, corpus / f.name)
    artifacts = cache_dir() / "artifacts" / name
    artifacts.mkdir(parents=True, exist_ok=True)
    harness.setup()  # type: ignore[attr-defined]

    flags = [a for a in args if a.startswith("-")]
    extra_dirs = [a for a in args if not a.startswith("-")]
    defaults = {"-timeout": "30", "-rss_limit_mb": "4096", "-print_final_stats": "1",
                "-artifact_prefix": f"{artifacts}/"}
    for key, value in defaults.items():
        if not any(a.split("=")[0] == key for a in flags):
            flags.append(f"{key}={value}")
    argv = [sys.argv[0], *flags, str(corpus), *extra_dirs]
    print(f"fuzz_{name}: corpus {corpus} (seeds {seed_dir}), crashes -> {artifacts}/", flush=True)
    mutator = getattr(harness, "custom_mutator", None)
    if mutator is not None:
        atheris.Setup(argv, harness.one_input, custom_mutator=mutator)  # type: ignore[attr-defined]
    else:
        atheris.Setup(argv, harness.one_input)  # type: ignore[attr-defined]
    atheris.Fuzz()
