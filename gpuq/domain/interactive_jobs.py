"""Interactive jobs (`gpuq run`, srun --pty; `gpuq alloc`, salloc): the pseudo-terminal such a
job runs on, shaped as the submitter's terminal is."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuq.domain.limits import shown
from gpuq.errors import InvalidInput


@dataclass(frozen=True, slots=True)
class Terminal:
    """An interactive job's pseudo-terminal, as the submitter's terminal is."""

    rows: int = 24
    cols: int = 80
    term: str = "xterm"
    stdin_tty: bool = True
    stdout_tty: bool = True

    def __post_init__(self) -> None:
        for name, value in (("rows", self.rows), ("cols", self.cols)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
                raise InvalidInput("terminal", f"{name} {shown(value)}", "must be 0 to 65535")
        if not isinstance(self.term, str) or not re.fullmatch(r"[A-Za-z0-9_.+-]{0,64}", self.term):
            raise InvalidInput("terminal", shown(self.term), "TERM is not a terminal name")
