//! Values that must never be logged: their `Debug` hides them and they have
//! no `Display`.

use std::{collections::HashMap, fmt};

/// The secrets of a CSI call (from `controllerPublishSecretRef`), byte for
/// byte as the Secret holds them.
///
/// `Debug` prints only the number of entries; the values are reachable only
/// through [`Secrets::expose`], which the client calls when it builds the
/// request.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secrets(HashMap<String, Vec<u8>>);

/// A secret value that is not valid UTF-8, and so cannot travel in the
/// `map<string, string>` of a CSI request.
///
/// The text is protobuf-go's marshalling error for such a string, which the Go
/// sidecars end with: they pass the bytes on unchanged and grpc-go refuses to
/// marshal the request (`codes.Internal`, `grpc: error while marshaling: …`).
/// The value is never altered to make it fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("string field contains invalid UTF-8")]
pub struct NotUtf8;

impl Secrets {
    /// Wraps a secrets map (values as strings or raw bytes).
    pub fn new<V: Into<Vec<u8>>>(map: HashMap<String, V>) -> Self {
        Self(map.into_iter().map(|(k, v)| (k, v.into())).collect())
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Hands the map over for a CSI request, every value exactly as read, or
    /// refuses it whole when a value is not UTF-8. Do not log what this
    /// returns.
    pub fn expose(self) -> Result<HashMap<String, String>, NotUtf8> {
        self.0
            .into_iter()
            .map(|(k, v)| String::from_utf8(v).map(|v| (k, v)).map_err(|_| NotUtf8))
            .collect()
    }
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<redacted {} entries>", self.0.len())
    }
}

impl From<HashMap<String, String>> for Secrets {
    fn from(map: HashMap<String, String>) -> Self {
        Self::new(map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_shows_only_the_number_of_entries() {
        let s = Secrets::new([("user".to_string(), "hunter2-top-secret".to_string())].into());
        let printed = format!("{s:?} {s:#?}");
        assert!(!printed.contains("hunter2"));
        assert!(!printed.contains("user"));
        assert!(printed.contains("<redacted 1 entries>"));
    }

    #[test]
    fn values_pass_byte_for_byte_or_not_at_all() {
        // Control characters, NUL, multi-byte characters, an empty value and a
        // large one: valid UTF-8, handed over unchanged.
        let big = "x".repeat(1 << 20);
        let odd = "\0\u{1}\u{7f}\n\t ü€😀\u{feff}\u{fffd}";
        let s = Secrets::new(HashMap::from([
            ("odd".to_string(), odd.as_bytes().to_vec()),
            ("empty".to_string(), Vec::new()),
            ("big".to_string(), big.clone().into_bytes()),
        ]));
        let out = s.expose().expect("valid UTF-8 passes");
        assert_eq!(out["odd"], odd);
        assert_eq!(out["empty"], "");
        assert_eq!(out["big"], big);
        assert_eq!(Secrets::default().expose(), Ok(HashMap::new()));

        // One bad value refuses the whole map: no replacement character, no
        // partial map.
        for bad in [
            &b"\xff"[..],
            b"ok\xc3",
            b"\xed\xa0\x80",
            b"\xc0\xaf",
            b"p\x80w",
        ] {
            let s = Secrets::new(HashMap::from([
                ("good".to_string(), b"fine".to_vec()),
                ("bad".to_string(), bad.to_vec()),
            ]));
            assert_eq!(s.expose(), Err(NotUtf8), "{bad:?}");
        }
        assert_eq!(NotUtf8.to_string(), "string field contains invalid UTF-8");
    }
}
