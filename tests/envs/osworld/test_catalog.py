"""OSWorld checkouts: hand-written tasks in OSWorld's format in a temporary checkout, the
offline listing per image, the split, and hostile checkouts."""

import json

import msgspec
import pytest

from dart_jax.wire.messages import TaskSpec
from envs.config import OSWorldSlots
from envs.osworld import catalog
from envs.osworld.checkout import MAX_TASK_BYTES, Checkout
from envs.osworld.env import OSWorldEnv
from envs.types import Task, TaskError


def _task(task_id, func="check_include_exclude", config=(), result=None, expected=None, apps=None):
    example = {"id": task_id, "snapshot": "os", "instruction": f"do {task_id}", "source": "", "config": list(config),
               "trajectory": "trajectories/", "related_apps": apps or [],
               "evaluator": {"func": func, "result": result or {"type": "vm_command_line", "command": "ls ~"},
                             "expected": expected or {"type": "rule", "rules": {"include": ["x"], "exclude": []}}}}
    return example


TASKS = {
    "os": [_task("os-runs", config=[{"type": "execute", "parameters": {"command": ["touch", "x"]}}]),
           _task("os-metric", func="compare_table")],
    "chrome": [_task("chrome-web", func="is_expected_tabs", result={"type": "open_tabs_info"},
                     config=[{"type": "chrome_open_tabs", "parameters": {"urls_to_open": ["https://example.org"]}}])],
    "multi_apps": [_task("multi-drive", config=[{"type": "googledrive", "parameters": {"settings_file": "x"}}]),
                   dict(_task("multi-clone"), instruction="Clone https://github.com/x/y into /home/user."),
                   _task("multi-bookmark", func="is_expected_bookmarks", result={"type": "bookmarks"},
                         expected={"type": "rule", "rules": {"urls": [["https://jimfan.me/"]]}}),
                   _task("multi-calc", apps=["libreoffice calc", "os"])],
    "gimp": [_task("gimp-app", func="exact_match", result={"type": "rule", "rules": {"expected": 1}},
                   expected={"type": "rule", "rules": {"expected": 1}})],
}


@pytest.fixture
def checkout(tmp_path):
    root = tmp_path / "OSWorld"
    for domain, examples in TASKS.items():
        (root / "evaluation_examples" / "examples" / domain).mkdir(parents=True)
        for example in examples:
            path = root / "evaluation_examples" / "examples" / domain / f"{example['id']}.json"
            path.write_text(json.dumps(example))
    index = {domain: [e["id"] for e in examples] for domain, examples in TASKS.items()}
    (root / "evaluation_examples" / "test_all.json").write_text(json.dumps(index))
    (root / "evaluation_examples" / "test_small.json").write_text(json.dumps({"os": ["os-runs"]}))
    return Checkout(root)


def test_the_listing_says_per_image_what_runs_and_why_not(checkout):
    assert checkout.indexes() == ["test_all.json", "test_small.json"]
    small = catalog.listing(checkout, "test_all.json", catalog.image.APPS["desktop"], None)
    assert small.verdicts == {
        "os/os-runs": "runs",
        "os/os-metric": "evaluator: metric 'compare_table'",
        "chrome/chrome-web": "live web: https://example.org, open_tabs_info",
        "multi_apps/multi-drive": "google account: googledrive",
        "multi_apps/multi-clone": "live web: https://github.com/x/y",
        "multi_apps/multi-bookmark": "live web: https://jimfan.me/",
        "multi_apps/multi-calc": "missing app: libreoffice_calc",
        "gimp/gimp-app": "missing app: gimp"}
    apps = catalog.listing(checkout, "test_all.json", catalog.image.APPS["osworld"], None)
    assert {k for k, v in apps.verdicts.items() if v == "runs"} == {"os/os-runs", "gimp/gimp-app",
                                                                     "multi_apps/multi-calc"}
    table = catalog.table(small).splitlines()
    assert table[0].startswith("| domain | tasks | runs offline | google account | live web | missing app |")
    assert "| os | 2 | 1 | 0 | 0 | 0 | 1 | 0 | 0 |" in table
    assert table[-1].startswith("| total | 8 | 1 | 1 | 3 | 2 | 1 |")


