//! What Go's `net/url.Parse` does with the `aws://…` EBS volume IDs, to get the same path and
//! the same error texts as csi-translation-lib (which wraps them as `Invalid disk name`).
//! Go 1.26 `net/url` and `net/netip` are the reference; only the parts an `aws://` URL reaches
//! are here (scheme `aws`, so the `http(s)`-only colon rule does not apply).

/// The decoded path of `raw` (which starts with `aws://`), or the text of Go's `*url.Error`.
pub(crate) fn parse_path(raw: &str) -> Result<String, String> {
    // Parse cuts the fragment off first and checks it only after the rest parsed.
    let (url, fragment) = raw
        .split_once('#')
        .map_or((raw, None), |(u, f)| (u, Some(f)));
    let path = parse(url).map_err(|e| url_error(url, &e))?;
    if let Some(fragment) = fragment.filter(|f| !f.is_empty()) {
        unescape(fragment.as_bytes(), Mode::Other).map_err(|e| url_error(raw, &e))?;
    }
    Ok(path)
}

/// `*url.Error`'s text: `parse "<url>": <err>`.
fn url_error(url: &str, err: &str) -> String {
    format!("parse {}: {err}", quote(url.as_bytes()))
}

fn parse(url: &str) -> Result<String, String> {
    if url.bytes().any(|b| b < b' ' || b == 0x7f) {
        return Err("net/url: invalid control character in URL".to_owned());
    }
    // The scheme is `aws`; what follows the `:` starts with `//`.
    let rest = &url["aws:".len()..];
    let rest = if rest.ends_with('?') && rest.matches('?').count() == 1 {
        &rest[..rest.len() - 1]
    } else {
        rest.split_once('?').map_or(rest, |(r, _)| r)
    };
    let after = &rest[2..];
    let (authority, path) = after
        .find('/')
        .map_or((after, ""), |i| (&after[..i], &after[i..]));
    parse_authority(authority)?;
    let path = unescape(path.as_bytes(), Mode::Other)?;
    Ok(go_string(&path))
}

fn parse_authority(authority: &str) -> Result<(), String> {
    let at = authority.rfind('@');
    parse_host(at.map_or(authority, |i| &authority[i + 1..]))?;
    let Some(i) = at else { return Ok(()) };
    let userinfo = &authority[..i];
    let valid = userinfo.chars().all(|c| {
        c.is_ascii_alphanumeric()
            || matches!(
                c,
                '-' | '.'
                    | '_'
                    | ':'
                    | '~'
                    | '!'
                    | '$'
                    | '&'
                    | '\''
                    | '('
                    | ')'
                    | '*'
                    | '+'
                    | ','
                    | ';'
                    | '='
                    | '%'
                    | '@'
            )
    });
    if !valid {
        return Err("net/url: invalid userinfo".to_owned());
    }
    let (user, password) = userinfo
        .split_once(':')
        .map_or((userinfo, None), |(u, p)| (u, Some(p)));
    unescape(user.as_bytes(), Mode::Other)?;
    if let Some(password) = password {
        unescape(password.as_bytes(), Mode::Other)?;
    }
    Ok(())
}

fn parse_host(host: &str) -> Result<(), String> {
    match host.rfind('[') {
        Some(i) if i > 0 => Err("invalid IP-literal".to_owned()),
        Some(_) => {
            let close = host.rfind(']').ok_or("missing ']' in host")?;
            let colon_port = &host[close + 1..];
            if !valid_optional_port(colon_port) {
                return Err(format!(
                    "invalid port {} after host",
                    quote(colon_port.as_bytes())
                ));
            }
            // Before the `]`: an IPv6 address, maybe with a `%25`-introduced zone.
            let name = &host[1..close];
            let unescaped = match name.find("%25") {
                Some(z) => {
                    let mut all = unescape(&name.as_bytes()[..z], Mode::Host)?;
                    all.extend(unescape(&name.as_bytes()[z..], Mode::Zone)?);
                    all
                }
                None => unescape(name.as_bytes(), Mode::Host)?,
            };
            match netip_parse(&unescaped) {
                Err(e) => Err(format!("invalid host: {e}")),
                Ok(IpKind::V4) => Err("invalid IP-literal".to_owned()),
                Ok(IpKind::V6) => Ok(()),
            }
        }
        None => {
            // Not http(s): the port starts at the last colon.
            if let Some(i) = host.rfind(':')
                && !valid_optional_port(&host[i..])
            {
                return Err(format!(
                    "invalid port {} after host",
                    quote(&host.as_bytes()[i..])
                ));
            }
            unescape(host.as_bytes(), Mode::Host).map(drop)
        }
    }
}

