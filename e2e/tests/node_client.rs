//! The official JavaScript client, `@kubernetes/client-node` from the npm registry (installed
//! by the test under the target directory, cached), against a real apiserver-lite process with
//! the kubeconfig users get: https, the lab CA, a bearer token. It refused podpath's plain-HTTP
//! kubeconfig before the API spoke TLS.

use podpath_e2e::clients::node_check;
use podpath_e2e::{ApiServer, Lab};
use testkit::netns::root_or_explain;

#[test]
fn node_client_over_tls_with_the_lab_ca() {
    // A short event log, so a continue token expires within the script.
    let srv = ApiServer::start(&["--event-log-capacity", "50"]).unwrap();
    node_check("client_check.mjs", &srv.kubeconfig, srv.dir.path(), "node client: ok");
}

/// A dual-stack API server (two Service ranges): the client creates a RequireDualStack
/// Service and reads both `clusterIPs`, downgrades it, and gets the real refusal of a
/// single-stack policy with two families.
#[test]
fn node_client_reads_both_cluster_ips_of_a_dual_stack_service() {
    let srv = ApiServer::start(&["--service-cluster-ip-range", "10.96.0.0/12,fd00:10:96::/112"]).unwrap();
    node_check("dualstack_check.mjs", &srv.kubeconfig, srv.dir.path(), "node dual-stack: ok");
}

/// The client's Exec, pod log and PortForward against a real lab. Root only.
#[test]
fn node_client_exec_logs_and_port_forward_in_a_lab() {
    if !root_or_explain() {
        return;
    }
    let lab = Lab::with_web_and_ticker("jsstream").unwrap();
    let home = tempfile::tempdir().unwrap();
    node_check("stream_check.mjs", &lab.kubeconfig, home.path(), "node streaming: ok");
}
