"""The package's layers (docs/architecture.md): imports run only downward, never in a circle.

Every ``import``/``from ... import`` of a ``fun_asr`` module anywhere in a module's source counts (also the
ones inside functions and under ``TYPE_CHECKING``): a lazy import hides a circle from Python, not from a
reader. Layers, top to bottom::

    fun_asr (the public API, __init__.py)
    cli
    serve, jobs
    asr
    converter
    vad
    audio, model
    notices, outputs (writing a user's files safely), _core,
    _spinwait (libgomp's spin count, set before _core loads)
    errors (errors as data)
    _spin (the compiled probe _spinwait times a spin-wait iteration with)

A module may import a module of a lower layer or of its own package; packages that share a layer do not
import each other. Inside ``serve`` (one layer): ``serve.core`` imports no protocol and not ``serve.app``, a
protocol (``serve.protocols.<name>``) imports no other protocol, and only ``serve.app`` imports the protocols.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "python" / "fun_asr"
LAYERS = [["_spin"], ["errors"], ["notices", "outputs", "_core", "_spinwait"], ["audio", "model"], ["vad", "speakers"],
          ["converter"], ["asr"], ["serve", "jobs"], ["cli"], [""]]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}
EXTENSIONS = {"fun_asr._core", "fun_asr._spin"}  # compiled modules (no .py source)


def imports(name: str) -> set[str]:
    """The fun_asr modules ``name`` imports (``from pkg import sub`` counts as ``pkg.sub`` when that is a
    module, else as ``pkg``)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "fun_asr"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "fun_asr":
                continue
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.add(sub if sub in MODULES or sub in EXTENSIONS else target)
    out.discard(name)
    return out


