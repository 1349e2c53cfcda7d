"""Token log-prob parity of the three places the policy runs: vLLM CPU, transformers, Flax.

    .venv/bin/python scripts/logprob_parity.py [--init-std 0.02] [--work DIR]

One vLLM engine start (fp32, CPU build) on the tiny Qwen2.5-VL. Three prompts: (a) text only,
(b) one screenshot, (c) three screenshots of different sizes with a history, all built by our
PromptBuilder and sent as placeholder ids, as rollout workers send them. Per prompt two token
paths are scored:
  - fixed response tokens, scored by vLLM's `prompt_logprobs` (prefill positions);
  - 16 tokens sampled by vLLM (temperature 1) with the logprobs it reports (decode positions,
    mrope position delta): exactly what TIS compares the trainer's logprobs with.
The same sequences are then scored by transformers (fp32, eager attention, pixel values from
our numpy processor, which is bit-exact with transformers' default torchvision backend) and by
the Flax policy. Reports max/mean |delta logp| for vLLM-vs-transformers, vLLM-vs-Flax and
transformers-vs-Flax per prompt.

Diagnostics for the vision path (hooks on vLLM's vision tower, engine in-process):
  - vLLM's pixel values after its own normalization vs our numpy processor's;
  - vLLM's vision-tower output vs transformers' tower on our pixel values;
  - the vision attention backend, input-normalization module and parameter dtype vLLM runs;
  - `image_effect`: how much the logprobs move when the screenshot's pixels change (so a
    vision-path error could not hide below the reported gaps);
  - `pil_processor`: the gap when the trainer side builds pixel values with transformers'
    PIL backend (`backend="pil"`, what `use_fast=False` selects) instead of torchvision.
The last line printed is JSON with the figures and the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine core in-process, so hooks can see the model
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from benchmarks.common import machine, work_dir  # noqa: E402

RESPONSE = "Thought: I need to click the OK button.\nAction: click(start_box='(40,52)')"
SAMPLED_TOKENS = 16


def make_cases(builder) -> dict:
    """Prompts (a) text only, (b) one screenshot, (c) three screenshots of different sizes."""
    rng = np.random.default_rng(0)
    shots = [Image.fromarray(rng.integers(0, 256, hw + (3,), dtype=np.uint8))
             for hw in [(210, 160), (160, 210), (120, 300), (400, 330)]]
    history = ["Action: click(start_box='(3,4)')", "Action: type(content='hello')"]
    return {
        "text": builder.tokenize_messages([{"role": "user", "content": "Type hello into the search box."}]),
        "one_image": builder.build("Click the OK button.", shots[:1], []),
        "three_images": builder.build("Click the OK button.", shots[1:], history),
    }


def gap(a, b) -> dict:
    d = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
    return {"max": float(d.max()), "mean": float(d.mean())}


def token_logprobs(logits_TxV, ids_T, n: int) -> np.ndarray:
    """log p(ids[t]) for the last n tokens, from logits at the positions before them."""
    x = np.asarray(logits_TxV, np.float64)[len(ids_T) - n - 1:len(ids_T) - 1]
    lse = np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1)) + x.max(-1)
    return x[np.arange(n), ids_T[-n:]] - lse


# ---- vLLM -------------------------------------------------------------------------------

def install_vision_hook(store: list):
    """apply_model function: record vLLM's vision-tower inputs (normalized) and outputs."""
    def install(model):
        import torch
        vis = model.visual

        def hook(mod, args, kwargs, out):
            x = args[0]
            with torch.no_grad():
                normalized = mod.input_norm(x, mod.dtype)
            store.append((kwargs["grid_thw"], normalized.float().numpy().copy(), out.float().numpy().copy()))

        vis.register_forward_hook(hook, with_kwargs=True)
        return {"param_dtype": str(next(model.parameters()).dtype), "vision_attn_backend": str(vis.attn_backend),
                "vision_input_norm": type(vis.input_norm).__name__}
    return install


