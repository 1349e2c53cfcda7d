"""UI-TARS-1.5 action text <-> Action, and the model-image <-> screen coordinate map."""

import ast
import importlib.util
import math
import random

import pytest

from envs.actions import (DEFAULT_SPACE, ActionParseError, ImageSpace, parse, render, render_call,
                          smart_resize, to_model, to_screen)
from envs.types import ACTION_KINDS, Action

SCREEN = (160, 210)  # MiniWoB++
DESKTOP = (1920, 1080)  # OSWorld


def _transformers_smart_resize():
    """transformers' own function; read from its source when the module cannot import
    (its image processors import torchvision, which may be absent on env hosts)."""
    name = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
    try:
        module = importlib.import_module(name)
        return module.smart_resize
    except Exception:
        spec = importlib.util.find_spec("transformers")
        if spec is None:
            pytest.skip("transformers is not installed")
        path = spec.submodule_search_locations[0] + "/models/qwen2_vl/image_processing_qwen2_vl.py"
        tree = ast.parse(open(path).read())
        fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "smart_resize")
        namespace = {"math": math}
        exec(compile(ast.Module([fn], []), path, "exec"), namespace)  # library source, not model text
        return namespace["smart_resize"]


def test_smart_resize_matches_transformers():
    reference = _transformers_smart_resize()
    rng = random.Random(0)
    sizes = [(210, 160), (1080, 1920), (720, 1280), (1, 150), (28, 28), (10_000, 60), (4000, 4000)]
    sizes += [(rng.randint(1, 5000), rng.randint(1, 5000)) for _ in range(2000)]
    space = DEFAULT_SPACE
    for h, w in sizes:
        if max(h, w) / min(h, w) > 200:
            continue
        assert smart_resize(h, w, space.factor, space.min_pixels, space.max_pixels) == \
            reference(h, w, factor=space.factor, min_pixels=space.min_pixels, max_pixels=space.max_pixels)


def test_known_sizes():
    assert DEFAULT_SPACE.model_size(1920, 1080) == (1932, 1092)  # DART.md
    assert DEFAULT_SPACE.model_size(160, 210) == (252, 336)


@pytest.mark.parametrize("screen", [SCREEN, DESKTOP, (400, 300)])
def test_coordinate_map_round_trip(screen):
    mw, mh = DEFAULT_SPACE.model_size(*screen)
    for x in range(0, screen[0], 7):
        for y in range(0, screen[1], 11):
            sx, sy = to_screen(to_model((x, y), screen), screen)
            assert abs(sx - x) <= screen[0] / mw and abs(sy - y) <= screen[1] / mh


def test_parse_click_maps_to_screen():
    action = parse("Thought: the yes button.\nAction: click(start_box='(126,168)')", SCREEN)
    assert action == Action(kind="click", point=(80.0, 105.0), thought="the yes button.")


@pytest.mark.parametrize("text, expected", [
    ("Action: left_double(start_box='<|box_start|>(0,0)<|box_end|>')", Action(kind="left_double", point=(0.0, 0.0))),
    ("Action: right_single(point='<point>252 336</point>')", Action(kind="right_single", point=(159.0, 209.0))),
    ("Action: drag(start_box='(0,0,252,336)', end_box='(63,84)')",
     Action(kind="drag", point=(80.0, 105.0), end_point=(40.0, 52.5))),
    ("Action: hotkey(key='Ctrl+Shift  t')", Action(kind="hotkey", keys=("ctrl", "shift", "t"))),
    ("Action: hotkey(key='return')", Action(kind="hotkey", keys=("enter",))),
    ("Action: type(content='It\\'s \"ok\"\\n')", Action(kind="type", content="It's \"ok\"\n")),
    ("Action: type(content='it's fine')", Action(kind="type", content="it's fine")),
    ("Action: type(content='a, b=c')", Action(kind="type", content="a, b=c")),
    ("Action: scroll(start_box='(126,168)', direction='up')", Action(kind="scroll", point=(80.0, 105.0), direction="up")),
    ("Action: scroll(direction=\"down\")", Action(kind="scroll", direction="down")),
    ("Action: wait()", Action(kind="wait")),
    ("Action: finished(content='done')", Action(kind="finished", content="done")),
    ("Action: finished()", Action(kind="finished")),
    ("Action: call_user()", Action(kind="call_user")),
    ("Reflection: r\nAction_Summary: s\nAction: wait()", Action(kind="wait", thought="s")),
])
def test_parse_formats(text, expected):
    assert parse(text, SCREEN) == expected


