"""UI-TARS prompt ids equal transformers' processor(apply_chat_template(...)) input_ids."""

import dataclasses
import subprocess
import sys
import typing

import numpy as np
import pytest
from PIL import Image

from dart_jax.agent.config import PromptConfig
from dart_jax.agent.prompt import (COMPUTER_USE_PROMPT, SYSTEM_PROMPT, TEMPLATES, PromptBuilder,
                                   build_messages, history_form, render)


@pytest.fixture(scope="module")
def builder(tiny_dir):
    return PromptBuilder.from_pretrained(tiny_dir)


def _screens(n, sizes=((210, 160), (300, 420), (160, 210))):
    rng = np.random.default_rng(n)
    return [Image.fromarray(rng.integers(0, 256, (*sizes[i % len(sizes)], 3), dtype=np.uint8)) for i in range(n)]


def _responses(n):
    return [f"Thought: step {i}: the button is near the top.\nAction: click(start_box='({10 + i},{20 + i})')"
            for i in range(n)]


def _processor_or_skip(tiny_dir):
    """transformers' processor of the tiny policy: skipped only where transformers is not
    installed; a processor that fails to load our files fails the test."""
    return pytest.importorskip("transformers").AutoProcessor.from_pretrained(tiny_dir)


def _images_in(messages):
    return [p["image"] for m in messages for p in m["content"] if p["type"] == "image"]


