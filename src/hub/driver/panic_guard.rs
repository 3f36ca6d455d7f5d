//! Panic containment: a bug hit by one object or one driver becomes an error with the panic's
//! message, and stays there.

/// Runs `fut`, turning a panic inside it into an error with the panic's
/// message, so that a bug hit by one object or one driver stays there.
pub async fn guarded<T>(fut: impl std::future::Future<Output = T>) -> Result<T, String> {
    use futures::FutureExt;
    std::panic::AssertUnwindSafe(fut)
        .catch_unwind()
        .await
        .map_err(|payload| panic_message(&*payload))
}

pub use crate::telemetry::panic_message;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_sync_becomes_an_error_with_its_message() {
        let ok = guarded(async { 7 }).await;
        assert_eq!(ok, Ok(7));
        let failed = guarded(async {
            let v: Vec<u8> = Vec::new();
            if v.is_empty() {
                panic!("bug for key {}", "va-1");
            }
            1
        })
        .await;
        assert_eq!(failed, Err("bug for key va-1".to_string()));
        let static_msg: Result<(), String> = guarded(async {
            if ok.is_ok() {
                panic!("static");
            }
        })
        .await;
        assert_eq!(static_msg, Err("static".to_string()));
    }
}
