/* Driver of benches/runtime-bench.sh (issues 14, 31): ROUNDS interleaved container cycles
 * (create, state, start, wait, delete) through several OCI runtimes, one cycle of each variant
 * per round (the order shuffled each round, so that drift, position and the variant run just
 * before hit every variant alike), timing every call and accounting every process's CPU time,
 * page faults and peak RSS exactly (wait4 rusage: µs, faults, KiB).
 *
 * It is what containerd's runc shim does: it calls `RUNTIME create --bundle B --pid-file F ID`,
 * `state ID`, `start ID`, becomes the subreaper of the container's init (PR_SET_CHILD_SUBREAPER)
 * and waits for it to exit, then calls `delete ID`. The container's own CPU (runc init, its
 * createContainer hooks, the process) is part of the cycle's CPU.
 *
 * Usage: cycle-bench -n ROUNDS [-w WARMUP] [-t TSV] [-C 1 | -S 1] VARIANT...
 *   -C 1: create only: each round runs just `create` of every variant, whose runtime must not
 *         start a container (a shim configured to exec true(1) as its low-level runtime): the
 *         shim's own cost, without runc's milliseconds of noise around it. cycle = create.
 *   -S 1: single calls: `create`, `state`, `start` and `delete` of every variant, each call on
 *         its own with a runtime that starts no container (true(1) again): every call's own
 *         cost. cycle = their sum; wait is 0.
 *   VARIANT: -v NAME -r RUNTIME -b BUNDLE [-o ORIGINAL] [-e NAME=VALUE]...
 *   -o: copied over BUNDLE/config.json before every create (untimed), for shims that edit it.
 *   -e: environment of that variant's runtime calls (ACTK_CONFIG).
 *   -t: also write every sample (variant, round, call, wall_us, cpu_us, minflt, majflt,
 *       maxrss_kib) to TSV.
 *   -P A:B  after the run, per call, the paired differences A - B over rounds (A's sample minus
 *           B's of the same round, so that drift between rounds cancels): median and p25..p75
 *           of wall and CPU ms, medians of minor faults and of peak RSS (KiB).
 *   -R A:B  the per-round ratios A / B of the cycle's wall and CPU time (median, p25..p75) and
 *           the paired difference per cycle in ms.
 * Prints, per variant and call, the medians of wall ms, CPU ms, minor faults and peak RSS KiB
 * (the peak of the process and what it exec'd: for a shim, the larger of the shim and the
 * runtime it execs), then the -P and -R lines. */
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

#define MAX_VARIANTS 24
#define MAX_ENV 8
enum { CREATE, STATE, START, WAIT, DELETE, CYCLE, NCALLS };
static const char *CALLS[NCALLS] = {"create", "state", "start", "wait", "delete", "cycle"};

struct variant {
    const char *name, *runtime, *bundle, *original;
    const char *env[MAX_ENV];
    int nenv;
    double *wall[NCALLS], *cpu[NCALLS];  /* per round, microseconds */
    double *flt[NCALLS], *rss[NCALLS];   /* per round, minor faults and peak RSS KiB */
    double *mflt[NCALLS];                /* per round, major faults */
};

static struct variant vs[MAX_VARIANTS];
static int nv;
#define MAX_PAIRS 32
static const char *pairs[MAX_PAIRS], *ratios[MAX_PAIRS];
static int npairs, nratios;
static int create_only, single_calls;

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

/* What one call cost: wall and CPU µs, minor and major faults, peak RSS KiB. */
struct cost { double wall, cpu, flt, mflt, rss; };

