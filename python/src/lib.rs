//! `delegate._core`: the Rust core of the Python package. Job directories,
//! submission (one sbatch per call, or one for a whole `map`), waiting,
//! status, cancel and the readers are the broker's client library
//! (`delegate_client`); this module only converts arguments and
//! errors. Every call that may block (sbatch, squeue, scancel, waiting,
//! reading large files) releases the GIL.

use std::collections::HashMap;
use std::time::Duration;

use delegate_client::{Client, ClientError, JobStatus, JobSummary, Stream, SubmitRequest};
use delegate_protocol::units::{parse_duration, parse_size};
use delegate_protocol::{JobId, State, Task, MAX_RESULT_BYTES};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

create_exception!(
    delegate._core,
    DelegateError,
    PyException,
    "A delegate operation failed (submission, Slurm, the job directory)."
);
create_exception!(
    delegate._core,
    NoSuchJobError,
    DelegateError,
    "No job with this id in the delegate root."
);
create_exception!(delegate._core, SubmitError, DelegateError, "The job could not be submitted.");

#[derive(Debug, thiserror::Error)]
enum CoreError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("{0}")]
    Invalid(String),
}

impl From<CoreError> for PyErr {
    fn from(e: CoreError) -> PyErr {
        match e {
            CoreError::Invalid(m) => PyValueError::new_err(m),
            CoreError::Client(c) => {
                let msg = c.to_string();
                match c {
                    ClientError::NoSuchJob { .. } | ClientError::NotYours { .. } => NoSuchJobError::new_err(msg),
                    ClientError::SubmitFailed { .. } | ClientError::Refused(_) => SubmitError::new_err(msg),
                    ClientError::InvalidRequest(_) => SubmitError::new_err(msg),
                    _ => DelegateError::new_err(msg),
                }
            }
        }
    }
}

type CoreResult<T> = Result<T, CoreError>;

fn client() -> CoreResult<Client> {
    Ok(Client::from_env()?)
}

fn parse_ids(ids: &[String]) -> CoreResult<Vec<JobId>> {
    ids.iter()
        .map(|s| JobId::parse(s).map_err(|e| CoreError::Invalid(e.to_string())))
        .collect()
}

fn opt_ms(py: Python<'_>, v: Option<u64>) -> Py<PyAny> {
    match v {
        Some(ms) => (ms as f64 / 1000.0)
            .into_pyobject(py)
            .map(|o| o.into_any().unbind())
            .unwrap_or_else(|_| py.None()),
        None => py.None(),
    }
}

fn status_dict<'py>(py: Python<'py>, s: &JobStatus) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("id", s.id.as_str())?;
    d.set_item("slurm_id", s.slurm_id.clone())?;
    d.set_item("state", s.state.as_str())?;
    d.set_item("reason", &s.reason)?;
    d.set_item("exit_code", s.exit_code)?;
    d.set_item("refused", s.refused)?;
    d.set_item("oom_killed", s.oom_killed)?;
    d.set_item("host", s.host.clone())?;
    d.set_item("submitted", opt_ms(py, s.submitted_ms))?;
    d.set_item("started", opt_ms(py, s.started_ms))?;
    d.set_item("finished", opt_ms(py, s.finished_ms))?;
    d.set_item("elapsed", s.elapsed_secs)?;
    Ok(d)
}

fn status_list<'py>(py: Python<'py>, v: &[JobStatus]) -> PyResult<Bound<'py, PyList>> {
    let items = v.iter().map(|s| status_dict(py, s)).collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, items)
}

#[allow(clippy::too_many_arguments)]
fn request(
    payload: Vec<u8>,
    python_version: &str,
    cloudpickle_version: &str,
    cpus: Option<u32>,
    gpus: Option<u32>,
    nodes: Option<u32>,
    mem: Option<&str>,
    time: Option<&str>,
    image: Option<&str>,
    env: &[(String, String)],
    files: &[String],
) -> CoreResult<SubmitRequest> {
    let mut req = SubmitRequest::new(Task::Python {
        python_version: python_version.to_owned(),
        cloudpickle_version: cloudpickle_version.to_owned(),
    });
    if let Some(c) = cpus {
        req.resources.cpus = c;
    }
    if let Some(g) = gpus {
        req.resources.gpus = g;
    }
    if let Some(n) = nodes {
        req.resources.nodes = n;
    }
    if let Some(m) = mem {
        req.resources.mem_bytes = parse_size(m).map_err(|e| CoreError::Invalid(format!("mem={m:?}: {e}")))?;
    }
    if let Some(t) = time {
        req.resources.time_limit_secs =
            parse_duration(t).map_err(|e| CoreError::Invalid(format!("time={t:?}: {e}")))?;
    }
    req.image = image.map(str::to_owned);
    req.env = env.to_vec();
    req.files = files.iter().map(std::path::PathBuf::from).collect();
    req.payload = Some(payload);
    Ok(req)
}

