#!/bin/sh
# The `osworld` image target's additions, run by mmdebstrap after the desktop image's hook
# with the new root as $1 (scripts/build_vm_image.sh osworld; not built by `make test`).
#  - `google-chrome` (and -stable): Chromium under the name OSWorld's tasks launch, with
#    its profile under ~/.config/google-chrome and remote debugging on the guest's loopback
#    port 1337; socat publishes that on port 9222, which QEMU forwards to the host's
#    loopback (OSWorld's images do the same with socat).
#  - VLC's HTTP interface on port 8080, password `password` (OSWorld's VLC getters).
#  - VLC's first-run privacy question off (it would block the player's window).
#  - LibreOffice's profile: no Tip of the Day dialog at start, no autosave or recovery
#    writes behind the agent's back.
#  - GIMP's profile made once at build time: the first start in a profile queries every
#    plug-in (110 s to the image's window under TCG; 50 s with the profile there).
#  - no indexers: tracker's miners masked for every user.
#  - no screen saver or blanking: the X server's own (10 min by default) is turned off
#    once the desktop's X server is up (Xvfb has no lock screen; no GNOME session runs).
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
printf '[qt]\nqt-privacy-ask=0\n[core]\nextraintf=http\nhttp-host=0.0.0.0\nhttp-port=8080\nmetadata-network-access=0\n[lua]\nhttp-password=password\n' \
  > "$root/home/user/.config/vlc/vlcrc"
mkdir -p "$root/home/user/.config/libreoffice/4/user"
cat > "$root/home/user/.config/libreoffice/4/user/registrymodifications.xcu" <<'XCU'
<?xml version="1.0" encoding="UTF-8"?>
<oor:items xmlns:oor="http://openoffice.org/2001/registry" xmlns:xs="http://www.w3.org/2001/XMLSchema" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">
<item oor:path="/org.openoffice.Office.Common/Misc"><prop oor:name="ShowTipOfTheDay" oor:op="fuse"><value>false</value></prop></item>
<item oor:path="/org.openoffice.Office.Common/Misc"><prop oor:name="FirstRun" oor:op="fuse"><value>false</value></prop></item>
<item oor:path="/org.openoffice.Office.Recovery/AutoSave"><prop oor:name="Enabled" oor:op="fuse"><value>false</value></prop></item>
<item oor:path="/org.openoffice.Office.Recovery/RecoveryInfo"><prop oor:name="Enabled" oor:op="fuse"><value>false</value></prop></item>
</oor:items>
XCU
for unit in tracker-miner-fs-3.service tracker-extract-3.service tracker-miner-rss-3.service; do
  chroot "$root" systemctl --global mask "$unit" >/dev/null 2>&1 || true
done
chroot "$root" chown -R user:user /home/user/.config
timeout 900 chroot "$root" runuser -u user -- env HOME=/home/user gimp-console -i -d -f -b '(gimp-quit 0)' \
  >/dev/null 2>&1 || true
[ -s "$root/home/user/.config/GIMP/2.10/pluginrc" ] || { echo "osworld image: GIMP made no profile" >&2; exit 1; }
cat > "$root/etc/systemd/system/dart-no-blank.service" <<'UNIT'
[Unit]
Description=No screen saver or blanking on the desktop's X server (:0)
After=dart-desktop.service
[Service]
Type=oneshot
User=user
ExecStart=/bin/sh -c 'until xset -display :0 s off s noblank; do sleep 1; done; xset -display :0 -dpms || true'
[Install]
WantedBy=multi-user.target
UNIT
ln -sf /etc/systemd/system/dart-no-blank.service \
  "$root/etc/systemd/system/multi-user.target.wants/dart-no-blank.service"
