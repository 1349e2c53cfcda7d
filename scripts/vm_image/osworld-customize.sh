#!/bin/sh
# The `osworld` image target's additions, run by mmdebstrap after the desktop image's hook
# with the new root as $1 (scripts/build_vm_image.sh osworld; not built by `make test`).
#  - `google-chrome` (and -stable): Chromium under the name OSWorld's tasks launch, with
#    its profile under ~/.config/google-chrome and remote debugging on the guest's loopback
#    port 1337; socat publishes that on port 9222, which QEMU forwards to the host's
#    loopback (OSWorld's images do the same with socat). No GPU process: the guest has no
#    GPU, and its software GL kept the guest's CPU busy after a snapshot's restore.
#  - VLC's HTTP interface on port 8080, password `password` (OSWorld's VLC getters).
#  - VLC's first-run privacy question off (it would block the player's window).
#  - LibreOffice's profile: no Tip of the Day dialog at start, no autosave or recovery
#    writes behind the agent's back.
#  - GIMP's profile made once at build time: the first start in a profile queries every
#    plug-in (110 s to the image's window under TCG; 50 s with the profile there).
#  - Thunderbird's profile (~/.thunderbird/dart.default-release, OSWorld's `default-release`
#    name): Local Folders and one account whose identity is user@dart.test (no server it can
#    reach: nothing checks mail), drafts in Local Folders; no account wizard, start page or
#    default-client question. installs.ini names it for Debian's install (/usr/lib/thunderbird,
#    whose install hash is FDC34C9F024745EB): without that, Thunderbird 140 makes a fresh
#    profile of its own on the first start and opens the wizard there.
#  - no indexers: tracker's miners masked for every user.
#  - no screen saver or blanking: the X server's own (10 min by default) is turned off
#    once the desktop's X server is up (Xvfb has no lock screen; no GNOME session runs).
set -eu
root=$1
cat > "$root/usr/local/bin/google-chrome" <<'SH'
#!/bin/sh
exec /usr/bin/chromium --remote-debugging-port=1337 --user-data-dir=/home/user/.config/google-chrome \
  --no-first-run --no-default-browser-check --password-store=basic --disable-gpu "$@"
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
tb="$root/home/user/.thunderbird"
mkdir -p "$tb/dart.default-release/Mail/Local Folders"
printf '[InstallFDC34C9F024745EB]\nDefault=dart.default-release\nLocked=1\n' > "$tb/installs.ini"
printf '[Profile0]\nName=default-release\nIsRelative=1\nPath=dart.default-release\nDefault=1\n\n[General]\nStartWithLastProfile=1\nVersion=2\n\n[InstallFDC34C9F024745EB]\nDefault=dart.default-release\nLocked=1\n' \
  > "$tb/profiles.ini"
cat > "$tb/dart.default-release/user.js" <<'JS'
user_pref("mail.provider.suppress_dialog_on_startup", true);
user_pref("mailnews.start_page.enabled", false);
user_pref("mail.shell.checkDefaultClient", false);
user_pref("mail.spotlight.firstRunDone", true);
user_pref("mail.rights.version", 1);
user_pref("datareporting.policy.dataSubmissionPolicyBypassNotification", true);
user_pref("app.update.enabled", false);
user_pref("mail.accountmanager.accounts", "account1,account2");
user_pref("mail.accountmanager.defaultaccount", "account2");
user_pref("mail.accountmanager.localfoldersserver", "server1");
user_pref("mail.account.account1.server", "server1");
user_pref("mail.server.server1.type", "none");
user_pref("mail.server.server1.hostname", "Local Folders");
user_pref("mail.server.server1.name", "Local Folders");
user_pref("mail.server.server1.userName", "nobody");
user_pref("mail.server.server1.directory-rel", "[ProfD]Mail/Local Folders");
user_pref("mail.account.account2.server", "server2");
user_pref("mail.account.account2.identities", "id1");
user_pref("mail.server.server2.type", "pop3");
user_pref("mail.server.server2.hostname", "localhost");
user_pref("mail.server.server2.name", "user@dart.test");
user_pref("mail.server.server2.userName", "user");
user_pref("mail.server.server2.login_at_startup", false);
user_pref("mail.server.server2.check_new_mail", false);
user_pref("mail.server.server2.deferred_to_account", "account1");
user_pref("mail.identity.id1.fullName", "Dart User");
user_pref("mail.identity.id1.useremail", "user@dart.test");
user_pref("mail.identity.id1.valid", true);
user_pref("mail.identity.id1.compose_html", false);
user_pref("mail.identity.id1.draft_folder", "mailbox://nobody@Local%20Folders/Drafts");
user_pref("mail.identity.id1.drafts_folder_picker_mode", "0");
JS
chroot "$root" chown -R user:user /home/user/.thunderbird
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
