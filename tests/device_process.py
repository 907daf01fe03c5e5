"""A GPU test case runs in a Python process of its own, so that a driver that crashes fails that case, not the run.

The cases that run on a GPU backend (a ``device`` parameter of ``cuda``/``vulkan``, or the ``device_process`` mark)
go through a pytest child process, one per test module: the child runs the module's pending GPU cases in
collection order and writes each case's reports as JSON lines; this process reads them back and reports them as
its own. Where the child dies (a signal: a driver's SIGSEGV or SIGABRT), the case it was running runs once more in
a new child and fails, with both deaths and the child's last output, where it dies again; the summary lists every
case whose process died; the module's cases after it run in a new child when their turn comes.

The child is ``python -m pytest`` with the same options file, ``FUN_ASR_TEST_CHILD_REPORT`` naming its report file
(which also stops it from isolating again). ``FUN_ASR_TEST_IN_PROCESS=1`` runs every case in this process (a
debugger, or a machine where starting Python is dear)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from _pytest.reports import TestReport

GPU_NAMES = ("cuda", "vulkan", "gpu")
CHILD_REPORT = "FUN_ASR_TEST_CHILD_REPORT"
_TAIL = 4000
# How long one child (a test module's GPU cases) may run before it is killed as hung: 40 min by default (the slowest
# module on Mesa's lavapipe, compiling its shaders cold on 2 cores, takes ~10).
CHILD_TIMEOUT_S = int(os.environ.get("FUN_ASR_TEST_CHILD_TIMEOUT", "2400"))


def in_child() -> bool:
    return bool(os.environ.get(CHILD_REPORT))


def needs_own_process(item: pytest.Item) -> bool:
    """A case on a GPU backend: a ``device`` parameter naming one, or the ``device_process`` mark."""
    if item.get_closest_marker("device_process"):
        return True
    params = getattr(getattr(item, "callspec", None), "params", {})
    device = params.get("device")
    return isinstance(device, str) and device.split(":")[0] in GPU_NAMES


# -- the child: each case's reports as JSON lines ------------------------------------------------------------

class ChildReporter:
    def __init__(self, path: str) -> None:
        self.out = open(path, "a", encoding="utf-8")  # noqa: SIM115 (open for the whole run)

    def _write(self, row: dict[str, Any]) -> None:
        self.out.write(json.dumps(row) + "\n")
        self.out.flush()

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self._write({"nodeid": nodeid, "event": "start"})

    def pytest_runtest_logreport(self, report: TestReport) -> None:
        longrepr: Any = report.longrepr
        if isinstance(longrepr, tuple):
            longrepr = [str(longrepr[0]), longrepr[1], str(longrepr[2])]
        elif longrepr is not None:
            longrepr = str(longrepr)
        self._write({"nodeid": report.nodeid, "event": "report", "when": report.when, "outcome": report.outcome,
                     "longrepr": longrepr, "duration": report.duration, "sections": report.sections,
                     "wasxfail": getattr(report, "wasxfail", None)})


# -- this process: run a module's cases in a child, report what it said -------------------------------------

class DeviceProcesses:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.pending: dict[str, list[pytest.Item]] = {}  # module -> its isolated cases not yet run
        self.rows: dict[str, list[dict[str, Any]]] = {}  # nodeid -> what its child said
        self.died: dict[str, str] = {}  # nodeid -> how its first process died
        self.exit_deaths: list[str] = []  # children that died at exit, their cases reported

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.died:
            terminalreporter.section("GPU cases whose process died (each ran once more in a new process)")
            for nodeid, how in self.died.items():
                terminalreporter.line(f"{nodeid}: {how.splitlines()[0]}")
        if self.exit_deaths:
            terminalreporter.section("GPU test processes that died at exit, after their cases had reported")
            for line in self.exit_deaths:
                terminalreporter.line(line.splitlines()[0])

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            if needs_own_process(item):
                self.pending.setdefault(item.nodeid.split("::")[0], []).append(item)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
        if not needs_own_process(item):
            return None
        while item.nodeid not in self.rows:  # (a case whose process died once runs once more: _take)
            self._run_child(item)
        item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        for report in self._reports(item):
            item.ihook.pytest_runtest_logreport(report=report)
        item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        # What this process set up for earlier cases is torn down as pytest's own protocol would.
        item.session._setupstate.teardown_exact(nextitem)  # noqa: SLF001
        return True

    def _run_child(self, item: pytest.Item) -> None:
        module = item.nodeid.split("::")[0]
        todo = [x for x in self.pending.get(module, [item]) if x.nodeid not in self.rows]
        if item not in todo:
            todo.insert(0, item)
        with tempfile.TemporaryDirectory(prefix="fun-asr-device-case-") as tmp:
            report, log = Path(tmp) / "reports.jsonl", Path(tmp) / "output.txt"
            env = dict(os.environ, **{CHILD_REPORT: str(report)})
            cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir",
                   str(self.config.rootpath), *(x.nodeid for x in todo)]
            with open(log, "wb") as out:
                child = subprocess.Popen(cmd, cwd=self.config.rootpath, env=env, stdout=out, stderr=subprocess.STDOUT)
                try:
                    rc = child.wait(timeout=CHILD_TIMEOUT_S)
                    note = ""
                except subprocess.TimeoutExpired:  # a driver that hangs: the case dies, the run goes on
                    child.kill()
                    rc = child.wait()
                    note = f"\n(killed after {CHILD_TIMEOUT_S} s: FUN_ASR_TEST_CHILD_TIMEOUT)"
            rows = [json.loads(line) for line in report.read_text("utf-8").splitlines()] if report.exists() else []
            self._take(rows, todo, rc, log.read_text("utf-8", errors="replace")[-_TAIL:] + note)

    def _take(self, rows: list[dict[str, Any]], todo: list[pytest.Item], rc: int, tail: str) -> None:
        started: list[str] = []
        for row in rows:
            self.rows.setdefault(row["nodeid"], [])
            if row["event"] == "start":
                started.append(row["nodeid"])
            else:
                self.rows[row["nodeid"]].append(row)
        finished = {n for n, got in self.rows.items() if any(r["when"] == "teardown" for r in got)}
        crashed = [n for n in started if n not in finished]
        if not crashed and todo[0].nodeid in self.rows:
            if rc < 0:  # after its cases had reported: at the process's exit (a driver's teardown)
                self.exit_deaths.append(f"the process of {todo[0].nodeid} and the cases after it was {_how(rc)} "
                                        "at its exit")
            return
        # The child died in a case (or before any): the case runs once more in a new child, and fails where it
        # dies again; the cases after it get a new child.
        victim = crashed[0] if crashed else todo[0].nodeid
        for n in started:
            if n not in finished:
                del self.rows[n]
        if victim not in self.died:
            self.died[victim] = _death(rc, victim, tail)
            return
        self.rows[victim] = [{"event": "report", "when": "call", "outcome": "failed", "duration": 0.0,
                              "sections": [], "wasxfail": None,
                              "longrepr": f"{self.died[victim]}\n\nand again in a second process: "
                                          f"{_death(rc, victim, tail)}"}]

    def _reports(self, item: pytest.Item) -> list[TestReport]:
        reports = []
        for row in self.rows.get(item.nodeid, []):
            longrepr = row["longrepr"]
            if isinstance(longrepr, list):
                longrepr = tuple(longrepr)
            report = TestReport(item.nodeid, item.location, {k: 1 for k in item.keywords}, row["outcome"],
                                longrepr, row["when"], sections=[tuple(s) for s in row["sections"]],
                                duration=row["duration"])
            if row.get("wasxfail") is not None:
                report.wasxfail = row["wasxfail"]
            reports.append(report)
        return reports


def _how(rc: int) -> str:
    if rc >= 0:
        return f"ended with exit code {rc} without reporting this case"
    try:
        return f"killed by {signal.Signals(-rc).name}"
    except ValueError:
        return f"killed by signal {-rc}"


def _death(rc: int, nodeid: str, tail: str) -> str:
    return (f"the test process running {nodeid} (a GPU case, run in a process of its own) was {_how(rc)}: a crash "
            f"in the GPU driver or in fun-asr's native code. Its last output:\n{tail}")


def register(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "device_process: run this case in a Python process of its own (GPU cases)")
    if in_child():
        config.pluginmanager.register(ChildReporter(os.environ[CHILD_REPORT]), "fun_asr_child_reporter")
    elif os.environ.get("FUN_ASR_TEST_IN_PROCESS") != "1":
        config.pluginmanager.register(DeviceProcesses(config), "fun_asr_device_processes")
