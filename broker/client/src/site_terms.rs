//! What one submission takes from the site policy, decided once when the
//! policy is read ([`SiteTerms`]). A policy that cannot be read refuses
//! what needs it (the sandbox image of a call that names none, a shipment
//! measured against the job size) and leaves the rest to defaults: no map
//! (one Slurm job per call), the default bound of an allocation, the
//! protocol's bound on retries, and no resource check before Slurm's own
//! (the runner checks every job against the policy on the node).

use delegate_protocol::attempt::{DEFAULT_RETRIES, MAX_RETRIES};
use delegate_protocol::policy::{Policy, PolicyError};
use delegate_protocol::Resources;

use crate::error::{ClientError, Result};
use crate::plan::DEFAULT_MAX_ALLOCATION_SECS;
use crate::SubmitRequest;

/// Room left in a job directory for its spec, payload and the call's own
/// output when a shipment is measured against the site's job size.
const SHIP_HEADROOM: u64 = 1 << 20;

/// The site policy as one submission uses it.
pub(crate) struct SiteTerms {
    policy: std::result::Result<Policy, PolicyError>,
}

impl SiteTerms {
    /// The client's policy (`$DELEGATE_POLICY`, the default path, or the
    /// built-in defaults where there is no file).
    pub(crate) fn load() -> Self {
        SiteTerms::from(Policy::load_for_client())
    }

    pub(crate) fn from(policy: std::result::Result<Policy, PolicyError>) -> Self {
        SiteTerms { policy }
    }

    fn unreadable(e: &PolicyError) -> ClientError {
        ClientError::Policy(e.clone())
    }

    /// The image a call runs in: its own, else the site's default.
    pub(crate) fn image(&self, asked: Option<&String>) -> Result<String> {
        match (asked, &self.policy) {
            (Some(i), _) => Ok(i.clone()),
            (None, Ok(p)) => Ok(p.default_image.clone()),
            (None, Err(e)) => Err(Self::unreadable(e)),
        }
    }

    /// How many times a lost call runs again: what its first request asks
    /// for, else [`DEFAULT_RETRIES`] or the site's `max_retries` when lower
    /// (an ask above the site's bound is refused). A multi-node job is
    /// never run again: its ranks' files would mix.
    pub(crate) fn retries(&self, first: &SubmitRequest) -> Result<u32> {
        if first.resources.nodes > 1 {
            return match first.retries {
                Some(n) if n > 0 => Err(ClientError::InvalidRequest(
                    "retries apply to one-node calls: a multi-node job is not run again (ask for retries=0)".into(),
                )),
                _ => Ok(0),
            };
        }
        let max = self.policy.as_ref().map_or(MAX_RETRIES, |p| p.max_retries.min(MAX_RETRIES));
        match first.retries {
            Some(n) if n > max => Err(ClientError::InvalidRequest(format!(
                "retries {n} is more than the site maximum of {max}"
            ))),
            Some(n) => Ok(n),
            None => Ok(DEFAULT_RETRIES.min(max)),
        }
    }

    /// What the calls ask for, within the site's maxima (one sentence
    /// instead of Slurm's refusal).
    pub(crate) fn check_resources(&self, r: &Resources) -> Result<()> {
        match &self.policy {
            Ok(p) => Ok(p.check_resources(r)?),
            Err(_) => Ok(()),
        }
    }

    /// How many bytes a shipment may have beside a payload of
    /// `payload_bytes` (`u64::MAX`: the site sets no job size).
    pub(crate) fn ship_limit(&self, payload_bytes: u64) -> Result<u64> {
        match &self.policy {
            Ok(p) => Ok(match p.limits().max_job_bytes {
                0 => u64::MAX,
                n => n.saturating_sub(payload_bytes + SHIP_HEADROOM),
            }),
            Err(e) => Err(Self::unreadable(e)),
        }
    }

    /// The site's calls per allocation of a map (1: no maps).
    pub(crate) fn calls_per_allocation(&self) -> u32 {
        self.policy.as_ref().map_or(1, |p| p.calls_per_allocation)
    }

    /// How long a map's allocation may pull calls.
    pub(crate) fn max_allocation_secs(&self) -> u64 {
        self.policy
            .as_ref()
            .map_or(DEFAULT_MAX_ALLOCATION_SECS, |p| p.limits().max_allocation_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unreadable() -> SiteTerms {
        SiteTerms::from(Err(PolicyError::Invalid {
            path: "/etc/delegate/policy.toml".into(),
            reason: "bad".into(),
        }))
    }

    fn request(nodes: u32, retries: Option<u32>) -> SubmitRequest {
        let mut r = SubmitRequest::command(vec!["true".into()]);
        r.resources.nodes = nodes;
        r.retries = retries;
        r
    }

    #[test]
    fn a_readable_policy_gives_its_own_terms() {
        let p = Policy::parse(
            "default_image = \"img:1\"\nmax_job_bytes = \"10M\"\ncalls_per_allocation = 7\nmax_retries = 1\n\
             max_allocation_time = \"2m\"\nmax_cpus = 2\n",
            "t",
        )
        .expect("valid");
        let t = SiteTerms::from(Ok(p));
        assert_eq!(t.image(None).expect("the default"), "img:1");
        assert_eq!(t.image(Some(&"own:2".to_owned())).expect("its own"), "own:2");
        assert_eq!(t.ship_limit(0).expect("bounded"), (10 << 20) - SHIP_HEADROOM);
        assert_eq!(t.calls_per_allocation(), 7);
        assert_eq!(t.max_allocation_secs(), 120);
        assert_eq!(t.retries(&request(1, None)).expect("default"), 1);
        let e = t.retries(&request(1, Some(2))).expect_err("past the site's 1");
        assert!(e.to_string().contains("retries 2 is more than the site maximum of 1"), "{e}");
        let mut big = request(1, None).resources;
        big.cpus = 3;
        assert!(t.check_resources(&big).expect_err("3 cpus").to_string().contains("cpus 3"));
    }

    #[test]
    fn an_unreadable_policy_refuses_what_needs_it_and_defaults_the_rest() {
        let t = unreadable();
        assert!(matches!(t.image(None), Err(ClientError::Policy(_))));
        assert_eq!(t.image(Some(&"own:2".to_owned())).expect("its own"), "own:2");
        assert!(matches!(t.ship_limit(0), Err(ClientError::Policy(_))));
        assert_eq!(t.calls_per_allocation(), 1);
        assert_eq!(t.max_allocation_secs(), DEFAULT_MAX_ALLOCATION_SECS);
        assert_eq!(t.retries(&request(1, None)).expect("default"), DEFAULT_RETRIES.min(MAX_RETRIES));
        t.check_resources(&request(1, None).resources).expect("left to the runner");
        let e = t.retries(&request(2, Some(1))).expect_err("a multi-node job");
        assert!(e.to_string().contains("retries apply to one-node calls"), "{e}");
    }
}
