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
    notices, outputs (writing a user's files safely), _core, _compat (the old module paths, by name only),
    _spinwait (libgomp's spin count, set before _core loads)
    _spin (the compiled probe _spinwait times a spin-wait iteration with)

A module may import a module of a lower layer or of its own package; packages that share a layer do not
import each other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "python" / "fun_asr"
LAYERS = [["_spin"], ["notices", "outputs", "_core", "_compat", "_spinwait"], ["audio", "model"], ["vad", "speakers"],
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


def test_old_module_paths_still_import() -> None:
    """Code written against the flat layout (``fun_asr.session``, ``fun_asr.server``, ...) keeps working, with a
    DeprecationWarning that names the new module; each old name is the new module itself."""
    import importlib
    import sys
    import warnings

    from fun_asr import _compat

    for old, new in _compat.MOVED.items():
        sys.modules.pop(old, None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mod = importlib.import_module(old)
        assert mod is importlib.import_module(new), old
        assert any(issubclass(w.category, DeprecationWarning) and new in str(w.message) for w in caught), old
        assert old not in MODULES  # the old file is gone: the alias is all that is left
    from fun_asr.session import Session  # noqa: F401 - the import a user wrote

    import fun_asr
    assert Session is fun_asr.Session
