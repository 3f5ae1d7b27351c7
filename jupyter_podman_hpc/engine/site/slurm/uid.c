/* For Slurm's client commands in a rootless container: getuid() and friends
 * answer the user's id on the host (read from /proc/self/uid_map and
 * gid_map), not the container's root, so that slurmctld accepts what they
 * send (it checks the request's uid against munge's credential). Loaded by
 * the `client` wrapper with the loader's --preload, never through
 * LD_PRELOAD, so that the jobs' processes do not inherit it. */
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

static unsigned long outside(const char *map, unsigned long inside) {
    unsigned long in, out, count, found = inside;
    FILE *f = fopen(map, "r");
    if (!f) return inside;
    while (fscanf(f, "%lu %lu %lu", &in, &out, &count) == 3) {
        if (inside >= in && inside - in < count) { found = out + (inside - in); break; }
    }
    fclose(f);
    return found;
}

static uid_t uid, euid;
static gid_t gid, egid;

__attribute__((constructor)) static void init(void) {
    uid = outside("/proc/self/uid_map", syscall(SYS_getuid));
    euid = outside("/proc/self/uid_map", syscall(SYS_geteuid));
    gid = outside("/proc/self/gid_map", syscall(SYS_getgid));
    egid = outside("/proc/self/gid_map", syscall(SYS_getegid));
}

uid_t getuid(void) { return uid; }
uid_t geteuid(void) { return euid; }
gid_t getgid(void) { return gid; }
gid_t getegid(void) { return egid; }
