/* The floor of an OCI runtime shim, for benches/runtime-bench.sh (issue 14): the least any shim
 * that edits config.json must do. On `create` and `run` it reads the bundle's config.json, writes
 * it back to a temporary file in the bundle and renames that over the original (what
 * actk-runtime does to apply its edits atomically), then it execs runc with the argv unchanged;
 * every other call only execs runc. Built with -DEXEC_ONLY it never touches config.json: the
 * cost of one more exec alone.
 *
 * Built by the bench: gcc -O2 -static -DRUNC_PATH='"/usr/sbin/runc"' [-DEXEC_ONLY] floor-shim.c
 * It reads the argv as actk-runtime does (runc's global flags before the subcommand; the bundle
 * from -b/--bundle[=]DIR, else the working directory) but knows no more than the bench needs. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef RUNC_PATH
#error "build with -DRUNC_PATH='\"/path/to/runc\"'"
#endif

static void die(const char *what, const char *path) {
    fprintf(stderr, "floor-shim: %s %s: %s\n", what, path, strerror(errno));
    exit(1);
}

#ifndef EXEC_ONLY
/* Global runc flags that take a value (so their value is not read as the subcommand). */
static int takes_value(const char *a) {
    static const char *flags[] = {"--root", "--log", "--log-format", "--criu", "--rootless", NULL};
    for (int i = 0; flags[i]; i++)
        if (strcmp(a, flags[i]) == 0) return 1;
    return 0;
}

static void rewrite_config(const char *bundle) {
    char path[4096], tmp[4096];
    snprintf(path, sizeof path, "%s/config.json", bundle);
    snprintf(tmp, sizeof tmp, "%s/.config.json.floor-%d", bundle, (int)getpid());
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) die("cannot open", path);
    struct stat st;
    if (fstat(fd, &st) != 0) die("cannot stat", path);
    char *buf = malloc(st.st_size ? st.st_size : 1);
    if (!buf) die("out of memory for", path);
    ssize_t got = 0;
    while (got < st.st_size) {
        ssize_t n = read(fd, buf + got, st.st_size - got);
        if (n <= 0) die("cannot read", path);
        got += n;
    }
    close(fd);
    int out = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, st.st_mode & 07777);
    if (out < 0) die("cannot create", tmp);
    for (ssize_t done = 0; done < got;) {
        ssize_t n = write(out, buf + done, got - done);
        if (n <= 0) die("cannot write", tmp);
        done += n;
    }
    if (close(out) != 0) die("cannot close", tmp);
    if (rename(tmp, path) != 0) die("cannot rename onto", path);
    free(buf);
}
#endif

int main(int argc, char **argv) {
#ifndef EXEC_ONLY
    int i = 1;
    const char *sub = NULL;
    for (; i < argc; i++) {
        if (argv[i][0] == '-') {
            if (takes_value(argv[i])) i++;
            continue;
        }
        sub = argv[i++];
        break;
    }
    if (sub && (strcmp(sub, "create") == 0 || strcmp(sub, "run") == 0)) {
        const char *bundle = ".";
        for (; i < argc; i++) {
            if ((strcmp(argv[i], "--bundle") == 0 || strcmp(argv[i], "-b") == 0) && i + 1 < argc) {
                bundle = argv[++i];
            } else if (strncmp(argv[i], "--bundle=", 9) == 0) {
                bundle = argv[i] + 9;
            }
        }
        rewrite_config(bundle);
    }
#endif
    argv[0] = "runc";
    execv(RUNC_PATH, argv);
    die("cannot execute", RUNC_PATH);
    return 1;
}
