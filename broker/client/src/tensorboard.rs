//! Where a job's TensorBoard is: the student's own Jupyter server serves it
//! (the delegate Python package's server extension, `delegate._jupyter`),
//! at [`ROUTE`]`/<job id>/` below the server's base URL, which JupyterHub
//! gives the server and its terminals and kernels as
//! [`SERVICE_PREFIX_ENV`].

use delegate_protocol::JobId;

/// The route below a Jupyter server's base URL.
pub const ROUTE: &str = "delegate/tensorboard";
/// The variable that holds a hub server's base URL (`/user/<name>/`).
pub const SERVICE_PREFIX_ENV: &str = "JUPYTERHUB_SERVICE_PREFIX";

/// The board of job `id` below the hub, for the server at `service_prefix`.
pub fn url(service_prefix: &str, id: &JobId) -> String {
    format!("{}/{ROUTE}/{id}/", service_prefix.trim_end_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_board_is_below_the_students_own_server() {
        let id = JobId::parse("20261127T152353-b2c3344e").unwrap();
        assert_eq!(
            url("/user/day-ann/", &id),
            "/user/day-ann/delegate/tensorboard/20261127T152353-b2c3344e/"
        );
        assert_eq!(url("/user/x", &id), "/user/x/delegate/tensorboard/20261127T152353-b2c3344e/");
    }
}
