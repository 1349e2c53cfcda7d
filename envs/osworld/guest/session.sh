#!/bin/sh
# The guest's desktop session (run by dart-desktop.service as the desktop user): an X
# server, a D-Bus session with the accessibility bus, a window manager, then the
# OSWorld-protocol server on port 5000 (its answer means the desktop is ready).
# The screen size comes from the kernel command line (dart.screen=WIDTHxHEIGHT).
set -eu
screen=$(tr ' ' '\n' </proc/cmdline | sed -n 's/^dart\.screen=//p')
screen=${screen:-1280x800}
# GTK 3 apps load the AT-SPI bridge themselves; GTK 2 ones (PCManFM) need the modules named
export DISPLAY=:0 HOME=/home/user NO_AT_BRIDGE=0 GTK_MODULES=gail:atk-bridge
rm -f /tmp/.X0-lock /tmp/.X11-unix/X0
Xvfb :0 -screen 0 "${screen}x24" -nolisten tcp -dpi 96 &
for _ in $(seq 100); do [ -S /tmp/.X11-unix/X0 ] && break; sleep 0.1; done
eval "$(dbus-launch --sh-syntax)"
export DBUS_SESSION_BUS_ADDRESS
/usr/libexec/at-spi-bus-launcher --launch-immediately &
openbox &
cd "$HOME"
exec python3 /opt/dart/osworld_server.py --port 5000
