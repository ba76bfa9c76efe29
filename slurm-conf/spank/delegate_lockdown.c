/*
 * delegate_lockdown.so -- delegate's slurmstepd gate, a SPANK plugin for
 * Slurm 22.05. Built by build_cluster.sh (gcc against libslurm-dev's
 * <slurm/spank.h>); loaded through the PlugStackConfig that slurm.conf names
 * (slurm-conf/plugstack.conf.j2):
 *
 *   required /usr/local/lib/delegate/delegate_lockdown.so admin_gid=<gid> runner=<path> [nodes=<a,b,...>]
 *
 * nodes= (a cluster shared with plain Slurm jobs: the nodes of delegate's
 * partitions, the site policy's `partitions`): on any other node (this
 * host's short name not in the list) the plugin does nothing at all, so
 * researchers' steps, interactive jobs and environments are untouched
 * there. Without it every node is delegate's.
 *
 * "required": a failing callback fails the step ("optional" would ignore it).
 * CALLBACKS FAIL BY RETURNING A NEGATIVE VALUE: slurmstepd tests
 * `spank_init(job) < 0` (mgr.c) and plugstack.c passes the plugin's rc
 * through, so ESPANK_ERROR (3000, positive) would only be logged ("failed
 * with rc=3000") and the step would RUN ANYWAY (seen on 22.05.8).
 *
 * For users who are neither root nor in the admin group (membership from
 * this node's account database, by uid: never from what the job says):
 *  - slurm_spank_init (remote: slurmstepd, as root, before any user code)
 *    refuses every step but the batch step and the extern step (which runs
 *    no user code): `srun --jobid=<own job> [--overlap] CMD`, srun inside an
 *    allocation, interactive steps. The step fails before it forks; srun
 *    prints "task 0 launch failed: Plugin initialization failed".
 *    One exception, delegate's rank step (multi-node jobs): a step whose
 *    argv (S_JOB_ARGV, the launch request's, in slurmstepd) is exactly
 *    { <runner>, "rank", <absolute path> }, runner= being the installed
 *    sandbox-runner. That program only asks the node's root agent for a
 *    sandbox of the caller's own running job; a student who starts it by
 *    hand (srun --jobid=<own job> --overlap <runner> rank <dir>) gets at
 *    most what delegate gives them anyway: one sandbox of their own job.
 *  - slurm_spank_task_init (remote, in the batch or rank task after setuid,
 *    just before the exec of the batch script or the runner) replaces the job's environment by
 *    an allowlist, so LD_PRELOAD, LD_AUDIT, GCONV_PATH, BASH_ENV, ... from
 *    the submitting shell never reach /bin/sh before it execs the runner,
 *    and of SLURM_* only what slurmstepd sets itself survives (the
 *    submitter's SLURM_PROLOG etc. are options of the srun the runner
 *    starts for a rank job; the runner also starts srun with an empty
 *    environment and those options pinned).
 * Root and admins keep full Slurm. Students cannot reach this code: it runs
 * inside slurmstepd, root-owned and not dumpable.
 */
#define _GNU_SOURCE
#include <grp.h>
#include <pwd.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include <fcntl.h>
#include <linux/landlock.h>
#include <sys/syscall.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

SPANK_PLUGIN(delegate_lockdown, 1);

static gid_t admin_gid = (gid_t)-1;
static const char *runner = NULL;	/* points into the plugin's argv */
static const char *nodes = NULL;	/* nodes=: delegate's nodes, or NULL: all */

static void parse_args(int ac, char **av)
{
	for (int i = 0; i < ac; i++) {
		if (!strncmp(av[i], "admin_gid=", 10))
			admin_gid = (gid_t)strtoul(av[i] + 10, NULL, 10);
		else if (!strncmp(av[i], "runner=", 7) && av[i][7] == '/')
			runner = av[i] + 7;
		else if (!strncmp(av[i], "nodes=", 6))
			nodes = av[i] + 6;
	}
}

/* Is this node one of delegate's: no nodes= (every node is), or this
 * host's short name is in the comma-separated list. A host name that
 * cannot be read counts as delegate's (fail closed). */
static int on_delegate_node(void)
{
	char host[256] = { 0 };
	size_t n;
	const char *p;

	if (!nodes)
		return 1;
	if (gethostname(host, sizeof(host) - 1) != 0 || !host[0])
		return 1;
	host[strcspn(host, ".")] = '\0';
	n = strlen(host);
	for (p = nodes; *p;) {
		size_t len = strcspn(p, ",");
		if (len == n && !strncmp(p, host, n))
			return 1;
		p += len;
		if (*p == ',')
			p++;
	}
	return 0;
}

