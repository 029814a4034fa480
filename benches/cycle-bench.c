/* Driver of benches/runtime-bench.sh (issue 14): ROUNDS interleaved container cycles
 * (create, state, start, wait, delete) through several OCI runtimes, one cycle of each variant
 * per round (the order rotates each round, so drift and position hit every variant alike),
 * timing every call and accounting every process's CPU time exactly (wait4 rusage, µs).
 *
 * It is what containerd's runc shim does: it calls `RUNTIME create --bundle B --pid-file F ID`,
 * `state ID`, `start ID`, becomes the subreaper of the container's init (PR_SET_CHILD_SUBREAPER)
 * and waits for it to exit, then calls `delete ID`. The container's own CPU (runc init, its
 * createContainer hooks, the process) is part of the cycle's CPU.
 *
 * Usage: cycle-bench -n ROUNDS [-w WARMUP] [-t TSV] [-C 1] VARIANT...
 *   -C 1: create only: each round runs just `create` of every variant, whose runtime must not
 *         start a container (a shim configured to exec true(1) as its low-level runtime): the
 *         shim's own cost, without runc's milliseconds of noise around it. cycle = create.
 *   VARIANT: -v NAME -r RUNTIME -b BUNDLE [-o ORIGINAL] [-e NAME=VALUE]...
 *   -o: copied over BUNDLE/config.json before every create (untimed), for shims that edit it.
 *   -e: environment of that variant's runtime calls (ACTK_CONFIG).
 *   -t: also write every sample (variant, round, call, wall_us, cpu_us) to TSV.
 *   -P A:B  after the run, the median over rounds of (A's time - B's time) per call, in ms:
 *           paired by round, so that drift between rounds cancels.
 *   -R A:B  the ratios of A's to B's medians of the cycle's wall and CPU time, and the paired
 *           median difference per cycle in ms.
 * Prints, per variant and call, the median wall and CPU time in ms, then the -P and -R lines. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_VARIANTS 16
#define MAX_ENV 8
enum { CREATE, STATE, START, WAIT, DELETE, CYCLE, NCALLS };
static const char *CALLS[NCALLS] = {"create", "state", "start", "wait", "delete", "cycle"};

struct variant {
    const char *name, *runtime, *bundle, *original;
    const char *env[MAX_ENV];
    int nenv;
    double *wall[NCALLS], *cpu[NCALLS]; /* per round, microseconds */
};

static struct variant vs[MAX_VARIANTS];
static int nv;
#define MAX_PAIRS 32
static const char *pairs[MAX_PAIRS], *ratios[MAX_PAIRS];
static int npairs, nratios;
static int create_only;

static void fail(const char *fmt, const char *a, const char *b) {
    fprintf(stderr, "cycle-bench: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n");
    exit(1);
}

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static double cpu_us(const struct rusage *r) {
    return r->ru_utime.tv_sec * 1e6 + r->ru_utime.tv_usec + r->ru_stime.tv_sec * 1e6 + r->ru_stime.tv_usec;
}

/* Children that exited while we waited for another one (the container's init may exit before
 * the `start` call that released it does). */
#define MAX_EARLY 64
static struct early { pid_t pid; int status; struct rusage ru; } early[MAX_EARLY];
static int nearly;

/* Reaps children until `pid` has exited; its rusage in *ru. Other children (orphans handed to
 * us as the subreaper) are kept for a later reap of their own pid. */
static int reap(pid_t pid, struct rusage *ru) {
    for (int i = 0; i < nearly; i++) {
        if (early[i].pid == pid) {
            *ru = early[i].ru;
            int st = early[i].status;
            early[i] = early[--nearly];
            return st;
        }
    }
    for (;;) {
        struct rusage r;
        int st;
        pid_t got = wait4(-1, &st, 0, &r);
        if (got < 0) {
            if (errno == EINTR) continue;
            fail("wait4: %s%s", strerror(errno), "");
        }
        if (got == pid) {
            *ru = r;
            return st;
        }
        if (nearly < MAX_EARLY) {
            early[nearly].pid = got;
            early[nearly].status = st;
            early[nearly].ru = r;
            nearly++;
        }
    }
}

/* Runs RUNTIME ARGS... for variant v; returns wall and CPU in µs. Exit status must be 0. */
static void call(struct variant *v, char *const args[], double *wall, double *cpu) {
    double t0 = now_us();
    pid_t pid = fork();
    if (pid < 0) fail("fork: %s%s", strerror(errno), "");
    if (pid == 0) {
        for (int i = 0; i < v->nenv; i++) putenv((char *)v->env[i]);
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0) dup2(null, 1);
        execv(v->runtime, args);
        fprintf(stderr, "cycle-bench: cannot execute %s: %s\n", v->runtime, strerror(errno));
        _exit(127);
    }
    struct rusage ru;
    int st = reap(pid, &ru);
    *wall = now_us() - t0;
    *cpu = cpu_us(&ru);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) fail("%s: %s failed", v->name, args[1]);
}

