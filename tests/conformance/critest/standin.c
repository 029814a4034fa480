/*
 * Offline stand-ins for the three registry.k8s.io e2e-test-images critest runs as programs
 * (run.sh builds this statically and installs it under each name). Each does what critest
 * looks at, nothing more:
 *
 *   nginx (nginx:1.14-2, the Security Context NamespaceOption specs): a long-running process
 *     named nginx (its comm, which `pidof nginx` matches) whose /proc/PID/cmdline reads
 *     "nginx: master process ...", as nginx's master sets it, and whose pid is in
 *     /var/run/nginx.pid;
 *   httpd (httpd:2.4.39-4, the Multiple Containers specs): a long-running process that writes
 *     a line naming httpd to its log, as Apache's start-up notice does;
 *   nnp (nonewprivs:1.3, set-user-ID root): prints "Effective uid: N" (its effective uid: 0
 *     unless no_new_privs kept the set-user-ID bit from taking effect).
 *
 * and for two applets of the busybox 1.29 image that Debian's busybox-static leaves out:
 *
 *   pgrep NAME: the pids of the processes whose comm is NAME, one a line (exit 1 when none);
 *   ipcs -m: the System V shared memory segments of the caller's IPC namespace, as the kernel
 *     lists them (/proc/sysvipc/shm: key, shmid, ...).
 *
 * SIGTERM and SIGINT end the long-running ones (as PID 1 they get no default action).
 */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void quit(int sig) {
    (void)sig;
    _exit(0);
}

static void wait_forever(void) {
    signal(SIGTERM, quit);
    signal(SIGINT, quit);
    for (;;)
        pause();
}

int main(int argc, char **argv) {
    const char *base = strrchr(argv[0], '/');
    base = base ? base + 1 : argv[0];
    if (strcmp(base, "nnp") == 0) {
        printf("Effective uid: %d\n", (int)geteuid());
        return 0;
    }
    if (strcmp(base, "pgrep") == 0) {
        if (argc != 2) {
            fprintf(stderr, "usage: pgrep NAME\n");
            return 2;
        }
        int found = 0;
        DIR *d = opendir("/proc");
        struct dirent *e;
        while (d != NULL && (e = readdir(d)) != NULL) {
            char path[300], comm[64] = "";
            if (e->d_name[0] < '1' || e->d_name[0] > '9')
                continue;
            snprintf(path, sizeof path, "/proc/%s/comm", e->d_name);
            FILE *f = fopen(path, "r");
            if (f == NULL)
                continue;
            if (fgets(comm, sizeof comm, f) != NULL) {
                comm[strcspn(comm, "\n")] = 0;
                if (strcmp(comm, argv[1]) == 0) {
                    printf("%s\n", e->d_name);
                    found = 1;
                }
            }
            fclose(f);
        }
        return found ? 0 : 1;
    }
    if (strcmp(base, "ipcs") == 0) {
        FILE *f = fopen("/proc/sysvipc/shm", "r");
        char line[512];
        while (f != NULL && fgets(line, sizeof line, f) != NULL)
            fputs(line, stdout);
        return f == NULL;
    }
    if (strcmp(base, "httpd") == 0) {
        fprintf(stderr, "httpd: stand-in started (tests/conformance/critest)\n");
        wait_forever();
    }
    if (strncmp(argv[0], "nginx: master process", 21) != 0) {
        /* Again with the title as argv[0]: /proc/PID/cmdline is argv, comm stays "nginx". */
        char *title[] = {"nginx: master process nginx -g daemon off;", NULL};
        execv("/usr/sbin/nginx", title);
        perror("nginx stand-in: execv");
        return 1;
    }
    FILE *f = fopen("/var/run/nginx.pid", "w");
    if (f == NULL) {
        perror("nginx stand-in: /var/run/nginx.pid");
        return 1;
    }
    fprintf(f, "%d\n", (int)getpid());
    fclose(f);
    wait_forever();
}
