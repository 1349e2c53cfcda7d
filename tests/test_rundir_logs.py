import json
import logging

import numpy as np

from dart_jax import logs
from dart_jax.rundir import MetricsWriter, RunDir


def test_run_dir_layout_and_config(tmp_path):
    run = RunDir.create(tmp_path / "runs" / "r1", config_yaml="run: {name: r1}\n")
    for sub in ("logs", "metrics", "data", "checkpoints", "export"):
        assert (run.root / sub).is_dir()
    assert run.config_path.read_text() == "run: {name: r1}\n"
    assert RunDir.create(run.root).config_path.read_text() == "run: {name: r1}\n"  # idempotent
    assert run.log_path("trainer") == run.root / "logs" / "trainer.log"


def test_structured_log_lines(tmp_path):
    path = tmp_path / "logs" / "trainer.log"
    log = logs.setup("trainer", path)
    log.info("step %d done", 3, extra={"loss": 0.5})
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("failed")
    for handler in logging.getLogger().handlers:
        handler.flush()
    first, second = [json.loads(line) for line in path.read_text().splitlines()]
    assert first["role"] == "trainer" and first["message"] == "step 3 done" and first["loss"] == 0.5
    assert second["level"] == "ERROR" and "RuntimeError: boom" in second["exception"]
    logging.getLogger().handlers.clear()


def test_metrics_writer_plain_scalars(tmp_path):
    writer = MetricsWriter(tmp_path / "m.jsonl")
    writer.write(1, {"loss": np.float32(0.25), "hist": [1, 2]})
    writer.close()
    record = json.loads((tmp_path / "m.jsonl").read_text())
    assert record["step"] == 1 and record["loss"] == 0.25 and record["hist"] == [1, 2]
