//! `sandbox-runner probe`: what `delegate doctor` asks; the runner asks the
//! node's agent (students cannot reach the Docker socket themselves).

use delegate_protocol::agent::{Answer, Request};
use delegate_protocol::policy::Policy;
use serde_json::{json, Value};

use crate::agent::Agent;

/// The probe's findings (the agent's answer).
pub type Report = delegate_protocol::agent::ProbeReport;

/// Text and JSON forms of the report.
pub trait Show {
    fn ok(&self) -> bool;
    fn to_json(&self) -> Value;
    fn to_text(&self) -> String;
}

impl Show for Report {
    fn ok(&self) -> bool {
        self.docker_ok && self.image_present
    }

    fn to_json(&self) -> Value {
        json!({
            "docker": {
                "ok": self.docker_ok,
                "version": self.version,
                "api_version": self.api_version,
                "error": self.error,
            },
            "image": { "name": self.image, "present": self.image_present },
            "perf_mode": { "mode": self.perf_mode, "detail": self.perf_detail },
            "gpu_mode": { "mode": self.gpu_mode, "detail": self.gpu_detail },
        })
    }

    fn to_text(&self) -> String {
        let mut s = String::new();
        if self.docker_ok {
            s += &format!("docker:    ok, engine {} (API {} negotiated)\n", self.version, self.api_version);
        } else {
            s += &format!("docker:    NOT OK: {}\n", self.error);
        }
        s += &format!(
            "image:     {} {}\n",
            self.image,
            if self.image_present { "present" } else { "MISSING" }
        );
        s += &format!("perf mode: {} ({})\n", self.perf_mode, self.perf_detail);
        if !self.gpu_mode.is_empty() {
            s += &format!("gpu mode:  {} ({})\n", self.gpu_mode, self.gpu_detail);
        }
        s
    }
}

/// Asks the agent named by the policy.
pub async fn probe(policy: &Policy) -> Report {
    let unknown = |error: String| Report {
        image: policy.default_image.clone(),
        error,
        perf_mode: "unknown".into(),
        perf_detail: "the delegate agent could not be asked".into(),
        ..Default::default()
    };
    let mut agent = match Agent::connect(&policy.agent_socket).await {
        Ok(a) => a,
        Err(e) => return unknown(e),
    };
    if let Err(e) = agent.send(&Request::Probe, &[]).await {
        return unknown(e);
    }
    match agent.recv().await {
        Ok(Answer::Probe(r)) => r,
        Ok(other) => unknown(format!("unexpected answer from the delegate agent: {other:?}")),
        Err(e) => unknown(e),
    }
}
