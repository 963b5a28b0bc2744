"""A job's diagnosis as the CLI prints it: `gpuq diagnose`, and `gpuq show`'s "Diagnosis"
section and `diagnosis` key in `--json`."""

from __future__ import annotations

from typing import Any

from gpuq.cli import render


def diagnosis_dict(diagnosis: Any) -> dict[str, Any]:
    """The JSON form: `verdict` (the first, or null), `verdicts` (all, ranked), `note`."""
    verdicts = [
        {"name": v.name, "title": v.title, "evidence": list(v.evidence), "advice": v.advice}
        for v in diagnosis.verdicts
    ]
    return {
        "verdict": verdicts[0] if verdicts else None,
        "verdicts": verdicts,
        "note": diagnosis.note,
    }


def diagnosis_text(diagnosis: Any, heading: str) -> str:
    """The verdict with its evidence and next step, then the others one line each; every
    value escaped (they quote the job's own output)."""
    lines = [heading + ":"]
    if not diagnosis.verdicts:
        lines.append("  nothing to say: it has not ended, and nothing about it is flagged")
    for number, verdict in enumerate(diagnosis.verdicts):
        if number == 0:
            lines.append(f"  {render.printable(verdict.title)} [{verdict.name}]")
            lines += [f"    evidence: {render.printable(e)}" for e in verdict.evidence]
            if verdict.advice:
                lines.append(f"    next step: {render.printable(verdict.advice)}")
            if len(diagnosis.verdicts) > 1:
                lines.append("  also:")
            continue
        lines.append(f"    {render.printable(verdict.title)} [{verdict.name}]")
    if diagnosis.note:
        lines.append(f"  note: {render.printable(diagnosis.note)}")
    return "\n".join(lines)