/* Runs RUNTIME ARGS... for variant v and returns its cost. Exit status must be 0. */
static void call(struct variant *v, char *const args[], struct cost *c) {
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
    c->wall = now_us() - t0;
    c->cpu = cpu_us(&ru);
    c->flt = ru.ru_minflt;
    c->mflt = ru.ru_majflt;
    c->rss = ru.ru_maxrss;
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
    struct cost c[NCALLS] = {{0}};
    char *rt = (char *)v->runtime;
    char *create[] = {rt, "create", "--bundle", (char *)v->bundle, "--pid-file", pidfile, id, NULL};
    char *state[] = {rt, "state", id, NULL};
    char *start[] = {rt, "start", id, NULL};
    char *del[] = {rt, "delete", id, NULL};
    call(v, create, &c[CREATE]);
    if (create_only) {
        c[CYCLE] = c[CREATE];
        goto record;
    }
    if (single_calls) {
        call(v, state, &c[STATE]);
        call(v, start, &c[START]);
        call(v, del, &c[DELETE]);
    } else {
        pid_t init = read_pid(pidfile);
        call(v, state, &c[STATE]);
        double t0 = now_us();
        call(v, start, &c[START]);
        struct rusage ru;
        int st = reap(init, &ru);
        c[WAIT].wall = now_us() - t0 - c[START].wall;
        c[WAIT].cpu = cpu_us(&ru);
        c[WAIT].flt = ru.ru_minflt;
        c[WAIT].mflt = ru.ru_majflt;
        c[WAIT].rss = ru.ru_maxrss;
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) fail("%s: the container's process failed%s", v->name, "");
        call(v, del, &c[DELETE]);
        nearly = 0;
    }
    for (int k = 0; k < CYCLE; k++) {
        c[CYCLE].wall += c[k].wall;
        c[CYCLE].cpu += c[k].cpu;
        c[CYCLE].flt += c[k].flt;
        c[CYCLE].mflt += c[k].mflt;
        if (c[k].rss > c[CYCLE].rss) c[CYCLE].rss = c[k].rss;
    }
record:
    if (r < 0) return;
    for (int k = 0; k < NCALLS; k++) {
        v->wall[k][r] = c[k].wall;
        v->cpu[k][r] = c[k].cpu;
        v->flt[k][r] = c[k].flt;
        v->mflt[k][r] = c[k].mflt;
        v->rss[k][r] = c[k].rss;
    }
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The q-quantile (0..1) of xs[0..n), by linear interpolation between the closest ranks. */
static double quantile(const double *xs, int n, double q) {
    double *s = malloc(n * sizeof *s);
    memcpy(s, xs, n * sizeof *s);
    qsort(s, n, sizeof *s, cmp);
    double pos = q * (n - 1);
    int lo = (int)pos;
    double m = lo + 1 < n ? s[lo] + (pos - lo) * (s[lo + 1] - s[lo]) : s[lo];
    free(s);
    return m;
}

static double median(const double *xs, int n) { return quantile(xs, n, 0.5); }

