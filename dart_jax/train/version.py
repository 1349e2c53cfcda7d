"""The trainer's policy version, held in one place.

    trainer = Trainer(cfg, hf_dir)                                             # trainer.version: 0
    publisher = WeightPublisher(cfg.weights, config, state_file=path, version=trainer.version)
    source = DataManagerSource(wire, collator, version=trainer.version)

Policy versions count the weight versions published in a run. The publisher alone advances
the count (one per publish) and records it in its state file (`record`), so a restarted
trainer numbers on from the last version published (`recorded`): workers may hold versions
published after the checkpoint it resumed from. Everyone else reads it: the data source
asks for batches curated for it, the trainer's checkpoints and heartbeat carry it, the
loop's metrics report it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path


@dataclasses.dataclass
class PolicyVersion:
    value: int = 0  # the newest version published (0: none yet)


def recorded(path: Path | None) -> int:
    """The last version recorded in `path` (0 when there is none)."""
    if path is None or not path.exists():
        return 0
    return int(json.loads(path.read_text())["version"])


def record(path: Path | None, version: int) -> None:
    """Atomically: a crash leaves the old record or the new one, never half of one."""
    if path is None:
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"version": version, "time": time.time()}))
    os.replace(tmp, path)
