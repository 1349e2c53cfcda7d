#!/usr/bin/env bash
# Builds the desktop VM image that envs/osworld/qemu.py boots (`make setup-vm`; idempotent).
#   scripts/build_vm_image.sh [desktop|osworld] [--key]
#
# Debian bookworm from Debian's packages (mmdebstrap): a kernel, systemd, Xvfb as the X
# server, the openbox window manager, Mousepad (text editor), xterm (terminal), PCManFM
# (file manager), the AT-SPI accessibility bus, and OSWorld's VM-side protocol
# (envs/osworld/guest/osworld_server.py with pyautogui from PyPI) started at boot as user `user`
# (password `password`, as OSWorld's images). Output, in a folder named by the hash of
# this script and envs/osworld/guest/ (so a change to either rebuilds and nothing stale is used):
#   $DART_VM_DIR/<target>-<key>/{desktop.qcow2, vmlinuz, initrd.img, manifest.json}
# DART_VM_DIR defaults to ~/.cache/dart-jax/vm (shared by every checkout on the host).
# Target `osworld` (`make setup-vm-osworld`, not built by `make test`) adds OSWorld's
# applications and their settings (scripts/vm_image/osworld.packages, osworld-customize.sh;
# both in its key). `--key` prints the image folder and builds nothing.
#   DART_SKIP_APT=1   do not apt-get install the host tools (qemu, mmdebstrap)
set -euo pipefail
export LC_ALL=C
cd "$(dirname "$0")/.."
ROOT=${DART_VM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dart-jax/vm}
TARGET=desktop print_key=""
for arg in "$@"; do
  case $arg in --key) print_key=1 ;; *) TARGET=$arg ;; esac
done
case $TARGET in
  desktop) extra=() ;;
  osworld) extra=(scripts/vm_image/osworld.packages scripts/vm_image/osworld-customize.sh) ;;
  *) echo "usage: $0 [desktop|osworld] [--key]" >&2; exit 2 ;;
