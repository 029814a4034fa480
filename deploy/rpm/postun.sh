# actk .rpm %postun ($1: 0 on erase, 1 on upgrade): systemd forgets the removed units.
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
fi
if [ "$1" -eq 0 ]; then
    rm -f /var/lib/actk/runtime-registrations
    rmdir /var/lib/actk 2>/dev/null || :
fi
