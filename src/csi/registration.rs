//! Reading a plugin's registration socket (the kubelet plugin registration
//! API) to learn its driver name and CSI socket.

use std::{path::Path, time::Duration};

use super::{
    connection::{Address, Connection},
    proto::registration::{InfoRequest, PluginInfo, registration_client::RegistrationClient},
};

/// Plugin type of CSI drivers in `PluginInfo.type`.
pub const CSI_PLUGIN_TYPE: &str = "CSIPlugin";
/// Deadline of connecting to a registration socket and of GetInfo.
pub const INFO_TIMEOUT: Duration = Duration::from_secs(1);

/// Errors of reading a registration socket.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The socket path is not usable as an address.
    #[error(transparent)]
    Address(#[from] super::connection::Error),
    /// GetInfo failed.
    #[error("GetInfo on {socket}: {status}")]
    Call {
        /// The registration socket.
        socket: String,
        /// The status.
        status: tonic::Status,
    },
}

/// Calls `Registration/GetInfo` on the registration socket at `socket`.
pub async fn plugin_info(socket: &Path) -> Result<PluginInfo, Error> {
    let address: Address = socket.to_string_lossy().parse()?;
    let connection = Connection::connect(address, Some(INFO_TIMEOUT)).await?;
    let mut client = RegistrationClient::new(connection.channel());
    let mut request = tonic::Request::new(InfoRequest {});
    request.set_timeout(INFO_TIMEOUT);
    let call = tokio::time::timeout(INFO_TIMEOUT, client.get_info(request)).await;
    match call {
        Ok(Ok(response)) => Ok(response.into_inner()),
        Ok(Err(status)) => Err(Error::Call {
            socket: socket.display().to_string(),
            status,
        }),
        Err(_) => Err(Error::Call {
            socket: socket.display().to_string(),
            status: tonic::Status::deadline_exceeded("context deadline exceeded"),
        }),
    }
}