def run_vllm(model_dir: Path, cases: dict, response_ids: np.ndarray) -> dict:
    from vllm import LLM, SamplingParams

    t0 = time.time()
    llm = LLM(model=str(model_dir), dtype="float32", max_model_len=4096, seed=0, enforce_eager=True,
              limit_mm_per_prompt={"image": 3}, max_num_seqs=4, kv_cache_memory_bytes=256 * 2**20)
    start_s = time.time() - t0
    store: list = []
    info = llm.apply_model(install_vision_hook(store))[0]
    info["model_config_dtype"] = str(llm.llm_engine.model_config.dtype)

    def request(p, extra=()):
        req = {"prompt_token_ids": np.concatenate([p.placeholder_ids, np.asarray(extra, np.int32)]).tolist()}
        if p.images:
            req["multi_modal_data"] = {"image": list(p.images)}
        return req

    n = len(response_ids)
    fixed = llm.generate([request(p, response_ids) for p in cases.values()],
                         SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0), use_tqdm=False)
    sampled = llm.generate([request(p) for p in cases.values()],
                           SamplingParams(max_tokens=SAMPLED_TOKENS, min_tokens=SAMPLED_TOKENS, ignore_eos=True,
                                          temperature=1.0, seed=1, logprobs=0), use_tqdm=False)
    out = {}
    for (name, p), f, s in zip(cases.items(), fixed, sampled):
        if list(f.prompt_token_ids) != np.concatenate([p.token_ids, response_ids]).tolist():
            raise RuntimeError(f"{name}: vLLM's expanded prompt differs from PromptBuilder's token ids")
        comp = s.outputs[0]
        out[name] = {
            "fixed": np.array([e[t].logprob for t, e in zip(f.prompt_token_ids[-n:], f.prompt_logprobs[-n:])]),
            "sampled_ids": np.asarray(comp.token_ids, np.int64),
            "sampled": np.array([e[t].logprob for t, e in zip(comp.token_ids, comp.logprobs)]),
        }
    del llm
    return {"logprobs": out, "vision_calls": store, "engine": info, "engine_start_s": round(start_s, 1)}


# ---- transformers and Flax --------------------------------------------------------------

def sequences(cases: dict, response_ids, vllm_lp: dict) -> dict:
    """Per prompt and path: the full token ids the model scores and how many are scored."""
    seqs = {}
    for name, p in cases.items():
        for path, tail in (("fixed", response_ids), ("sampled", vllm_lp[name]["sampled_ids"])):
            seqs[name, path] = (np.concatenate([p.token_ids, tail]).astype(np.int64), len(tail))
    return seqs


def hf_logprobs(hf, ids, n, image_pad_id, pixels=None):
    import torch
    kw = {"input_ids": torch.as_tensor(ids[None])}
    if pixels is not None:
        kw.update(pixel_values=torch.as_tensor(pixels.pixel_values_NxD),
                  image_grid_thw=torch.as_tensor(pixels.image_grid_thw_Ix3),
                  mm_token_type_ids=torch.as_tensor((ids[None] == image_pad_id).astype(np.int64)))
    with torch.no_grad():
        return token_logprobs(hf(**kw).logits[0].float().numpy(), ids, n)


def flax_logprobs(model_dir, seqs, pixels) -> dict:
    """All sequences in one right-padded batch (one compile); images in row order."""
    from dart_jax.policy import load_hf
    policy = load_hf(model_dir)
    keys = list(seqs)
    width = max(len(ids) for ids, _ in seqs.values())
    ids_BxT = np.zeros((len(keys), width), np.int64)
    mask_BxT = np.zeros_like(ids_BxT)
    pv, grids = [], []
    for b, key in enumerate(keys):
        ids, _ = seqs[key]
        ids_BxT[b, :len(ids)], mask_BxT[b, :len(ids)] = ids, 1
        if pixels[key[0]] is not None:
            pv.append(pixels[key[0]].pixel_values_NxD)
            grids.append(pixels[key[0]].image_grid_thw_Ix3)
    logits = policy.logits(ids_BxT, mask_BxT, np.concatenate(pv), np.concatenate(grids))
    return {key: token_logprobs(logits[b, :len(seqs[key][0])], seqs[key][0], seqs[key][1])
            for b, key in enumerate(keys)}


def vision_checks(hf, calls, pixels) -> dict:
    """vLLM's normalized pixel values and tower outputs vs ours / transformers', per tower call."""
    import torch
    by_grid = {}
    for p in pixels.values():
        if p is None:
            continue
        offsets = np.cumsum([0] + [int(np.prod(g)) for g in p.image_grid_thw_Ix3])
        for i, g in enumerate(p.image_grid_thw_Ix3):
            by_grid[tuple(g.tolist())] = p.pixel_values_NxD[offsets[i]:offsets[i + 1]]
    pix, emb = [], []
    for grid_thw, vllm_pixels, vllm_embeds in calls:
        ours = np.concatenate([by_grid[tuple(g)] for g in grid_thw])
        pix.append(np.abs(vllm_pixels - ours).max())
        with torch.no_grad():
            ref = hf.model.visual(torch.as_tensor(ours), grid_thw=torch.as_tensor(grid_thw)).pooler_output
        emb.append(np.abs(vllm_embeds - ref.numpy()).max() / np.abs(ref.numpy()).max())
    return {"tower_calls": len(calls), "pixel_values_max_abs": float(max(pix)),
            "embeds_max_rel": float(max(emb))}


