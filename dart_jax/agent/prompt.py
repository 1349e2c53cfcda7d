"""The UI-TARS-1.5 prompt, as exact token ids (tokenizers + numpy + PIL; no torch, no JAX).

Step t of an episode has screenshots s_0..s_t and the policy's responses r_0..r_{t-1}:

    system     You are a helpful assistant.
    user       COMPUTER_USE_PROMPT(instruction) [s_0]
    assistant  r_0            (history form: points wrapped in <|box_start|>...<|box_end|>)
    user       [s_1]
    ...
    assistant  r_{t-1}
    user       [s_t]
    assistant  <- generation starts here

Only the last `max_images` screenshots stay (oldest first, s_0 included); a user turn whose
screenshot was dropped disappears, its assistant turn stays. Only the last `max_responses`
assistant texts stay. Images are rendered as <|vision_start|><|image_pad|><|vision_end|> and
each <|image_pad|> is expanded to the image's grid_t*grid_h*grid_w / merge_size^2 tokens, as
transformers' processor and vLLM expand it, so the ids are what the model sees.

vLLM takes a token prompt with ONE <|image_pad|> per image and expands it itself (given
expanded ids it expands the first placeholder again), so rollout workers send
`Prompt.placeholder_ids`; vLLM's `RequestOutput.prompt_token_ids` then equals `Prompt.token_ids`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np
from tokenizers import Tokenizer

from dart_jax.agent.config import PromptConfig
from dart_jax.agent.image_processing import ImageLike, ImageProcessorConfig

SYSTEM_PROMPT = "You are a helpful assistant."

# The one copy of the action space (envs/actions.py parses what the model writes back).
ACTION_SPACE = """click(start_box='<|box_start|>(x1,y1)<|box_end|>')
left_double(start_box='<|box_start|>(x1,y1)<|box_end|>')
right_single(start_box='<|box_start|>(x1,y1)<|box_end|>')
drag(start_box='<|box_start|>(x1,y1)<|box_end|>', end_box='<|box_start|>(x3,y3)<|box_end|>')
hotkey(key='ctrl c') # Split keys with a space and use lowercase. Do not use more than 3 keys in one hotkey action.
type(content='xxx') # Use escape characters \\', \\", and \\n in content part to ensure we can parse the content in normal python string format. If you want to submit your input, use \\n at the end of content.
scroll(start_box='<|box_start|>(x1,y1)<|box_end|>', direction='down or up or right or left') # Show more information on the `direction` side.
wait() # Sleep for 5s and take a screenshot to check for any changes.
finished(content='xxx') # Use escape characters \\', \\", and \\n in content part to ensure we can parse the content in normal python string format.
call_user() # Submit the task and call the user when the task is unsolvable, or when you need the user's help."""

COMPUTER_USE_PROMPT = """You are a GUI agent. You are given a task and your action history, with screenshots. You need to perform the next action to complete the task.

## Output Format
```
Thought: ...
Action: ...
```

## Action Space

""" + ACTION_SPACE + """


## Note
- Use {language} in `Thought` part.
- Write a small plan and finally summarize your next action (with its target element) in one sentence in `Thought` part.

## User Instruction
{instruction}
"""

# For small policies trained from scratch (the local learning proof): the task alone. The
# UI-TARS text above is ~540 tokens the policy must learn to look past before it can find
# the instruction; a model pretrained on it (UI-TARS, DART-GUI) wants it verbatim.
COMPACT_PROMPT = "Task: {instruction}\n"
TEMPLATES = {"computer_use": COMPUTER_USE_PROMPT, "compact": COMPACT_PROMPT}  # PromptConfig.template

IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
_POINT_ARG = re.compile(r"(start_box|end_box)='(\([^()']*\))'")


def history_form(response: str) -> str:
    """A response as it appears in later prompts: points wrapped in box tokens (UI-TARS)."""
    return _POINT_ARG.sub(r"\1='<|box_start|>\2<|box_end|>'", response)


def build_messages(instruction: str, screenshots: Sequence[ImageLike], responses: Sequence[str],
                   cfg: PromptConfig = PromptConfig(), screen_text: str = "") -> list[dict]:
    """Chat messages (transformers' content-part format) for the step after `responses`.

    `screenshots` has one more entry than `responses`: the observation before each response
    and the current one. Image parts carry the screenshot under "image". With
    `cfg.screen_text`, `screen_text` (the current screen's elements) follows the current
    screenshot in the last user turn; earlier screens' texts are never kept. With
    `cfg.task_position == "last"` the task text ends the last user turn instead of opening the
    first.
    """
    if len(screenshots) != len(responses) + 1:
        raise ValueError(f"need len(screenshots) == len(responses) + 1, got {len(screenshots)} "
                         f"screenshots and {len(responses)} responses")
    first_image = len(screenshots) - cfg.max_images
    first_response = len(responses) - cfg.max_responses

    def image_turn(i: int) -> list[dict]:
        return [{"type": "image", "image": screenshots[i]}] if i >= first_image else []

    task = TEMPLATES[cfg.template].format(language=cfg.language, instruction=instruction)
    first = cfg.task_position == "first"
    messages = [{"role": "system", "content": [{"type": "text", "text": SYSTEM_PROMPT}]},
                {"role": "user", "content": [{"type": "text", "text": task}] * first + image_turn(0)}]
    for i, response in enumerate(responses):
        if i >= first_response:
            messages.append({"role": "assistant", "content": [{"type": "text", "text": history_form(response)}]})
        if i + 1 >= first_image:
            messages.append({"role": "user", "content": image_turn(i + 1)})
    if cfg.screen_text and screen_text:
        messages[-1]["content"].append({"type": "text", "text": f"\nScreen elements:\n{screen_text}"})
    if not first:
        messages[-1]["content"].append({"type": "text", "text": f"\n{task}"})
    return messages