/// Submits Python calls (each payload is one pickled call). One payload: one
/// sbatch. Several: ONE sbatch (the calls share exclusive allocations and
/// run one after another), one job directory (and one fresh sandbox) per
/// call. Returns the job ids in order.
#[pyfunction]
#[pyo3(signature = (payloads, python_version, cloudpickle_version, *, cpus=None, gpus=None, nodes=None, mem=None, time=None, image=None, env=None, files=None, mix_classes=None, retries=None))]
#[allow(clippy::too_many_arguments)]
fn submit_python(
    py: Python<'_>,
    payloads: Vec<Bound<'_, PyBytes>>,
    python_version: String,
    cloudpickle_version: String,
    cpus: Option<u32>,
    gpus: Option<u32>,
    nodes: Option<u32>,
    mem: Option<String>,
    time: Option<String>,
    image: Option<String>,
    env: Option<HashMap<String, String>>,
    files: Option<Vec<String>>,
    mix_classes: Option<bool>,
    retries: Option<u32>,
) -> PyResult<Vec<String>> {
    let files = files.unwrap_or_default();
    let mut env: Vec<(String, String)> = env.unwrap_or_default().into_iter().collect();
    env.sort();
    let reqs = payloads
        .iter()
        .map(|p| {
            request(
                p.as_bytes().to_vec(),
                &python_version,
                &cloudpickle_version,
                cpus,
                gpus,
                nodes,
                mem.as_deref(),
                time.as_deref(),
                image.as_deref(),
                &env,
                &files,
            )
        })
        .map(|r| {
            r.map(|r| SubmitRequest {
                mix_classes: mix_classes.unwrap_or(false),
                retries,
                ..r
            })
        })
        .collect::<CoreResult<Vec<_>>>()?;
    drop(payloads);
    let ids = py.detach(move || -> CoreResult<Vec<String>> {
        let c = client()?;
        Ok(c.submit_many(&reqs)?.into_iter().map(|h| h.id.to_string()).collect())
    })?;
    Ok(ids)
}

/// The status of each job (one Slurm query for all).
#[pyfunction]
fn status<'py>(py: Python<'py>, ids: Vec<String>) -> PyResult<Bound<'py, PyList>> {
    let ids = parse_ids(&ids)?;
    let v = py.detach(move || -> CoreResult<Vec<JobStatus>> { Ok(client()?.status(&ids)?) })?;
    status_list(py, &v)
}

/// Bumped by `wake()`: a wait in progress returns (within a second) so
/// that the caller can add jobs to it.
static WAKE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Makes the waits in progress return early (the waiter has new futures).
#[pyfunction]
fn wake() {
    WAKE.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
}

/// Waits up to `timeout` seconds (None: until all are over) for the jobs;
/// returns their statuses. The job directories' inotify events wake it;
/// Slurm is asked once per interval for all of them (shared by consecutive
/// waits of this process). With `any`, it returns as soon as one job is
/// over, or when `wake()` is called.
#[pyfunction]
#[pyo3(signature = (ids, timeout=None, any=false))]
fn wait<'py>(py: Python<'py>, ids: Vec<String>, timeout: Option<f64>, any: bool) -> PyResult<Bound<'py, PyList>> {
    let ids = parse_ids(&ids)?;
    let timeout = match timeout {
        Some(t) if !(t.is_finite() && t >= 0.0) => {
            return Err(PyValueError::new_err(format!(
                "timeout must be a non-negative number of seconds, not {t}"
            )))
        }
        Some(t) => Some(Duration::from_secs_f64(t)),
        None => None,
    };
    let v = py.detach(move || -> CoreResult<Vec<JobStatus>> {
        if any {
            let seen = WAKE.load(std::sync::atomic::Ordering::SeqCst);
            let woken = move || WAKE.load(std::sync::atomic::Ordering::SeqCst) != seen;
            Ok(client()?.wait_any_with(&ids, timeout, woken)?)
        } else {
            Ok(client()?.wait(&ids, timeout)?)
        }
    })?;
    status_list(py, &v)
}

