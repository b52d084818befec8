/* comm_launch.c — starting the right number of ranks: self-relaunch under mpirun, and the
 * world-size check when a launcher already started us.
 *
 * Owns the mpirun command line (what running as root in a container on one host needs:
 * --allow-run-as-root, --oversubscribe, --bind-to none so a rank's worker threads are not all
 * pinned to one core) and the exec.  MOESERVE_MPIRUN overrides the launcher binary;
 * MOESERVE_RELAUNCHED marks the child so a broken launcher cannot loop.  Does not touch MPI, so
 * it runs before ms_comm_init.  Call from the main thread before any other thread starts.
 *
 * The process the user started stays, as the launcher's supervisor (supervise): Open MPI's
 * mpirun answers SIGTERM/SIGINT by killing every rank within a second, so the supervisor
 * takes those signals instead (mpirun runs in its own process group: a terminal's Ctrl-C
 * reaches only the supervisor) and turns the first two into SIGUSR1 to mpirun, which forwards
 * them to every rank (rank 0 of `serve` drains on the first and stops on the second, aborting
 * what still runs; the others ignore them); a third is passed on as SIGTERM, with which mpirun
 * kills every rank (a wedged rank 0 too).  It exits with mpirun's exit status.
 */
#include "parallel/comm.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

/* The world size a launcher announced in the environment, 0 if unknown, -1 if no launcher. */
static int launcher_world_size(void)
{
    static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) {
            char *end;
            long n = strtol(v, &end, 10);
            return (*end || n < 1 || n > INT_MAX) ? 0 : (int)n;
        }
    }
    if (getenv("PMIX_RANK") || getenv("OMPI_COMM_WORLD_RANK") || getenv("PMI_RANK")) return 0;
    return -1;
}

int ms_comm_launch_argv(int world_size, const char *exe, int argc, char **argv, bool as_root,
                        char **out, int cap, ms_errbuf *e)
{
    static char np[16];
    snprintf(np, sizeof np, "%d", world_size);
    const char *launcher = getenv("MOESERVE_MPIRUN");
    const char *head[] = {launcher && *launcher ? launcher : "mpirun",
                          "-np",
                          np,
                          "--oversubscribe",
                          "--bind-to",
                          "none",
                          as_root ? "--allow-run-as-root" : NULL};
    int n = 0;
    for (size_t i = 0; i < sizeof head / sizeof head[0]; i++) {
        if (!head[i]) continue;
        if (n >= cap - 1) goto full;
        out[n++] = (char *)(uintptr_t)head[i];
    }
    if (n >= cap - 1) goto full;
    out[n++] = (char *)(uintptr_t)exe;
    for (int i = 1; i < argc; i++) {
        if (n >= cap - 1) goto full;
        out[n++] = argv[i];
    }
    out[n] = NULL;
    return n;
full:
    return ms_err(e, MS_ETOOBIG, "mpirun command line needs more than %d arguments", cap);
}

static volatile sig_atomic_t n_stop_signals;
static volatile pid_t launcher_pid;

static void forward_stop(int sig)
{
    (void)sig;
    int n = ++n_stop_signals;
    if (launcher_pid > 0) kill(launcher_pid, n <= 2 ? SIGUSR1 : SIGTERM);
}

/* Runs args (mpirun ...) as a child and exits with its status; returns only if it cannot
 * start. */
static int supervise(char **args, ms_errbuf *e)
{
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGHUP);
    sigprocmask(SIG_BLOCK, &block, &old); /* until launcher_pid is known */
    pid_t pid = fork();
    if (pid < 0) {
        sigprocmask(SIG_SETMASK, &old, NULL);
        return ms_err(e, MS_EIO, "cannot fork to start %s: %s", args[0], strerror(errno));
    }
    if (pid == 0) {
        sigprocmask(SIG_SETMASK, &old, NULL);
        setpgid(0, 0);                        /* no terminal signals: they go to the supervisor */
        prctl(PR_SET_PDEATHSIG, SIGTERM);     /* the supervisor killed: the job ends too */
        int fd = open("/dev/null", O_RDONLY); /* a background group must not read the tty */
        if (fd >= 0) dup2(fd, 0);
        execvp(args[0], args);
        fprintf(stderr, "cannot start %s: %s (install openmpi-bin, or run mpirun yourself)\n",
                args[0], strerror(errno));
        _exit(127);
    }
    setpgid(pid, pid);
    launcher_pid = pid;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = forward_stop;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    sigprocmask(SIG_SETMASK, &old, NULL);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    exit(WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : 1);
}

int ms_comm_maybe_relaunch(int world_size_needed, int argc, char **argv, ms_errbuf *e)
{
    if (world_size_needed < 1)
        return ms_err(e, MS_EINVAL, "world size %d must be >= 1", world_size_needed);
    int started = launcher_world_size();
    if (started >= 0) {
        if (started > 0 && started != world_size_needed)
            return ms_err(e, MS_ELAYOUT,
                          "this launch needs %d rank%s, mpirun started %d (use "
                          "mpirun -np %d, or start without mpirun to launch automatically)",
                          world_size_needed, world_size_needed == 1 ? "" : "s", started,
                          world_size_needed);
        return 0;
    }
    if (world_size_needed == 1) return 0;
    if (getenv("MOESERVE_RELAUNCHED"))
        return ms_err(e, MS_ECOMM,
                      "relaunched under mpirun but no MPI launcher variables are "
                      "set (is MOESERVE_MPIRUN an Open MPI mpirun?)");
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) return ms_err(e, MS_EIO, "cannot resolve /proc/self/exe: %s", strerror(errno));
    exe[len] = 0;
    enum { CAP = 4096 };
    char **args = calloc(CAP, sizeof *args);
    if (!args) return ms_err(e, MS_ENOMEM, "out of memory building the mpirun command line");
    bool root = geteuid() == 0;
    int rc = ms_comm_launch_argv(world_size_needed, exe, argc, argv, root, args, CAP, e);
    if (rc < 0) {
        free(args);
        return rc;
    }
    setenv("MOESERVE_RELAUNCHED", "1", 1);
    if (root) { /* Open MPI refuses root without both (the flag alone suffices on 4.x) */
        setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
        setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    }
    fflush(stdout);
    fflush(stderr);
    rc = supervise(args, e);
    free(args);
    return rc;
}