def part(name: str) -> str:
    """The layer entry a module belongs to: its first-level package or module (``""`` for fun_asr itself)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


GRAPH = {name: imports(name) for name in MODULES}


def test_every_module_is_in_a_layer() -> None:
    assert not [n for n in MODULES if part(n) not in RANK], "add the new package to LAYERS (and to the doc)"


def upward(graph: dict[str, set[str]]) -> list[str]:
    wrong = []
    for name, deps in graph.items():
        for dep in sorted(deps):
            a, b = part(name), part(dep)
            if a == b and a != "":
                continue  # inside one package (circles are checked separately)
            if dep == "fun_asr":
                wrong.append(f"{name} -> fun_asr (import the defining module, not the public API)")
            elif RANK[b] >= RANK[a]:
                wrong.append(f"{name} -> {dep}")
    return wrong


def circles(graph: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}
    stack: list[str] = []
    found: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for d in sorted(graph.get(n, ())):
            if d not in graph:
                continue
            if state.get(d) == 1:
                found.append(" -> ".join([*stack[stack.index(d):], d]))
            elif d not in state:
                visit(d)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)
    return found


def test_imports_only_run_downward() -> None:
    wrong = upward(GRAPH)
    assert not wrong, "upward or sideways imports:\n" + "\n".join(wrong)


def test_no_import_circles() -> None:
    found = circles(GRAPH)
    assert not found, "import circles:\n" + "\n".join(found)


def protocol_of(name: str) -> str | None:
    """The server protocol a module belongs to (``fun_asr.serve.protocols.openai.api_router`` -> ``openai``), or
    None (``fun_asr.serve.protocols`` itself names no protocol)."""
    parts = name.split(".")
    return parts[3] if parts[:3] == ["fun_asr", "serve", "protocols"] and len(parts) > 3 else None


def serve_inside(graph: dict[str, set[str]]) -> list[str]:
    """The server's inner rule (serve/ is one layer): ``serve.core`` imports no ``serve.protocols`` module and not
    ``serve.app``; a protocol imports no other protocol; only ``serve.app`` (and ``serve/__init__``) import the
    protocols, so that a new protocol is its own package plus a line in the app."""
    wrong = []
    for name, deps in graph.items():
        core = name == "fun_asr.serve.core" or name.startswith("fun_asr.serve.core.")
        own = protocol_of(name)
        for dep in sorted(deps):
            theirs = protocol_of(dep)
            to_protocols = theirs is not None or dep == "fun_asr.serve.protocols"
            if core and (to_protocols or dep == "fun_asr.serve.app"):
                wrong.append(f"{name} -> {dep} (serve.core imports no protocol and not the app)")
            elif own is not None and theirs is not None and theirs != own:
                wrong.append(f"{name} -> {dep} (a protocol imports no other protocol)")
            elif own is None and to_protocols and name not in ("fun_asr.serve.app", "fun_asr.serve") \
                    and not name.startswith("fun_asr.serve.protocols"):
                wrong.append(f"{name} -> {dep} (only serve.app imports the protocols)")
    return wrong


def test_server_protocols_stay_apart() -> None:
    wrong = serve_inside(GRAPH)
    assert not wrong, "imports across the server's parts:\n" + "\n".join(wrong)


def test_the_server_check_catches_violations() -> None:
    """A core module importing a protocol or the app, a protocol importing another, and a module other than the
    app importing a protocol are each reported."""
    assert {"fun_asr.serve.core.batcher", "fun_asr.serve.app"} <= set(GRAPH)
    fake = {k: set(v) for k, v in GRAPH.items()}
    fake["fun_asr.serve.core.batcher"] |= {"fun_asr.serve.protocols.openai.protocol", "fun_asr.serve.app"}
    fake["fun_asr.serve.protocols.funasr_runtime.serving"].add("fun_asr.serve.protocols.funasr_realtime.protocol")
    fake["fun_asr.serve.words"].add("fun_asr.serve.protocols.web.routes")
    fake["fun_asr.cli.serve"].add("fun_asr.serve.protocols.funasr_realtime")
    found = set(serve_inside(fake)) - set(serve_inside(GRAPH))
    assert {w.split(" (")[0] for w in found} == {
        "fun_asr.serve.core.batcher -> fun_asr.serve.protocols.openai.protocol",
        "fun_asr.serve.core.batcher -> fun_asr.serve.app",
        "fun_asr.serve.protocols.funasr_runtime.serving -> fun_asr.serve.protocols.funasr_realtime.protocol",
        "fun_asr.serve.words -> fun_asr.serve.protocols.web.routes",
        "fun_asr.cli.serve -> fun_asr.serve.protocols.funasr_realtime"}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_each_module_says_what_it_is(name: str) -> None:
    """A docstring whose first line is a sentence (package __init__ files too)."""
    doc = ast.get_docstring(ast.parse(MODULES[name].read_text("utf-8")))
    assert doc and doc.split("\n")[0].strip(), f"{name}: no docstring saying what it is"


def test_the_checks_catch_violations() -> None:
    """An upward import, a sideways one and a circle inside a package are each reported."""
    fake = {k: set(v) for k, v in GRAPH.items()}
    fake["fun_asr.audio.decode"].add("fun_asr.asr.session")
    fake["fun_asr.serve.app"].add("fun_asr.jobs.batch")
    assert upward(fake) == upward(GRAPH) + ["fun_asr.audio.decode -> fun_asr.asr.session",
                                            "fun_asr.serve.app -> fun_asr.jobs.batch"] or \
        {"fun_asr.audio.decode -> fun_asr.asr.session", "fun_asr.serve.app -> fun_asr.jobs.batch"} <= set(upward(fake))
    fake = {k: set(v) for k, v in GRAPH.items()}
    fake["fun_asr.asr.prompt"].add("fun_asr.asr.engine")  # the engine imports prompt
    assert "fun_asr.asr.engine" in GRAPH and "fun_asr.asr.prompt" in GRAPH["fun_asr.asr.engine"]
    assert any("fun_asr.asr.prompt" in c and "fun_asr.asr.engine" in c for c in circles(fake))
    # imports inside functions count (the Session imports its speaker-model finder when speakers are asked for)
    assert "fun_asr.asr.speakers" in imports("fun_asr.asr.session")
