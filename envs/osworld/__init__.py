"""OSWorld desktops: the backend (`env`), the VMs this host boots (`qemu`, `image`, and the
in-VM server in `guest/`), OSWorld's setup steps and evaluators (`evaluation`), and the
bundled tasks (`tasks/`) with their experts (`oracle`)."""
