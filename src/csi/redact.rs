//! Values that must never be logged: their `Debug` hides them and they have
//! no `Display`.

use std::{collections::HashMap, fmt};

/// The secrets of a CSI call (from `controllerPublishSecretRef`).
///
/// `Debug` prints only the number of entries; the map is reachable only
/// through [`Secrets::expose`], which the client calls when it builds the
/// request.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secrets(HashMap<String, String>);

impl Secrets {
    /// Wraps a secrets map.
    pub fn new(map: HashMap<String, String>) -> Self {
        Self(map)
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Hands the map over for a CSI request. Do not log what this returns.
    pub fn expose(self) -> HashMap<String, String> {
        self.0
    }
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<redacted {} entries>", self.0.len())
    }
}

impl From<HashMap<String, String>> for Secrets {
    fn from(map: HashMap<String, String>) -> Self {
        Self(map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_shows_only_the_number_of_entries() {
        let s = Secrets::new([("user".into(), "hunter2-top-secret".into())].into());
        let printed = format!("{s:?} {s:#?}");
        assert!(!printed.contains("hunter2"));
        assert!(!printed.contains("user"));
        assert!(printed.contains("<redacted 1 entries>"));
    }
}
