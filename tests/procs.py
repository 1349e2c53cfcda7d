"""The processes a test started, found through the process tree (psutil)."""

import psutil


def descendants(pid: int) -> list[psutil.Process]:
    """Every live process under `pid` whose command line can be read ([] once `pid` is gone)."""
    try:
        procs = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for p in procs:
        try:
            p.cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        out.append(p)
    return out
