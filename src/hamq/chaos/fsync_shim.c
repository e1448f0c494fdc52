/* The chaos suite's disk shim (hamq.chaos.disk_faults), loaded with LD_PRELOAD.
 *
 * Wraps fsync, fdatasync and ftruncate. With HAMQ_SHIM_DIR set:
 *   - if $HAMQ_SHIM_DIR/slow_ms exists, sleeps that many milliseconds before the real call
 *     (read on every call, so a nemesis can slow a running process down and back up);
 *   - after a successful call on a regular file, appends "<st_dev>:<st_ino>\t<size>\n" to
 *     $HAMQ_SHIM_DIR/fsync.log with one write() on an O_APPEND descriptor, so lines from
 *     concurrent threads and processes never interleave. <size> is the smaller of the sizes
 *     before and after the call: bytes appended while the fsync ran may not be durable, and
 *     a file cut while it ran is no longer than the cut.
 *   - after a successful ftruncate of a regular file, appends "<st_dev>:<st_ino>\tT<size>\n":
 *     a cut ends what earlier fsyncs made durable (power_loss reads the lines in order).
 * Keyed by inode, not by name: an fsynced temporary file renamed over its target keeps it.
 * Without HAMQ_SHIM_DIR the real call runs unchanged.
 *
 * Also preloaded (first) beside libfaketime for the clock nemesis, for one more wrapper:
 * clock_nanosleep on any clock but CLOCK_REALTIME goes straight to the kernel. libfaketime
 * 0.9.10 with FAKETIME_DONT_FAKE_MONOTONIC=1 fails an absolute CLOCK_MONOTONIC sleep with
 * EINVAL — every time.sleep() of CPython >= 3.11 — though that clock is not faked at all.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef int (*sync_fn)(int);

/* clock_nanosleep's contract (an error number, not -1 and errno) on the bare system call */
static int kernel_sleep(clockid_t clock, int flags, const struct timespec *req,
                        struct timespec *rem) {
    int saved = errno;
    int rc = syscall(SYS_clock_nanosleep, clock, flags, req, rem) == 0 ? 0 : errno;
    errno = saved;
    return rc;
}

int clock_nanosleep(clockid_t clock, int flags, const struct timespec *req,
                    struct timespec *rem) {
    static int (*real)(clockid_t, int, const struct timespec *, struct timespec *);
    if (clock != CLOCK_REALTIME) return kernel_sleep(clock, flags, req, rem);
    if (!real) real = (int (*)(clockid_t, int, const struct timespec *, struct timespec *))
        dlsym(RTLD_NEXT, "clock_nanosleep");
    return real(clock, flags, req, rem);
}

static long read_slow_ms(const char *dir) {
    char path[PATH_MAX];
    char text[32];
    if (snprintf(path, sizeof path, "%s/slow_ms", dir) >= (int)sizeof path) return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n <= 0) return 0;
    text[n] = '\0';
    long ms = strtol(text, NULL, 10);
    return ms > 0 ? ms : 0;
}

static void log_size(const char *dir, const struct stat *st, const char *mark) {
    char path[PATH_MAX];
    char line[96];
    if (snprintf(path, sizeof path, "%s/fsync.log", dir) >= (int)sizeof path) return;
    int len = snprintf(line, sizeof line, "%llu:%llu\t%s%lld\n", (unsigned long long)st->st_dev,
                       (unsigned long long)st->st_ino, mark, (long long)st->st_size);
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return;
    if (write(fd, line, (size_t)len) != len) {
        /* nothing to do: a missing line only makes power_loss drop more */
    }
    close(fd);
}

/* The log exists from the process's start, so a host whose processes never fsynced
 * (a name server) is told apart from one that ran without the shim. */
__attribute__((constructor)) static void create_log(void) {
    const char *dir = getenv("HAMQ_SHIM_DIR");
    char path[PATH_MAX];
    if (!dir || !*dir) return;
    if (snprintf(path, sizeof path, "%s/fsync.log", dir) >= (int)sizeof path) return;
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) close(fd);
}

static int wrapped(const char *name, int fd) {
    static sync_fn real[2];
    int which = name[1] == 'd';  /* "fdatasync" vs "fsync" */
    if (!real[which]) real[which] = (sync_fn)dlsym(RTLD_NEXT, name);
    const char *dir = getenv("HAMQ_SHIM_DIR");
    if (!dir || !*dir) return real[which](fd);
    long ms = read_slow_ms(dir);
    if (ms) {
        struct timespec pause = {ms / 1000, (ms % 1000) * 1000000L};
        while (kernel_sleep(CLOCK_MONOTONIC, 0, &pause, &pause) == EINTR) {
        }
    }
    struct stat before, after;
    int regular = fstat(fd, &before) == 0 && S_ISREG(before.st_mode);
    int rc = real[which](fd);
    int saved = errno;
    if (rc == 0 && regular && fstat(fd, &after) == 0) {
        if (after.st_size > before.st_size) after.st_size = before.st_size;
        log_size(dir, &after, "");
    }
    errno = saved;
    return rc;
}

typedef int (*truncate_fn)(int, off_t);

static int truncated(const char *name, int fd, off_t length) {
    static truncate_fn real[2];
    int which = name[9] == '6';  /* "ftruncate64" vs "ftruncate" */
    if (!real[which]) real[which] = (truncate_fn)dlsym(RTLD_NEXT, name);
    int rc = real[which](fd, length);
    const char *dir = getenv("HAMQ_SHIM_DIR");
    if (rc == 0 && dir && *dir) {
        int saved = errno;
        struct stat st;
        if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) log_size(dir, &st, "T");
        errno = saved;
    }
    return rc;
}

/* 64-bit off_t on the platforms the suite runs on: ftruncate64 is the same call, under the
 * name programs built with _FILE_OFFSET_BITS=64 (CPython) link against */
int ftruncate(int fd, off_t length) { return truncated("ftruncate", fd, length); }

int ftruncate64(int fd, off64_t length) { return truncated("ftruncate64", fd, (off_t)length); }

int fsync(int fd) { return wrapped("fsync", fd); }

int fdatasync(int fd) { return wrapped("fdatasync", fd); }