/* Bytes job_submit.lua allows in a path (safe_path), and no "/.." parts. */
static int safe_path(const char *p)
{
	size_t n = strlen(p);

	if (n < 2 || n > 4096 || p[0] != '/' || p[n - 1] == '/')
		return 0;
	for (size_t i = 0; i < n; i++) {
		char c = p[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      strchr("._/+@=,:-", c)))
			return 0;
	}
	return !strstr(p, "//") && !strstr(p, "/./") && !strstr(p, "/../");
}

/* Is this step delegate's rank step: a job of two nodes or more, argv
 * exactly { runner, "rank", <dir> }? */
static int is_rank_step(spank_t sp)
{
	int argc = 0;
	char **argv = NULL;

	if (!runner)
		return 0;
	uint32_t nnodes = 0;

	/* Only a multi-node job has ranks (job_submit.lua admits more than
	 * one node only in delegate's rank form). */
	if (spank_get_item(sp, S_JOB_NNODES, &nnodes) != ESPANK_SUCCESS || nnodes < 2)
		return 0;
	if (spank_get_item(sp, S_JOB_ARGV, &argc, &argv) != ESPANK_SUCCESS || !argv)
		return 0;
	return argc == 3 && argv[0] && argv[1] && argv[2] && !strcmp(argv[0], runner) &&
	       !strcmp(argv[1], "rank") && safe_path(argv[2]);
}

/* Is `uid` root or a member of admin_gid (primary or supplementary) in this
 * node's account database? Any failure counts as "no". */
static int uid_is_admin(uid_t uid)
{
	struct passwd pw, *res = NULL;
	char buf[16384];
	gid_t groups[256];
	int ngroups = 256;

	if (uid == 0)
		return 1;
	if (admin_gid == (gid_t)-1)
		return 0;
	if (getpwuid_r(uid, &pw, buf, sizeof(buf), &res) != 0 || !res)
		return 0;
	if (pw.pw_gid == admin_gid)
		return 1;
	if (getgrouplist(pw.pw_name, pw.pw_gid, groups, &ngroups) < 0)
		return 0;	/* more than 256 groups: not an admin here */
	for (int i = 0; i < ngroups; i++)
		if (groups[i] == admin_gid)
			return 1;
	return 0;
}

static int is_admin(spank_t sp)
{
	uid_t uid;

	if (spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS)
		return 0;
	return uid_is_admin(uid);
}

static int scrub_env(spank_t sp);

/*
 * The rank step's slurmstepd may execute nothing but the runner (and the
 * ELF interpreter it needs): a Landlock ruleset (EXECUTE handled, allowed
 * on those files only) on this slurmstepd, inherited by everything it
 * forks. srun's --task-prolog/--task-epilog name a program slurmstepd runs
 * as the user in this step (no SPANK item shows them): with this ruleset
 * their exec fails, whatever they name. Fails closed: no Landlock, no step.
 */
static int restrict_exec(void)
{
	static const char *loaders[] = {
		"/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1",
		"/lib/ld-linux-armhf.so.3", NULL
	};
	struct landlock_ruleset_attr attr = { .handled_access_fs = LANDLOCK_ACCESS_FS_EXECUTE };
	int rs, added = 0;

	rs = syscall(SYS_landlock_create_ruleset, &attr, sizeof(attr), 0);
	if (rs < 0) {
		slurm_error("delegate_lockdown: Landlock is not available (%m); rank steps are refused");
		return -1;
	}
	for (int i = -1; i < 0 || loaders[i]; i++) {
		const char *p = i < 0 ? runner : loaders[i];
		struct landlock_path_beneath_attr pb = { .allowed_access = LANDLOCK_ACCESS_FS_EXECUTE };
		int fd = open(p, O_PATH | O_CLOEXEC);

		if (fd < 0)
			continue;
		pb.parent_fd = fd;
		if (syscall(SYS_landlock_add_rule, rs, LANDLOCK_RULE_PATH_BENEATH, &pb, 0) == 0 && i < 0)
			added = 1;
		close(fd);
	}
	if (!added || syscall(SYS_landlock_restrict_self, rs, 0) != 0) {
		slurm_error("delegate_lockdown: cannot restrict the rank step's executables (%m)");
		close(rs);
		return -1;
	}
	close(rs);
	return 0;
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	uint32_t jobid = 0, stepid = 0;

	if (spank_context() != S_CTX_REMOTE)
		return ESPANK_SUCCESS;
	parse_args(ac, av);
	if (!on_delegate_node() || is_admin(sp))
		return ESPANK_SUCCESS;
	if (spank_get_item(sp, S_JOB_STEPID, &stepid) != ESPANK_SUCCESS) {
		slurm_error("delegate_lockdown: cannot read the step id; refusing the step");
		return -1;
	}
	spank_get_item(sp, S_JOB_ID, &jobid);
	if (stepid == SLURM_BATCH_SCRIPT || stepid == SLURM_EXTERN_CONT)
		return ESPANK_SUCCESS;
	if (is_rank_step(sp)) {
		/* The environment is the user's srun's: scrubbed before any
		 * task prolog could see it (LD_PRELOAD into the runner), and
		 * nothing but the runner may be executed. */
		if (scrub_env(sp) < 0 || restrict_exec() < 0)
			return -1;
		return ESPANK_SUCCESS;
	}
	slurm_error("delegate_lockdown: job steps are disabled for users on this cluster "
		    "(job %u step %u refused); only delegate's batch step runs",
		    jobid, stepid);
	return -1;
}

