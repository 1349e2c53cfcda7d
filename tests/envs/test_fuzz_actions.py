"""10,000 random and mutated action strings: `parse` raises nothing but ActionParseError."""

import random
import time

from envs.actions import ActionParseError, parse

SEEDS = [
    "Thought: click it\nAction: click(start_box='(126,168)')",
    "Action: left_double(start_box='<|box_start|>(10,20)<|box_end|>')",
    "Action: right_single(point='<point>100 200</point>')",
    "Action: drag(start_box='(1,2)', end_box='(3,4)')",
    "Action: hotkey(key='ctrl shift t')",
    "Action: type(content='hello \\'world\\'\\n')",
    "Action: scroll(start_box='(5,6)', direction='down')",
    "Action: wait()", "Action: finished(content='x')", "Action: call_user()",
]
ALPHABET = "()[]{}<>|'\"\\,=:._- \n\t0123456789abcxyzActionThought" + "é✓\x00\u202e"
TOKENS = ["Action:", "Thought:", "start_box=", "end_box=", "content=", "'", '"', "(", ")", ",",
          "<|box_start|>", "<|box_end|>", "<point>", "</point>", "\n\n", "1e309", "-0", "nan", "9" * 400]


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
        try:
            parse(text, rng.choice(screens))
            valid += 1
        except ActionParseError:
            invalid += 1
    assert valid > 100 and invalid > 5000  # the mutations exercise both outcomes
    assert time.monotonic() - start < 30