def versions() -> dict:
    """The versions of the three stacks compared (and JAX's)."""
    import jax
    import torch
    import transformers
    import vllm
    return {"vllm": vllm.__version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "jax": jax.__version__}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--init-std", type=float, default=None, help="tiny model weight scale (TinySpec default)")
    ap.add_argument("--work", default=None, help="directory for the tiny model, kept (default: a temporary "
                    "directory, removed at the end)")
    args = ap.parse_args()
    with work_dir(args.work, "logprob_parity_") as work:
        print(json.dumps(measure(work, args.init_std)))


def measure(work: Path, init_std: float | None) -> dict:
    """The report: every gap and diagnostic, the tiny model built under `work`."""
    import torch
    from transformers import AutoImageProcessor, Qwen2_5_VLForConditionalGeneration

    from dart_jax.agent.prompt import PromptBuilder
    from dart_jax.agent.image_processing import ProcessedImages, preprocess_images
    from dart_jax.models.tiny import make_tiny_hf_dir

    overrides = {} if init_std is None else {"init_std": init_std}
    model_dir = make_tiny_hf_dir(work / "tiny", seed=0, **overrides)
    builder = PromptBuilder.from_pretrained(model_dir)
    cases = make_cases(builder)
    response_ids = builder.response_ids(RESPONSE)

    vllm_run = run_vllm(model_dir, cases, response_ids)
    vlp = vllm_run["logprobs"]
    seqs = sequences(cases, response_ids, vlp)
    pixels = {k: preprocess_images(p.images, builder.image_cfg) if p.images else None for k, p in cases.items()}

    hf = Qwen2_5_VLForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32,
                                                            attn_implementation="eager").eval()
    hlp = {k: hf_logprobs(hf, ids, n, builder.image_pad_id, pixels[k[0]]) for k, (ids, n) in seqs.items()}
    flp = flax_logprobs(model_dir, seqs, pixels)

    pil = AutoImageProcessor.from_pretrained(model_dir, backend="pil")
    report = {"logp": {}, "pil_processor": {}}
    for name, p in cases.items():
        v = np.concatenate([vlp[name]["fixed"], vlp[name]["sampled"]])
        h = np.concatenate([hlp[name, "fixed"], hlp[name, "sampled"]])
        f = np.concatenate([flp[name, "fixed"], flp[name, "sampled"]])
        report["logp"][name] = {"tokens": len(v), "vllm_vs_transformers": gap(v, h), "vllm_vs_flax": gap(v, f),
                                "transformers_vs_flax": gap(h, f),
                                "vllm_fixed_vs_transformers": gap(vlp[name]["fixed"], hlp[name, "fixed"]),
                                "vllm_sampled_vs_transformers": gap(vlp[name]["sampled"], hlp[name, "sampled"])}
        if p.images:
            pp = pil(images=list(p.images), return_tensors="np")
            pp = ProcessedImages(np.asarray(pp["pixel_values"], np.float32), np.asarray(pp["image_grid_thw"]))
            ids, n = seqs[name, "fixed"]
            report["pil_processor"][name] = {
                "pixel_values_max_abs": float(np.abs(pp.pixel_values_NxD - pixels[name].pixel_values_NxD).max()),
                "vllm_vs_transformers": gap(vlp[name]["fixed"], hf_logprobs(hf, ids, n, builder.image_pad_id, pp))}

    # the one-screenshot prompt with other pixels: how far the logprobs move with the image
    other = Image.fromarray(np.random.default_rng(7).integers(0, 256, (210, 160, 3), dtype=np.uint8))
    ids, n = seqs["one_image", "fixed"]
    moved = hf_logprobs(hf, ids, n, builder.image_pad_id, preprocess_images([other], builder.image_cfg))
    report["image_effect_max"] = gap(moved, hlp["one_image", "fixed"])["max"]
    report["vision"] = dict(vllm_run["engine"], **vision_checks(hf, vllm_run["vision_calls"], pixels))
    report["engine_start_s"] = vllm_run["engine_start_s"]
    report["init_std"] = json.loads((model_dir / "config.json").read_text())["text_config"]["initializer_range"]
    report["machine"] = machine() | versions()
    return report


if __name__ == "__main__":
    main()
