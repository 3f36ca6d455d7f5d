//! Unique, DNS-1123-safe object and driver names.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

/// Longest name produced, so that names also fit DNS-1123 labels.
const MAX_NAME_LEN: usize = 63;

/// Longest tag kept in a name; the rest of the room goes to the test name.
const MAX_TAG_LEN: usize = 20;

/// Name of the running test (libtest names the test's thread after it), made
/// DNS-1123 safe; `"test"` outside a test thread.
pub(crate) fn test_name() -> String {
    let thread = std::thread::current();
    let raw = thread.name().unwrap_or("test");
    // `module::path::test_name`: keep the last segment.
    let last = raw.rsplit("::").next().unwrap_or(raw);
    let name = dns_safe(last);
    if name.is_empty() || name == "main" {
        "test".to_string()
    } else {
        name
    }
}

/// A name unique across tests, test binaries and runs against the same
/// control plane: `<test name>-<tag>-<random>-<counter>`, at most 63
/// characters of `[a-z0-9-]`, starting and ending with an alphanumeric.
pub(crate) fn unique_name(tag: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let suffix = format!(
        "{}-{}",
        run_token(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    let tag = dns_safe(tag);
    let tag = tag[..tag.len().min(MAX_TAG_LEN)].trim_end_matches('-');
    let tag_part = if tag.is_empty() { 0 } else { tag.len() + 1 };
    let room = MAX_NAME_LEN - suffix.len() - 1 - tag_part;
    let test = test_name();
    let test = test[..test.len().min(room)].trim_end_matches('-');
    let stem = if tag.is_empty() {
        test.to_string()
    } else {
        format!("{test}-{tag}")
    };
    format!("{stem}-{suffix}")
}

/// A unique CSI driver name such as `<test>-<random>-0.csi.test`. The dots
/// make its sanitized form (finalizers, lease names) differ from the name.
pub(crate) fn unique_driver_name(tag: &str) -> String {
    let mut base = unique_name(tag);
    // Driver names are at most 63 characters (CSIDriver validation).
    let tail = ".csi.test";
    if base.len() + tail.len() > MAX_NAME_LEN {
        let cut = base.len() - (base.len() + tail.len() - MAX_NAME_LEN);
        base = base[base.len() - cut..].trim_start_matches('-').to_string();
    }
    format!("{base}{tail}")
}

/// Six hex digits, random per test process.
fn run_token() -> &'static str {
    static TOKEN: OnceLock<String> = OnceLock::new();
    TOKEN.get_or_init(|| {
        let mut h = RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            h.write_u128(t.as_nanos());
        }
        format!("{:06x}", h.finish() & 0xff_ffff)
    })
}

/// Lower-case; every run of characters outside `[a-z0-9]` becomes one `-`;
/// no leading or trailing `-`.
fn dns_safe(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars().map(|c| c.to_ascii_lowercase()) {
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_end_matches('-').to_string()
}