esac
key=$(cat scripts/build_vm_image.sh envs/osworld/guest/*.py envs/osworld/guest/*.sh "${extra[@]}" \
      | sha256sum | cut -c1-16)
out=$ROOT/$TARGET-$key
if [ -n "$print_key" ]; then
  echo "$out"; exit 0
fi
if [ -f "$out/manifest.json" ]; then
  echo "setup-vm: image up to date ($out)"; exit 0
fi

HOST_TOOLS=(qemu-system-x86 qemu-utils mmdebstrap e2fsprogs)
missing=$(for t in qemu-system-x86_64 qemu-img mmdebstrap mke2fs; do command -v $t >/dev/null || echo $t; done)
if [ -n "$missing" ] && [ -z "${DART_SKIP_APT:-}" ]; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  echo "setup-vm: installing ${HOST_TOOLS[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${HOST_TOOLS[@]}" >/dev/null
fi
[ "$(id -u)" = 0 ] || { echo "setup-vm: building the image needs root (mmdebstrap, chroot)" >&2; exit 1; }

# libxfixes3: the server's screenshots show the X server's cursor (XFixes), as a screen does
GUEST_PACKAGES=(
  linux-image-amd64 systemd-sysv udev dbus dbus-x11 sudo procps
  xvfb openbox xdotool wmctrl xclip xdg-utils fonts-dejavu-core libx11-6 libxfixes3
  mousepad xterm pcmanfm
  at-spi2-core python3-pyatspi python3 python-is-python3 python3-flask python3-xlib python3-pil python3-tk
)
hooks=()
if [ "$TARGET" = osworld ]; then
  mapfile -t more < <(grep -v '^#' scripts/vm_image/osworld.packages | grep .)
  GUEST_PACKAGES+=("${more[@]}")
  hooks=(--customize-hook="$PWD/scripts/vm_image/osworld-customize.sh \"\$1\"")
fi
# pyautogui and its pure-Python helpers are not packaged by Debian: PyPI, pinned.
PYPI_PACKAGES=(pyautogui==0.9.54 pymsgbox==1.0.9 pytweening==1.2.0 pyscreeze==1.0.1 pygetwindow==0.0.9
               pyrect==0.2.0 mouseinfo==0.1.3 pyperclip==1.9.0)

start=$(date +%s)
mkdir -p "$ROOT"
work=$(mktemp -d "$ROOT/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "setup-vm: building the $TARGET image in $work"

PIP_CONFIG_FILE=/dev/null python3 -m pip --version >/dev/null 2>&1 && pip=(python3 -m pip) || pip=(.venv/bin/python -m pip)
PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= "${pip[@]}" install -q --no-deps --no-compile \
  --target "$work/pypi" "${PYPI_PACKAGES[@]}"

# The customize hook runs on the host with the new root as $1.
cat > "$work/customize.sh" <<'HOOK'
#!/bin/sh
set -eu
root=$1 src=$2
chroot "$root" useradd -m -s /bin/bash -G sudo user
echo user:password | chroot "$root" chpasswd
mkdir -p "$root/home/user/Desktop" "$root/home/user/Documents"
chroot "$root" chown -R user:user /home/user
install -D -m 0755 "$src/envs/osworld/guest/session.sh" "$root/opt/dart/session.sh"
install -D -m 0644 "$src/envs/osworld/guest/osworld_server.py" "$root/opt/dart/osworld_server.py"
cp -r "$src/pypi/." "$root/usr/local/lib/python3.11/dist-packages/"
echo dart-vm > "$root/etc/hostname"
echo "/dev/vda / ext4 rw,noatime 0 1" > "$root/etc/fstab"
cat > "$root/etc/systemd/system/dart-desktop.service" <<'UNIT'
[Unit]
Description=Desktop session and OSWorld-protocol server (port 5000)
After=systemd-user-sessions.service
[Service]
User=user
PAMName=login
ExecStart=/opt/dart/session.sh
Restart=always
RestartSec=1
StandardOutput=journal
StandardError=journal+console
[Install]
WantedBy=multi-user.target
UNIT
ln -sf /etc/systemd/system/dart-desktop.service "$root/etc/systemd/system/multi-user.target.wants/dart-desktop.service"
# QEMU user networking: the guest is 10.0.2.15, no DHCP wait.
mkdir -p "$root/etc/systemd/network"
printf '[Match]\nName=en* eth*\n[Network]\nAddress=10.0.2.15/24\nGateway=10.0.2.2\n' \
  > "$root/etc/systemd/network/10-qemu.network"
ln -sf /lib/systemd/system/systemd-networkd.service "$root/etc/systemd/system/multi-user.target.wants/systemd-networkd.service"
mkdir -p "$root/etc/systemd/journald.conf.d"
printf '[Journal]\nStorage=volatile\n' > "$root/etc/systemd/journald.conf.d/volatile.conf"
for unit in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer getty@tty1.service \
            man-db.timer dpkg-db-backup.timer; do
  chroot "$root" systemctl mask "$unit" >/dev/null 2>&1 || true
done
# A small initramfs: only what mounts a virtio disk (MODULES=most is 3x larger, slower to boot).
sed -i 's/^MODULES=.*/MODULES=list/' "$root/etc/initramfs-tools/initramfs.conf"
printf 'virtio_pci\nvirtio_blk\next4\ncrc32c_generic\n' >> "$root/etc/initramfs-tools/modules"
chroot "$root" update-initramfs -u -k all >/dev/null
rm -rf "$root/var/lib/apt/lists/"* "$root/var/cache/apt/"*.bin
HOOK
chmod +x "$work/customize.sh"
cp -r envs "$work/src-envs"
mkdir -p "$work/src" && mv "$work/src-envs" "$work/src/envs" && mv "$work/pypi" "$work/src/pypi"

mmdebstrap --variant=minbase --include="$(IFS=,; echo "${GUEST_PACKAGES[*]}")" \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias' \
  --customize-hook="$work/customize.sh \"\$1\" $work/src" "${hooks[@]}" \
  bookworm "$work/root" http://deb.debian.org/debian >"$work/mmdebstrap.log" 2>&1 \
  || { tail -30 "$work/mmdebstrap.log" >&2; exit 1; }

size_mb=$(( $(du -sm "$work/root" | cut -f1) * 13 / 10 + 512 ))
stage=$work/out
mkdir -p "$stage"
cp "$work/root"/boot/vmlinuz-* "$stage/vmlinuz"
cp "$work/root"/boot/initrd.img-* "$stage/initrd.img"
mke2fs -q -t ext4 -L root -d "$work/root" "$work/root.raw" "${size_mb}M"
qemu-img convert -O qcow2 "$work/root.raw" "$stage/desktop.qcow2"
seconds=$(( $(date +%s) - start ))
printf '{"key": "%s", "seconds": %d, "rootfs_mib": %d, "qcow2_bytes": %d}\n' "$key" "$seconds" "$size_mb" \
  "$(stat -c %s "$stage/desktop.qcow2")" > "$stage/manifest.json"
rm -rf "$out" && mv "$stage" "$out"
# Older images are never used again (their key no longer matches the sources).
find "$ROOT" -maxdepth 1 -name "$TARGET-*" ! -name "$TARGET-$key" -exec rm -rf {} +
echo "setup-vm: built $out in ${seconds} s ($(du -sh "$out/desktop.qcow2" | cut -f1))"
