//! The all-in-one lab: `up` builds the topology ([`plan`]), starts `apiserver-lite` and one
//! `node-agent` per node, each in its namespace, and records what it started in
//! `<state-dir>/lab.json`; `down` undoes exactly that, also when the processes already died.
//!
//! - [`state`]: the lab's record and kubeconfig; [`up`](mod@up): `up` and `down`;
//! - [`multicall`]: the programs `podpath` also is, and the links `up` starts them through;
//! - [`hosts`]: commands and HTTP in the lab's hosts, lb-sim's status;
//! - [`inspect`]: the nodes' proxy rules, watched and explained ([`rules`], [`explain`](mod@explain));
//! - [`trace`]: `podpath trace`;
//! - [`ui`]: `podpath ui`, the lab in a browser.
//!
//! What it is not: a VM manager (the VM lab is the Vagrantfile's) or a cluster installer; the
//! components it starts are the workspace's own programs, run from `podpath`'s binary.

pub mod dns;
pub mod doctor;
pub mod explain;
pub mod family;
pub mod fault;
pub mod gateway;
pub mod hosts;
pub mod inspect;
pub mod multicall;
pub mod plan;
pub mod policy;
pub mod rules;
pub mod state;
pub mod trace;
pub mod ui;
pub mod up;
pub mod vagrant;
pub mod watch;

pub use hosts::{exec_argv, http_get, http_get_in, in_netns_thread, lb_status, lb_table, nodes_ready};
pub use inspect::{explain, node_tables, proxy_rules, watch_rules, NodeTables};
pub use state::{
    default_state_dir, kubeconfig, kubeconfig_path, load_state, LabState, LbMode, Proc, ProxyMode, LB_STATUS,
};
pub use up::{down, image_socket, image_store, kill_pods, parse_size, preflight, status, up, UpOptions};

/// Errors of the lab. Each names what it concerns.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// A wrong argument or a lab in the wrong state for the command.
    #[error("{0}")]
    Usage(String),
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
    #[error("`{cmd}` failed: {stderr}")]
    Command { cmd: String, stderr: String },
    /// An HTTP exchange with a component failed.
    #[error(transparent)]
    Http(#[from] podpath_client::http::HttpError),
    #[error("{0}")]
    NotReady(String),
}

pub type Result<T> = std::result::Result<T, LabError>;

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LabError {
    let what = what.into();
    move |source| LabError::Io { what, source }
}
