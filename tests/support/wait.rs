//! Waiting for object conditions through watches, with a timeout that says
//! what was awaited.

use std::fmt;
use std::time::Duration;

use kube::runtime::wait::{Condition, await_condition, conditions};
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// A wait that did not end as hoped: what was awaited, on which object, and
/// the object as last read (so a failed test shows why).
pub(crate) struct WaitError {
    /// Human description of the awaited condition.
    what: String,
    /// `Kind/name` of the object.
    object: String,
    /// How long the wait lasted.
    timeout: Duration,
    /// Why it ended: timeout, deletion, or a watch error.
    reason: String,
    /// The object as read after the failure, as JSON (or why it could not be read).
    last_seen: String,
}

impl fmt::Display for WaitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "waiting for {} ({}): {} (limit {:?}); last seen: {}",
            self.object, self.what, self.reason, self.timeout, self.last_seen
        )
    }
}

// `unwrap()` prints Debug; make that the readable form.
impl fmt::Debug for WaitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for WaitError {}

/// Waits (through a watch on the single object) until `cond` holds for object
/// `name`, and returns the object. `what` describes the condition for the
/// error message, e.g. `"status.attached=true"`.
pub(crate) async fn wait_for<K>(
    api: &Api<K>,
    name: &str,
    what: &str,
    cond: impl Condition<K>,
    timeout: Duration,
) -> Result<K, WaitError>
where
    K: Resource + Clone + fmt::Debug + Serialize + DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
{
    let reason = match tokio::time::timeout(timeout, await_condition(api.clone(), name, cond)).await
    {
        Ok(Ok(Some(obj))) => return Ok(obj),
        Ok(Ok(None)) => "the object does not exist (or was deleted)".to_string(),
        Ok(Err(e)) => format!("watch failed: {e}"),
        Err(_) => "timed out".to_string(),
    };
    Err(failure(api, name, what, timeout, reason).await)
}

/// Waits until object `name` no longer exists (returns at once if it is
/// already gone).
pub(crate) async fn wait_deleted<K>(
    api: &Api<K>,
    name: &str,
    timeout: Duration,
) -> Result<(), WaitError>
where
    K: Resource + Clone + fmt::Debug + Serialize + DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
{
    let what = "deleted";
    let uid = match api.get_opt(name).await {
        Ok(None) => return Ok(()),
        Ok(Some(obj)) => obj.meta().uid.clone().unwrap_or_default(),
        Err(e) => {
            return Err(failure(api, name, what, timeout, format!("get failed: {e}")).await);
        }
    };
    let reason = match tokio::time::timeout(
        timeout,
        await_condition(api.clone(), name, conditions::is_deleted(&uid)),
    )
    .await
    {
        Ok(Ok(_)) => return Ok(()),
        Ok(Err(e)) => format!("watch failed: {e}"),
        Err(_) => "timed out".to_string(),
    };
    Err(failure(api, name, what, timeout, reason).await)
}

async fn failure<K>(
    api: &Api<K>,
    name: &str,
    what: &str,
    timeout: Duration,
    reason: String,
) -> WaitError
where
    K: Resource + Clone + fmt::Debug + Serialize + DeserializeOwned,
    K::DynamicType: Default,
{
    let last_seen = match api.get_opt(name).await {
        Ok(Some(obj)) => serde_json::to_string(&obj).unwrap_or_else(|e| format!("<{e}>")),
        Ok(None) => "<not found>".to_string(),
        Err(e) => format!("<get failed: {e}>"),
    };
    WaitError {
        what: what.to_string(),
        object: format!("{}/{name}", K::kind(&K::DynamicType::default())),
        timeout,
        reason,
        last_seen,
    }
}
