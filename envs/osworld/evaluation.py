"""OSWorld's task setup steps and evaluators, the subset that runs without desktop-env.

desktop-env (the official package) cannot share an environment with the trainer (its pins),
so a host without it still runs OSWorld-format tasks whose steps and evaluator lie in this
subset, with the official semantics:

- setup steps (`config`, and the evaluator's `postconfig`): execute / command (with
  `until`, and `stdout` / `stderr` kept as files of the episode's cache for `cache_file`),
  execute_with_verification, launch, sleep, open, activate_window, close_window,
  upload_file (local files confined to the slots' task_dir), download (the file from the
  host's file cache, envs/osworld/files.py, pushed through the VM's `/setup/upload`, as
  OSWorld does), chrome_open_tabs / chrome_close_tabs (over the browser's DevTools port,
  from the host: envs/osworld/cdp.py);
- result / expected getters: vm_command_line, vm_command_error, vm_file, rule, cloud_file
  (from the file cache), cache_file (a file of the episode's cache), open_tabs_info (the
  browser's tabs over DevTools: their URLs, and titles where loaded; OSWorld's waits for each
  page to load, which only its title needs);
- metrics: exact_match, check_include_exclude, literal_match, is_in_list, is_expected_tabs,
  infeasible;
  several metrics combine with `conj` and / or.

A task using anything else is refused at reset (`unsupported`), never scored wrongly.
Scoring follows DesktopEnv.evaluate: an infeasible task scores 1 exactly when the agent's
last action was FAIL; any other task scores 0 when it was.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from dart_jax.wire import paths
from envs.osworld.cdp import DevTools, same_url
from envs.osworld.checkout import NAME
from envs.osworld.files import FileCache
from envs.types import EnvError, TaskError

SETUP_STEPS = {"execute", "command", "execute_with_verification", "launch", "sleep", "open",
               "activate_window", "close_window", "upload_file", "download", "chrome_open_tabs",
               "chrome_close_tabs"}
GETTERS = {"vm_command_line", "vm_command_error", "vm_file", "rule", "cloud_file", "cache_file", "open_tabs_info"}
# an `execute` step with `until` repeats, 0.3 s apart, for this long at most: an application's
# start under TCG (GIMP's first in a profile: 110 s here, 50 s once its profile exists)
UNTIL_S, _UNTIL_PAUSE_S = 240.0, 0.3
BROWSER_WAIT_S = 60.0  # a browser the task's setup launched takes this long at most to answer


def unsupported(example: dict, evaluator: bool = True) -> list[str]:
    """What the example uses outside this subset (empty: it runs here); with `evaluator`
    False, only its setup steps count (the evaluator runs elsewhere: envs/osworld/sidecar.py)."""
    postconfig = list(example["evaluator"].get("postconfig") or []) if evaluator else []
    missing = [f"setup step {s.get('type') if isinstance(s, dict) else s!r}"
               for s in list(example.get("config") or []) + postconfig
               if not isinstance(s, dict) or s.get("type") not in SETUP_STEPS]
    if not evaluator:
        return missing
    funcs = _as_list(example["evaluator"]["func"])
    missing += [f"metric {f!r}" for f in funcs if f not in METRICS]
    if funcs != ["infeasible"]:
        for role in ("result", "expected"):
            for getter in _as_list(example["evaluator"].get(role)):
                if getter is not None and (not isinstance(getter, dict) or getter.get("type") not in GETTERS):
                    kind = getter.get("type") if isinstance(getter, dict) else getter
                    missing.append(f"{role} getter {kind!r}")
    return missing


class Runner:
    """Runs setup steps and evaluators against one VM's server (an `envs.osworld.env.VMClient`)."""

    def __init__(self, vm: Any, screen: tuple[int, int], cache_dir: Path, task_dir: str,
                 files: FileCache | None = None, devtools_url: str = "", client_password: str = "password"):
        self.vm, self.screen, self.cache_dir, self.task_dir = vm, screen, cache_dir, task_dir
        self.files, self.devtools_url, self.client_password = files, devtools_url, client_password

    # ---- setup ------------------------------------------------------------------------

    def setup(self, steps: list[dict]) -> None:
        for i, step in enumerate(steps):
            params = step.get("parameters") or {}
            if not isinstance(params, dict):
                raise TaskError(f"setup step {i + 1}: parameters must be an object")
            try:
                getattr(self, f"_{step['type']}")(**params)
            except TypeError as e:
                raise TaskError(f"setup step {i + 1} ({step['type']}): {e}") from None

    def _execute(self, command, shell: bool = False, until: dict | None = None,
                 stdout: str = "", stderr: str = "") -> None:
        command = self._placeholders(command)
        deadline = time.monotonic() + UNTIL_S
        while True:
            result = self.vm.post_json("/setup/execute", {"command": command, "shell": shell})
            for name, key in ((stdout, "output"), (stderr, "error")):
                if name:
                    self._cache_path(name).write_text(str(result.get(key) or ""))
            if not until or _until_met(until, result):
                return
            if time.monotonic() > deadline:
                raise EnvError(f"setup command {command!r} never met {until} in {UNTIL_S:.0f} s")
            time.sleep(_UNTIL_PAUSE_S)

    _command = _execute

    def _execute_with_verification(self, command, verification: dict | None = None, max_wait_time: float = 10,
                                   check_interval: float = 1.0, shell: bool = False) -> None:
        self.vm.post_json("/setup/execute_with_verification",
                          {"command": self._placeholders(command), "shell": shell, "verification": verification or {},
                           "max_wait_time": max_wait_time, "check_interval": check_interval})

    def _launch(self, command, shell: bool = False) -> None:
        if isinstance(command, str) and not shell:
            command = command.split()
        self.vm.post_json("/setup/launch", {"command": command, "shell": shell}, parse=False)

    def _sleep(self, seconds: float) -> None:
        time.sleep(min(float(seconds), 60.0))

    def _open(self, path: str) -> None:
        self.vm.post_json("/setup/open_file", {"path": path}, parse=False)

    def _activate_window(self, window_name: str, strict: bool = False, by_class: bool = False) -> None:
        self.vm.post_json("/setup/activate_window", {"window_name": window_name, "strict": strict,
                                                     "by_class": by_class}, parse=False)

    def _close_window(self, window_name: str, strict: bool = False, by_class: bool = False) -> None:
        self.vm.post_json("/setup/close_window", {"window_name": window_name, "strict": strict,
                                                  "by_class": by_class}, parse=False)

    def _upload_file(self, files: list[dict]) -> None:
        for f in files:
            if not self.task_dir:
                raise TaskError("upload_file needs the slots' task_dir on this env host")
            try:
                local = paths.confine(f["local_path"], Path(self.task_dir), paths.roots(Path(self.task_dir)),
                                      field="local_path")
            except paths.PathRefused as e:
                raise TaskError(str(e)) from None
            self.vm.upload(local.read_bytes(), f["path"])

    def _download(self, files: list[dict]) -> None:
        if self.files is None:
            raise TaskError("download needs the slots' file_cache on this env host")
        for f in files:
            self.vm.upload(self.files.read(f["url"]), f["path"])

    def _chrome_open_tabs(self, urls_to_open: list[str]) -> None:
        """Each URL in a new tab; the tab that was open before goes once the first is
        open (OSWorld's semantics)."""
        browser = self._browser()
        before = browser.tabs()
        for i, url in enumerate(urls_to_open):
            browser.open(str(url))
            if i == 0 and before:
                browser.close(before[0]["id"])

    def _chrome_close_tabs(self, urls_to_close: list[str]) -> None:
        """For each URL, the first tab showing it (compared as OSWorld compares URLs)."""
        browser = self._browser()
        for url in urls_to_close:
            tab = next((t for t in browser.tabs() if same_url(t["url"], str(url))), None)
            if tab is not None:
                browser.close(tab["id"])

    def _browser(self) -> DevTools:
        if not self.devtools_url:
            raise TaskError("the chrome_* setup steps need the browser's DevTools port (provider qemu or remote)")
        browser = DevTools(self.devtools_url)
        browser.wait(BROWSER_WAIT_S)
        return browser

    def _cache_path(self, name: object) -> Path:
        """A file of the episode's cache, by a plain name (it comes from the task JSON)."""
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise TaskError(f"cache file name {str(name)[:100]!r} is not a plain name")
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        return self.cache_dir / name

    def _placeholders(self, command):
        width, height = self.screen
        values = {"{CLIENT_PASSWORD}": self.client_password, "{SCREEN_WIDTH_HALF}": str(width // 2),
                  "{SCREEN_HEIGHT_HALF}": str(height // 2), "{SCREEN_WIDTH}": str(width),
                  "{SCREEN_HEIGHT}": str(height)}

        def fill(text: str) -> str:
            for key, value in values.items():
                text = text.replace(key, value)
            return text
        return fill(command) if isinstance(command, str) else [fill(str(part)) for part in command]

    # ---- evaluation ---------------------------------------------------------------------

    def evaluate(self, evaluator: dict, last_action: str | None) -> float:
        funcs = _as_list(evaluator["func"])
        if funcs == ["infeasible"]:
            return 1.0 if last_action == "FAIL" else 0.0
        if last_action == "FAIL":
            return 0.0
        self.setup(list(evaluator.get("postconfig") or []))
        results, expected = _as_list(evaluator.get("result")), _as_list(evaluator.get("expected"))
        options = _as_list(evaluator.get("options")) or [{}] * len(funcs)
        scores = []
        for i, func in enumerate(funcs):
            result = self._get(results[i] if i < len(results) else None)
            want = self._get(expected[i]) if i < len(expected) and expected[i] is not None else None
            opts = options[i] if i < len(options) and isinstance(options[i], dict) else {}
            score = METRICS[func](result, want, **opts) if want is not None else METRICS[func](result, **opts)
            if evaluator.get("conj", "and") == "and" and score == 0:
                return 0.0
            scores.append(float(score))
        return max(scores) if evaluator.get("conj", "and") == "or" else sum(scores) / len(scores)

    def _get(self, getter: dict | None) -> Any:
        if getter is None:
            return None
        kind = getter["type"]
        if kind == "rule":
            return getter["rules"]
        if kind == "cache_file":
            path = self._cache_path(getter["path"])
            return str(path) if path.is_file() else None
        if kind == "cloud_file":
            return self._cloud_file(getter)
        if kind == "open_tabs_info":
            return [{"title": t.get("title", ""), "url": t["url"]} for t in self._browser().tabs()]
        if kind in ("vm_command_line", "vm_command_error"):
            reply = self.vm.post_json("/execute", {"command": getter["command"], "shell": getter.get("shell", False)})
            return reply.get("output" if kind == "vm_command_line" else "error")
        data = self.vm.file(getter["path"])  # vm_file
        if data is None:
            return None
        target = self.cache_dir / Path(str(getter.get("dest") or "vm_file")).name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        return str(target)


    def stage_cloud_files(self, evaluator: dict) -> None:
        """Every file the evaluator's cloud_file getters name, written from the file cache into
        the episode's folder under its `dest` name: where OSWorld's own getter (the sidecar)
        finds it instead of downloading it."""
        for role in ("result", "expected"):
            for getter in _as_list(evaluator.get(role)):
                if isinstance(getter, dict) and getter.get("type") == "cloud_file":
                    self._cloud_file(getter)

    def _cloud_file(self, getter: dict) -> str | list[str]:
        """The expected file(s) from the file cache, written under their `dest` names;
        `multi` takes lists, `gives` picks which paths the metric gets (OSWorld's getter)."""
        if self.files is None:
            raise TaskError("cloud_file needs the slots' file_cache on this env host")
        multi = getter.get("multi", False)
        urls, dests = (getter["path"], getter["dest"]) if multi else ([getter["path"]], [getter["dest"]])
        if not (isinstance(urls, list) and isinstance(dests, list) and len(urls) == len(dests)):
            raise TaskError("cloud_file: path and dest must be lists of one length with multi")
        gives = set(getter.get("gives", [0]))
        out = []
        for i, (url, dest) in enumerate(zip(urls, dests)):
            path = self._cache_path(dest)
            path.write_bytes(self.files.read(url))
            if i in gives:
                out.append(str(path))
        return out[0] if len(out) == 1 else out


def _until_met(until: dict, result: dict) -> bool:
    return ("returncode" in until and result.get("returncode") == until["returncode"]) or \
        ("stdout" in until and until["stdout"] in (result.get("output") or "")) or \
        ("stderr" in until and until["stderr"] in (result.get("error") or ""))


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else ([] if value is None else [value])


# ---- metrics (OSWorld's desktop_env/evaluators/metrics/general.py semantics) ----------------

def exact_match(result: Any, rules: dict, **_: Any) -> float:
    return float(result == rules["expected"])


def literal_match(result: Any, expected: Any, **options: Any) -> float:
    if isinstance(result, str) and isinstance(expected, str) and options.get("ignore_case"):
        return float(result.lower() == expected.lower())
    return float(result == expected)


def is_in_list(result: Any, rules: dict, **_: Any) -> float:
    return float(rules["expected"] in result) if result is not None else 0.0


def is_expected_tabs(open_tabs: list[dict] | None, rule: dict, **_: Any) -> float:
    """OSWorld's (metrics/chrome.py): with rule type "url", the open tabs' URLs and the
    expected ones are the same length and each expected URL is among the open ones."""
    if rule.get("type") != "url" or open_tabs is None:
        return 0.0
    urls = [tab["url"] for tab in open_tabs]
    return float(len(urls) == len(rule["urls"]) and all(any(same_url(want, url) for url in urls)
                                                        for want in rule["urls"]))


def check_include_exclude(result: Any, rules: dict, **_: Any) -> float:
    if result is None:
        return 0.0
    return float(all(s in result for s in rules.get("include", [])) and
                 not any(s in result for s in rules.get("exclude", [])))


METRICS: dict[str, Callable[..., float]] = {
    "exact_match": exact_match, "literal_match": literal_match, "is_in_list": is_in_list,
    "check_include_exclude": check_include_exclude, "is_expected_tabs": is_expected_tabs,
    "infeasible": lambda *a, **k: 0.0,
}

