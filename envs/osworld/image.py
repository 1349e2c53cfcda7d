"""Where the desktop VM image of this checkout lives (scripts/build_vm_image.sh builds it).

The image folder is named by a hash of the build script and the guest's files
(envs/osworld/guest/), computed here exactly as the script computes it, so a checkout never boots
an image built from other sources: a stale or missing image is an error that says to run
`make setup-vm`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path

from envs.types import EnvError

REPO = Path(__file__).resolve().parents[2]
# The OSWorld applications each image target holds, by the names OSWorld's tasks give them
# (domains and `related_apps`, normalized by envs.osworld.catalog); "os" is the desktop
# itself (a shell, files, settings through the command line). The small default image has
# none of OSWorld's applications (Mousepad, xterm and PCManFM are not among them).
APPS: dict[str, frozenset[str]] = {
    "desktop": frozenset({"os"}),
    "osworld": frozenset({"os", "chrome", "libreoffice_calc", "libreoffice_writer", "libreoffice_impress",
                          "gimp", "vlc", "thunderbird", "terminal", "pdf", "image"}),
}


@dataclasses.dataclass(frozen=True)
class Image:
    folder: Path

    @property
    def disk(self) -> Path:
        return self.folder / "desktop.qcow2"

    @property
    def kernel(self) -> Path:
        return self.folder / "vmlinuz"

    @property
    def initrd(self) -> Path:
        return self.folder / "initrd.img"


def cache_root() -> Path:
    if os.environ.get("DART_VM_DIR"):
        return Path(os.environ["DART_VM_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dart-jax" / "vm"


def source_key(repo: Path = REPO) -> str:
    """The build script's key: sha256 of the script then envs/osworld/guest/*.py, *.sh (C order)."""
    guest = repo / "envs" / "osworld" / "guest"
    files = [repo / "scripts" / "build_vm_image.sh"] + sorted(guest.glob("*.py")) + sorted(guest.glob("*.sh"))
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def locate(image_dir: str = "") -> Image:
    """The image in `image_dir`, or the one built from this checkout's sources."""
    folder = Path(image_dir) if image_dir else cache_root() / f"desktop-{source_key()}"
    image = Image(folder)
    missing = [p.name for p in (image.disk, image.kernel, image.initrd, folder / "manifest.json") if not p.exists()]
    if missing:
        raise EnvError(f"no desktop VM image in {folder} (missing {', '.join(missing)}): run `make setup-vm`")
    return image