fn valid_optional_port(port: &str) -> bool {
    port.is_empty()
        || port
            .strip_prefix(':')
            .is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit()))
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Host,
    Zone,
    /// Path, userinfo and fragment: only `%` escapes are checked.
    Other,
}

/// Bytes Go leaves unescaped in a host (`shouldEscape(c, encodeHost)` is false).
fn host_byte_ok(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"!$&'()*+,;=:[]<>\"-_.~".contains(&c)
}

/// Go's `unescape`: checks every `%XY`, and in a host every plain ASCII byte; then decodes.
fn unescape(s: &[u8], mode: Mode) -> Result<Vec<u8>, String> {
    let escape_error = |e: &[u8]| format!("invalid URL escape {}", quote(e));
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            b'%' => {
                if i + 2 >= s.len()
                    || !s[i + 1].is_ascii_hexdigit()
                    || !s[i + 2].is_ascii_hexdigit()
                {
                    return Err(escape_error(&s[i..(i + 3).min(s.len())]));
                }
                let seq = &s[i..i + 3];
                if mode == Mode::Host && unhex(s[i + 1]) < 8 && seq != b"%25" {
                    return Err(escape_error(seq));
                }
                if mode == Mode::Zone {
                    let v = unhex(s[i + 1]) << 4 | unhex(s[i + 2]);
                    if seq != b"%25" && v != b' ' && !host_byte_ok(v) {
                        return Err(escape_error(seq));
                    }
                }
                i += 3;
            }
            c => {
                if matches!(mode, Mode::Host | Mode::Zone) && c < 0x80 && !host_byte_ok(c) {
                    return Err(format!(
                        "invalid character {} in host name",
                        quote(&s[i..=i])
                    ));
                }
                i += 1;
            }
        }
    }
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'%' {
            out.push(unhex(s[i + 1]) << 4 | unhex(s[i + 2]));
            i += 3;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    Ok(out)
}

fn unhex(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        _ => c - b'A' + 10,
    }
}

/// Bytes as Go shows a string in JSON: invalid UTF-8 bytes each become U+FFFD (a `%`-decoded
/// path may hold any byte).
fn go_string(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    let mut rest = bytes;
    while !rest.is_empty() {
        match std::str::from_utf8(rest) {
            Ok(s) => {
                out.push_str(s);
                break;
            }
            Err(e) => {
                let (valid, after) = rest.split_at(e.valid_up_to());
                out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                out.push(char::REPLACEMENT_CHARACTER);
                rest = &after[1..];
            }
        }
    }
    out
}

