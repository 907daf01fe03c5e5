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
