"""Every flag of every command has an INPLACE_* variable, shown in its --help, and docs/configuration.md's
table of them is the one the parsers make (a flag another change adds fails here until the page is
regenerated with ``python -m inplace_extension.cli.reference``)."""

from __future__ import annotations

import re

import pytest

from inplace_extension.cli import reference

FLAG_IN_HELP = re.compile(r"^  (?:-\w, )?(--[a-z][a-z-]*)", re.MULTILINE)  # option lines, not wrapped help
FLAG_IN_DOC = re.compile(r"`(--[a-z][a-z-]*)")


def test_the_page_holds_the_table_the_parsers_make() -> None:
    assert reference.main(["--check"]) == 0, "regenerate with: python -m inplace_extension.cli.reference"


@pytest.mark.parametrize("command", sorted(reference.parsers()))
def test_every_flag_in_help_has_its_variable_shown(command: str) -> None:
    parser = reference.parsers()[command]
    text = parser.format_help()
    flags = {flag for flag in FLAG_IN_HELP.findall(text) if flag != "--help"}
    variables = {var.flag: var.variable for var in parser.variables.values()}
    assert flags, text
    assert sorted(flags - set(variables)) == [], f"{command}: flags without a variable"
    joined = " ".join(text.split())
    for flag, variable in variables.items():
        assert f"env {variable})" in joined, f"{command} {flag}: --help does not show {variable}"


def test_every_flag_the_page_names_is_a_flag_of_some_command() -> None:
    known = {var.flag for parser in reference.parsers().values() for var in parser.variables.values()}
    known |= {"--no-" + flag.removeprefix("--") for flag in known} | {"--help", "--version"}
    known |= {"--foo", "--foo-bar", "--no-foo"}  # the page's examples of the naming rule
    written = set(FLAG_IN_DOC.findall(reference.PAGE.read_text(encoding="utf-8")))
    assert sorted(written - known) == []
