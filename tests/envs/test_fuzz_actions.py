"""10,000 random and mutated action strings: `parse` raises nothing but ActionParseError,
and a response it reads as one action is refused once a second action follows it."""

import random
import time

import pytest

from envs.actions import MAX_TEXT_CHARS, ActionParseError, parse

SEEDS = [
    "Thought: click it\nAction: click(start_box='(126,168)')",
    "Action: left_double(start_box='<|box_start|>(10,20)<|box_end|>')",
    "Action: right_single(point='<point>100 200</point>')",
    "Action: drag(start_box='(1,2)', end_box='(3,4)')",
    "Action: hotkey(key='ctrl shift t')",
    "Action: type(content='hello \\'world\\'\\n')",
    "Action: scroll(start_box='(5,6)', direction='down')",
    "Action: wait()", "Action: finished(content='x')", "Action: call_user()",
    "Thought: x\nAction: finished(content='The answer. Action: none')",
    "Action: type(content='a)\n\nb(')", "Action: hotkey(key='ctrl a')\n\ntype(content='zz')",
]
ALPHABET = "()[]{}<>|'\"\\,=:._- \n\t0123456789abcxyzActionThought" + "é✓\x00\u202e"
TOKENS = ["Action:", "Thought:", "start_box=", "end_box=", "content=", "'", '"', "(", ")", ",",
          "<|box_start|>", "<|box_end|>", "<point>", "</point>", "\n\n", "1e309", "-0", "nan", "9" * 400,
          ")\n\n", "')", "\\'", "wait()", "type("]
SECOND_ACTIONS = ["\n\nwait()", "Action: wait()", "\nAction: type(content='x')"]


def _mutate(rng: random.Random, text: str) -> str:
    chars = list(text)
    for _ in range(rng.randint(1, 6)):
        op, i = rng.randrange(5), rng.randrange(len(chars) + 1)
        if op == 0 and chars:
            del chars[min(i, len(chars) - 1)]
        elif op == 1:
            chars.insert(i, rng.choice(ALPHABET))
        elif op == 2:
            chars[i:i] = rng.choice(TOKENS)
        elif op == 3 and chars:
            j = rng.randrange(len(chars))
            chars[min(i, j):max(i, j)] = chars[min(i, j):max(i, j)] * rng.randint(1, 3)
        else:
            chars = chars[:i]
    return "".join(chars)


def _random(rng: random.Random) -> str:
    return "".join(rng.choice(ALPHABET) if rng.random() < 0.7 else rng.choice(TOKENS)
                   for _ in range(rng.randint(0, 80)))


def test_fuzz_parser_only_raises_action_parse_error():
    rng = random.Random(1234)
    screens = [(160, 210), (1920, 1080), (1, 1), (0, 10), (10_000, 10)]
    valid = invalid = 0
    start = time.monotonic()
    for i in range(10_000):
        text = _mutate(rng, rng.choice(SEEDS)) if i % 2 else _random(rng)
        if i % 500 == 0:
            text = text * 400  # long inputs stay fast
        screen = rng.choice(screens)
        try:
            parse(text, screen)
        except ActionParseError:
            invalid += 1
            continue
        valid += 1
        second = rng.choice(SECOND_ACTIONS)
        if len(text + second) <= MAX_TEXT_CHARS:
            with pytest.raises(ActionParseError, match="^2 actions in one response"):
                parse(text + second, screen)
    assert valid > 100 and invalid > 5000  # the mutations exercise both outcomes
    assert time.monotonic() - start < 30


ADVERSARIAL = [  # each forces a naive scanner to rescan the rest of the text many times
    "Action: type(content='" * 2000, "Action: type(content='hi')" + "Action: " * 4000,
    "Action: finished(content='" + "')x" * 10_000, "Action: type(content='" + "', a" * 8000,
    "Action: wait()\n\n" * 2000, "Action: " + "\\" * 30_000,
]


def test_adversarial_inputs_scan_in_linear_time():
    start = time.monotonic()
    for text in ADVERSARIAL:
        with pytest.raises(ActionParseError):
            parse(text[:MAX_TEXT_CHARS], (160, 210))
    assert time.monotonic() - start < 1.0
