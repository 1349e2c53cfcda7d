#!/bin/sh
# The `osworld` image target's additions, run by mmdebstrap after the desktop image's hook
# with the new root as $1 (scripts/build_vm_image.sh osworld; not built by `make test`).
#  - `google-chrome` (and -stable): Chromium under the name OSWorld's tasks launch, with
#    its profile under ~/.config/google-chrome and remote debugging on the guest's loopback
#    port 1337; socat publishes that on port 9222, which QEMU forwards to the host's
#    loopback (OSWorld's images do the same with socat).
#  - VLC's HTTP interface on port 8080, password `password` (OSWorld's VLC getters).
#  - no indexers: tracker's miners masked for every user.
set -eu
root=$1
cat > "$root/usr/local/bin/google-chrome" <<'SH'
#!/bin/sh
exec /usr/bin/chromium --remote-debugging-port=1337 --user-data-dir=/home/user/.config/google-chrome \
  --no-first-run --no-default-browser-check --password-store=basic "$@"
SH
chmod 0755 "$root/usr/local/bin/google-chrome"
ln -sf google-chrome "$root/usr/local/bin/google-chrome-stable"
cat > "$root/etc/systemd/system/dart-devtools.service" <<'UNIT'
[Unit]
Description=The browser's DevTools (guest loopback 1337) on port 9222, for QEMU's forward
[Service]
ExecStart=/usr/bin/socat TCP-LISTEN:9222,fork,reuseaddr TCP:127.0.0.1:1337
Restart=always
RestartSec=1
[Install]
WantedBy=multi-user.target
UNIT
ln -sf /etc/systemd/system/dart-devtools.service \
  "$root/etc/systemd/system/multi-user.target.wants/dart-devtools.service"
mkdir -p "$root/home/user/.config/vlc"
printf '[core]\nextraintf=http\nhttp-host=0.0.0.0\nhttp-port=8080\n[lua]\nhttp-password=password\n' \
  > "$root/home/user/.config/vlc/vlcrc"
for unit in tracker-miner-fs-3.service tracker-extract-3.service tracker-miner-rss-3.service; do
  chroot "$root" systemctl --global mask "$unit" >/dev/null 2>&1 || true
done
chroot "$root" chown -R user:user /home/user/.config
