//! gRPC codes and errors spelled as the Go sidecars spell them (metrics labels, error texts).
//!
//! There is no classifier of "final" and "may be in progress" errors: external-attacher's
//! attacher computes one (`isFinalError`) and its `csiAttach` discards it; attach and detach
//! errors are saved and retried alike.

use tonic::Code;

/// The Go spelling of a gRPC code (`codes.Code.String()` in grpc-go), used in
/// the `grpc_status_code` metric label and in error messages.
pub fn go_code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

/// Formats a status as grpc-go's `status.Error(...).Error()` does:
/// `rpc error: code = <Code> desc = <message>`. external-attacher writes this
/// text into `VolumeAttachment.status.attachError.message`.
pub fn go_error_text(status: &tonic::Status) -> String {
    format!(
        "rpc error: code = {} desc = {}",
        go_code_name(status.code()),
        status.message()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_names_follow_grpc_go() {
        assert_eq!(go_code_name(Code::Cancelled), "Canceled");
        assert_eq!(go_code_name(Code::Ok), "OK");
        assert_eq!(go_code_name(Code::ResourceExhausted), "ResourceExhausted");
    }

    #[test]
    fn error_text_matches_grpc_go() {
        let s = tonic::Status::deadline_exceeded("context deadline exceeded");
        assert_eq!(
            go_error_text(&s),
            "rpc error: code = DeadlineExceeded desc = context deadline exceeded"
        );
    }
}