def test_first_step_layout():
    shots = _screens(1)
    msgs = build_messages("Open the menu.", shots, [])
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert msgs[0]["content"][0]["text"] == SYSTEM_PROMPT
    assert msgs[1]["content"][0]["text"] == COMPUTER_USE_PROMPT.format(language="English",
                                                                       instruction="Open the menu.")
    assert _images_in(msgs) == shots
    text = render(msgs)
    assert text.endswith("## User Instruction\nOpen the menu.\n<|vision_start|><|image_pad|><|vision_end|>"
                         "<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("t", [0, 2])
def test_screen_text_follows_the_current_screenshot_only_when_asked(t):
    shots, elements = _screens(t + 1), '[1] button "OK" (10,20,60,24) point="(39,31)"'
    plain = build_messages("Press OK.", shots, _responses(t), PromptConfig(), elements)
    assert "Screen elements" not in render(plain)
    msgs = build_messages("Press OK.", shots, _responses(t), PromptConfig(screen_text=True), elements)
    assert msgs[:-1] == plain[:-1]  # every earlier turn as without it
    assert msgs[-1]["content"][-1] == {"type": "text", "text": f"\nScreen elements:\n{elements}"}
    assert render(msgs).count("Screen elements") == 1
    assert render(msgs).endswith(f"<|vision_end|>\nScreen elements:\n{elements}<|im_end|>\n<|im_start|>assistant\n")
    assert build_messages("Press OK.", shots, _responses(t), PromptConfig(screen_text=True)) == plain


@pytest.mark.parametrize("t", [0, 3])
def test_task_last_ends_the_current_turn_the_same_distance_before_every_response(t):
    shots, elements = _screens(t + 1), '[1] button "OK" (10,20,60,24) point="(39,31)"'
    cfg = PromptConfig(template="compact", screen_text=True, task_position="last", max_images=1)
    msgs = build_messages("Press OK.", shots, _responses(t), cfg, elements)
    text = render(msgs)
    assert text.count("Task: Press OK.") == 1
    assert text.endswith(f"\nScreen elements:\n{elements}\nTask: Press OK.\n<|im_end|>\n<|im_start|>assistant\n")
    first = build_messages("Press OK.", shots, _responses(t), dataclasses.replace(cfg, task_position="first"),
                           elements)
    assert render(first).count("Task: Press OK.") == 1
    assert not render(first).endswith("Task: Press OK.\n<|im_end|>\n<|im_start|>assistant\n")
    assert _images_in(msgs) == _images_in(first) == shots[-1:]
    with pytest.raises(ValueError, match="task_position"):
        PromptConfig(task_position="middle")


@pytest.mark.parametrize("t", [0, 1, 4, 5, 9])
def test_keeps_last_five_screenshots_and_all_responses(t):
    shots, resps = _screens(t + 1), _responses(t)
    msgs = build_messages("Do it.", shots, resps)
    assert _images_in(msgs) == shots[-5:]
    assert [m["content"][0]["text"] for m in msgs if m["role"] == "assistant"] == [history_form(r) for r in resps]
    assert all(m["content"] for m in msgs)  # no empty user turns: a dropped screenshot drops its turn
    assert msgs[-1]["role"] == "user" and msgs[-1]["content"][-1]["image"] is shots[-1]
    # Screenshot i+1 follows response i; the turns of dropped screenshots are gone.
    expected = ["system", "user"]
    for i in range(t):
        expected += ["assistant"] + (["user"] if i + 1 >= t + 1 - 5 else [])
    assert [m["role"] for m in msgs] == expected


def test_response_cap_drops_oldest():
    cfg = PromptConfig(max_images=2, max_responses=3)
    shots, resps = _screens(8), _responses(7)
    msgs = build_messages("Do it.", shots, resps, cfg)
    assert [m["content"][0]["text"] for m in msgs if m["role"] == "assistant"] == [history_form(r) for r in resps[-3:]]
    assert _images_in(msgs) == shots[-2:]
    with pytest.raises(ValueError, match="len\\(screenshots\\)"):
        build_messages("x", shots, resps[:3])


def test_history_form_wraps_points_once():
    r = "Thought: drag it.\nAction: drag(start_box='(1,2)', end_box='(30, 40)')"
    assert history_form(r) == ("Thought: drag it.\nAction: drag(start_box='<|box_start|>(1,2)<|box_end|>', "
                               "end_box='<|box_start|>(30, 40)<|box_end|>')")
    assert history_form(history_form(r)) == history_form(r)
    assert history_form("Action: type(content='(1,2)')") == "Action: type(content='(1,2)')"


def test_image_pads_are_expanded(builder):
    shots = _screens(3)
    p = builder.build("Click OK.", shots, _responses(2))
    grids = p.image_grid_thw
    assert grids.tolist() == [[1, 24, 18], [1, 22, 30], [1, 18, 24]]  # 210x160 -> 336x252, 300x420 -> 308x420
    assert int((p.token_ids == builder.image_pad_id).sum()) == int(grids.prod(axis=1).sum()) // 4
    assert list(p.images) == shots and p.token_ids.dtype == np.int32
    assert int((p.placeholder_ids == builder.image_pad_id).sum()) == 3  # vLLM's token prompts: one per image
    assert np.array_equal(builder.expand_image_pads(p.placeholder_ids, grids), p.token_ids)
    text = builder.decode(p.token_ids, skip_special_tokens=False)
    assert text.count("<|vision_start|>") == 3 and "<|box_start|>(10,20)<|box_end|>" in text


def test_response_ids(builder):
    text = "Thought: done.\nAction: finished(content='ok')"
    ids = builder.response_ids(text)
    assert ids[-1] == builder.im_end_id and builder.decode(ids) == text
    assert builder.decode(builder.response_ids(text, add_eos=False), skip_special_tokens=False) == text


@pytest.mark.parametrize("t, cfg", [(0, PromptConfig()), (2, PromptConfig()), (7, PromptConfig()),
                                    (6, PromptConfig(max_images=2, max_responses=3, language="Chinese")),
                                    (3, PromptConfig(max_images=1, template="compact"))])
def test_ids_equal_transformers_processor(tiny_dir, builder, t, cfg):
    proc = _processor_or_skip(tiny_dir)
    shots, resps = _screens(t + 1), _responses(t)
    msgs = build_messages("Fill in the form and press Submit.", shots, resps, cfg)
    text = proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == render(msgs)
    ref = proc(text=[text], images=_images_in(msgs), return_tensors="np")
    ours = PromptBuilder.from_pretrained(tiny_dir, cfg).build("Fill in the form and press Submit.", shots, resps)
    assert np.array_equal(ours.token_ids, ref["input_ids"][0])
    assert np.array_equal(ours.image_grid_thw, ref["image_grid_thw"])


def test_prompt_module_imports_no_torch_or_jax():
    code = ("import sys, dart_jax.agent.prompt; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'jax', 'flax', 'transformers'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_every_template_the_config_accepts_has_a_text():
    accepted = typing.get_args(typing.get_type_hints(PromptConfig)["template"])
    assert set(accepted) == set(TEMPLATES)
