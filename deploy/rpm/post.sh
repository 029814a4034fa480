# actk .rpm %post ($1: 1 on install, 2 on upgrade). What the .deb's postinst does with
# debhelper's snippets: enable the refresh units on install, start them (which writes the CDI
# specs) when systemd runs, and register actk-runtime with the engines the admin named in
# /etc/default/actk (never otherwise).
if [ "$1" -eq 1 ]; then
    systemctl --no-reload enable actk-cdi-refresh.service actk-cdi-refresh.path >/dev/null 2>&1 || :
fi
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
    systemctl start actk-cdi-refresh.path >/dev/null 2>&1 || :
    systemctl restart actk-cdi-refresh.service >/dev/null 2>&1 || :
fi
/usr/lib/actk/runtime-registrations add