def render(messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
    """The Qwen2.5-VL chat template (ChatML; one placeholder per image) in plain Python."""
    parts = []
    if messages and messages[0]["role"] != "system":
        parts.append(f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n")
    for m in messages:
        content = m["content"]
        if not isinstance(content, str):
            content = "".join(IMAGE_PLACEHOLDER if p["type"] == "image" else p["text"] for p in content)
        parts.append(f"<|im_start|>{m['role']}\n{content}<|im_end|>\n")
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)


@dataclass(frozen=True)
class Prompt:
    token_ids: np.ndarray  # int32 [T]: what the model sees, each <|image_pad|> expanded
    placeholder_ids: np.ndarray  # int32 [T']: one <|image_pad|> per image, what vLLM takes as a token prompt
    images: tuple  # the screenshots that are in the prompt, in prompt order
    image_grid_thw: np.ndarray  # int64 [images, 3]
    responses: tuple[str, ...] = ()  # the episode's earlier answers it was built from (build), oldest first


class PromptBuilder:
    """Renders and tokenizes UI-TARS prompts with a model directory's tokenizer.json."""

    def __init__(self, tokenizer, image_cfg: ImageProcessorConfig, cfg: PromptConfig = PromptConfig()):
        self.tokenizer = tokenizer
        self.image_cfg = image_cfg
        self.cfg = cfg
        self.image_pad_id = self._special_id("<|image_pad|>")
        self.im_end_id = self._special_id("<|im_end|>")

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, cfg: PromptConfig = PromptConfig()) -> "PromptBuilder":
        model_dir = Path(model_dir)
        return cls(Tokenizer.from_file(str(model_dir / "tokenizer.json")),
                   ImageProcessorConfig.from_pretrained(model_dir), cfg)

    def _special_id(self, token: str) -> int:
        i = self.tokenizer.token_to_id(token)
        if i is None:
            raise ValueError(f"tokenizer has no {token} token: not a Qwen2.5-VL tokenizer")
        return i

    def encode_text(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def build(self, instruction: str, screenshots: Sequence[ImageLike], responses: Sequence[str],
              screen_text: str = "") -> Prompt:
        messages = build_messages(instruction, screenshots, responses, self.cfg, screen_text)
        return replace(self.tokenize_messages(messages), responses=tuple(responses))

    def tokenize_messages(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> Prompt:
        images = tuple(p["image"] for m in messages if not isinstance(m["content"], str)
                       for p in m["content"] if p["type"] == "image")
        grids = np.asarray([self.image_cfg.grid_thw(*_hw(im)) for im in images], np.int64).reshape(-1, 3)
        ids = np.asarray(self.encode_text(render(messages, add_generation_prompt)), np.int32)
        return Prompt(self.expand_image_pads(ids, grids), ids, images, grids)

    def expand_image_pads(self, ids: Sequence[int], grids_Ix3: np.ndarray) -> np.ndarray:
        """Replace the k-th <|image_pad|> by grid_t*grid_h*grid_w / merge^2 copies of itself."""
        ids = np.asarray(ids, np.int32)
        where = np.flatnonzero(ids == self.image_pad_id)
        if len(where) != len(grids_Ix3):
            raise ValueError(f"{len(where)} image placeholders for {len(grids_Ix3)} images")
        counts = np.ones(len(ids), np.int64)
        counts[where] = np.prod(grids_Ix3, axis=1) // self.image_cfg.merge_size**2
        return np.repeat(ids, counts)

    def response_ids(self, text: str, add_eos: bool = True) -> np.ndarray:
        """Token ids of an assistant response (for SFT), ending with <|im_end|> like a sample."""
        ids = self.encode_text(text) + ([self.im_end_id] if add_eos else [])
        return np.asarray(ids, np.int32)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(map(int, ids)), skip_special_tokens=skip_special_tokens)


def _hw(image: ImageLike) -> tuple[int, int]:
    """Height and width after EXIF orientation (which vLLM applies before processing)."""
    if isinstance(image, np.ndarray):
        return image.shape[0], image.shape[1]
    if image.getexif().get(0x0112) in (5, 6, 7, 8):  # orientations that swap the axes
        return image.width, image.height
    return image.height, image.width
