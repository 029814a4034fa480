# actk .rpm %preun ($1: 0 on erase, 1 on upgrade). On erase, while /usr/bin/actk still exists:
# stop and disable the refresh units, undo the engine registrations %post made, and remove the
# CDI specs the refresh wrote (they name /usr/bin/actk-hook).
if [ "$1" -eq 0 ]; then
    systemctl --no-reload disable --now actk-cdi-refresh.path actk-cdi-refresh.service >/dev/null 2>&1 || :
    /usr/lib/actk/runtime-registrations remove
    /usr/bin/actk cdi clean --output /var/run/cdi || :
fi
