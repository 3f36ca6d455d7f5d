//! `make bench`'s end-to-end configuration: Pods through kube-controller-manager
//! to the GCE PD and AWS EBS drivers' controllers with a cloud-like latency,
//! attacher-hub against the Go fleet (see `bench/e2e.rs`). Not part of `cargo test`
//! (ignored); `tests/bench/run.sh` runs it after the main benchmark, with
//! kube-controller-manager started on the benchmark's control plane, and
//! writes the report to `target/bench-e2e-report.md`.

mod peers;
mod support;

#[path = "bench/e2e.rs"]
mod e2e;

use support::Cluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "benchmark: make bench runs it"]
async fn pods_through_kube_controller_manager_hub_against_the_go_fleet() {
    let knobs = e2e::Knobs::from_env();
    let md = e2e::run(Cluster::get(), &knobs).await;
    println!("{md}");
    e2e::write_report(&md);
}