@pytest.mark.parametrize("text", [
    "", "click(start_box='(1,2)')", "Action: ", "Action: click()", "Action: click(start_box='(1,2)'",
    "Action: click(start_box='(300,2)')", "Action: click(start_box='(-1,2)')", "Action: click(start_box='(a,b)')",
    "Action: clack(start_box='(1,2)')", "Action: click(start_box='(1,2)', extra='x')",
    "Action: click(start_box=(1,2))", "Action: scroll(direction='sideways')", "Action: hotkey(key='ctrl hyper')",
    "Action: hotkey(key='a b c d e')", "Action: wait()\nAction:", "Action: wait() now",
    "Action: type(content='x', content='y')", "Action: __import__('os').system('true')",
    "Action: click(start_box='(1,2)') + 1", "Action: type(content='" + "x" * 40_000 + "')",
])
def test_parse_rejects(text):
    with pytest.raises(ActionParseError):
        parse(text, SCREEN)


def _random_action(rng: random.Random, screen) -> Action:
    point = lambda: (rng.uniform(0, screen[0] - 1), rng.uniform(0, screen[1] - 1))  # noqa: E731
    kind = rng.choice(ACTION_KINDS)
    text = "".join(rng.choice("abc 'ñ\"\\\n,=()") for _ in range(rng.randint(1, 12)))
    return Action(kind=kind, thought="t", point=point() if kind != "hotkey" and kind in
                  ("click", "left_double", "right_single", "drag", "scroll") else None,
                  end_point=point() if kind == "drag" else None,
                  keys=("ctrl", "c") if kind == "hotkey" else (),
                  content=text if kind in ("type", "finished") else "",
                  direction=rng.choice(["up", "down", "left", "right"]) if kind == "scroll" else "")


@pytest.mark.parametrize("screen", [SCREEN, DESKTOP])
@pytest.mark.parametrize("box_tokens", [True, False])
def test_render_parse_round_trip(screen, box_tokens):
    rng = random.Random(1)
    mw, mh = DEFAULT_SPACE.model_size(*screen)
    tol = (screen[0] / mw, screen[1] / mh)
    for _ in range(500):
        action = _random_action(rng, screen)
        back = parse(render(action, screen, box_tokens=box_tokens), screen)
        assert (back.kind, back.keys, back.content, back.direction, back.thought) == \
               (action.kind, action.keys, action.content, action.direction, action.thought)
        for a, b in ((action.point, back.point), (action.end_point, back.end_point)):
            assert (a is None) == (b is None)
            if a is not None:
                assert abs(a[0] - b[0]) <= tol[0] and abs(a[1] - b[1]) <= tol[1]


def test_agrees_with_ui_tars_parser():
    """Where ui-tars' own parser reads a valid action, its relative coordinates match ours."""
    parser = pytest.importorskip("ui_tars.action_parser")
    rng = random.Random(2)
    for _ in range(200):
        x, y = rng.randint(0, 1932), rng.randint(0, 1092)
        text = f"Thought: t\nAction: click(start_box='({x},{y})')"
        theirs = parser.parse_action_to_structure_output(text, 28, 1080, 1920)[0]
        rel = ast.literal_eval(theirs["action_inputs"]["start_box"])
        ours = parse(text, DESKTOP)
        assert math.isclose(ours.point[0], min(rel[0] * 1920, 1919), abs_tol=1e-6)
        assert math.isclose(ours.point[1], min(rel[1] * 1080, 1079), abs_tol=1e-6)


@pytest.mark.parametrize("text, expected", [
    ("Action: type(content='Action: hi')", Action(kind="type", content="Action: hi")),
    ("Thought: x\nAction: finished(content='The answer. Action: none')",
     Action(kind="finished", content="The answer. Action: none", thought="x")),
    ("Action: type(content='a)\n\nb(')", Action(kind="type", content="a)\n\nb(")),
    ("Action: type(content='a\\')\n\nwait()\nAction: wait(')",
     Action(kind="type", content="a')\n\nwait()\nAction: wait(")),
    ('Action: finished(content="said \\"Action: click(start_box=\'(1,2)\')\\"")',
     Action(kind="finished", content="said \"Action: click(start_box='(1,2)')\"")),
    ("Action: finished(content='f(x') then g(y)')", Action(kind="finished", content="f(x') then g(y)")),
    ("Thought: open the Action: menu\nAction: wait()", Action(kind="wait", thought="open the Action: menu")),
])
def test_text_inside_arguments_never_splits_the_action(text, expected):
    assert parse(text, SCREEN) == expected


