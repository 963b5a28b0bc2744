"""Which tmpfs folder an installation's root agents keep their job folders in: the record.

A root agent keeps its run folders on tmpfs in a folder of the installation with a random name,
`/dev/shm/gpuq-<random>` (gpuq.agent.run_folder makes it, and says why it is random), and
remembers its path in `<GPUQ_HOME>/agent/run-root`. Reading that record is all the settings need
(Settings.agent_run_root), so it lives here, below both the settings and the agent.
"""

from __future__ import annotations

import re
from pathlib import Path

TMPFS = Path("/dev/shm")  # where a root agent keeps job folders by default
# the path of the installation's tmpfs run folder, in <GPUQ_HOME>/agent (the parent of every
# node's state folder: one folder per installation, with a folder per node in it)
RECORD = "run-root"
PREFIX = "gpuq-"
RANDOM_NAME = re.compile(r"gpuq-[0-9a-f]{24}")


def recorded_root(where: Path) -> Path | None:
    """The tmpfs run folder remembered in the folder `where` (None: none, or not one of ours by
    its name). Whether it still is ours is for gpuq.agent.run_folder.safe_folder to say."""
    try:
        text = (where / RECORD).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    path = Path(text)
    if path.parent != TMPFS or not RANDOM_NAME.fullmatch(path.name):
        return None
    return path