/// Cancels the jobs (one scancel), waits briefly for them to end, returns
/// their statuses. `reason`, in the user's words, is kept with each job
/// (their state reads `cancelled: <reason>`).
#[pyfunction]
#[pyo3(signature = (ids, reason=None))]
fn cancel<'py>(py: Python<'py>, ids: Vec<String>, reason: Option<String>) -> PyResult<Bound<'py, PyList>> {
    let ids = parse_ids(&ids)?;
    let v =
        py.detach(move || -> CoreResult<Vec<JobStatus>> { Ok(client()?.cancel_because(&ids, reason.as_deref())?) })?;
    status_list(py, &v)
}

/// Reads a job's `stdout`, `stderr` (at most `limit` bytes) or `result`;
/// None when the file does not exist.
#[pyfunction]
#[pyo3(signature = (id, name, limit=64 * 1024 * 1024))]
fn read_file<'py>(py: Python<'py>, id: String, name: String, limit: u64) -> PyResult<Option<Bound<'py, PyBytes>>> {
    let id = JobId::parse(&id).map_err(|e| PyValueError::new_err(e.to_string()))?;
    let data = py.detach(move || -> CoreResult<Option<Vec<u8>>> {
        let c = client()?;
        Ok(match name.as_str() {
            "stdout" => c.read_output(&id, Stream::Stdout, limit)?,
            "stderr" => c.read_output(&id, Stream::Stderr, limit)?,
            "result" => c.read_result(&id)?,
            // A rank's result of a multi-node call (`result.<K>`).
            other => match other.strip_prefix("result.").and_then(|k| k.parse::<u32>().ok()) {
                Some(k) if k < delegate_protocol::MAX_RANKS => c.read_rank_result(&id, k)?,
                _ => {
                    return Err(CoreError::Invalid(format!(
                        "unknown job file {other:?} (stdout, stderr, result or result.<rank>)"
                    )))
                }
            },
        })
    })?;
    Ok(data.map(|d| PyBytes::new(py, &d)))
}

/// Hands job `id`'s output to `sink(stream, data)` as it is written
/// (`stream` "stdout" or "stderr", `data` bytes, empty after a pause
/// without news) until the job is over. A sink that returns False, or an
/// interrupt (Ctrl-C, a notebook's stop button), ends it early; an
/// exception in the sink is raised here.
#[pyfunction]
fn follow_output(py: Python<'_>, id: String, sink: Py<PyAny>) -> PyResult<()> {
    let id = JobId::parse(&id).map_err(|e| PyValueError::new_err(e.to_string()))?;
    let mut raised: Option<PyErr> = None;
    py.detach(|| -> CoreResult<()> {
        Ok(client()?.follow_output(&id, |stream, bytes| {
            Python::attach(|py| {
                let called = py
                    .check_signals()
                    .and_then(|()| sink.call1(py, (stream.file_name(), PyBytes::new(py, bytes))));
                match called {
                    Ok(v) => !matches!(v.extract::<bool>(py), Ok(false)),
                    Err(e) => {
                        raised = Some(e);
                        false
                    }
                }
            })
        })?)
    })?;
    raised.map_or(Ok(()), Err)
}

/// The machine a job's call ran on, as the worker's agent recorded it
/// (its fingerprint), as JSON; None before the call ended or when the
/// worker recorded none.
#[pyfunction]
fn fingerprint(py: Python<'_>, id: String) -> PyResult<Option<String>> {
    let id = JobId::parse(&id).map_err(|e| PyValueError::new_err(e.to_string()))?;
    let f =
        py.detach(move || -> CoreResult<Option<delegate_protocol::Fingerprint>> { Ok(client()?.fingerprint(&id)?) })?;
    let Some(f) = f else { return Ok(None) };
    // With its hardware class (what must be equal for results to compare).
    let mut v = serde_json::to_value(&f).map_err(|e| PyValueError::new_err(e.to_string()))?;
    if let Some(obj) = v.as_object_mut() {
        obj.insert("class".into(), serde_json::Value::String(f.class()));
    }
    Ok(Some(v.to_string()))
}

