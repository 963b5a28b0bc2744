"""scontrol inside a gpuq job: `scontrol show hostnames [LIST]`, the one use scripts written
for SLURM make of it to find their master node
(`scontrol show hostnames $SLURM_JOB_NODELIST | head -n1`). Anything else is refused with one
line, so a script does not go on with a wrong answer.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from gpuq.domain.node_constraints import expand_nodes
from gpuq.errors import InvalidInput

UNSUPPORTED = "scontrol: only `show hostnames` is supported inside gpuq jobs"


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    env = os.environ if environ is None else environ
    words = [a for a in args if a not in ("-o", "--oneliner", "-Q", "--quiet")]
    if len(words) < 2 or words[0] != "show" or words[1] not in ("hostnames", "hostname"):
        sys.stderr.write(UNSUPPORTED + "\n")
        return 1
    if len(words) > 3:
        sys.stderr.write("scontrol: show hostnames takes one node list\n")
        return 1
    text = words[2] if len(words) == 3 else env.get("SLURM_JOB_NODELIST", "")
    if not text:
        sys.stderr.write("scontrol: no node list given and SLURM_JOB_NODELIST is unset\n")
        return 1
    try:
        names = expand_nodes(text, "node list")
    except InvalidInput as exc:
        sys.stderr.write(f"scontrol: error: {exc}\n")
        return 1
    sys.stdout.write("".join(f"{name}\n" for name in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