/// Go's `strconv.Quote` (and `%q`). Non-ASCII runes count as printable unless they are
/// control, space-like or format characters; exact for ASCII, which is what IDs hold.
pub(crate) fn quote(bytes: &[u8]) -> String {
    let mut out = String::from("\"");
    let mut rest = bytes;
    while let Some(&first) = rest.first() {
        let (c, len) = match std::str::from_utf8(&rest[..utf8_len(first).min(rest.len())]) {
            Ok(s) if first >= 0x80 => (s.chars().next(), s.len()),
            _ => (None, 1),
        };
        match c {
            None if first < 0x80 => match first {
                b'"' => out.push_str("\\\""),
                b'\\' => out.push_str("\\\\"),
                0x07 => out.push_str("\\a"),
                0x08 => out.push_str("\\b"),
                0x0c => out.push_str("\\f"),
                b'\n' => out.push_str("\\n"),
                b'\r' => out.push_str("\\r"),
                b'\t' => out.push_str("\\t"),
                0x0b => out.push_str("\\v"),
                b' '..=b'~' => out.push(first as char),
                _ => out.push_str(&format!("\\x{first:02x}")),
            },
            None => out.push_str(&format!("\\x{first:02x}")),
            Some(c) if printable(c) => out.push(c),
            Some(c) if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
            Some(c) => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
        rest = &rest[len..];
    }
    out.push('"');
    out
}

fn utf8_len(first: u8) -> usize {
    match first {
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        0xf0..=0xf7 => 4,
        _ => 1,
    }
}

/// Go's `unicode.IsPrint` for non-ASCII runes, without the tables: false for control
/// (Cc), space (Z*), the common format (Cf) and the private-use characters.
fn printable(c: char) -> bool {
    let u = c as u32;
    !(c.is_control()
        || c.is_whitespace()
        || matches!(u, 0xad | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f | 0x180e)
        || matches!(u, 0x200b..=0x200f | 0x202a..=0x202e | 0x2060..=0x206f)
        || matches!(u, 0xfeff | 0xfff9..=0xfffb | 0xe000..=0xf8ff | 0xf0000..)
        || u == 0xa0)
}

enum IpKind {
    V4,
    V6,
}

/// Go's `netip.ParseAddr`: which kind of address `s` is, or the error text.
fn netip_parse(s: &[u8]) -> Result<IpKind, String> {
    let error = |msg: &str, at: Option<&[u8]>| match at.filter(|a| !a.is_empty()) {
        Some(at) => format!("ParseAddr({}): {msg} (at {})", quote(s), quote(at)),
        None => format!("ParseAddr({}): {msg}", quote(s)),
    };
    for &c in s {
        match c {
            b'.' => {
                return ipv4_fields(s, s, &mut [0; 4])
                    .map(|()| IpKind::V4)
                    .map_err(|(m, at)| error(m, at));
            }
            b':' => {
                return parse_ipv6(s)
                    .map(|()| IpKind::V6)
                    .map_err(|(m, at)| error(m, at));
            }
            b'%' => return Err(error("missing IPv6 address", None)),
            _ => {}
        }
    }
    Err(error("unable to parse IP", None))
}

type AddrError<'a> = (&'static str, Option<&'a [u8]>);

/// `parseIPv4Fields` over `s` (a part of the whole input).
fn ipv4_fields<'a>(_whole: &[u8], s: &'a [u8], fields: &mut [u8]) -> Result<(), AddrError<'a>> {
    let (mut val, mut pos, mut digits) = (0u32, 0usize, 0usize);
    for i in 0..s.len() {
        let c = s[i];
        if c.is_ascii_digit() {
            if digits == 1 && val == 0 {
                return Err(("IPv4 field has octet with leading zero", None));
            }
            val = val * 10 + u32::from(c - b'0');
            digits += 1;
            if val > 255 {
                return Err(("IPv4 field has value >255", None));
            }
        } else if c == b'.' {
            if i == 0 || i == s.len() - 1 || s[i - 1] == b'.' {
                return Err(("IPv4 field must have at least one digit", Some(&s[i..])));
            }
            if pos == 3 {
                return Err(("IPv4 address too long", None));
            }
            fields[pos] = val as u8;
            pos += 1;
            val = 0;
            digits = 0;
        } else {
            return Err(("unexpected character", Some(&s[i..])));
        }
    }
    if pos < 3 {
        return Err(("IPv4 address too short", None));
    }
    fields[3] = val as u8;
    Ok(())
}

