"""OSWorld's own tasks from a user's checkout of OSWorld: loading, what this host can run
offline and why not the rest, the file cache's filling, a train / held-out split.

    python -m envs.osworld.catalog list CHECKOUT [--image desktop|osworld] [--sidecar] [--cache DIR]
                                    [--index test_all.json] [--split OUT_DIR] [--heldout 0.2]
    python -m envs.osworld.catalog fill CHECKOUT --cache DIR [--index test_all.json]

A checkout holds `evaluation_examples/examples/<domain>/<id>.json` (one task each) and
index lists `evaluation_examples/test_*.json` (`{"domain": ["id", ...]}`). An env task
names a checkout's task by its id and config `{"domain": ...}` (the slots' `osworld_dir`
is the checkout).

A task runs offline on an image when it needs neither a Google account nor the live web,
the image has its applications, every setup step, getter and metric it uses is in
envs/osworld/evaluation.py (with `--sidecar`, as env slots with `eval_sidecar` run: only its
setup steps, for desktop-env scores the rest), and (given a cache) every file it fetches on
the host is in the cache. The listing gives the first reason that fails, in that order. The split is by
a hash of the task's id, so a task keeps its side whatever the image or the cache.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import hashlib
import json
import re
import sys
from pathlib import Path

import msgspec

from envs.osworld import evaluation, image
from envs.osworld.checkout import Checkout
from envs.osworld.files import FileCache, download, task_urls
from envs.types import TaskError

# what a task's domain or `related_apps` entry names, as image.APPS names it
APP_NAMES = {"libreoffice calc": "libreoffice_calc", "calc": "libreoffice_calc", "writer": "libreoffice_writer",
             "libreoffice": "libreoffice_writer", "vs_code": "vscode", "browser": "chrome"}
NO_APP_DOMAINS = {"multi_apps"}  # their apps are in `related_apps` alone
# Google Drive or a Google login: no offline copy can stand in
ACCOUNT_STEPS, ACCOUNT_GETTERS = {"googledrive", "login"}, {"googledrive_file"}
# getters that read pages the agent browses (or the host fetches) on the live web
WEB_GETTERS = {"active_url_from_accessTree", "active_tab_html_parse", "active_tab_info", "active_tab_url_parse",
               "open_tabs_info", "url_dashPart", "page_info", "info_from_website", "pdf_from_url",
               "gotoRecreationPage_and_get_html_content"}
URL = re.compile(r"https?://[^\s\"']+")
REASONS = ("google account", "live web", "missing app", "evaluator", "file not cached")


# ---- what runs offline ------------------------------------------------------------------------

def apps_needed(domain: str, example: dict) -> set[str]:
    named = [a for a in example.get("related_apps") or [] if isinstance(a, str)]
    if domain not in NO_APP_DOMAINS:
        named.append(domain)
    return {APP_NAMES.get(a.lower(), a.lower()) for a in named}


def why_not(domain: str, example: dict, apps: frozenset[str], cache: FileCache | None = None,
            sidecar: bool = False) -> tuple[str, str] | None:
    """(reason, detail) of the first thing that keeps the task off this image offline, or None;
    with `sidecar`, desktop-env's evaluator scores (the env's `eval_sidecar`)."""
    evaluator = example["evaluator"]
    steps = [s for s in list(example.get("config") or []) + list(evaluator.get("postconfig") or [])
             if isinstance(s, dict)]
    getters = [g for role in ("result", "expected") for g in _as_list(evaluator.get(role)) if isinstance(g, dict)]
    kinds = {s.get("type") for s in steps}, {g.get("type") for g in getters}
    if account := sorted((kinds[0] & ACCOUNT_STEPS) | (kinds[1] & ACCOUNT_GETTERS)):
        return "google account", ", ".join(account)
    tabs = [u for s in steps if s.get("type") == "chrome_open_tabs"
            for u in _as_list((s.get("parameters") or {}).get("urls_to_open")) if str(u).startswith("http")]
    # pages the agent is told to visit, or that the expected answer names (a clone, a stream,
    # the authors' homepages to bookmark)
    visits = URL.findall(str(example.get("instruction", ""))) + \
        URL.findall(json.dumps([g for g in getters if g.get("type") == "rule"]))
    if tabs or kinds[1] & WEB_GETTERS or visits:
        return "live web", ", ".join((tabs + visits)[:1] + sorted(kinds[1] & WEB_GETTERS))
    if missing := sorted(apps_needed(domain, example) - apps):
        return "missing app", ", ".join(missing)
    if missing := evaluation.unsupported(example, evaluator=not sidecar):
        return "evaluator", ", ".join(missing)
    if cache is not None and (missing := cache.missing(task_urls(example))):
        return "file not cached", f"{len(missing)} file(s), first {missing[0][:120]}"
    return None


def _as_list(value) -> list:
    return value if isinstance(value, list) else ([] if value is None else [value])


@dataclasses.dataclass
class Listing:
    by_domain: dict[str, collections.Counter]  # domain -> {"runs": n, reason: n}
    verdicts: dict[str, str]  # "<domain>/<id>" -> "runs" or "reason: detail"
    need_files: collections.Counter  # domain -> tasks that fetch files on the host


def listing(checkout: Checkout, index: str, apps: frozenset[str], cache: FileCache | None,
            sidecar: bool = False) -> Listing:
    out = Listing(collections.defaultdict(collections.Counter), {}, collections.Counter())
    for domain, example in checkout.tasks(index):
        verdict = why_not(domain, example, apps, cache, sidecar)
        out.by_domain[domain]["runs" if verdict is None else verdict[0]] += 1
        out.verdicts[f"{domain}/{example['id']}"] = "runs" if verdict is None else ": ".join(verdict)
        out.need_files[domain] += bool(task_urls(example))
    return out


def table(result: Listing) -> str:
    head = ["domain", "tasks", "runs offline", *REASONS, "fetch files"]
    rows = [head, ["---"] * len(head)]
    domains = sorted(result.by_domain)
    for domain in [*domains, "total"]:
        counts = sum((result.by_domain[d] for d in domains), collections.Counter()) if domain == "total" \
            else result.by_domain[domain]
        files = sum(result.need_files.values()) if domain == "total" else result.need_files[domain]
        rows.append([domain, str(sum(counts.values())), str(counts["runs"]), *(str(counts[r]) for r in REASONS),
                     str(files)])
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


# ---- the split ------------------------------------------------------------------------------

def held_out(task_id: str, fraction: float) -> bool:
    return int(hashlib.sha256(task_id.encode()).hexdigest()[:8], 16) < fraction * 2**32


def write_split(result: Listing, out: Path, fraction: float) -> dict[str, int]:
    """train.json and heldout.json (OSWorld's index format) of the tasks that run, the
    same as env TaskSpecs (tasks.jsonl: splits train and eval), and every verdict
    (verdicts.json)."""
    from dart_jax.wire.messages import TaskSpec
    sides: dict[str, dict[str, list[str]]] = {"train": {}, "heldout": {}}
    specs = []
    for name, verdict in sorted(result.verdicts.items()):
        if verdict != "runs":
            continue
        domain, task_id = name.split("/", 1)
        side = "heldout" if held_out(task_id, fraction) else "train"
        sides[side].setdefault(domain, []).append(task_id)
        specs.append(TaskSpec(task_id=f"osworld/{name}", backend="osworld", name=task_id,
                              split="eval" if side == "heldout" else "train", config=json.dumps({"domain": domain})))
    out.mkdir(parents=True, exist_ok=True)
    for side, listing_ in sides.items():
        (out / f"{side}.json").write_text(json.dumps(listing_, indent=1) + "\n")
    (out / "tasks.jsonl").write_bytes(b"".join(msgspec.json.encode(s) + b"\n" for s in specs))
    (out / "verdicts.json").write_text(json.dumps(result.verdicts, indent=1, sort_keys=True) + "\n")
    return {side: sum(map(len, listing_.values())) for side, listing_ in sides.items()}


# ---- the command ------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m envs.osworld.catalog", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    show = sub.add_parser("list", help="per domain: the tasks this image runs offline, and why not the others")
    fill = sub.add_parser("fill", help="download every task's host-side files into the cache (networked machine)")
    for p in (show, fill):
        p.add_argument("checkout", type=Path)
        p.add_argument("--index", default="test_all.json")
    show.add_argument("--image", choices=sorted(image.APPS), default="desktop")
    show.add_argument("--sidecar", action="store_true",
                      help="OSWorld's own evaluator scores (env slots with eval_sidecar): only setup steps count")
    show.add_argument("--cache", type=Path, help="count tasks whose files are missing from this cache as not runnable")
    show.add_argument("--split", type=Path, help="write train.json, heldout.json, tasks.jsonl, verdicts.json here")
    show.add_argument("--heldout", type=float, default=0.2)
    fill.add_argument("--cache", type=Path, required=True)
    args = parser.parse_args(argv)
    checkout = Checkout(args.checkout)
    try:
        if args.command == "fill":
            urls = [u for _, example in checkout.tasks(args.index) for u in task_urls(example)]
            failed = FileCache(args.cache).fill(list(dict.fromkeys(urls)), download)
            for url, error in failed.items():
                print(f"failed: {url}: {error}", file=sys.stderr)
            print(f"{len(set(urls)) - len(failed)} of {len(set(urls))} files in {args.cache}")
            return 1 if failed else 0
        if not 0 <= args.heldout < 1:
            parser.error("--heldout is a fraction in [0, 1)")
        result = listing(checkout, args.index, image.APPS[args.image], FileCache(args.cache) if args.cache else None,
                         args.sidecar)
        print(table(result))
        if args.split:
            sizes = write_split(result, args.split, args.heldout)
            print(f"split: {sizes['train']} train, {sizes['heldout']} held out, in {args.split}")
        return 0
    except TaskError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
