//! The project's Rust mock CSI driver as a process of its own
//! (`mock-csi-driver`), for tests that must not share the test process's
//! cores with the driver (benchmarks); its call record is read through the
//! control socket.

use std::path::Path;
use std::time::Duration;

use mock_csi_driver::CallRecord;
use mock_csi_driver::control;

use super::{DriverProcess, mock_csi_driver_bin};

/// How long the mock may take to print `ready`.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// A `mock-csi-driver` process serving one driver on a socket of its own.
#[derive(Debug)]
pub(crate) struct MockProcess {
    /// Driver name (`--name`).
    pub(crate) driver: String,
    /// The process and its socket.
    pub(crate) process: DriverProcess,
}

impl MockProcess {
    /// Starts `mock-csi-driver --name <driver> --volumes <volumes>` (volume IDs
    /// `vol-0` …) and waits for its `ready` line.
    pub(crate) async fn start(driver: &str, volumes: usize) -> MockProcess {
        let name = driver.to_string();
        let mut process =
            DriverProcess::start("mock-csi-driver", mock_csi_driver_bin(), move |socket| {
                vec![
                    format!("--endpoint={}", socket.display()),
                    format!("--name={name}"),
                    format!("--volumes={volumes}"),
                ]
            })
            .await;
        process
            .process
            .wait_for_output("ready\n", 1, READY_TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("mock-csi-driver {driver} did not become ready: {e}"));
        MockProcess {
            driver: driver.to_string(),
            process,
        }
    }

    /// Path of the driver's socket.
    pub(crate) fn socket(&self) -> &Path {
        &self.process.socket
    }

    /// Every call the mock has recorded, oldest first.
    pub(crate) async fn calls(&self) -> Vec<CallRecord> {
        let mut ctl = control::Client::for_endpoint(self.socket())
            .await
            .unwrap_or_else(|e| panic!("control socket of mock {}: {e}", self.driver));
        ctl.calls()
            .await
            .unwrap_or_else(|e| panic!("call record of mock {}: {e}", self.driver))
    }

    /// Stops the process (SIGTERM, then SIGKILL).
    pub(crate) async fn stop(&mut self) {
        self.process.process.stop().await;
    }
}