/// `parseIPv6`: only whether it parses (the address itself is not needed).
fn parse_ipv6(input: &[u8]) -> Result<(), AddrError<'_>> {
    let mut s = without_zone(input)?;
    // Whether a `::` has been read (where it stands does not matter when not expanding it).
    let mut ellipsis = false;
    if s.starts_with(b"::") {
        ellipsis = true;
        s = &s[2..];
        if s.is_empty() {
            return Ok(());
        }
    }
    // Bytes of the address read so far: two per group, four for an embedded IPv4 address.
    let mut i = 0;
    while i < 16 {
        let digits = hex_group(s)?;
        if s.get(digits) == Some(&b'.') {
            embedded_ipv4_fits(s, ellipsis, i)?;
            ipv4_fields(input, s, &mut [0; 4])?;
            s = &[];
            i += 4;
            break;
        }
        i += 2;
        s = &s[digits..];
        if s.is_empty() {
            break;
        }
        let (rest, double) = separator(s, ellipsis)?;
        s = rest;
        if double {
            ellipsis = true;
            if s.is_empty() {
                break;
            }
        }
    }
    if !s.is_empty() {
        return Err(("trailing garbage after address", Some(s)));
    }
    fills_sixteen_bytes(i, ellipsis)
}

/// The address without its `%zone`; a `%` must be followed by a zone.
fn without_zone(input: &[u8]) -> Result<&[u8], AddrError<'_>> {
    match input.iter().position(|&c| c == b'%') {
        Some(i) if i + 1 == input.len() => Err(("zone must be a non-empty string", None)),
        Some(i) => Ok(&input[..i]),
        None => Ok(input),
    }
}

/// How many hexadecimal digits start `s`: one to four, for a value below 2^16.
fn hex_group(s: &[u8]) -> Result<usize, AddrError<'_>> {
    let mut acc = 0u32;
    let mut off = 0;
    while let Some(d) = s.get(off).and_then(|&c| (c as char).to_digit(16)) {
        acc = (acc << 4) + d;
        if off > 3 {
            return Err(("each group must have 4 or less digits", Some(s)));
        }
        if acc > 0xffff {
            return Err(("IPv6 field has value >=2^16", Some(s)));
        }
        off += 1;
    }
    if off == 0 {
        return Err((
            "each colon-separated field must have at least one digit",
            Some(s),
        ));
    }
    Ok(off)
}

/// An IPv4 address `s` embedded after `filled` bytes of groups must be the last four bytes
/// (or follow a `::`, which makes room for it).
fn embedded_ipv4_fits(s: &[u8], ellipsis: bool, filled: usize) -> Result<(), AddrError<'_>> {
    if !ellipsis && filled != 12 {
        return Err((
            "embedded IPv4 address must replace the final 2 fields of the address",
            Some(s),
        ));
    }
    if filled + 4 > 16 {
        return Err((
            "too many hex fields to fit an embedded IPv4 at the end of the address",
            Some(s),
        ));
    }
    Ok(())
}

/// The `:` or `::` that starts `s` (after a group): what follows it, and whether it is `::`
/// (at most one in an address: `ellipsis` says one was read).
fn separator(s: &[u8], ellipsis: bool) -> Result<(&[u8], bool), AddrError<'_>> {
    if s[0] != b':' {
        return Err(("unexpected character, want colon", Some(s)));
    } else if s.len() == 1 {
        return Err(("colon must be followed by more characters", Some(s)));
    }
    let s = &s[1..];
    if s[0] != b':' {
        return Ok((s, false));
    }
    if ellipsis {
        return Err(("multiple :: in address", Some(s)));
    }
    Ok((&s[1..], true))
}

