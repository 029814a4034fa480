# Sourced by benches/runtime-bench.sh and scripts/hot-text.sh (issue 31).
# valgrind_has_openat2 VALGRIND WORKDIR: whether that valgrind passes openat2(2) to the kernel.
# Debian 12's valgrind 3.19 answers it with ENOSYS, so discovery under it takes HostRoot's path
# walk of kernels before 5.6 instead of the openat2 path a real start takes; forky's 3.27 has it
# (docs/performance.md says how to run it from its extracted .deb). Needs gcc.
valgrind_has_openat2() {
  printf '#include <fcntl.h>\n#include <linux/openat2.h>\n#include <sys/syscall.h>\n#include <unistd.h>\n#include <errno.h>\nint main(void){struct open_how h={.flags=O_RDONLY};return syscall(SYS_openat2,AT_FDCWD,"/",&h,sizeof h)<0&&errno==ENOSYS;}\n' >"$2/openat2.c"
  gcc -o "$2/openat2" "$2/openat2.c" 2>/dev/null && "$1" --tool=none -q "$2/openat2" 2>/dev/null
}
