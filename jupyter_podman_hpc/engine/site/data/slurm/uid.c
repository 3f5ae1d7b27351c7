/* For Slurm's client commands in a rootless container: getuid() and friends
 * answer the user's ids on the host, not the container's, so that slurmctld
 * accepts what they send. Loaded by the `client` wrapper with the loader's
 * --preload, never through LD_PRELOAD, so that the jobs' processes do not
 * inherit it.
 *
 * Where the host ids come from:
 * - PODMANHPC_HOST_UID / PODMANHPC_HOST_GID, compiled in (-D) by the engine,
 *   which builds one shim per user (kernels/slurm.py) and knows them. This is
 *   the only source that is right in every user-namespace layout: without
 *   keep-id (container root is the user), with --userns=keep-id (a nested
 *   namespace: /proc/self/uid_map reads "1001 0 1", relative to podman's
 *   rootless namespace where the user is 0, not to the host) and below a
 *   further `unshare` inside the container. No map a container can read
 *   reaches the host's ids in the nested cases.
 * - Built without them: /proc/self/uid_map and gid_map, one level, right
 *   only when the container's parent namespace is the host's.
 *
 * Not a way to impersonate anyone: any process in the container can send
 * slurmctld whatever uid it likes (its own shim, a crafted request), but
 * slurmctld compares the request's uid with the one munge's credential
 * vouches for, which munged takes from the kernel (SO_PEERCRED, mapped into
 * the host's namespace). A process that is not the user on the host
 * (--userns=auto, a subordinate uid) is refused whatever this answers.
 *
 * With PODMANHPC_HOST_USER (and _HOME) compiled in too, the user's passwd
 * entry is answered when the image's /etc/passwd has none for that uid or
 * name (a container whose root is the user: podman writes the user's entry
 * only with keep-id), so that `squeue --me`, `squeue -u USER` and sacct's
 * user names work, which look the uid up ("Invalid user: 1001"). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pwd.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

__attribute__((unused)) static unsigned long outside(const char *map, unsigned long inside) {
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
#ifdef PODMANHPC_HOST_UID
    uid = euid = PODMANHPC_HOST_UID;
#else
    uid = outside("/proc/self/uid_map", syscall(SYS_getuid));
    euid = outside("/proc/self/uid_map", syscall(SYS_geteuid));
#endif
#ifdef PODMANHPC_HOST_GID
    gid = egid = PODMANHPC_HOST_GID;
#else
    gid = outside("/proc/self/gid_map", syscall(SYS_getgid));
    egid = outside("/proc/self/gid_map", syscall(SYS_getegid));
#endif
}

uid_t getuid(void) { return uid; }
uid_t geteuid(void) { return euid; }
gid_t getgid(void) { return gid; }
gid_t getegid(void) { return egid; }

#if defined(PODMANHPC_HOST_UID) && defined(PODMANHPC_HOST_GID) && defined(PODMANHPC_HOST_USER) && defined(PODMANHPC_HOST_HOME)
typedef int (*by_uid_fn)(uid_t, struct passwd *, char *, size_t, struct passwd **);
typedef int (*by_name_fn)(const char *, struct passwd *, char *, size_t, struct passwd **);

/* The user's entry in the caller's buffer (getpwuid_r's contract: ERANGE when it is too small). */
static int users_entry(struct passwd *pwd, char *buf, size_t size, struct passwd **result) {
    const char *strings[] = {PODMANHPC_HOST_USER, "*", "", PODMANHPC_HOST_HOME, "/bin/sh"};
    char **fields[] = {&pwd->pw_name, &pwd->pw_passwd, &pwd->pw_gecos, &pwd->pw_dir, &pwd->pw_shell};
    size_t used = 0;
    *result = NULL;
    for (int i = 0; i < 5; i++) {
        size_t length = strlen(strings[i]) + 1;
        if (size - used < length) return ERANGE;
        *fields[i] = memcpy(buf + used, strings[i], length);
        used += length;
    }
    pwd->pw_uid = PODMANHPC_HOST_UID;
    pwd->pw_gid = PODMANHPC_HOST_GID;
    *result = pwd;
    return 0;
}

int getpwuid_r(uid_t id, struct passwd *pwd, char *buf, size_t size, struct passwd **result) {
    by_uid_fn next = (by_uid_fn)dlsym(RTLD_NEXT, "getpwuid_r");
    int err = next ? next(id, pwd, buf, size, result) : ENOENT;
    if (id == PODMANHPC_HOST_UID && (err == ENOENT || (err == 0 && *result == NULL)))
        return users_entry(pwd, buf, size, result);  /* the image does not know the user */
    return err;
}

int getpwnam_r(const char *name, struct passwd *pwd, char *buf, size_t size, struct passwd **result) {
    by_name_fn next = (by_name_fn)dlsym(RTLD_NEXT, "getpwnam_r");
    int err = next ? next(name, pwd, buf, size, result) : ENOENT;
    if (strcmp(name, PODMANHPC_HOST_USER) == 0 && (err == ENOENT || (err == 0 && *result == NULL)))
        return users_entry(pwd, buf, size, result);
    return err;
}

static struct passwd entry;
static char entry_buf[4096];

struct passwd *getpwuid(uid_t id) {
    struct passwd *found = NULL;
    int err = getpwuid_r(id, &entry, entry_buf, sizeof entry_buf, &found);
    if (err) errno = err;
    return found;
}

struct passwd *getpwnam(const char *name) {
    struct passwd *found = NULL;
    int err = getpwnam_r(name, &entry, entry_buf, sizeof entry_buf, &found);
    if (err) errno = err;
    return found;
}
#endif