/// Whether `filled` bytes make a whole address: all sixteen without `::`, fewer with it (it
/// stands for at least one group of zeros).
fn fills_sixteen_bytes(filled: usize, ellipsis: bool) -> Result<(), AddrError<'static>> {
    match (filled < 16, ellipsis) {
        (true, false) => Err(("address string too short", None)),
        (false, true) => Err(("the :: must expand to at least one field of zeros", None)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_quote_escapes_like_strconv_quote() {
        assert_eq!(quote(b"a\"b\\c"), r#""a\"b\\c""#);
        assert_eq!(quote(b"\t\n\x07\x7f\x01"), r#""\t\n\a\x7f\x01""#);
        assert_eq!(quote("é日".as_bytes()), "\"é日\"");
        assert_eq!(quote("\u{a0}\u{85}".as_bytes()), r#""\u00a0\u0085""#);
        assert_eq!(quote(b"%\xe6"), r#""%\xe6""#);
    }

    #[test]
    fn an_ipv6_address_is_read_group_by_group() {
        assert_eq!(without_zone(b"fe80::1%eth0"), Ok(&b"fe80::1"[..]));
        assert_eq!(without_zone(b"::1"), Ok(&b"::1"[..]));
        assert_eq!(
            without_zone(b"::1%"),
            Err(("zone must be a non-empty string", None))
        );
        assert_eq!(hex_group(b"fe80::1"), Ok(4));
        assert_eq!(hex_group(b"0:1"), Ok(1));
        assert_eq!(
            hex_group(b"12345"),
            Err(("each group must have 4 or less digits", Some(&b"12345"[..])))
        );
        assert!(hex_group(b":1").is_err());
        assert_eq!(separator(b":1", false), Ok((&b"1"[..], false)));
        assert_eq!(separator(b"::1", false), Ok((&b"1"[..], true)));
        assert_eq!(separator(b"::", false), Ok((&b""[..], true)));
        assert_eq!(
            separator(b"::1", true),
            Err(("multiple :: in address", Some(&b":1"[..])))
        );
        assert_eq!(
            separator(b"x", false),
            Err(("unexpected character, want colon", Some(&b"x"[..])))
        );
        assert!(embedded_ipv4_fits(b"1.2.3.4", false, 12).is_ok());
        assert!(embedded_ipv4_fits(b"1.2.3.4", true, 2).is_ok());
        assert!(embedded_ipv4_fits(b"1.2.3.4", false, 10).is_err());
        assert!(embedded_ipv4_fits(b"1.2.3.4", true, 14).is_err());
        assert!(fills_sixteen_bytes(16, false).is_ok());
        assert!(fills_sixteen_bytes(14, true).is_ok());
        assert!(fills_sixteen_bytes(14, false).is_err());
        assert!(fills_sixteen_bytes(16, true).is_err());
    }

    #[test]
    fn addresses_parse_like_netip_parse_addr() {
        // Vectors checked against Go 1.26's netip.ParseAddr: `None` parses, else its error.
        for (text, error) in [
            ("::", None),
            ("::1", None),
            ("1::", None),
            ("1:2:3:4:5:6:7:8", None),
            (
                "1:2:3:4:5:6:7",
                Some(r#"ParseAddr("1:2:3:4:5:6:7"): address string too short"#),
            ),
            (
                "1:2:3:4:5:6:7:8:9",
                Some(r#"ParseAddr("1:2:3:4:5:6:7:8:9"): trailing garbage after address (at "9")"#),
            ),
            ("1::8", None),
            ("::ffff:1.2.3.4", None),
            ("1:2:3:4:5:6:1.2.3.4", None),
            (
                "1:2:3:4:5:1.2.3.4",
                Some(
                    r#"ParseAddr("1:2:3:4:5:1.2.3.4"): embedded IPv4 address must replace the final 2 fields of the address (at "1.2.3.4")"#,
                ),
            ),
            (
                "1:2:3:4:5:6:7:1.2.3.4",
                Some(
                    r#"ParseAddr("1:2:3:4:5:6:7:1.2.3.4"): embedded IPv4 address must replace the final 2 fields of the address (at "1.2.3.4")"#,
                ),
            ),
            (
                "::1.2.3.4.5",
                Some(r#"ParseAddr("::1.2.3.4.5"): IPv4 address too long"#),
            ),
            (
                "::1.2.3",
                Some(r#"ParseAddr("::1.2.3"): IPv4 address too short"#),
            ),
            (
                "::01.2.3.4",
                Some(r#"ParseAddr("::01.2.3.4"): IPv4 field has octet with leading zero"#),
            ),
            ("fe80::1%eth0", None),
            (
                "fe80::1%",
                Some(r#"ParseAddr("fe80::1%"): zone must be a non-empty string"#),
            ),
            (
                "12345::",
                Some(
                    r#"ParseAddr("12345::"): each group must have 4 or less digits (at "12345::")"#,
                ),
            ),
            ("1:2:3:4:5:6:7::", None),
            (
                "1:2:3:4:5:6:7:8::",
                Some(
                    r#"ParseAddr("1:2:3:4:5:6:7:8::"): the :: must expand to at least one field of zeros"#,
                ),
            ),
            (
                "::1:2:3:4:5:6:7:8",
                Some(
                    r#"ParseAddr("::1:2:3:4:5:6:7:8"): the :: must expand to at least one field of zeros"#,
                ),
            ),
            (
                "1::2::3",
                Some(r#"ParseAddr("1::2::3"): multiple :: in address (at ":3")"#),
            ),
            (
                "1:",
                Some(r#"ParseAddr("1:"): colon must be followed by more characters (at ":")"#),
            ),
            (
                "1:::2",
                Some(
                    r#"ParseAddr("1:::2"): each colon-separated field must have at least one digit (at ":2")"#,
                ),
            ),
            (
                ":1",
                Some(
                    r#"ParseAddr(":1"): each colon-separated field must have at least one digit (at ":1")"#,
                ),
            ),
            ("1:2:3:4:5:6:7:8%z", None),
            (
                "::g",
                Some(
                    r#"ParseAddr("::g"): each colon-separated field must have at least one digit (at "g")"#,
                ),
            ),
            (
                "1:2:3:4:5:6:7:8x",
                Some(r#"ParseAddr("1:2:3:4:5:6:7:8x"): unexpected character, want colon (at "x")"#),
            ),
            ("0000:0:0:0:0:0:0:1", None),
            (
                "00000::1",
                Some(
                    r#"ParseAddr("00000::1"): each group must have 4 or less digits (at "00000::1")"#,
                ),
            ),
            (
                "fffff::",
                Some(
                    r#"ParseAddr("fffff::"): each group must have 4 or less digits (at "fffff::")"#,
                ),
            ),
            (
                "1:2:3:4:5:6::1.2.3.4",
                Some(
                    r#"ParseAddr("1:2:3:4:5:6::1.2.3.4"): the :: must expand to at least one field of zeros"#,
                ),
            ),
            (
                "1:2:3:4:5:6:7::1.2.3.4",
                Some(
                    r#"ParseAddr("1:2:3:4:5:6:7::1.2.3.4"): too many hex fields to fit an embedded IPv4 at the end of the address (at "1.2.3.4")"#,
                ),
            ),
            ("::1.2.3.4%z", None),
            (
                "::1.2..4",
                Some(r#"ParseAddr("::1.2..4"): IPv4 field must have at least one digit (at ".4")"#),
            ),
            (
                "::256.1.1.1",
                Some(r#"ParseAddr("::256.1.1.1"): IPv4 field has value >255"#),
            ),
            (
                "1.2.3.4:1",
                Some(r#"ParseAddr("1.2.3.4:1"): unexpected character (at ":1")"#),
            ),
            (
                ":",
                Some(
                    r#"ParseAddr(":"): each colon-separated field must have at least one digit (at ":")"#,
                ),
            ),
            ("1::%z", None),
            ("a:b", Some(r#"ParseAddr("a:b"): address string too short"#)),
        ] {
            let got = netip_parse(text.as_bytes()).map(|_| ()).err();
            assert_eq!(got.as_deref(), error, "{text}");
        }
    }
}
