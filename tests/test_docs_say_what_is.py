"""The project's text says what is: no file names a work session, a planning round or a tracker's issue by
number (the word, a space, a digit: see DIARY). History is what git log keeps; docs give today's figures with
the command that reproduces them and the date."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# built from parts so that this file does not match itself
DIARY = re.compile(r"(?<![\w-])(?:" + "|".join(("sess" + "ion", "rou" + "nd", "iss" + "ue")) + r")s?\s+[0-9]", re.I)
TEXT = {".py", ".md", ".txt", ".toml", ".cfg", ".yaml", ".yml", ".sh", ".cpp", ".h", ".hpp", ".c", ".cmake",
        ".js", ".html", ".css", ".json", ".in", ""}


def _files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        paths = [ROOT / line for line in out.splitlines()]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: the project's own folders
        paths = [p for d in ("python", "csrc", "docs", "tools", "tests", "scripts", "examples", ".ci")
                 for p in (ROOT / d).rglob("*")] + list(ROOT.glob("*"))
    return [p for p in paths if p.is_file() and p.suffix.lower() in TEXT and "tests/data" not in p.as_posix()]


def diary_lines(files: list[Path]) -> list[str]:
    found = []
    for path in files:
        try:
            text = path.read_text("utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        for m in DIARY.finditer(text):  # also across a line break
            n = text.count("\n", 0, m.start()) + 1
            found.append(f"{name}:{n}: {text.splitlines()[n - 1].strip()[:120]}")
    return found


def test_no_file_names_a_session_round_or_issue() -> None:
    found = diary_lines(_files())
    assert not found, f"{len(found)} lines name a session, round or issue:\n" + "\n".join(found[:40])


def test_the_check_catches_them(tmp_path: Path) -> None:
    probe = tmp_path / "notes.md"
    words = ["sess" + "ion 20", "Rou" + "nd 3", "iss" + "ue 23.10"]
    text = "\n".join(f"measured in {w}" for w in words) + "\nas in the sess" + "ions\n13-15 before\n"
    probe.write_text(text + "the --stream-rounds 4 flag\n", "utf-8")
    assert len(diary_lines([probe])) == 4
