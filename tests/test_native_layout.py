"""The native core's layers (docs/architecture.md, "Native side"): includes run one way, top to bottom::

    bindings   (pybind11: the Python module)
    runtime    (backends, models, generation, the VAD's and CAM++'s runners)
    graph      (one builder per stage)
    model, kernels   (metadata, hyperparameters, the tensor table, loading; the custom CPU ops)
    base       (the FUN_ASR_* environment switches)

A file includes headers of its own folder or of a lower layer; ``model`` and ``kernels`` share a layer and do not
include each other. The environment is read in one file, base/switches.cpp, and every switch read anywhere is
listed there (and so in ``system_info()["switches"]``).
"""

from __future__ import annotations

import re
from pathlib import Path

CSRC = Path(__file__).resolve().parents[1] / "csrc"
LAYERS = [["base"], ["model", "kernels"], ["graph"], ["runtime"], ["bindings"]]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"/]+)/[^"]+"', re.M)


def sources() -> list[Path]:
    return sorted(p for p in CSRC.rglob("*") if p.suffix in (".h", ".cpp", ".inc"))


def includes(path: Path) -> set[str]:
    """The csrc folders a file's quoted includes name (``"graph/common.h"`` -> ``graph``)."""
    return {m.group(1) for m in INCLUDE.finditer(path.read_text("utf-8")) if m.group(1) in RANK}


def violations(graph: dict[str, set[str]]) -> list[str]:
    """``file -> folder`` for every include that goes up a layer or sideways."""
    out = []
    for name, targets in sorted(graph.items()):
        folder = name.split("/")[0]
        for t in sorted(targets):
            if t != folder and RANK[t] >= RANK[folder]:
                out.append(f"{name} -> {t}/")
    return out


GRAPH = {str(p.relative_to(CSRC)): includes(p) for p in sources() if p.relative_to(CSRC).parts[0] in RANK}


def test_every_folder_is_a_layer() -> None:
    folders = {p.name for p in CSRC.iterdir() if p.is_dir()}
    assert folders <= set(RANK), f"add {sorted(folders - set(RANK))} to LAYERS (and to docs/architecture.md)"


def test_includes_run_one_way() -> None:
    found = violations(GRAPH)
    assert not found, "upward or sideways includes:\n" + "\n".join(found)


def test_the_check_catches_violations() -> None:
    fake = {k: set(v) for k, v in GRAPH.items()}
    fake["graph/fsmn_vad.cpp"].add("runtime")
    fake["model/loader.cpp"].add("kernels")
    assert violations(fake) == ["graph/fsmn_vad.cpp -> runtime/", "model/loader.cpp -> kernels/"]
    assert includes(CSRC / "graph" / "fsmn_vad.cpp") == {"graph"}


def test_the_environment_is_read_in_one_file() -> None:
    readers = sorted(str(p.relative_to(CSRC)) for p in sources() if "getenv" in p.read_text("utf-8"))
    assert readers == ["base/switches.cpp"], readers


def test_every_switch_read_is_listed() -> None:
    """The FUN_ASR_* names native sources read through base/switches.h are the listed ones (none missing, none
    stale), and system_info() reports each with what it does."""
    from fun_asr import _core

    read = set()
    for p in sources():
        read |= set(re.findall(r'switches::(?:is|value)\("(FUN_ASR_\w+)"', p.read_text("utf-8")))
    listed = _core.system_info()["switches"]
    assert read and read == set(listed), sorted(read ^ set(listed))
    assert all(s["what"] and (s["value"] is None or isinstance(s["value"], str)) for s in listed.values())


def kernel_choosers(graph: dict[str, set[str]]) -> list[str]:
    """Stage files that include a kernel header themselves: the kernel choice is graph/common.cpp's (the builders
    it offers pick a custom op or ggml's), so a stage file includes only graph/ (and model/) headers."""
    return sorted(n for n, t in graph.items() if n.startswith("graph/") and n != "graph/common.cpp" and "kernels" in t)


BACKEND_QUESTION = re.compile(r"ggml_backend_\w+|ggml-backend\.h|cpu_backend|getenv")


def test_stage_files_leave_kernel_and_device_choices_to_common() -> None:
    assert not kernel_choosers(GRAPH), kernel_choosers(GRAPH)
    fake = {k: set(v) for k, v in GRAPH.items()}
    fake["graph/decoder_qwen3.cpp"].add("kernels")
    assert kernel_choosers(fake) == ["graph/decoder_qwen3.cpp"]
    # No graph file asks which backend it runs on: it reads GraphCtx::caps (runtime/backend.cpp device_caps).
    askers = sorted(str(p.relative_to(CSRC)) for p in (CSRC / "graph").iterdir()
                    if BACKEND_QUESTION.search(p.read_text("utf-8")))
    assert not askers, askers
    assert all(BACKEND_QUESTION.search(s) for s in ("if (backend_ == cpu_backend_)", "ggml_backend_is_cpu(b)"))


def test_every_device_capability_is_reported() -> None:
    """system_info()'s devices list each DeviceCaps field (graph/common.h) with its value; the CPU's are the
    record's defaults (the builders' reference behaviour)."""
    from fun_asr import _core

    text = (CSRC / "graph" / "common.h").read_text("utf-8")
    body = text[text.index("struct DeviceCaps {"):text.index("};", text.index("struct DeviceCaps {"))]
    fields = re.findall(r"^\s+bool (\w+) = (true|false);", body, re.M)
    assert len(fields) >= 7
    cpu = next(d for d in _core.system_info()["devices"] if d["type"] == "cpu")
    assert list(cpu["caps"]) == [name for name, _ in fields]
    assert cpu["caps"] == {name: value == "true" for name, value in fields}
