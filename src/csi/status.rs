//! What a failed CSI call means: the one classifier of outcomes, and gRPC code
//! names spelled as the Go sidecars spell them (metrics labels, error texts).

use tonic::Code;

/// Whether a failed call may still have an effect on the storage backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The driver has, for sure, not done (and will not do) the operation.
    Final,
    /// The operation may still be in progress or may have taken effect.
    MayBeInProgress,
}

/// Classifies the gRPC status of a failed `ControllerPublishVolume` (spec 3.7).
///
/// This is the only place that maps codes to outcomes; handlers branch on the
/// returned [`Outcome`], never on raw codes.
pub fn classify(code: Code) -> Outcome {
    match code {
        // The caller gave up (deadline or cancellation): the driver may still
        // be working on it.
        Code::Cancelled | Code::DeadlineExceeded => Outcome::MayBeInProgress,
        // The driver or the connection was unavailable: the request may or may
        // not have reached it.
        Code::Unavailable => Outcome::MayBeInProgress,
        // The driver is out of a resource right now or asked us to retry a
        // conflicting operation later: it may still complete the attach.
        Code::ResourceExhausted | Code::Aborted => Outcome::MayBeInProgress,
        // Every other code is a definite answer from the driver.
        Code::Ok
        | Code::Unknown
        | Code::InvalidArgument
        | Code::NotFound
        | Code::AlreadyExists
        | Code::PermissionDenied
        | Code::FailedPrecondition
        | Code::OutOfRange
        | Code::Unimplemented
        | Code::Internal
        | Code::DataLoss
        | Code::Unauthenticated => Outcome::Final,
    }
}

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
    fn codes_that_may_leave_work_in_flight_are_classified_as_in_progress() {
        for code in [
            Code::Cancelled,
            Code::DeadlineExceeded,
            Code::Unavailable,
            Code::ResourceExhausted,
            Code::Aborted,
        ] {
            assert_eq!(classify(code), Outcome::MayBeInProgress, "{code:?}");
        }
    }

    #[test]
    fn definite_answers_are_final() {
        for code in [
            Code::InvalidArgument,
            Code::NotFound,
            Code::AlreadyExists,
            Code::FailedPrecondition,
            Code::Internal,
            Code::Unknown,
            Code::Unimplemented,
        ] {
            assert_eq!(classify(code), Outcome::Final, "{code:?}");
        }
    }

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