@pytest.mark.parametrize("text, reason", [
    ("Action: type(content='hi')Action: click(start_box='(1,1)')", "2 actions in one response (type, click)"),
    ("Action: hotkey(key='ctrl a')\nAction: type(content='zz')", "2 actions in one response (hotkey, type)"),
    ("Thought: t\nAction: type(content='x')\n\nclick(start_box='(1,2)')",
     "2 actions in one response (type, click)"),
    ("Action: click(start_box='(1,2)')\nhotkey(key='enter')", "2 actions in one response (click, hotkey)"),
    ("Action: wait()\n\nAction: finished(content='a)\n\nb(')\n\n call_user()",
     "3 actions in one response (wait, finished, call_user)"),
    ("Action: type(content='it's')\n\n" + "wait()\n\n" * 6 + "wait()",
     "8 actions in one response (type, wait, wait, wait, ...)"),
])
def test_several_actions_are_refused(text, reason):
    with pytest.raises(ActionParseError) as refusal:
        parse(text, SCREEN)
    assert str(refusal.value) == reason + "; one action per step"


def _from_ui_tars(their: dict, screen) -> Action:
    """ui-tars' reading as an Action (its boxes are [x, y, x, y] relative to the screen)."""
    inputs = their["action_inputs"]

    def point(name):
        if name not in inputs:
            return None
        x, y = ast.literal_eval(inputs[name])[:2]
        return min(x * screen[0], screen[0] - 1), min(y * screen[1], screen[1] - 1)

    return Action(kind=their["action_type"], point=point("start_box"), end_point=point("end_box"),
                  keys=tuple(inputs.get("key", "").split()), content=inputs.get("content", ""),
                  direction=inputs.get("direction", ""), thought=their["thought"])


def _ui_tars_reads(action: Action) -> bool:
    """ui-tars misreads a backslash (its quote escaping doubles escaped ones) and `')` (its
    type-content pattern stops there, escaped or not): it has no opinion on those."""
    return "\\" not in action.content and "')" not in action.content


def test_several_actions_are_the_calls_ui_tars_splits():
    """UI-TARS separates several actions by blank lines: ui-tars' parser finds as many calls
    as we count, and reads each one alone as we do (it left-strips values)."""
    parser = pytest.importorskip("ui_tars.action_parser")
    rng = random.Random(3)
    checked = 0
    while checked < 300:
        actions = [_random_action(rng, DESKTOP) for _ in range(rng.randint(1, 3))]
        if not all(map(_ui_tars_reads, actions)):
            continue
        calls = [render_call(a, DESKTOP, box_tokens=False) for a in actions]
        text = "Thought: t\nAction: " + "\n\n".join(calls)
        theirs = parser.parse_action_to_structure_output(text, 28, 1080, 1920)
        assert len(theirs) == len(calls)
        if len(calls) > 1:
            with pytest.raises(ActionParseError, match=f"^{len(calls)} actions in one response"):
                parse(text, DESKTOP)
        for call, their in zip(calls, theirs):
            ours, expected = parse(f"Thought: t\nAction: {call}", DESKTOP), _from_ui_tars(their, DESKTOP)
            assert (ours.kind, ours.keys, ours.content.lstrip(), ours.direction, ours.thought) == \
                (expected.kind, expected.keys, expected.content, expected.direction, expected.thought)
            for a, b in ((ours.point, expected.point), (ours.end_point, expected.end_point)):
                assert (a is None) == (b is None) and (a is None or a == pytest.approx(b, abs=1e-6))
        checked += 1


def test_custom_image_space():
    space = ImageSpace(min_pixels=4 * 28 * 28, max_pixels=64 * 28 * 28)
    mw, mh = space.model_size(*DESKTOP)
    assert mw * mh <= space.max_pixels
    assert parse(f"Action: click(start_box='({mw},{mh})')", DESKTOP, space).point == (1919.0, 1079.0)