static void copy_file(const char *from, const char *to) {
    char buf[1 << 16];
    int in = open(from, O_RDONLY), out = open(to, O_WRONLY | O_TRUNC | O_CREAT, 0644);
    if (in < 0 || out < 0) fail("cannot copy %s to %s", from, to);
    for (;;) {
        ssize_t n = read(in, buf, sizeof buf);
        if (n < 0) fail("cannot read %s%s", from, "");
        if (n == 0) break;
        if (write(out, buf, n) != n) fail("cannot write %s%s", to, "");
    }
    close(in);
    close(out);
}

static pid_t read_pid(const char *file) {
    char buf[32] = {0};
    int fd = open(file, O_RDONLY);
    if (fd < 0 || read(fd, buf, sizeof buf - 1) <= 0) fail("cannot read pid file %s%s", file, "");
    close(fd);
    return (pid_t)atoi(buf);
}

/* One cycle of variant v; samples into round slot r (r < 0: warm-up, not recorded). */
static void cycle(struct variant *v, int r) {
    char id[128], pidfile[4096], cfg[4096];
    snprintf(id, sizeof id, "actk-bench-%s-%d", v->name, (int)getpid());
    snprintf(pidfile, sizeof pidfile, "%s/bench.pid", v->bundle);
    snprintf(cfg, sizeof cfg, "%s/config.json", v->bundle);
    if (v->original) copy_file(v->original, cfg);
    double w[NCALLS] = {0}, c[NCALLS] = {0};
    char *rt = (char *)v->runtime;
    char *create[] = {rt, "create", "--bundle", (char *)v->bundle, "--pid-file", pidfile, id, NULL};
    char *state[] = {rt, "state", id, NULL};
    char *start[] = {rt, "start", id, NULL};
    char *del[] = {rt, "delete", id, NULL};
    call(v, create, &w[CREATE], &c[CREATE]);
    if (create_only) {
        w[CYCLE] = w[CREATE];
        c[CYCLE] = c[CREATE];
        goto record;
    }
    pid_t init = read_pid(pidfile);
    call(v, state, &w[STATE], &c[STATE]);
    double t0 = now_us();
    call(v, start, &w[START], &c[START]);
    struct rusage ru;
    int st = reap(init, &ru);
    w[WAIT] = now_us() - t0 - w[START];
    c[WAIT] = cpu_us(&ru);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) fail("%s: the container's process failed%s", v->name, "");
    call(v, del, &w[DELETE], &c[DELETE]);
    nearly = 0;
    for (int k = 0; k < CYCLE; k++) {
        w[CYCLE] += w[k];
        c[CYCLE] += c[k];
    }
record:
    if (r < 0) return;
    for (int k = 0; k < NCALLS; k++) {
        v->wall[k][r] = w[k];
        v->cpu[k][r] = c[k];
    }
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *xs, int n) {
    double *s = malloc(n * sizeof *s);
    memcpy(s, xs, n * sizeof *s);
    qsort(s, n, sizeof *s, cmp);
    double m = n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
    free(s);
    return m;
}

/* The variant named by the `which`th (0 or 1) half of "A:B". */
static struct variant *find(const char *pair, int which) {
    const char *colon = strchr(pair, ':');
    if (!colon) fail("%s: expected A:B%s", pair, "");
    const char *name = which ? colon + 1 : pair;
    size_t len = which ? strlen(colon + 1) : (size_t)(colon - pair);
    for (int j = 0; j < nv; j++)
        if (strlen(vs[j].name) == len && !strncmp(vs[j].name, name, len)) return &vs[j];
    fail("%s: no such variant%s", pair, "");
    return NULL;
}