/*
 * The SLURM_* variables slurmstepd itself sets for a batch or rank task
 * (seen with `env` in a 22.05 batch step and srun task). Every other
 * SLURM_* name in the job's environment came from the submitter's shell
 * and is an option of the Slurm commands a task may run: SLURM_PROLOG,
 * SLURM_EPILOG, SLURM_TASK_PROLOG and SLURM_TASK_EPILOG are srun's
 * --prolog/--epilog/--task-prolog/--task-epilog (programs srun or
 * slurmstepd runs as the user, outside any sandbox), SLURM_CONTAINER is
 * --container, SLURM_CONF names another configuration. They are dropped.
 */
static int slurm_owned(const char *e)
{
	static const char *prefixes[] = {
		"SLURM_JOB_", "SLURM_ARRAY_", "SLURM_STEP_", "SLURM_TOPOLOGY_", "SLURMD_", NULL
	};
	static const char *exact[] = {
		"SLURM_JOBID", "SLURM_STEPID", "SLURM_CLUSTER_NAME", "SLURM_WORKING_CLUSTER",
		"SLURM_NODEID", "SLURM_NODELIST", "SLURM_NNODES", "SLURM_NODE_ALIASES",
		"SLURM_PROCID", "SLURM_LOCALID", "SLURM_GTIDS", "SLURM_TASK_PID",
		"SLURM_CPUS_ON_NODE", "SLURM_GPUS_ON_NODE", "SLURM_TASKS_PER_NODE",
		"SLURM_PRIO_PROCESS", "SLURM_SUBMIT_DIR", "SLURM_SUBMIT_HOST",
		"SLURM_LAUNCH_NODE_IPADDR", "SLURM_SRUN_COMM_HOST", "SLURM_SRUN_COMM_PORT",
		NULL
	};
	const char *eq = strchr(e, '=');
	size_t n = eq ? (size_t)(eq - e) : strlen(e);

	for (int i = 0; prefixes[i]; i++)
		if (!strncmp(e, prefixes[i], strlen(prefixes[i])))
			return 1;
	for (int i = 0; exact[i]; i++)
		if (strlen(exact[i]) == n && !strncmp(e, exact[i], n))
			return 1;
	return 0;
}

static int allowed_name(const char *e)
{
	static const char *exact[] = { "HOME=", "USER=", "LOGNAME=", "LANG=", "TZ=", NULL };

	if (slurm_owned(e))
		return 1;
	for (int i = 0; exact[i]; i++)
		if (!strncmp(e, exact[i], strlen(exact[i])))
			return 1;
	return 0;
}

/* Reduces the step's environment to the allowlist and a fixed PATH. */
static int scrub_env(spank_t sp)
{
	char **env = NULL, **names;
	int n = 0, k = 0;

	if (spank_get_item(sp, S_JOB_ENV, &env) != ESPANK_SUCCESS || !env)
		return -1;
	while (env[n])
		n++;
	names = calloc(n + 1, sizeof(char *));
	if (!names)
		return -1;
	for (int i = 0; i < n; i++) {
		const char *eq = strchr(env[i], '=');

		if (!eq || allowed_name(env[i]))
			continue;
		names[k++] = strndup(env[i], eq - env[i]);
	}
	for (int i = 0; i < k; i++) {
		if (names[i] && spank_unsetenv(sp, names[i]) != ESPANK_SUCCESS) {
			slurm_error("delegate_lockdown: cannot remove %s from the job's environment",
				    names[i]);
			for (int j = i; j < k; j++)
				free(names[j]);
			free(names);
			return -1;
		}
		free(names[i]);
	}
	free(names);
	if (spank_setenv(sp, "PATH", "/usr/bin:/bin", 1) != ESPANK_SUCCESS)
		return -1;
	return 0;
}

int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	uint32_t stepid = 0;

	if (spank_context() != S_CTX_REMOTE)
		return ESPANK_SUCCESS;
	parse_args(ac, av);
	if (!on_delegate_node() || is_admin(sp))
		return ESPANK_SUCCESS;
	if (spank_get_item(sp, S_JOB_STEPID, &stepid) != ESPANK_SUCCESS ||
	    (stepid != SLURM_BATCH_SCRIPT && !is_rank_step(sp)))
		return -1;	/* not reached: slurm_spank_init refused it */
	return scrub_env(sp) < 0 ? -1 : ESPANK_SUCCESS;
}
