"""The project cites only its own documents, and every cited page, section and link exists.

A user's clone has nothing beside the repository, so code, comments, docs and scripts must not point at
team notes outside it. Citations of the form ``docs/<page>.md §N`` (the CAPI hook contract is numbered)
must name an existing page and a section heading that starts with that number.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# documents outside the repository, by path or by the names of the team notes
OUTSIDE = re.compile(r"\.\./shared|shared/docs|\b(?:design|kubelab|peers(?:-2026)?|style)\.md\b|pitfall")
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


def test_no_file_cites_a_document_outside_the_repository() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in tracked_text_files()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert found == [], "\n".join(found)


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


LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCED = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its rendered text (a link shows its text), lower case, punctuation
    dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCED.sub("", page.read_text(encoding="utf-8"))
    return {slug(h) for h in re.findall(r"(?m)^#{1,6} (.+)$", text)}


def test_every_relative_link_in_the_docs_resolves() -> None:
    pages = [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in LINK.findall(FENCED.sub("", page.read_text(encoding="utf-8"))):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            file_part, _, anchor = target.partition("#")
            linked = (page.parent / file_part).resolve() if file_part else page
            if not linked.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{page.relative_to(ROOT)}: {target}: no such heading")
    assert broken == [], "\n".join(broken)
