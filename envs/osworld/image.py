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


# what a target adds to the desktop image, in its key (scripts/build_vm_image.sh `extra`)
TARGET_FILES = {"desktop": (), "osworld": ("scripts/vm_image/osworld.packages", "scripts/vm_image/osworld-customize.sh")}


def source_key(target: str = "desktop", repo: Path = REPO) -> str:
    """The build script's key: sha256 of the script, envs/osworld/guest/*.py, *.sh (C order),
    then the target's own files."""
    guest = repo / "envs" / "osworld" / "guest"
    files = [repo / "scripts" / "build_vm_image.sh"] + sorted(guest.glob("*.py")) + sorted(guest.glob("*.sh"))
    files += [repo / name for name in TARGET_FILES[target]]
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def locate(image_dir: str = "", target: str = "desktop") -> Image:
    """The image in `image_dir`, or the `target` image built from this checkout's sources."""
    folder = Path(image_dir) if image_dir else cache_root() / f"{target}-{source_key(target)}"
    image = Image(folder)
    missing = [p.name for p in (image.disk, image.kernel, image.initrd, folder / "manifest.json") if not p.exists()]
    if missing:
        build = "setup-vm" if target == "desktop" else f"setup-vm-{target}"
        raise EnvError(f"no {target} VM image in {folder} (missing {', '.join(missing)}): run `make {build}`")
    return image
