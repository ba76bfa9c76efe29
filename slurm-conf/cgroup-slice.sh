#!/bin/bash
# slurm-conf/cgroup-slice.sh -- slurmd's slice where cgroup.conf says
# IgnoreSystemd=yes (cgroup v2 without systemd, Slurm before 23.11; docs/ml.md,
# "Slurm's cgroup side"): nothing else makes /sys/fs/cgroup/system.slice, and
# slurmd 22.05 stops when it cannot make its own scope there. The slice gets
# the controllers slurmd enables in its scope (cpuset, cpu, memory, pids),
# those the hierarchy has. Run as root before slurmd starts, by
# build_cluster.d/local.sh (--local and the offline bundle) and the stack's
# workers (docker/cluster-entrypoint.sh). A controller that cannot be enabled
# is a warning on stderr; a slice that cannot be made, exit 1.
set -uo pipefail

root=/sys/fs/cgroup
slice=$root/system.slice
mkdir -p "$slice" || { echo "cannot make $slice for slurmd's cgroup scope" >&2; exit 1; }
for c in cpuset cpu memory pids; do
    grep -qw "$c" "$root/cgroup.controllers" 2>/dev/null || continue
    if ! { echo "+$c" >"$root/cgroup.subtree_control" && echo "+$c" >"$slice/cgroup.subtree_control"; } 2>/dev/null; then
        echo "WARNING: cannot enable the $c controller for $slice" >&2
    fi
done
exit 0
