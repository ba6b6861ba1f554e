"""Every page and section the project cites from its own docs exists.

Citations of the form ``docs/<page>.md §N`` (the CAPI hook contract is numbered)
must name an existing page and a section heading that starts with that number.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SECTION = re.compile(r"docs/([a-z0-9-]+\.md) §(\d+(?:\.\d+)?)")
THIS = Path(__file__).relative_to(ROOT).as_posix()


def tracked_text_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    files = []
    for name in listed.decode().split("\0"):
        path = ROOT / name
        if not name or name == THIS or not path.is_file():
            continue
        try:
            path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        files.append(path)
    return files


def test_every_cited_section_exists() -> None:
    missing = []
    for path in tracked_text_files():
        for page, section in SECTION.findall(path.read_text(encoding="utf-8")):
            target = ROOT / "docs" / page
            headings = (
                re.findall(r"(?m)^#{2,4} (\d+(?:\.\d+)?)[. ]", target.read_text(encoding="utf-8"))
                if target.is_file()
                else []
            )
            if section not in headings:
                missing.append(f"{path.relative_to(ROOT)}: docs/{page} §{section}")
    assert missing == [], "\n".join(sorted(set(missing)))
