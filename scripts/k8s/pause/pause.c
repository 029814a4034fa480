/* The pod sandbox's process (what registry.k8s.io/pause runs): hold the pod's namespaces open,
 * reap children, exit on SIGINT/SIGTERM. Built static by scripts/k8s/base-images.sh. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void down(int sig) { (void)sig; _exit(0); }

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, 0, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction a = {0};
    a.sa_handler = down;
    sigaction(SIGINT, &a, 0);
    sigaction(SIGTERM, &a, 0);
    a.sa_handler = reap;
    a.sa_flags = SA_NOCLDSTOP;
    sigaction(SIGCHLD, &a, 0);
    for (;;) pause();
}
