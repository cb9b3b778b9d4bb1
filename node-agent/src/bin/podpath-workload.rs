//! `podpath-workload`: a pod's sandbox, its containers' processes and their monitors, as the
//! kubelet starts them (`kubelet::workload`). A binary of its own so a pod's processes are not
//! copies of the agent.

fn main() {
    kubelet::workload::main()
}
