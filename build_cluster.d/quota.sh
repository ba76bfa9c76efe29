# shellcheck shell=bash
# build_cluster.d/quota.sh -- per-student disk limits on the shared home.
#
# Sourced by build_cluster.sh after common.sh (never run by itself); used by
# the roster (`accounts add|list|remove`, accounting.sh). A student's job
# writes into their job directory, which is in their home: without a limit
# one student fills the filesystem for everyone (and, on one machine, the
# Docker and Slurm state beside it). The per-job cap (policy max_job_bytes)
# bounds one job; the quota bounds the student.
#
# What the home's filesystem allows decides how:
#   btrfs   each new student's home is its own subvolume with a qgroup
#           limit (`btrfs qgroup limit`); quotas are enabled on the
#           filesystem when off. Existing homes that are plain
#           directories are reported, not converted.
#   ext4/xfs with user quotas on (`quotaon -p` says so): `setquota -u`.
#   nfs     the limit belongs on the file server (docs/instructors.md, "Disk quotas").
#   other, or quotas off (this VM's kernel has no CONFIG_QUOTA): a warning
#           naming the filesystem; the per-job cap still holds.
# Settings:
#   DELEGATE_HOME_QUOTA       per-student hard limit (K/M/G/T suffix);
#                             0 or empty: no limit is set
#   DELEGATE_ROSTER_HOME_BASE where the roster's new homes are made

# quota_wanted: true when a per-student limit is configured.
quota_wanted() { [[ -n $DELEGATE_HOME_QUOTA && $DELEGATE_HOME_QUOTA != 0 ]]; }

# home_fs DIR: "FSTYPE MOUNTPOINT" of the filesystem holding DIR.
home_fs() { findmnt -n -o FSTYPE,TARGET --target "$1" | head -n1; }

# btrfs_is_subvolume DIR: true when DIR is the root of a btrfs subvolume
# (inode 256 on btrfs).
btrfs_is_subvolume() { [[ $(stat -c %i "$1" 2>/dev/null) == 256 ]]; }

# btrfs_quota_on MOUNT: quotas (qgroups) enabled on the filesystem, turned
# on when off.
btrfs_quota_on() {
    btrfs qgroup show "$1" >/dev/null 2>&1 && return 0
    btrfs quota enable "$1" || die "quota: cannot enable btrfs quotas on $1"
    log "quota: enabled btrfs quotas on $1"
}

# btrfs_home_subvolume USER HOME: the freshly made plain-directory HOME
# becomes a subvolume with the same contents, owner and mode (the copy is a
# reflink: no data is duplicated). Only for a home this run created.
btrfs_home_subvolume() {
    local u=$1 home=$2 new
    new="$(dirname "$home")/.$u.subvol.$$"
    btrfs -q subvolume create "$new" >/dev/null || die "quota: cannot create a btrfs subvolume for $u at $new"
    cp -a --reflink=auto "$home/." "$new/" || die "quota: cannot fill the subvolume of $u"
    chown --reference="$home" "$new" && chmod --reference="$home" "$new"
    rm -rf -- "$home" || die "quota: cannot replace the home of $u"
    mv -T -- "$new" "$home" || die "quota: cannot put the subvolume of $u at $home"
}

# home_quota_apply USER NEW: the per-student limit on USER's home; NEW=1
# when this run created the account (a btrfs home may then be turned into a
# subvolume). Idempotent; warns (never dies) where the filesystem has no
# quotas, so a roster still goes in.
home_quota_apply() {
    local u=$1 new=$2 home fs mnt bytes
    quota_wanted || return 0
    bytes=$(deploy_value bytes DELEGATE_HOME_QUOTA) || exit 1
    home=$(getent passwd "$u" | cut -d: -f6)
    [[ -d $home ]] || { warn "quota: $u has no home directory ($home)"; return 0; }
    read -r fs mnt <<<"$(home_fs "$home")"
    case $fs in
        btrfs)
            command -v btrfs >/dev/null || die "quota: the home of $u is on btrfs but btrfs-progs is not installed"
            if ! btrfs_is_subvolume "$home"; then
                if [[ $new == 1 ]]; then
                    btrfs_home_subvolume "$u" "$home"
                else
                    warn "quota: the home of $u ($home) is a plain directory on btrfs, not a subvolume: no limit set (move it into a subvolume by hand)"
                    return 0
                fi
            fi
            btrfs_quota_on "$mnt"
            btrfs qgroup limit "$bytes" "$home" || die "quota: cannot limit the home of $u to $DELEGATE_HOME_QUOTA"
            ;;
        ext2 | ext3 | ext4 | xfs)
            if ! quotaon -pu "$mnt" 2>/dev/null | grep -q ' is on'; then
                quota_warn_once "$fs" "$mnt" "user quotas are off on $mnt ($fs; enable them with the usrquota mount option and quotaon, or the kernel lacks CONFIG_QUOTA)"
                return 0
            fi
            # Block limits in KiB: soft at 90 % (a grace period), hard at the limit.
            setquota -u "$u" $((bytes * 9 / 10240)) $((bytes / 1024)) 0 0 "$mnt" \
                || die "quota: setquota for $u on $mnt failed"
            ;;
        nfs | nfs4)
            quota_warn_once "$fs" "$mnt" "the shared home $mnt is NFS: set per-student quotas on the file server (docs/instructors.md, \"Disk quotas\")"
            return 0
            ;;
        *)
            quota_warn_once "$fs" "$mnt" "$mnt is $fs, which has no per-user quotas delegate can set"
            return 0
            ;;
    esac
    log "quota: $u limited to $DELEGATE_HOME_QUOTA ($fs on $mnt)"
}

# quota_warn_once FSTYPE MOUNT MESSAGE: one warning per filesystem and run.
QUOTA_WARNED=" "
quota_warn_once() {
    [[ $QUOTA_WARNED == *" $2 "* ]] && return 0
    QUOTA_WARNED+="$2 "
    warn "quota: no per-student disk limit: $3; the per-job cap (policy max_job_bytes) still holds"
}

# home_quota_show USER: "USED/LIMIT" of USER's home where delegate set a
# limit it can read back (btrfs qgroups, vfs quotas), else "-".
home_quota_show() {
    local u=$1 home fs mnt id line
    home=$(getent passwd "$u" | cut -d: -f6)
    [[ -d $home ]] || { echo -; return; }
    read -r fs mnt <<<"$(home_fs "$home")"
    case $fs in
        btrfs)
            btrfs_is_subvolume "$home" || { echo -; return; }
            id=$(btrfs inspect-internal rootid "$home" 2>/dev/null) || { echo -; return; }
            line=$(btrfs qgroup show -re --iec "$mnt" 2>/dev/null | awk -v q="0/$id" '$1 == q {print $2 "/" $4}')
            echo "${line:--}" ;;
        ext2 | ext3 | ext4 | xfs)
            line=$(quota -w -u "$u" 2>/dev/null | awk -v m="$mnt" '$1 != "" && NR > 2 {print $2 "K/" $4 "K"; exit}')
            echo "${line:--}" ;;
        *) echo - ;;
    esac
}

# home_remove_subvolume HOME: a btrfs subvolume home is deleted as a
# subvolume (userdel cannot); other homes are left to userdel.
home_remove_subvolume() {
    local home=$1
    [[ -d $home ]] && btrfs_is_subvolume "$home" && [[ $(home_fs "$home") == btrfs* ]] || return 0
    btrfs -q subvolume delete "$home" >/dev/null || warn "quota: cannot delete the subvolume $home"
}
