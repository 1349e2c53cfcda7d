"""Serve a tiny Qwen2.5-VL directory with vLLM (CPU build) once; write what it sampled as JSON.

    python tests/models/vllm_tiny_check.py MODEL_DIR OUT.json

Run as a script (vLLM spawns workers, so the engine starts under __main__). Three requests,
greedy, 4 tokens each with their logprobs: a text prompt; an image prompt given as chat text
plus the image (vLLM tokenizes and expands the placeholder); the same image prompt given as
our PromptBuilder's placeholder ids (one <|image_pad|> per image) plus the image.
"""

import json
import sys
import time

import numpy as np
from PIL import Image


def _record(output) -> dict:
    comp = output.outputs[0]
    return {
        "prompt_token_ids": list(output.prompt_token_ids),
        "token_ids": list(comp.token_ids),
        "logprobs": [lp[t].logprob for t, lp in zip(comp.token_ids, comp.logprobs)],
    }


def main(model_dir: str, out_path: str) -> None:
    from vllm import LLM, SamplingParams

    from dart_jax.agent.prompt import PromptBuilder, render

    t0 = time.time()
    llm = LLM(model=model_dir, dtype="float32", max_model_len=4096, seed=0, enforce_eager=True,
              limit_mm_per_prompt={"image": 2}, max_num_seqs=4,
              kv_cache_memory_bytes=256 * 2**20)  # explicit: the CPU default reserves 92% of RAM
    started = time.time() - t0
    params = SamplingParams(temperature=0.0, max_tokens=4, min_tokens=4, ignore_eos=True, logprobs=1)

    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, hw + (3,), dtype=np.uint8)) for hw in [(210, 160), (120, 300)]]
    messages = [{"role": "user", "content": [{"type": "image", "image": images[0]},
                                             {"type": "text", "text": "Click the OK button."}]},
                {"role": "assistant", "content": [{"type": "text", "text": "Action: click(start_box='(3,4)')"}]},
                {"role": "user", "content": [{"type": "image", "image": images[1]}]}]
    builder = PromptBuilder.from_pretrained(model_dir)
    ours = builder.tokenize_messages(messages)
    requests = [
        "<|im_start|>user\nType hello into the search box.<|im_end|>\n<|im_start|>assistant\n",
        {"prompt": render(messages), "multi_modal_data": {"image": images}},
        {"prompt_token_ids": ours.placeholder_ids.tolist(), "multi_modal_data": {"image": images}},
    ]
    t1 = time.time()
    outs = llm.generate(requests, params)
    result = dict(zip(("text", "image_text", "image_ids"), map(_record, outs)))
    result["engine_start_s"] = round(started, 1)
    result["generate_s"] = round(time.time() - t1, 2)
    result["our_prompt_token_ids"] = ours.token_ids.tolist()
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