def test_with_the_sidecar_only_the_setup_steps_the_host_runs_count(checkout):
    """desktop-env scores compare_table; a setup step the env server lacks still keeps a task off."""
    examples = checkout.root / "evaluation_examples" / "examples" / "os"
    (examples / "os-history.json").write_text(json.dumps(_task("os-history", func="compare_table", config=[
        {"type": "update_browse_history", "parameters": {"history": []}}])))
    (checkout.root / "evaluation_examples" / "test_os.json").write_text(json.dumps(
        {"os": ["os-runs", "os-metric", "os-history"]}))
    fast = catalog.listing(checkout, "test_os.json", catalog.image.APPS["osworld"], None)
    side = catalog.listing(checkout, "test_os.json", catalog.image.APPS["osworld"], None, sidecar=True)
    assert fast.verdicts["os/os-metric"] == "evaluator: metric 'compare_table'"
    assert side.verdicts == {"os/os-runs": "runs", "os/os-metric": "runs",
                             "os/os-history": "evaluator: setup step 'update_browse_history'"}


def test_the_split_is_by_id_hash_and_written_as_osworld_indexes_and_task_specs(checkout, tmp_path):
    result = catalog.listing(checkout, "test_all.json", catalog.image.APPS["osworld"], None)
    runs = sorted(k for k, v in result.verdicts.items() if v == "runs")
    sizes = catalog.write_split(result, tmp_path / "split", 0.5)
    train, held = (json.loads((tmp_path / "split" / f"{s}.json").read_text()) for s in ("train", "heldout"))
    names = sorted(f"{d}/{i}" for side in (train, held) for d, ids in side.items() for i in ids)
    assert names == runs and sizes == {"train": sum(map(len, train.values())), "heldout": sum(map(len, held.values()))}
    for side in (train, held):
        for ids in side.values():
            assert all(catalog.held_out(i, 0.5) == (side is held) for i in ids)
    lines = (tmp_path / "split" / "tasks.jsonl").read_bytes().splitlines()
    specs = [msgspec.json.decode(line, type=TaskSpec) for line in lines]
    assert sorted(f"{json.loads(s.config)['domain']}/{s.name}" for s in specs) == runs
    assert sorted(s.task_id for s in specs) == [f"osworld/{name}" for name in runs]
    assert all((s.split == "eval") == catalog.held_out(s.name, 0.5) for s in specs)
    assert json.loads((tmp_path / "split" / "verdicts.json").read_text()) == result.verdicts
    catalog.write_split(result, tmp_path / "none", 0.0)
    assert json.loads((tmp_path / "none" / "heldout.json").read_text()) == {}