int main(int argc, char **argv) {
    int rounds = 0, warmup = 3;
    const char *tsv = NULL;
    struct variant *cur = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!val) fail("%s needs a value%s", a, "");
        i++;
        if (!strcmp(a, "-n")) rounds = atoi(val);
        else if (!strcmp(a, "-w")) warmup = atoi(val);
        else if (!strcmp(a, "-t")) tsv = val;
        else if (!strcmp(a, "-C")) create_only = atoi(val);
        else if (!strcmp(a, "-P") && npairs < MAX_PAIRS) pairs[npairs++] = val;
        else if (!strcmp(a, "-R") && nratios < MAX_PAIRS) ratios[nratios++] = val;
        else if (!strcmp(a, "-v")) {
            if (nv == MAX_VARIANTS) fail("too many variants%s%s", "", "");
            cur = &vs[nv++];
            cur->name = val;
        } else if (!cur) fail("%s before the first -v%s", a, "");
        else if (!strcmp(a, "-r")) cur->runtime = val;
        else if (!strcmp(a, "-b")) cur->bundle = val;
        else if (!strcmp(a, "-o")) cur->original = val;
        else if (!strcmp(a, "-e") && cur->nenv < MAX_ENV) cur->env[cur->nenv++] = val;
        else fail("unknown or repeated option %s%s", a, "");
    }
    if (rounds < 1 || nv == 0) fail("usage: cycle-bench -n ROUNDS [-w WARMUP] [-t TSV] (-v NAME -r RUNTIME -b BUNDLE [-o ORIG] [-e K=V]...)...%s%s", "", "");
    for (int j = 0; j < nv; j++) {
        if (!vs[j].runtime || !vs[j].bundle) fail("variant %s needs -r and -b%s", vs[j].name, "");
        for (int k = 0; k < NCALLS; k++) {
            vs[j].wall[k] = calloc(rounds, sizeof(double));
            vs[j].cpu[k] = calloc(rounds, sizeof(double));
        }
    }
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) fail("PR_SET_CHILD_SUBREAPER: %s%s", strerror(errno), "");
    for (int r = 0; r < warmup; r++)
        for (int j = 0; j < nv; j++) cycle(&vs[j], -1);
    for (int r = 0; r < rounds; r++)
        for (int j = 0; j < nv; j++) cycle(&vs[(j + r) % nv], r);

    printf("%-14s", "median ms");
    for (int k = 0; k < NCALLS; k++) printf(" %9s %9s", CALLS[k], "cpu");
    printf("\n");
    for (int j = 0; j < nv; j++) {
        printf("%-14s", vs[j].name);
        for (int k = 0; k < NCALLS; k++)
            printf(" %9.3f %9.3f", median(vs[j].wall[k], rounds) / 1e3, median(vs[j].cpu[k], rounds) / 1e3);
        printf("\n");
    }
    double *d = malloc(rounds * sizeof *d), *dc = malloc(rounds * sizeof *dc);
    for (int p = 0; p < npairs; p++) {
        struct variant *a = find(pairs[p], 0), *b = find(pairs[p], 1);
        char label[64];
        snprintf(label, sizeof label, "%s - %s", a->name, b->name);
        printf("%-28s", label);
        for (int k = 0; k < NCALLS; k++) {
            for (int r = 0; r < rounds; r++) {
                d[r] = a->wall[k][r] - b->wall[k][r];
                dc[r] = a->cpu[k][r] - b->cpu[k][r];
            }
            printf(" %s %+.3f/%+.3f", CALLS[k], median(d, rounds) / 1e3, median(dc, rounds) / 1e3);
        }
        printf("\n");
    }
    for (int p = 0; p < nratios; p++) {
        struct variant *a = find(ratios[p], 0), *b = find(ratios[p], 1);
        for (int r = 0; r < rounds; r++) {
            d[r] = a->wall[CYCLE][r] - b->wall[CYCLE][r];
            dc[r] = a->cpu[CYCLE][r] - b->cpu[CYCLE][r];
        }
        char label[64];
        snprintf(label, sizeof label, "%s / %s", a->name, b->name);
        printf("%-28s cycle wall %.3fx  cycle cpu %.3fx  per cycle %+.2f ms wall, %+.2f ms cpu\n", label,
               median(a->wall[CYCLE], rounds) / median(b->wall[CYCLE], rounds),
               median(a->cpu[CYCLE], rounds) / median(b->cpu[CYCLE], rounds), median(d, rounds) / 1e3,
               median(dc, rounds) / 1e3);
    }
    if (tsv) {
        FILE *f = fopen(tsv, "w");
        if (!f) fail("cannot write %s: %s", tsv, strerror(errno));
        fprintf(f, "variant\tround\tcall\twall_us\tcpu_us\n");
        for (int j = 0; j < nv; j++)
            for (int r = 0; r < rounds; r++)
                for (int k = 0; k < NCALLS; k++)
                    fprintf(f, "%s\t%d\t%s\t%.1f\t%.1f\n", vs[j].name, r, CALLS[k], vs[j].wall[k][r], vs[j].cpu[k][r]);
        fclose(f);
    }
    return 0;
}
