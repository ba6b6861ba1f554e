"""Targets of bench/update.py: a measured value with its limit, printed with its verdict and counted at
the end (``targets met: N/M``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Target:
    """One line of the report that has a target: the measured value, the limit, and whether it held."""

    label: str
    value: float
    unit: str
    limit: float
    note: str = ""

    @property
    def met(self) -> bool:
        return self.value <= self.limit

    def line(self) -> tuple[str, str]:
        fmt = f"{self.value:6.2f}{self.unit}"
        verdict = "met" if self.met else "MISSED"
        return self.label, f"{fmt:9} target <= {self.limit:g}{self.unit.strip()}  {verdict}  {self.note}"