def test_the_command_prints_the_table_and_refuses_a_bad_checkout(checkout, tmp_path, capsys):
    assert catalog.main(["list", str(checkout.root), "--index", "test_small.json", "--split", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert "| os | 1 | 1 |" in out and "split: " in out
    assert catalog.main(["list", str(tmp_path / "nowhere")]) == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize("name, why", [("../test_all.json", "test_<name>.json"), ("test_all", "test_<name>.json")])
def test_index_names_are_plain(checkout, name, why):
    with pytest.raises(TaskError, match=why):
        checkout.index(name)


def test_hostile_checkouts_are_refused_with_typed_errors(checkout, tmp_path):
    examples = checkout.root / "evaluation_examples" / "examples"
    index = checkout.root / "evaluation_examples" / "test_evil.json"
    for listing, why in [({"os": ["../../../../etc/passwd"]}, "plain name"), ({"../os": ["x"]}, "plain name"),
                         ({"os": [3]}, "plain name"), (["os"], "expected"), ({"os": "x"}, "expected")]:
        index.write_text(json.dumps(listing))
        with pytest.raises(TaskError, match=why):
            checkout.index("test_evil.json")
    index.write_text("{not json")
    with pytest.raises(TaskError, match="not JSON"):
        checkout.index("test_evil.json")
    for domain, task_id in [("os", ".."), ("os/../os", "os-runs"), ("", "x"), ("os", "a" * 200), ("os", "a\0b")]:
        with pytest.raises(TaskError, match="plain name"):
            checkout.task(domain, task_id)
    (examples / "os" / "bad.json").write_text("[1")
    (examples / "os" / "big.json").write_text(" " * (MAX_TASK_BYTES + 1))
    (examples / "os" / "other.json").write_text(json.dumps(TASKS["os"][0]))
    outside = tmp_path / "secret.json"
    outside.write_text(json.dumps(_task("link")))
    (examples / "os" / "link.json").symlink_to(outside)
    for task_id, why in [("bad", "not JSON"), ("big", "over"), ("other", "says id"), ("link", "not a regular file"),
                         ("missing", "not a regular file")]:
        with pytest.raises(TaskError, match=why):
            checkout.task("os", task_id)


def test_the_env_runs_a_checkout_task_by_domain_and_id(checkout, fake_vm):
    env = OSWorldEnv(OSWorldSlots(provider="remote", remote_urls=(fake_vm.url,), settle_s=0.0,
                                  osworld_dir=str(checkout.root)))
    obs = env.reset(Task("osworld/os/os-runs", "osworld", "os-runs", config={"domain": "os"}))
    assert obs.instruction == "do os-runs" and fake_vm.commands[-1] == ["touch", "x"]
    for domain, name, why in [("../os", "os-runs", "plain name"), ("os", "../os/os-runs", "plain name"),
                              ("os", "missing", "not a regular file"), (["os"], "os-runs", "plain name")]:
        with pytest.raises(TaskError, match=why):
            env.reset(Task("osworld/x", "osworld", name, config={"domain": domain}))
    bare = OSWorldEnv(OSWorldSlots(provider="remote", remote_urls=(fake_vm.url,)))
    with pytest.raises(TaskError, match="osworld_dir"):
        bare.reset(Task("osworld/os/os-runs", "osworld", "os-runs", config={"domain": "os"}))


def test_fill_then_list_with_the_cache(checkout, web, tmp_path, capsys):
    """`fill` downloads a task's files into the cache; `list --cache` counts the task as
    runnable once they are there, and as "file not cached" before."""
    base, root, _ = web
    (root / "in.txt").write_text("data")
    example = _task("os-dl", config=[{"type": "download", "parameters": {"files": [
        {"url": f"{base}/in.txt", "path": "/home/user/in.txt"}]}}])
    (checkout.examples / "os" / "os-dl.json").write_text(json.dumps(example))
    (checkout.root / "evaluation_examples" / "test_dl.json").write_text(json.dumps({"os": ["os-dl"]}))
    cache = tmp_path / "cache"
    args = ["list", str(checkout.root), "--index", "test_dl.json", "--cache", str(cache)]
    assert catalog.main(args) == 0
    assert "| os | 1 | 0 | 0 | 0 | 0 | 0 | 1 | 1 |" in capsys.readouterr().out
    assert catalog.main(["fill", str(checkout.root), "--index", "test_dl.json", "--cache", str(cache)]) == 0
    assert "1 of 1 files" in capsys.readouterr().out
    assert catalog.main(args) == 0
    assert "| os | 1 | 1 | 0 | 0 | 0 | 0 | 0 | 1 |" in capsys.readouterr().out
    (root / "in.txt").unlink()
    (checkout.root / "evaluation_examples" / "test_dl.json").write_text(json.dumps({"os": ["os-dl", "os-runs"]}))
    example["config"][0]["parameters"]["files"][0]["url"] = f"{base}/gone.txt"
    (checkout.examples / "os" / "os-dl.json").write_text(json.dumps(example))
    assert catalog.main(["fill", str(checkout.root), "--index", "test_dl.json", "--cache", str(cache)]) == 1
    assert "gone.txt" in capsys.readouterr().err