/* " WHAT median [p25 p75]" of xs times `scale`, each printed with `fmt`. */
static void print_spread(const char *what, const double *xs, int n, double scale, const char *fmt) {
    char f[64];
    snprintf(f, sizeof f, " %%s %s [%s %s]", fmt, fmt, fmt);
    printf(f, what, quantile(xs, n, 0.5) * scale, quantile(xs, n, 0.25) * scale, quantile(xs, n, 0.75) * scale);
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
        else if (!strcmp(a, "-S")) single_calls = atoi(val);
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
            vs[j].flt[k] = calloc(rounds, sizeof(double));
            vs[j].mflt[k] = calloc(rounds, sizeof(double));
            vs[j].rss[k] = calloc(rounds, sizeof(double));
        }
    }
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) fail("PR_SET_CHILD_SUBREAPER: %s%s", strerror(errno), "");
    for (int r = 0; r < warmup; r++)
        for (int j = 0; j < nv; j++) cycle(&vs[j], -1);
    /* A fresh order every round, shuffled (Fisher-Yates, a fixed xorshift seed so that runs
     * repeat it). A rotation would keep the cyclic order: each variant would always run right
     * after the same one, and what that one leaves in the caches (a shim of the same binary:
     * warm text; a Go runtime or a large process: cold ones) moved a create's CPU by up to
     * 0.2 ms on this project's VM, the same sign every round (issue 31). */
    int order[MAX_VARIANTS];
    unsigned long long seed = 0x9e3779b97f4a7c15ULL;
    for (int j = 0; j < nv; j++) order[j] = j;
    for (int r = 0; r < rounds; r++) {
        for (int j = nv - 1; j > 0; j--) {
            seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
            int i = (int)(seed % (unsigned long long)(j + 1)), t = order[j];
            order[j] = order[i], order[i] = t;
        }
        for (int j = 0; j < nv; j++) cycle(&vs[order[j]], r);
    }

    /* Calls a mode does not make are left out of what it prints. */
    int shown[NCALLS];
    for (int k = 0; k < NCALLS; k++)
        shown[k] = !(create_only && k != CREATE && k != CYCLE) && !(single_calls && k == WAIT);
    printf("medians per call: wall ms / CPU ms / minor faults / peak RSS KiB\n");
    for (int j = 0; j < nv; j++) {
        printf("%-16s", vs[j].name);
        for (int k = 0; k < NCALLS; k++) {
            if (!shown[k]) continue;
            printf(" %s %.3f/%.3f/%.0f/%.0f", CALLS[k], median(vs[j].wall[k], rounds) / 1e3,
                   median(vs[j].cpu[k], rounds) / 1e3, median(vs[j].flt[k], rounds), median(vs[j].rss[k], rounds));
        }
        printf("\n");
    }
    double *d = malloc(rounds * sizeof *d), *dc = malloc(rounds * sizeof *dc);
    double *df = malloc(rounds * sizeof *df), *dr = malloc(rounds * sizeof *dr);
    if (npairs) printf("A - B: paired differences by round, ms: median [p25 p75] of wall, of CPU; medians of faults, peak RSS KiB\n");
    for (int p = 0; p < npairs; p++) {
        struct variant *a = find(pairs[p], 0), *b = find(pairs[p], 1);
        for (int k = 0; k < NCALLS; k++) {
            if (!shown[k]) continue;
            for (int r = 0; r < rounds; r++) {
                d[r] = a->wall[k][r] - b->wall[k][r];
                dc[r] = a->cpu[k][r] - b->cpu[k][r];
                df[r] = a->flt[k][r] - b->flt[k][r];
                dr[r] = a->rss[k][r] - b->rss[k][r];
            }
            printf("%s - %s %s", a->name, b->name, CALLS[k]);
            print_spread("wall", d, rounds, 1e-3, "%+.3f");
            print_spread("cpu", dc, rounds, 1e-3, "%+.3f");
            printf(" faults %+.0f rss %+.0f\n", median(df, rounds), median(dr, rounds));
        }
    }
    if (nratios) printf("A / B: per-round ratios of the cycle, median [p25 p75] of wall, of CPU; paired difference per cycle, ms\n");
    for (int p = 0; p < nratios; p++) {
        struct variant *a = find(ratios[p], 0), *b = find(ratios[p], 1);
        for (int r = 0; r < rounds; r++) {
            d[r] = a->wall[CYCLE][r] / b->wall[CYCLE][r];
            dc[r] = a->cpu[CYCLE][r] / b->cpu[CYCLE][r];
            df[r] = a->wall[CYCLE][r] - b->wall[CYCLE][r];
            dr[r] = a->cpu[CYCLE][r] - b->cpu[CYCLE][r];
        }
        printf("%s / %s cycle", a->name, b->name);
        print_spread("wall", d, rounds, 1, "%.3f");
        print_spread("cpu", dc, rounds, 1, "%.3f");
        printf(" per-cycle wall %+.3f cpu %+.3f\n", median(df, rounds) / 1e3, median(dr, rounds) / 1e3);
    }
    if (tsv) {
        FILE *f = fopen(tsv, "w");
        if (!f) fail("cannot write %s: %s", tsv, strerror(errno));
        fprintf(f, "variant\tround\tcall\twall_us\tcpu_us\tminflt\tmajflt\tmaxrss_kib\n");
        for (int j = 0; j < nv; j++)
            for (int r = 0; r < rounds; r++)
                for (int k = 0; k < NCALLS; k++)
                    fprintf(f, "%s\t%d\t%s\t%.1f\t%.1f\t%.0f\t%.0f\t%.0f\n", vs[j].name, r, CALLS[k], vs[j].wall[k][r],
                            vs[j].cpu[k][r], vs[j].flt[k][r], vs[j].mflt[k][r], vs[j].rss[k][r]);
        fclose(f);
    }
    return 0;
}
