"""The train-step benchmark's worker for the reference, transformers + torch
(benchmarks/gpu/train_step.py runs it): `python -m benchmarks.gpu.train_step_torch --worker
CASE_JSON` runs one case and prints its figures as JSON lines."""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

from benchmarks.gpu.measure import model_config, profiled
from benchmarks.gpu.op_profile import torch_ops
from benchmarks.gpu.train_step import Case


def run_torch(case: Case) -> dict:
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    hf_config = Qwen2_5_VLConfig(**model_config(case.size).to_hf())
    hf_config._attn_implementation = "sdpa"
    with torch.device(device):
        model = Qwen2_5_VLForConditionalGeneration(hf_config).train()
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.1, fused=cuda)
    gen = torch.Generator(device).manual_seed(0)
    ids = torch.randint(0, hf_config.text_config.vocab_size, (case.rows, case.length), device=device, generator=gen)
    compute = getattr(torch, case.dtype)

    def step() -> float:
        with torch.autocast(device, dtype=compute, enabled=compute != torch.float32):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 2.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss)  # waits for the device

    start = time.perf_counter()
    step()
    first = time.perf_counter() - start
    times = []
    for _ in range(case.steps):
        start = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - start)
    peak = int(torch.cuda.max_memory_allocated()) if cuda else None
    steady = statistics.median(times)  # eager torch compiles nothing: the first step's extra is warm-up,
    result = {"step_s": steady, "first_step_s": first, "warmup_s": first - steady,  # < 0 within noise
              "peak_bytes": peak, "peak_source": "max_memory_allocated" if cuda else None, "loss": loss,
              "device": torch.cuda.get_device_name() if cuda else "cpu"}
    return profiled(result, torch_ops, step) if case.profile else result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", required=True, help="the case, as JSON")
    print(json.dumps(run_torch(Case(**json.loads(ap.parse_args().worker)))))


if __name__ == "__main__":
    main()
