"""OSWorld desktops: the backend (`env`), the VMs this host boots (`qemu`, `image`, and the
in-VM server in `guest/`), OSWorld's setup steps and evaluators (`evaluation`, with the
browser's DevTools in `cdp` and one bounded HTTP call in `httpcall`), the bundled tasks
(`tasks/`) with their experts (`oracle`), and OSWorld's own tasks: a checkout
(`checkout`), the task-file cache (`files`) and the offline listing (`catalog`)."""