/// The `limit` most recent jobs of the delegate root (all with None),
/// oldest first: each a status dict plus `what` (the command, or the
/// Python function's name). One Slurm query for all.
#[pyfunction]
#[pyo3(signature = (limit=None))]
fn jobs<'py>(py: Python<'py>, limit: Option<usize>) -> PyResult<Bound<'py, PyList>> {
    let v = py.detach(move || -> CoreResult<Vec<JobSummary>> { Ok(client()?.list_summaries(limit, true)?) })?;
    let items = v
        .iter()
        .map(|j| {
            let d = status_dict(py, &j.status)?;
            d.set_item("what", &j.what)?;
            d.set_item("outcome", &j.outcome)?;
            d.set_item("cpu", &j.cpu)?;
            d.set_item("machine", &j.machine)?;
            Ok(d)
        })
        .collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, items)
}

/// Seconds from a duration such as `90`, `30s`, `5m` or `1h30m` (the same
/// parser as the cluster's `time=`).
#[pyfunction]
fn parse_duration_secs(s: &str) -> PyResult<u64> {
    parse_duration(s).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// Bytes from a size such as `512M` or `2G` (the same parser as `mem=`).
#[pyfunction]
fn parse_size_bytes(s: &str) -> PyResult<u64> {
    parse_size(s).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// The job directory of a job.
#[pyfunction]
fn job_dir(py: Python<'_>, id: String) -> PyResult<String> {
    let id = JobId::parse(&id).map_err(|e| PyValueError::new_err(e.to_string()))?;
    let c = py.detach(client)?;
    Ok(c.job_dir(&id).display().to_string())
}

/// The directory of one of the caller's own jobs (delegate-client
/// `own_job_dir`); NoSuchJobError for any other id.
#[pyfunction]
fn own_job_dir(py: Python<'_>, id: String) -> PyResult<String> {
    let id = JobId::parse(&id).map_err(|e| PyValueError::new_err(e.to_string()))?;
    let dir = py.detach(move || -> CoreResult<std::path::PathBuf> { Ok(client()?.own_job_dir(&id)?) })?;
    Ok(dir.display().to_string())
}

/// The delegate root in use.
#[pyfunction]
fn root(py: Python<'_>) -> PyResult<String> {
    let c = py.detach(client)?;
    Ok(c.root().display().to_string())
}

/// How many sbatch calls this process made.
#[pyfunction]
fn sbatch_count() -> u64 {
    delegate_client::slurm::sbatch_calls()
}

/// How many squeue calls this process made (one per wait interval, however
/// many futures wait).
#[pyfunction]
fn squeue_count() -> u64 {
    delegate_client::slurm::squeue_calls()
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("DelegateError", py.get_type::<DelegateError>())?;
    m.add("NoSuchJobError", py.get_type::<NoSuchJobError>())?;
    m.add("SubmitError", py.get_type::<SubmitError>())?;
    // Constants the Python side must not copy by hand: the names of the
    // terminal states (from the State enum) and the bound of a result file.
    let terminal: Vec<&str> = State::terminal().map(State::as_str).collect();
    m.add("TERMINAL_STATES", pyo3::types::PyTuple::new(py, terminal)?)?;
    m.add("MAX_RESULT_BYTES", MAX_RESULT_BYTES)?;
    // The job directory's files local mode writes itself (protocol/layout.rs).
    m.add("STDOUT", delegate_protocol::layout::STDOUT)?;
    m.add("STDERR", delegate_protocol::layout::STDERR)?;
    m.add("RESULT", delegate_protocol::layout::RESULT)?;
    m.add("TENSORBOARD_ROUTE", delegate_client::tensorboard::ROUTE)?;
    m.add_function(wrap_pyfunction!(submit_python, m)?)?;
    m.add_function(wrap_pyfunction!(status, m)?)?;
    m.add_function(wrap_pyfunction!(wait, m)?)?;
    m.add_function(wrap_pyfunction!(wake, m)?)?;
    m.add_function(wrap_pyfunction!(cancel, m)?)?;
    m.add_function(wrap_pyfunction!(read_file, m)?)?;
    m.add_function(wrap_pyfunction!(jobs, m)?)?;
    m.add_function(wrap_pyfunction!(fingerprint, m)?)?;
    m.add_function(wrap_pyfunction!(follow_output, m)?)?;
    m.add_function(wrap_pyfunction!(parse_duration_secs, m)?)?;
    m.add_function(wrap_pyfunction!(parse_size_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(job_dir, m)?)?;
    m.add_function(wrap_pyfunction!(own_job_dir, m)?)?;
    m.add_function(wrap_pyfunction!(root, m)?)?;
    m.add_function(wrap_pyfunction!(sbatch_count, m)?)?;
    m.add_function(wrap_pyfunction!(squeue_count, m)?)?;
    Ok(())
}
