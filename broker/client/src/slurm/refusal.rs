//! Slurm's refusals of a submission that are the course's accounting
//! policy (a per-student limit, a missing association), told to the student
//! in one sentence that names the limit and what to do, instead of Slurm's
//! raw text (`QOSMaxSubmitJobPerUserLimit`, "Job violates accounting/QOS
//! policy (job submit limit, user's size and/or time limits)").

use std::fmt;

/// Why Slurm refused a submission, when the reason is the accounting policy
/// (`AccountingStorageEnforce=associations,limits,qos`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The student already has as many jobs queued or running as they may
    /// (`MaxSubmitJobsPerUser` of the QOS, `MaxSubmitJobs` of the
    /// association; every job-array element counts).
    SubmitLimit,
    /// The whole course (account or QOS) has as many jobs queued as it may
    /// (`GrpSubmitJobs`).
    CourseSubmitLimit,
    /// The job alone asks for more than a per-student limit allows (time,
    /// CPUs, CPU-minutes of the QOS or association).
    SizeLimit,
    /// The user has no association (is not on the course's roster).
    NoAssociation,
    /// The QOS asked for (or the default one) is not allowed to the user.
    InvalidQos,
}

impl Refusal {
    /// The name of the limit, as an administrator would look it up.
    pub fn limit(&self) -> &'static str {
        match self {
            Refusal::SubmitLimit => "MaxSubmitJobsPerUser",
            Refusal::CourseSubmitLimit => "GrpSubmitJobs",
            Refusal::SizeLimit => "a per-student size or time limit",
            Refusal::NoAssociation => "association",
            Refusal::InvalidQos => "QOS",
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Refusal::SubmitLimit => {
                "You already have as many jobs queued or running as a student may \
                 (the course's limit of submitted jobs per student, MaxSubmitJobsPerUser; \
                 a map counts one job per node, every other call one job): wait for some to finish or \
                 cancel some, then submit again."
            }
            Refusal::CourseSubmitLimit => {
                "The course's queue is full (its limit of submitted jobs for all students \
                 together, GrpSubmitJobs): wait a few minutes and submit again, or tell \
                 your instructor."
            }
            Refusal::SizeLimit => {
                "The job asks for more than a student may use at once (a per-student limit \
                 on time, CPUs or CPU-minutes of the course's accounting policy): ask for \
                 a shorter time or fewer CPUs, or wait for your running jobs to finish."
            }
            Refusal::NoAssociation => {
                "Your account is not registered with Slurm for this course (no association, \
                 so Slurm refuses your jobs): ask your instructor to add you to the roster \
                 (build_cluster.sh accounts add)."
            }
            Refusal::InvalidQos => {
                "Your account may not use the Slurm QOS this job asked for (the course's \
                 accounting policy): submit without a QOS, or ask your instructor."
            }
        })
    }
}

/// The accounting refusal in `sbatch`'s error output, if it is one. Slurm
/// prints the reason code (`sbatch: error: QOSMaxSubmitJobPerUserLimit`)
/// and then the general message; the code decides when present.
pub fn classify_sbatch_error(stderr: &str) -> Option<Refusal> {
    const CODES: &[(&str, Refusal)] = &[
        ("QOSMaxSubmitJobPerUserLimit", Refusal::SubmitLimit),
        ("AssocMaxSubmitJobLimit", Refusal::SubmitLimit),
        ("QOSMaxSubmitJobPerAccountLimit", Refusal::SubmitLimit),
        ("QOSGrpSubmitJobsLimit", Refusal::CourseSubmitLimit),
        ("AssocGrpSubmitJobsLimit", Refusal::CourseSubmitLimit),
    ];
    if let Some((_, r)) = CODES.iter().find(|(code, _)| stderr.contains(code)) {
        return Some(*r);
    }
    let lower = stderr.to_ascii_lowercase();
    if lower.contains("invalid account or account/partition combination") {
        Some(Refusal::NoAssociation)
    } else if lower.contains("invalid qos specification") {
        Some(Refusal::InvalidQos)
    } else if lower.contains("job violates accounting/qos policy") {
        if lower.contains("submit limit") && !lower.contains("size") {
            Some(Refusal::SubmitLimit)
        } else {
            Some(Refusal::SizeLimit)
        }
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: &str =
        "sbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, user's size and/or time limits)\n";

    #[test]
    fn the_reason_code_decides() {
        let qos = format!("sbatch: error: QOSMaxSubmitJobPerUserLimit\n{POLICY}");
        assert_eq!(classify_sbatch_error(&qos), Some(Refusal::SubmitLimit));
        let assoc = format!("sbatch: error: AssocMaxSubmitJobLimit\n{POLICY}");
        assert_eq!(classify_sbatch_error(&assoc), Some(Refusal::SubmitLimit));
        let grp = format!("sbatch: error: AssocGrpSubmitJobsLimit\n{POLICY}");
        assert_eq!(classify_sbatch_error(&grp), Some(Refusal::CourseSubmitLimit));
    }

    #[test]
    fn without_a_code_the_message_decides() {
        assert_eq!(classify_sbatch_error(POLICY), Some(Refusal::SizeLimit));
        assert_eq!(
            classify_sbatch_error(
                "sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified"
            ),
            Some(Refusal::NoAssociation)
        );
        assert_eq!(
            classify_sbatch_error("sbatch: error: Batch job submission failed: Invalid qos specification"),
            Some(Refusal::InvalidQos)
        );
    }

    #[test]
    fn other_errors_are_not_refusals() {
        assert_eq!(classify_sbatch_error(""), None);
        assert_eq!(
            classify_sbatch_error("sbatch: error: Batch job submission failed: Requested time limit is invalid"),
            None
        );
        assert_eq!(
            classify_sbatch_error("sbatch: error: Batch job submission failed: Unable to contact slurm controller"),
            None
        );
    }

    #[test]
    fn each_message_is_one_sentence_naming_the_limit() {
        for r in [
            Refusal::SubmitLimit,
            Refusal::CourseSubmitLimit,
            Refusal::SizeLimit,
            Refusal::NoAssociation,
            Refusal::InvalidQos,
        ] {
            let m = r.to_string();
            assert!(m.ends_with('.') && m.matches(". ").count() == 0, "{m}");
            assert!(!m.contains("QOSMax") && !m.contains("violates"), "{m}");
            assert!(m.contains(r.limit()) || r == Refusal::SizeLimit, "{m}");
        }
    }
}
